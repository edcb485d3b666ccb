"""Calibration: the smallest noise multiplier that meets a target (ε, δ).

The search itself is the libraries' own: ``dp_accounting.calibrate_dp_mechanism`` (Brent's method
over a fresh accountant per candidate) for RDP and PLD, and Opacus' ``get_noise_multiplier`` for
PRV. The returned ``σ`` always satisfies the target: ε(σ) ≤ target ε.
"""

from __future__ import annotations

import math

import dp_accounting as dpa

from fedprivopt.privacy.accounting import (
    ACCOUNTANTS,
    PLDGridTooLargeError,
    compose_epsilon,
    dpa_accountant,
)
from fedprivopt.privacy.events import SubsampledGaussianEvent

__all__ = ["calibrate_noise_multiplier", "make_round_event"]


def make_round_event(
    noise_multiplier: float,
    *,
    sampling: str = "poisson",
    sample_rate: float | None = None,
    population: int | None = None,
    cohort_size: int | None = None,
) -> SubsampledGaussianEvent:
    """Build the event of one round from the sampling parameters.

    Poisson sampling takes ``sample_rate`` (or ``cohort_size / population``); fixed-size sampling
    takes ``population`` and ``cohort_size``.
    """
    if sampling == "poisson":
        if sample_rate is None:
            if population is None or cohort_size is None:
                raise ValueError("poisson sampling needs sample_rate (or population and cohort)")
            sample_rate = cohort_size / population
        return SubsampledGaussianEvent.poisson(
            sample_rate=sample_rate, noise_multiplier=noise_multiplier, population=population
        )
    if sampling == "fixed":
        if population is None or cohort_size is None:
            raise ValueError("fixed sampling needs population and cohort_size")
        return SubsampledGaussianEvent.fixed(
            population=population, cohort_size=cohort_size, noise_multiplier=noise_multiplier
        )
    raise ValueError(f"sampling must be 'poisson' or 'fixed', got {sampling!r}")


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
        Tolerance on ``σ`` (RDP, PLD); PRV uses Opacus' ε tolerance of 0.01.
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
        whose PLD exceeds ``accounting.PLD_MAX_BYTES`` (see
        :func:`~fedprivopt.privacy.accounting.compose_epsilon`).
    """
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise ValueError(f"target_epsilon must be a finite number > 0, got {target_epsilon}")
    if not (0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    if not isinstance(events_per_round, int) or events_per_round < 1:
        raise ValueError(f"events_per_round must be an integer >= 1, got {events_per_round!r}")
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {', '.join(ACCOUNTANTS)}, got {accountant!r}")
    if not (0 < pld_discretization < 1):
        raise ValueError(f"pld_discretization must be in (0, 1), got {pld_discretization}")
    h = float(pld_discretization)
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
    compose_epsilon([(probe, 1)], delta, accountant=accountant)
    if accountant == "prv":
        from opacus.accountants.utils import MAX_SIGMA, get_noise_multiplier

        try:
            return float(
                get_noise_multiplier(
                    target_epsilon=target_epsilon,
                    target_delta=delta,
                    sample_rate=probe.sample_rate,
                    steps=steps,
                    accountant="prv",
                )
            )
        except ValueError as exc:
            if "budget is too low" not in str(exc):
                raise
            raise ValueError(
                f"target_epsilon={target_epsilon:g} cannot be met by the prv accountant at "
                f"delta={delta:g}, sample_rate={probe.sample_rate:g} over {steps} events: Opacus' "
                f"search gives up above noise_multiplier {MAX_SIGMA:g}; raise the target epsilon, "
                "or lower the rounds or the sample rate"
            ) from None

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

    sigma_rdp = search("rdp", dpa.LowerEndpointAndGuess(1e-3, 1.0))
    if accountant == "rdp":
        return sigma_rdp
    # PLD is tighter than RDP, so its σ lies below σ_rdp. Bracket it from there: a PLD of a tiny σ
    # needs an enormous grid (tens of GiB), so the search must never probe near 0. Each bracket
    # probe goes through compose_epsilon, which refuses a grid beyond PLD_MAX_BYTES before
    # allocating it; the search then only probes σ >= lower, whose grids are smaller.
    lower = sigma_rdp
    for _ in range(12):
        lower *= 0.75
        try:
            eps = compose_epsilon(
                [(event(lower), steps)], delta, accountant="pld", pld_discretization=h
            )
        except PLDGridTooLargeError as exc:
            raise PLDGridTooLargeError(
                f"cannot calibrate target_epsilon={target_epsilon:g} over rounds={rounds} with "
                f"the PLD grid of the noise levels it must probe: {exc}"
            ) from None
        if eps > target_epsilon:
            break
    return search("pld", dpa.ExplicitBracketInterval(lower, sigma_rdp))
