"""The privacy ledger of a run directory: the record of what every released round released.

``privacy_ledger.jsonl`` opens with a header (the accountant, δ and the run's privacy-relevant
settings) and gets one fsynced line per released round *before* anything of the round leaves the
process (metrics row, checkpoint, next broadcast): the round, the privacy events it released
(sampling kind and rate, noise multiplier, count), the accountant, the cumulative event count and
a SHA-256 of the released model. ε in the summary and after a resume is composed from these
lines, never from ``config.toml``; a resume whose configuration differs from the header in a
privacy-relevant key is refused naming the key, and a checkpoint whose accountant does not match
the ledger is refused (:class:`RunLedger`). A file this version would not have written is refused
naming its line.

Ledgers of earlier versions recorded event counts only. They are converted conservatively when a
checkpoint can be read (its accountant, plus the rounds the metrics show after it, plus whatever
count the old file claims beyond that, all charged), and refused otherwise
(:meth:`RunLedger.convert`, :mod:`fedprivopt.simulation.ledger_convert`).

What one line holds and how a file's lines are checked: :mod:`fedprivopt.simulation.ledger_lines`;
the checks of a resumed run against the ledger: :mod:`fedprivopt.simulation.ledger_checks`.
Who may write into the directory, and when a failed start removes it:
:mod:`fedprivopt.simulation.rundir`.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fedprivopt.privacy.accounting import PrivacyAccountant, compose_epsilon
from fedprivopt.privacy.accounting_state import merge_ledger
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.simulation.files import (
    LEDGER_FILE,
    atomic_write,
    json_line,
    parse_json,
    read_lines,
    write_synced,
)
from fedprivopt.simulation.ledger_checks import LedgerChecks
from fedprivopt.simulation.ledger_convert import LedgerConversion, check_accountant_kind
from fedprivopt.simulation.ledger_lines import (
    HEADER_RECORDS,
    LEDGER_VERSION,
    OLD_LEDGER_SUFFIX,
    Ledger,
    LedgerEntry,
    OldLedgerError,
    count_events,
    params_sha256,
    parse_lines,
    privacy_settings,
    released_json,
    released_less,
    replay_order,
    round_released,
)

__all__ = [
    "LedgerEntry",
    "OldLedgerError",
    "RunLedger",
    "params_sha256",
    "privacy_settings",
]

_log = logging.getLogger(__name__)


def _whole_object(text: str) -> bool:
    """Whether ``text`` is a whole JSON object (not the prefix of a line cut while written)."""
    try:
        return isinstance(parse_json(text), dict)
    except ValueError:
        return False


class RunLedger(LedgerChecks, LedgerConversion):
    """The privacy ledger of one run directory (``privacy_ledger.jsonl``).

    Use :meth:`read` or :meth:`create`. The in-memory :attr:`entries` mirror the file; every
    :meth:`append` is fsynced before it returns.
    """

    def __init__(self, path: Path, header: dict[str, Any], entries: list[LedgerEntry]) -> None:
        self.path = path
        self.header = header
        self.entries = entries
        self._total = merge_ledger(p for e in entries for p in e.released)
        self.replay: list[LedgerEntry] = []
        # a seeded resume's earlier releases of the rounds it redoes, by (kind, round): each redo
        # draws their cohort and noise again, so it must come out as each of them did
        self._redone: dict[tuple[str, int], list[LedgerEntry]] = {}
        self._partial: tuple[int, Ledger] | None = None  # the running round's recorded part
        self._torn_at: int | None = None  # where a torn last line starts; cut at the next append
        self._unterminated = False  # a whole last line lacking its newline: ended on append

    # -- files ------------------------------------------------------------------------------

    @staticmethod
    def header_for(
        config,
        accountant: PrivacyAccountant,
        data: Mapping[str, Any] | None = None,
        tuning_plan: str | None = None,
    ) -> dict[str, Any]:
        """The header line of a new ledger for ``config`` and its algorithm's accountant.

        ``data``: the task's :func:`~fedprivopt.models.task.data_identity`, if it has one.
        ``tuning_plan``: for a trial of ``fedprivopt tune``, the digest of the plan that drew it
        (:func:`~fedprivopt.simulation.tune_plan.plan_digest`), which ``compare-tuned`` checks
        against ``tune.json``.
        """
        header = {
            "ledger": LEDGER_VERSION,
            "kind": "header",
            "round": 0,
            "events": 0,
            "accountant": accountant.accountant,
            "pld_discretization": accountant.pld_discretization,
            "prv_eps_error": accountant.prv_eps_error,
            "delta": config.strategy.delta,
            "private": bool(config.strategy.private),
            "settings": privacy_settings(config),
            "records": list(HEADER_RECORDS),
        }
        if data is not None:
            header["data"] = dict(data)
        if tuning_plan is not None:
            header["tuning_plan"] = tuning_plan
        return header

    @classmethod
    def create(
        cls,
        out: Path,
        config,
        accountant: PrivacyAccountant,
        data: Mapping[str, Any] | None = None,
        tuning_plan: str | None = None,
    ) -> RunLedger:
        """Write a new ledger (its header) into ``out``.

        The file must not exist, or hold no complete line (a start killed while writing the
        header, whose debris :meth:`read` reports as no ledger). ``data``, ``tuning_plan``: as
        in :meth:`header_for`.
        """
        header = cls.header_for(config, accountant, data, tuning_plan)
        path = out / LEDGER_FILE
        debris = path.is_file() and b"\n" not in path.read_bytes()
        write_synced(path, json_line(header), mode="w" if debris else "x")
        return cls(path, header, [])

    @classmethod
    def write_converted(
        cls, out: Path, header: dict[str, Any], lines: list[dict[str, Any]]
    ) -> RunLedger:
        """Replace the ledger of ``out`` by ``header`` + ``lines`` (an older one is kept aside).

        The older one is copied aside first and then replaced in one rename, so that a kill at
        any moment leaves it or the new ledger under its name. Forty-second review of issue 15
        (ledger, finding 4): it was renamed aside before the new one was written, and a resume
        killed between the two left no ledger: the next resume rebuilt one from the checkpoint
        alone, without the events the earlier version's ledger counted beyond it (a secure run's
        released rounds after its checkpoint: epsilon 18.41 where 22.11 was spent).
        """
        path = out / LEDGER_FILE
        if path.exists():
            atomic_write(out / (LEDGER_FILE + OLD_LEDGER_SUFFIX), path.read_bytes())
        text = "".join(json_line(x) for x in [header, *lines])
        atomic_write(path, text)
        return cls._parse(path, text.splitlines())

    @classmethod
    def read(cls, out: Path) -> RunLedger | None:
        """The ledger of ``out`` (``None`` if there is none).

        A torn last line (a write killed before its newline) is dropped; it was never followed
        by a release. It is cut off the file only by the next :meth:`append`, so reading (also
        for a resume that is then refused, or for a report) changes nothing. A file with no
        complete line (a start killed while writing the header) is no ledger (``None``).

        A last line that lacks only its newline (a whole JSON object) is not torn: a line is
        written in one piece, so it was edited (by a script that wrote no final newline, or an
        editor) and is read as the release it records; the next :meth:`append` ends it first.
        Thirty-first review of issue 15: it was dropped, and a secure run's resume then charged
        the round it recorded once for two releases.

        Raises
        ------
        OldLedgerError
            For a ledger of an earlier version (counts only).
        ValueError
            Naming the file and line, for anything this version would not have written.
        """
        path = out / LEDGER_FILE
        # a FIFO or a link to a device (ninth review); lines of at most LINE_LIMIT (twelfth)
        lines, torn_at = read_lines(path)
        unterminated = torn_at is not None and len(lines) > 1 and _whole_object(lines[-1])
        if torn_at is not None and not unterminated:
            lines.pop()
        if not lines:
            return None
        ledger = cls._parse(path, lines)
        ledger._torn_at = None if unterminated else torn_at
        ledger._unterminated = unterminated
        return ledger

    @classmethod
    def _parse(cls, path: Path, lines: list[str]) -> RunLedger:
        header, entries = parse_lines(path, lines)
        return cls(path, header, entries)

    def append(
        self,
        round_num: int,
        released: Ledger,
        digest: str | None,
        *,
        kind: str = "round",
        participants: str | None = None,
    ) -> None:
        """Append (and fsync) one released round (``participants``: a tree run's digest)."""
        events = (self.entries[-1].events if self.entries else 0) + count_events(released)
        line = {
            "kind": kind,
            "round": int(round_num),
            "events": events,
            "accountant": self.header["accountant"],
            "released": released_json(released),
            "params_sha256": digest,
        }
        if participants is not None:
            line["participants_sha256"] = participants
        if self._torn_at is not None:  # cut the torn line off first, so this one starts clean
            with open(self.path, "r+b") as fh:
                fh.truncate(self._torn_at)
                fh.flush()
                os.fsync(fh.fileno())
            self._torn_at = None
        text = ("\n" if self._unterminated else "") + json_line(line)
        write_synced(self.path, text, mode="a")
        self._unterminated = False
        number = (self.entries[-1].line if self.entries else 1) + 1
        self.entries.append(
            LedgerEntry(kind, int(round_num), released, events, digest, number, participants)
        )
        self._total = merge_ledger([*self._total, *released])

    # -- what was released ------------------------------------------------------------------

    @property
    def last_round(self) -> int:
        """The highest round the ledger records (0 if none)."""
        return max((e.round for e in self.entries), default=0)

    def total(self) -> Ledger:
        """Every event released, merged."""
        return self._total

    def prefix(self, n: int) -> Ledger:
        """The events of the first ``n`` entries, merged."""
        return merge_ledger(p for e in self.entries[:n] for p in e.released)

    def epsilon(self, delta: float | None = None) -> float:
        """ε of everything released at ``delta``, by default the header's (``inf`` if not private).

        A report passes the δ it shows beside ε (the run's ``config.toml``'s), so that the pair
        holds whatever the header says.
        """
        if not self.header["private"]:
            return math.inf
        return compose_epsilon(
            self._total,
            self.header["delta"] if delta is None else delta,
            accountant=self.header["accountant"],
            pld_discretization=self.header["pld_discretization"],
            prv_eps_error=self.header["prv_eps_error"],
        )

    def restore(self, accountant: PrivacyAccountant, round_num: int, checkpoint: str | None,
                *, secure: bool) -> None:  # fmt: skip
        """Set ``accountant`` from the ledger for a run restored at ``round_num``.

        ``accountant`` holds the restored checkpoint's state (empty for a restart from round 0).
        A checkpoint of round ``k`` must hold exactly the events of the ledger up to the last
        line of round ``k`` (what was released when it was written); otherwise ``ValueError``.
        Seeded runs whose later lines are exactly rounds ``k+1, k+2, …`` replay them: a redone
        round whose model digest equals its first release's is the same release (not charged
        again); one that differs is refused, nothing of it released (:meth:`_replayed`). In
        every other case (secure mode, or no digests, or lines out of replay order) the
        accountant starts with the whole ledger and each redone round is a new release; a
        seeded one must still equal every recorded release of its round (:meth:`_check_redone`).
        The checkpoint's accountant must also be the header's (kind, PLD discretization, PRV
        error bound).
        """
        start = 0
        if checkpoint is not None:
            check_accountant_kind(accountant, self.header, checkpoint, self.path.name)
            ends = [e.round == round_num and e.kind != "partial" for e in self.entries]
            anchors = [i for i, end in enumerate(ends) if end]
            if not anchors:
                raise ValueError(
                    f"{checkpoint} is a checkpoint of round {round_num}, but {self.path.name} "
                    f"records no release of round {round_num} (it ends at round "
                    f"{self.last_round}): the ledger or the checkpoint was edited; refusing to "
                    "resume"
                )
            start = anchors[-1] + 1
            expected = self.prefix(start)
            if accountant.ledger != expected:
                have, want = accountant.num_events, count_events(expected)
                relation = "fewer than" if have < want else "more than" if have > want else ""
                raise ValueError(
                    f"{checkpoint} records {have} privacy events at round {round_num}, "
                    f"{relation or 'other events than'} the {want} that {self.path.name} shows "
                    "were released by "
                    "then: the checkpoint or the ledger was edited; refusing to resume"
                )
        rest = self.entries[start:]
        self._partial = None
        self._redone = {}
        if not secure:
            for entry in self.entries:
                if entry.round > round_num and entry.params_sha256 and entry.kind != "carried":
                    self._redone.setdefault((entry.kind, entry.round), []).append(entry)
        if not secure and replay_order(rest, round_num):
            accountant.set_ledger(self.prefix(start))
            self.replay = list(rest)
        else:
            accountant.set_ledger(self._total)
            self.replay = []
            later = [e for e in rest if e.round > round_num]  # not a rebuilt ledger's carried
            if sum(count_events(e.released) for e in later):  # a tree period's rounds: none
                # thirty-fifth review of issue 15 (the lifecycle reviewer): said on every
                # resume of a run whose budget ends at its checkpoint, where no round is redone
                _log.warning(
                    "%d privacy events of rounds released after round %d stay accounted (epsilon "
                    "includes them); a round redone from round %d on is a new release",
                    sum(count_events(e.released) for e in later),
                    round_num,
                    round_num + 1,
                )

    # -- during a run -----------------------------------------------------------------------

    def record(
        self,
        round_num: int,
        events: Sequence[SubsampledGaussianEvent],
        params: torch.Tensor,
        accountant: PrivacyAccountant,
        participants: str | None = None,
    ) -> None:
        """Record round ``round_num`` before anything of it is released; set ``accountant``.

        ``events`` are what the round released (the line holds those not recorded by
        :meth:`record_partial` for this round already) and ``params`` the released model. A replayed
        round identical to its first release adds nothing (the accountant, which has just
        counted the round, then equals the ledger up to that line); anything else is appended
        (fsynced) and the accountant becomes the whole ledger.

        Raises
        ------
        ValueError
            A replayed round (seeded mode) that differs from its first release
            (:meth:`_replayed`).
        """
        released = round_released(events)
        partial, self._partial = self._partial, None
        if partial is not None and partial[0] == round_num:
            released = released_less(released, partial[1])
        digest = params_sha256(params)
        if self.replay:
            head = self._replayed(round_num, "round", released, digest)
            if accountant.num_events != head.events:
                accountant.set_ledger(self.prefix(self.entries.index(head) + 1))
            return
        self._check_redone(round_num, "round", digest)
        self.append(round_num, released, digest, participants=participants)
        accountant.set_ledger(self._total)

    def record_partial(
        self, round_num: int, events: Sequence[SubsampledGaussianEvent], point: torch.Tensor
    ) -> None:
        """Record the part of round ``round_num`` released before the round ends.

        ADADP sends its second cohort the half-step point, a function of the round's first
        noised sum, before the round's model exists. That release is recorded (fsynced) first,
        as a ``partial`` line with ``events`` and the digest of ``point``; the round's
        :meth:`record` then records the rest of its events. Thirty-third review of issue 15:
        with only the round's line, a run stopped between the two (a kill, a lost SuperLink)
        and resumed released cohort 1's sum again: in secure mode with fresh noise and the
        first release uncharged, in seeded mode with the same noise, so the two points'
        difference revealed the difference of the two sums without noise. The accountant is
        set by the round's :meth:`record`.

        Raises
        ------
        ValueError
            A replayed round (seeded mode) whose point differs from its first release's:
            nothing of it is released (see :meth:`record`).
        """
        released = round_released(events)
        digest = params_sha256(point)
        if self.replay and self.replay[0].kind == "round" and self.replay[0].round == round_num:
            self._partial = (round_num, ())  # a line of a version without partial lines
            return
        if self.replay:
            self._replayed(round_num, "partial", released, digest)
        else:
            self._check_redone(round_num, "partial", digest)
            self.append(round_num, released, digest, kind="partial")
        self._partial = (round_num, released)

    def _replayed(self, round_num: int, kind: str, released: Ledger, digest: str) -> LedgerEntry:
        """Take the next replayed line, which must be this release (seeded resume).

        Raises
        ------
        ValueError
            If it is not: the redone round drew its first release's cohort and noise (the
            seed's), so releasing it too would reveal the difference of the two without noise,
            which no charge covers: nothing of it is released or written (twenty-ninth review
            of issue 15; it used to be charged as a second release, and under tree aggregation
            inside a restart period not at all).
        """
        head = self.replay[0]
        if (head.kind, head.round, head.released, head.params_sha256) != (
            kind, round_num, released, digest,
        ):  # fmt: skip
            raise self._unlike_first(round_num, kind, head)
        return self.replay.pop(0)

    def _check_redone(self, round_num: int, kind: str, digest: str) -> None:
        """Refuse a seeded redo unlike a release of its round that the ledger records.

        A seeded resume whose later lines are not rounds ``k+1, k+2, …`` in order (lines
        swapped, or one repeated, by hand) is not replayed (:meth:`restore`): its redone rounds
        are charged again. Each still draws the seed's cohort and noise of every earlier
        release of its round, so it must be that release. Thirty-eighth review of issue 15
        (ledger, finding 1): a ledger whose lines of rounds 4 and 5 were swapped turned the
        comparison off, and a round 4 that came out otherwise was released with its first
        release's noise, rc 0.

        Raises
        ------
        ValueError
            As :meth:`_replayed`; nothing of the round is released or written.
        """
        for entry in self._redone.get((kind, round_num), ()):
            if entry.params_sha256 != digest:
                raise self._unlike_first(round_num, kind, entry)

    def _unlike_first(self, round_num: int, kind: str, first: LedgerEntry) -> ValueError:
        """The refusal of a seeded redo of ``round_num`` unlike its release on line ``first``."""
        what = "its first cohort's point" if kind == "partial" else "it"
        return ValueError(
            f"round {round_num}, redone from the checkpoint, came out other than its first "
            f"release (line {first.line} of {self.path.name}): with the seed's noise again, "
            f"releasing {what} would reveal the difference of the two without noise, so "
            "nothing of it was released; a client that failed or answered differently, "
            "another device, another engine, vectorize or (on a GPU) cohort-chunk or "
            "fast-actors setting (their trainers differ in float rounding) or edited code "
            "changes a redone round: resume where those are as they were, or start a new run"
        )
