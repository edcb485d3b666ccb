"""Hostile and failing clients cannot move the model more than the privacy contract allows.

Server mode: adding one user's (clipped) update moves the noised mean Δ̃ by at most C/m̄. A hostile
client (norm >> C, NaN, Inf) must not do more: its update is re-clipped to C or rejected, so
||Δ̃_with_hostile − Δ̃_without|| <= C/m̄, and NaN/Inf updates change nothing at all. Checked on the
aggregator (hypothesis), on the fast engine (real local training, ``drive_round``) and on Flower's
simulation engine, where some nodes also crash, drop a user or answer after the round timeout:
the rounds complete, the failures are counted and ε is that of a run without failures.
"""

import math

import pytest
import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivopt.clients.trainer import LocalTrainer
from fedprivopt.models import build_task, initial_flat, model_spec
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from fedprivopt.strategies.flower import DPStrategy
from fedprivopt.strategies.flower_arrays import flat_to_arrays
from tests.fast_train import fast_train
from tests.faults import make_faulty_client_app

C = 1.0


def _corrupt(delta: torch.Tensor, kind: str) -> torch.Tensor:
    """A hostile client's version of ``delta``."""
    bad = delta.clone()
    if kind == "huge":
        return torch.full_like(delta, 1e6 / math.sqrt(delta.numel()))
    if kind == "nan":
        bad[0] = math.nan
    elif kind == "inf":
        bad[-1] = math.inf
    elif kind == "-inf":
        bad[len(bad) // 2] = -math.inf
    elif kind == "overflow":  # finite entries whose squares overflow float32
        bad.fill_(3e38)
    return bad


# -- the aggregator ------------------------------------------------------------------------------

KINDS = ("huge", "nan", "inf", "-inf", "overflow")


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n_honest=st.integers(0, 12),
    dim=st.integers(1, 64),
    kind=st.sampled_from((*KINDS, "scaled")),
    scale=st.floats(1.0, 1e30),
    hostile_user=st.integers(0, 20),
    sigma=st.sampled_from((0.3, 1.0, 3.0)),  # DP mode (sigma = 0 is the plain, unfixed mean)
    m_bar=st.floats(1.0, 50.0),
)
def test_aggregator_bounds_the_effect_of_one_hostile_update(
    seed, n_honest, dim, kind, scale, hostile_user, sigma, m_bar
):
    gen = torch.Generator().manual_seed(seed)
    users = [u for u in range(21) if u != hostile_user][:n_honest]
    norms = torch.rand(len(users), generator=gen) * 2 * C  # some honest updates above C too
    honest = {
        u: torch.randn(dim, generator=gen) * float(n) for u, n in zip(users, norms, strict=True)
    }
    if kind == "scaled":  # any direction, any norm up to 1e30
        hostile = torch.randn(dim, generator=gen)
        hostile = hostile / hostile.norm().clamp_min(1e-12) * scale
    else:
        hostile = _corrupt(torch.randn(dim, generator=gen), kind)
    agg = NoisyMeanAggregator(clip_norm=C, noise_multiplier=sigma, expected_cohort_size=m_bar)

    def run(updates):
        noise = RngFactory(seed=seed % 1000).generator(1, "server-noise")  # the same noise
        return agg.aggregate(sorted(updates.items()), dim=dim, generator=noise)

    without = run(honest)
    with_hostile = run({**honest, hostile_user: hostile})
    as_none = run({**honest, hostile_user: None})
    diff = float((with_hostile.delta_tilde - without.delta_tilde).norm())
    scale_sum = sum(float(u.norm()) for u in honest.values()) + C + sigma * C * math.sqrt(dim)
    assert diff <= C / m_bar * (1 + 1e-5) + 1e-6 * scale_sum / m_bar
    assert torch.equal(as_none.delta_tilde, without.delta_tilde)  # None contributes nothing
    if kind in ("nan", "inf", "-inf"):
        assert torch.equal(with_hostile.delta_tilde, without.delta_tilde)
        assert with_hostile.rejected == {hostile_user: "contains NaN or Inf"}
    assert torch.isfinite(with_hostile.delta_tilde).all()


@pytest.mark.parametrize("entry", [3.4e38, 3e38, 1.7e38, 1e38, 1e36])
def test_updates_near_the_float_maximum_are_clipped_inside_the_ball(entry):
    # regression: their clip factor is a subnormal float32 and lost the clipping margin (a
    # re-clipped norm of 1 + 2.6e-6 at entries of 3e38); the aggregator now prescales them
    agg = NoisyMeanAggregator(clip_norm=C, noise_multiplier=1e-30, expected_cohort_size=1.0)
    for dim in (2, 3, 7, 64, 199):
        noise = RngFactory(seed=0).generator(1, "server-noise")
        out = agg.aggregate([(0, torch.full((dim,), entry))], dim=dim, generator=noise)
        assert out.metrics["accepted"] == 1 and out.metrics["server_clipped"] == 1
        assert float(torch.linalg.vector_norm(out.delta_tilde.double())) <= C


# -- the fast engine -----------------------------------------------------------------------------

FAST_TASK = {"num_users": 12, "seed": 5}
FAST_CONFIG = StrategyConfig(
    strategy="dp-fedavg",
    population=12,
    clients_per_round=6,
    num_server_rounds=3,
    noise_multiplier=0.5,
    clip_norm=C,
    local_learning_rate=0.5,
    server_learning_rate=1.0,
    seed=7,
)


@pytest.fixture(scope="module")
def fast_setup():
    task = build_task("toy", **FAST_TASK)
    return task, fast_train(LocalTrainer(task, device="cpu"), secure=False)


def _clone(alg, task):
    twin = build_algorithm(alg.config, initial_flat(task))
    twin.load_state_dict(alg.state_dict())
    return twin


@pytest.mark.parametrize("kind", ["huge", "nan", "inf"])
def test_fast_engine_hostile_client_moves_the_model_at_most_c_over_m(fast_setup, kind):
    task, train = fast_setup
    alg = build_algorithm(FAST_CONFIG, initial_flat(task))
    m_bar = FAST_CONFIG.clients_per_round
    for r in range(1, FAST_CONFIG.num_server_rounds + 1):
        victim = alg.sample(r)[0]  # the same seed samples the same users in both runs

        def hostile(request, victim=victim):
            updates = train(request)
            updates[victim] = _corrupt(updates[victim], kind)
            return updates

        def dropped(request, victim=victim):
            updates = train(request)
            del updates[victim]
            return updates

        twin = _clone(alg, task)
        bad = drive_round(alg, r, hostile)
        ref = drive_round(twin, r, dropped)
        # momentum 0 and server learning rate 1: both runs start from the same model and the
        # parameter change is Δ̃ itself, so this is ||Δ̃_hostile − Δ̃_without|| (up to rounding)
        diff = float((bad.params - ref.params).norm())
        if kind == "huge":
            assert bad.metrics["server_clipped"] == 1 and bad.metrics["rejected"] == 0
            assert diff <= C / m_bar + 1e-5
            assert diff >= 0.5 * C / m_bar  # the test can see a clipped update
        else:
            assert bad.metrics["rejected"] == 1
            assert torch.equal(bad.params, ref.params)  # a rejected update contributes nothing
        assert bad.metrics["epsilon"] == ref.metrics["epsilon"]
        assert torch.isfinite(bad.params).all()


# -- Flower's simulation engine: hostile, crashing, dropping and slow nodes -----------------------

USERS, ROUNDS, TIMEOUT, SLEEP = 10, 3, 4.0, 6.0
TASK = {"num_users": USERS, "seed": 3}
FAULTS = {0: "huge", 1: "nan", 2: "inf", 3: "raise", 4: "slow", 5: "drop"}
CONFIG = StrategyConfig(
    strategy="dp-fedavg",
    population=USERS,
    clients_per_round=5,
    num_server_rounds=ROUNDS,
    noise_multiplier=0.5,
    clip_norm=C,
    local_learning_rate=0.5,
    server_learning_rate=1.0,
    seed=3,
)


@pytest.fixture(scope="module")
def flower_run():
    task = build_task("toy", **TASK)
    spec = model_spec(task)
    rows, params = [], [initial_flat(task)]
    app = ServerApp()

    def on_round(result, eval_metrics):
        rows.append({"round": result.round_num, **result.metrics})
        params.append(result.params.detach().clone())

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        alg = build_algorithm(CONFIG, initial_flat(task))
        strategy = DPStrategy(alg, spec, on_round=on_round)
        # warm up: the first message of every Ray worker loads torch and the task (seconds); the
        # discovery before start() uses the default (long) timeout, so no node is missed
        strategy.discover_users(grid)
        strategy.start(grid, flat_to_arrays(initial_flat(task), spec), ROUNDS, timeout=TIMEOUT)

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
    return task, rows, params


def test_flower_failures_are_counted_and_do_not_change_epsilon(flower_run):
    task, rows, _ = flower_run
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1))  # training completed
    reference = build_algorithm(CONFIG, initial_flat(task))  # the same run, nobody failing
    train = fast_train(LocalTrainer(task, device="cpu"), secure=False)
    seen = set()
    for row in rows:
        sampled = set(reference.sample(row["round"]))
        seen |= {FAULTS[u] for u in sampled & set(FAULTS)}
        lost = sampled & {3, 4, 5}  # crashed node, too slow for the timeout, dropped user
        assert row["cohort_size"] == len(sampled)
        assert row["node_errors"] == len(sampled & {3})
        assert row["received"] == len(sampled - lost)
        assert row["rejected"] == len(sampled & {1, 2})
        assert row["server_clipped"] == len(sampled & {0})
        assert row["accepted"] == len(sampled - lost - {1, 2})
        assert lost  # every round has a failing client
        clean = drive_round(reference, row["round"], train)
        assert row["epsilon"] == clean.metrics["epsilon"]  # accounting counts the sampling
    assert seen == set(FAULTS.values())  # every fault was exercised


def test_flower_hostile_clients_move_the_model_at_most_c_over_m(flower_run):
    task, rows, params = flower_run
    train = fast_train(LocalTrainer(task, device="cpu"), secure=False)

    def without_faulty(request):
        return {u: d for u, d in train(request).items() if u not in FAULTS}

    m_bar = CONFIG.clients_per_round
    for row in rows:
        r = row["round"]
        # replay round r in process from Flower's model of round r - 1, all faulty users removed
        alg = build_algorithm(CONFIG, initial_flat(task))
        alg.params, alg.round_num = params[r - 1].clone(), r - 1
        ref = drive_round(alg, r, without_faulty)
        diff = float((params[r] - ref.params).norm())
        huge = int(row["server_clipped"])
        assert diff <= huge * C / m_bar + 1e-5
        if huge:
            assert diff >= 0.5 * C / m_bar
