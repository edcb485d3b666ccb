import itertools
import json
import math
import warnings

import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis import rdp as opacus_rdp

from fedprivopt.privacy import (
    PrivacyAccountant,
    SubsampledGaussianEvent,
    accounting,
    compose_epsilon,
    pld_guard,
    prv_guard,
    rdp_curves,
)

Poisson = SubsampledGaussianEvent.poisson


def eps(q, sigma, rounds, delta, accountant="rdp"):
    ev = Poisson(sample_rate=q, noise_multiplier=sigma)
    return compose_epsilon([(ev, rounds)], delta, accountant=accountant)


def test_acceptance_example_rdp_pld_prv():
    # Opacus' RDP accountant gives 6.7127 for this setting.
    assert eps(0.01, 1.0, 10_000, 1e-5) == pytest.approx(6.7127, abs=0.005)
    assert eps(0.01, 1.0, 10_000, 1e-5, "pld") == pytest.approx(6.19, abs=0.02)
    assert eps(0.01, 1.0, 10_000, 1e-5, "prv") == pytest.approx(6.19, abs=0.05)


GRID = list(
    itertools.product(
        [0.001, 0.01, 0.05, 0.1], [0.7, 1.0, 2.0, 5.0], [10, 1000, 10_000], [1e-5, 1e-7]
    )
)


def test_rdp_matches_opacus_rdp_on_a_grid():
    """Independent implementations of the same RDP analysis (same orders) agree within 2%.

    Restricted to epsilon <= 50: beyond that dp-accounting drops fractional orders near 1 whose
    series it cannot evaluate in 1000 terms, so our epsilon is larger (conservative) there.
    """
    orders = list(dpa_rdp.DEFAULT_RDP_ORDERS)
    compared = 0
    for q, sigma, rounds, delta in GRID:
        rdp = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=rounds, orders=orders)
        ref, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
        if ref > 50:
            continue
        ours = eps(q, sigma, rounds, delta)
        assert ours == pytest.approx(ref, rel=0.02), (q, sigma, rounds, delta)
        assert ours >= ref * (1 - 1e-6)  # never less private than the reference claims
        compared += 1
    assert compared >= 80


def test_rdp_matches_opacus_default_rdp_accountant_where_its_orders_suffice():
    """Opacus' RDPAccountant uses orders up to 63; where its optimum is interior they agree."""
    compared = 0
    for q, sigma, rounds, delta in GRID[::3]:
        rdp = opacus_rdp.compute_rdp(
            q=q, noise_multiplier=sigma, steps=rounds, orders=RDPAccountant.DEFAULT_ALPHAS
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref, best = opacus_rdp.get_privacy_spent(
                orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta
            )
        if best >= max(RDPAccountant.DEFAULT_ALPHAS) or ref > 50:
            continue
        assert eps(q, sigma, rounds, delta) == pytest.approx(ref, rel=0.02)
        compared += 1
    assert compared >= 15


@pytest.mark.parametrize(
    ("q", "sigma", "rounds"),
    [(0.01, 1.0, 1000), (0.05, 0.8, 200), (0.001, 2.0, 5000), (0.2, 3.0, 50)],
)
def test_pld_is_at_most_rdp(q, sigma, rounds):
    assert eps(q, sigma, rounds, 1e-6, "pld") <= eps(q, sigma, rounds, 1e-6, "rdp")


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_monotonicity(accountant):
    by_t = [eps(0.02, 1.0, t, 1e-5, accountant) for t in (10, 100, 1000)]
    by_q = [eps(q, 1.0, 100, 1e-5, accountant) for q in (0.005, 0.02, 0.1)]
    by_s = [eps(0.02, s, 100, 1e-5, accountant) for s in (0.8, 1.2, 2.0)]
    assert by_t[0] < by_t[1] < by_t[2]
    assert by_q[0] < by_q[1] < by_q[2]
    assert by_s[0] > by_s[1] > by_s[2]


def test_fixed_size_uses_replace_one_with_half_the_noise_multiplier():
    ev = SubsampledGaussianEvent.fixed(population=1000, cohort_size=10, noise_multiplier=2.0)
    assert ev.neighboring_relation.name == "REPLACE_ONE"
    assert ev.accountant_noise_multiplier == 1.0
    assert ev.sample_rate == 0.01
    fixed = compose_epsilon([(ev, 100)], 1e-5)
    # the same event computed directly with dp-accounting, replace-one, sigma / 2
    acc = dpa_rdp.RdpAccountant(neighboring_relation=ev.neighboring_relation)
    import dp_accounting as dpa

    acc.compose(dpa.SampledWithoutReplacementDpEvent(1000, 10, dpa.GaussianDpEvent(1.0)), count=100)
    assert fixed == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)
    # replace-one costs more than add/remove-one with the same noise
    assert fixed > eps(0.01, 2.0, 100, 1e-5)


def test_fixed_size_is_rdp_only_and_cannot_mix_with_poisson():
    ev = SubsampledGaussianEvent.fixed(population=100, cohort_size=10, noise_multiplier=1.0)
    for accountant in ("pld", "prv"):
        with pytest.raises(ValueError, match="rdp"):
            PrivacyAccountant(accountant=accountant).step(ev)
    acc = PrivacyAccountant()
    acc.step(ev)
    with pytest.raises(ValueError, match="Poisson and fixed"):
        acc.step(Poisson(sample_rate=0.1, noise_multiplier=1.0))
    assert acc.num_events == 1  # nothing recorded by the failed step


def test_ledger_merges_and_matches_one_shot_composition():
    ev = Poisson(sample_rate=0.05, noise_multiplier=1.1)
    acc = PrivacyAccountant()
    for _ in range(30):
        acc.step([ev, ev])  # two events per round, as ADADP
    assert acc.ledger == ((ev, 60),)
    assert acc.epsilon(1e-5) == eps(0.05, 1.1, 60, 1e-5)


def test_would_exceed_and_epsilon_after():
    ev = Poisson(sample_rate=0.05, noise_multiplier=1.0)
    acc = PrivacyAccountant()
    acc.step(ev, count=99)
    e99, e100 = acc.epsilon(1e-5), acc.epsilon_after(ev, 1e-5)
    assert e99 < e100 == eps(0.05, 1.0, 100, 1e-5)
    assert acc.would_exceed((e99 + e100) / 2, 1e-5, ev)
    assert not acc.would_exceed(e100 * 1.0001, 1e-5, ev)
    assert acc.num_events == 99  # queries record nothing


def test_budget_loop_never_exceeds_the_target():
    ev = Poisson(sample_rate=0.1, noise_multiplier=1.2)
    acc, target = PrivacyAccountant(), 3.0
    rounds = 0
    while not acc.would_exceed(target, 1e-5, [ev, ev]):
        acc.step([ev, ev])
        rounds += 1
    assert 0 < rounds < 1000
    assert acc.epsilon(1e-5) <= target < acc.epsilon_after([ev, ev], 1e-5)


def test_state_dict_round_trip_through_json():
    acc = PrivacyAccountant(accountant="pld", pld_discretization=1e-3)
    acc.step(Poisson(sample_rate=0.02, noise_multiplier=1.0), count=50)
    acc.step(Poisson(sample_rate=0.02, noise_multiplier=2.0), count=20)
    state = json.loads(json.dumps(acc.state_dict()))
    other = PrivacyAccountant()
    other.load_state_dict(state)
    assert other.accountant == "pld" and other.pld_discretization == 1e-3
    assert other.ledger == acc.ledger and other.num_events == 70
    assert other.epsilon(1e-5) == acc.epsilon(1e-5)
    with pytest.raises(ValueError, match="version"):
        other.load_state_dict({"ledger": []})


def test_empty_and_non_private_ledgers():
    acc = PrivacyAccountant()
    assert acc.epsilon(1e-5) == 0.0
    acc.step(Poisson(sample_rate=0.1, noise_multiplier=0.0))
    assert math.isinf(acc.epsilon(1e-5))


def test_invalid_inputs_name_the_parameter():
    with pytest.raises(ValueError, match="delta"):
        eps(0.1, 1.0, 10, 1.0)
    with pytest.raises(ValueError, match="accountant"):
        PrivacyAccountant(accountant="gdp")
    with pytest.raises(ValueError, match="sample_rate"):
        Poisson(sample_rate=0.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        Poisson(sample_rate=0.5, noise_multiplier=-1.0)
    with pytest.raises(ValueError, match="cohort_size"):
        SubsampledGaussianEvent.fixed(population=5, cohort_size=6, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="count"):
        PrivacyAccountant().step(Poisson(sample_rate=0.5, noise_multiplier=1.0), count=0)
    with pytest.raises(ValueError, match="target_epsilon"):
        PrivacyAccountant().would_exceed(0.0, 1e-5, Poisson(sample_rate=0.5, noise_multiplier=1.0))


# -- the PLD memory guard -------------------------------------------------------------------------


def _pld_reference(ledger, delta, interval=1e-4):
    """ε from dp-accounting's own PLDAccountant (unguarded)."""
    import dp_accounting as dpa
    from dp_accounting import pld

    acc = pld.PLDAccountant(value_discretization_interval=interval)
    acc.compose(
        dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(e.to_dp_event(), c) for e, c in ledger])
    )
    return acc.get_epsilon(delta)


@pytest.mark.parametrize(
    "ledger",
    [
        [(Poisson(sample_rate=0.01, noise_multiplier=1.0), 10_000)],
        [(Poisson(sample_rate=1.0, noise_multiplier=2.0), 30)],
        [(Poisson(sample_rate=0.05, noise_multiplier=0.8), 40)],
        [
            (Poisson(sample_rate=0.02, noise_multiplier=1.0), 50),
            (Poisson(sample_rate=0.02, noise_multiplier=2.0), 20),
        ],
    ],
)
def test_guarded_pld_equals_dp_accounting_pld_accountant(ledger):
    """The guard changes nothing where it lets the computation run: bit-identical ε."""
    assert compose_epsilon(ledger, 1e-5, accountant="pld") == _pld_reference(ledger, 1e-5)


def test_pld_refuses_a_tiny_sigma_before_allocating():
    """σ = 0.01, q = 1 once: dp-accounting would build ~1.2e8 points (~22 GiB) through a dict."""
    import tracemalloc

    ev = Poisson(sample_rate=1.0, noise_multiplier=0.01)
    assert pld_guard.pld_grid_points(ev) == pytest.approx(1.19e8, rel=0.01)
    tracemalloc.start()
    try:
        with pytest.raises(pld_guard.PLDGridTooLargeError) as info:
            compose_epsilon([(ev, 1)], 1e-5, accountant="pld")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20  # refused before anything large was allocated
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    for part in ("noise_multiplier=0.01", "sample_rate=1", "pld_discretization=0.0001", "rdp"):
        assert part in message
    assert "GiB" in message and "limit 512 MiB" in message
    # the same query at a coarser discretization fits and runs
    assert compose_epsilon([(ev, 1)], 1e-5, accountant="pld", pld_discretization=0.05) > 100


@pytest.mark.parametrize(
    ("q", "sigma", "count", "what"),
    [
        (1.0, 1.0, 10_000, "composition over 10000"),  # 1.7e7 FFT points, ~2 GiB
        (0.01, 1.0, 10**12, "composition over 1000000000000"),  # 3e11 points
        (1.0, 0.05, 1, "one round"),
        (0.01, 0.01, 1, "one round"),
    ],
)
def test_pld_refuses_grids_beyond_the_limit(q, sigma, count, what):
    acc = PrivacyAccountant(accountant="pld")  # the path of simulate and the strategies
    acc.step(Poisson(sample_rate=q, noise_multiplier=sigma), count=count)
    with pytest.raises(ValueError, match=what):
        acc.epsilon(1e-5)


def test_pld_grid_estimate_is_what_dp_accounting_builds():
    from dp_accounting.pld import common

    h = 1e-4
    for q, sigma in [(1.0, 1.0), (0.01, 1.0), (0.05, 0.8), (1.0, 3.0)]:
        ev = Poisson(sample_rate=q, noise_multiplier=sigma)
        pld_guard._single_pld.cache_clear()
        built = pld_guard._single_pld(ev, h)
        sizes = [pmf.size for pmf in pld_guard._pmfs(built)]
        assert pld_guard.pld_grid_points(ev, h) == max(sizes)
        for count in (1, 7, 10_000, 10**9):
            expected = 1
            for pmf in pld_guard._pmfs(built):
                probs = pmf.to_dense_pmf()._probs
                lo, hi = common.compute_self_convolve_bounds(probs, count, 1e-15)
                expected = max(expected, hi - lo + 1, len(probs))
            assert pld_guard._self_compose_points(ev, h, count) == expected


def test_pld_memory_estimate_bounds_the_measured_peak():
    """Peak traced memory of a fresh PLD computation stays below the estimate the guard uses."""
    import tracemalloc

    h, count = 1e-4, 2_000
    ev = Poisson(sample_rate=0.02, noise_multiplier=1.5)
    pld_guard._single_pld.cache_clear()
    pld_guard._log_mgfs.cache_clear()
    tracemalloc.start()
    try:
        compose_epsilon([(ev, count)], 1e-5, accountant="pld")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    build = pld_guard._PLD_BUILD_BYTES * pld_guard.pld_grid_points(ev, h)
    fft = pld_guard._PLD_FFT_BYTES * pld_guard._self_compose_points(ev, h, count)
    assert peak <= max(build, fft)
    assert peak >= 0.25 * max(build, fft)  # and the estimate is not wildly pessimistic


def test_pld_limit_is_the_module_constant(monkeypatch):
    ev = Poisson(sample_rate=0.01, noise_multiplier=1.0)
    monkeypatch.setattr(pld_guard, "PLD_MAX_BYTES", 2**20)
    pld_guard._single_pld.cache_clear()
    with pytest.raises(ValueError, match="limit 1 MiB"):
        compose_epsilon([(ev, 10_000)], 1e-5, accountant="pld")


def test_pld_huge_count_on_a_sparse_pmf_does_not_exhaust_memory():
    """q = 1e-300 gives a PLD of a few points; dp-accounting's sparse self-composition would
    compute size**count (a 10^12-digit integer: MemoryError) or loop 10^12 times."""
    ev = Poisson(sample_rate=1e-300, noise_multiplier=0.5)
    assert compose_epsilon([(ev, 10**12)], 1e-5, accountant="pld") == pytest.approx(0.0, abs=1e-3)
    small = Poisson(sample_rate=0.001, noise_multiplier=30.0)  # sparse, few compositions
    assert compose_epsilon([(small, 3)], 1e-5, accountant="pld") == _pld_reference(
        [(small, 3)], 1e-5
    )


# -- a checkpoint's accountant state is validated field by field ---------------------------------


def _valid_state():
    acc = PrivacyAccountant()
    acc.step(Poisson(sample_rate=0.1, noise_multiplier=1.0), count=3)
    return acc.state_dict()


def _with(path, value):
    state = json.loads(json.dumps(_valid_state()))
    target = state
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return state


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("ledger", 0, "count"), -5, "count"),
        (("ledger", 0, "count"), 0, "count"),
        (("ledger", 0, "count"), 2.7, "count"),
        (("ledger", 0, "count"), "3", "count"),
        (("ledger", 0, "count"), True, "count"),
        (("ledger", 0, "count"), None, "count"),
        (("ledger", 0, "count"), _DELETE, "count"),
        (("ledger", 0, "count"), 10**400, "count"),  # issue 15: epsilon() raised OverflowError
        (("ledger", 0, "count"), 10**9 + 1, "count"),
        (("ledger", 0, "event", "noise_multiplier"), 1e308, "noise_multiplier"),
        (("ledger", 0, "event", "noise_multiplier"), 1.1e100, "noise_multiplier"),
        (("ledger", 0, "event", "noise_multiplier"), "1.0", "noise_multiplier"),
        (("ledger", 0, "event", "noise_multiplier"), True, "noise_multiplier"),
        (("ledger", 0, "event", "noise_multiplier"), float("nan"), "noise_multiplier"),
        (("ledger", 0, "event", "sample_rate"), "0.1", "sample_rate"),
        (("ledger", 0, "event", "sample_rate"), 0.0, "sample_rate"),
        (("ledger", 0, "event", "sampling"), "uniform", "sampling"),
        (("ledger", 0, "event", "population"), 2.5, "population"),
        (("ledger", 0, "event"), "poisson", "event"),
        (("ledger", 0, "extra"), 1, "extra"),
        (("ledger", 0), [1, 2], "ledger"),
        (("ledger",), {"0": 1}, "ledger"),
        (("ledger",), _DELETE, "ledger"),
        (("accountant",), "gdp", "accountant"),
        (("accountant",), _DELETE, "accountant"),
        (("pld_discretization",), "1e-4", "pld_discretization"),
        (("pld_discretization",), 0.0, "pld_discretization"),
        (("pld_discretization",), float("nan"), "pld_discretization"),
        (("prv_eps_error",), -1, "prv_eps_error"),
        (("prv_eps_error",), _DELETE, "prv_eps_error"),
        (("version",), True, "version"),
        (("version",), 2, "version"),
        (("version",), 1.0, "version"),  # issue 15: a float where the int 1 is written
        (("surplus",), 0, "surplus"),
    ],
)
def test_load_state_dict_validates_every_field(path, value, field):
    acc = PrivacyAccountant(accountant="pld")
    acc.step(Poisson(sample_rate=0.5, noise_multiplier=2.0), count=7)
    before = (acc.accountant, acc.ledger, acc.pld_discretization, acc.prv_eps_error)
    with pytest.raises(ValueError, match=field) as info:
        acc.load_state_dict(_with(path, value))
    assert len(str(info.value).splitlines()) == 1
    assert (acc.accountant, acc.ledger, acc.pld_discretization, acc.prv_eps_error) == before


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_load_state_dict_bounds_are_accepted_and_give_a_finite_epsilon(accountant):
    from fedprivopt.privacy.accounting_state import MAX_STATE_COUNT, MAX_STATE_NOISE_MULTIPLIER

    for sigma in (1.0, MAX_STATE_NOISE_MULTIPLIER):
        state = _valid_state()
        state["accountant"] = accountant
        state["ledger"] = [
            {
                "event": Poisson(sample_rate=0.5, noise_multiplier=sigma).to_dict(),
                "count": MAX_STATE_COUNT if sigma > 1 else 1,
            }
        ]
        acc = PrivacyAccountant(accountant=accountant)
        acc.load_state_dict(state)
        assert math.isfinite(acc.epsilon(1e-5))


def test_load_state_dict_refuses_events_its_accountant_cannot_account():
    state = _valid_state()
    state["accountant"] = "prv"
    state["ledger"] = [
        {"event": SubsampledGaussianEvent.fixed(population=10, cohort_size=2,
                                                noise_multiplier=1.0).to_dict(), "count": 1}
    ]  # fmt: skip
    with pytest.raises(ValueError, match="accountant"):
        PrivacyAccountant().load_state_dict(state)


def test_set_ledger_replaces_what_was_released():
    acc = PrivacyAccountant()
    ev = Poisson(sample_rate=0.1, noise_multiplier=1.0)
    acc.step(ev, count=2)
    acc.set_ledger([(ev, 5)])
    assert acc.num_events == 5 and acc.epsilon(1e-5) == eps(0.1, 1.0, 5, 1e-5)
    with pytest.raises(ValueError, match="count"):
        acc.set_ledger([(ev, 0)])
    assert acc.num_events == 5


# -- the PRV memory guard and its numerical failures ----------------------------------------------


@pytest.mark.parametrize(
    ("q", "sigma", "count"),
    [
        (0.1, 0.02, 40),  # ~6.5 GiB measured before the guard
        (0.01, 1.0, 10**12),  # --rounds 1000000000000: petabytes
        (0.1, 0.5, 10**12),
    ],
)
def test_prv_refuses_domains_beyond_the_limit_before_allocating(q, sigma, count):
    import tracemalloc

    ev = Poisson(sample_rate=q, noise_multiplier=sigma)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="accountant 'prv'") as info:
            compose_epsilon([(ev, count)], 1e-5, accountant="prv")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20  # refused before the domain was allocated
    assert isinstance(info.value, accounting.PRVDomainTooLargeError)
    message = str(info.value)
    assert "rdp" in message and "limit 512 MiB" in message and len(message.splitlines()) == 1


def test_prv_numerical_failure_is_a_value_error_with_advice():
    """σ = 0.01, q = 1: Opacus raised RuntimeError ("Discrete mean differs significantly")."""
    ev = Poisson(sample_rate=1.0, noise_multiplier=0.01)
    with pytest.raises(
        ValueError, match=r"accountant 'prv'.*noise_multiplier=0\.01.*rdp accountant"
    ):
        compose_epsilon([(ev, 1)], 1e-5, accountant="prv")


def test_prv_guard_estimate_bounds_the_measured_peak():
    import tracemalloc

    ev = Poisson(sample_rate=0.05, noise_multiplier=0.8)
    points = accounting.prv_domain_points([(ev, 200)], 1e-5, 0.01)
    tracemalloc.start()
    try:
        compose_epsilon([(ev, 200)], 1e-5, accountant="prv")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    estimate = prv_guard._PRV_BYTES * points
    # tracemalloc sees about a third of the peak resident memory the estimate bounds (thirty-
    # eighth review of issue 15: 67 of 176-184 bytes a point; its test measures the rest)
    assert 0.25 * estimate <= peak <= estimate


def test_prv_limit_is_the_module_constant(monkeypatch):
    ev = Poisson(sample_rate=0.01, noise_multiplier=1.0)
    monkeypatch.setattr(prv_guard, "PRV_MAX_BYTES", 2**20)
    with pytest.raises(ValueError, match="limit 1 MiB"):
        compose_epsilon([(ev, 10_000)], 1e-5, accountant="prv")


# -- sixth review: tiny noise multipliers -----------------------------------------------------


@pytest.mark.parametrize("sigma", [1e-101, 4.7e-152, 1e-155, 1e-160, 1e-300, 5e-324])
def test_a_noise_multiplier_below_the_floor_is_refused(sigma):
    """σ 1e-155 at q 0.25 composed to ε 0 (dp-accounting's RDP was NaN); 1e-300 divided by 0."""
    from fedprivopt.privacy.events import MIN_NOISE_MULTIPLIER

    assert sigma < MIN_NOISE_MULTIPLIER == 1e-100
    with pytest.raises(ValueError, match=r"noise_multiplier must be 0.*at least 1e-100"):
        Poisson(sample_rate=0.25, noise_multiplier=sigma)
    with pytest.raises(ValueError, match="count_noise_multiplier must be at least 1e-100"):
        Poisson(sample_rate=0.25, noise_multiplier=1.0, count_noise_multiplier=sigma)


def test_cli_floor_is_the_event_floor():
    from fedprivopt.cli_args import NOISE_MULTIPLIER
    from fedprivopt.privacy.events import MIN_NOISE_MULTIPLIER

    assert NOISE_MULTIPLIER(repr(MIN_NOISE_MULTIPLIER)) == MIN_NOISE_MULTIPLIER


@pytest.mark.parametrize("q", [0.01, 0.25, 1.0])
def test_epsilon_never_falls_as_sigma_shrinks_to_the_floor(q):
    """From σ 1 down to the floor the ε of one round is positive and grows: nothing lost to NaN."""
    sigmas = [10.0**-k for k in range(0, 101, 4)] + [1e-100]
    eps = [compose_epsilon([(Poisson(sample_rate=q, noise_multiplier=s), 3)], 1e-4) for s in sigmas]
    assert all(e > 0 for e in eps), eps
    assert all(b >= a for a, b in itertools.pairwise(eps)), eps


def test_a_nan_rdp_counts_as_unbounded(monkeypatch):
    """An order dp-accounting cannot compute (NaN) is not left out (ε was 0): it is infinite, or
    (a Poisson event's integer orders, since the thirty-first review of issue 15) the series of
    ``_poisson_int_rdp``, an upper bound that needs no dp-accounting; a fixed-size event's
    orders up to 256, since the thirty-fourth review, Theorem 27 evaluated without cancellation
    (``privacy/wor_rdp.py``): never less than the ε dp-accounting's own values give."""
    import numpy as np

    real = rdp_curves.rdp.RdpAccountant
    ev = Poisson(sample_rate=0.25, noise_multiplier=0.7)
    fixed = SubsampledGaussianEvent.fixed(population=8, cohort_size=2, noise_multiplier=0.7)
    honest = compose_epsilon([(ev, 1)], 1e-4)
    honest_fixed = compose_epsilon([(fixed, 1)], 1e-4)

    class NanRdp(real):
        @property
        def rdp(self):
            return np.full_like(super().rdp, np.nan)

    rdp_curves.event_rdp.cache_clear()
    rdp_curves.bounded_event_rdp.cache_clear()
    monkeypatch.setattr(rdp_curves.rdp, "RdpAccountant", NanRdp)
    try:
        assert honest <= compose_epsilon([(ev, 1)], 1e-4) < math.inf
        assert honest_fixed <= compose_epsilon([(fixed, 1)], 1e-4) < math.inf
    finally:
        rdp_curves.event_rdp.cache_clear()
        rdp_curves.bounded_event_rdp.cache_clear()


def test_rdp_within_rounding_of_zero_is_dropped_not_composed():
    """Thirteenth review of issue 15: the RDP of a round at σ = 1.6357e7, q = 0.1 (about 1e-17)
    cancelled to 0 in dp-accounting, and 10**21 rounds reported ε = 0 (true: about 3.7e4)."""
    huge = SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=1.6357e7)
    assert compose_epsilon([(huge, 10**21)], 1e-5) > 3.7e4  # an upper bound, never 0
    import numpy as np

    from fedprivopt.privacy.rdp_curves import MIN_LOG_A, RDP_ORDERS, event_rdp

    curve = event_rdp(huge)
    kept = np.isfinite(curve)
    assert kept.any() and not kept.all()  # the low orders were rounding, the high ones are kept
    assert ((RDP_ORDERS[kept] - 1) * curve[kept] >= MIN_LOG_A).all()
    # ε bounds the dropped orders by the Gaussian's own α/(2σ²) (twenty-ninth review: from
    # σ ≈ 1e8 every order was dropped and ε was inf); the kept ones are dp-accounting's
    from fedprivopt.privacy.rdp_curves import bounded_event_rdp

    bounded = bounded_event_rdp(huge)
    unsampled = RDP_ORDERS / (2 * 1.6357e7**2)
    assert np.isfinite(bounded).all() and (bounded <= curve).all()
    # (thirty-first review of issue 15: the dropped integer orders take the sampled Gaussian's
    # own series, summed without cancellation: at order 2, q²·expm1(1/σ²), 100 times below the
    # unsampled bound here; the fractional ones keep that bound)
    frac = RDP_ORDERS != np.floor(RDP_ORDERS)
    assert bounded[~kept & frac] == pytest.approx(unsampled[~kept & frac], rel=1e-12)
    ints = ~kept & ~frac
    assert ints.any() and (bounded[ints] <= unsampled[ints]).all()
    assert bounded[RDP_ORDERS == 2.0][0] == pytest.approx(0.01 / 1.6357e7**2, rel=1e-5)
    assert (bounded[kept] == curve[kept]).all()
    # an ordinary event keeps every order: dp-accounting's value, unchanged
    ev = SubsampledGaussianEvent.poisson(sample_rate=0.01, noise_multiplier=1.0)
    acc = dpa_rdp.RdpAccountant(orders=list(RDP_ORDERS))
    acc.compose(ev.to_dp_event(), 10_000)
    reference = dpa_rdp.compute_epsilon(RDP_ORDERS, acc.rdp, 1e-5)[0]
    assert np.isfinite(event_rdp(ev)).all()
    assert compose_epsilon([(ev, 10_000)], 1e-5) == pytest.approx(reference, rel=1e-12)
