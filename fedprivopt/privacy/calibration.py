"""Calibration: the smallest noise multiplier that meets a target (ε, δ).

The search itself is the libraries' own: ``dp_accounting.calibrate_dp_mechanism`` (Brent's method
over a fresh accountant per candidate) for RDP and PLD, and Opacus' ``get_noise_multiplier``
search for PRV, re-run here so that every probe goes through the PRV memory guard of
:func:`~fedprivopt.privacy.accounting.compose_epsilon` and the search is bounded. The returned
``σ`` always satisfies the target: ε(σ) ≤ target ε. Numerical failures and targets an accountant
cannot resolve are ``ValueError`` with advice (another accountant).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real

import dp_accounting as dpa

from fedprivopt.core.checks import as_float, check_int
from fedprivopt.core.text import shown
from fedprivopt.privacy.accounting import compose_epsilon, dpa_accountant, fixed_epsilon_bound
from fedprivopt.privacy.accounting_state import (
    check_accountant,
    check_delta,
    check_ledger_count,
    check_pld_discretization,
    relation_of,
)
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.pld_guard import PLDGridTooLargeError
from fedprivopt.privacy.sampling import SamplingSpec

__all__ = ["calibrate_noise_multiplier", "make_round_event"]

#: The lower end of dp-accounting's bracket search (``LowerEndpointAndGuess(1e-3, 1.0)``).
SEARCH_LOWEST_SIGMA = 1e-3

_PLD_BRACKET_STEPS = 12  # σ_rdp · 0.75**k, k <= 12: down to ~σ_rdp / 30
# The PRV search (Opacus' ``get_noise_multiplier``, bounded; see :func:`_calibrate_prv`).
_PRV_SIGMA_START = 20.0  # Opacus' first upper end (10, doubled once)
_PRV_EPS_TOLERANCE = 0.01  # Opacus' epsilon_tolerance
_PRV_EPS_ERROR = 0.01  # the eps_error compose_epsilon gives Opacus' PRV accountant
_PRV_SIGMA_RTOL = 1e-3  # also stop once the bracket is this narrow, relative to its upper end
_PRV_MAX_PROBES = 80  # doubling (<= 17 up to MAX_SIGMA) plus bisection (<= ~40)


def make_round_event(
    noise_multiplier: float,
    *,
    sampling: str = "poisson",
    sample_rate: float | None = None,
    population: int | None = None,
    cohort_size: int | None = None,
) -> SubsampledGaussianEvent:
    """Build the event of one round from the sampling parameters (:class:`SamplingSpec`).

    Poisson sampling takes ``sample_rate`` (or ``cohort_size / population``); fixed-size sampling
    takes ``population`` and ``cohort_size``.
    """
    spec = SamplingSpec(sampling, population, sample_rate=sample_rate, cohort_size=cohort_size)
    return spec.event(noise_multiplier)


def bracketed_search(
    search: Callable[[], float], eps_at: Callable[[float], float], target_epsilon: float
) -> float:
    """``search()``, a dp-accounting bracket search from :data:`SEARCH_LOWEST_SIGMA`, checked.

    Where it finds no bracket, a ``ValueError`` naming ``target_epsilon``. dp-accounting raises
    ``NoBracketIntervalFoundError`` (no ``ValueError``) when the target is met already at the
    search's lowest σ, or by no σ within 2**30 of its guess. A short API review of issue 15:
    ``calibrate_noise_multiplier`` and ``calibrate_tree`` at a target ε of 1e300 let it through.
    ``eps_at(σ)`` says which of the two it was.
    """
    from dp_accounting.mechanism_calibration import NoBracketIntervalFoundError

    try:
        return float(search())
    except NoBracketIntervalFoundError:
        pass
    try:
        lowest = eps_at(SEARCH_LOWEST_SIGMA)
    except (ValueError, ArithmeticError):
        lowest = math.inf
    if lowest <= target_epsilon:
        raise ValueError(
            f"target_epsilon={target_epsilon:g} is met even at noise_multiplier="
            f"{SEARCH_LOWEST_SIGMA:g}, the smallest the calibration searches (epsilon "
            f"{lowest:.4g} there): no noise level is calibrated for it; lower target_epsilon"
        ) from None
    raise ValueError(
        f"target_epsilon={target_epsilon:g} is not met by any noise_multiplier the calibration "
        "searches (up to 2**30): raise target_epsilon or delta, or use fewer rounds"
    ) from None


def _calibrate_prv(
    target_epsilon: float,
    delta: float,
    event: Callable[[float], SubsampledGaussianEvent],
    steps: int,
) -> float:
    """Opacus' ``get_noise_multiplier`` search for PRV, with every probe behind the PRV guard.

    The same search as Opacus (double ``σ`` from 20 until ε ≤ target, giving up above
    ``MAX_SIGMA``; then bisect until ε is within 0.01 below the target), except that every ε goes
    through :func:`~fedprivopt.privacy.accounting.compose_epsilon`: a σ whose PRV domain would
    exceed ``PRV_MAX_BYTES`` is refused before anything is allocated, and a numerical failure of
    Opacus (an error, or an infinite ε at small σ) is a ``ValueError``. A refused σ is taken as
    a lower end whose ε is unknown. The bisection also stops once the bracket is narrower than
    0.1 % of its upper end (Opacus' 0.01 absolute tolerance on ε needs ever finer σ at a large
    target, e.g. 1000, and its probes at tiny σ grow without bound). If the lower end is then a
    refused σ, the smallest σ cannot be known and a ``ValueError`` advising ``rdp`` is raised.
    A target at or below the PRV's error bound (0.01) is refused at once.
    """
    from opacus.accountants.utils import MAX_SIGMA

    def eps_of(sigma: float) -> tuple[float | None, str]:
        try:
            eps = compose_epsilon([(event(sigma), steps)], delta, accountant="prv")
        except (ValueError, ArithmeticError, MemoryError) as exc:
            return None, (str(exc).splitlines() or [type(exc).__name__])[0]
        # Opacus returns inf when the loss does not fit its domain: a failure, not an ε
        return (eps, "") if math.isfinite(eps) else (None, "Opacus returned an infinite epsilon")

    def refused(sigma: float, why: str) -> ValueError:
        return ValueError(
            f"accountant 'prv' cannot calibrate target_epsilon={target_epsilon:g} at "
            f"delta={delta:g}, sample_rate={event(1.0).sample_rate:g} over {steps} events: it "
            f"cannot account noise_multiplier={sigma:.4g}, which the search must probe ({why}); "
            "use --accountant rdp (or pld)"
        )

    # Opacus reports the upper end of its error bound, estimate + eps_error (0.01): a target at
    # or below it is met only where the estimated loss is <= 0, i.e. never within MAX_SIGMA for
    # more than a few events, and the search would first probe ~17 ever larger domains.
    if target_epsilon <= _PRV_EPS_ERROR:
        raise ValueError(
            f"target_epsilon={target_epsilon:g} cannot be met by the prv accountant: its epsilon "
            f"is an upper bound that includes its error prv_eps_error={_PRV_EPS_ERROR:g}, so "
            "the target must be larger; use --accountant rdp (or pld)"
        )
    probes = 0
    low, low_why = 0.0, ""  # low_why: why ε(low) is unknown ("" when ε(low) > target is known)
    high = _PRV_SIGMA_START
    while True:
        if high > MAX_SIGMA:
            if low_why:
                raise refused(low, low_why)
            raise ValueError(
                f"target_epsilon={target_epsilon:g} cannot be met by the prv accountant at "
                f"delta={delta:g}, sample_rate={event(1.0).sample_rate:g} over {steps} events: "
                f"Opacus' search gives up above noise_multiplier {MAX_SIGMA:g}; raise the target "
                "epsilon, lower the rounds or the sample rate, or use --accountant rdp"
            )
        eps_high, why = eps_of(high)
        probes += 1
        if eps_high is not None and eps_high <= target_epsilon:
            break
        low, low_why = high, why
        high *= 2
    assert eps_high is not None
    while target_epsilon - eps_high > _PRV_EPS_TOLERANCE:
        if high - low <= _PRV_SIGMA_RTOL * high or probes >= _PRV_MAX_PROBES:
            if low_why:
                raise refused(low, low_why)
            break
        sigma = (low + high) / 2
        eps, why = eps_of(sigma)
        probes += 1
        if eps is not None and eps < target_epsilon:
            high, eps_high = sigma, eps
        else:
            low, low_why = sigma, why
    return float(high)


_CHECKED_DOUBLINGS = 40  # σ up to 2**40 times dp-accounting's before the target is refused


def _rdp_checked(
    sigma: float, eps_at: Callable[[float], float], target_epsilon: float, tol: float
) -> float:
    """The smallest ``σ' >= sigma`` (to ``tol`` relative) whose ε by ``eps_at`` meets the target.

    ``sigma`` itself when it meets it. Thirty-first review of issue 15: where dp-accounting's RDP
    of a round cancelled to 0 (``calibrate --target-epsilon 0.05 --population 1000000 --cohort 1
    --rounds 1 --delta 1e-6``: σ 0.982, whose ε compose_epsilon bounds by 0.367), the target was
    refused ("raise target_epsilon") although σ 1.5 meets it (ε 0).
    """
    spent = eps_at(sigma)
    if spent <= target_epsilon:
        return sigma
    low, high = sigma, sigma
    for _ in range(_CHECKED_DOUBLINGS):
        high *= 2.0
        if eps_at(high) <= target_epsilon:
            break
        low = high
    else:
        raise ValueError(
            f"target_epsilon={target_epsilon:g} is not reached: at the noise_multiplier "
            f"{sigma:.5g} dp-accounting's search found, the RDP of a round is within rounding of "
            f"0 and the epsilon that can be shown is {spent:.4g}, and no noise_multiplier up to "
            f"2**{_CHECKED_DOUBLINGS} times it meets the target; raise target_epsilon or delta, "
            "or use fewer rounds"
        )
    return _bisect(eps_at, low, high, target_epsilon, tol)


def _bisect(
    eps_at: Callable[[float], float], low: float, high: float, target_epsilon: float, tol: float
) -> float:
    """The smallest σ in ``(low, high]`` to ``tol`` relative whose ``eps_at`` meets the target.

    ``high`` meets it and ``low`` does not; ε falls with σ.
    """
    while high - low > tol * high:
        mid = (low + high) / 2.0
        if eps_at(mid) <= target_epsilon:
            high = mid
        else:
            low = mid
    return high


_FIXED_DOUBLINGS = 30  # σ up to 2**30 (dp-accounting's bracket search's reach), as its message says


def _fixed_search(
    eps_at: Callable[[float], float], target_epsilon: float, tol: float, start: float = 1.0
) -> Callable[[], float]:
    """The search of a fixed-size round's σ, by the ε the ledger will compose (``eps_at``).

    Thirty-fourth review of issue 15: dp-accounting's search composes its own RDP of sampling
    without replacement, whose differences are rounding noise at a large σ
    (:mod:`fedprivopt.privacy.wor_rdp`): its ε was jagged in σ and stalled at a floor, so
    ``calibrate --sampling fixed --population 2 --cohort 1 --target-epsilon 0.05 --rounds 1``
    returned σ 2e5 where σ 130 meets the target by the accountant's ε of today, and the σ it
    printed for 9 of 10 users (10 rounds, target 1) had ε 1.0014. Here: doubling (or halving)
    from σ = ``start`` to a bracket, then bisection to ``tol`` relative, every probe by
    ``eps_at``, an ε that falls with σ. Raises dp-accounting's ``NoBracketIntervalFoundError``
    where it finds no bracket, for :func:`bracketed_search`'s messages.
    """
    from dp_accounting.mechanism_calibration import NoBracketIntervalFoundError

    def search() -> float:
        low = high = start
        if eps_at(high) <= target_epsilon:
            while True:  # halve down to a σ that misses the target
                low = high / 2.0
                if low < SEARCH_LOWEST_SIGMA:
                    raise NoBracketIntervalFoundError("met at the lowest sigma")
                if eps_at(low) > target_epsilon:
                    break
                high = low
        else:
            for _ in range(_FIXED_DOUBLINGS):
                high = low * 2.0
                if eps_at(high) <= target_epsilon:
                    break
                low = high
            else:
                raise NoBracketIntervalFoundError("not met up to 2**30")
        return _bisect(eps_at, low, high, target_epsilon, tol)

    return search


def _calibrate_fixed(
    event: Callable[[float], SubsampledGaussianEvent],
    steps: int,
    delta: float,
    target_epsilon: float,
    tol: float,
) -> float:
    """The smallest σ (to ``tol``) whose fixed-size ledger of ``steps`` events meets the target.

    The search first probes the cheap upper bound of :func:`fixed_epsilon_bound` (dp-accounting's
    own evaluation of a fixed-size event costs about a second), which is never below the
    accountant's ε, so the σ it finds meets the target; then the accountant's own ε confirms
    it, and where σ a step of ``tol`` lower meets the target too, searches on down with it.
    """
    from dp_accounting.mechanism_calibration import NoBracketIntervalFoundError

    def eps(sigma: float) -> float:
        return compose_epsilon([(event(sigma), steps)], delta)

    def cheap(sigma: float) -> float:
        return fixed_epsilon_bound(event(sigma), steps, delta)

    try:
        start = _fixed_search(cheap, target_epsilon, tol)()
    except NoBracketIntervalFoundError:
        start = 1.0  # the bound alone reaches no bracket: the accountant's ε from σ = 1
    else:
        if eps(start) <= target_epsilon and eps(start * (1.0 - tol)) > target_epsilon:
            return start
    return bracketed_search(_fixed_search(eps, target_epsilon, tol, start), eps, target_epsilon)


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    rounds: int,
    sampling: str = "poisson",
    sample_rate: float | None = None,
    population: int | None = None,
    cohort_size: int | None = None,
    events_per_round: int = 1,
    accountant: str = "rdp",
    tol: float = 1e-4,
    pld_discretization: float = 1e-4,
) -> float:
    """Smallest noise multiplier ``σ`` whose ε after ``rounds`` rounds is at most the target.

    Parameters
    ----------
    target_epsilon : float
        Target ε > 0.
    delta : float
        δ in ``(0, 1)``.
    rounds : int
        Number of rounds ``T >= 1``.
    sampling, sample_rate, population, cohort_size
        As for :func:`make_round_event`.
    events_per_round : int
        Data accesses per round (2 for ADADP).
    accountant : {"rdp", "pld", "prv"}
        Library used for ε.
    tol : float
        Tolerance on ``σ`` (RDP, PLD); PRV uses Opacus' ε tolerance of 0.01, and stops
        bisecting once its bracket is narrower than 0.1 % of ``σ``.
    pld_discretization : float
        ``value_discretization_interval`` of the PLD accountant, in ``(0, 1)``.

    Returns
    -------
    float
        ``σ`` (noise std on the clipped sum over the clip norm).

    Raises
    ------
    PLDGridTooLargeError
        (a ``ValueError``) with ``accountant="pld"`` when the search would have to account a σ
        whose PLD exceeds ``pld_guard.PLD_MAX_BYTES`` (see
        :func:`~fedprivopt.privacy.accounting.compose_epsilon`).
    ValueError
        With ``accountant="prv"``, when no σ up to Opacus' ``MAX_SIGMA`` meets the target, or
        when the search must probe a σ that the PRV accountant refuses (domain beyond
        ``prv_guard.PRV_MAX_BYTES``, checked before anything is allocated) or fails on
        numerically; with ``accountant="pld"``, when the PLD grid is too coarse to resolve the
        target. Each message advises another accountant.
    """
    # sixteenth review of issue 15: True was taken as a target of 1 and "5" failed with a
    # TypeError; rounds=10**400 raised OverflowError from dp-accounting's composition
    if (
        isinstance(target_epsilon, bool)
        or not isinstance(target_epsilon, Real)
        or not (target_epsilon > 0 and math.isfinite(as_float(target_epsilon)))
    ):
        raise ValueError(f"target_epsilon must be a finite number > 0, got {shown(target_epsilon)}")
    target_epsilon = float(target_epsilon)
    delta = check_delta(delta)
    rounds = check_int("rounds", rounds, 1)
    events_per_round = check_int("events_per_round", events_per_round, 1)
    check_ledger_count(
        rounds * events_per_round,
        "rounds x events_per_round must be at most 10**300 (events composed; float64 holds no "
        "more)",
    )
    if isinstance(tol, bool) or not (isinstance(tol, Real) and 0 < tol <= 1):
        # fourteenth review of issue 15: tol=nan ended in brentq's "did not bracket a
        # solution" naming no parameter; tol=1e9 in an error blaming target_epsilon; tol=10
        # returned sigma 13.0 as "the smallest" for a target that sigma 3.03 meets
        raise ValueError(f"tol must be a number in (0, 1] (a tolerance on sigma), got {shown(tol)}")
    check_accountant(accountant)
    h = check_pld_discretization(pld_discretization)
    steps = rounds * events_per_round

    def event(sigma: float) -> SubsampledGaussianEvent:
        return make_round_event(
            sigma,
            sampling=sampling,
            sample_rate=sample_rate,
            population=population,
            cohort_size=cohort_size,
        )

    probe = event(1.0)  # validates the sampling arguments and the accountant/sampling pairing
    if probe.sampling == "fixed":  # refused by pld and prv; its rdp takes a second to compute
        relation_of(((probe, 1),), accountant)
    else:
        compose_epsilon([(probe, 1)], delta, accountant=accountant)
    if accountant == "prv":
        return _calibrate_prv(target_epsilon, delta, event, steps)

    def search(kind: str, bracket: dpa.BracketInterval) -> float:
        return float(
            dpa.calibrate_dp_mechanism(
                lambda: dpa_accountant(kind, probe.neighboring_relation, h),
                lambda s: dpa.SelfComposedDpEvent(event(s).to_dp_event(), steps),
                target_epsilon,
                delta,
                bracket_interval=bracket,
                tol=tol,
            )
        )

    def rdp_eps(sigma: float) -> float:
        return compose_epsilon([(event(sigma), steps)], delta)

    if probe.sampling == "fixed":  # rdp only: the other accountants refused it above
        return _calibrate_fixed(event, steps, delta, target_epsilon, tol)
    sigma_rdp = bracketed_search(
        lambda: search("rdp", dpa.LowerEndpointAndGuess(SEARCH_LOWEST_SIGMA, 1.0)),
        rdp_eps,
        target_epsilon,
    )
    if accountant == "rdp":
        # dp-accounting's search composes its own RDP, whose value for a round at a huge σ (or a
        # tiny q) cancels to 0, where compose_epsilon has an upper bound: check the result, and
        # where it fails, search on from there with compose_epsilon itself
        return _rdp_checked(sigma_rdp, rdp_eps, target_epsilon, tol)

    # PLD is usually tighter than RDP, so its σ lies below σ_rdp (checked: at a tiny target its
    # grid can be looser, which is refused with advice). Bracket it from there: a PLD of a tiny σ
    # needs an enormous grid (tens of GiB), so the search must never probe near 0. Each bracket
    # probe goes through compose_epsilon, which refuses a grid beyond PLD_MAX_BYTES before
    # allocating it; the search then only probes σ >= lower, whose grids are smaller.
    def pld_eps(sigma: float) -> float:
        try:
            return compose_epsilon(
                [(event(sigma), steps)], delta, accountant="pld", pld_discretization=h
            )
        except PLDGridTooLargeError as exc:
            raise PLDGridTooLargeError(
                f"cannot calibrate target_epsilon={target_epsilon:g} over rounds={rounds} with "
                f"the PLD grid of the noise levels it must probe: {exc}"
            ) from None

    eps_rdp_sigma = pld_eps(sigma_rdp)
    if eps_rdp_sigma > target_epsilon:
        # The upper end must meet the target; at a tiny target the PLD's discretization
        # (one grid step of loss a round at least) can be looser than RDP.
        raise ValueError(
            f"target_epsilon={target_epsilon:g} is too small for the pld accountant at "
            f"pld_discretization={h:g} over {steps} events: even at the rdp accountant's "
            f"noise_multiplier {sigma_rdp:.4g} its epsilon is {eps_rdp_sigma:.4g} (the grid "
            "is too coarse); use --accountant rdp, or a finer --pld-discretization"
        )
    lower = sigma_rdp
    for _ in range(_PLD_BRACKET_STEPS):
        lower *= 0.75
        if pld_eps(lower) > target_epsilon:
            break
    else:
        # The PLD's ε stays at or below the target from σ_rdp down to ~σ_rdp/30: its grid is
        # too coarse for this target (each round's loss range is below one grid step), and
        # Brent's method would fail on a bracket with no sign change.
        raise ValueError(
            f"target_epsilon={target_epsilon:g} is too small for the pld accountant at "
            f"pld_discretization={h:g} over {steps} events: its epsilon stays at or below the "
            f"target for every noise_multiplier in [{lower:.4g}, {sigma_rdp:.4g}] (the grid is "
            "too coarse to resolve it); use --accountant rdp, or a finer --pld-discretization"
        )
    try:
        return search("pld", dpa.ExplicitBracketInterval(lower, sigma_rdp))
    except ValueError as exc:
        if isinstance(exc, PLDGridTooLargeError):
            raise
        raise ValueError(
            f"the pld accountant cannot calibrate target_epsilon={target_epsilon:g} over "
            f"{steps} events ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
            "use --accountant rdp, or a finer --pld-discretization"
        ) from None
