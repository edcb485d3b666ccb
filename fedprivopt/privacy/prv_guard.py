"""Opacus' PRV accountant behind a memory guard.

``opacus.accountants.PRVAccountant`` (Gopi et al. 2021) discretizes every distinct event of a
ledger on one domain whose size grows like ``L·√T / eps_error``. Before anything is allocated the
domain is sized as Opacus sizes it (:func:`prv_domain_points`) and a ledger that would need more
than :data:`PRV_MAX_BYTES` is refused with :class:`PRVDomainTooLargeError`; Opacus' numerical
failures become ``ValueError`` (:func:`prv_epsilon`). Use it through
:func:`fedprivopt.privacy.accounting.compose_epsilon` with ``accountant="prv"``.

References
----------
S. Gopi, Y. T. Lee, L. Wutschitz, "Numerical Composition of Differential Privacy", NeurIPS 2021.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from fedprivopt.core.text import shown
from fedprivopt.privacy.accounting_state import (
    Ledger,
    check_delta,
    check_prv_eps_error,
    gib,
)
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.pld_guard import poisson_gaussians

__all__ = [
    "PRV_MAX_BYTES",
    "PRVDomainTooLargeError",
    "check_prv_ledger",
    "prv_domain_points",
    "prv_epsilon",
]

# How Opacus' PRVAccountant grows (opacus 1.6, accountants/prv.py): every distinct event is
# discretized on one domain [-L, L] of mesh ``eps_error / sqrt(T·ln(12/δe)/2)`` (T the total
# number of compositions, δe = δ/1000), where L comes from an RDP bound
# (``compute_safe_domain_size``); each discretization evaluates the PRV's CDF on the whole domain
# and is then self-composed by an FFT of the same length. Peak traced memory measured with
# tracemalloc is 67-68 bytes per domain point (six settings, 2.8e4 to 7.5e6 points), but
# tracemalloc does not see all of it: the peak resident memory of the process grows by 176-184
# bytes a point from about 1.5e6 points (thirty-eighth review of issue 15: 1.25 GB more at the
# old limit of 7.46e6 points, where the guard said 512 MiB; 67 bytes a point below 1e6).
PRV_MAX_BYTES = 512 * 2**20
"""Largest estimated peak memory (bytes) of one PRV computation; larger ledgers are refused."""
_PRV_BYTES = 200  # per domain point per distinct event (peak resident memory: 176-184 measured)


class PRVDomainTooLargeError(ValueError):
    """The PRV of a ledger would need more memory than :data:`PRV_MAX_BYTES`."""


def _prv_history(ledger: Ledger) -> list[tuple[float, float, int]]:
    return [(e.noise_multiplier, e.sample_rate, int(c)) for e, c in ledger]


def _prv_failure(ledger: Ledger, reason: str) -> ValueError:
    event = ledger[0][0]
    return ValueError(
        f"accountant 'prv' cannot account noise_multiplier={event.noise_multiplier:g} with "
        f"sample_rate={event.sample_rate:g} over {sum(c for _, c in ledger)} events ({reason}); "
        "use the rdp accountant (or pld)"
    )


def prv_domain_points(
    ledger: Iterable[tuple[SubsampledGaussianEvent, int]], delta: float, eps_error: float = 0.01
) -> float:
    """Points of the domain Opacus' PRV accountant would discretize ``ledger`` on.

    Sized exactly as ``PRVAccountant._get_domain`` sizes it (the RDP-based half-width ``L`` and
    the mesh ``eps_error / sqrt(T·ln(12/δe)/2)``, ``δe = δ/1000``), without allocating anything;
    each distinct event of the ledger is discretized on this domain.

    Returns
    -------
    float
        The number of points (``inf`` when the half-width is not finite).
    """
    import warnings

    from opacus.accountants.analysis.prv import (
        PoissonSubsampledGaussianPRV,
        compute_safe_domain_size,
    )

    eps_error = check_prv_eps_error(eps_error)  # 5.0 was taken (short API review of issue 15)
    delta_error = check_delta(delta) / 1000
    ledger = poisson_gaussians(ledger, "prv")  # a count folded in; fixed and tree refused
    if not ledger:
        return 0.0
    if delta_error == 0:  # 5e-324: Opacus' mesh divides by it (ZeroDivisionError before)
        raise ValueError(
            f"delta must be at least {1000 * 5e-324:g} for the prv accountant (its error budget "
            f"delta/1000 must be a positive float), got {shown(delta)}; use the rdp accountant "
            "(or pld)"
        )
    counts = [int(c) for _, c in ledger]
    prvs = [PoissonSubsampledGaussianPRV(e.sample_rate, e.noise_multiplier) for e, _ in ledger]
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            half = float(compute_safe_domain_size(prvs, counts, eps_error, delta_error))
    except (ArithmeticError, ValueError, RuntimeError):
        return math.inf
    mesh = eps_error / math.sqrt(sum(counts) * math.log(12 / delta_error) / 2)
    if not (math.isfinite(half) and mesh > 0):
        return math.inf
    return 2 * (half / mesh + 1) + 2


def check_prv_ledger(ledger: Ledger, delta: float, eps_error: float) -> None:
    """Refuse a merged Poisson ``ledger`` whose PRV domain would exceed :data:`PRV_MAX_BYTES`.

    Raises :class:`PRVDomainTooLargeError` before anything large is allocated, and a
    ``ValueError`` for a noise multiplier above Opacus' ``MAX_SIGMA`` (1e6, where its own search
    gives up): Opacus sizes the domain with its RDP accountant, which there fails (σ 1e8 at
    q = 0.1: an infinite domain, refused) or takes many seconds (σ 1e10 at q = 0.5: ~28 s for
    ε = 0.01, its error bound); thirtieth review of issue 15, privacy-report finding 1.
    """
    ledger = poisson_gaussians(ledger, "prv")  # forty-second review of issue 15 (mechanisms 2)
    from opacus.accountants.utils import MAX_SIGMA

    for event, count in ledger:
        if event.noise_multiplier > MAX_SIGMA:
            raise ValueError(
                f"accountant 'prv' cannot account noise_multiplier={event.noise_multiplier:g} "
                f"(sample_rate={event.sample_rate:g}, {count} events): Opacus' PRV takes "
                f"noise_multiplier <= {MAX_SIGMA:g}; use the rdp accountant (or pld)"
            )
    points = prv_domain_points(ledger, delta, eps_error)
    nbytes = points * _PRV_BYTES * len(ledger)
    if nbytes > PRV_MAX_BYTES:
        event = ledger[0][0]
        raise PRVDomainTooLargeError(
            f"accountant 'prv' refused noise_multiplier={event.noise_multiplier:g} with "
            f"sample_rate={event.sample_rate:g} over {sum(c for _, c in ledger)} events: its "
            f"domain would hold ~{points:.3g} points at prv_eps_error={eps_error:g} (about "
            f"{gib(nbytes)}, limit {gib(PRV_MAX_BYTES)}); use the rdp accountant (or pld)"
        )


def prv_epsilon(ledger: Ledger, delta: float, eps_error: float) -> float:
    """ε of a Poisson ledger with Opacus' PRV accountant, guarded (see :func:`check_prv_ledger`)."""
    import warnings

    delta, eps_error = check_delta(delta), check_prv_eps_error(eps_error)
    ledger = poisson_gaussians(ledger, "prv")  # forty-second review of issue 15 (mechanisms 2)
    check_prv_ledger(ledger, delta, eps_error)
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = _prv_history(ledger)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            eps = float(acc.get_epsilon(delta, eps_error=eps_error))
    except (ArithmeticError, ValueError, RuntimeError, MemoryError) as exc:
        raise _prv_failure(ledger, str(exc).strip().rstrip(".") or type(exc).__name__) from None
    if math.isnan(eps):
        raise _prv_failure(ledger, "Opacus returned NaN")
    # ε(δ) is the least ε >= 0 with δ(ε) <= δ. Opacus solves δ(ε) = δ over every real ε and
    # returns a negative root when already δ(0) < δ (a large δ): the answer is then 0 (a short
    # API review of issue 15: `epsilon --accountant prv --delta 0.1` printed epsilon = -0.0953)
    return max(eps, 0.0)
