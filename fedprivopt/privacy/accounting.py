"""Privacy accountant facade over dp-accounting (RDP, PLD) and Opacus (PRV).

The accountant keeps a *ledger*: the sequence of :class:`SubsampledGaussianEvent` released so far,
with consecutive identical events merged into a count. ε is always computed from the whole ledger
by a well-kept library, never by formulas written here (:func:`compose_epsilon`):

* ``"rdp"`` (default): ``dp_accounting.rdp.RdpAccountant``; supports Poisson sampling
  (add/remove-one) and fixed-size sampling without replacement (replace-one). An adaptive-clipping
  round is given to it as the sampled ``ComposedDpEvent`` of its two Gaussians (sum and count).
  Where dp-accounting's value of an order is rounding (:func:`bounded_event_rdp`), the order
  takes an upper bound that has none: for a fixed-size event dp-accounting's own bound
  evaluated without cancellation (:mod:`fedprivopt.privacy.wor_rdp`).
* ``"pld"``: dp-accounting's privacy loss distributions (what ``dp_accounting.pld.PLDAccountant``
  composes, step for step), tighter; Poisson sampling only. A ledger whose grid would need more
  than ``PLD_MAX_BYTES`` is refused with ``PLDGridTooLargeError`` before anything is allocated:
  that guard is :mod:`fedprivopt.privacy.pld_guard`.
* ``"prv"``: ``opacus.accountants.PRVAccountant`` (Gopi et al. 2021); Poisson sampling only; its
  reported ε is the upper end of its error bound. A ledger whose domain would need more than
  :data:`PRV_MAX_BYTES` is refused with :class:`PRVDomainTooLargeError` (see
  :func:`prv_domain_points`); Opacus' numerical failures become ``ValueError``. That guard is
  :mod:`fedprivopt.privacy.prv_guard`.

PLD and PRV take one Gaussian per sampled event: an adaptive-clipping round is given to them as
the single Gaussian it exactly is (:func:`single_gaussians`; the tests compare it with
dp-accounting's RDP of the composed event).

The ledger type, the checks of the settings and the validation of a saved state are
:mod:`fedprivopt.privacy.accounting_state`.

Because ε is recomputed from the merged ledger, the ε of a run after ``R`` rounds is exactly what
``fedprivopt epsilon`` prints for the same ``q``, ``σ`` and ``R``.

References
----------
I. Mironov, "Rényi Differential Privacy", CSF 2017.
Y. Zhu, J. Dong, Y.-X. Wang, "Optimal Accounting of Differential Privacy via Characteristic
Function", AISTATS 2022.
S. Gopi, Y. T. Lee, L. Wutschitz, "Numerical Composition of Differential Privacy", NeurIPS 2021.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

import dp_accounting as dpa
import numpy as np
from dp_accounting import pld, rdp

from fedprivopt.core.checks import as_float, check_int
from fedprivopt.core.text import shown
from fedprivopt.privacy.accounting_state import (
    ACCOUNTANTS,
    STATE_VERSION,
    Ledger,
    check_accountant,
    check_delta,
    check_pld_discretization,
    check_prv_eps_error,
    merge_ledger,
    parse_state,
    relation_of,
)
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.pld_guard import check_pld_ledger, pld_epsilon
from fedprivopt.privacy.prv_guard import (
    PRV_MAX_BYTES,
    PRVDomainTooLargeError,
    check_prv_ledger,
    prv_domain_points,
    prv_epsilon,
)
from fedprivopt.privacy.wor_rdp import wor_rdp_bound

__all__ = [
    "ACCOUNTANTS",
    "PRV_MAX_BYTES",
    "PRVDomainTooLargeError",
    "PrivacyAccountant",
    "bounded_event_rdp",
    "check_ledger",
    "compose_epsilon",
    "event_rdp",
    "fixed_epsilon_bound",
    "fixed_rdp_bound",
    "prv_domain_points",
    "single_gaussians",
]

_RDP_ORDERS = np.asarray(rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=np.float64)


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
    grid = _RDP_ORDERS if orders is None else _check_orders(orders)
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
                for a, c in zip(_RDP_ORDERS, curve, strict=True)
            ]
        )
    dp_event = event.to_dp_event()
    mechanism = getattr(dp_event, "event", dp_event)  # a tree event is its own closed form
    acc = rdp.RdpAccountant(
        orders=list(_RDP_ORDERS), neighboring_relation=event.neighboring_relation
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
    curve = wor_rdp_bound(event.sample_rate, sigma, _RDP_ORDERS)
    curve.setflags(write=False)
    return curve


def fixed_epsilon_bound(event: SubsampledGaussianEvent, count: int, delta: float) -> float:
    """ε at ``delta`` of ``count`` fixed-size ``event`` by :func:`fixed_rdp_bound` alone.

    Never below :func:`compose_epsilon`'s (its other orders are left out), and cheap: what the
    calibration's search probes before it checks its σ with :func:`compose_epsilon`.
    """
    curve = check_int("count", count, 1) * fixed_rdp_bound(event)
    eps = rdp.rdp_privacy_accountant.compute_epsilon(_RDP_ORDERS, curve, check_delta(delta))[0]
    return _spent(eps)


def check_ledger(
    ledger: Iterable[tuple[SubsampledGaussianEvent, int]],
    delta: float,
    *,
    accountant: str = "rdp",
    pld_discretization: float = 1e-4,
    prv_eps_error: float = 0.01,
) -> None:
    """Refuse, before any large allocation, a ledger that ``accountant`` cannot hold in memory.

    ``pld``: :func:`check_pld_ledger`; ``prv``: the domain size of :func:`prv_domain_points`
    against :data:`PRV_MAX_BYTES`; ``rdp`` needs nothing. A run calls it with its planned ledger
    (rounds × events per round) before training.

    Raises
    ------
    PLDGridTooLargeError, PRVDomainTooLargeError
        (``ValueError``) as an ε query of this ledger would.
    """
    check_accountant(accountant)
    merged = merge_ledger(ledger)
    if not merged or any(e.noise_multiplier == 0 for e, _ in merged):
        return
    relation_of(merged, accountant)
    merged = single_gaussians(merged) if accountant != "rdp" else merged
    if accountant == "pld":
        check_pld_ledger(merged, pld_discretization)
    elif accountant == "prv":
        check_prv_ledger(merged, check_delta(delta), check_prv_eps_error(prv_eps_error))


def single_gaussians(ledger: Iterable[tuple[SubsampledGaussianEvent, int]]) -> Ledger:
    """``ledger`` with every event as the one subsampled Gaussian it is, merged.

    The PLD and PRV paths take one Gaussian per sampled event; an adaptive-clipping round (sum
    and count) is exactly the Gaussian of :meth:`SubsampledGaussianEvent.single_gaussian`
    (Andrew et al. 2021, Theorem 1). The RDP path gives dp-accounting the composed event itself.
    """
    return merge_ledger((event.single_gaussian(), count) for event, count in ledger)


def dpa_accountant(accountant: str, relation: dpa.NeighboringRelation, pld_interval: float):
    if accountant == "rdp":
        return rdp.RdpAccountant(neighboring_relation=relation)
    return pld.PLDAccountant(
        neighboring_relation=relation, value_discretization_interval=pld_interval
    )


def compose_epsilon(
    ledger: Sequence[tuple[SubsampledGaussianEvent, int]],
    delta: float,
    *,
    accountant: str = "rdp",
    pld_discretization: float = 1e-4,
    prv_eps_error: float = 0.01,
) -> float:
    """ε at ``delta`` of the composition of ``(event, count)`` pairs.

    Parameters
    ----------
    ledger : sequence of (SubsampledGaussianEvent, int)
        Events and how many times each was released.
    delta : float
        Target δ in ``(0, 1)``.
    accountant : {"rdp", "pld", "prv"}
        Which library interprets the events.
    pld_discretization : float
        ``value_discretization_interval`` of the PLD accountant.
    prv_eps_error : float
        ``eps_error`` of Opacus' PRV accountant.

    Returns
    -------
    float
        ε (``0.0`` for an empty ledger, ``inf`` if any event has no noise).

    Raises
    ------
    PLDGridTooLargeError
        (a ``ValueError``) with ``accountant="pld"``, before anything large is allocated, when
        the estimated peak memory exceeds ``pld_guard.PLD_MAX_BYTES`` (e.g. ``σ = 0.01``, ``q = 1``
        needs ~22 GiB at the default discretization).
    PRVDomainTooLargeError
        (a ``ValueError``) with ``accountant="prv"``, likewise against :data:`PRV_MAX_BYTES`
        (e.g. ``σ = 0.02``, ``q = 0.1``, 40 rounds: ~6.5 GiB).
    ValueError
        With ``accountant="prv"``, when Opacus fails numerically (e.g. ``σ = 0.01``, ``q = 1``:
        "Discrete mean differs significantly from continuous mean"); the message suggests
        ``rdp``.
    """
    delta = check_delta(delta)
    check_accountant(accountant)
    ledger = merge_ledger(ledger)
    if not ledger:
        return 0.0
    if any(event.noise_multiplier == 0 for event, _ in ledger):
        return math.inf
    relation_of(ledger, accountant)
    if accountant == "prv":
        return prv_epsilon(single_gaussians(ledger), delta, check_prv_eps_error(prv_eps_error))
    if accountant == "rdp":
        # The RDP of a composition is the count-weighted sum of each event's RDP curve, exactly
        # what RdpAccountant.compose accumulates; computing each distinct curve once (cached)
        # makes a per-round epsilon cost a dot product instead of a series evaluation.
        total = sum(count * bounded_event_rdp(event) for event, count in ledger)
        return _spent(rdp.rdp_privacy_accountant.compute_epsilon(_RDP_ORDERS, total, delta)[0])
    return _spent(
        pld_epsilon(single_gaussians(ledger), delta, check_pld_discretization(pld_discretization))
    )


def _spent(eps: float) -> float:
    """``eps`` as a float, a NaN as ``inf``: a failed computation never reports less spent.

    (dp-accounting drops orders whose RDP is NaN and returns 0 when none is left; events below
    ``MIN_NOISE_MULTIPLIER``, where that happened, are refused when they are built.) A 0 itself
    can be right: at a large σ the round is (0, δ)-DP for the δ asked.
    """
    eps = float(eps)
    return math.inf if math.isnan(eps) else eps


class PrivacyAccountant:
    """Ledger of privacy events with ε queries, budget checks and checkpointing.

    Parameters
    ----------
    accountant : {"rdp", "pld", "prv"}
        Library used to interpret the ledger (see the module docstring).
    pld_discretization : float
        ``value_discretization_interval`` of the PLD accountant.
    prv_eps_error : float
        ``eps_error`` of Opacus' PRV accountant.

    Examples
    --------
    >>> ev = SubsampledGaussianEvent.poisson(sample_rate=0.01, noise_multiplier=1.0)
    >>> acc = PrivacyAccountant()
    >>> acc.step(ev, count=10_000)
    >>> round(acc.epsilon(1e-5), 2)
    6.71
    """

    def __init__(
        self,
        *,
        accountant: str = "rdp",
        pld_discretization: float = 1e-4,
        prv_eps_error: float = 0.01,
    ) -> None:
        self.accountant = check_accountant(accountant)
        self.pld_discretization = check_pld_discretization(pld_discretization)
        self.prv_eps_error = check_prv_eps_error(prv_eps_error)
        self._ledger: Ledger = ()
        self._cache: dict[tuple[Ledger, float], float] = {}

    @property
    def ledger(self) -> Ledger:
        """The merged ``(event, count)`` pairs released so far."""
        return self._ledger

    @property
    def num_events(self) -> int:
        """Total number of events released."""
        return sum(count for _, count in self._ledger)

    @staticmethod
    def _as_events(
        events: SubsampledGaussianEvent | Sequence[SubsampledGaussianEvent],
    ) -> tuple[SubsampledGaussianEvent, ...]:
        if isinstance(events, SubsampledGaussianEvent):
            return (events,)
        events = tuple(events)
        if not events:
            raise ValueError("events must contain at least one SubsampledGaussianEvent")
        for e in events:
            if not isinstance(e, SubsampledGaussianEvent):
                raise ValueError(f"events must be SubsampledGaussianEvent, got {type(e).__name__}")
        return events

    def _extended(self, events: Sequence[SubsampledGaussianEvent], count: int) -> Ledger:
        count = check_int("count", count, 1)
        new = [(e, count) for e in events]
        return merge_ledger([*self._ledger, *new])

    def _epsilon_of(self, ledger: Ledger, delta: float) -> float:
        key = (ledger, check_delta(delta))
        if key not in self._cache:
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[key] = compose_epsilon(
                ledger,
                delta,
                accountant=self.accountant,
                pld_discretization=self.pld_discretization,
                prv_eps_error=self.prv_eps_error,
            )
        return self._cache[key]

    def step(
        self,
        events: SubsampledGaussianEvent | Sequence[SubsampledGaussianEvent],
        *,
        count: int = 1,
    ) -> None:
        """Record ``count`` repetitions of ``events`` (e.g. the events of one round).

        Raises ``ValueError`` if the events cannot be accounted by this accountant (e.g. fixed-size
        sampling with PLD), before anything is recorded.
        """
        ledger = self._extended(self._as_events(events), count)
        relation_of(ledger, self.accountant)
        self._ledger = ledger

    def epsilon(self, delta: float) -> float:
        """ε at ``delta`` of everything released so far."""
        return self._epsilon_of(self._ledger, delta)

    def epsilon_after(
        self,
        events: SubsampledGaussianEvent | Sequence[SubsampledGaussianEvent],
        delta: float,
        *,
        count: int = 1,
    ) -> float:
        """ε at ``delta`` if ``events`` were released ``count`` more times (nothing is recorded)."""
        return self._epsilon_of(self._extended(self._as_events(events), count), delta)

    def would_exceed(
        self,
        target_epsilon: float,
        delta: float,
        next_events: SubsampledGaussianEvent | Sequence[SubsampledGaussianEvent],
    ) -> bool:
        """Whether releasing ``next_events`` would push ε above ``target_epsilon``.

        Call it *before* a round with that round's events: a run stops when it returns true, so
        the final ε never exceeds the target.
        """
        # thirty-first review of issue 15: "5", b"5" and True were taken (as 5, 5 and 1), and
        # 10**400 raised OverflowError; a real number > 0 (inf: no budget), as calibrate takes
        real = isinstance(target_epsilon, numbers.Real) and not isinstance(target_epsilon, bool)
        target = as_float(target_epsilon) if real else math.nan
        if not target > 0:
            raise ValueError(f"target_epsilon must be a number > 0, got {shown(target_epsilon)}")
        return self.epsilon_after(next_events, delta) > target

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state (JSON-serialisable) for checkpoints."""
        return {
            "version": STATE_VERSION,
            "accountant": self.accountant,
            "pld_discretization": self.pld_discretization,
            "prv_eps_error": self.prv_eps_error,
            "ledger": [{"event": e.to_dict(), "count": c} for e, c in self._ledger],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state written by :meth:`state_dict`, validating every field.

        Raises
        ------
        ValueError
            Naming the field, for anything :meth:`state_dict` would not have written: a missing
            or unknown key, a wrong type (``"3"``, ``2.7`` or ``True`` for a count), a count
            below 1, an invalid event, settings out of range, or events this accountant cannot
            account. Nothing is changed then.
        """
        accountant, h, eps_error, ledger = parse_state(state)
        self.accountant = accountant
        self.pld_discretization = h
        self.prv_eps_error = eps_error
        self._ledger = ledger
        self._cache.clear()

    def set_ledger(self, ledger: Iterable[tuple[SubsampledGaussianEvent, int]]) -> None:
        """Replace what was released by ``ledger`` (``(event, count)`` pairs, merged).

        A run sets its accountant from its privacy ledger file, the record of what it released.
        Raises ``ValueError`` (nothing changed) on a count that is not an integer ``>= 1``, an
        item that is not an event, or events this accountant cannot account.
        """
        items = []
        for i, item in enumerate(ledger):
            event, count = item
            if not isinstance(event, SubsampledGaussianEvent):
                raise ValueError(f"ledger[{i}] must hold a SubsampledGaussianEvent")
            items.append((event, check_int(f"ledger[{i}] count", count, 1)))
        merged = merge_ledger(items)
        if merged:
            relation_of(merged, self.accountant)
        self._ledger = merged

    def __repr__(self) -> str:
        return f"PrivacyAccountant(accountant={shown(self.accountant)}, events={self.num_events})"
