"""Every strategy in Flower's simulation engine (run_simulation, Ray backend) on the toy task.

One simulation runs all strategies one after another on the same grid (Ray starts once); each
strategy's metrics are asserted separately.
"""

import math

import pytest
import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedprivopt.clients.client_app import make_client_app
from fedprivopt.clients.trainer import LocalTrainer
from fedprivopt.models import build_task, initial_flat, model_spec
from fedprivopt.privacy import compose_epsilon, make_round_event, unflatten
from fedprivopt.strategies import STRATEGIES, StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from fedprivopt.strategies.flower import DPStrategy
from fedprivopt.strategies.flower_arrays import flat_to_arrays
from tests.fast_train import fast_train
from tests.strategies.recorder import RunRecorder, evaluate_fn

USERS = 12
ROUNDS = 4
TASK = {"num_users": USERS, "seed": 1}
COMMON = dict(
    population=USERS,
    clients_per_round=6,
    num_server_rounds=ROUNDS,
    noise_multiplier=0.3,
    clip_norm=1.0,
    local_learning_rate=0.5,
    batch_size=16,
    seed=0,
)
SPECIFIC = {
    "dp-fedavg": dict(server_learning_rate=1.0),
    "dp-fedadam": dict(server_learning_rate=0.1),
    "dp-fedadam-bc": dict(server_learning_rate=0.1, gamma=1e-4),
    "adadps": dict(server_learning_rate=1.0, server_momentum=0.5),
    "dp2": dict(dp2_s1=2, dp2_s2=2, dp2_learning_rate=0.05, dp2_epsilon=0.1),
    "dp2-noise-first": dict(dp2_s1=2, dp2_s2=2, dp2_learning_rate=0.05, dp2_epsilon=0.1),
    "dp-fedavg-adadp": dict(server_learning_rate=1.0, adadp_tolerance=0.5),
    "fedavg": dict(),
    "fedadam": dict(server_learning_rate=0.1),
}
assert set(SPECIFIC) == set(STRATEGIES)


def config(name):
    if name == "distributed":  # dp-fedavg with clients adding their noise shares
        return StrategyConfig(
            strategy="dp-fedavg", noise_mode="distributed", min_shares=4, **COMMON
        )
    return StrategyConfig.from_mapping(dict(strategy=name, **COMMON, **SPECIFIC[name]))


def side_information(name, init):
    return torch.full_like(init, 1.0) if name == "adadps" else None


@pytest.fixture(scope="module")
def simulation():
    recorders = {name: RunRecorder() for name in [*STRATEGIES, "distributed"]}
    errors = {}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        task = build_task("toy", **TASK)
        spec, init = model_spec(task), initial_flat(task)
        for name in [*STRATEGIES, "distributed"]:
            try:
                alg = build_algorithm(
                    config(name), init, preconditioner=side_information(name, init)
                )
                strategy = DPStrategy(alg, spec, on_round=recorders[name])
                result = strategy.start(
                    grid,
                    flat_to_arrays(init, spec),
                    num_rounds=ROUNDS,
                    evaluate_fn=evaluate_fn(task),
                )
                recorders[name].initial_eval = dict(result.evaluate_metrics_serverapp[0])
                recorders[name].final_params = alg.params.clone()
            except Exception as exc:
                errors[name] = repr(exc)

    run_simulation(
        server_app=app,
        client_app=make_client_app(task="toy", task_params=TASK),
        num_supernodes=USERS,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2},
        },
    )
    return recorders, errors


@pytest.mark.parametrize("name", [*STRATEGIES, "distributed"])
def test_strategy_runs_in_flower_and_eval_loss_improves(simulation, name):
    recorders, errors = simulation
    assert name not in errors, errors.get(name)
    rec = recorders[name]
    assert [row["round"] for row in rec.rows] == list(range(1, ROUNDS + 1))
    first, last = rec.initial_eval["loss"], rec.rows[-1]["eval_loss"]
    assert last < first * 0.9, (first, [r["eval_loss"] for r in rec.rows])
    for row in rec.rows:
        rejected = row.get("rejected", row.get("rejected_1", 0) + row.get("rejected_2", 0))
        assert rejected == 0 and row["node_errors"] == 0


@pytest.mark.parametrize("name", STRATEGIES)
def test_epsilon_reported_equals_the_cli_computation(simulation, name):
    rec = simulation[0][name]
    cfg = config(name)
    if not cfg.private:
        assert all(math.isinf(r["epsilon"]) for r in rec.rows)
        return
    k = 2 if name == "dp-fedavg-adadp" else 1
    event = make_round_event(cfg.noise_multiplier, sample_rate=cfg.sample_rate)
    for row in rec.rows:
        assert row["epsilon"] == compose_epsilon([(event, row["round"] * k)], cfg.delta)


@pytest.mark.parametrize("name", ["dp-fedadam", "dp2", "dp-fedavg-adadp", "distributed"])
def test_flower_engine_equals_in_process_driver(simulation, name):
    """Same seed, same model: the Flower run matches driving the same core in process."""
    task = build_task("toy", **TASK)
    init = initial_flat(task)
    trainer = LocalTrainer(task, device="cpu")

    train = fast_train(trainer, secure=False)  # the fast engine's client loop

    alg = build_algorithm(config(name), init, preconditioner=side_information(name, init))
    for r in range(1, ROUNDS + 1):
        drive_round(alg, r, train)
    flower_final = simulation[0][name].final_params
    torch.testing.assert_close(flower_final, alg.params, rtol=0, atol=1e-6)
    model = task.build_model()
    model.load_state_dict(unflatten(alg.params, model_spec(task)))
    assert task.evaluate(model)["loss"] == pytest.approx(
        simulation[0][name].rows[-1]["eval_loss"], rel=1e-5
    )


def test_round_metrics_describe_the_mechanism(simulation):
    rows = simulation[0]["dp-fedavg"].rows
    for row in rows:
        assert row["noise_std"] == pytest.approx(0.3 * 1.0 / 6)
        assert 0 <= row["clipped_fraction"] <= 1 and row["accepted"] == row["cohort_size"]
    shares = simulation[0]["distributed"].rows
    for row in shares:
        assert row["shares"] == row["accepted"] == row["cohort_size"]
        expected = 0.3 / 6 * math.sqrt(max(row["accepted"], 4) / 4)
        assert row["noise_std"] == pytest.approx(expected)
        assert row["topup_std"] == pytest.approx(0.3 * math.sqrt(max(0, 4 - row["accepted"]) / 4))
