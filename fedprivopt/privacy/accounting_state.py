"""What the accountant facade and its PRV accountant share: ledgers and saved states.

A *ledger* is a tuple of ``(SubsampledGaussianEvent, count)`` pairs with consecutive identical
events merged (:func:`merge_ledger`); one ledger composes events of a single neighbouring relation
(:func:`relation_of`). This module holds the checks of the accountant's settings that every
accountant applies, and the validation of a saved accountant state (:func:`parse_state`, what
:meth:`~fedprivopt.privacy.accounting.PrivacyAccountant.load_state_dict` loads): every field that
:meth:`~fedprivopt.privacy.accounting.PrivacyAccountant.state_dict` would not have written is
refused with a ``ValueError`` naming it.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable

import dp_accounting as dpa

from fedprivopt.core.checks import as_float, check_int
from fedprivopt.core.text import shown
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.limits import MAX_STATE_NOISE_MULTIPLIER

__all__ = [
    "ACCOUNTANTS",
    "MAX_LEDGER_COUNT",
    "MAX_STATE_COUNT",
    "MAX_STATE_NOISE_MULTIPLIER",
    "STATE_VERSION",
    "Ledger",
    "check_accountant",
    "check_delta",
    "check_ledger_count",
    "check_pld_discretization",
    "check_prv_eps_error",
    "gib",
    "is_count",
    "merge_ledger",
    "parse_state",
    "relation_of",
]

ACCOUNTANTS = ("rdp", "pld", "prv")
STATE_VERSION = 1
#: Largest count of one ledger entry in a saved state. A run releases at most 10**6 rounds
#: (``strategies.config.MAX_ROUNDS``) of a few events each (ADADP: 2); 10**9 leaves a factor of
#: 1,000 and keeps every accountant's arithmetic in float64 (a count of 10**400 made ``epsilon``
#: raise ``OverflowError``).
MAX_STATE_COUNT = 10**9
#: Largest count of one ledger entry, and of equal events merged, that :func:`merge_ledger`
#: takes (an API ledger, not a saved state, whose bound is :data:`MAX_STATE_COUNT`). Every
#: accountant computes with the count as a float64; 10**400 made ``compose_epsilon`` raise
#: ``OverflowError`` (sixteenth review of issue 15). Below it a count stays finite in float64
#: (the RDP path composes 10**300 events of σ 1, q 0.1 to ε 1.5e298; PLD and PRV refuse such
#: counts by their memory guards), and it is far above ``epsilon``'s ``--rounds`` x
#: ``--events-per-round`` of any meaning.
MAX_LEDGER_COUNT = 10**300

Ledger = tuple[tuple[SubsampledGaussianEvent, int], ...]


def _real(name: str, value: object, shown_range: str) -> float:
    """``value`` as a float; ``ValueError`` naming ``name`` unless it is a real number.

    Sixteenth review of issue 15: ``compose_epsilon(ledger, "1e-5")`` and
    ``PrivacyAccountant(pld_discretization="0.5")`` were taken through ``float()``, and
    ``PrivacyAccountant(prv_eps_error="0.5")`` raised a ``TypeError``; bools and strings are
    refused, as for every other parameter of the accountants.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number in {shown_range}, got {shown(value)}")
    return as_float(value)


def check_delta(delta: float) -> float:
    """``delta`` as a float; ``ValueError`` unless it is a number in (0, 1)."""
    delta = _real("delta", delta, "(0, 1)")
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return delta


def check_prv_eps_error(eps_error: float) -> float:
    """``eps_error`` as a float; ``ValueError`` unless it is a number in (0, 1)."""
    eps_error = _real("prv_eps_error", eps_error, "(0, 1)")
    if not (0.0 < eps_error < 1.0):
        raise ValueError(f"prv_eps_error must be in (0, 1), got {eps_error}")
    return eps_error


def check_accountant(accountant: str) -> str:
    """``accountant``; ``ValueError`` unless it is one of :data:`ACCOUNTANTS`."""
    if accountant not in ACCOUNTANTS:
        raise ValueError(
            f"accountant must be one of {', '.join(ACCOUNTANTS)}, got {shown(accountant)}"
        )
    return accountant


def check_pld_discretization(interval: float) -> float:
    """``interval`` as a float; ``ValueError`` unless it is a number in (0, 1)."""
    interval = _real("pld_discretization", interval, "(0, 1)")
    if not (0 < interval < 1):
        raise ValueError(f"pld_discretization must be in (0, 1), got {interval}")
    return interval


def merge_ledger(ledger: Iterable[tuple[SubsampledGaussianEvent, int]]) -> Ledger:
    """Merge consecutive identical events (composition is order-independent anyway).

    Every count must be an integer ``>= 0`` (a 0 is dropped) and every event a
    :class:`SubsampledGaussianEvent`; anything else is a ``ValueError`` naming the item.
    Fourteenth review of issue 15: ``compose_epsilon([(event, nan)], δ)`` returned ε 0.0 and a
    count of 9.5 or 0.5 composed 9.5 or no releases, where every other entry point (``step``,
    ``set_ledger``, a saved state) refuses a count that is not an integer.
    """
    out: list[tuple[SubsampledGaussianEvent, int]] = []
    if not isinstance(ledger, Iterable) or isinstance(ledger, (str, bytes)):
        raise ValueError(
            f"ledger must be a sequence of (SubsampledGaussianEvent, count) pairs, got "
            f"{type(ledger).__name__}"
        )
    for i, item in enumerate(ledger):
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            # a short API review of issue 15: a string ledger ended in "not enough values to
            # unpack", naming nothing
            raise ValueError(
                f"ledger[{i}] must be a (SubsampledGaussianEvent, count) pair, got "
                f"{type(item).__name__}"
            )
        event, count = item
        if not isinstance(event, SubsampledGaussianEvent):
            raise ValueError(
                f"ledger[{i}] must pair a SubsampledGaussianEvent with its count, got "
                f"{type(event).__name__}"
            )
        if isinstance(count, numbers.Integral) and not isinstance(count, bool):
            # forty-third review follow-up of issue 15 (ledger 3): an int subclass whose own
            # __int__ said 1 (storing 5) was composed as 1 event (tuning_epsilon 9.03 for 22.48,
            # compose_epsilon 7.99 for 17.27); its stored value is read (operator.index)
            count = operator.index(count)
        count = check_int(f"ledger[{i}] count", count, 0)
        check_ledger_count(
            count,
            f"ledger[{i}] count must be an integer in [0, 10**300] (events composed; float64 "
            "holds no more)",
        )
        if count == 0:
            continue
        if out and out[-1][0] == event:
            out[-1] = (event, out[-1][1] + count)
            if out[-1][1] > MAX_LEDGER_COUNT:
                raise ValueError(
                    f"ledger[{i}] count: merged with the equal events before it, the count is "
                    f"{_digits(out[-1][1])}, more than 10**300 (events composed; float64 holds no "
                    "more)"
                )
        else:
            out.append((event, count))
    return tuple(out)


def check_ledger_count(count: int, rule: str) -> int:
    """``count`` unless it exceeds :data:`MAX_LEDGER_COUNT`: ``ValueError(f"{rule}, got …")``.

    ``rule`` names the count and its bound; the count is shown by its number of digits.
    Sixteenth review of issue 15: counts of 10**400 (events, rounds, tree periods, tunings)
    ended in ``OverflowError`` where the accountants compose in float64.
    """
    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
        # a short API review of issue 15: NaN, -1 and 2.5 were returned unchanged
        raise ValueError(f"{rule}, got {shown(count)}")
    if count > MAX_LEDGER_COUNT:
        raise ValueError(f"{rule}, got {_digits(count)}")
    return int(count)


def _digits(count: int) -> str:
    """``count`` for a message: in full up to 30 digits, else its number of digits."""
    try:
        text = str(count)
    except ValueError:  # beyond Python's 4,300 digits (eighteenth review, finding 5)
        return shown(count)
    return text if len(text) <= 30 else f"an integer of {len(text):,} digits"


def relation_of(ledger: Ledger, accountant: str) -> dpa.NeighboringRelation:
    """Return the one neighbouring relation of a ledger; raise if ``accountant`` can't use it."""
    relations = {event.neighboring_relation for event, _ in ledger}
    if len(relations) > 1:
        raise ValueError(
            "cannot compose Poisson and fixed-size events (or tree events with either) in one "
            "ledger"
        )
    relation = relations.pop()
    if accountant != "rdp" and relation is dpa.NeighboringRelation.REPLACE_SPECIAL:
        raise ValueError(
            f"accountant {shown(accountant)} cannot account tree aggregation (dp-accounting's "
            "SingleEpochTreeAggregationDpEvent has RDP only); use accountant 'rdp'"
        )
    if accountant != "rdp" and relation is not dpa.NeighboringRelation.ADD_OR_REMOVE_ONE:
        raise ValueError(
            f"accountant {shown(accountant)} supports only Poisson sampling; fixed-size sampling "
            "(without replacement, replace-one adjacency) needs accountant 'rdp'"
        )
    return relation


def gib(nbytes: float) -> str:
    """``nbytes`` in MiB or GiB, for messages."""
    return f"{nbytes / 2**30:.3g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.3g} MiB"


# -- validation of a saved state ------------------------------------------------------------------


def is_count(x: object) -> bool:
    """Whether ``x`` is an ``int`` (not a ``bool``) ``>= 1``."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_noise(x: object) -> bool:
    return _is_real(x) and 0 <= x <= MAX_STATE_NOISE_MULTIPLIER  # type: ignore[operator]


_EVENT_FIELDS = {
    "noise_multiplier": _is_noise,
    "sampling": lambda x: isinstance(x, str),
    "sample_rate": _is_real,
    "population": lambda x: x is None or (isinstance(x, int) and not isinstance(x, bool)),
    "cohort_size": lambda x: x is None or (isinstance(x, int) and not isinstance(x, bool)),
    "count_noise_multiplier": lambda x: x is None or (_is_noise(x) and x > 0),
    "tree_steps": lambda x: x is None or (is_count(x) and x <= MAX_STATE_COUNT),
}
_OPTIONAL_EVENT_FIELDS = frozenset({"count_noise_multiplier", "tree_steps"})


def _parse_event(data: object, where: str) -> SubsampledGaussianEvent:
    if not isinstance(data, dict):
        raise ValueError(f"accountant state: {where}.event must be a mapping, got {shown(data)}")
    for key in data:
        if key not in _EVENT_FIELDS:
            raise ValueError(f"accountant state: unknown field {where}.event.{key}")
    for key, ok in _EVENT_FIELDS.items():
        if key == "noise_multiplier" and key in data and not ok(data[key]):
            raise ValueError(
                f"accountant state: {where}.event.noise_multiplier must be a finite number in "
                f"[0, {MAX_STATE_NOISE_MULTIPLIER:g}], got {shown(data[key])}"
            )
        if key in _OPTIONAL_EVENT_FIELDS and key not in data:
            continue
        if key not in data or not ok(data[key]):
            raise ValueError(
                f"accountant state: {where}.event.{key} is missing or invalid: "
                f"{shown(data.get(key))}"
            )
    try:
        return SubsampledGaussianEvent.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"accountant state: {where}.event: {exc}") from None


def parse_state(state: object) -> tuple[str, float, float, Ledger]:
    """The validated (accountant, pld_discretization, prv_eps_error, ledger) of a state.

    ``version`` must be the int :data:`STATE_VERSION` (``1.0`` or ``True`` are refused), every
    count an int in ``[1, MAX_STATE_COUNT]`` and every noise multiplier a finite number in
    ``[0, MAX_STATE_NOISE_MULTIPLIER]``; anything else raises ``ValueError`` naming the field.
    """
    fields = ("version", "accountant", "pld_discretization", "prv_eps_error", "ledger")
    if not isinstance(state, dict):
        raise ValueError(f"accountant state must be a mapping, got {type(state).__name__}")
    for key in state:
        if key not in fields:
            raise ValueError(f"accountant state: unknown field {shown(key)}")
    for key in fields:
        if key not in state:
            raise ValueError(f"accountant state: field {shown(key)} is missing")
    version = state["version"]
    if type(version) is not int or version != STATE_VERSION:
        raise ValueError(
            f"accountant state: version must be the integer {STATE_VERSION}, got {shown(version)}"
        )
    accountant = state["accountant"]
    if not isinstance(accountant, str) or accountant not in ACCOUNTANTS:
        raise ValueError(
            f"accountant state: accountant must be one of {', '.join(ACCOUNTANTS)}, "
            f"got {shown(accountant)}"
        )
    numbers = []
    for key in ("pld_discretization", "prv_eps_error"):
        value = state[key]
        if not (_is_real(value) and 0 < value < 1):
            raise ValueError(
                f"accountant state: {key} must be a number in (0, 1), got {shown(value)}"
            )
        numbers.append(float(value))
    items = state["ledger"]
    if not isinstance(items, list):
        raise ValueError(f"accountant state: ledger must be a list, got {type(items).__name__}")
    pairs = []
    for i, item in enumerate(items):
        where = f"ledger[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"accountant state: {where} must be a mapping with event and count")
        for key in item:
            if key not in ("event", "count"):
                raise ValueError(f"accountant state: unknown field {where}.{key}")
        count = item.get("count")
        if not (is_count(count) and count <= MAX_STATE_COUNT):
            raise ValueError(
                f"accountant state: {where}.count must be an integer in [1, {MAX_STATE_COUNT}], "
                f"got {shown(count)}"
            )
        pairs.append((_parse_event(item.get("event"), where), count))
    ledger = merge_ledger(pairs)
    if ledger:
        try:
            relation_of(ledger, accountant)
        except ValueError as exc:
            raise ValueError(f"accountant state: {exc}") from None
    return accountant, numbers[0], numbers[1], ledger
