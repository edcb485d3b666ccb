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

The tests run fedprivopt's ClientApp and DPStrategy in process (no Flower engine, no Ray).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, RecordDict

from fedprivopt import wire as P
from fedprivopt.privacy.flat import flatten
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy
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
