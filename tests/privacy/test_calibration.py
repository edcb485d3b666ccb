import pytest

from fedprivopt.privacy import calibrate_noise_multiplier, compose_epsilon, make_round_event
from fedprivopt.privacy.events import SubsampledGaussianEvent


@pytest.mark.parametrize(
    ("target", "q", "rounds", "accountant"),
    [
        (6.7127, 0.01, 10_000, "rdp"),
        (2.0, 0.05, 100, "rdp"),
        (4.0, 0.05, 50, "pld"),
        (4.0, 0.02, 300, "prv"),
    ],
)
def test_calibrate_then_epsilon_round_trips(target, q, rounds, accountant):
    sigma = calibrate_noise_multiplier(
        target_epsilon=target, delta=1e-5, rounds=rounds, sample_rate=q, accountant=accountant
    )
    ev = make_round_event(sigma, sample_rate=q)
    achieved = compose_epsilon([(ev, rounds)], 1e-5, accountant=accountant)
    assert achieved <= target * (1 + 1e-9)
    assert achieved == pytest.approx(target, rel=0.01)
    # a slightly smaller sigma no longer meets the target: sigma is (nearly) the smallest
    smaller = make_round_event(sigma * 0.98, sample_rate=q)
    assert compose_epsilon([(smaller, rounds)], 1e-5, accountant=accountant) > target


def test_calibrate_acceptance_example_gives_sigma_one():
    sigma = calibrate_noise_multiplier(
        target_epsilon=6.7128, delta=1e-5, rounds=10_000, sample_rate=0.01
    )
    assert sigma == pytest.approx(1.0, abs=1e-3)


def test_calibrate_fixed_size_and_events_per_round():
    kw = dict(target_epsilon=5.0, delta=1e-5, rounds=50)
    fixed = calibrate_noise_multiplier(sampling="fixed", population=1000, cohort_size=20, **kw)
    ev = make_round_event(fixed, sampling="fixed", population=1000, cohort_size=20)
    assert compose_epsilon([(ev, 50)], 1e-5) == pytest.approx(5.0, rel=0.01)
    one = calibrate_noise_multiplier(sample_rate=0.02, **kw)
    two = calibrate_noise_multiplier(sample_rate=0.02, events_per_round=2, **kw)
    assert two > one
    assert compose_epsilon([(make_round_event(two, sample_rate=0.02), 100)], 1e-5) <= 5.0 + 1e-9


def test_calibrate_rejects_bad_input():
    with pytest.raises(ValueError, match="target_epsilon"):
        calibrate_noise_multiplier(target_epsilon=0, delta=1e-5, rounds=5, sample_rate=0.1)
    with pytest.raises(ValueError, match="rounds"):
        calibrate_noise_multiplier(target_epsilon=1, delta=1e-5, rounds=0, sample_rate=0.1)
    with pytest.raises(ValueError, match="rdp"):
        calibrate_noise_multiplier(
            target_epsilon=1,
            delta=1e-5,
            rounds=5,
            sampling="fixed",
            population=10,
            cohort_size=2,
            accountant="pld",
        )


def test_calibrate_pld_refuses_a_search_that_needs_a_huge_grid():
    """A huge target ε pushes σ toward 0, where one PLD needs GiBs: a clear ValueError, fast."""
    import time

    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"target_epsilon=1000.*pld_discretization") as info:
        calibrate_noise_multiplier(
            target_epsilon=1000.0, delta=1e-5, rounds=1, sample_rate=1.0, accountant="pld"
        )
    assert "rdp" in str(info.value) and "GiB" in str(info.value)
    assert time.perf_counter() - start < 10
    # RDP calibrates the same target (no grid)
    assert (
        calibrate_noise_multiplier(target_epsilon=1000.0, delta=1e-5, rounds=1, sample_rate=1.0)
        < 0.1
    )


def test_calibrate_pld_discretization_is_used_and_checked():
    kw = dict(target_epsilon=4.0, delta=1e-5, rounds=50, sample_rate=0.05, accountant="pld")
    coarse = calibrate_noise_multiplier(pld_discretization=1e-2, **kw)
    ev = make_round_event(coarse, sample_rate=0.05)
    # met at the coarse grid, which is more pessimistic than the default one: had the default
    # grid been searched, this σ would exceed the target when accounted at 1e-2
    achieved = compose_epsilon([(ev, 50)], 1e-5, accountant="pld", pld_discretization=1e-2)
    assert achieved <= 4.0 * (1 + 1e-9)
    assert achieved == pytest.approx(4.0, rel=0.01)
    assert compose_epsilon([(ev, 50)], 1e-5, accountant="pld") < achieved
    with pytest.raises(ValueError, match="pld_discretization"):
        calibrate_noise_multiplier(pld_discretization=0.0, **kw)


def test_calibrate_prv_names_the_target_when_no_noise_level_meets_it():
    """A variant of issue 15's case 9: Opacus' bare "The privacy budget is too low." is replaced."""
    with pytest.raises(ValueError, match=r"target_epsilon=0\.001 cannot be met by the prv"):
        calibrate_noise_multiplier(
            target_epsilon=0.001, delta=1e-5, rounds=100000, sample_rate=0.9, accountant="prv"
        )


def test_calibrate_prv_refuses_a_target_at_its_error_bound_at_once():
    """Issue 15: target 0.01 over 10**6 rounds grew to 7.3 GB, then an _ArrayMemoryError."""
    with pytest.raises(ValueError, match=r"target_epsilon=0\.01 cannot be met by the prv.*rdp"):
        calibrate_noise_multiplier(
            target_epsilon=0.01, delta=1e-5, rounds=10**6, sample_rate=0.5, accountant="prv"
        )


def test_calibrate_prv_probes_only_through_the_guard_and_ends(monkeypatch):
    """Issue 15: target 1000 over 10 rounds ran for minutes (Opacus' unguarded search).

    A stand-in ε (1/σ, refused below σ = 0.01 as the guard refuses a large domain) checks that
    every probe goes through ``compose_epsilon`` (Opacus' own search is never called), that the
    search is bounded, and that a lower end it cannot account becomes advice to use rdp.
    """
    import opacus.accountants.utils as opacus_utils

    from fedprivopt.privacy import calibration
    from fedprivopt.privacy.accounting import PRVDomainTooLargeError

    def unguarded(**kwargs):
        raise AssertionError("Opacus' get_noise_multiplier bypasses the PRV guard")

    probes = []

    def fake(ledger, delta, **kwargs):
        sigma = ledger[0][0].noise_multiplier
        probes.append(sigma)
        if sigma < 0.01:
            raise PRVDomainTooLargeError(f"refused noise_multiplier={sigma:g}")
        return 1.0 / sigma

    monkeypatch.setattr(opacus_utils, "get_noise_multiplier", unguarded)
    monkeypatch.setattr(calibration, "compose_epsilon", fake)
    with pytest.raises(ValueError, match=r"cannot account noise_multiplier=0\.0099.*use --acc"):
        calibrate_noise_multiplier(
            target_epsilon=1000, delta=1e-5, rounds=10, sample_rate=0.5, accountant="prv"
        )
    assert len(probes) <= 100
    probes.clear()
    sigma = calibrate_noise_multiplier(
        target_epsilon=50, delta=1e-5, rounds=10, sample_rate=0.5, accountant="prv"
    )
    assert 1 / sigma <= 50 and sigma == pytest.approx(0.02, rel=1e-3) and len(probes) <= 100


def test_calibrate_pld_names_a_target_its_grid_cannot_resolve():
    """Issue 15: target 0.001 at q = 1 over 10**6 rounds printed a raw ``brentq`` error."""
    with pytest.raises(ValueError) as info:
        calibrate_noise_multiplier(
            target_epsilon=0.001, delta=1e-5, rounds=10**6, sample_rate=1.0, accountant="pld"
        )
    message = str(info.value)
    assert "too small for the pld accountant" in message and "--accountant rdp" in message
    assert "brentq" not in message and len(message.splitlines()) == 1


def test_a_target_only_the_rounding_meets_is_refused():
    """dp-accounting's search met ε 0.001 (q 0.05, 40 rounds, δ 1e-5) at σ 31,623, where its RDP
    of a round cancels to 0; compose_epsilon's bound there was 0.0035: refused, not printed.

    Since the thirty-first review of issue 15 compose_epsilon sums a Poisson event's integer
    orders without that cancellation, and its ε there is 0 (the order-2 RDP bounds the total
    variation below δ): the σ is returned, and meets the target. (Where the check fails, the
    search goes on from dp-accounting's σ with compose_epsilon itself: ``_rdp_checked``.)"""
    sigma = calibrate_noise_multiplier(
        target_epsilon=0.001, delta=1e-5, sample_rate=0.05, rounds=40
    )
    event = SubsampledGaussianEvent.poisson(sample_rate=0.05, noise_multiplier=sigma)
    assert compose_epsilon([(event, 40)], 1e-5) <= 0.001
    sigma = calibrate_noise_multiplier(
        target_epsilon=0.1, delta=1e-6, sample_rate=0.0003, rounds=1500
    )
    assert sigma == pytest.approx(2.8058, rel=1e-3)  # ordinary targets are unchanged
