"""Finished runs as data: load run directories and the ε their files state.

:func:`load_run` reads one run directory (ε from its privacy ledger, or its newest checkpoint's
accountant, final metrics from its metrics rows, :attr:`RunData.warnings` for what was
tolerated); :func:`load_runs` a run, a ``compare`` output or a folder of runs. Grouping them by
(strategy, σ) and aggregating over seeds: :mod:`fedprivopt.simulation.rundata_aggregate`; the
report built from them: :mod:`fedprivopt.simulation.report`. A summary read against the run's
``config.toml``, ledger header and rows (and :func:`check_summary_rounds`, re-exported here):
:mod:`fedprivopt.simulation.rundata_summary`.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedprivopt.core import checks
from fedprivopt.core.files import refuse_url
from fedprivopt.core.text import shown
from fedprivopt.simulation.divergence import (
    DIVERGED_KEY,
    checked_round,
    earliest,
    first_diverged,
)
from fedprivopt.simulation.files import (
    CONFIG_FILE,
    LEDGER_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    check_run_files,
    parse_json,
    read_rows,
    stated_epsilons,
)
from fedprivopt.simulation.rundata_epsilon import (
    accounted_epsilon,
    beside_epsilons,
    checkpoint_epsilon_header,
    composed_delta,
    is_delta,
    note_copied_plan,
    trial_note,
)
from fedprivopt.simulation.rundata_summary import (
    check_rows,
    check_summary_rounds,
    configured_summary,
    no_round,
    recorded_summary,
)

__all__ = [
    "RunData",
    "RunWarning",
    "as_float",
    "dedup_rounds",
    "load_run",
    "load_runs",
    "trial_note",
]

_REQUIRED_SUMMARY_KEYS = ("strategy", "noise_multiplier", "seed", "epsilon", "delta")
_RUN_MARKS = (LEDGER_FILE, METRICS_FILE)
"""Files that make a directory a run's: its ledger is written before its first round."""


class RunWarning(UserWarning):
    """A note on the runs of a report (a file tolerated or disagreeing), also listed in it."""


@dataclass(frozen=True)
class RunData:
    """One run directory, as loaded by :func:`load_run`.

    Attributes
    ----------
    summary : dict
        Parsed ``summary.json``, its run's identity (``strategy``, ``noise_multiplier``,
        ``seed``), ``delta`` and ``config`` taken from the run's ``config.toml`` when it has one
        (the configuration ``--resume`` and ``compare`` check against the privacy ledger).
    rows : list of dict
        Parsed ``metrics.jsonl`` rows, in file order.
    path : pathlib.Path
        The run directory.
    warnings : tuple of str
        What was tolerated while loading (a truncated final line, a summary whose ε is not the
        ledger's).
    ledger_epsilon : float or None
        The largest ε the run's files state: its privacy ledger composed (without a ledger: its
        newest checkpoint's accountant), ``summary.json`` and the metrics rows (an edit of one
        cannot lower what the report shows).
    """

    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    path: Path
    warnings: tuple[str, ...] = field(default=())
    ledger_epsilon: float | None = None

    @property
    def strategy(self) -> str:
        """Strategy name."""
        return str(self.summary["strategy"])

    @property
    def noise_multiplier(self) -> float:
        """Noise multiplier σ."""
        return as_float(self.summary["noise_multiplier"])

    @property
    def seed(self) -> int:
        """Seed of the run."""
        return int(self.summary["seed"])

    @property
    def epsilon(self) -> float:
        """ε spent by the run: the largest its files state (``inf`` if not private)."""
        if self.ledger_epsilon is not None:
            return self.ledger_epsilon
        return as_float(self.summary["epsilon"])

    @property
    def delta(self) -> float:
        """δ at which :attr:`epsilon` holds."""
        return as_float(self.summary["delta"])

    @property
    def rounds_completed(self) -> int:
        """Completed rounds: the summary's, but never fewer than the largest round in the rows.

        Thirty-seventh review of issue 15 (reports, finding 5): ``write_report(out,
        load_runs(R))`` of a 2-round run whose ``summary.json`` says ``rounds_completed`` 1
        reported "rounds 1" beside the final metrics of round 2 (reports take them from the
        rows, which a summary edited alone cannot change); the rows are written as the rounds
        complete, so no run has a row past its completed rounds.
        """
        most = max((int(r["round"]) for r in self.rows), default=0)
        if "rounds_completed" in self.summary:
            return max(int(self.summary["rounds_completed"]), most)
        return most

    def has_metric(self, metric: str) -> bool:
        """Whether the final results or any row report ``metric``."""
        return metric in self._final() or any(metric in r for r in self.rows)

    def _final(self) -> dict[str, Any]:
        """``summary.json``'s ``final`` block; anything but a mapping is none (an edit).

        Thirty-second review of issue 15 (resume, finding 4): a ``final`` edited to a string,
        list or number was a ``TypeError`` from :meth:`has_metric` or :meth:`final_value`.
        """
        final = self.summary.get("final")
        return final if isinstance(final, dict) else {}

    def final_value(self, metric: str) -> float:
        """``metric`` from the last metrics row that has it, else the summary's ``final`` block.

        The rows are what each round recorded as it happened; ``summary.json`` repeats the last
        one and is only the fallback.
        """
        for row in reversed(dedup_rounds(self.rows)):
            if metric in row:
                return as_float(row[metric])
        final = self._final()
        return as_float(final[metric]) if metric in final else math.nan

    def diverged(self, metric: str) -> int | None:
        """The first round whose model or evaluation was not finite (``None``: none shown).

        The earliest of ``summary.json``'s ``diverged`` and the first round whose row has a
        non-finite ``eval_loss`` or ``metric`` (:mod:`~fedprivopt.simulation.divergence`): an
        edited summary cannot hide what the rows show, and a run written before summaries had
        the key is read from its rows.
        """
        stated = checked_round(self.summary.get(DIVERGED_KEY))
        return earliest(stated, first_diverged(self.rows, metric))

    def curve(self, metric: str) -> dict[int, float]:
        """``{round: value}`` for the rows reporting ``metric`` (a repeated round: last wins)."""
        return {int(r["round"]): as_float(r[metric]) for r in self.rows if metric in r}

    def seconds_per_round(self) -> float:
        """Mean of the finite ``seconds`` of rounds ≥ 1 (round 0 is the initial evaluation)."""
        secs = [as_float(r.get("seconds")) for r in dedup_rounds(self.rows) if int(r["round"]) >= 1]
        secs = [s for s in secs if math.isfinite(s)]
        return float(np.mean(secs)) if secs else math.nan


def load_run(path: str | Path) -> RunData:
    """Load one run directory.

    Parameters
    ----------
    path : str or pathlib.Path
        Directory holding ``metrics.jsonl`` and ``summary.json``.

    Returns
    -------
    RunData

    Raises
    ------
    ValueError
        If a file is missing or malformed; the message names the file (and line). Also for a
        run that is not finished: a ledger or rows but no ``summary.json`` (continue it with
        ``--resume``). A final line of ``metrics.jsonl`` with no newline that does not parse
        is the trace of a run killed mid-write: it is skipped and noted in
        :attr:`RunData.warnings`.
    """
    refuse_url("path", path)  # forty-sixth review of issue 15 (follow-up outputs, open)
    path = Path(path)
    check_run_files(path)  # a FIFO or a link to a device (issue 15, ninth review)
    summary_path, metrics_path = path / SUMMARY_FILE, path / METRICS_FILE
    _refuse_unfinished(path)
    for p in (summary_path, metrics_path):
        if not p.is_file() and not (p == metrics_path and no_round(summary_path)):
            raise ValueError(f"{p}: missing (is {path} a fedprivopt run directory?)")
    try:
        summary = parse_json(summary_path.read_text(encoding="utf-8"))
    except ValueError as exc:  # also nested too deeply, or an integer too long to read
        raise ValueError(f"{summary_path}: not valid JSON ({exc})") from exc
    if not isinstance(summary, dict):
        raise ValueError(f"{summary_path}: expected a JSON object, got {type(summary).__name__}")
    missing = [k for k in _REQUIRED_SUMMARY_KEYS if k not in summary]
    if missing:
        raise ValueError(f"{summary_path}: missing keys {missing}")
    if "rounds_completed" in summary:
        check_summary_rounds(summary["rounds_completed"], summary_path)

    notes: list[str] = []
    raw = summary  # as summary.json states it (its rows' digest: check_rows)
    configured = configured_summary(path, summary, notes)  # a new mapping when config.toml was read
    # the file δ comes from: config.toml, or without a readable one summary.json (finding 4)
    where = CONFIG_FILE if configured is not summary else SUMMARY_FILE
    seed = configured["seed"]  # the summary's own when there is no config.toml (finding 9)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"{summary_path} is unreadable (seed must be an integer >= 0, got "
                         f"{shown(seed)})")  # fmt: skip
    summary = recorded_summary(path, configured, notes, configured=where == CONFIG_FILE)
    rows = read_rows(metrics_path, skipped=notes)
    known = stated_epsilons(rows, summary)  # every ε the run directory states, by file
    accounted = accounted_epsilon(path, notes, summary.get("delta"), where)
    if not is_delta(summary.get("delta")):
        summary = composed_delta(summary, accounted, known, summary_path, notes)
    if accounted is not None:
        accounted = accounted[:2]
        known.insert(0, accounted)
        if accounted[0] == LEDGER_FILE:
            # thirty-sixth review of issue 15 (the ledger reviewer's report): a ledger cut to
            # its first round beside rows and a summary lowered to its ε was reported at round
            # 1's ε (7.55) while the checkpoint's accountant held the 5 rounds released (15.03)
            delta = summary.get("delta")
            at = delta if is_delta(delta) else None
            with contextlib.suppress(ValueError):  # a damaged checkpoint: the ledger stands
                found = checkpoint_epsilon_header(path, at)
                if found is not None:
                    known.append((f"{found[0]} (its accountant)", found[1]))
                    note_copied_plan(path, found[0], found[4], notes)
                # forty-eighth review (ledger 3): a newer checkpoint beside an older copy's files
                most = max(v for _, v in known)
                known.extend(e for e in beside_epsilons(path, at) if e[1] > most * (1 + 1e-6))
    spent = max(v for _, v in known) if known else None
    if known and any(not math.isclose(v, spent, rel_tol=1e-6) for _, v in known):
        stated = ", ".join(f"{k} {v:.6g}" for k, v in known)
        notes.append(
            f"{path}: its files state different epsilons ({stated}); the largest is reported"
        )
    check_rows(path, rows, raw, notes)
    return RunData(summary, rows, path, tuple(notes), spent)


def _refuse_unfinished(path: Path) -> None:
    """Refuse a run directory holding a run's files but no ``summary.json``: it is not finished.

    Forty-fifth review follow-up of issue 15 (ledger, finding 2): ``load_run(R)`` of an
    interrupted run (config, ledger, checkpoint and rows, killed before its summary) said
    ``R/summary.json: missing (is R a fedprivopt run directory?)``, where ``load_runs`` of its
    parent said that it is not finished and to continue it with ``--resume``.
    """
    if (path / SUMMARY_FILE).exists() or not any((path / f).exists() for f in _RUN_MARKS):
        return
    raise ValueError(
        f"{path}: a run without {SUMMARY_FILE}: it is not finished (interrupted, or still "
        "running); continue it with --resume"
    )


def _refuse_tunings(root: Path) -> None:
    """Refuse a tuning directory, or a tuned comparison, given to :func:`load_runs`.

    Fortieth review of issue 15 (reports, finding 5): ``load_runs(T)`` of a ``tune`` output said
    ``T/metrics.jsonl: missing (is T a fedprivopt run directory?)`` (its ``summary.json`` is the
    tuning's), and of a ``compare --tune-grid`` output "no run directories found": neither said
    that a tuning's released run is reported at the tuning's ε, which ``load_runs`` does not
    compute.
    """
    from fedprivopt.simulation.tune_plan import PLAN_FILE

    how = "report it with compare-tuned (or fedprivopt.simulation.tune_report.load_tuned)"
    if (root / PLAN_FILE).is_file():
        raise ValueError(
            f"{root} is a tuning (it holds {PLAN_FILE}): its released run's epsilon is the "
            f"tuning's, which load_runs does not compute; {how}"
        )
    tunings = root / "tune"  # cli_compare_tune.TUNE_DIR
    if not (root / "runs").is_dir() and tunings.is_dir():
        with contextlib.suppress(OSError):
            if any((d / PLAN_FILE).is_file() for d in tunings.iterdir()):
                raise ValueError(
                    f"{root} is a tuned comparison (compare --tune-grid): its cells are the "
                    f"tunings in {tunings}; {how}"
                )


def load_runs(root: str | Path) -> list[RunData]:
    """Load a run directory, a ``compare`` output (``root/runs/*``) or a folder of runs.

    Raises
    ------
    ValueError
        If no run directory is found, one of them fails :func:`load_run`, or one is not finished:
        it holds a run's files but no ``summary.json`` (interrupted, stopped again after a
        ``--resume``, or still running). Thirty-fifth review of issue 15 (outputs, finding 3):
        such a directory was left out without a word, so ``compare-tuned T --untuned C`` of a
        ``compare --seeds 3`` stopped during its third seed reported the row over 2 seeds
        (rc 0), where an unfinished run that kept an earlier ``summary.json`` is refused.
    """
    refuse_url("root", root)  # forty-sixth review of issue 15 (follow-up outputs, open)
    root = Path(root)
    _refuse_tunings(root)
    if any((root / f).exists() for f in (SUMMARY_FILE, *_RUN_MARKS)):
        return [load_run(root)]  # a run without summary.json refused as unfinished (follow-up)
    parent = root / "runs" if (root / "runs").is_dir() else root
    dirs = sorted(p for p in parent.glob("*") if p.is_dir() and (p / SUMMARY_FILE).exists())
    if not dirs:
        raise ValueError(f"{root}: no run directories (with {SUMMARY_FILE}) found")
    # forty-fourth review follow-up (ledger 1): a run or folder of runs beside root/runs was
    # left out without a word (D/runs read, the run D/S not); a compare output holds none
    for d in sorted(root.glob("*")) if parent != root else ():
        if d != parent and d.is_dir() and _holding_runs(d, itself=True) is not None:
            raise ValueError(
                f"{d} is a run or holds runs, beside {parent}: only the run directories in "
                f"{parent} are read, so it would be left out; move it into {parent} or give "
                "it on its own (load_runs, compare-tuned --untuned)"
            )
    for d in sorted(parent.glob("*")):
        if not d.is_dir():
            continue
        # forty-fourth review of issue 15 (reports, finding 2): a folder of runs that also held
        # a compare output was read without its runs (they are in its runs/), no word; a
        # tuning in it was refused as a run without metrics.jsonl
        _refuse_tunings(d)
        inside = _holding_runs(d) if d not in dirs else None
        if inside is not None:
            what = f"a compare output (its runs are in {inside})" if inside == d / "runs" else (
                "a folder of runs")  # fmt: skip
            raise ValueError(
                f"{d} is {what}, not a run of {parent}: the run directories directly in "
                f"{parent} are read, so its runs would be left out; give {d} on its own "
                "(load_runs, compare-tuned --untuned)"
            )
        if d not in dirs and any((d / f).exists() for f in _RUN_MARKS):
            raise ValueError(
                f"{d}: a run without {SUMMARY_FILE}: it is not finished (interrupted, or still "
                f"running); continue it with --resume, or move it out of {parent}, to report "
                f"the runs of {root}"
            )
    return [load_run(d) for d in dirs]


def _holding_runs(path: Path, *, itself: bool = False) -> Path | None:
    """A directory under ``path`` holding a run (``path`` too if ``itself``), else ``None``.

    ``path/runs`` or ``path`` when one of their subdirectories is a run (forty-fourth review,
    reports 3), else the first deeper one found among at most :data:`_SEARCHED` directories
    (follow-up, ledger 2: ``D/E/F/S2`` was left out of ``load_runs(D)`` without a word), a run
    there being a directory with a ledger, or with ``summary.json`` and ``config.toml``.
    """
    marks = (SUMMARY_FILE, *_RUN_MARKS)
    if itself and any((path / f).exists() for f in marks):
        return path
    for where in (path / "runs", path):
        with contextlib.suppress(OSError):
            if where.is_dir() and any(
                x.is_dir() and any((x / f).exists() for f in marks) for x in where.iterdir()
            ):
                return where
    for n, (where, _, files) in enumerate(os.walk(path)):  # links not followed; errors skipped
        if n >= _SEARCHED:
            break
        if where != str(path) and (LEDGER_FILE in files or {SUMMARY_FILE, CONFIG_FILE} <= {*files}):
            return Path(where).parent  # a run's own marks: another tool's summary.json is none
    return None


_SEARCHED = 10_000
"""Directories :func:`_holding_runs` looks into below a subdirectory of a folder of runs."""


def as_float(value: Any) -> float:
    """A float from a JSON value; ``None`` and non-numbers become NaN.

    An integer beyond the floats is an infinity of its sign (thirty-second review of issue 15,
    resume finding 1: ``float()``'s ``OverflowError`` escaped as a traceback).
    """
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        return checks.as_float(value)
    except (TypeError, ValueError):
        return math.nan


def dedup_rounds(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows sorted by round; a round written twice (a resumed run) keeps its last row."""
    by_round = {int(r["round"]): r for r in rows}
    return [by_round[k] for k in sorted(by_round)]
