"""Private tuning: the trial-count distributions and the ε of the whole procedure."""

import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import dp_event, rdp
from dp_accounting.rdp.rdp_privacy_accountant import _gamma_truncated_negative_binomial
from scipy import stats

from fedprivopt.privacy.accounting import compose_epsilon
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.tuning import TrialCount, ledger_rdp, tuning_epsilon

DRAWS = 20_000
TNB = "truncated-negative-binomial"


def _reference_pmf(trials: TrialCount, k: np.ndarray) -> np.ndarray:
    """The pmf from scipy, written independently of the module's formula."""
    if trials.distribution == "poisson":
        return stats.poisson(trials.mean).pmf(k)
    gamma, eta = trials.gamma, trials.shape
    if eta == 0:  # logarithmic: P[k] = (1-γ)^k / (k log(1/γ))
        return stats.logser(1.0 - gamma).pmf(k)
    # negative binomial (failures before eta successes of probability γ), without 0
    nb = stats.nbinom(eta, gamma)
    return np.where(k >= 1, nb.pmf(k) / (1.0 - nb.pmf(0)), 0.0)


CASES = [
    TrialCount(TNB, 10.0, shape=0.0),
    TrialCount(TNB, 10.0, shape=0.5),
    TrialCount(TNB, 10.0, shape=1.0),
    TrialCount(TNB, 4.0, shape=3.0),
    TrialCount("poisson", 10.0),
    TrialCount("poisson", 2.5),
]


@pytest.mark.parametrize("trials", CASES, ids=lambda t: f"{t.distribution}-{t.shape}-{t.mean:g}")
def test_pmf_matches_scipy_and_has_the_requested_mean(trials):
    k = np.arange(0, 4000)
    pmf = trials.pmf(k)
    np.testing.assert_allclose(pmf, _reference_pmf(trials, k), rtol=1e-9, atol=1e-15)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert (k * pmf).sum() == pytest.approx(trials.mean, rel=1e-9)


@pytest.mark.parametrize("trials", CASES, ids=lambda t: f"{t.distribution}-{t.shape}-{t.mean:g}")
def test_sampled_counts_follow_the_distribution(trials):
    """Chi-square of 20,000 seeded draws against the pmf, and their mean and variance."""
    rng = np.random.default_rng(12345)
    draws = np.array([trials.sample(rng) for _ in range(DRAWS)])
    k = np.arange(0, draws.max() + 1)
    expected = DRAWS * _reference_pmf(trials, k)
    # bins with at least 5 expected draws; the rest of the support merged into one tail bin
    keep = expected >= 5
    observed = np.bincount(draws, minlength=len(k))
    obs = np.append(observed[keep], observed[~keep].sum() + 0.0)
    exp = np.append(expected[keep], DRAWS - expected[keep].sum())
    if exp[-1] < 5:  # a negligible tail goes into the last kept bin
        obs[-2] += obs[-1]
        exp[-2] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    chi2 = ((obs - exp) ** 2 / exp).sum()
    p_value = stats.chi2(len(obs) - 1).sf(chi2)
    assert p_value > 1e-3, (chi2, len(obs))
    k_all = np.arange(0, 20_000)
    p_all = _reference_pmf(trials, k_all)
    var = ((k_all - trials.mean) ** 2 * p_all).sum()
    assert abs(draws.mean() - trials.mean) < 5 * math.sqrt(var / DRAWS)
    assert draws.var() == pytest.approx(var, rel=0.1)
    if trials.distribution == TNB:
        assert draws.min() >= 1  # truncated: at least one trial


def test_a_sampler_of_the_wrong_distribution_fails_the_same_check():
    """The chi-square check can fail: geometric draws against the logarithmic pmf."""
    log = TrialCount(TNB, 10.0, shape=0.0)
    geometric = TrialCount(TNB, 10.0, shape=1.0)
    rng = np.random.default_rng(1)
    draws = np.array([geometric.sample(rng) for _ in range(DRAWS)])
    k = np.arange(0, 60)
    expected = DRAWS * log.pmf(k)
    keep = expected >= 5
    obs, exp = np.bincount(draws, minlength=400)[: len(k)][keep], expected[keep]
    chi2 = ((obs - exp) ** 2 / exp).sum()
    assert stats.chi2(keep.sum() - 1).sf(chi2) < 1e-10


def test_sampling_is_reproducible_from_the_seed():
    trials = TrialCount(TNB, 7.0, shape=0.5)
    a = [trials.sample(np.random.default_rng(9)) for _ in range(3)]
    b = [trials.sample(np.random.default_rng(9)) for _ in range(3)]
    assert a == b


@pytest.mark.parametrize("eta", [0.0, 0.3, 1.0, 5.0])
@pytest.mark.parametrize("mean", [1.5, 10.0, 300.0])
def test_gamma_is_conservative_against_dp_accountings(eta, mean):
    """The sampler's γ has mean <= the requested one and is >= dp-accounting's (its bound's)."""
    ours = TrialCount(TNB, mean, shape=eta)
    theirs = _gamma_truncated_negative_binomial(eta, mean)
    assert ours.gamma >= theirs
    assert ours.gamma == pytest.approx(theirs, rel=1e-8)
    k = np.arange(0, 200_000)
    assert (k * ours.pmf(k)).sum() <= mean * (1 + 1e-9)


def test_mean_one_is_a_single_trial():
    trials = TrialCount(TNB, 1.0, shape=2.0)
    assert trials.gamma == 1.0
    assert trials.sample(np.random.default_rng(0)) == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"distribution": "geometric", "mean": 5.0}, "distribution"),
        ({"distribution": TNB, "mean": 0.5}, "mean"),
        ({"distribution": "poisson", "mean": math.inf}, "mean"),
        ({"distribution": "poisson", "mean": 5.0, "shape": 1.0}, "shape"),
        ({"distribution": TNB, "mean": 5.0, "shape": -1.0}, "shape"),
        ({"distribution": TNB, "mean": 5.0, "shape": math.nan}, "shape"),
    ],
)
def test_bad_parameters_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrialCount(**kwargs)


def _independent_epsilon(inner: dpa.DpEvent, rounds, mean, shape, delta, relation):
    """RepeatAndSelectDpEvent around the run, built here from dp-accounting alone."""
    run = dpa.SelfComposedDpEvent(inner, rounds)
    acc = rdp.RdpAccountant(neighboring_relation=relation)
    acc.compose(dp_event.RepeatAndSelectDpEvent(run, mean, shape))
    return acc.get_epsilon(delta)


@pytest.mark.parametrize(
    "trials", [TrialCount(TNB, 10.0, shape=1.0), TrialCount(TNB, 5.0, shape=0.0),
               TrialCount(TNB, 20.0, shape=2.5), TrialCount("poisson", 10.0)],
    ids=lambda t: f"{t.distribution}-{t.shape}",
)  # fmt: skip
def test_tuning_epsilon_is_dp_accountings_repeat_and_select(trials):
    q, sigma, rounds, delta = 0.05, 1.0, 100, 1e-5
    event = SubsampledGaussianEvent.poisson(sample_rate=q, noise_multiplier=sigma)
    inner = dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma))
    shape = math.inf if trials.distribution == "poisson" else trials.shape
    expected = _independent_epsilon(
        inner, rounds, trials.mean, shape, delta, dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    got = tuning_epsilon([(event, rounds)], delta, trials)
    assert got == pytest.approx(expected, rel=1e-12)
    single = compose_epsilon([(event, rounds)], delta)
    assert got > single  # tuning costs privacy ...
    assert got < 3 * single  # ... far less than composing the trials would at this mean


def test_tuning_epsilon_of_fixed_size_sampling_uses_replace_one():
    n, m, sigma, rounds, delta = 400, 20, 0.8, 30, 1e-4
    event = SubsampledGaussianEvent.fixed(population=n, cohort_size=m, noise_multiplier=sigma)
    inner = dpa.SampledWithoutReplacementDpEvent(n, m, dpa.GaussianDpEvent(sigma / 2))
    trials = TrialCount(TNB, 8.0, shape=1.0)
    expected = _independent_epsilon(
        inner, rounds, 8.0, 1.0, delta, dpa.NeighboringRelation.REPLACE_ONE
    )
    assert tuning_epsilon([(event, rounds)], delta, trials) == pytest.approx(expected, rel=1e-12)


def test_tuning_epsilon_grows_with_the_mean_and_is_infinite_without_noise():
    event = SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=1.2)
    eps = [tuning_epsilon([(event, 20)], 1e-5, TrialCount(TNB, k, shape=1.0)) for k in (2, 8, 32)]
    assert eps[0] < eps[1] < eps[2]
    free = SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=0.0)
    assert tuning_epsilon([(free, 1)], 1e-5, TrialCount("poisson", 3.0)) == math.inf


def test_ledger_rdp_adds_the_events_curves():
    a = SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=1.0)
    b = SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=2.0)
    np.testing.assert_allclose(
        ledger_rdp([(a, 3), (b, 2)]), 3 * ledger_rdp([(a, 1)]) + 2 * ledger_rdp([(b, 1)])
    )
    assert np.all(ledger_rdp([(a, 1)]) > ledger_rdp([(b, 1)]))


def test_a_shape_too_large_for_its_mean_is_refused_not_an_overflow():
    """Seventh review F6: eta 1e6 at mean 1e4 overflowed ``expm1`` in the sampler."""
    with pytest.raises(ValueError, match=r"shape 1e\+06 with mean 10000 is out of range.*171"):
        TrialCount("truncated-negative-binomial", 10_000.0, shape=1e6)
    # the largest valid shape still draws and sums to one
    edge = TrialCount("truncated-negative-binomial", 10_000.0, shape=171.0)
    assert edge.sample(np.random.default_rng(0)) >= 1
    assert edge.pmf(np.arange(0, 40_000)).sum() == pytest.approx(1.0, abs=1e-9)
    # at a small mean every shape up to the limit is fine
    TrialCount("truncated-negative-binomial", 2.0, shape=1e6)


def _toy_ledger(sigma):
    from fedprivopt.privacy.events import SubsampledGaussianEvent

    event = SubsampledGaussianEvent.from_dict({"noise_multiplier": sigma, "sampling": "poisson",
                                               "sample_rate": 0.25, "population": 16,
                                               "cohort_size": None})  # fmt: skip
    return ((event, 3),)


def test_orders_where_dp_accounting_fails_are_dropped_consistently():
    """Eighth review F1: σ = 1.0 has RDP inf at order 1.7 (dp-accounting does not converge), so
    no grid point dominated σ = 0.5 and tune refused the grid."""
    from dp_accounting import dp_event, rdp

    from fedprivopt.privacy.tuning import finite_orders, ledger_rdp, run_dp_event
    from fedprivopt.simulation.tune import dominating_plan

    low, high = _toy_ledger(0.5), _toy_ledger(1.0)
    assert np.isfinite(ledger_rdp(high)).sum() < np.isfinite(ledger_rdp(low)).sum()
    point, ledger = dominating_plan([({"s": 0.5}, low), ({"s": 1.0}, high)])
    assert point == {"s": 0.5} and ledger == low
    orders = finite_orders([low, high])
    assert orders is not None and 1.7 not in orders
    # left: orders where both are finite, or both not (no ε comes from those)
    assert (np.isfinite(ledger_rdp(high, orders)) == np.isfinite(ledger_rdp(low, orders))).all()
    trials = TrialCount("truncated-negative-binomial", 3.0, shape=1.0)
    eps = tuning_epsilon(low, 1e-4, trials, orders)
    accountant = rdp.RdpAccountant(list(orders))
    accountant.compose(dp_event.RepeatAndSelectDpEvent(run_dp_event(low), 3.0, 1.0))
    assert eps == pytest.approx(accountant.get_epsilon(1e-4), rel=1e-12)
    assert eps >= tuning_epsilon(low, 1e-4, trials)  # fewer orders: never a smaller epsilon


@pytest.mark.parametrize(
    "trials", [TrialCount(TNB, 5.0, shape=1.0), TrialCount("poisson", 5.0)],
    ids=lambda t: t.distribution,
)  # fmt: skip
def test_rdp_within_rounding_of_zero_never_reaches_the_tuning_bound(trials):
    """Fourteenth review of issue 15: the run's curve was dp-accounting's composition, so at
    σ = 1.6357e7, q = 0.1 (a round's RDP about 1e-17, cancelled to 0) a tuning of 10**21 rounds
    reported ε = 0; the orders within rounding of 0 are now dropped, as a run's ε drops them."""
    from fedprivopt.privacy.tuning import composed_tuning_epsilon

    huge = SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=1.6357e7)
    ledger = [(huge, 10**21)]
    accountant = rdp.RdpAccountant()
    run = dpa.SelfComposedDpEvent(huge.to_dp_event(), 10**21)
    accountant.compose(dp_event.RepeatAndSelectDpEvent(run, trials.mean, trials.dp_shape))
    assert accountant.get_epsilon(1e-5) == 0  # what dp-accounting alone reports
    curve = ledger_rdp(ledger)
    assert np.isfinite(curve).any() and not np.isfinite(curve).all()
    single = compose_epsilon(ledger, 1e-5)
    assert single > 3.7e4  # the run's own bound, the thirteenth review's fix
    eps = tuning_epsilon(ledger, 1e-5, trials)
    assert eps >= single  # the best of several runs costs at least one run
    assert composed_tuning_epsilon(ledger, 1e-5, trials, 3) >= eps
