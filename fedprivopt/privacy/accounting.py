"""Privacy accountant facade over dp-accounting (RDP, PLD) and Opacus (PRV).

The accountant keeps a *ledger*: the sequence of :class:`SubsampledGaussianEvent` released so far,
with consecutive identical events merged into a count. ε is always computed from the whole ledger
by a well-kept library, never by formulas written here:

* ``"rdp"`` (default): ``dp_accounting.rdp.RdpAccountant``; supports Poisson sampling
  (add/remove-one) and fixed-size sampling without replacement (replace-one).
* ``"pld"``: ``dp_accounting.pld.PLDAccountant``, tighter; Poisson sampling only.
* ``"prv"``: ``opacus.accountants.PRVAccountant`` (Gopi et al. 2021); Poisson sampling only; its
  reported ε is the upper end of its error bound.

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

from fedprivopt.privacy.events import SubsampledGaussianEvent

__all__ = ["ACCOUNTANTS", "PrivacyAccountant", "compose_epsilon"]

ACCOUNTANTS = ("rdp", "pld", "prv")
_STATE_VERSION = 1

Ledger = tuple[tuple[SubsampledGaussianEvent, int], ...]


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return delta


def _check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {', '.join(ACCOUNTANTS)}, got {accountant!r}")
    return accountant


def _merge(ledger: Iterable[tuple[SubsampledGaussianEvent, int]]) -> Ledger:
    """Merge consecutive identical events (composition is order-independent anyway)."""
    out: list[tuple[SubsampledGaussianEvent, int]] = []
    for event, count in ledger:
        if count < 1:
            continue
        if out and out[-1][0] == event:
            out[-1] = (event, out[-1][1] + count)
        else:
            out.append((event, count))
    return tuple(out)


def _relation_of(ledger: Ledger, accountant: str) -> dpa.NeighboringRelation:
    """Return the one neighbouring relation of a ledger; raise if ``accountant`` can't use it."""
    relations = {event.neighboring_relation for event, _ in ledger}
    if len(relations) > 1:
        raise ValueError("cannot compose Poisson and fixed-size events in one ledger")
    relation = relations.pop()
    if accountant != "rdp" and relation is not dpa.NeighboringRelation.ADD_OR_REMOVE_ONE:
        raise ValueError(
            f"accountant {accountant!r} supports only Poisson sampling; fixed-size sampling "
            "(without replacement, replace-one adjacency) needs accountant 'rdp'"
        )
    return relation


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


def _dpa_accountant(accountant: str, relation: dpa.NeighboringRelation, pld_interval: float):
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
    """
    delta = _check_delta(delta)
    _check_accountant(accountant)
    ledger = _merge(ledger)
    if not ledger:
        return 0.0
    if any(event.noise_multiplier == 0 for event, _ in ledger):
        return math.inf
    relation = _relation_of(ledger, accountant)
    if accountant == "prv":
        from opacus.accountants import PRVAccountant

        acc = PRVAccountant()
        acc.history = [(e.noise_multiplier, e.sample_rate, int(c)) for e, c in ledger]
        return float(acc.get_epsilon(delta, eps_error=prv_eps_error))
    if accountant == "rdp":
        # The RDP of a composition is the count-weighted sum of each event's RDP curve, exactly
        # what RdpAccountant.compose accumulates; computing each distinct curve once (cached)
        # makes a per-round epsilon cost a dot product instead of a series evaluation.
        total = sum(count * _rdp_curve(event) for event, count in ledger)
        return float(rdp.rdp_privacy_accountant.compute_epsilon(_RDP_ORDERS, total, delta)[0])
    acc = _dpa_accountant(accountant, relation, pld_discretization)
    composed = dpa.ComposedDpEvent(
        [dpa.SelfComposedDpEvent(event.to_dp_event(), int(count)) for event, count in ledger]
    )
    acc.compose(composed)
    return float(acc.get_epsilon(delta))


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
        self.accountant = _check_accountant(accountant)
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
        return _merge([*self._ledger, *new])

    def _epsilon_of(self, ledger: Ledger, delta: float) -> float:
        key = (ledger, _check_delta(delta))
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
        _relation_of(ledger, self.accountant)
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
            "version": _STATE_VERSION,
            "accountant": self.accountant,
            "pld_discretization": self.pld_discretization,
            "prv_eps_error": self.prv_eps_error,
            "ledger": [{"event": e.to_dict(), "count": c} for e, c in self._ledger],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state written by :meth:`state_dict`."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"accountant state must be a dict with version {_STATE_VERSION}")
        accountant = _check_accountant(state["accountant"])
        ledger = _merge(
            (SubsampledGaussianEvent.from_dict(item["event"]), int(item["count"]))
            for item in state["ledger"]
        )
        self.accountant = accountant
        self.pld_discretization = float(state["pld_discretization"])
        self.prv_eps_error = float(state["prv_eps_error"])
        self._ledger = ledger
        self._cache.clear()

    def __repr__(self) -> str:
        return f"PrivacyAccountant(accountant={self.accountant!r}, events={self.num_events})"
