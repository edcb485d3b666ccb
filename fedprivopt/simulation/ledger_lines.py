"""What one line of the privacy ledger holds, and the settings its header records.

The released events of a round (:func:`round_released`, :func:`released_json`), the digest of the
released model (:func:`params_sha256`), a parsed line (:class:`LedgerEntry`), the privacy-relevant
settings of a configuration (:func:`privacy_settings`) and how two of them are compared. The
ledger file itself: :mod:`fedprivopt.simulation.ledger`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from fedprivopt.core.text import shown
from fedprivopt.privacy.accounting import PrivacyAccountant
from fedprivopt.privacy.accounting_state import check_delta, merge_ledger
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.simulation.files import parse_json
from fedprivopt.strategies.config import MAX_ROUNDS

__all__ = [
    "ADDED_SETTINGS",
    "EVENT_KEYS",
    "FIRST_KEYS",
    "HEADER_RECORDS",
    "LEDGER_VERSION",
    "OLD_LEDGER_SUFFIX",
    "RELOCATABLE_TASK_PARAMS",
    "RESUMABLE_KEYS",
    "Ledger",
    "LedgerEntry",
    "OldLedgerError",
    "canonical",
    "count_events",
    "first_difference",
    "is_int",
    "params_sha256",
    "parse_lines",
    "participants_sha256",
    "privacy_settings",
    "released_json",
    "released_less",
    "replay_order",
    "round_released",
    "tree_participants",
]

LEDGER_VERSION = 2
# What a header states it records (its "records" field): the task parameters always, the task's
# data identity whenever the task has one, with its module's source digest (``task_source``) for
# a task by reference. Headers written before the field (thirty-ninth review of issue 15, ledger
# follow-up) are recognised as older by what those versions really lacked
# (:meth:`~fedprivopt.simulation.ledger_checks.LedgerChecks.check_config`, ``check_data``).
HEADER_RECORDS = ("data", "task-params", "task_source")
OLD_LEDGER_SUFFIX = ".v1"
_SHA256 = re.compile("[0-9a-f]{64}")

Ledger = tuple[tuple[SubsampledGaussianEvent, int], ...]

# StrategyConfig keys that may change when a run is resumed: nothing about what was released or
# how it is accounted depends on them. Execution settings (engine, device, resources, chunking)
# and the evaluation and checkpoint cadence are not in the header at all; a seeded replay is
# checked against the released model's digest instead.
RESUMABLE_KEYS = frozenset({"num-server-rounds"})
_DIGEST_CHUNK = 1 << 16  # participants hashed at a time by tree_participants
# Task parameters that say only where the same data lives or how it is cached (a dataset that
# moved): a resume may change them. Every other task parameter chooses the users' data, the model
# or the evaluation, so the header records it (as "task-params") and a resume may not change it.
RELOCATABLE_TASK_PARAMS = frozenset({"data_dir", "cache_dir", "cache_users", "token_cache"})
# Settings added after ledgers were first written, with the value that does what every run did
# before the key existed: a header without the key records that value (seventeenth review of
# issue 15, finding 3: every DP2 run started before dp2-scale-by-preconditioner was refused on
# --resume, and its comparison cells on compare, as "(not set)" against false).
ADDED_SETTINGS = MappingProxyType({"dp2-scale-by-preconditioner": False})
FIRST_KEYS = ("noise-multiplier", "sampling", "population", "clients-per-round", "accountant",
               "delta", "strategy", "secure", "seed", "target-epsilon", "clip-norm",
               "noise-mode")  # fmt: skip
EVENT_KEYS = {"noise_multiplier": "noise-multiplier", "sample_rate": "clients-per-round",
               "sampling": "sampling", "population": "population",
               "cohort_size": "clients-per-round",
               "count_noise_multiplier": "clip-count-stddev",
               "tree_steps": "tree-restart-rounds"}  # fmt: skip


def participants_sha256(period: int, users: Iterable[int]) -> str:
    """SHA-256 of a tree restart period's participants (sorted user ids) and its number.

    Written into each round's ledger line of a tree run (fourteenth review of issue 15): a
    checkpoint's participation ledger must match the line of its round, so users exchanged
    for others in the checkpoint alone are found in secure mode too.
    """
    text = f"{int(period)}:" + ",".join(str(int(u)) for u in sorted(int(u) for u in users))
    return hashlib.sha256(text.encode()).hexdigest()


def tree_participants(algorithm: Any) -> str | None:
    """:func:`participants_sha256` of ``algorithm``'s tree participation ledger (else ``None``)."""
    cohorts = getattr(algorithm, "tree_cohorts", None)
    if cohorts is None:
        return None
    state = cohorts.ledger.state_dict()
    # forty-eighth review of issue 15 (memory 5): the same digest, hashed a chunk at a time
    # (the whole period as Python ints and their text took 81 bytes a participant: 772 MB for
    # 10**7 every round, about 8 GB for a period of 10**8)
    users = state["users"].sort().values
    digest = hashlib.sha256(f"{int(state['period'])}:".encode())
    for start in range(0, users.numel(), _DIGEST_CHUNK):
        text = ",".join(map(str, users[start : start + _DIGEST_CHUNK].tolist()))
        digest.update(("," if start else "").encode() + text.encode())
    return digest.hexdigest()


def params_sha256(params: torch.Tensor) -> str:
    """SHA-256 of a released model (dtype, shape and raw bytes)."""
    t = params.detach().cpu().contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy())  # the buffer itself, no copy
    return h.hexdigest()


def privacy_settings(config) -> dict[str, Any]:
    """The privacy-relevant settings of a ``RunConfig``, flat, as the ledger's header holds them.

    Every strategy key except :data:`RESUMABLE_KEYS`, the task, its parameters except
    :data:`RELOCATABLE_TASK_PARAMS` (under ``"task-params"``) and the side-information table.
    """
    mapping = config.to_mapping()
    strategy = set(config.strategy.to_mapping())
    out = {k: v for k, v in mapping.items() if k in strategy and k not in RESUMABLE_KEYS}
    out["task"] = mapping["task"]
    out["task-params"] = {
        k.replace("_", "-"): v
        for k, v in sorted(config.task_params.items())
        if k not in RELOCATABLE_TASK_PARAMS
    }
    for key, value in mapping.get("side-information", {}).items():
        out[f"side-information.{key}"] = value
    return json.loads(json.dumps(out, allow_nan=True))


def canonical(value: Any) -> str:
    """``value`` as sorted-key JSON: what two settings are compared by.

    Keys are made strings first, as a JSON file holds them: forty-seventh review of issue 15
    (sameness 4), a task's data identity ``{"counts": {1: 5, "total": 5}}`` (kept so in a
    checkpoint's copy of the header) could not be sorted, and every ``--resume`` and compare's
    reuse of its runs ended in a ``TypeError``.
    """
    try:
        return json.dumps(value, sort_keys=True, allow_nan=True)
    except TypeError:  # keys of several types: 1 and "total" cannot be ordered
        plain = json.loads(json.dumps(value, allow_nan=True))
        return json.dumps(plain, sort_keys=True, allow_nan=True)


def first_difference(old: Any, new: Any) -> tuple[str, Any, Any]:
    """``("task-params.<key>", old, new)`` of the first differing task parameter (or the whole)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return "task-params", old, new
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "(not set)"), new.get(key, "(not set)")
        if canonical(a) != canonical(b):
            return f"task-params.{key}", a, b
    return "task-params", old, new


def released_json(released: Ledger) -> list[dict[str, Any]]:
    """``released`` as a ledger line's ``"released"`` list."""
    return [{"event": e.to_dict(), "count": c} for e, c in released]


def round_released(events: Sequence[SubsampledGaussianEvent]) -> Ledger:
    """The merged ``(event, count)`` pairs of one round's events."""
    return merge_ledger((e, 1) for e in events)


def released_less(released: Ledger, part: Ledger) -> Ledger:
    """``released`` without the events of ``part`` (the part of a round recorded before it).

    Raises
    ------
    ValueError
        If ``part`` holds an event ``released`` does not (a round cannot release less than it
        already did).
    """
    counts = dict(released)
    for event, count in part:
        if counts.get(event, 0) < count:
            raise ValueError(f"a round's events {released} do not hold its recorded part {part}")
        counts[event] -= count
    return tuple((event, counts[event]) for event, _ in released if counts[event])


def replay_order(entries: Sequence[LedgerEntry], round_num: int) -> bool:
    """Whether ``entries`` are exactly the releases of rounds ``round_num + 1, round_num + 2, …``.

    Each round is one ``round`` line, or a ``partial`` line and then its ``round`` line; the
    last round may have only its ``partial`` line (a run stopped between the two). Every line
    has the digest of what it released. Only such lines can be replayed by a seeded resume.
    """
    expected = round_num + 1
    for i, entry in enumerate(entries):
        if entry.round != expected or not entry.params_sha256:
            return False
        if entry.kind == "round":
            expected += 1
        elif entry.kind != "partial" or (i + 1 < len(entries) and entries[i + 1].kind != "round"):
            return False
    return True


def count_events(released: Ledger) -> int:
    """The number of events in ``released``."""
    return sum(c for _, c in released)


@dataclass(frozen=True)
class LedgerEntry:
    """One line of the ledger after its header.

    Attributes
    ----------
    kind : {"round", "partial", "carried"}
        ``round``: the release of one round; ``partial``: the part of a round released before it
        ends (ADADP's half-step point, a function of the round's first noised sum, sent to its
        second cohort), whose ``round`` line then holds the rest of the round's events;
        ``carried``: events taken over from a checkpoint or an older ledger when an earlier
        version's ledger was converted.
    round : int
    released : tuple of (SubsampledGaussianEvent, int)
    events : int
        Cumulative number of events after this line.
    params_sha256 : str or None
        Digest of the released model (``round`` lines written by this version).
    line : int
        Line number in the file (1-based).
    participants_sha256 : str or None
        Under tree aggregation, the digest of the restart period's participants after the round
        (:func:`participants_sha256`); ``None`` otherwise and in lines written before it.
    """

    kind: str
    round: int
    released: Ledger
    events: int
    params_sha256: str | None
    line: int
    participants_sha256: str | None = None


class OldLedgerError(ValueError):
    """The ledger was written by an earlier version (event counts only)."""

    def __init__(self, message: str, *, max_events: int, max_round: int) -> None:
        super().__init__(message)
        self.max_events = max_events
        self.max_round = max_round


def is_int(x: object, low: int = 0) -> bool:
    """Whether ``x`` is an int (not a bool) ``>= low``."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def parse_lines(path: Path, lines: list[str]) -> tuple[dict[str, Any], list[LedgerEntry]]:
    """The header and entries of a ledger file's complete ``lines``, every field checked.

    Raises
    ------
    OldLedgerError
        For a ledger of an earlier version (event counts only).
    ValueError
        Naming ``path`` and the line, for anything this version would not have written.
    """

    def bad(i: int, what: str) -> ValueError:
        return ValueError(
            f"{path}: line {i}: {what}; the privacy ledger is damaged or was edited, so what "
            "this run released cannot be established (restore it, or start a new run)"
        )

    rows = []
    for i, text in enumerate(lines, 1):
        try:
            row = parse_json(text)
        except ValueError as exc:  # also nested too deeply, or an integer too long to read
            raise bad(i, f"not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise bad(i, "not a JSON object")
        rows.append(row)
    if not rows:
        raise bad(1, "empty file")
    header = rows[0]
    if "ledger" not in header and all(set(r) <= {"round", "events", "kind"} for r in rows):
        counts = [r.get("events") for r in rows]
        rounds = [r.get("round") for r in rows]
        if not all(is_int(x) for x in counts + rounds):
            raise bad(1, "an older ledger whose counts are not integers")
        raise OldLedgerError(
            f"{path} was written by an older fedprivopt (event counts only, no events), "
            "so it cannot show what was released",
            max_events=max(counts),
            max_round=max(rounds),
        )
    if header.get("ledger") != LEDGER_VERSION or header.get("kind") != "header":
        raise bad(1, f"not a version-{LEDGER_VERSION} ledger header")
    keys = ("accountant", "pld_discretization", "prv_eps_error", "delta", "private")
    missing = [k for k in (*keys, "settings") if k not in header]
    if missing or header.get("events") != 0 or not isinstance(header["settings"], dict):
        raise bad(1, f"the header lacks {missing or 'its settings'}")
    for key in ("accountant", "delta"):
        if canonical(header[key]) != canonical(header["settings"].get(key)):
            raise bad(1, f"the header's {key} is not its settings' {key}")
    try:  # thirty-sixth review (ledger): "0.0001" in both was "Unknown format code 'g'" (reports)
        check_delta(header["delta"])
    except ValueError as exc:
        raise bad(1, f"the header's {exc}") from None
    if not isinstance(header["private"], bool):
        raise bad(1, "private must be true or false")
    if "records" in header and header["records"] != list(HEADER_RECORDS):
        raise bad(1, f"the header's records is not {list(HEADER_RECORDS)}")
    template = {
        "version": 1,
        "accountant": header["accountant"],
        "pld_discretization": header["pld_discretization"],
        "prv_eps_error": header["prv_eps_error"],
    }
    try:
        PrivacyAccountant().load_state_dict({**template, "ledger": []})
    except ValueError as exc:
        raise bad(1, str(exc)) from None
    entries: list[LedgerEntry] = []
    total = 0
    relation: tuple[Any, int] | None = None  # of the first event, and its line
    for i, row in enumerate(rows[1:], 2):
        kind = row.get("kind")
        if kind not in ("round", "partial", "carried"):
            raise bad(i, f"unknown kind {kind!r}")
        if not is_int(row.get("round"), 1) or not is_int(row.get("events")):
            raise bad(i, "round and events must be integers")
        if row["round"] > MAX_ROUNDS:  # thirty-first review: "set num-server-rounds to 10**20"
            raise bad(i, f"round {shown(row['round'])} is beyond the {MAX_ROUNDS:,} a run may have")
        if row.get("accountant") != header["accountant"]:
            raise bad(i, f"accountant {row.get('accountant')!r} is not the header's")
        items = row.get("released")
        if not isinstance(items, list):
            raise bad(i, "released must be a list")
        probe = PrivacyAccountant()
        try:
            probe.load_state_dict({**template, "ledger": items})
        except ValueError as exc:
            raise bad(i, str(exc)) from None
        released = merge_ledger(
            (SubsampledGaussianEvent.from_dict(x["event"]), x["count"]) for x in items
        )
        # thirty-ninth review of issue 15 (ledger, finding 3): each line was probed alone, so
        # lines of Poisson and fixed-size events were read and every report of the run ended in
        # "cannot compose Poisson and fixed-size events …", naming no file
        for event, _ in released:
            relation = relation or (event.neighboring_relation, i)
            if event.neighboring_relation is not relation[0]:
                raise bad(
                    i,
                    f"its events cannot be composed with those of line {relation[1]} (Poisson, "
                    "fixed-size and tree events are never mixed in one run)",
                )
        total += count_events(released)
        if row["events"] != total:
            raise bad(i, f"events {row['events']} does not add up (expected {total})")
        digest, users = row.get("params_sha256"), row.get("participants_sha256")
        for name, value in (("params_sha256", digest), ("participants_sha256", users)):
            if value is not None and not (isinstance(value, str) and _SHA256.fullmatch(value)):
                raise bad(i, f"{name} must be a SHA-256 (64 hexadecimal digits)")
        # thirty-sixth review of issue 15 (ledger): every version-2 writer records the released
        # model's digest on a round's lines; only a ledger rebuilt from a checkpoint
        # (RunLedger.convert) holds none, in the carried lines and rounds it starts with. The
        # digests nulled with sed (or emptied, or a line marked carried) turned off the check of
        # an edited checkpoint's model (check_model) and the seeded replay's, so a tree round
        # was redone from another model with its first release's noise and participants,
        # charged nothing
        converted = all(e.kind == "carried" or e.params_sha256 is None for e in entries)
        if kind == "carried" and not converted:
            raise bad(i, "a carried line after a released round's (only a rebuilt ledger has one)")
        if digest is None and kind != "carried" and not (entries and converted):
            raise bad(i, f"a {kind} line without params_sha256 (the released model's digest)")
        entries.append(LedgerEntry(kind, row["round"], released, total, digest, i, users))
    return header, entries
