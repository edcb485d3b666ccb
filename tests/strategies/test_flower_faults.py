"""Hostile and failing clients in Flower's simulation engine: the rounds complete, malformed
updates are rejected and counted, an oversized one is re-clipped, lost updates are counted by
cause (error reply, time-out, dropped), and accounting is unchanged.

The last tests drive :meth:`DPStrategy.start` through a scripted in-process grid (no Ray) to
cover the causes a simulation cannot produce on demand (the SuperLink's "node unavailable"
reply, users hosted by no node) and to compare ε with and without time-outs.
"""

import time
import uuid

import numpy as np
import pytest
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    RecordDict,
)
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedprivopt import wire as P
from fedprivopt.models import build_task, initial_flat, model_spec
from fedprivopt.privacy import compose_epsilon, make_round_event
from fedprivopt.privacy.flat import flatten
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy
from fedprivopt.strategies.flower_arrays import flat_to_arrays
from fedprivopt.strategies.flower_replies import LOSS_METRICS
from tests.faults import make_faulty_client_app
from tests.messages import reply_metadata
from tests.strategies.recorder import RunRecorder

USERS, ROUNDS = 12, 4
TIMEOUT, SLEEP = 4.0, 6.0  # a "slow" node sleeps past the round timeout
TASK = {"num_users": USERS, "seed": 3}
FAULTS = {
    0: "raise",
    1: "nan",
    2: "inf",
    3: "shape",
    4: "dtype",
    5: "missing",
    6: "huge",
    7: "foreign",
    8: "slow",
    9: "drop",
}
REJECTED = {1, 2, 3, 4, 5}
LOST = {0, 8, 9}
CONFIG = StrategyConfig(
    strategy="dp-fedavg",
    population=USERS,
    clients_per_round=8,
    num_server_rounds=ROUNDS,
    noise_multiplier=0.5,
    clip_norm=1.0,
    local_learning_rate=0.5,
    seed=11,
)


@pytest.fixture(scope="module")
def faulty_run():
    recorder = RunRecorder()
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        task = build_task("toy", **TASK)
        alg = build_algorithm(CONFIG, initial_flat(task))
        strategy = DPStrategy(alg, model_spec(task), on_round=recorder)
        # warm up every worker (loading torch takes seconds) under the long default timeout, so
        # that only the slow node misses the short round timeout
        strategy.discover_users(grid)
        strategy.start(
            grid,
            flat_to_arrays(initial_flat(task), model_spec(task)),
            num_rounds=ROUNDS,
            timeout=TIMEOUT,
        )

    run_simulation(
        server_app=app,
        client_app=make_faulty_client_app(
            FAULTS, task="toy", task_params=TASK, sleep_seconds=SLEEP
        ),
        num_supernodes=USERS,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2},
        },
    )
    return recorder


def test_every_round_completes_with_faults_counted(faulty_run):
    rows = faulty_run.rows
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1))
    reference = build_algorithm(CONFIG, torch.zeros(3))  # same seed: same samples
    seen_faults = set()
    for row in rows:
        sampled = set(reference.sample(row["round"]))
        seen_faults |= {FAULTS[u] for u in sampled if u in FAULTS}
        assert row["cohort_size"] == len(sampled)
        assert row["node_errors"] == len(sampled & {0})
        assert row["rejected"] == len(sampled & REJECTED)
        assert row["server_clipped"] == len(sampled & {6})
        assert row["accepted"] == len(sampled - REJECTED - LOST)
        # every lost user is counted once, by cause
        assert row["failed"] == len(sampled & {0})
        assert row["timed_out"] == len(sampled & {8})
        assert row["dropped"] == len(sampled & {9})
        assert row["unavailable"] == row["unhosted"] == 0
        assert row["received"] == len(sampled - LOST)
        assert row["cohort_size"] == row["received"] + sum(row[k] for k in LOSS_METRICS)
    assert seen_faults == set(FAULTS.values())  # every fault was exercised at least once
    assert torch.isfinite(faulty_run.final_params).all()


def test_accounting_is_unchanged_by_failures(faulty_run):
    event = make_round_event(0.5, sample_rate=8 / USERS)
    assert any(row["timed_out"] > 0 for row in faulty_run.rows)
    for row in faulty_run.rows:
        assert row["epsilon"] == compose_epsilon([(event, row["round"])], 1e-5)


# -- a scripted grid: every cause of a lost update, and ε with and without time-outs --------------

DIM = 6
NODE_USERS = {100: [0, 1], 101: [2, 3], 102: [4, 5], 103: [6, 7], 104: [8, 9], 105: [10, 11]}
POPULATION = 13  # user 12 is on no node
BEHAVIOUR = {102: "no reply", 103: "error", 104: "unavailable", 105: "drop 11"}


class ScriptedGrid:
    """The part of Flower's Grid that DPStrategy uses; nodes behave as ``behaviour`` says.

    Like Flower's grids it writes a fresh message id into every message it pushes, and error
    replies the SuperLink makes for a node come from the SuperLink (node id 1).
    """

    def __init__(self, behaviour: dict[int, str]):
        self.behaviour = behaviour

    def get_node_ids(self):
        return list(NODE_USERS)

    @staticmethod
    def _reply(msg: Message, src: int, content=None, error=None) -> Message:
        metadata = reply_metadata(msg, src)
        if error is not None:
            return Message(error, metadata=metadata)
        return Message(content, metadata=metadata)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            node = msg.metadata.dst_node_id
            if msg.metadata.message_type == "query":
                users = ConfigRecord({P.USER_IDS: NODE_USERS[node]})
                replies.append(self._reply(msg, node, RecordDict({P.USERS_RECORD: users})))
                continue
            how = self.behaviour.get(node, "ok")
            if how == "no reply":
                continue
            if how == "error":
                error = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="boom")
                replies.append(self._reply(msg, node, error=error))
                continue
            if how == "unavailable":
                error = Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node unavailable")
                replies.append(self._reply(msg, 1, error=error))
                continue
            content = RecordDict()
            for user in msg.content.config_records[P.CONFIG_RECORD][P.USERS]:
                if how == f"drop {user}":
                    continue
                delta = np.random.default_rng(user).standard_normal(DIM).astype(np.float32)
                content[P.update_key(user)] = ArrayRecord({P.DELTA_ARRAY: Array(0.1 * delta)})
            replies.append(self._reply(msg, node, content))
        return replies


def scripted_run(behaviour: dict[int, str]) -> list[dict]:
    config = StrategyConfig(
        strategy="dp-fedavg",
        population=POPULATION,
        clients_per_round=POPULATION,  # q = 1: every user is sampled in every round
        num_server_rounds=3,
        noise_multiplier=0.8,
        clip_norm=1.0,
        seed=5,
    )
    flat, spec = flatten({"w": torch.zeros(DIM)})
    rows = []
    strategy = DPStrategy(
        build_algorithm(config, flat),
        spec,
        node_wait=0.3,  # user 12 is never found
        on_round=lambda result, _: rows.append({"round": result.round_num, **result.metrics}),
    )
    strategy.start(ScriptedGrid(behaviour), flat_to_arrays(flat, spec), 3, timeout=1.0)
    return rows


def test_scripted_round_metrics_name_every_cause(server_side):
    rows = scripted_run(BEHAVIOUR)
    assert [r["round"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["cohort_size"] == POPULATION
        assert row["received"] == 5  # users 0-3 and 10
        assert row["timed_out"] == 2  # users 4, 5
        assert row["failed"] == 2  # users 6, 7
        assert row["unavailable"] == 2  # users 8, 9
        assert row["dropped"] == 1  # user 11
        assert row["unhosted"] == 1  # user 12
        assert row["node_errors"] == 2  # the error and the SuperLink's unavailable reply
        assert row["cohort_size"] == row["received"] + sum(row[k] for k in LOSS_METRICS)


def test_scripted_epsilon_is_identical_with_and_without_time_outs(server_side):
    """What is accounted is the sampling, not the arrival."""
    lossy = scripted_run({102: "no reply", 103: "no reply"})
    clean = scripted_run({})
    event = make_round_event(0.8, sample_rate=1.0)
    for a, b in zip(lossy, clean, strict=True):
        assert a["timed_out"] == 4 and b["timed_out"] == 0
        assert a["received"] == b["received"] - 4
        assert a["epsilon"] == b["epsilon"] == compose_epsilon([(event, a["round"])], 1e-5)


class LateNodesGrid(ScriptedGrid):
    """Nodes 103-105 connect while the first user query is out, which outlasts ``node_wait``."""

    def __init__(self):
        super().__init__({})
        self.queries = 0

    def get_node_ids(self):
        return list(NODE_USERS) if self.queries else [100, 101, 102]

    def send_and_receive(self, messages, *, timeout=None):
        if messages and messages[0].metadata.message_type == "query":
            self.queries += 1
            if self.queries == 1:
                time.sleep(0.5)  # past node_wait = 0.3 s
        return super().send_and_receive(messages, timeout=timeout)


def test_nodes_that_connect_during_a_slow_user_query_are_queried_too(server_side):
    """Regression: discovery gave up at its deadline without asking the nodes that connected
    while it waited (8,000 simulated nodes: 239 users never reached, a different model)."""
    config = StrategyConfig(
        strategy="dp-fedavg", population=POPULATION, clients_per_round=4, num_server_rounds=1,
        noise_multiplier=0.8, clip_norm=1.0, seed=5,
    )  # fmt: skip
    flat, spec = flatten({"w": torch.zeros(DIM)})
    strategy = DPStrategy(build_algorithm(config, flat), spec, node_wait=0.3)
    grid = LateNodesGrid()
    mapping = strategy.discover_users(grid)
    assert grid.queries == 2
    assert mapping == {u: n for n, users in NODE_USERS.items() for u in users}  # 12: no node
