"""Issue 15, forty-seventh hostile review (wire: Flower messages, replies, the strategy): tests.

1. Under tree aggregation, a round left at its cohort: a ServerApp of one's own calling
   ``DPStrategy.configure_train`` for round 1 again (its first send failed), or ``drive_round``
   whose train callback raised (a network error) and then ``drive_round`` of round 1 again.
   Before: the abandoned round's cohort stayed checked in to the period's participation ledger
   beside the second one (8 users at step 1 of a period of 4 a round): 4 of 12 users lost to the
   period (round 3 trained none), and the algorithm's own ``state_dict()`` after round 1 was
   refused by ``load_state_dict`` as edited. Now the round generator checks its cohort out when
   it is closed at its cohort (``ServerAlgorithm.run_round``), ``drive_round`` closes it when the
   callback raises, and the strategy closes a round it configured and did not aggregate
   (``DPStrategy._leave_round``). Only while its draw is the last one: a round closed late (after
   ``load_state_dict`` of the state before it, the same seeded cohort drawn and released by
   ``drive_round``) checked the released users out, so they could be drawn again in the period
   (the first form of this fix; the ledger held none of the 4 released users).
2. A ServerApp of one's own handing ``DPStrategy.aggregate_train`` of round 2 the replies of
   round 1 (a variable kept from the round before), round 2's messages sent or not. Before: each
   reply was read as its sender's reply (by its sender, where it answers none of this cohort's
   messages): round 2 was released from the round-1 updates of users asked again (6 of 8,
   trained on round 1's model), said only as the keys of users not asked again (``unrequested``
   2). Now a reply to a message of another round or cohort (its ``reply_to_message_id`` not one
   of this cohort's messages, which the grid wrote ids into, or one of the cohort before's) is
   ignored, in one warning, ``ignored the reply of node 100 and 2 more: it answers a message of
   another round or cohort ...`` (``ReplyCollection._updates``); its node's users are counted
   as not answered (``timed_out``), unless the node's own reply came.
3. A ServerApp of one's own calling ``DPStrategy.aggregate_train(5, replies)`` (or ``True``, 2)
   after ``configure_train(1, ...)`` (a loop's off-by-one). Before: round 1 was released and said
   as round 5 (the warnings, the metrics the app files under 5). Now ``ValueError:
   aggregate_train's server_round is 5, but the round configured (configure_train) is round 1:
   give its own number``, nothing released, and the round stays configured: ``aggregate_train(1,
   replies)`` then releases it as before.

The tests run DPStrategy in process on scripted grids (no Flower engine, no Ray).
"""

from __future__ import annotations

import logging
import uuid

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from fedprivopt import wire as P
from fedprivopt.privacy.flat import flatten
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from fedprivopt.strategies.flower import DPStrategy, flat_to_arrays
from tests.messages import reply_metadata

NODES = {100: [0, 3, 6, 9], 101: [1, 4, 7, 10], 102: [2, 5, 8, 11]}


class _Grid:
    """Three nodes hosting users 0-11, each answering every asked user with a small update."""

    def get_node_ids(self):
        return list(NODES)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # as a grid pushes it
            node = msg.metadata.dst_node_id
            if msg.metadata.message_type == "query":
                content = RecordDict({P.USERS_RECORD: ConfigRecord({P.USER_IDS: NODES[node]})})
            else:
                users = msg.content.config_records[P.CONFIG_RECORD][P.USERS]
                delta = ArrayRecord({P.DELTA_ARRAY: Array(np.full(3, 0.01, np.float32))})
                content = RecordDict({P.update_key(u): delta for u in users})
            replies.append(Message(content, metadata=reply_metadata(msg, node)))
        return replies


def _strategy(**extra) -> tuple[DPStrategy, ArrayRecord]:
    flat, spec = flatten({"w": torch.zeros(3)})
    fields = {"population": 12, "clients_per_round": 4, "noise_multiplier": 1.0, "seed": 3}
    config = StrategyConfig(**(fields | extra))
    return DPStrategy(build_algorithm(config, flat), spec, node_wait=0.0), flat_to_arrays(
        flat, spec
    )


# -- finding 1: a round left at its cohort checks its cohort out of the tree's period -------------

TREE = {"noise_mechanism": "tree", "tree_restart_rounds": 3}


def _period_users(strategy: DPStrategy) -> list[int]:
    return sorted(int(u) for u in strategy.algorithm.tree_cohorts.state_dict()["users"])


def test_1_configure_train_again_checks_the_first_cohort_out(server_side):
    strategy, arrays = _strategy(**TREE)
    grid = _Grid()
    strategy.configure_train(1, arrays, ConfigRecord(), grid)  # its send failed: configured again
    messages = strategy.configure_train(1, arrays, ConfigRecord(), grid)
    arrays, metrics = strategy.aggregate_train(1, grid.send_and_receive(messages))
    assert len(_period_users(strategy)) == 4  # before: 8, a second cohort checked in
    state = strategy.algorithm.state_dict()
    other = build_algorithm(strategy.algorithm.config, strategy.algorithm.params)
    other.load_state_dict(state)  # before: refused as edited (8 users at step 1 of period 0)
    for round_num in (2, 3):
        messages = strategy.configure_train(round_num, arrays, ConfigRecord(), grid)
        arrays, metrics = strategy.aggregate_train(round_num, grid.send_and_receive(messages))
        assert metrics["cohort_size"] == 4  # before: round 3 trained none
    assert len(_period_users(strategy)) == 12


def test_1_drive_round_whose_callback_raised_checks_its_cohort_out():
    strategy, _ = _strategy(**TREE)
    alg = strategy.algorithm

    def lost(request):
        raise OSError("the network is down")

    with pytest.raises(OSError):
        drive_round(alg, 1, lost)
    assert _period_users(strategy) == []  # before: the cohort stayed checked in
    result = drive_round(alg, 1, lambda request: {u: torch.zeros(3) for u in request.users})
    assert result.metrics["cohort_size"] == 4 and len(_period_users(strategy)) == 4  # before: 8


def test_1_a_round_closed_late_leaves_a_released_cohort_checked_in():
    strategy, _ = _strategy(**TREE)
    alg = strategy.algorithm
    before = alg.state_dict()
    left = alg.run_round(1)
    drawn = next(left).users
    alg.load_state_dict(before)  # the state before the round, its ledger empty
    drive_round(alg, 1, lambda request: {u: torch.zeros(3) for u in request.users})
    assert _period_users(strategy) == sorted(drawn)  # the same seeded cohort, released
    left.close()  # the first attempt, closed late
    assert _period_users(strategy) == sorted(drawn)  # the fix's first form: [] (checked out)


# -- finding 2: a reply to a message of another round or cohort is not this cohort's -------------


@pytest.mark.parametrize("sent", [True, False])
def test_2_replies_of_round_1_are_not_round_2s(server_side, caplog, sent):
    strategy, arrays = _strategy()
    grid = _Grid()
    first = grid.send_and_receive(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    arrays, _ = strategy.aggregate_train(1, first)
    messages = strategy.configure_train(2, arrays, ConfigRecord(), grid)
    second = grid.send_and_receive(messages) if sent else []
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, metrics = strategy.aggregate_train(2, first)  # before: read as round 2's replies
    assert metrics["received"] == 0 and metrics["accepted"] == 0  # before: 2 of round 1's
    assert metrics["timed_out"] == metrics["cohort_size"]
    said = [r.getMessage() for r in caplog.records if "ignored the reply" in r.getMessage()]
    assert len(said) == 1 and "answers a message of another round or cohort" in said[0]
    if sent:  # the node's own reply beside the stale one is read
        strategy, arrays = _strategy()
        first = grid.send_and_receive(strategy.configure_train(1, arrays, ConfigRecord(), grid))
        arrays, _ = strategy.aggregate_train(1, first)
        second = grid.send_and_receive(strategy.configure_train(2, arrays, ConfigRecord(), grid))
        _, metrics = strategy.aggregate_train(2, first + second)
        assert metrics["received"] == metrics["accepted"] == metrics["cohort_size"] > 0


# -- finding 3: aggregate_train's round is the round configured ----------------------------------


@pytest.mark.parametrize("given", [5, 2, True])
def test_3_aggregate_train_of_another_round_is_refused_and_the_round_kept(server_side, given):
    strategy, arrays = _strategy()
    grid = _Grid()
    replies = grid.send_and_receive(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    with pytest.raises(ValueError, match=r"^aggregate_train's server_round is (5|2|True), but the"):
        strategy.aggregate_train(given, replies)  # before: round 1 released, said as round 5
    assert strategy.algorithm.round_num == 0 and strategy.algorithm.epsilon() == 0.0
    _, metrics = strategy.aggregate_train(1, replies)
    assert strategy.algorithm.round_num == 1 and metrics["accepted"] == metrics["cohort_size"] > 0
