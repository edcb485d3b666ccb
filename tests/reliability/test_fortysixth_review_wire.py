"""Issue 15, forty-sixth hostile review (wire: Flower messages, replies, the ClientApp): tests.

1. ``DPStrategy`` in process (a grid of one's own) reading a train reply of node 100, asked for
   users 0-1,999 (one SuperNode hosting many users), that holds their 2,000 updates, or 2,000
   updates under keys not asked of it (a rogue node). Before: each key was looked up in the
   node's list of asked users (``user not in self._node_users.get(node, [])``): a scan of the
   list per key, quadratic in the users a node hosts: a reply of 20,000 asked updates took 5 s
   to read (0.3 s of it decoding), 20,000 unasked keys beside them 9 s more, every round (a
   rogue node's 200,000 keys against 20,000 asked users about 15 minutes). Now the node's users
   are one set a reply (``ReplyCollection._updates``): 2.8 s and 0.4 s, linear; the test counts
   the scans of the list (0 where there were 4,000), and the updates read, ``unrequested`` and
   ``dropped`` are as before.
2. ``DPStrategy`` in process (a grid of one's own) whose node 100 hosts 200 users and answers
   with updates of another shape for a third of them and float64 updates of a float32 model for
   the rest (a ClientApp of one's own training another model, or a rogue node). Before: one
   warning a rejected user, ``round 1: rejected the update of user 0: shape (4,) != (3,)``: 200
   lines a round (2,000 lines and 145 kB a round at 2,000 users), where a reply's unrequested
   and undecodable updates are one warning each (forty-third review, wire 10; forty-fifth, wire
   5). Now one warning a round, by reason: ``round 1: rejected 200 updates: user 0 and 66 more:
   shape (4,) != (3,); user 1 and 132 more: dtype torch.float64 != torch.float32``, at most
   five reasons shown and the rest counted (``strategies.flower.rejected_text``); ``rejected``
   and ``accepted`` as before.

The tests run fedprivopt's ClientApp and DPStrategy in process (no Flower engine, no Ray).
"""

from __future__ import annotations

import logging
import uuid

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from fedprivopt import wire as P
from fedprivopt.privacy.flat import flatten
from fedprivopt.strategies import StrategyConfig, build_algorithm, flower
from fedprivopt.strategies.flower import DPStrategy, flat_to_arrays
from tests.messages import delivered, reply_metadata

# -- finding 1: a reply's keys are looked up in a set of the node's users, not its list -----------


class _CountingList(list):
    """A node's list of asked users that counts the membership scans made of it."""

    scans = 0

    def __contains__(self, item: object) -> bool:
        type(self).scans += 1
        return super().__contains__(item)


def _read_reply(first: int, count: int, asked: int) -> tuple[DPStrategy, dict]:
    """Node 100, asked for users ``0..asked-1``, replies with users ``first..first+count-1``."""
    flat, spec = flatten({"w": torch.zeros(2)})
    config = StrategyConfig(population=4 * asked, clients_per_round=asked, noise_multiplier=0.8)
    strategy = DPStrategy(build_algorithm(config, flat), spec, node_wait=0.0)
    message = delivered({}, "train", dst_node_id=100)
    strategy._sent = [message]
    strategy._node_users = {100: _CountingList(range(asked))}
    delta = ArrayRecord({P.DELTA_ARRAY: Array(np.full(2, 0.01, np.float32))})
    content = RecordDict({P.update_key(u): delta for u in range(first, first + count)})
    reply = Message(content, metadata=reply_metadata(message, 100))
    return strategy, strategy._updates([reply])


def test_1_a_replys_keys_are_not_each_a_scan_of_the_nodes_users():
    _CountingList.scans = 0
    strategy, updates = _read_reply(0, 2000, 2000)
    assert sorted(updates) == list(range(2000))
    assert torch.equal(updates[1999], torch.full((2,), 0.01))
    assert strategy.unrequested == 0 and strategy.lost["dropped"] == 0
    strategy, updates = _read_reply(2000, 2000, 2000)  # a rogue node's keys, none asked
    assert updates == {} and strategy.unrequested == 2000
    assert strategy.lost["dropped"] == 2000
    assert _CountingList.scans == 0  # before: 4,000 scans of a list of 2,000 users


# -- finding 2: a round's rejected updates are one warning, by reason -----------------------------


class _OtherModelGrid:
    """Node 100 hosts users 0-199 and sends updates of another shape or dtype for each."""

    def get_node_ids(self):
        return [100]

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # as a grid pushes it
            if msg.metadata.message_type == "query":
                content = RecordDict({P.USERS_RECORD: ConfigRecord({P.USER_IDS: list(range(200))})})
            else:
                users = msg.content.config_records[P.CONFIG_RECORD][P.USERS]
                content = RecordDict(
                    {
                        P.update_key(u): ArrayRecord(
                            {
                                P.DELTA_ARRAY: Array(
                                    np.full(4, 0.01, np.float32)
                                    if u % 3 == 0
                                    else np.full(3, 0.01, np.float64)
                                )
                            }
                        )
                        for u in users
                    }
                )
            replies.append(Message(content, metadata=reply_metadata(msg, 100)))
        return replies


def test_2_a_rounds_rejected_updates_are_one_warning_by_reason(server_side, caplog):
    config = StrategyConfig(population=200, clients_per_round=200, noise_multiplier=0.8, seed=5)
    flat, spec = flatten({"w": torch.zeros(3)})
    rows: list[dict] = []
    strategy = DPStrategy(
        build_algorithm(config, flat),
        spec,
        node_wait=0.0,
        on_round=lambda r, _: rows.append(r.metrics),
    )
    with caplog.at_level(logging.WARNING, logger="flwr"):
        strategy.start(_OtherModelGrid(), flat_to_arrays(flat, spec), 1, timeout=1.0)
    said = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert said == [  # before: 200 lines, one a user
        "round 1: rejected 200 updates: user 0 and 66 more: shape (4,) != (3,); user 1 and 132 "
        "more: dtype torch.float64 != torch.float32"
    ]
    assert rows[0]["rejected"] == 200 and rows[0]["accepted"] == 0


def test_2_rejected_text_shows_five_reasons_and_counts_the_rest():
    assert flower.rejected_text(3, {7: "contains NaN or Inf"}) == (
        "round 3: rejected the update: user 7: contains NaN or Inf"
    )
    text = flower.rejected_text(2, {u: f"reason {u % 8}" for u in range(16)})
    assert text == (
        "round 2: rejected 16 updates: user 0 and 1 more: reason 0; user 1 and 1 more: reason 1; "
        "user 2 and 1 more: reason 2; user 3 and 1 more: reason 3; user 4 and 1 more: reason 4; "
        "6 more for 3 other reasons"
    )
