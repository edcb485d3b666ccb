"""What a round's train replies hold: each user's update, or why it did not arrive.

:class:`ReplyCollection` is a mixin of :class:`~fedprivopt.strategies.flower.DPStrategy` (as
:class:`~fedprivopt.strategies.discovery.UserDiscovery` is): it reads a cohort's replies into
``{user: flat update}`` and counts the users whose update did not arrive, by cause. It reads and
sets the strategy's attributes (``_sent``, ``_sent_before``, ``_node_users``, ``_request``,
``_timeout``, ``lost``, ``node_errors``, ``unrequested``, ``stop_at_task_error``).

Every sampled user of a round ends in exactly one of these round metrics (summed over the
cohorts of a round), so ``cohort_size = received + failed + timed_out + unavailable + dropped +
unhosted`` for a single-cohort strategy:

* ``received``: its update arrived (the aggregator then accepts or rejects it);
* ``failed``: its node answered with an error (the ClientApp raised, crashed or did not load);
* ``timed_out``: its node sent no reply before the round timeout;
* ``unavailable``: the SuperLink answered for the node that the node or its reply is unavailable
  (Flower error codes ``MESSAGE_UNAVAILABLE``, ``REPLY_MESSAGE_UNAVAILABLE``, ``NODE_UNAVAILABLE``);
* ``dropped``: its node replied without its update (among them a user whose training failed
  on a node where another user trained: left out alone, forty-seventh review of issue 15);
* ``unhosted``: no connected node hosts it (no message was sent).

``node_errors`` still counts error replies (nodes, not users) and ``unrequested`` updates under
keys nobody asked for. None of this changes the accounting, which follows the sampling.

A cohort whose every node asked answered with the task's error (code
:data:`~fedprivopt.clients.messages.TASK_ERROR`: the task breaks its protocol, the same on every
node) ends the run with that :class:`~fedprivopt.models.task.TaskError` before the round is
aggregated, as the fast engine stops at the first such user; a task error beside any other
outcome (an update, a time-out, another failure) is counted as ``failed`` like any error, unless
``stop_at_task_error`` (Flower's simulation engine, whose nodes all run the same task on the same
data) ends the run at the first one.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Message
from flwr.common import log
from flwr.common.constant import ErrorCode

from fedprivopt import wire as P
from fedprivopt.clients.messages import TASK_ERROR
from fedprivopt.core.text import shown
from fedprivopt.strategies.discovery import task_failure
from fedprivopt.strategies.requests import ReportedUpdates

__all__ = ["LOSS_METRICS", "ReplyCollection"]

LOSS_METRICS = ("failed", "timed_out", "unavailable", "dropped", "unhosted")
"""Round metrics counting sampled users whose update did not arrive, by cause."""

# error replies that the SuperLink writes for a node (not the node's own failure)
_UNAVAILABLE = frozenset(
    {
        ErrorCode.MESSAGE_UNAVAILABLE,
        ErrorCode.REPLY_MESSAGE_UNAVAILABLE,
        ErrorCode.NODE_UNAVAILABLE,
    }
)


class ReplyCollection:
    """The train replies of :class:`~fedprivopt.strategies.flower.DPStrategy` (a mixin)."""

    def _reply_node(self, reply: Message, sent: dict[str, int]) -> int | None:
        """The node a reply answers, or ``None``.

        By the id of the message it replies to (the SuperLink's own error replies have the
        SuperLink as sender), else by its sender if that node was asked this cohort.
        """
        node = sent.get(reply.metadata.reply_to_message_id)
        if node is None and reply.metadata.src_node_id in self._node_users:
            node = reply.metadata.src_node_id
        return node

    @staticmethod
    def _said_other_cohort(nodes: list[int]) -> None:
        """Say the replies to messages not of this cohort (their senders ``nodes``), ignored.

        Forty-seventh review of issue 15 (wire 2): a reply answering a message of another round
        or cohort (a ServerApp of one's own handing ``aggregate_train`` of round 2 the replies of
        round 1) was read as its sender's reply: round 2 was released from 6 updates trained on
        round 1's model, without a word but for the keys of users not asked again.
        """
        more = f" and {len(nodes) - 1} more" if len(nodes) > 1 else ""
        log(
            WARNING,
            "ignored the reply of node %s%s: it answers a message of another round or cohort, "
            "not one of this cohort's (aggregate_train takes the replies to configure_train's "
            "messages of its round)",
            nodes[0],
            more,
        )

    def _said_unrequested(self, node: int, keys: list[str]) -> None:
        """Count ``keys``, one reply's updates under keys not asked of ``node``, in one warning.

        Forty-third review of issue 15 (wire 10): one warning a key, so a node keying its
        updates otherwise (by position, every hosted user) wrote a line for each of its users in
        every round (20,000 lines for a reply of 20,000 such keys).
        """
        self.unrequested += len(keys)
        more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
        log(
            WARNING,
            "node %s sent an update under an unrequested key %s%s",
            node,
            shown(keys[0]),
            more,
        )

    @staticmethod
    def _said_undecodable(node: int, reasons: dict[int, str]) -> None:
        """Say one reply's undecodable updates (user to NumPy's or torch's reason) in one warning.

        Forty-fifth review of issue 15 (wire 5): one warning a user, each holding the reason
        whole: NumPy's ``Cannot parse header`` repeats a forged header of up to 10,000 characters,
        so a reply of 500 such updates wrote 500 lines and 5 MB a round.
        """
        user = min(reasons)
        more = f" and {len(reasons) - 1} more" if len(reasons) > 1 else ""
        log(
            WARNING,
            "node %s: undecodable update of user %d%s: %s",
            node,
            user,
            more,
            shown(reasons[user]),
        )

    def _updates(self, replies: Iterable[Message]) -> dict[int, Any]:
        """``{user: flat update}`` from train replies; nothing a client sends can raise here.

        An update that cannot be decoded into a tensor (missing ``delta``, undecodable bytes, an
        unsupported serialization or byte order) maps to ``None``, which the aggregator rejects
        and counts; an update under a key that was not requested from that node (another
        node's user, an unknown id, a non-canonical key) is dropped and counted in
        ``unrequested``. Users whose update did not arrive are counted by cause in
        :attr:`lost` (see the module docstring); this is called once per cohort, right after
        ``send_and_receive`` of that cohort's messages.

        Raises
        ------
        TaskError
            When every node asked answered with the task's error, or one did with
            ``stop_at_task_error`` (:func:`~fedprivopt.strategies.discovery.task_failure`).
        """
        sent = {m.metadata.message_id: m.metadata.dst_node_id for m in self._sent}
        sent.pop("", None)
        answered: set[int] = set()
        errored: set[int] = set()
        task_errors: dict[int, str] = {}  # said below, unless they end the run
        updates = ReportedUpdates()
        other_cohort: list[int] = []  # senders of replies to other messages (wire 2), said once
        for reply in replies:
            answers = reply.metadata.reply_to_message_id
            earlier = self._sent_before  # the ids of the cohort before (the strategy's)
            if answers and answers not in sent and (sent or answers in earlier):
                other_cohort.append(reply.metadata.src_node_id)
                continue
            node = self._reply_node(reply, sent)
            if node is not None and node in answered:
                continue  # a second reply to one message: the first one counts
            if node is not None:
                answered.add(node)
            if reply.has_error():
                self.node_errors += 1
                if node is not None and reply.error.code == TASK_ERROR:
                    task_errors[node] = str(reply.error.reason)
                else:
                    log(WARNING, "node %s failed: %s", node, shown(reply.error.reason))
                if node is not None:
                    errored.add(node)
                    cause = "unavailable" if reply.error.code in _UNAVAILABLE else "failed"
                    self.lost[cause] += len(self._node_users[node])
                continue
            if node is None:
                node = reply.metadata.src_node_id
            # a set (forty-sixth review of issue 15, wire 1: the node's list was scanned for every
            # key, so a reply of 20,000 asked updates took 5 s to read, 20,000 keys not asked
            # beside them 9 s more; quadratic in the users a node hosts)
            asked = frozenset(self._node_users.get(node, ()))
            unrequested: list[str] = []  # said once a reply (forty-third review, wire 10)
            undecodable: dict[int, str] = {}  # said once a reply, cut (forty-fifth, wire 5)
            for key, record in reply.content.items():  # records of every kind (wire 5)
                if not key.startswith(P.UPDATE_PREFIX):
                    continue
                user = P.parse_update_key(key)
                if user is None or user not in asked:
                    unrequested.append(key)
                    continue
                updates[user] = None  # unless decoded below; the aggregator rejects and counts it
                if not isinstance(record, ArrayRecord):
                    # forty-sixth review of issue 15 (wire 5): an update sent as a MetricRecord
                    # (or ConfigRecord) of its values was not seen: its user counted as dropped,
                    # without a word, every round
                    undecodable[user] = (
                        f"its record is a {type(record).__name__}, not an ArrayRecord holding "
                        f"the array {P.DELTA_ARRAY!r}"
                    )
                    continue
                if P.DELTA_ARRAY not in record:
                    continue
                header = P.long_npy_header(record[P.DELTA_ARRAY])
                if header is not None:
                    undecodable[user] = header
                    continue
                try:
                    array = np.array(record[P.DELTA_ARRAY].numpy(), copy=True)
                    updates[user] = torch.from_numpy(array)
                except Exception as exc:  # hostile bytes: np.load and torch raise many types
                    undecodable[user] = str(exc)
                if P.CLIP_BIT_ARRAY in record:  # checked by the round (adaptive clipping)
                    if P.long_npy_header(record[P.CLIP_BIT_ARRAY]) is not None:  # not parsed either
                        updates.clip_bits[user] = "undecodable"
                        continue
                    try:
                        updates.clip_bits[user] = np.array(
                            record[P.CLIP_BIT_ARRAY].numpy(), copy=True
                        )
                    except Exception:  # undecodable: the round rejects the reply
                        updates.clip_bits[user] = "undecodable"
            if unrequested:
                self._said_unrequested(node, unrequested)
            if undecodable:
                self._said_undecodable(node, undecodable)
        if other_cohort:
            self._said_other_cohort(other_cohort)
        every = task_errors.keys() == self._node_users.keys()
        if task_errors and (every or self.stop_at_task_error):
            where = (
                "asked" if self._request is None else f"asked in round {self._request.round_num}"
            )
            raise task_failure(task_errors, len(self._node_users), where)
        for node, reason in task_errors.items():
            log(WARNING, "node %s failed: %s", node, shown(reason))
        for node, users in self._node_users.items():
            if node not in answered:
                self.lost["timed_out"] += len(users)
                log(WARNING, "node %s sent no reply within %g s", node, self._timeout)
            elif node not in errored:
                self.lost["dropped"] += sum(1 for u in users if u not in updates)
        return updates
