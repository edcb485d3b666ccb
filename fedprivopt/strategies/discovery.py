"""Which users each Flower node hosts: the user query at the start of a run.

:class:`UserDiscovery` is the part of :class:`~fedprivopt.strategies.flower.DPStrategy` that asks
every connected node (a ``query`` message) which users it hosts, batch by batch, until the
population is found or ``node_wait`` has passed; the sampling is over users, so the strategy
sends each node only the sampled users it hosts. :func:`task_failure` is the error that ends a
run whose nodes answered with the task's error (code
:data:`~fedprivopt.clients.messages.TASK_ERROR`), at the query or in a round.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from logging import WARNING

from flwr.app import Message
from flwr.common import log
from flwr.serverapp import Grid

from fedprivopt import wire as P
from fedprivopt.clients.messages import TASK_ERROR
from fedprivopt.core.text import shown
from fedprivopt.models.task import TaskError

__all__ = ["MAX_REASON_CHARS", "QUERY_BATCH", "UserDiscovery", "task_failure"]

QUERY_BATCH = 256
"""Nodes asked the user query at once (:meth:`UserDiscovery.discover_users`).

Flower's simulation engine hands messages to its nodes in passes over every node, each scanning
every stored message (``add_messages_to_queue``: nodes x messages), and checks whether to stop
only between passes. 8,000 queries at once made a pass take minutes on 2 busy cores, and a
Ctrl-C or SIGTERM of the run waited for it (thirty-third review of issue 15)."""

MAX_REASON_CHARS = 1000
"""Characters of a task's error, as a node sent it, that the run's last line shows whole."""


def task_failure(reasons: dict[int, str], asked: int, where: str) -> TaskError:
    """The error ending a run whose nodes answered with the task's error.

    ``reasons`` maps each node to the reason of its reply (the ClientApp's ``TaskError``); the
    first one is named, whole when it is one line of at most :data:`MAX_REASON_CHARS` characters
    (a node's own text: a longer one is cut as other echoed values). ``asked``: the nodes asked;
    ``where``: ``asked in round 3``.
    """
    reason = next(iter(reasons.values()))
    if len(reason) > MAX_REASON_CHARS or not reason.isprintable():
        reason = shown(reason)
    if len(reasons) < asked:
        nodes = f"{len(reasons)} of the {asked} nodes"
    else:
        nodes = "the one node" if asked == 1 else f"all {asked} nodes"
    others = len(set(reasons.values())) - 1
    also = f", {others} of them with another error" if others else ""
    return TaskError(f"{reason} (the answer of {nodes} {where}{also})")


class UserDiscovery:
    """The user query of :class:`~fedprivopt.strategies.flower.DPStrategy` (a mixin).

    It reads and sets the strategy's ``algorithm``, ``min_nodes``, ``node_wait``, ``_timeout``,
    ``stop_at_task_error``, ``node_errors``, ``user_nodes`` and ``_discovered``.
    """

    def discover_users(self, grid: Grid) -> dict[int, int]:
        """Ask every node which users it hosts; returns ``{user_id: node_id}``.

        Nodes may come online one by one (simulated nodes start after the ServerApp), so new
        nodes are queried until every user of the population is found, or ``node_wait`` seconds
        have passed, at least ``min_nodes`` nodes answered and no new node connected since the
        last query (then the missing users are logged: they are still sampled, and simply never
        reply).

        Raises
        ------
        TaskError
            When at least ``min_nodes`` nodes were asked and every one answered with the task's
            error, or one did with ``stop_at_task_error`` (thirty-third review of issue 15: a
            task whose model has nothing to train waited ``node_wait``, 120 s, then released
            noise-only rounds with every user on no node, rc 0; the fast engine stops with the
            error).
        ValueError
            When fewer than ``min_nodes`` nodes connected, none hosts a user of the population,
            or two nodes host one user (thirty-fourth review of issue 15: these were
            ``RuntimeError``, a traceback from the command line where one line says it).
        """
        population = set(self.algorithm.user_ids)  # public users (AdaDPS) are never asked
        deadline = time.monotonic() + self.node_wait
        mapping: dict[int, int] = {}
        queried: set[int] = set()
        task_failed: dict[int, str] = {}  # nodes that answered with the task's error
        while True:
            new = sorted(set(grid.get_node_ids()) - queried)
            # a node answers its first message only after starting its ClientApp (seconds on a
            # busy machine): wait as long as for nodes to connect, not just a round timeout
            wait = max(self._timeout, self.node_wait)
            for first in range(0, len(new), QUERY_BATCH):
                batch = new[first : first + QUERY_BATCH]
                queried.update(batch)
                messages = [
                    Message(content=P.users_query(), dst_node_id=n, message_type="query")
                    for n in batch
                ]
                failed: dict[int, str] = {}  # the task's errors, said after the batch
                replies = grid.send_and_receive(messages, timeout=wait)
                # the grid wrote each message's id when it pushed it
                sent = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
                sent.pop("", None)
                self._read_users(replies, mapping, failed, sent, population)
                task_failed.update(failed)
                every = len(queried) >= self.min_nodes and task_failed.keys() == queried
                if task_failed and (every or self.stop_at_task_error):
                    # the task cannot be built as the run config says (on every node so far)
                    raise task_failure(task_failed, len(queried), "to the user query")
                for node, reason in failed.items():
                    log(WARNING, "node %s failed the user query: %s", node, shown(reason))
            if len(queried) >= self.min_nodes and population <= set(mapping):
                break
            # give up only after a pass that found no new node: nodes that connected while a
            # long query was out (8,000 simulated nodes take minutes to answer) are asked too
            if not new and time.monotonic() > deadline:
                if len(queried) < self.min_nodes:
                    raise ValueError(
                        f"only {len(queried)} of min_nodes={self.min_nodes} nodes connected "
                        f"within {self.node_wait:g} s"
                    )
                if not mapping:
                    # thirty-third review of issue 15 (lead, the flower reviewer's suggestion):
                    # every node failed the user query (another error than the task's, e.g. a
                    # device it lacks) and the run released noise-only rounds, charged, rc 0
                    raise ValueError(
                        f"none of the {len(queried)} connected nodes hosts a user of the "
                        "population (each failed the user query or hosts none; see the "
                        "warnings above): no round would train anyone, so none was released"
                    )
                log(
                    WARNING,
                    "%d of %d users are on no connected node (they will never reply)",
                    len(population - set(mapping)),
                    len(population),
                )
                break
            time.sleep(0.2)
        self.user_nodes = mapping
        self._discovered = True
        return mapping

    def _read_users(
        self,
        replies: Iterable[Message],
        mapping: dict[int, int],
        failed: dict[int, str],
        sent: dict[str, int],
        population: set[int],
    ) -> None:
        """Add the users of the answers to the user query to ``mapping`` (user → node).

        An error reply or a malformed answer is a node error (its users stay on no node); the
        reasons of replies with the task's error go to ``failed`` (node → reason), said later.
        A reply is the node's whose query it answers (``sent``: message id → node), else its
        sender's, and a node's first reply counts. Forty-third review of issue 15 (wire 4): a
        second reply of one node ended the run (``user 0 is hosted by nodes 100 and 100: two
        SuperNodes have the same partition-id``), where a round takes a node's first reply, and
        the SuperLink's own error reply for a node was said as the SuperLink's failure (``node
        1 failed the user query``), where a round names the node. Only the users of
        ``population`` are kept (no other is ever sampled): forty-fifth review (wire 6), a node
        answering with 3,000,000 ids outside it grew the mapping by as many entries, 420 MB
        held for the whole run (and walked every round of a tree run).
        """
        answered: set[int] = set()
        for reply in replies:
            node = sent.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
            if node in answered:
                continue
            answered.add(node)
            if reply.has_error():
                self.node_errors += 1
                if reply.error.code == TASK_ERROR:
                    failed[node] = str(reply.error.reason)
                    continue
                log(WARNING, "node %s failed the user query: %s", node, shown(reply.error.reason))
                continue
            try:
                users = P.read_user_ids(reply.content)
            except ValueError as exc:
                # malformed: as an error reply, its users stay on no node (unhosted)
                self.node_errors += 1
                log(WARNING, "node %s answered the user query malformed: %s", node, exc)
                continue
            for user in users:
                if user not in population:  # never sampled (AdaDPS' public users, or none)
                    continue
                if user in mapping:  # no user may be trained (and sampled) twice
                    raise ValueError(
                        f"user {user} is hosted by nodes {mapping[user]} and {node}: two "
                        f"SuperNodes have the same {P.NODE_PARTITION_ID}, or different "
                        f"{P.NODE_NUM_PARTITIONS} (start node p of P with --node-config "
                        f'"{P.NODE_PARTITION_ID}=p {P.NODE_NUM_PARTITIONS}=P")'
                    )
                mapping[user] = node
