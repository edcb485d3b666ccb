"""The checks of a resumed (or reused) run against its privacy ledger.

:class:`LedgerChecks` is the part of :class:`~fedprivopt.simulation.ledger.RunLedger` that
refuses, naming what differs, a run whose configuration, data, task code, strategy, accountant
or checkpoint is not what the ledger records, and a ledger that composes to less ε than the run
reported before. Each check raises ``ValueError``; none writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fedprivopt.core.text import shown, shown_key
from fedprivopt.models.task import TASK_SOURCE
from fedprivopt.simulation.files import CONFIG_FILE
from fedprivopt.simulation.ledger_lines import (
    ADDED_SETTINGS,
    EVENT_KEYS,
    FIRST_KEYS,
    Ledger,
    LedgerEntry,
    canonical,
    count_events,
    first_difference,
    params_sha256,
    privacy_settings,
    released_less,
    round_released,
)

__all__ = ["LedgerChecks"]


class LedgerChecks:
    """The resume checks of :class:`~fedprivopt.simulation.ledger.RunLedger` (a mixin).

    They read the ledger's ``path``, ``header`` and ``entries`` and its :meth:`epsilon`.
    """

    path: Path
    header: dict[str, Any]
    entries: list[LedgerEntry]

    def _last_release(self, round_num: int) -> LedgerEntry | None:
        """The ledger's last ``round`` line of round ``round_num`` (its latest release), if any."""
        lines = [e for e in self.entries if e.round == round_num and e.kind == "round"]
        return lines[-1] if lines else None

    def check_header_copy(self, copy: Any, name: str) -> None:
        """Refuse a header that differs from checkpoint ``name``'s copy of it (``copy``).

        Every checkpoint of this version holds a copy of the ledger's header
        (``ledger_header``; ``None`` in earlier versions' checkpoints, not checked), which a
        ledger rebuilt from it is checked against (fortieth review, ledger 3). Fortieth review
        follow-up (ledger 5): a run's header with its ``data`` and ``records`` deleted read as
        an earlier version's, whose data is not compared: a run of a task by reference resumed
        on its module's edited code (other data), rc 0.
        """
        if copy is None:
            return
        keys = ("delta", "accountant", "private", "settings", "records", "data", "tuning_plan")
        for key in keys:
            if not isinstance(copy, Mapping) or canonical(copy.get(key)) != canonical(
                self.header.get(key)
            ):
                theirs = copy.get(key) if isinstance(copy, Mapping) else None
                which = _difference(self.header.get(key), theirs, name)
                raise ValueError(
                    f"{self.path}: line 1: its header's {key} is not the one {name} recorded "
                    f"(its copy of the ledger header){which}"
                    ": the privacy ledger or the checkpoint was edited, or one of them copied "
                    "from another run; refusing to resume"
                )

    def records(self, round_num: int, participants: str | None) -> bool:
        """Whether the line of round ``round_num`` records tree ``participants`` (a digest)."""
        line = self._last_release(round_num)
        if participants is None or line is None:
            return False
        return line.participants_sha256 == participants

    def check_participants(self, round_num: int, digest: str | None, name: str) -> None:
        """Refuse a checkpoint of ``round_num`` whose tree participants are not its line's.

        ``digest``: :func:`participants_sha256` of the checkpoint's participation ledger
        (``None``: not a tree run). Lines without one (earlier versions, which recorded no
        model digest either, and rebuilt ledgers) are not checked.
        """
        line = self._last_release(round_num)
        if digest is not None and line is not None and line.params_sha256 is not None:
            if line.participants_sha256 is None:
                # thirty-eighth review of issue 15 (ledger, finding 3): every writer that records
                # a model's digest records a tree round's participants too (fourteenth review);
                # the field removed from the line turned this check off, and a secure run's
                # checkpoint whose participants were exchanged for as many others resumed
                raise ValueError(
                    f"{self.path}: line {line.line}: a tree round's line without "
                    "participants_sha256 (the digest of its restart period's participants); the "
                    f"privacy ledger was edited{self._participants_unrecorded()}: refusing to "
                    "resume"
                )
        if line is not None and line.participants_sha256 not in (None, digest):
            raise ValueError(
                f"{name}'s tree participation ledger is not the one {self.path.name} recorded "
                f"for round {round_num} (line {line.line}): the checkpoint was edited "
                "(resuming it would let users of the period take part again); refusing to resume"
            )

    def _participants_unrecorded(self) -> str:
        """What to add when a tree ledger may be genuine but written before participants were.

        Versions of 24-25 November 2026 (d307e8f to 6cd99d8^) recorded the released models'
        digests but no tree round's participants; their ledgers hold no participants on any
        line, no ``partial`` line, no header ``records`` and no ``data.task_source`` (all
        recorded only later). Thirty-ninth review follow-up of issue 15 (ledger, open row),
        fortieth review (ledger 1): such a genuine run was called edited, with no word of what
        its owner can do. It is still refused (in secure mode the participants cannot be
        replayed, so accepting such lines reopens the thirty-eighth review's finding 3).
        """
        data = self.header.get("data")
        later = (
            "records" in self.header
            or (isinstance(data, dict) and TASK_SOURCE in data)
            or any(e.participants_sha256 is not None or e.kind == "partial" for e in self.entries)
        )
        if later:
            return ""
        return (
            ", or written by a version of 24-25 November 2026, which recorded the released "
            "models' digests but not a tree round's participants, so the checkpoint's participants "
            "cannot be checked (what it released and its epsilon, in summary.json and "
            "metrics.jsonl, stand; finish it with that version, or start a new run in another "
            "directory)"
        )

    def check_model(self, round_num: int, params: torch.Tensor, name: str) -> None:
        """Refuse a checkpoint of ``round_num`` whose model is not the one its line released.

        A checkpoint holds the model its round released, whose :func:`params_sha256` the line
        records (lines of earlier versions hold none and are not checked). Twenty-ninth review
        of issue 15: a checkpoint whose parameters were edited (its digest recomputed) was
        resumed; the rounds it redid were new releases, and a tree run's, inside a restart
        period, were charged nothing.
        """
        line = self._last_release(round_num)
        if line is not None and line.params_sha256 not in (None, params_sha256(params)):
            raise ValueError(
                f"{name}'s model is not the one {self.path.name} recorded as released by round "
                f"{round_num} (line {line.line}): the checkpoint or the ledger was edited; "
                "refusing to resume"
            )

    def check_tuning_plan(self, digest: str) -> None:
        """Raise ``ValueError`` unless the header names the tuning plan ``digest``.

        A trial of ``fedprivopt tune`` records the digest of the plan that drew it
        (:meth:`header_for`); a plan rewritten afterwards (its grid or trial count edited in
        ``tune.json`` and ``summary.json`` alike) no longer matches the trials' ledgers
        (seventeenth review of issue 15, finding 2).
        """
        stated = self.header.get("tuning_plan")
        if stated == digest:
            return
        if stated is None:
            raise ValueError(
                f"{self.path}: its header names no tuning plan: not a trial that tune ran under "
                "this plan (or one of a version before the plan's digest was recorded)"
            )
        raise ValueError(
            f"{self.path}: its header names the tuning plan {str(stated)[:16]!r}..., not "
            f"{digest[:16]!r}... of this tuning: the trial was run under another plan, or the "
            "plan was edited after it ran"
        )

    def check_config(self, config, source: str = CONFIG_FILE) -> None:
        """Raise ``ValueError`` naming the first privacy-relevant key where ``config`` differs."""
        stored = self.header["settings"]
        current = privacy_settings(config)
        for key, before in ADDED_SETTINGS.items():  # a header written before the key existed
            if (
                key not in stored
                and key in current
                and canonical(current[key]) == canonical(before)
            ):
                del current[key]
        keys = [k for k in FIRST_KEYS if k in stored or k in current]
        keys += sorted((set(stored) | set(current)) - set(keys))
        if "task-params" not in stored:  # written before task parameters were recorded
            self._refuse_lost("settings.task-params")
            current.pop("task-params")
            keys.remove("task-params")
        for key in keys:
            old, new = stored.get(key, "(not set)"), current.get(key, "(not set)")
            if key == "task-params":
                key, old, new = first_difference(old, new)
            if canonical(old) != canonical(new):
                what = (
                    " (different side information)"
                    if key.startswith("side-")
                    else " (other data, model or evaluation)"
                    if key.startswith("task-params")
                    else ""
                )
                raise ValueError(
                    f"{source}: {key} = {canonical(new)}, but the run's privacy ledger records "
                    f"{key} = {canonical(old)}: resuming with a different configuration{what} "
                    "is refused, as privacy-relevant settings cannot change within a run (start "
                    "a new run in another directory)"
                )
        if self.header["private"] != bool(config.strategy.private):
            raise ValueError(
                f"{self.path.name}: its header says private = "
                f"{str(self.header['private']).lower()}, but {source} runs strategy "
                f"{config.strategy.strategy!r}: the ledger was edited; refusing to resume"
            )

    def _refuse_lost(self, what: str, *, since_participants: bool = True) -> None:
        """Refuse a header without ``what`` beside what only versions that record it write.

        Those marks: the header's ``records`` (every header written since the thirty-ninth
        review states what it records), ADADP's ``partial`` lines (written since after the task
        parameters, the data identity and the task's source were all recorded), a tree round's
        participants (``since_participants``: recorded since after the task parameters and the
        data), the header's ``data`` beside no ``task-params`` (data was recorded after them),
        and ``ema-decay`` in the settings beside no ``task-params`` (both were added to the
        header by one version; a header written before holds neither, and its settings are
        refused by :meth:`check_config` anyway). Thirty-ninth review of issue 15 (ledger,
        findings 4 and 5): ``task-params`` (or ``data``) deleted from a seeded tree run's header
        turned its check off, and a resume with ``task-params.seed`` (or the task's module)
        changed ran the restart period on, its users' indices holding other examples than in
        its first rounds. Its follow-up: only those tree and ADADP lines were marks, so a
        Gaussian run's header with ``task-params``, ``data`` or ``data.task_source`` deleted
        resumed (and was reused by ``compare``) on other data or another task module, rc 0.
        A tree run's header lacking ``what`` is refused with no mark (the rounds of a restart
        period must hold the same data at each user index).
        """
        tree = [e.line for e in self.entries if e.participants_sha256 is not None]
        partial = [e.line for e in self.entries if e.kind == "partial"]
        if partial and self._whole_two_part_round_before(partial[0]):
            # fortieth review (ledger 2): the run was started by a version before partial lines
            # (its header is that version's) and resumed by a later one, which wrote them
            partial = []
        task_params = what == "settings.task-params"
        only = f"which only versions that record {what} write"
        marks = (
            (since_participants and tree,
             f"line {(tree or [0])[0]} records a tree round's participants, {only}"),
            (partial, f"line {(partial or [0])[0]} is a partial line, {only}"),
            ("records" in self.header, f"its header's records field states that it records {what}"),
            (task_params and "data" in self.header, f"its header records the task's data, {only}"),
            (task_params and "ema-decay" in self.header.get("settings", {}),
             "its settings record ema-decay, added to the header with task-params"),
        )  # fmt: skip
        later = next((text for present, text in marks if present), None)
        if later is not None:
            unread = (
                ""
                if task_params
                else " (or the task's module had no readable source file when "
                "the run started, so its code cannot be compared)"
            )
            raise ValueError(
                f"{self.path}: line 1: its header lacks {what}, but {later}; the privacy ledger "
                f"was edited{unread}: refusing to resume"
            )
        if any(e.sampling == "tree" for entry in self.entries for e, _ in entry.released):
            # thirty-ninth review follow-up (ledger 3): a tree run's ledger rewritten in the form
            # RunLedger.convert writes (one carried line, no participants), its header's records
            # and data deleted, resumed the restart period on an edited module's data
            raise ValueError(
                f"{self.path}: line 1: its header lacks {what}, and its events are tree "
                "aggregation's, whose restart period bounds each user index's participation: "
                "that the resumed rounds' users hold the data of the period's first rounds cannot "
                "be checked (the privacy ledger was edited, or written by a version before it "
                "recorded this); refusing to resume (start a new run in another directory)"
            )

    def _whole_two_part_round_before(self, line: int) -> bool:
        """Whether a ``round`` line before ``line`` released a two-part round in one line.

        Versions before ADADP's ``partial`` lines (a7ec3cb) wrote each round whole (its two
        events on one line); a resume by a later version continues such a ledger with
        ``partial`` lines, but its header is still the first version's
        (:meth:`_check_partial_kept` refuses such a line after a ``partial`` one). Fortieth
        review of issue 15 (ledger, finding 2): an ADADP run of a task by reference written at
        0166fb2^ (its header without ``data``), resumed once by this version, was refused on its
        next resume as edited, its own first ``partial`` line taken as the header's version.
        """
        return any(
            e.line < line and e.kind == "round" and count_events(e.released) >= 2
            for e in self.entries
        )

    def check_data(self, data: Mapping[str, Any] | None, source: str = CONFIG_FILE) -> None:
        """Raise ``ValueError`` when the task's data is not the data the run was started on.

        ``data`` is the rebuilt task's :func:`~fedprivopt.models.task.data_identity`. A ledger
        written before data was recorded is not checked, nor is a task without an identity
        whose ledger records none.

        Forty-seventh review of issue 15 (sameness 3): a task without an identity was not
        checked against a ledger that records one: ``task = "mymod48:make"``, ``make`` a function
        of one's own setting the toy task's data seed 3 (its module's digest recorded), then the
        module edited to ``from fedprivopt.models.toy import ToyClassificationTask as make`` (a
        packaged class: no module of one's own to digest, so no identity), and ``simulate
        --resume`` ran rounds 3-4 on the data of seed 0, rc 0. Refused now, where the header
        states it records the task's data (``records``).
        """
        stored = self.header.get("data")
        if stored is None and data is not None:
            self._refuse_lost("data")
        records = self.header.get("records")
        if stored is not None and data is None and isinstance(records, list) and "data" in records:
            # a header of this version (its records say so); an earlier one as before
            recorded = ", ".join(sorted(map(str, stored))) if isinstance(stored, dict) else "data"
            raise ValueError(
                f"{source}: the run's privacy ledger records the task's data and code "
                f"({recorded}), but its task now has no identity (no data_identity(), no module "
                "of one's own: its factory was replaced, say by a packaged class): resuming or "
                "reusing a run with other task code is refused (start a new run in another "
                "directory)"
            )
        if stored is None or data is None:
            return
        if not isinstance(stored, dict):
            raise ValueError(f"{self.path}: its header's data is not a mapping (edited?)")
        then, now = stored.get(TASK_SOURCE), data.get(TASK_SOURCE)
        if isinstance(then, dict) and isinstance(now, dict) and "factory" not in then:
            # a ledger written before a registered name's factory was recorded (forty-seventh
            # review, api 3) records its module's digest alone, which is what it is checked by:
            # its follow-up (ledger 4), such a run of a registered task, unchanged, was refused
            # on resume as 'the task's code changed' (the same SHA-256), compare's reuse alike
            data = {**data, TASK_SOURCE: {k: v for k, v in now.items() if k != "factory"}}
        keys = set(stored) | set(data)
        if TASK_SOURCE not in stored:  # a ledger written before the task's code was recorded
            if TASK_SOURCE in data:  # tree participants were recorded before it
                self._refuse_lost(f"data.{TASK_SOURCE}", since_participants=False)
            keys.discard(TASK_SOURCE)
        for key in sorted(keys):
            if key == TASK_SOURCE and canonical(stored.get(key)) != canonical(data.get(key)):
                now, then = data.get(key) or {}, stored.get(key) or {}
                then_factory = then.get("factory") if isinstance(then, dict) else None
                factories = ""
                if now.get("factory") != then_factory:  # a registered name's (47th review, api 3)
                    factories = (
                        f"; factory {canonical(now.get('factory'))}, the ledger's "
                        f"{canonical(then_factory)}"
                    )
                raise ValueError(
                    f"{source}: the task's code changed since the run started (module "
                    f"{canonical(now.get('module'))}, source SHA-256 "
                    f"{str(now.get('sha256'))[:12]}…; the run's privacy ledger records "
                    f"{canonical(then.get('module') if isinstance(then, dict) else then)}, "
                    f"{str(then.get('sha256') if isinstance(then, dict) else '')[:12]}…"
                    f"{factories}): resuming or reusing a run with other task code is refused "
                    "(start a new run in another directory)"
                )
            if canonical(stored.get(key)) != canonical(data.get(key)):
                raise ValueError(
                    f"{source}: task-params.data-dir holds other data than the run was started "
                    f"on ({key} is {canonical(data.get(key))}, the run's privacy ledger records "
                    f"{canonical(stored.get(key))}): resuming or reusing a run on other data is "
                    "refused (start a new run in another directory)"
                )

    def check_algorithm(self, alg) -> None:
        """Raise if the ledger's released events or accountant settings are not ``alg``'s.

        ``alg`` is the :class:`~fedprivopt.strategies.ServerAlgorithm` built from the resumed
        configuration: every ``round`` line must hold the events one of its rounds releases, and
        the header the settings of its accountant.
        """
        acc = alg.accountant
        for key in ("pld_discretization", "prv_eps_error"):
            if self.header[key] != getattr(acc, key):
                raise ValueError(
                    f"{self.path}: the header's {key} = {self.header[key]!r} is not the "
                    f"accountant's {getattr(acc, key)!r}; the ledger was edited: refusing to resume"
                )
        previous, partial_seen = None, False
        for entry in self.entries:
            expected = self._expected(alg, entry, previous)
            self._check_partial_kept(alg, entry, previous, partial_seen)
            partial_seen = partial_seen or entry.kind == "partial"
            previous = entry
            if entry.kind == "carried" or entry.released == expected:
                continue
            field, old, new = "count", count_events(entry.released), count_events(expected)
            if entry.released and expected and len(entry.released) == len(expected) == 1:
                a, b = entry.released[0][0].to_dict(), expected[0][0].to_dict()
                diff = [k for k in {**a, **b} if a.get(k) != b.get(k)]
                if diff:
                    field, old, new = diff[0], a.get(diff[0]), b.get(diff[0])
            key = EVENT_KEYS.get(field, "strategy")
            raise ValueError(
                f"{self.path}: line {entry.line}: round {entry.round} released {field}={old}, "
                f"but {CONFIG_FILE} makes a round release {field}={new} ({key}); the ledger or "
                "the configuration was edited: refusing to resume"
            )

    def _check_partial_kept(
        self, alg, entry: LedgerEntry, previous: LedgerEntry | None, partial_seen: bool
    ) -> None:
        """Refuse a whole round's line of a two-part round after ``partial`` lines.

        A version that records ADADP's half-step point writes a ``partial`` line before every
        such round's ``round`` line; only a ledger of an earlier version (one line a round,
        which a resume by this version then continues) has rounds without one, all before its
        first ``partial`` line. Thirty-eighth review of issue 15 (ledger, finding 2): round 4's
        ``partial`` line removed and its event merged into the round's line (the counts still
        add up) resumed, and a seeded redo sent round 4's half-step point to the second cohort
        without comparing it with its first release (:meth:`RunLedger.record_partial` takes
        such a line as an earlier version's).
        """
        if not partial_seen or entry.kind != "round":
            return
        if previous is not None and previous.kind == "partial" and previous.round == entry.round:
            return
        if len(alg.round_events(entry.round)) >= 2:
            raise ValueError(
                f"{self.path}: line {entry.line}: round {entry.round} released its whole round "
                "in one line, but the lines before it record each round's first part on a "
                "partial line of its own (ADADP's half-step point, recorded before it is sent "
                "out): that partial line was removed; the ledger was edited: refusing to resume"
            )

    def _expected(self, alg, entry: LedgerEntry, previous: LedgerEntry | None) -> Ledger:
        """What ``entry`` must hold were it released by ``alg`` (after line ``previous``).

        A ``partial`` line holds the first of the round's events (ADADP's first cohort) and the
        ``round`` line after it the rest; a strategy that releases a round in one piece
        (one event a round) has no ``partial`` line.
        """
        events = alg.round_events(entry.round)
        if entry.kind == "partial":
            if len(events) < 2:
                raise ValueError(
                    f"{self.path}: line {entry.line}: a partial release of round {entry.round}, "
                    f"but strategy {alg.config.strategy!r} releases a round in one piece; the "
                    "ledger or the configuration was edited: refusing to resume"
                )
            return round_released(events[:1])
        whole = round_released(events)
        if previous is not None and previous.kind == "partial" and previous.round == entry.round:
            return released_less(whole, previous.released)
        return whole

    def check_reported(self, reported: Sequence[tuple[str, float]]) -> None:
        """Raise unless the ledger's ε covers every ε the run reported before.

        ``reported`` holds ``(where, ε)`` pairs read from ``metrics.jsonl`` rows and
        ``summary.json``. Every reported ε was composed from the ledger as it then stood, and a
        ledger only grows, so one that now composes to less was edited (for example its noise
        multipliers raised, with the configuration to match).
        """
        if not self.header["private"] or not reported:
            return
        where, most = max(reported, key=lambda item: item[1])
        have = self.epsilon()
        if most > have * (1 + 1e-6):
            raise ValueError(
                f"{self.path.name} composes to epsilon {have:.6g}, but {where} reported epsilon "
                f"{most:.6g}: the ledger was edited (what was released cannot have shrunk); "
                "refusing to resume"
            )


def _difference(mine: Any, theirs: Any, name: str) -> str:
    """`` (the ledger: KEY = A, NAME: KEY = B)`` for the first setting of two that differs.

    Names the key, as the twenty-first review of issue 15 (finding 6) asked of a checkpoint of
    another configuration: the fortieth review follow-up's header check came first and named
    none. ``""`` when the two are not both mappings.
    """
    if not (isinstance(mine, Mapping) and isinstance(theirs, Mapping)):
        return ""
    for key in sorted(set(mine) | set(theirs), key=str):
        a, b = mine.get(key), theirs.get(key)
        if canonical(a) != canonical(b):
            shown_as = shown_key(key)
            return f" (the ledger: {shown_as} = {shown(a)}, {name}: {shown_as} = {shown(b)})"
    return ""
