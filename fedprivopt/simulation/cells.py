"""The cells of a ``fedprivopt compare`` grid, and the ``--out`` directory that holds them.

A grid puts one run directory per (strategy, noise multiplier, seed) under ``OUT/runs/``
(:func:`cell_label` names it); beside ``runs/`` a comparison writes its report
(:data:`REPORT_FILES`) and holds its lock (:data:`COMPARE_LOCK`), and :func:`check_compare_dir`
refuses an ``--out`` holding anything else. What each cell's plan is (run, resume, reuse or
rerun: :class:`CellPlan`, decided by :func:`~fedprivopt.simulation.cell_plans.plan_cells`) and
its finished run read back: :mod:`fedprivopt.simulation.cell_plans`; :func:`run_cell` carries a
plan out.

Bounds, checked before anything is allocated: at most :data:`MAX_SEEDS` seeds per cell and
:data:`MAX_CELLS` cells per grid. Each cell is a full run with its own directory (a checkpoint
of the model plus its metrics), and every cell's configuration is resolved and its task built
(validated) before the first run starts, so a grid of 10,000 cells already holds 10,000
configurations (a few kB each) and takes 10,000 task constructions to validate; beyond that a
grid is a typo, not an experiment.

Examples
--------
>>> cell_label("dp-fedavg", 0.5, 0)
'dp-fedavg__sigma0.5__seed0'
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedprivopt.core.text import cut_middle
from fedprivopt.core.text import shown as _short
from fedprivopt.simulation.config import RunConfig
from fedprivopt.simulation.files import CONFIG_FILE
from fedprivopt.simulation.rundir import lock_directory

__all__ = [
    "CELL_NAME",
    "MAX_CELLS",
    "MAX_SEEDS",
    "Cell",
    "CellPlan",
    "StaleCellError",
    "cell_label",
    "check_compare_dir",
    "check_not_reported",
    "check_vanished_cells",
    "grid",
    "leftover_note",
    "remove_report",
    "run_cell",
    "task_key",
]

MAX_SEEDS = 1_000
MAX_CELLS = 10_000
RUN, RESUME, REUSE, RERUN = "run", "resume", "reuse", "rerun"


def grid(
    strategies: Sequence[str],
    sigmas: Sequence[float],
    first_seed: int,
    seeds: int,
    mean_trials: float | None = None,
) -> list[tuple[str, float | None, int]]:
    """The (strategy, noise multiplier, seed) points of a grid; ``None`` for a non-private one.

    Non-private strategies run once per seed, the others at every noise multiplier. Checked
    before anything is built: every strategy registered and given once, every noise multiplier
    given once and naming its own run directory, ``1 <= seeds <=`` :data:`MAX_SEEDS` and at most
    :data:`MAX_CELLS` runs: points, or with ``mean_trials`` (``compare --tune-grid``, every
    point a tuning of that many trials on average) points times ``mean_trials``. Errors are
    ``ValueError`` naming the command-line flag.
    """
    from fedprivopt.strategies.config import NON_PRIVATE, STRATEGIES

    for i, name in enumerate(strategies):
        if name not in STRATEGIES:
            raise ValueError(
                f"argument --strategies: {_short(name)} is not one of {', '.join(STRATEGIES)}"
            )
        if name in strategies[:i]:
            raise ValueError(f"argument --strategies: {_short(name)} is given twice")
    seen: dict[str, int] = {}  # run directory name -> the first index naming it (linear time)
    for i, sigma in enumerate(sigmas):
        first = seen.setdefault(f"{sigma:g}", i)
        same = sigmas[first]
        if first != i and same == sigma:
            raise ValueError(f"argument --noise-multipliers: {sigma!r} is given twice")
        if first != i:
            raise ValueError(
                f"argument --noise-multipliers: {same!r} and {sigma!r} name the same run "
                f"directories (sigma{sigma:g}); give values that differ in 6 significant digits"
            )
    if not 1 <= seeds <= MAX_SEEDS:
        raise ValueError(f"argument --seeds: must be an integer in [1, {MAX_SEEDS}], got {seeds}")
    private = [name for name in strategies if name not in NON_PRIVATE]
    size = (len(private) * len(sigmas) + len(strategies) - len(private)) * seeds
    if size > MAX_CELLS:
        # thirteenth review: name the flags that multiply the grid, not always --seeds
        counts = (("--strategies", len(strategies)), ("--noise-multipliers", len(sigmas)))
        flags = [flag for flag, n in (*counts, ("--seeds", seeds)) if n > 1] or ["--seeds"]
        raise ValueError(
            f"argument {'/'.join(flags)}: the grid would hold {size:,} runs (strategies x noise "
            f"multipliers x seeds), more than the limit of {MAX_CELLS:,}"
        )
    if mean_trials is not None and size * mean_trials > MAX_CELLS:
        # tenth review of issue 15, finding 4: checked before any tuning is planned
        raise ValueError(
            f"argument --mean-trials/--seeds: the tuned grid would run about "
            f"{size * mean_trials:,.0f} trials ({size:,} tunings, strategies x noise multipliers "
            f"x seeds, of --mean-trials {mean_trials:g} each), more than the limit of "
            f"{MAX_CELLS:,} runs per grid"
        )
    return [
        (name, sigma, seed)
        for name in strategies
        for sigma in (sigmas if name in private else [None])
        for seed in range(first_seed, first_seed + seeds)
    ]


def task_key(config: RunConfig) -> tuple[str, str]:
    """What identifies ``config``'s task: its name and its parameters.

    The cells (or trials) that share a task build it, and read its data, once.
    """
    return config.task, json.dumps(config.task_params, sort_keys=True, default=str)


def cell_label(strategy: str, noise_multiplier: float, seed: int) -> str:
    """The run directory name of a cell, e.g. ``dp-fedavg__sigma0.5__seed0``."""
    return f"{strategy}__sigma{noise_multiplier:g}__seed{seed}"


@dataclass(frozen=True)
class Cell:
    """One (strategy, noise multiplier, seed) of a grid and its resolved configuration."""

    label: str
    config: RunConfig
    task: Any = field(default=None, compare=False, repr=False)
    """The config's task, built once for the cells that share it (``None``: built by the run)."""
    tuning_plan: str | None = None
    """For a trial of ``fedprivopt tune``: the digest of its plan, which the run's ledger header
    records (:meth:`~fedprivopt.simulation.ledger.RunLedger.check_tuning_plan`); an earlier run
    whose ledger names another plan is stale."""


@dataclass(frozen=True)
class CellPlan:
    """What :func:`run_cell` does with a cell.

    Attributes
    ----------
    cell : Cell
    run_dir : pathlib.Path
        ``OUT/runs/<label>``.
    action : {"run", "resume", "reuse", "rerun"}
    why : str
        For ``rerun``: what made the earlier run stale (the first differing key and its value,
        or the check it failed); for ``resume``: why it is unfinished.
    start : int
        For ``resume``: the round of the checkpoint it continues from (0: none readable).
    """

    cell: Cell
    run_dir: Path
    action: str
    why: str = ""
    start: int = 0

    def describe(self) -> str:
        """One phrase for the report: where this cell's run comes from."""
        # thirty-first review of issue 15 (compare, finding 10): "no checkpoint, …; continued
        # from its checkpoint" for a run that had none and started again from round 0
        start = (f"continued from its checkpoint of round {self.start}" if self.start else
                 "started again from round 0 (no checkpoint to continue from)")  # fmt: skip
        return {
            RUN: "ran in this call",
            RESUME: f"resumed with the same configuration: {self.why}; {start}",
            REUSE: "reused: finished earlier with the same configuration",
            RERUN: f"rerun (--overwrite): {self.why}",
        }[self.action]


class StaleCellError(ValueError):
    """A cell's run directory holds a run made with another configuration."""


#: What ``compare`` writes into its ``--out``: the cells' run directories and the report.
COMPARE_LOCK = "compare.lock"
"""Held by the one ``compare`` writing a directory, for the whole call."""

REPORT_FILES = ("summary.csv", "report.md", "metric_vs_round.png", "privacy_utility.png")
"""What :func:`~fedprivopt.simulation.report.write_report` writes beside ``runs/``."""

COMPARE_ENTRIES = frozenset({"runs", *REPORT_FILES, COMPARE_LOCK})


def remove_report(out: str | Path) -> None:
    """Remove an earlier comparison's report from ``out`` before any cell changes.

    A call that changes a cell and then stops (a signal, a cell locked by another process, a
    failing run) would otherwise leave the old ``summary.csv`` and ``report.md`` describing runs
    that are no longer there; as ``--resume`` removes ``summary.json``, the report goes first
    and is written again at the end. A symlink is removed, never its target.

    Raises
    ------
    ValueError
        If one of :data:`REPORT_FILES` is a directory.
    """
    for name in REPORT_FILES:
        path = Path(out) / name
        if path.is_dir() and not path.is_symlink():
            raise ValueError(f"{path} is a directory, not a report file compare wrote")
        path.unlink(missing_ok=True)


def leftover_note(out: str | Path, labels: Sequence[str], sub: str = "runs") -> str | None:
    """A note on the entries of ``out/sub`` that are not this call's cells (``None``: none).

    Forty-fifth review of issue 15 (reports, finding 2): ``compare toy.toml --strategies
    dp-fedavg,fedavg --rounds 2 --tensorboard --out C``, then the same with ``--strategies
    dp-fedavg --rounds 4`` (or other noise multipliers, fewer seeds; ``--tune-grid`` alike,
    its tunings in ``C/tune``) left the earlier call's 2-round fedavg run in ``C/runs`` without
    a word: ``tensorboard --logdir C``, which the help offers for a grid, showed it beside the
    fresh runs as one of them, and ``load_runs(C/runs)`` reported it. They are the user's
    results and are kept; the report and standard error now name them.
    """
    where = Path(out) / sub
    if not where.is_dir():
        return None
    wanted = set(labels)
    extra = sorted(p.name for p in where.iterdir() if p.is_dir() and p.name not in wanted)
    if not extra:
        return None
    listed = ", ".join(cut_middle(n) for n in extra[:5])
    more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
    kind = "runs" if sub == "runs" else "tunings"
    return (
        f"{where} also holds {len(extra)} {kind} of an earlier call that this call's grid does "
        f"not include ({listed}{more}): this report leaves them out, but tensorboard --logdir "
        f"{out} shows those with event files beside its own; remove them, or give a new grid "
        "another --out"
    )


def check_vanished_cells(out: str | Path, sub: str = "runs") -> None:
    """Refuse a call while a cell that the comparison's ``report.md`` lists is gone.

    Called before :func:`remove_report` removes that report. Forty-fifth review of issue 15
    (lead 4, the ledger follow-up's open row; reports 3 refused it for a tuning's trial):
    ``compare toy.toml --strategies dp-fedavg --seeds 2 --set secure=true --out C``, ``rm -rf
    C/runs/dp-fedavg__sigma0.5__seed1``, then the same command: rc 0, that seed run again with
    new noise and the report written again, its rows composed over 2 runs where 3 had been
    made (a seed retried until it scores well; ``--tune-grid`` alike with a cell's whole
    tuning in ``C/tune``). Every cell the report lists is checked, whether or not this call's
    grid holds it (``--seeds 1`` would otherwise write a report without it, and a later
    ``--seeds 2`` run it again). ``sub``: ``runs`` (a run is there when its ``config.toml`` or
    ledger is) or ``tune`` (a tuning is there when its ``tune.json`` is). A report that cannot
    be read states nothing here; ``--overwrite`` is checked too (it reuses identical cells, so
    ``--seeds 1 --overwrite`` would write a report without the cell as well).

    Raises
    ------
    ValueError
        Naming the cell's directory.
    """
    from fedprivopt.simulation.files import LEDGER_FILE

    path = Path(out) / "report.md"
    try:
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    except (OSError, ValueError):
        return
    link = re.compile(rf"\[([^\]/]+)\]\({re.escape(sub)}/\1/report\.md\)\Z")
    for line in lines:
        first = line[2:].split(" | ", 1)[0] if line.startswith("| ") else ""
        found = link.match(first) if sub != "runs" else None
        name = found.group(1) if found else first if sub == "runs" else ""
        if not CELL_NAME.match(name):
            continue
        where = Path(out) / sub / name
        if sub == "runs":
            there = (where / CONFIG_FILE).exists() or (where / LEDGER_FILE).exists()
        else:
            there = (where / "tune.json").exists()
        if not there:
            kind = "run" if sub == "runs" else "tuning"
            raise ValueError(
                f"{where}: missing, but the comparison's report.md lists this cell's {kind}: a "
                "call that runs it again makes a second release of the cell (with new noise in "
                "secure mode), which the report's epsilon does not count; put its directory "
                "back, or give another --out (or remove that report.md, if it was never "
                "published)"
            )


def lock_compare_dir(out: str | Path):
    """Context manager holding ``out``'s :data:`COMPARE_LOCK` (``out`` must exist).

    A second ``compare`` on the same ``--out`` (whatever its grid) is refused with a
    ``ValueError`` naming the holder's PID; each cell's run directory has its own lock besides.
    The lock is on the directory (:func:`~fedprivopt.simulation.rundir.lock_directory`), so
    deleting ``compare.lock`` does not release it.
    """
    return lock_directory(out, COMPARE_LOCK, what=f"comparison {str(out)!r}")


CELL_NAME = re.compile(r"[a-z0-9-]+__sigma[^/]+__seed[0-9]+\Z")
"""What :func:`cell_label` names a cell's run directory (and a tuned cell's tuning)."""


def _foreign_runs(runs: Path, reports: list[str]) -> list[str]:
    """The entries that make ``runs`` (and the ``reports`` beside it) not a comparison's.

    Twenty-seventh review of issue 15: ``compare --out P``, where ``P`` held a ``runs/`` of
    another tool's (PyTorch's TensorBoard writes ``runs/<date>_<host>/`` by default) and the
    user's own ``report.md`` and ``summary.csv``, replaced both (rc 0). ``runs/`` of a
    comparison holds only cells' run directories (:func:`cell_label`), and a report beside it
    was written after at least one cell. A cell counts only when it holds a run's
    ``config.toml`` (twenty-ninth review): an empty ``runs/<cell>/`` (``mkdir -p`` of a name
    that looks like a cell, or a cell whose files were deleted) beside the user's ``report.md``
    let it be replaced, and no report of ours stands beside cells that are all empty (the
    report is removed before the first cell changes and written after the last).
    """
    cells = sorted(p.name for p in runs.iterdir())
    foreign = [f"runs/{n}" for n in cells if not CELL_NAME.match(n)]
    if not foreign and reports and not any((runs / n / CONFIG_FILE).is_file() for n in cells):
        foreign = reports  # a report with no run beside it: not one compare wrote
    return foreign


def check_compare_dir(out: str | Path) -> None:
    """Refuse an ``--out`` that holds anything but an earlier comparison's files.

    ``compare`` writes ``report.md``, ``summary.csv`` and two plots beside ``runs/``; into a
    directory that holds other files (a user's notes, a single run's ``config.toml``) it would
    replace files that are not its own, so such a directory is refused before anything runs,
    also with ``--overwrite`` (which reruns stale cells of a comparison, nothing else).

    Raises
    ------
    ValueError
        Naming the directory and up to three of the entries that are not a comparison's.
    """
    out = Path(out)
    if not out.is_dir():
        return
    names = sorted(p.name for p in out.iterdir())
    foreign = [n for n in names if n not in COMPARE_ENTRIES]
    if names and "runs" not in names:
        foreign = foreign or names
    runs = out / "runs"
    if runs.exists() and not runs.is_dir():
        foreign.append("runs")
    elif runs.is_dir() and not foreign:
        foreign = _foreign_runs(runs, [n for n in names if n in REPORT_FILES])
    if foreign:
        shown = ", ".join(repr(n[:60]) for n in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise ValueError(
            f"--out {str(out)!r} holds {shown}, which compare did not write: it writes only into a "
            "new or empty directory or an earlier comparison's (runs/ and its report); choose "
            "another --out"
        )


def check_not_reported(run_dir: str | Path) -> None:
    """Refuse a resume of a comparison's cell, or a tuning's trial, while its report is there.

    Forty-first review follow-up of issue 15 (ledger 1): ``compare toy.toml --strategies
    dp-fedavg --rounds 1 --out C1`` (ε 7.55), the cell's ``config.toml`` raised to 2 rounds and
    ``simulate --resume C1/runs/<cell>`` (ε 10.28): ``C1/summary.csv`` and ``C1/report.md`` kept
    stating 7.55 beside a run that had spent more (a ``tune`` trial alike: its ``summary.json``
    said 8.279, the trial had spent 12.17). ``compare`` and ``tune`` remove their report before
    any cell changes (:func:`remove_report`), so a report beside ``runs/`` describes every cell
    as it is; a resume of one of them by hand (``simulate --resume``,
    :func:`~fedprivopt.simulation.run.resume` that would release a round, or
    ``simulate(..., overwrite=True)`` over it) is refused while it is there, naming the command
    that resumes or reruns the cell and writes the report again. A cell of a comparison or
    tuning that stopped (no report) resumes as before.

    Raises
    ------
    ValueError
        If ``run_dir`` is ``OUT/runs/<name>`` of a comparison (``OUT`` holds
        :data:`COMPARE_LOCK`) or a tuning (``tune.json`` or ``tune.lock``) whose report is there.
    """
    from fedprivopt.simulation.tune_dir import TUNE_FILES, TUNE_LOCK

    run = Path(os.path.realpath(run_dir))
    if run.parent.name != "runs":
        return
    out = run.parent.parent
    if os.path.lexists(out / COMPARE_LOCK):
        what, command, names = "a cell of the comparison", "compare", REPORT_FILES[:2]
        how = "it resumes a stopped cell; other rounds or settings: --overwrite reruns cells"
        if os.path.isdir(out / "tune"):  # compare --tune-grid: its tunings sit in OUT/tune
            command = "compare --tune-grid"
    elif os.path.lexists(out / TUNE_LOCK) or os.path.lexists(out / "tune.json"):
        what, command, names = "a trial of the tuning", "tune", TUNE_FILES[:3]
        how = "it resumes a stopped trial; another plan: --overwrite"
    else:
        return
    found = [name for name in names if os.path.lexists(out / name)]
    if not found:
        return
    given = out  # the --out to give: a compare --tune-grid tuning sits in OUT/tune/<cell>
    comparison = out.parent.parent
    if command == "tune" and out.parent.name == "tune" and (comparison / COMPARE_LOCK).exists():
        command, given = "compare --tune-grid", comparison
    raise ValueError(
        f"--resume directory {str(run_dir)!r} is {what} in {str(out)!r}, whose "
        f"{', '.join(found)} state its rounds and epsilon: a resume here would leave them "
        f"describing a run that is no longer there; run fedprivopt {command} with --out "
        f"{str(given)!r} instead ({how}; it writes the report again), or copy the directory "
        "elsewhere to resume it alone"
    )


def run_cell(plan: CellPlan, *, progress: bool = False) -> None:
    """Carry out ``plan``: run, resume or rerun the cell's simulation, or nothing (reuse)."""
    from fedprivopt.simulation.run import resume, simulate

    cell = plan.cell
    if plan.action == RUN:
        simulate(cell.config, plan.run_dir, progress=progress, task=cell.task,
                 tuning_plan=cell.tuning_plan)  # fmt: skip
    elif plan.action == RESUME:
        resume(plan.run_dir, progress=progress, tuning_plan=cell.tuning_plan, planned=True)
    elif plan.action == RERUN:
        simulate(cell.config, plan.run_dir, progress=progress, overwrite=True, task=cell.task,
                 tuning_plan=cell.tuning_plan, planned=True)  # fmt: skip
