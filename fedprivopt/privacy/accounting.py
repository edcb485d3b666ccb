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
:mod:`fedprivopt.privacy.accounting_state`; the RDP curve of one event (:func:`event_rdp`,
:func:`bounded_event_rdp`) is :mod:`fedprivopt.privacy.rdp_curves`.

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

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dp_accounting as dpa
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

# event_rdp, bounded_event_rdp and fixed_rdp_bound stay importable from here (its __all__)
from fedprivopt.privacy.rdp_curves import (
    RDP_ORDERS,
    bounded_event_rdp,
    event_rdp,
    fixed_rdp_bound,
)

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


def fixed_epsilon_bound(event: SubsampledGaussianEvent, count: int, delta: float) -> float:
    """ε at ``delta`` of ``count`` fixed-size ``event`` by :func:`fixed_rdp_bound` alone.

    Never below :func:`compose_epsilon`'s (its other orders are left out), and cheap: what the
    calibration's search probes before it checks its σ with :func:`compose_epsilon`.
    """
    curve = check_int("count", count, 1) * fixed_rdp_bound(event)
    eps = rdp.rdp_privacy_accountant.compute_epsilon(RDP_ORDERS, curve, check_delta(delta))[0]
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
        return _spent(rdp.rdp_privacy_accountant.compute_epsilon(RDP_ORDERS, total, delta)[0])
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
        if isinstance(ledger, (str, bytes, Mapping)) or not isinstance(ledger, Iterable):
            # forty-seventh review of issue 15 (mechanisms 3): a dict {event: count}, None or a
            # string ended in TypeError ("cannot unpack", "not iterable") naming nothing
            raise ValueError(
                "ledger must be a sequence of (SubsampledGaussianEvent, count) pairs, got "
                f"{type(ledger).__name__}"
            )
        for i, item in enumerate(ledger):
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise ValueError(
                    f"ledger[{i}] must be a (SubsampledGaussianEvent, count) pair, got "
                    f"{type(item).__name__}"
                )
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
