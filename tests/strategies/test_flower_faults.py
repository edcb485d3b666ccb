"""Hostile and failing clients in Flower's simulation engine: the rounds complete, malformed
updates are rejected and counted, an oversized one is re-clipped, and accounting is unchanged."""

import pytest
import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedprivopt.clients.faults import make_faulty_client_app
from fedprivopt.models import build_task, initial_flat, model_spec
from fedprivopt.privacy import compose_epsilon, make_round_event
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy, flat_to_arrays
from fedprivopt.strategies.server_app import RunRecorder

USERS, ROUNDS = 12, 4
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
}
REJECTED = {1, 2, 3, 4, 5}
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
        DPStrategy(alg, model_spec(task), on_round=recorder).start(
            grid, flat_to_arrays(initial_flat(task), model_spec(task)), num_rounds=ROUNDS
        )

    run_simulation(
        server_app=app,
        client_app=make_faulty_client_app(FAULTS, task="toy", task_params=TASK),
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
        assert row["accepted"] == len(sampled) - len(sampled & REJECTED) - len(sampled & {0})
    assert seen_faults == set(FAULTS.values())  # every fault was exercised at least once
    assert torch.isfinite(faulty_run.final_params).all()


def test_accounting_is_unchanged_by_failures(faulty_run):
    event = make_round_event(0.5, sample_rate=8 / USERS)
    for row in faulty_run.rows:
        assert row["epsilon"] == compose_epsilon([(event, row["round"])], 1e-5)
