"""Private hyperparameter tuning: a random number of trials, the best one released.

Papernot and Steinke (2022) run a training procedure ``K`` times, ``K`` drawn from a known
distribution, each run with hyperparameters drawn independently, and release only the best run
(by a score the run outputs). If one run is ``(λ, ε(λ))``-RDP, the whole procedure is RDP with a
bound that grows with ``log E[K]`` instead of ``K``. dp-accounting computes that bound:
``RepeatAndSelectDpEvent(event, mean, shape)`` interpreted by its RDP accountant (its PLD
accountant does not support it).

:class:`TrialCount` is the distribution of ``K`` (its sampler and pmf):

* ``"truncated-negative-binomial"`` with shape ``η >= 0`` (``η = 0``: logarithmic, ``η = 1``:
  geometric): ``P[K = k] = Γ(k + η) / (Γ(η + 1) k!) · (1 − γ)^k / Z`` for ``k >= 1``, with
  ``Z = (γ^(−η) − 1) / η`` (``−log γ`` at ``η = 0``) and ``γ`` set by the mean
  ``E[K] = η (1 − γ) / (γ (1 − γ^η))`` (``(1 − γ) / (γ log(1/γ))`` at ``η = 0``);
  dp-accounting's ``shape = η``;
* ``"poisson"``: ``K ~ Poisson(mean)`` (``K = 0`` is possible: nothing is released);
  dp-accounting's ``shape = ∞``.

:func:`tuning_epsilon` is ε of the whole procedure around one run's ledger, always from
dp-accounting's RDP accountant.

References
----------
N. Papernot, T. Steinke, "Hyperparameter Tuning with Renyi Differential Privacy", ICLR 2022
(arXiv:2110.03620), Definition 1, Theorems 2 and 6.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
from collections.abc import Iterable
from dataclasses import dataclass

import dp_accounting as dpa
import numpy as np
from dp_accounting import dp_event, rdp

from fedprivopt.core.checks import as_float
from fedprivopt.core.text import shown
from fedprivopt.privacy.accounting_state import (
    Ledger,
    check_delta,
    check_ledger_count,
    merge_ledger,
)
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.rdp_curves import event_rdp

__all__ = [
    "MAX_LOG_Z",
    "MAX_MEAN_TRIALS",
    "MECHANISM_OF_RELATION",
    "TRIAL_DISTRIBUTIONS",
    "TrialCount",
    "composed_tuning_epsilon",
    "finite_orders",
    "ledger_rdp",
    "mechanisms_of",
    "rdp_dominates",
    "run_dp_event",
    "tuning_dp_event",
    "tuning_epsilon",
]

TRIAL_DISTRIBUTIONS = ("truncated-negative-binomial", "poisson")
MAX_MEAN_TRIALS = 10_000.0
"""Largest mean number of trials: each trial is a full run."""
MAX_SHAPE = 1e6
"""Largest truncated-negative-binomial shape ``η`` (beyond it, use the Poisson limit)."""
MAX_LOG_Z = 700.0
"""Largest ``η log(1/γ)``: beyond it ``P[K = 1] = (1 − γ) η / (γ^(−η) − 1)`` underflows in
double precision (and ``γ^(−η)`` overflows past 709.8), so the sampler cannot draw ``K``."""


def _log_z_exponent(shape: float, mean: float) -> float:
    """``η log(1/γ)`` of the truncated negative binomial with this shape and mean."""
    gamma = _tnb_gamma(shape, mean)
    return 0.0 if gamma >= 1.0 else -shape * math.log(gamma)


def _largest_shape(mean: float) -> float:
    """The largest ``η`` (within 0.1 %) whose ``η log(1/γ)`` at ``mean`` is within the limit."""
    lo, hi = 0.0, MAX_SHAPE
    if _log_z_exponent(hi, mean) <= MAX_LOG_Z:
        return hi
    while hi - lo > 1e-3 * max(lo, 1e-3):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _log_z_exponent(mid, mean) <= MAX_LOG_Z else (lo, mid)
    return lo


def _tnb_mean(gamma: float, shape: float) -> float:
    """``E[K]`` of the truncated negative binomial with halting probability ``gamma``."""
    if gamma >= 1.0:
        return 1.0
    log_gamma = math.log(gamma)
    if abs(shape * log_gamma) < 1e-300:
        # η = 0, or an η so small that 1 − γ^η underflows (η = 5e-324 divided by zero: a short
        # API review of issue 15); its limit (1 − γ^η)/η → −log γ is then exact to ~1e-300
        return (1.0 - gamma) / (gamma * -log_gamma)
    # η (1 − γ) / (γ (1 − γ^η)) with 1 − γ^η = −expm1(η log γ)
    return shape * (1.0 - gamma) / (gamma * -math.expm1(shape * log_gamma))


def _tnb_gamma(shape: float, mean: float) -> float:
    """The ``γ`` whose mean is at most ``mean``, within a relative 1e-12 of it.

    The mean falls as ``γ`` grows; bisection keeps ``mean(hi) <= mean`` and returns ``hi``.
    Drawing with it is conservative for dp-accounting's bound, which uses ``log(mean)`` and
    ``log(1/γ)`` with its own (lower end) ``γ``: both terms are at least the sampler's.
    """
    if mean == 1.0:
        return 1.0
    lo, hi = 0.0, min(1.0, 2.0 * (shape + 1.0) / mean)
    while _tnb_mean(hi, shape) > mean:  # pragma: no cover - the bound above holds
        hi = min(1.0, hi * 2.0)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if _tnb_mean(mid, shape) > mean:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi


@dataclass(frozen=True)
class TrialCount:
    """The distribution of the number of trials ``K``.

    Parameters
    ----------
    distribution : {"truncated-negative-binomial", "poisson"}
    mean : float
        ``E[K]``, in ``[1, MAX_MEAN_TRIALS]``.
    shape : float, optional
        ``η >= 0`` of the truncated negative binomial (required for it, absent for Poisson).

    Examples
    --------
    >>> TrialCount("poisson", 10.0).dp_shape
    inf
    >>> TrialCount("truncated-negative-binomial", 1.0, shape=1.0).pmf(np.array([1, 2])).tolist()
    [1.0, 0.0]
    """

    distribution: str
    mean: float
    shape: float | None = None

    def __post_init__(self) -> None:
        if self.distribution not in TRIAL_DISTRIBUTIONS:
            raise ValueError(
                f"distribution must be one of {', '.join(TRIAL_DISTRIBUTIONS)}, "
                f"got {shown(self.distribution)}"
            )
        mean = self.mean
        # sixteenth review of issue 15: a numpy.float32 mean (a valid number) was refused;
        # every real scalar is taken (numpy's too), bools and strings are not
        if isinstance(mean, (bool, np.bool_)) or not isinstance(mean, numbers.Real):
            raise ValueError(
                f"mean must be a number in [1, {MAX_MEAN_TRIALS:g}], got {shown(mean)}"
            )
        if not (1.0 <= as_float(mean) <= MAX_MEAN_TRIALS):
            raise ValueError(f"mean must be in [1, {MAX_MEAN_TRIALS:g}], got {shown(mean)}")
        object.__setattr__(self, "mean", float(mean))
        if self.distribution == "poisson":
            if self.shape is not None:
                raise ValueError("shape applies only to the truncated-negative-binomial")
            return
        shape = 1.0 if self.shape is None else self.shape
        if isinstance(shape, (bool, np.bool_)) or not isinstance(shape, numbers.Real):
            raise ValueError(f"shape must be a number in [0, {MAX_SHAPE:g}], got {shown(shape)}")
        if not (0.0 <= as_float(shape) <= MAX_SHAPE):
            raise ValueError(f"shape must be in [0, {MAX_SHAPE:g}], got {shown(shape)}")
        object.__setattr__(self, "shape", float(shape))
        exponent = _log_z_exponent(float(shape), float(mean))
        if exponent > MAX_LOG_Z:
            raise ValueError(
                f"shape {shape:g} with mean {mean:g} is out of range: eta*log(1/gamma) = "
                f"{exponent:.4g} > {MAX_LOG_Z:g}, where the probability of each number of trials "
                f"underflows; at mean {mean:g} the shape must be in [0, "
                f"{_largest_shape(float(mean)):.4g}] (or use the Poisson distribution)"
            )

    @property
    def dp_shape(self) -> float:
        """dp-accounting's ``shape``: ``η``, or ``inf`` for Poisson."""
        return math.inf if self.distribution == "poisson" else float(self.shape)

    @property
    def gamma(self) -> float | None:
        """The truncated negative binomial's ``γ`` for :attr:`mean` (``None`` for Poisson)."""
        if self.distribution == "poisson":
            return None
        return _tnb_gamma(float(self.shape), self.mean)

    def describe(self) -> str:
        """One phrase, e.g. ``truncated negative binomial (eta 1, gamma 0.1), mean 10``."""
        if self.distribution == "poisson":
            return f"Poisson, mean {self.mean:g}"
        return (
            f"truncated negative binomial (eta {self.shape:g}, gamma {self.gamma:.6g}), "
            f"mean {self.mean:g}"
        )

    def to_dict(self) -> dict:
        """Plain data: distribution, mean, shape (``η``; ``None`` for Poisson), gamma."""
        return {
            "distribution": self.distribution,
            "mean": self.mean,
            "shape": self.shape,
            "gamma": self.gamma,
            "dp_accounting_shape": "inf" if self.distribution == "poisson" else self.shape,
        }

    def pmf(self, k: np.ndarray) -> np.ndarray:
        """``P[K = k]`` for integer ``k`` (array), exactly the distribution :meth:`sample` draws."""
        k = np.asarray(k, dtype=np.float64)
        if self.distribution == "poisson":
            from scipy.special import gammaln

            with np.errstate(divide="ignore"):
                logp = k * math.log(self.mean) - self.mean - gammaln(k + 1.0)
            return np.where(k >= 0, np.exp(logp), 0.0)
        gamma, shape = self.gamma, float(self.shape)
        if gamma >= 1.0:
            return np.where(k == 1, 1.0, 0.0)
        from scipy.special import gammaln

        log_gamma = math.log(gamma)
        log_z = (
            math.log(-log_gamma) if shape == 0 else math.log(math.expm1(-shape * log_gamma) / shape)
        )
        kk = np.maximum(k, 1.0)
        logp = (
            gammaln(kk + shape) - gammaln(shape + 1.0) - gammaln(kk + 1.0)
            + kk * math.log1p(-gamma) - log_z
        )  # fmt: skip
        return np.where(k >= 1, np.exp(logp), 0.0)

    def sample(self, rng: np.random.Generator) -> int:
        """One draw of ``K`` from ``rng`` (an explicit, seeded ``numpy.random.Generator``).

        Poisson: ``rng.poisson``. Truncated negative binomial: inversion of the CDF with one
        uniform, walking ``p_{k+1} = p_k (1 − γ)(k + η)/(k + 1)`` from ``p_1 = (1 − γ)/Z``.
        """
        if not isinstance(rng, np.random.Generator):
            raise ValueError("rng must be a numpy.random.Generator")
        if self.distribution == "poisson":
            return int(rng.poisson(self.mean))
        gamma, shape = self.gamma, float(self.shape)
        if gamma >= 1.0:
            return 1
        log_gamma = math.log(gamma)
        z = -log_gamma if shape == 0 else math.expm1(-shape * log_gamma) / shape
        u = rng.random()
        k, p = 1, (1.0 - gamma) / z
        cumulative = p
        while cumulative < u and p > 0.0:
            p *= (1.0 - gamma) * (k + shape) / (k + 1)
            k += 1
            cumulative += p
        return k


def run_dp_event(ledger: Iterable[tuple[SubsampledGaussianEvent, int]]) -> dpa.DpEvent:
    """One run's ledger as one dp-accounting event (a composition of self-compositions)."""
    merged = merge_ledger(ledger)
    return dpa.ComposedDpEvent(
        [dpa.SelfComposedDpEvent(event.to_dp_event(), count) for event, count in merged]
    )


MECHANISM_OF_RELATION = {
    dpa.NeighboringRelation.ADD_OR_REMOVE_ONE: "Poisson sampling",
    dpa.NeighboringRelation.REPLACE_ONE: "fixed-size sampling",
    dpa.NeighboringRelation.REPLACE_SPECIAL: "tree aggregation",
}
"""The mechanism each neighbouring relation comes from, as refusals name it."""


def mechanisms_of(relations: Iterable[dpa.NeighboringRelation]) -> str:
    """The mechanisms of ``relations`` in words, sorted: e.g. "Poisson sampling and tree ..."."""
    names = sorted({MECHANISM_OF_RELATION.get(r, str(r)) for r in relations})
    return ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]


def _relation(ledger: Ledger) -> dpa.NeighboringRelation:
    relations = {event.neighboring_relation for event, _ in ledger}
    if len(relations) > 1:
        raise ValueError(
            f"a run's ledger mixes neighbouring relations ({mechanisms_of(relations)})"
        )
    return relations.pop() if relations else dpa.NeighboringRelation.ADD_OR_REMOVE_ONE


def tuning_dp_event(
    ledger: Iterable[tuple[SubsampledGaussianEvent, int]], trials: TrialCount
) -> dp_event.RepeatAndSelectDpEvent:
    """``RepeatAndSelectDpEvent`` of one run's ledger under the trial count ``trials``."""
    if not isinstance(trials, TrialCount):  # an AttributeError before (a short API review)
        raise ValueError(f"trials must be a TrialCount, got {type(trials).__name__}")
    return dp_event.RepeatAndSelectDpEvent(run_dp_event(ledger), trials.mean, trials.dp_shape)


def tuning_epsilon(
    ledger: Iterable[tuple[SubsampledGaussianEvent, int]],
    delta: float,
    trials: TrialCount,
    orders: tuple[float, ...] | None = None,
) -> float:
    """ε at ``delta`` of releasing the best of ``K ~ trials`` runs, each within ``ledger``.

    dp-accounting's ``RdpAccountant`` (its default orders, or ``orders``: see
    :func:`finite_orders`; the ledger's neighbouring relation) composes
    :func:`tuning_dp_event`. ``inf`` when an event has no noise (a non-private run); a NaN from
    the library is reported as ``inf`` (never less spent).
    """
    delta = check_delta(delta)
    merged = merge_ledger(ledger)
    tuning_dp_event(merged, trials)  # checks trials before any early return
    if any(event.noise_multiplier == 0 for event, _ in merged):
        return math.inf
    orders = _precise_orders(merged, orders)
    if not orders and orders is not None:
        return math.inf
    accountant = _accountant(merged, orders)
    accountant.compose(tuning_dp_event(merged, trials))
    eps = float(accountant.get_epsilon(delta))
    return math.inf if math.isnan(eps) else eps


def composed_tuning_epsilon(
    ledger: Iterable[tuple[SubsampledGaussianEvent, int]],
    delta: float,
    trials: TrialCount,
    count: int,
) -> float:
    """ε at ``delta`` of ``count`` tunings on the same users, each :func:`tuning_epsilon`'s.

    Publishing a row of a tuned comparison (one tuning per seed) releases them all: their
    ``RepeatAndSelectDpEvent`` self-composed ``count`` times, at the orders where the run's RDP
    is finite (:func:`finite_orders` of ``ledger`` alone), by dp-accounting's RDP accountant.
    """
    delta = check_delta(delta)
    # forty-third review of issue 15 (reports, finding 2): an int subclass whose __int__ said 1
    # (a count of 5 tunings) was composed once by int(count): 9.03 where five cost 22.48; its
    # stored value is taken as a plain int (operator.index) before it is checked and composed
    plain = isinstance(count, (int, np.integer)) and not isinstance(count, (bool, np.bool_))
    if not plain or operator.index(count) < 1:
        # fifteenth review of issue 15: 2.5 tunings were charged as 2 (int()), "3" and True
        # were accepted, NaN failed naming no parameter
        raise ValueError(f"count must be an integer >= 1 (tunings composed), got {shown(count)}")
    count = operator.index(count)
    check_ledger_count(
        count,
        "count must be an integer in [1, 10**300] (tunings composed; float64 holds no more)",
    )
    merged = merge_ledger(ledger)
    if any(event.noise_multiplier == 0 for event, _ in merged) or not merged:
        return math.inf if merged else 0.0
    orders = _precise_orders(merged, None)
    if not orders and orders is not None:
        return math.inf
    accountant = _accountant(merged, orders)
    accountant.compose(dpa.SelfComposedDpEvent(tuning_dp_event(merged, trials), count))
    eps = float(accountant.get_epsilon(delta))
    return math.inf if math.isnan(eps) else eps


def _precise_orders(merged: Ledger, orders: tuple[float, ...] | None) -> tuple[float, ...] | None:
    """``orders`` (``None``: dp-accounting's) less those where the run's RDP is not finite.

    dp-accounting computes a ``RepeatAndSelectDpEvent``'s inner RDP itself, so an order where an
    event's RDP is NaN or within rounding of 0 (:func:`_rdp_curve`) must not reach it: its
    bound takes a minimum over orders, which a cancelled 0 would lower. ``orders`` itself when
    nothing is dropped; an empty tuple when nothing is left (ε is then ``inf``).
    """
    curve = _rdp_curve(merged, None if orders is None else tuple(orders))
    if np.isfinite(curve).all():
        return orders
    full = rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS if orders is None else orders
    return tuple(float(o) for o, c in zip(full, curve, strict=True) if np.isfinite(c))


def _accountant(merged: Ledger, orders: tuple[float, ...] | None) -> rdp.RdpAccountant:
    if orders is None:
        return rdp.RdpAccountant(neighboring_relation=_relation(merged))
    return rdp.RdpAccountant(list(orders), neighboring_relation=_relation(merged))


def ledger_rdp(
    ledger: Iterable[tuple[SubsampledGaussianEvent, int]],
    orders: tuple[float, ...] | None = None,
) -> np.ndarray:
    """RDP curve of a whole run (dp-accounting's default orders, or ``orders``).

    NaN orders count as ``inf``. Used to check that one run's privacy bounds every other's at
    every order (a valid input to the repeat-and-select bound for a mixture of hyperparameter
    settings). Curves are remembered by ledger and orders (:func:`_rdp_curve`): planning a
    ``compare --tune-grid`` asks for the same few curves once per cell.
    """
    return _rdp_curve(merge_ledger(ledger), None if orders is None else tuple(orders)).copy()


@functools.lru_cache(maxsize=256)
def _rdp_curve(merged: Ledger, orders: tuple[float, ...] | None) -> np.ndarray:
    """:func:`ledger_rdp` of a merged ledger, computed once per ledger and orders.

    The count-weighted sum of each event's :func:`~fedprivopt.privacy.rdp_curves.event_rdp`,
    which is what dp-accounting composes, with the same guard: an order at which an event's RDP
    is NaN or within rounding of 0 is ``inf`` for the run (a run of 10**21 rounds at σ = 1.6e7
    had a curve of 0 there, and its tuning an ε of 0; fourteenth review of issue 15). Remembered
    because dp-accounting's RDP of a subsampled Gaussian took about 0.07 s a ledger, 97% of the
    planning of a tuned comparison (tenth review of issue 15, finding 4).
    """
    size = len(rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS if orders is None else orders)
    if any(event.noise_multiplier == 0 for event, _ in merged):
        return np.full(size, np.inf)
    _relation(merged)  # one neighbouring relation per run, as the accountant requires
    total = np.zeros(size)
    for event, count in merged:
        total = total + count * event_rdp(event, orders)
    return total


def rdp_dominates(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the RDP curve ``a`` is at least ``b`` at every order where ``b`` is finite.

    An order where ``b`` is not finite is one where dp-accounting did not converge for ``b``
    (its true RDP is finite); for runs that differ in σ, the sampling rate or the number of
    rounds, RDP is monotone in each, so ``a``'s finite value still bounds ``b`` there whenever
    ``a`` bounds it at the orders where both are finite. An infinite ``a`` bounds everything.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ok = ~np.isfinite(b) | (a >= b) | np.isclose(a, b, rtol=1e-12, atol=0.0)
    return bool(np.all(ok))


def finite_orders(
    ledgers: Iterable[Iterable[tuple[SubsampledGaussianEvent, int]]],
    orders: tuple[float, ...] | None = None,
) -> tuple[float, ...] | None:
    """The RDP orders (of ``orders``, default dp-accounting's) where every ledger's RDP is finite.

    dp-accounting fails to converge at some orders for some events (an RDP of ``inf`` or NaN
    where the true value is finite). The tuning compares runs and bounds the tuning only at the
    orders every run has: RDP's ε is a minimum over orders, so dropping orders can only raise it
    (the bound stays valid). Orders infinite for every ledger are kept (they change no ε);
    ``orders`` (``None``: the accountant's default list) when no order is dropped; a
    non-private ledger (infinite everywhere) drops nothing.

    Raises
    ------
    ValueError
        When no order is left.
    """
    full = tuple(rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS) if orders is None else orders
    finite = [np.isfinite(ledger_rdp(ledger, orders)) for ledger in ledgers]
    finite = [f for f in finite if f.any()]  # a non-private run is infinite at every order
    if not finite:
        return orders
    every, some = np.logical_and.reduce(finite), np.logical_or.reduce(finite)
    # an order infinite for every run adds nothing to the bound (ε is a minimum over orders)
    # and is kept, so that the default list stays when nothing else is dropped
    keep = every | ~some
    if keep.all():
        return orders
    if not (keep & every).any():
        raise ValueError("no RDP order at which every run's privacy is finite")
    return tuple(float(x) for x, k in zip(full, keep, strict=True) if k)
