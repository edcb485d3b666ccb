"""Tree aggregation through the Flower strategy: the participation ledger of a deployment.

A scripted grid (no Ray) whose nodes come and go: the strategy forms each round's cohort from
users on connected nodes who have not taken part in the restart period, never asks a user twice
in a period, and its ledger refuses a second check-in outright.
"""

import pytest
import torch

from fedprivopt import wire as P
from fedprivopt.privacy.flat import flatten
from fedprivopt.privacy.tree import ParticipationError
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy
from fedprivopt.strategies.flower_arrays import flat_to_arrays
from tests.strategies.test_flower_faults import NODE_USERS, ScriptedGrid


class ComingAndGoing(ScriptedGrid):
    """Every node answers discovery; during training only :attr:`connected` nodes are listed."""

    def __init__(self):
        super().__init__({})
        self.connected = list(NODE_USERS)
        self.asked: list[list[int]] = []  # users of the train messages of each round

    def get_node_ids(self):
        return list(self.connected)

    def send_and_receive(self, messages, *, timeout=None):
        train = [m for m in messages if m.metadata.message_type == "train"]
        if not messages or train:  # a round's send (an empty cohort sends nothing)
            users = [u for m in train for u in m.content.config_records[P.CONFIG_RECORD][P.USERS]]
            self.asked.append(sorted(users))
        return super().send_and_receive(messages, timeout=timeout)


def test_a_deployment_asks_each_user_once_a_period_and_refuses_a_second_check_in(server_side):
    config = StrategyConfig(strategy="dp-fedadam", population=12, clients_per_round=2,
                            num_server_rounds=8, noise_multiplier=1.0, seed=4,
                            noise_mechanism="tree", tree_restart_rounds=6)  # fmt: skip
    flat, spec = flatten({"w": torch.zeros(6)})
    alg = build_algorithm(config, flat)
    grid = ComingAndGoing()
    # rounds 1-3: only nodes 100 and 101 (users 0-3) are connected; then all of them
    plan = {1: [100, 101], 2: [100, 101], 3: [100, 101]}
    rows = []

    def on_round(result, _):
        rows.append(result.metrics)
        grid.connected = plan.get(result.round_num + 1, list(NODE_USERS))

    strategy = DPStrategy(alg, spec, node_wait=0.3, on_round=on_round)
    discover = strategy.discover_users

    def discover_all(g):  # every node answers the user query at the start
        training, grid.connected = grid.connected, list(NODE_USERS)
        try:
            return discover(g)
        finally:
            grid.connected = training

    strategy.discover_users = discover_all
    grid.connected = plan[1]
    strategy.start(grid, flat_to_arrays(flat, spec), 8, timeout=1.0)

    period = grid.asked[:6]
    assert sorted(u for users in period[:2] for u in users) == [0, 1, 2, 3]
    assert period[2] == []  # users 0-3 already took part; nobody else was reachable
    assert [len(users) for users in period[3:]] == [2, 2, 2]
    seen = [u for users in period for u in users]
    assert len(seen) == len(set(seen)) == 10  # nobody twice in the period
    assert [m["cohort_size"] for m in rows[:6]] == [2, 2, 0, 2, 2, 2]
    assert all(len(users) == 2 for users in grid.asked[6:])  # period 1: everyone again
    assert len(rows) == 8 and torch.isfinite(alg.params).all()

    # the ledger itself: a user of this period cannot check in again
    ledger = alg.tree_cohorts.ledger
    again = grid.asked[6][0]
    with pytest.raises(ParticipationError, match=f"user {again} already took part"):
        ledger.check_in(1, [again])
    # ε: two restart periods charged, whatever the cohorts were
    assert alg.accountant.num_events == 2
