"""The RDP curve of one privacy event, at dp-accounting's orders, and its bounds.

:func:`event_rdp` is dp-accounting's RDP of one event at :data:`RDP_ORDERS` (or given orders),
with an order whose value is NaN or within rounding of 0 (:data:`MIN_LOG_A`) dropped as ``inf``;
:func:`bounded_event_rdp` the upper bound that the ``rdp`` accountant composes, which gives such
an order a value without cancellation (the Poisson integer-order series, the unsampled
mechanism's closed form, and for a fixed-size event :func:`fixed_rdp_bound`, Theorem 27 of
:mod:`fedprivopt.privacy.wor_rdp`). The curves are cached and read-only.
:mod:`fedprivopt.privacy.accounting` composes them into ε (and re-exports ``event_rdp``,
``bounded_event_rdp`` and ``fixed_rdp_bound``).

References
----------
I. Mironov, K. Talwar, L. Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism",
arXiv:1908.10530, 2019.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from dp_accounting import rdp

from fedprivopt.core.text import shown
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.wor_rdp import wor_rdp_bound

__all__ = ["MIN_LOG_A", "RDP_ORDERS", "bounded_event_rdp", "event_rdp", "fixed_rdp_bound"]

#: The RDP orders every curve is evaluated at: dp-accounting's defaults.
RDP_ORDERS = np.asarray(rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=np.float64)


#: Smallest ``(α - 1) · RDP(α)`` of one event that dp-accounting's value is kept at: it sums
#: ``log A_α = (α - 1) RDP(α)`` in floating point, so a value near ``1e-16`` is rounding (it
#: cancels to 0 or below, and dp-accounting returns 0); at ``1e-10`` the relative error is about
#: ``1e-6``, which a composition of any count keeps. Below it the order is dropped (``inf``) by
#: :func:`event_rdp`, and takes the unsampled mechanism's RDP in :func:`bounded_event_rdp`.
MIN_LOG_A = 1e-10


def _check_orders(orders) -> np.ndarray:
    """``orders`` as float64, each a finite real number > 1 (RDP is defined there).

    Fifteenth review of issue 15: ``ledger_rdp(ledger, (0.5,))`` returned an RDP of ``-inf``, and
    orders of NaN, inf or below 1 were turned into ``inf`` silently.
    """
    items = list(orders)
    if any(
        isinstance(o, bool) or not isinstance(o, (int, float, np.integer, np.floating))
        for o in items
    ):
        raise ValueError(f"orders must be real numbers > 1 (RDP orders), got {shown(orders)}"[:200])
    grid = np.asarray(items, dtype=np.float64)
    bad = ~np.isfinite(grid) | (grid <= 1.0)
    if bad.any():
        raise ValueError(
            f"orders must be finite numbers > 1 (RDP orders), got {shown(float(grid[bad][0]))}"
        )
    return grid


@functools.lru_cache(maxsize=256)
def event_rdp(
    event: SubsampledGaussianEvent, orders: tuple[float, ...] | None = None
) -> np.ndarray:
    """RDP of one occurrence of ``event`` at ``orders`` (default dp-accounting's), read-only.

    An order whose value is NaN is unbounded, not absent (dp-accounting would drop it), and an
    order whose value is within rounding of 0 (``(α - 1) RDP < MIN_LOG_A``) is dropped as
    ``inf``: ε takes the minimum over orders, so fewer orders only raise it. Thirteenth review of
    issue 15: at σ = 1.6357e7, q = 0.1 the RDP of a round (about 1e-17) cancelled to 0, and
    ``epsilon --rounds 10**21`` printed 0.0000 for a true ε of about 3.7e4; such a ledger now
    reports ``inf``, never less than was spent. A run's curve is the count-weighted sum of its
    events' (what ``RdpAccountant.compose`` accumulates), so the guard holds for any count.
    """
    grid = RDP_ORDERS if orders is None else _check_orders(orders)
    acc = rdp.RdpAccountant(orders=list(grid), neighboring_relation=event.neighboring_relation)
    try:
        acc.compose(event.to_dp_event())
        curve = np.asarray(acc.rdp, dtype=np.float64)
    except ValueError:
        if event.sampling != "fixed":
            raise
        # thirty-fourth review of issue 15: dp-accounting's bound of sampling without
        # replacement takes log1p(-exp(-1/σ'²)), log1p(-1) and a domain error from σ ≈ 2e8
        # (`epsilon --sampling fixed --noise-multiplier 1e9` printed "error: math domain
        # error"): no value at any order
        curve = np.full(len(grid), np.nan)
    imprecise = np.isnan(curve) | ((grid - 1.0) * curve < MIN_LOG_A)
    curve = np.where(imprecise, np.inf, curve)
    curve.setflags(write=False)
    return curve


_INT_RDP_MARGIN = 1e-6  # relative: covers lgamma's and exp's rounding in the terms below


def _poisson_int_rdp(q: float, sigma: float, alpha: float) -> float:
    """An upper bound on the RDP of a Poisson-sampled Gaussian at an integer ``alpha >= 2``.

    dp-accounting's own series (``_compute_log_a_int``, Mironov, Talwar & Zhang 2019),
    ``A_α = Σ_k C(α, k) (1 - q)^(α-k) q^k exp(k(k - 1)/(2σ²))``, summed as
    ``A_α - 1 = Σ_{k>=2} C(α, k) (1 - q)^(α-k) q^k expm1(k(k - 1)/(2σ²))`` (the ``k`` = 0 and
    1 terms cancel against the binomial sum ``1``): positive terms, so no cancellation, where
    dp-accounting's ``log A_α`` is ``log(1 + tiny)`` and rounds to 0. A tiny ``expm1(x)`` is
    bounded above by ``x·e^x`` in logs and the result is inflated by :data:`_INT_RDP_MARGIN`
    (a tiny one is bounded by ``A_α - 1`` itself, rounded up). ``inf`` for a fractional order
    (no such series) and where a term is not finite.
    """
    if alpha != int(alpha) or alpha < 2:
        return math.inf
    alpha = int(alpha)
    log_q, log_1mq = math.log(q), math.log1p(-q)
    log_half_var = -2.0 * math.log(sigma) - math.log(2.0)  # log 1/(2σ²), no overflow
    logs = []
    for k in range(2, alpha + 1):
        log_x = math.log(k * (k - 1)) + log_half_var
        x = math.exp(log_x) if log_x < 700 else math.inf
        if x < 1e-300:  # expm1(x) <= x e^x, where x itself may not be a float
            log_expm1 = log_x + x
        elif x < 700:
            log_expm1 = math.log(math.expm1(x))
        else:
            log_expm1 = x + math.log(-math.expm1(-x))
        log_comb = math.lgamma(alpha + 1) - math.lgamma(k + 1) - math.lgamma(alpha - k + 1)
        logs.append(log_comb + k * log_q + (alpha - k) * log_1mq + log_expm1)
    peak = max(logs)
    if not math.isfinite(peak):
        return math.inf
    log_sum = peak + math.log(sum(math.exp(v - peak) for v in logs))
    log_sum += math.log1p(_INT_RDP_MARGIN)  # log(A_α - 1), inflated
    if log_sum < -30:  # log A_α = log1p(A_α - 1) <= A_α - 1, which may be subnormal
        return math.nextafter(math.exp(log_sum - math.log(alpha - 1)), math.inf)
    # log(1 + e^log_sum), without cancellation on either side of 0
    log_a = (
        math.log1p(math.exp(log_sum)) if log_sum < 0 else log_sum + math.log1p(math.exp(-log_sum))
    )
    return log_a / (alpha - 1) * (1.0 + _INT_RDP_MARGIN)


@functools.lru_cache(maxsize=256)
def bounded_event_rdp(event: SubsampledGaussianEvent) -> np.ndarray:
    """An upper bound on the RDP of one ``event`` at dp-accounting's default orders, read-only.

    :func:`event_rdp`, except at an order where that is ``inf`` (dp-accounting's value was NaN,
    did not converge, or was within rounding of 0): there the RDP dp-accounting gives the
    event's mechanism without sampling (the Gaussian, or the sum and count pair, of
    ``to_dp_event().event``; under fixed-size sampling in the units of replace-one), a closed
    form ``α/(2σ'^2)`` with no cancellation. Sampling never raises a Rényi divergence (the
    sampled pair is a mixture of unsampled pairs and ``exp((α - 1) D_α)`` is jointly convex), so
    that is an upper bound too. A tree event's RDP is such a closed form already: its own value
    is taken at every order. ε of the ``rdp`` accountant comes from this curve; the tuning bound
    (which dp-accounting composes from the run's own event) keeps :func:`event_rdp`'s orders.

    Twenty-ninth review of issue 15: with those orders dropped, every order was ``inf`` from
    σ ≈ 1e8 at q = 1 and from σ = 1000 at q = 1e-5 (ε ``inf`` for one round, so a run with a
    target ε stopped before its first round), and where only the fractional orders near 1 were
    left, whose series dp-accounting sums with an absolute error near 1e-10, one round at
    σ = 1e5, q = 0.001 had ε 14.80 (σ = 1e4: 0.0000).
    """
    curve = event_rdp(event)
    if event.sampling == "poisson" and 0.0 < event.sample_rate < 1.0:
        # thirty-first review of issue 15: where dp-accounting's integer orders were dropped,
        # their exact series without its cancellation (the unsampled bound alone was 10**4 times
        # looser: σ = 77, q = 1e-6, 10**6 rounds printed ε 145 where σ = 70 printed 0.0035)
        sigma = event.effective_noise_multiplier
        curve = np.array(
            [
                _poisson_int_rdp(event.sample_rate, sigma, a) if math.isinf(c) else c
                for a, c in zip(RDP_ORDERS, curve, strict=True)
            ]
        )
    dp_event = event.to_dp_event()
    mechanism = getattr(dp_event, "event", dp_event)  # a tree event is its own closed form
    acc = rdp.RdpAccountant(
        orders=list(RDP_ORDERS), neighboring_relation=event.neighboring_relation
    )
    acc.compose(mechanism)
    bound = np.asarray(acc.rdp, dtype=np.float64)
    bound = np.where(np.isnan(bound), np.inf, bound)
    # only where dp-accounting gave nothing usable: a finite value it gave stays (it may be
    # looser than the bound, e.g. sampling without replacement at a large ε, but a lower ε for
    # a ledger than it composed to before would read as an edited ledger on --resume)
    curve = np.where(np.isinf(curve), bound, curve)
    if event.sampling == "fixed" and event.sample_rate < 1.0:
        # thirty-fourth review of issue 15: dp-accounting's differences of Theorem 27 are
        # rounding noise at a large σ (one round of 1 of 2 users had ε 0.12 at δ 1e-5 for every
        # σ from 50 to 1e5); the same bound without cancellation where it is smaller
        curve = np.minimum(curve, fixed_rdp_bound(event))
    curve.setflags(write=False)
    return curve


@functools.lru_cache(maxsize=256)
def fixed_rdp_bound(event: SubsampledGaussianEvent) -> np.ndarray:
    """Theorem 27's RDP of a fixed-size ``event`` without cancellation, read-only.

    ``inf`` at orders it does not evaluate; never below :func:`bounded_event_rdp`'s curve, and
    cheap (:func:`~fedprivopt.privacy.wor_rdp.wor_rdp_bound`, at the σ dp-accounting gives it).
    """
    if event.sampling != "fixed":
        raise ValueError(f"fixed_rdp_bound needs a fixed-size event, got {shown(event.sampling)}")
    mechanism = event.to_dp_event().event
    sigma = rdp.rdp_privacy_accountant._effective_gaussian_noise_multiplier(mechanism)
    curve = wor_rdp_bound(event.sample_rate, sigma, RDP_ORDERS)
    curve.setflags(write=False)
    return curve
