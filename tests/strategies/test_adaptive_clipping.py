"""Adaptive clipping in the server algorithm: every DP strategy, noise, hostile bits, accounting."""

import math

import numpy as np
import pytest
import torch

from fedprivopt.privacy import SubsampledGaussianEvent, compose_epsilon
from fedprivopt.privacy.adaptive_clip import update_noise_multiplier
from fedprivopt.strategies import STRATEGIES, StrategyConfig, build_algorithm
from fedprivopt.strategies.config import NON_PRIVATE
from fedprivopt.strategies.core import ReportedUpdates, drive_round

DIM = 50
DP_STRATEGIES = [s for s in STRATEGIES if s not in NON_PRIVATE]


def config(**kw):
    base = {
        "strategy": "dp-fedavg",
        "population": 40,
        "clients-per-round": 8,
        "noise-multiplier": 1.0,
        "clip-norm": 0.5,
        "seed": 3,
        "num-server-rounds": 5,
        "adaptive-clipping": True,
        "clip-count-stddev": 2.0,
        "dp2-s1": 1,
        "dp2-s2": 1,
    }
    return StrategyConfig.from_mapping(base | kw)


def make(cfg, dim=DIM):
    side = torch.full((dim,), 2.0) if cfg.strategy == "adadps" else None
    return build_algorithm(cfg, torch.zeros(dim), preconditioner=side)


def reporting(scale=0.3, bit_of=None):
    """Per-user updates of norm ≈ scale·√DIM, each with its honest clip bit (or ``bit_of``)."""

    def train(request):
        out = ReportedUpdates()
        clip = request.settings.local.clip_norm
        for u in request.users:
            g = torch.Generator().manual_seed(1000 * u + len(request.stream))
            delta = torch.randn(DIM, generator=g) * scale
            norm = float(delta.norm())
            out[u] = delta * min(1.0, clip / norm)
            honest = 1.0 if norm <= clip else 0.0
            out.clip_bits[u] = honest if bit_of is None else bit_of(u, honest)
        return out

    return train


@pytest.mark.parametrize("strategy", DP_STRATEGIES)
def test_every_dp_strategy_adapts_and_accounts_the_composed_event(strategy):
    cfg = config(strategy=strategy)
    alg = make(cfg)
    norms = []
    for r in range(1, 5):
        res = drive_round(alg, r, reporting())
        norms.append(res.metrics["clip_norm"])
        assert res.metrics["update_noise_multiplier"] == cfg.update_noise_multiplier
        assert res.metrics["next_clip_norm"] == pytest.approx(
            norms[-1] * math.exp(-0.2 * (res.metrics["clip_count_fraction"] - 0.5))
        )
    assert len(set(norms)) == 4  # C moved every round
    k = 2 if strategy == "dp-fedavg-adadp" else 1
    event = alg.round_event()
    assert event.count_noise_multiplier == 2 * 2.0
    assert event.noise_multiplier == update_noise_multiplier(1.0, 2.0)
    plain = SubsampledGaussianEvent.poisson(sample_rate=8 / 40, noise_multiplier=1.0)
    # the run's ε is fedprivopt's ε for its σ (Theorem 1), to float rounding
    assert alg.epsilon() == pytest.approx(compose_epsilon([(plain, 4 * k)], 1e-5), rel=1e-9)


def test_clients_are_told_the_round_clip_norm_and_to_report_their_bit():
    alg = make(config(**{"clip-norm": 0.7}))
    request = alg.run_round(1).send(None)
    assert request.settings.local.clip_norm == 0.7
    assert request.settings.local.clip_bit and request.settings.local.count_noise_std == 0.0
    dist = make(config(**{"noise-mode": "distributed", "min-shares": 4}))
    local = dist.run_round(1).send(None).settings.local
    assert local.count_noise_std == pytest.approx(2.0 / math.sqrt(4))
    assert local.noise_std == pytest.approx(update_noise_multiplier(1.0, 2.0) * 0.5 / 2.0)


def test_measured_noise_on_the_sum_is_sigma_delta_c_over_m_and_on_the_count_sigma_b_over_m():
    dim, m = 200_000, 8.0
    cfg = config(**{"clip-norm": 0.4, "clip-count-stddev": 1.5})
    alg = make(cfg, dim)

    def zeros(request):
        out = ReportedUpdates({u: torch.zeros(dim) for u in request.users})
        out.clip_bits.update({u: 1.0 for u in request.users})
        return out

    for r in (1, 2):  # the second round runs at the adapted C
        c = alg.current_clip_norm()
        before = alg.params.clone()
        res = drive_round(alg, r, zeros)
        step = (res.params - before).numpy()  # dp-fedavg, rate 1: the noised mean itself
        expected = cfg.update_noise_multiplier * c / m
        assert np.std(step) == pytest.approx(expected, rel=0.01)
        assert res.metrics["noise_std"] == pytest.approx(expected)
        assert res.metrics["clip_count_noise_std"] == pytest.approx(1.5 / m)
    # the count's noise over many rounds: b̄ − (n/2/m̄ + 1/2) has std σ_b/m̄
    alg = make(cfg, 4)
    draws = []
    for r in range(1, 801):
        res = drive_round(alg, r, lambda q: ReportedUpdates(
            {u: torch.zeros(4) for u in q.users}, clip_bits={u: 1.0 for u in q.users}))  # fmt: skip
        draws.append(res.metrics["clip_count_fraction"] - (res.metrics["accepted"] / 2 / m + 0.5))
    assert np.std(draws) == pytest.approx(1.5 / m, rel=0.08)  # 800 draws: ±2.5% s.e.


@pytest.mark.parametrize(
    "bad", [2.0, 0.5, -1.0, math.nan, math.inf, "1", None, np.array([1.0, 1.0])]
)
def test_a_hostile_bit_rejects_the_reply_and_moves_c_no_more_than_an_honest_user(bad):
    hostile = 10  # sampled in round 1 (checked below)

    def run(bit_of):
        alg = make(config())
        res = drive_round(alg, 1, reporting(bit_of=bit_of))
        assert hostile in alg.sample(1)
        return alg, res

    _, honest = run(None)
    _, attacked = run(lambda u, b: bad if u == hostile else b)
    assert "clip bit" in attacked.rejected[hostile]
    assert attacked.metrics["rejected"] == honest.metrics["rejected"] + 1
    assert attacked.metrics["accepted"] == honest.metrics["accepted"] - 1
    assert attacked.metrics["received"] == honest.metrics["received"]
    # any binary report moves b̄ by at most 1/m̄, as one honest user can
    fractions = [run(lambda u, b, v=v: v if u == hostile else b)[1] for v in (0.0, 1.0)]
    spread = abs(fractions[0].metrics["clip_count_fraction"] - fractions[1].metrics[
        "clip_count_fraction"])  # fmt: skip
    assert spread == pytest.approx(1 / 8)  # one binary report moves b̄ by 1/m̄ at most
    rejected_move = abs(attacked.metrics["clip_count_fraction"] - honest.metrics[
        "clip_count_fraction"])  # fmt: skip
    assert rejected_move <= 1 / 8 / 2 + 1e-12  # leaving one out moves the centred count by 1/2


def test_a_reply_without_a_bit_is_rejected():
    alg = make(config())
    res = drive_round(alg, 1, lambda q: {u: torch.zeros(DIM) for u in q.users})
    assert res.metrics["accepted"] == 0
    assert set(res.rejected.values()) == {"no clip bit"}


def test_checkpoint_round_trip_continues_the_same_c_trajectory():
    cfg = config(strategy="dp2", **{"clip-norm-adaptive": 2.0})
    ref = make(cfg)
    trajectory = [drive_round(ref, r, reporting()).metrics["clip_norm"] for r in range(1, 7)]
    assert set(ref.clipping.states) == {"clip-norm", "round-clip-norm"}  # DP2's two phases
    alg = make(cfg)
    for r in (1, 2, 3):
        drive_round(alg, r, reporting())
    resumed = make(cfg)
    resumed.load_state_dict(alg.state_dict())
    rest = [drive_round(resumed, r, reporting()).metrics["clip_norm"] for r in (4, 5, 6)]
    assert rest == trajectory[3:]
    assert torch.equal(resumed.params, ref.params)
    state = alg.state_dict()
    del state["clip_states"]
    with pytest.raises(ValueError, match="adaptive clip state"):
        make(cfg).load_state_dict(state)


def test_budget_stop_counts_the_composed_event():
    cfg = config(**{"target-epsilon": 3.0, "num-server-rounds": 100})
    alg = make(cfg)
    rounds = 0
    while alg.budget_allows_next_round():
        rounds += 1
        drive_round(alg, rounds, reporting())
    plain = SubsampledGaussianEvent.poisson(sample_rate=8 / 40, noise_multiplier=1.0)
    assert (
        compose_epsilon([(plain, rounds)], 1e-5)
        <= 3.0
        < compose_epsilon([(plain, rounds + 1)], 1e-5)
    )
    assert alg.epsilon() <= 3.0


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"clip-count-stddev": 0.5}, "clip-count-stddev must be > noise-multiplier/2"),
        ({"clip-count-stddev": None, "clients-per-round": 10}, "clients-per-round/20"),
        ({"clip-quantile": 1.0}, "clip-quantile must be a finite number in (0, 1)"),
        ({"clip-quantile": 0}, "clip-quantile"),
        ({"clip-learning-rate": 0}, "clip-learning-rate must be a finite number in (0, inf)"),
        ({"clip-count-stddev": -1}, "clip-count-stddev"),
        ({"adaptive-clipping": "yes"}, "adaptive-clipping must be true or false"),
    ],
)
def test_bad_keys_are_refused_naming_them(kw, needle):
    with pytest.raises(ValueError) as err:
        config(**kw)
    assert needle in str(err.value)


def test_non_private_baselines_ignore_it_and_defaults_leave_the_mapping_unchanged():
    cfg = config(strategy="fedavg")
    assert not cfg.adaptive and make(cfg).clipping is None
    plain = StrategyConfig()
    assert "adaptive-clipping" not in plain.to_mapping()
    assert StrategyConfig.from_mapping(config().to_mapping()) == config()


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_calibrated_sigma_gives_the_adaptive_run_its_target(sampling):
    from fedprivopt.privacy import calibrate_noise_multiplier

    sigma = calibrate_noise_multiplier(
        target_epsilon=4.0, delta=1e-5, rounds=6, sampling=sampling, sample_rate=8 / 40,
        population=40, cohort_size=8,
    )  # fmt: skip
    alg = make(config(**{"noise-multiplier": sigma, "sampling": sampling}))
    for r in range(1, 7):
        drive_round(alg, r, reporting())
    assert alg.epsilon() <= 4.0 * (1 + 1e-9)
    assert alg.epsilon() == pytest.approx(4.0, rel=1e-3)
