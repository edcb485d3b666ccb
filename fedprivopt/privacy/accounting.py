"""Privacy accountant facade over dp-accounting (RDP, PLD) and Opacus (PRV).

The accountant keeps a *ledger*: the sequence of :class:`SubsampledGaussianEvent` released so far,
with consecutive identical events merged into a count. ε is always computed from the whole ledger
by a well-kept library, never by formulas written here:

* ``"rdp"`` (default): ``dp_accounting.rdp.RdpAccountant``; supports Poisson sampling
  (add/remove-one) and fixed-size sampling without replacement (replace-one).
* ``"pld"``: dp-accounting's privacy loss distributions (what ``dp_accounting.pld.PLDAccountant``
  composes, step for step), tighter; Poisson sampling only. Its grid grows like ``1/σ²`` over the
  discretization interval, and with the number of compositions: before anything is allocated the
  grid is sized with dp-accounting's own bounds and a ledger that would need more than
  :data:`PLD_MAX_BYTES` is refused with :class:`PLDGridTooLargeError` (see
  :func:`pld_grid_points`).
* ``"prv"``: ``opacus.accountants.PRVAccountant`` (Gopi et al. 2021); Poisson sampling only; its
  reported ε is the upper end of its error bound. Its discretization domain grows like
  ``L·√T / eps_error``: before anything is allocated it is sized as Opacus sizes it and a ledger
  that would need more than :data:`PRV_MAX_BYTES` is refused with :class:`PRVDomainTooLargeError`
  (see :func:`prv_domain_points`); Opacus' numerical failures become ``ValueError``. That guard
  is :mod:`fedprivopt.privacy.prv_guard`; the ledger type, the checks of the settings and the
  validation of a saved state are :mod:`fedprivopt.privacy.accounting_state`.

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
from collections.abc import Iterable, Sequence
from typing import Any

import dp_accounting as dpa
import numpy as np
from dp_accounting import pld, rdp
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_dist
from dp_accounting.pld import privacy_loss_mechanism as pld_mech
from scipy import special

from fedprivopt.privacy.accounting_state import (
    ACCOUNTANTS,
    STATE_VERSION,
    Ledger,
    check_accountant,
    check_delta,
    check_pld_discretization,
    gib,
    is_count,
    merge_ledger,
    parse_state,
    relation_of,
)
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.prv_guard import (
    PRV_MAX_BYTES,
    PRVDomainTooLargeError,
    check_prv_ledger,
    prv_domain_points,
    prv_epsilon,
)

__all__ = [
    "ACCOUNTANTS",
    "PLD_MAX_BYTES",
    "PRV_MAX_BYTES",
    "PLDGridTooLargeError",
    "PRVDomainTooLargeError",
    "PrivacyAccountant",
    "check_ledger",
    "check_pld_ledger",
    "compose_epsilon",
    "pld_grid_points",
    "prv_domain_points",
]

_RDP_ORDERS = np.asarray(rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=np.float64)


@functools.lru_cache(maxsize=256)
def _rdp_curve(event: SubsampledGaussianEvent) -> np.ndarray:
    """RDP (at ``_RDP_ORDERS``) of one occurrence of ``event``, from dp-accounting."""
    acc = rdp.RdpAccountant(
        orders=list(_RDP_ORDERS), neighboring_relation=event.neighboring_relation
    )
    acc.compose(event.to_dp_event())
    curve = acc.rdp
    curve.setflags(write=False)
    return curve


# -- PLD memory guard -----------------------------------------------------------------------------
#
# How dp-accounting's PLD grows (dp_accounting/pld, version 0.6): a Poisson-subsampled Gaussian is
# discretized by connect-the-dots on the integer multiples of the interval h between the privacy
# losses at the tail truncation points (``GaussianPrivacyLoss.connect_dots_bounds``: the noise
# tails of mass e^-50 are cut). That range is about (1 + 2·9.9σ)/σ² wide for q = 1 and
# log(1 - q + q·e^((1 + 9.9σ)/σ²)) for small q, so a single distribution holds ~1/(σ²h) points
# for q = 1 (1.2e8 at σ = 0.01, h = 1e-4), and it is built through a Python dict (~200 bytes a
# point at peak). ``self_compose(T)`` then takes FFTs of the length that the Chernoff bound of
# ``common.compute_self_convolve_bounds`` gives for tail mass 1e-15 (about T·mean + c·√T·std of
# the loss, over h): complex128 arrays and copies, ~70-105 bytes a point measured.
PLD_MAX_BYTES = 512 * 2**20
"""Largest estimated peak memory (bytes) of one PLD computation; larger ledgers are refused."""
_PLD_BUILD_BYTES = 200  # per point of one distribution while dp-accounting builds it
_PLD_FFT_BYTES = 128  # per point of the FFT length of a composition
_PLD_TAIL_MASS = 1e-15  # dp-accounting's default tail_mass_truncation of (self_)compose


class PLDGridTooLargeError(ValueError):
    """The PLD of a ledger would need more memory than :data:`PLD_MAX_BYTES`."""


def _refuse(event: SubsampledGaussianEvent, what: str, points: float, nbytes: float, h: float):
    raise PLDGridTooLargeError(
        f"accountant 'pld' refused noise_multiplier={event.noise_multiplier:g} with "
        f"sample_rate={event.sample_rate:g}: {what} would hold ~{points:.3g} grid points at "
        f"pld_discretization={h:g} (about {gib(nbytes)}, limit {gib(PLD_MAX_BYTES)}); "
        "use accountant 'rdp' or a coarser pld_discretization (CLI: --pld-discretization)"
    )


def _adjacencies(event: SubsampledGaussianEvent) -> list[pld_mech.AdjacencyType]:
    # dp-accounting builds one (REMOVE) distribution for q = 1 and two (REMOVE, ADD) otherwise
    remove = pld_mech.AdjacencyType.REMOVE
    return [remove] if event.sample_rate == 1.0 else [remove, pld_mech.AdjacencyType.ADD]


def pld_grid_points(event: SubsampledGaussianEvent, discretization: float = 1e-4) -> float:
    """Grid points of one occurrence of ``event``'s PLD, before anything is allocated.

    The count dp-accounting's connect-the-dots discretization uses: the integer multiples of the
    interval between the privacy losses at the tail truncation points (from
    ``GaussianPrivacyLoss.connect_dots_bounds``), rounded as dp-accounting rounds them; the
    larger of the remove and add distributions.

    Parameters
    ----------
    event : SubsampledGaussianEvent
        A Poisson-sampled event with ``noise_multiplier > 0``.
    discretization : float
        ``value_discretization_interval`` of the PLD.

    Returns
    -------
    float
        The number of points (``inf`` if the loss range is not finite).
    """
    points = 0.0
    for adjacency in _adjacencies(event):
        try:
            bounds = pld_mech.GaussianPrivacyLoss(
                event.accountant_noise_multiplier,
                sampling_prob=event.sample_rate,
                adjacency_type=adjacency,
            ).connect_dots_bounds()
            upper = math.ceil(bounds.epsilon_upper / discretization)
            lower = math.floor(bounds.epsilon_lower / discretization)
        except (ArithmeticError, ValueError):  # σ so small that the loss range overflows
            return math.inf
        points = max(points, float(upper - lower + 1))
    return points


@functools.lru_cache(maxsize=4)
def _single_pld(event: SubsampledGaussianEvent, h: float) -> pld_dist.PrivacyLossDistribution:
    """dp-accounting's PLD of one occurrence of ``event`` (as ``PLDAccountant`` builds it).

    Cached: a run asks for ε after every round with the same event, and building is most of
    the cost of a PLD query. A cached PLD holds its PMFs as float arrays (8 bytes a point,
    at most ~45 MB each under :data:`PLD_MAX_BYTES`), never the dict used while building.
    """
    points = pld_grid_points(event, h)
    if points * _PLD_BUILD_BYTES > PLD_MAX_BYTES:
        _refuse(
            event, "one round's privacy loss distribution", points, points * _PLD_BUILD_BYTES, h
        )
    return pld_dist.from_gaussian_mechanism(
        standard_deviation=event.accountant_noise_multiplier,
        value_discretization_interval=h,
        sampling_prob=event.sample_rate,
        neighboring_relation=event.neighboring_relation,
    )


def _pmfs(distribution: pld_dist.PrivacyLossDistribution) -> list:
    # dp-accounting has no public accessor for the two PMFs of a PLD
    pmfs = [distribution._pmf_remove]
    if not distribution._symmetric:
        pmfs.append(distribution._pmf_add)
    return pmfs


@functools.lru_cache(maxsize=8)
def _log_mgfs(event: SubsampledGaussianEvent, h: float) -> tuple:
    """Per PMF of ``event``'s PLD: its length and the log-MGFs at the Chernoff orders.

    The same orders and values as ``common.compute_self_convolve_bounds`` (which recomputes
    them on every call); they do not depend on the number of compositions, so they are cached.
    """
    table = []
    for pmf in _pmfs(_single_pld(event, h)):
        probs = pmf.to_dense_pmf()._probs
        n = len(probs)
        orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / n
        values = [float(special.logsumexp(np.arange(n) * o, b=probs)) for o in orders]
        table.append((n, tuple(orders.tolist()), tuple(values)))
    return tuple(table)


def _self_compose_points(event: SubsampledGaussianEvent, h: float, count: int) -> int:
    """FFT length of ``self_compose(count)`` of ``event``'s PLD (``common.self_convolve``).

    ``compute_self_convolve_bounds``' Chernoff bounds at tail mass 1e-15, from cached log-MGFs;
    the larger of the remove and add PMFs. Tested equal to dp-accounting's function.
    """
    length = 1
    for n, orders, values in _log_mgfs(event, h):
        lower, upper = 0, (n - 1) * count
        for order, value in zip(orders, values, strict=True):
            bound = (count * value + math.log(2 / _PLD_TAIL_MASS)) / order
            if not math.isfinite(bound):
                continue
            if order > 0:
                upper = min(upper, math.ceil(bound))
            else:
                lower = max(lower, math.floor(bound))
        length = max(length, upper - lower + 1, n)
    return length


def _dense_for(distribution: pld_dist.PrivacyLossDistribution, count: int):
    """``distribution`` with dense PMFs when its sparse ``self_compose(count)`` would misbehave.

    dp-accounting's sparse PMF (at most 1000 points) self-composes by first computing
    ``size**count`` (a ``count``-digit integer: 2**1e12 exhausts memory) and, for a one-point
    PMF, by ``count`` Python-level compositions (a hang at 1e12 rounds). Whenever that power
    exceeds 1000 it converts to dense anyway; this does the conversion first, so the result is
    the same and the bad cases never run.
    """
    pmfs = _pmfs(distribution)
    sparse = [pmf for pmf in pmfs if not isinstance(pmf, pld_pmf.DensePLDPmf)]
    if not sparse or count * math.log2(max(2, max(p.size for p in sparse))) <= math.log2(1000):
        return distribution
    dense = [pmf.to_dense_pmf() for pmf in pmfs]
    return pld_dist.PrivacyLossDistribution(dense[0], dense[1] if len(dense) > 1 else None)


def _pld_epsilon(ledger: Ledger, delta: float, h: float) -> float:
    """ε of a Poisson ledger with dp-accounting's PLD, refusing what would not fit in memory.

    Composes exactly as ``PLDAccountant`` does (identity, then for every ``(event, count)``
    ``from_gaussian_mechanism(...).self_compose(count)`` composed in), with a size check before
    each allocation.
    """
    total = pld_dist.identity(value_discretization_interval=h)
    size = 1
    for event, count in ledger:
        single = _single_pld(event, h)
        points = _self_compose_points(event, h, count)
        if points * _PLD_FFT_BYTES > PLD_MAX_BYTES:
            what = f"its composition over {count} events (rounds x events per round)"
            _refuse(event, what, points, points * _PLD_FFT_BYTES, h)
        composed = _dense_for(single, count).self_compose(count)
        size += max(pmf.size for pmf in _pmfs(composed))
        if size * _PLD_FFT_BYTES > PLD_MAX_BYTES:
            what = f"the composition with the {len(ledger)} distinct events of the ledger"
            _refuse(event, what, size, size * _PLD_FFT_BYTES, h)
        total = total.compose(composed)
        size = max(pmf.size for pmf in _pmfs(total))
    return float(total.get_epsilon_for_delta(delta))


def check_pld_ledger(
    ledger: Iterable[tuple[SubsampledGaussianEvent, int]], pld_discretization: float = 1e-4
) -> None:
    """Refuse, before any large allocation, a ledger whose PLD would exceed :data:`PLD_MAX_BYTES`.

    The size checks of an ε query with ``accountant="pld"`` without the composition: a run calls
    it with its planned ledger at start, so a noise level the PLD cannot account fails before
    training rather than at its first ε query. The one-round distribution it builds is cached
    and reused by the later queries.

    Raises
    ------
    PLDGridTooLargeError
        As :func:`compose_epsilon` would for this ledger.
    """
    h = check_pld_discretization(pld_discretization)
    for event, count in merge_ledger(ledger):
        _single_pld(event, h)  # refuses an oversized one-round distribution before building it
        points = _self_compose_points(event, h, count)
        if points * _PLD_FFT_BYTES > PLD_MAX_BYTES:
            what = f"its composition over {count} events (rounds x events per round)"
            _refuse(event, what, points, points * _PLD_FFT_BYTES, h)


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
    if accountant == "pld":
        check_pld_ledger(merged, pld_discretization)
    elif accountant == "prv":
        check_prv_ledger(merged, check_delta(delta), float(prv_eps_error))


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
        the estimated peak memory exceeds :data:`PLD_MAX_BYTES` (e.g. ``σ = 0.01``, ``q = 1``
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
        return prv_epsilon(ledger, delta, float(prv_eps_error))
    if accountant == "rdp":
        # The RDP of a composition is the count-weighted sum of each event's RDP curve, exactly
        # what RdpAccountant.compose accumulates; computing each distinct curve once (cached)
        # makes a per-round epsilon cost a dot product instead of a series evaluation.
        total = sum(count * _rdp_curve(event) for event, count in ledger)
        return float(rdp.rdp_privacy_accountant.compute_epsilon(_RDP_ORDERS, total, delta)[0])
    return _pld_epsilon(ledger, delta, check_pld_discretization(pld_discretization))


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
        if not (0 < pld_discretization < 1):
            raise ValueError(f"pld_discretization must be in (0, 1), got {pld_discretization}")
        if not (0 < prv_eps_error < 1):
            raise ValueError(f"prv_eps_error must be in (0, 1), got {prv_eps_error}")
        self.pld_discretization = float(pld_discretization)
        self.prv_eps_error = float(prv_eps_error)
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
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be an integer >= 1, got {count!r}")
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
        target_epsilon = float(target_epsilon)
        if not (target_epsilon > 0):
            raise ValueError(f"target_epsilon must be > 0, got {target_epsilon}")
        return self.epsilon_after(next_events, delta) > target_epsilon

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
            if not is_count(count):
                raise ValueError(f"ledger[{i}] count must be an integer >= 1, got {count!r}")
            items.append((event, count))
        merged = merge_ledger(items)
        if merged:
            relation_of(merged, self.accountant)
        self._ledger = merged

    def __repr__(self) -> str:
        return f"PrivacyAccountant(accountant={self.accountant!r}, events={self.num_events})"
