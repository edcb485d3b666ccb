"""A tuning's ``--out`` directory: what ``tune`` writes there, and what it refuses to find.

``tune`` writes ``runs/`` (one run directory per trial, :data:`TUNE_FILES` beside it: the
summary and report), ``tune.json`` and, while it runs, :data:`TUNE_LOCK`. :func:`check_tune_dir`
refuses an ``--out`` holding anything else before anything runs, :func:`check_leftover_trials`
a ``runs/`` holding runs that are not trials of this call's plan, :func:`check_vanished_trials`
a trial the earlier call's summary states ran whose files are gone, and :func:`remove_outputs`
removes an earlier call's summary and report before any trial changes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from fedprivopt.simulation.files import CONFIG_FILE

__all__ = [
    "TUNE_ENTRIES",
    "TUNE_FILES",
    "TUNE_LOCK",
    "check_leftover_trials",
    "check_tune_dir",
    "check_vanished_trials",
    "remove_outputs",
]

TUNE_LOCK = "tune.lock"
TUNE_FILES = ("summary.json", "report.md", "trials.csv", "trials.png")
TUNE_ENTRIES = frozenset({"runs", *TUNE_FILES, TUNE_LOCK, "tune.json"})


_TRIAL_NAME = re.compile(r"trial-[0-9]+\Z")
"""What :func:`~fedprivopt.simulation.tune.draw_trials` names a trial's run directory."""


def _is_ours(path: Path, kind: str) -> bool:
    """Whether ``path`` is a small regular JSON file whose ``"kind"`` is ``kind``."""
    from fedprivopt.simulation.files import SMALL_FILE_LIMIT

    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > SMALL_FILE_LIMIT:
            return False
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("kind") == kind


def _is_dir(path: Path) -> bool:
    """Whether ``path`` is a directory and no link."""
    return path.is_dir() and not path.is_symlink()


def _foreign_beside_runs(out: Path, names: list[str]) -> list[str]:
    """The entries that make ``out`` (holding ``runs`` and only tune's names) not a tuning's.

    Twenty-seventh review of issue 15: ``tune --out P``, where ``P`` held an empty ``runs/``
    and the user's ``report.md``, ``summary.json`` and ``trials.csv``, replaced all three
    (rc 0). ``runs/`` of a tuning holds only trials' run directories (``trial-NNN``), a report
    stands beside at least one trial or tune's own ``tune.json`` (written before the first
    trial), and ``summary.json`` is tune's (``"kind": "fedprivopt-tune"``). Beside tune's own
    ``tune.json`` a stray entry of ``runs/`` is left to :func:`check_leftover_trials`, which
    names it to remove, and a damaged ``tune.json`` beside a trial to the plan check.
    """
    runs = out / "runs"
    if not _is_dir(runs):
        return ["runs"]
    if "summary.json" in names and not _is_ours(out / "summary.json", "fedprivopt-tune"):
        return ["summary.json"]
    trials = sorted(p.name for p in runs.iterdir())
    # a trial counts only when it holds a run (twenty-ninth review: an empty runs/trial-001/
    # beside the user's report let it be replaced)
    ran = any((runs / n / CONFIG_FILE).is_file() for n in trials)
    if "tune.json" in names:  # beside trials, a damaged plan is named by the plan check
        ours = ran or _is_ours(out / "tune.json", "fedprivopt-tune-plan")
        return [] if ours else ["tune.json"]
    foreign = [f"runs/{n}" for n in trials if not _TRIAL_NAME.match(n) or not _is_dir(runs / n)]
    reports = [n for n in names if n in TUNE_FILES]
    if not foreign and reports and not ran:
        foreign = reports  # a report with no trial and no plan beside it: not one tune wrote
    return foreign


def check_tune_dir(out: str | Path) -> None:
    """Refuse an ``--out`` that holds anything but an earlier tuning's files.

    ``tune`` writes ``runs/`` (one directory per trial), ``summary.json``, ``report.md``,
    ``trials.csv`` and ``trials.png``; a directory with other entries is refused before
    anything runs, as ``compare`` refuses one (also with ``--overwrite``).

    Raises
    ------
    ValueError
        Naming the directory and up to three foreign entries.
    """
    out = Path(out)
    if not out.is_dir():
        return
    names = sorted(p.name for p in out.iterdir())
    foreign = [n for n in names if n not in TUNE_ENTRIES]
    if names and "runs" not in names:
        foreign = foreign or names
    if names and not foreign:
        foreign = _foreign_beside_runs(out, names)
    if foreign:
        listed = ", ".join(repr(n[:60]) for n in foreign[:3]) + (
            ", ..." if len(foreign) > 3 else ""
        )
        raise ValueError(
            f"--out {str(out)!r} holds {listed}, which tune did not write: it writes only into a "
            "new or empty directory or an earlier tuning's; choose another --out"
        )


def check_leftover_trials(out: str | Path, labels: Sequence[str]) -> None:
    """Refuse an ``OUT/runs/`` that holds runs that are not trials of this call.

    Called after the plan check (:func:`~fedprivopt.simulation.tune_replan.check_plan`): what
    is left is a run that no plan of this directory drew (e.g. a ``simulate`` into
    ``runs/trial-009``) or a tuning's that ``tune.json`` no longer records. Reporting this call
    beside them would mix two tunings, and deleting them would lose results, so the message
    names the entries to remove (tenth review of issue 15, finding 3).
    """
    runs = Path(out) / "runs"
    if not runs.is_dir():
        return
    extra = sorted(p.name for p in runs.iterdir() if p.name not in set(labels))
    if extra:
        listed = ", ".join(repr(str(runs / n[:60])) for n in extra[:3])
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        one = len(extra) == 1
        raise ValueError(
            f"--out {str(out)!r}: runs/ holds {len(extra)} {'entry' if one else 'entries'} that "
            f"{'is' if one else 'are'} not a trial of this tuning's plan; remove "
            f"{listed}{more} to continue it, or choose another --out"
        )


def remove_outputs(out: str | Path) -> None:
    """Remove an earlier call's summary and report before any trial changes."""
    for name in TUNE_FILES:
        path = Path(out) / name
        if path.is_dir() and not path.is_symlink():
            raise ValueError(f"{path} is a directory, not a file tune wrote")
        path.unlink(missing_ok=True)


def check_vanished_trials(out: str | Path) -> None:
    """Refuse to run again a trial that the tuning's ``summary.json`` states ran, now gone.

    Called before :func:`remove_outputs` removes that summary. Forty-fifth review of issue 15
    (reports, finding 3): ``tune toy.toml --grid server-learning-rate=0.5,1 --mean-trials 2
    --rounds 1 --seed 3 --set secure=true``, ``rm -rf OUT/runs/trial-001`` (its run had
    finished, score 0.49), then the same command: rc 0, trial-001 run again with new noise
    (0.47) and the tuning still at epsilon 9.459 for one trial, where two runs of it were made
    and either could be the one released (retried until one scores well, the released trial
    is the best of more trials than K). ``compare-tuned`` refuses such a tuning while its
    summary is the earlier one (forty-third review follow-up, ledger 2); the rerun replaced
    it. A summary that cannot be read states nothing here (``compare-tuned`` checks it).

    Raises
    ------
    ValueError
        Naming the trial's directory and what the summary states.
    """
    from fedprivopt.simulation.files import LEDGER_FILE
    from fedprivopt.simulation.tune_trials import stated_run

    path = Path(out) / "summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError, RecursionError):
        return
    trials = summary.get("trials") if isinstance(summary, dict) else None
    for entry in trials if isinstance(trials, list) else ():
        name = entry.get("trial") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not _TRIAL_NAME.match(name):
            continue
        run_dir = Path(out) / "runs" / name
        ran = stated_run(entry)
        if not ran:
            continue
        if not (run_dir / CONFIG_FILE).exists() and not (run_dir / LEDGER_FILE).exists():
            what = f"its {CONFIG_FILE} and {LEDGER_FILE} are" if run_dir.is_dir() else "it is"
            raise ValueError(
                f"{run_dir}: {what} missing, but the trial ran ({ran}): run again, it would be a "
                "second run of one trial (with new noise in secure mode), which the tuning's "
                "epsilon does not count; put its directory back, or start another tuning in "
                "another --out"
            )
        _check_recorded_rounds(run_dir, entry.get("rounds_completed"), ran)


def _check_recorded_rounds(run_dir: Path, stated: object, ran: str) -> None:
    """Refuse a trial whose ledger and checkpoint record fewer rounds than its summary states.

    Forty-fifth review follow-up of issue 15 (ledger, finding 3): the same tune with
    ``trial-001``'s files removed but its ``config.toml`` (its ledger removed or cut to its
    header: an older backup put back) ran the trial again from round 1 with new noise (rc 0,
    score 0.4233 then 0.4333, or 0.5300), the tuning still at epsilon 9.459 for one trial.
    A ledger or checkpoint holding the stated rounds is resumed (rebuilt) as before.
    """
    from fedprivopt.simulation.checkpoint import newest_checkpoint
    from fedprivopt.simulation.files import LEDGER_FILE
    from fedprivopt.simulation.ledger import RunLedger

    if isinstance(stated, bool) or not isinstance(stated, int) or stated <= 0:
        return
    try:
        ledger = RunLedger.read(run_dir)
        recorded = 0 if ledger is None else ledger.last_round
        if recorded < stated:
            state, _ = newest_checkpoint(run_dir, problems={})
            recorded = max(recorded, int(state["algorithm"]["round"]) if state else 0)
    except (OSError, ValueError, TypeError, KeyError):
        return  # a damaged file: the resume (or compare-tuned) refuses it, naming it
    if recorded < stated:
        raise ValueError(
            f"{run_dir}: its {LEDGER_FILE} and checkpoints record {recorded} rounds, but the "
            f"trial ran ({ran}): run again, it would run its later rounds a second time (with "
            "new noise in secure mode), which the tuning's epsilon does not count; put its "
            "files back, or start another tuning in another --out"
        )
