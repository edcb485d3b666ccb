"""Adaptive clipping: the clip-state transform, the noised count and their accounting."""

import math

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from dp_accounting import pld, rdp

from fedprivopt.privacy import PrivacyAccountant, SubsampledGaussianEvent, compose_epsilon
from fedprivopt.privacy.accounting_state import parse_state
from fedprivopt.privacy.adaptive_clip import (
    MAX_CLIP_NORM,
    ClipState,
    NoisyCountAggregator,
    adaptive_clip,
    clip_bit,
    count_share,
    default_count_stddev,
    update_noise_multiplier,
)
from fedprivopt.privacy.clip import MIN_CLIP_NORM

# -- σ_Δ -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sigma", "sigma_b"), [(1.0, 5.0), (0.3, 2.5), (2.0, 1.01), (0.8, 50.0)])
def test_update_noise_multiplier_closed_form(sigma, sigma_b):
    s_delta = update_noise_multiplier(sigma, sigma_b)
    assert s_delta == pytest.approx((sigma**-2 - (2 * sigma_b) ** -2) ** -0.5, rel=1e-14)
    assert s_delta > sigma
    # Theorem 1: the two Gaussians together are one Gaussian with the user's σ
    assert (s_delta**-2 + (2 * sigma_b) ** -2) ** -0.5 == pytest.approx(sigma, rel=1e-12)


@pytest.mark.parametrize("sigma_b", [0.5, 0.25, 0.0, -1.0, math.nan, math.inf])
def test_update_noise_multiplier_refuses_count_noise_at_most_half_sigma(sigma_b):
    with pytest.raises(ValueError, match="clip-count-stddev"):
        update_noise_multiplier(1.0, sigma_b)


def test_tiny_and_huge_sigmas_do_not_overflow():
    assert update_noise_multiplier(1e-200, 1.0) == 1e-200
    assert update_noise_multiplier(1e200, 1e201) == pytest.approx(1e200 / math.sqrt(1 - 0.0025))
    # events stop at MIN_NOISE_MULTIPLIER (1e-100), where sigma**-2 still fits a float
    event = SubsampledGaussianEvent.poisson(
        sample_rate=0.5, noise_multiplier=1e-100, count_noise_multiplier=1e-99
    )
    assert event.effective_noise_multiplier == pytest.approx(1e-100 / math.sqrt(1.01))


def test_default_count_stddev_is_the_papers():
    assert default_count_stddev(100.0) == 5.0


# -- the transform ---------------------------------------------------------------------------


def test_geometric_update_closed_form_and_bounds():
    rule = adaptive_clip(initial_clip_norm=2.0, quantile=0.5, learning_rate=0.2)
    state = rule.init()
    assert state == ClipState(2.0)
    state = rule.update(0.9, state)
    assert state.clip_norm == pytest.approx(2.0 * math.exp(-0.2 * 0.4), rel=1e-15)
    assert rule.update(1e9, state).clip_norm == MIN_CLIP_NORM
    assert rule.update(-1e9, ClipState(1e300)).clip_norm == MAX_CLIP_NORM
    assert ClipState.from_dict(state.to_dict()) == state
    with pytest.raises(ValueError):
        rule.update(math.nan, state)
    with pytest.raises(ValueError):
        ClipState.from_dict({"clip_norm": 1.0, "extra": 1})


@pytest.mark.parametrize(
    ("key", "kwargs"),
    [
        ("clip-quantile", {"quantile": 0.0}),
        ("clip-quantile", {"quantile": 1.0}),
        ("clip-learning-rate", {"learning_rate": 0.0}),
        ("clip-norm", {"initial_clip_norm": 0.0}),
    ],
)
def test_transform_validates_naming_the_key(key, kwargs):
    args = {"initial_clip_norm": 1.0, "quantile": 0.5, "learning_rate": 0.2} | kwargs
    with pytest.raises(ValueError, match=key):
        adaptive_clip(**args)


# Convergence on synthetic norms: each round 1,000 users draw norms ~ Exponential(1) (γ-quantile
# -ln(1 - γ)); the server releases b̄ with the paper's σ_b = m̄/20 and updates C. Started 10x too
# small or too large, after 300 rounds the mean C of the last 100 rounds is within 5% of the
# quantile, and the fraction of the distribution below it within 0.02 of γ (documented tolerance).
@pytest.mark.parametrize("gamma", [0.3, 0.5, 0.9])
@pytest.mark.parametrize("start", [0.1, 10.0])
def test_clip_norm_converges_to_the_quantile(gamma, start):
    m = 1000
    target = -math.log(1 - gamma)
    rule = adaptive_clip(initial_clip_norm=start * target, quantile=gamma, learning_rate=0.2)
    counter = NoisyCountAggregator(count_stddev=default_count_stddev(m), expected_cohort_size=m)
    state = rule.init()
    gen = torch.Generator().manual_seed(7)
    history = []
    for _ in range(300):
        norms = torch.empty(m, dtype=torch.float64).exponential_(1.0, generator=gen).tolist()
        bits = [(u, clip_bit(n, state.clip_norm)) for u, n in enumerate(norms)]
        state = rule.update(counter.aggregate(bits, generator=gen).fraction, state)
        history.append(state.clip_norm)
    settled = float(np.mean(history[-100:]))
    assert settled == pytest.approx(target, rel=0.05)
    assert 1 - math.exp(-settled) == pytest.approx(gamma, abs=0.02)


# -- the noised count ------------------------------------------------------------------------


def test_count_noise_std_is_sigma_b_over_m():
    m, sigma_b, n = 50.0, 4.0, 4000
    counter = NoisyCountAggregator(count_stddev=sigma_b, expected_cohort_size=m)
    bits = [(u, float(u % 2)) for u in range(50)]  # exactly half: b̄ is 1/2 + noise/m̄
    draws = [
        counter.aggregate(bits, generator=torch.Generator().manual_seed(s)).fraction
        for s in range(n)
    ]
    assert np.mean(draws) == pytest.approx(0.5, abs=4 * sigma_b / m / math.sqrt(n))
    assert np.std(draws) == pytest.approx(sigma_b / m, rel=0.05)  # 5% ≈ 4.5 standard errors
    assert counter.aggregate(bits, generator=torch.Generator()).noise_std == sigma_b / m


def test_distributed_count_noise_is_at_least_the_servers():
    m, sigma_b, m_min, n = 40.0, 3.0, 30, 3000
    counter = NoisyCountAggregator(
        count_stddev=sigma_b, expected_cohort_size=m, noise_mode="distributed", min_shares=m_min
    )
    share_std = counter.share_std()
    assert share_std == pytest.approx(sigma_b / math.sqrt(m_min))
    for arrived in (10, 30, 45):  # fewer shares than m_min: the server tops up
        draws = []
        for s in range(n):
            gen = torch.Generator().manual_seed(10_000 * arrived + s)
            shares = [(u, count_share(1.0, share_std, gen)) for u in range(arrived)]
            draws.append(counter.aggregate(shares, generator=gen).fraction)
        expected = sigma_b * math.sqrt(max(arrived, m_min) / m_min) / m
        assert np.std(draws) == pytest.approx(expected, rel=0.06)
        centred = arrived * 0.5 / m + 0.5  # Σ(b - 1/2)/m̄ + 1/2 with every bit 1
        assert np.mean(draws) == pytest.approx(centred, abs=5 * expected / math.sqrt(n))


@pytest.mark.parametrize(
    "report",
    [2.0, 0.5, -1.0, math.nan, math.inf, True, "1", None, [1.0], np.array([1.0, 0.0]),
     np.array([1], dtype=np.int64), torch.tensor([[1.0]])],
)  # fmt: skip
def test_hostile_bit_is_rejected_in_server_mode(report):
    counter = NoisyCountAggregator(count_stddev=1.0, expected_cohort_size=10)
    out = counter.aggregate([(0, 1.0), (1, report)], generator=torch.Generator().manual_seed(0))
    assert out.counted == 1
    assert set(out.rejected) == {1}
    assert "clip bit" in out.rejected[1]


def test_valid_bits_of_every_form_are_accepted():
    counter = NoisyCountAggregator(count_stddev=1.0, expected_cohort_size=10)
    reports = [
        (0, 1.0),
        (1, 0),
        (2, np.array([1.0])),
        (3, torch.tensor([0.0], dtype=torch.float64)),
    ]
    assert counter.aggregate(reports, generator=torch.Generator()).counted == 4


def test_one_hostile_user_moves_the_count_by_at_most_one_honest_user():
    # server mode: a binary report moves Σ(b − 1/2) by 1/2 at most, like an honest user
    counter = NoisyCountAggregator(count_stddev=1.0, expected_cohort_size=10)
    honest = [(u, 1.0) for u in range(9)]
    outs = [
        counter.aggregate([*honest, (9, r)], generator=torch.Generator().manual_seed(3)).fraction
        for r in (0.0, 1.0, 1e30, -1e30)
    ]
    assert max(outs) - min(outs) == pytest.approx(1 / 10)
    # distributed mode: a share outside the bound is rejected, never counted
    dist = NoisyCountAggregator(
        count_stddev=1.0, expected_cohort_size=10, noise_mode="distributed", min_shares=5
    )
    # 0.61: a share (an exact centred bit, 0.5, carries no noise: 47th review, mechanisms 2)
    out = dist.aggregate([(0, 0.61), (1, dist.accept_bound() * 1.01)], generator=torch.Generator())
    assert out.counted == 1 and set(out.rejected) == {1}


def test_clip_bit():
    assert clip_bit(1.0, 1.0) == 1.0
    assert clip_bit(1.0000001, 1.0) == 0.0
    assert clip_bit(math.inf, 1.0) == 0.0
    assert clip_bit(math.nan, 1.0) == 0.0


# -- accounting ------------------------------------------------------------------------------


def _dpa_rdp_composed(q, s_delta, count_mult, rounds, delta):
    """dp-accounting's RDP of the composed event, built here independently of the package."""
    acc = rdp.RdpAccountant()
    inner = dpa.ComposedDpEvent([dpa.GaussianDpEvent(s_delta), dpa.GaussianDpEvent(count_mult)])
    acc.compose(dpa.PoissonSampledDpEvent(q, inner), rounds)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize(
    ("q", "sigma", "sigma_b", "rounds"),
    [(0.01, 1.0, 5.0, 1000), (0.05, 0.7, 2.5, 100), (0.1, 2.0, 1.5, 50), (0.001, 0.9, 50.0, 10**4)],
)
def test_run_epsilon_equals_sigma_and_the_composed_event(q, sigma, sigma_b, rounds):
    delta = 1e-5
    s_delta = update_noise_multiplier(sigma, sigma_b)
    event = SubsampledGaussianEvent.poisson(
        sample_rate=q, noise_multiplier=s_delta, count_noise_multiplier=2 * sigma_b
    )
    acc = PrivacyAccountant()
    for _ in range(3):
        acc.step(event, count=rounds // 3)
    acc.step(event, count=rounds - 3 * (rounds // 3))
    ours = acc.epsilon(delta)
    composed = _dpa_rdp_composed(q, s_delta, 2 * sigma_b, rounds, delta)
    plain = SubsampledGaussianEvent.poisson(sample_rate=q, noise_multiplier=sigma)
    assert ours == pytest.approx(composed, rel=1e-9)
    assert ours == pytest.approx(compose_epsilon([(plain, rounds)], delta), rel=1e-9)
    # PLD: the single Gaussian of Theorem 1, equal to fedprivopt's PLD for σ
    assert compose_epsilon([(event, rounds)], delta, accountant="pld") == pytest.approx(
        compose_epsilon([(plain, rounds)], delta, accountant="pld"), rel=1e-6
    )


def test_pld_single_gaussian_against_dp_accountings_own_pld():
    q, sigma, sigma_b, rounds, delta = 0.02, 1.1, 3.0, 300, 1e-6
    s_delta = update_noise_multiplier(sigma, sigma_b)
    event = SubsampledGaussianEvent.poisson(
        sample_rate=q, noise_multiplier=s_delta, count_noise_multiplier=2 * sigma_b
    )
    ref = pld.PLDAccountant(value_discretization_interval=1e-4)
    ref.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), rounds)
    ours = compose_epsilon([(event, rounds)], delta, accountant="pld")
    assert ours == pytest.approx(ref.get_epsilon(delta), rel=1e-3)
    # PLD refuses the composed event itself: that is why it is given the single Gaussian
    with pytest.raises(dpa.UnsupportedEventError):
        pld.PLDAccountant().compose(event.to_dp_event())


def test_fixed_size_event_halves_both_multipliers():
    s_delta, count_mult = 1.5, 4.0
    event = SubsampledGaussianEvent.fixed(
        population=100, cohort_size=10, noise_multiplier=s_delta, count_noise_multiplier=count_mult
    )
    acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    inner = dpa.ComposedDpEvent(
        [dpa.GaussianDpEvent(s_delta / 2), dpa.GaussianDpEvent(count_mult / 2)]
    )
    acc.compose(dpa.SampledWithoutReplacementDpEvent(100, 10, inner), 20)
    assert compose_epsilon([(event, 20)], 1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def test_event_round_trips_and_old_events_are_unchanged():
    plain = SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=1.0)
    assert "count_noise_multiplier" not in plain.to_dict()
    event = SubsampledGaussianEvent.poisson(
        sample_rate=0.1, noise_multiplier=1.2, count_noise_multiplier=3.0
    )
    assert SubsampledGaussianEvent.from_dict(event.to_dict()) == event
    acc = PrivacyAccountant()
    acc.step([event, plain])
    assert parse_state(acc.state_dict())[3] == acc.ledger
    bad = acc.state_dict()
    bad["ledger"][0]["event"]["count_noise_multiplier"] = -1.0
    with pytest.raises(ValueError, match="count_noise_multiplier"):
        parse_state(bad)
    with pytest.raises(ValueError, match="count_noise_multiplier"):
        SubsampledGaussianEvent.poisson(
            sample_rate=0.1, noise_multiplier=0.0, count_noise_multiplier=3.0
        )
