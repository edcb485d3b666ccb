"""Hostile clip bits over Flower's messages: the reply is rejected and counted, rounds go on."""

import pytest
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedprivopt.models import build_task, initial_flat, model_spec
from fedprivopt.privacy import compose_epsilon, make_round_event
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy
from fedprivopt.strategies.flower_arrays import flat_to_arrays
from tests.faults import make_faulty_client_app
from tests.strategies.recorder import RunRecorder

USERS, ROUNDS = 10, 3
TASK = {"num_users": USERS, "seed": 3}
FAULTS = {1: "bad-bit", 2: "no-bit", 3: "nan"}
CONFIG = StrategyConfig.from_mapping(
    {
        "strategy": "dp-fedavg",
        "population": USERS,
        "clients-per-round": 6,
        "num-server-rounds": ROUNDS,
        "noise-multiplier": 0.5,
        "clip-norm": 0.05,
        "local-learning-rate": 0.5,
        "seed": 11,
        "adaptive-clipping": True,
        "clip-count-stddev": 1.0,
    }
)


@pytest.fixture(scope="module")
def run():
    recorder = RunRecorder()
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        task = build_task("toy", **TASK)
        strategy = DPStrategy(
            build_algorithm(CONFIG, initial_flat(task)), model_spec(task), on_round=recorder
        )
        strategy.start(
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


def test_bad_and_missing_bits_reject_the_reply_and_are_counted(run):
    sampler = build_algorithm(CONFIG, initial_flat(build_task("toy", **TASK)))
    assert [r["round"] for r in run.rows] == [1, 2, 3]
    hit = 0
    for row in run.rows:
        sampled = set(sampler.sample(row["round"]))
        hostile = sampled & set(FAULTS)
        hit += len(hostile & {1, 2})
        assert row["received"] == len(sampled)
        assert row["rejected"] == len(hostile)
        assert row["accepted"] == len(sampled) - len(hostile)
    assert hit > 0  # the hostile bits were exercised
    norms = [r["clip_norm"] for r in run.rows]
    assert norms[0] == 0.05 and len(set(norms)) == ROUNDS  # C still adapts
    plain = make_round_event(0.5, sample_rate=6 / USERS)
    assert run.rows[-1]["epsilon"] == pytest.approx(
        compose_epsilon([(plain, ROUNDS)], CONFIG.delta), rel=1e-9
    )
