"""The cells of a ``fedprivopt compare`` grid, and when a cell's earlier run may be used again.

A grid puts one run directory per (strategy, noise multiplier, seed) under ``OUT/runs/``
(:func:`cell_label` names it). A later ``compare`` into the same ``OUT`` uses a cell's run again
only when the configuration stored in it (``config.toml``, written by
:func:`~fedprivopt.simulation.run.simulate`) is the configuration this call resolves for the
cell, key for key, and its files pass every check ``--resume`` makes
(:func:`~fedprivopt.simulation.audit.audit_run_dir`: the configuration against the privacy
ledger's header, the checkpoint against the ledger, every reported ε against the ledger). A
finished run (by its checkpoint and ledger, :meth:`~fedprivopt.simulation.audit.RunDirState.
unfinished`) is *reused*, an unfinished one *resumed* from its checkpoint. Any difference (more
rounds, another clip norm, another task parameter) or a failed check makes the cell *stale*:
:func:`plan_cells` refuses the whole grid before anything runs, naming the cell and the first
differing key or the check, unless ``overwrite`` is set, in which case the stale cell is *rerun*
from scratch (its directory is replaced). Cells with no run yet are *run*.

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
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedprivopt.core.text import cut_middle
from fedprivopt.core.text import shown as _short
from fedprivopt.data.locks import LockHeldError
from fedprivopt.simulation.config import RunConfig, load_config
from fedprivopt.simulation.files import CONFIG_FILE, check_appended_not_linked, toml_value
from fedprivopt.simulation.rundir import lock_directory, lock_run_dir

__all__ = [
    "CELL_NAME",
    "MAX_CELLS",
    "MAX_SEEDS",
    "Cell",
    "CellPlan",
    "StaleCellError",
    "cell_label",
    "check_compare_dir",
    "first_difference",
    "grid",
    "plan_cells",
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


def _flat(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}" if not prefix else f"{prefix}{key.replace('_', '-')}"
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


_MISSING = "(not set)"


def _as_toml(value: Any) -> str:
    """A configuration value for a message, written as the preset's TOML writes it.

    Thirty-sixth review of issue 15 (cli, finding 2): the refusal of a reused cell wrote Python's
    ``repr`` (``tensorboard = False, this call asks for True``; strings in single quotes), not
    the ``false``/``true`` a user types in a preset or ``--set``. Long values keep both ends.
    """
    if value is _MISSING:
        return _MISSING
    return cut_middle(toml_value(value))


def first_difference(stored: RunConfig, wanted: RunConfig) -> tuple[str, Any, Any] | None:
    """The first key (in preset order) whose value differs, with both values; ``None`` if equal.

    Keys are the preset's kebab-case names (``num-server-rounds``, ``task-params.num-users``);
    a task parameter set on one side only shows as ``(not set)`` on the other.
    """
    a, b = _flat(stored.to_mapping()), _flat(wanted.to_mapping())
    for key in [*b, *(k for k in a if k not in b)]:
        left, right = a.get(key, _MISSING), b.get(key, _MISSING)
        if not _same(left, right):
            return key, left, right
    return None


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


def plan_cells(out: str | Path, cells: Sequence[Cell], *, overwrite: bool) -> list[CellPlan]:
    """Decide, before anything runs, what to do with each cell of a grid written into ``out``.

    Raises
    ------
    StaleCellError
        If a cell's directory holds a run with another configuration, or one whose files fail
        the checks of ``--resume``, and ``overwrite`` is false; the message names the cell and
        the first differing key and both values, or the check.
    ValueError
        If a cell's stored ``config.toml`` cannot be read (and ``overwrite`` is false), its
        run directory is not a directory, or a cell to be run asks the ``flower`` engine for
        client resources this machine does not have
        (:func:`~fedprivopt.simulation.engines.check_flower_resources`).
    """
    from fedprivopt.simulation.engines import check_flower_resources
    from fedprivopt.simulation.files import CONFIG_FILE, check_config_not_empty, check_run_files
    from fedprivopt.simulation.rundir import check_claimable

    plans = []
    for cell in cells:
        run_dir = Path(out) / "runs" / cell.label
        if run_dir.exists() and not run_dir.is_dir():
            raise ValueError(f"cell {cell.label}: {run_dir} exists and is not a directory")
        try:
            check_run_files(run_dir)  # a FIFO would hang the checks, a device fill memory
        except ValueError as exc:
            raise ValueError(f"cell {cell.label}: {exc}") from None
        if not (run_dir / CONFIG_FILE).exists():
            plans.append(CellPlan(cell, run_dir, RUN))
            continue
        hint = "pass --overwrite to rerun it, or choose another --out"
        try:
            check_config_not_empty(run_dir / CONFIG_FILE)  # not "every key its default"
            stored = load_config(run_dir / CONFIG_FILE)
        except (ValueError, OSError, RecursionError) as exc:
            if not overwrite:
                raise ValueError(
                    f"cell {cell.label}: its {CONFIG_FILE} in {run_dir} cannot be read "
                    f"({type(exc).__name__}: {exc}); {hint}"
                ) from None
            _check_recognisable(cell, run_dir)
            plans.append(
                CellPlan(cell, run_dir, RERUN, f"the earlier run had an unreadable {CONFIG_FILE}")
            )
            continue
        diff = first_difference(stored, cell.config)
        if diff is None:
            plans.append(_audited(cell, run_dir, overwrite=overwrite, hint=hint))
            continue
        key, old, new = diff
        if not overwrite:
            raise StaleCellError(
                f"cell {cell.label}: {run_dir} holds a run made with {key} = {_as_toml(old)}, "
                f"this call asks for {_as_toml(new)} (the first differing key); {hint}"
            )
        plans.append(CellPlan(cell, run_dir, RERUN, f"the earlier run had {key} = {_as_toml(old)}"))
    for plan in plans:
        if plan.action != REUSE and plan.run_dir.is_symlink():
            # sixth review of issue 15: --overwrite replaced a run the link pointed at, outside
            # --out; a linked finished run may still be reused (read only)
            raise ValueError(
                f"cell {plan.cell.label}: {plan.run_dir} is a symbolic link (to "
                f"{os.readlink(plan.run_dir)}); a compare writes only inside --out: remove the "
                "link or choose another --out"
            )
        if plan.action in (RUN, RERUN) and plan.run_dir.is_dir():
            # ninth review of issue 15 (N9): a stranger's file in a cell was found only when
            # its run started, after the progress line of the cell was printed
            try:
                check_claimable(plan.run_dir, overwrite=plan.action == RERUN)
            except ValueError as exc:
                raise ValueError(f"cell {plan.cell.label}: {exc}") from None
        if plan.action != REUSE:  # a reused run starts no engine
            try:
                check_flower_resources(plan.cell.config)
            except ValueError as exc:
                raise ValueError(f"cell {plan.cell.label}: {exc}") from None
    _check_clusters([plan.cell for plan in plans if plan.action != REUSE])
    return plans


def _check_clusters(cells: Sequence[Cell]) -> None:
    """Refuse cells that would join a Ray cluster where no head answers (each address once).

    Twenty-first review of issue 15: the check was made only when a cell's run joined, so a
    tuning's every trial "failed" on it and ``tune`` ended with rc 0 and an ε for a tuning that
    trained nothing, and ``compare`` stopped after its first cell's progress line.
    """
    from fedprivopt.simulation.cluster import check_reachable
    from fedprivopt.simulation.cluster_config import check_cluster_config

    seen: set[tuple[str, str]] = set()
    for cell in cells:
        try:
            joined = check_cluster_config(cell.config)
            if joined is not None and joined not in seen:
                seen.add(joined)
                check_reachable(*joined)
        except ValueError as exc:
            raise ValueError(f"cell {cell.label}: {exc}") from None


def _check_recognisable(cell: Cell, run_dir: Path) -> None:
    """Refuse to rerun a cell whose unreadable ``config.toml`` sits beside files of no run.

    File names alone do not make a directory a run (issue 15, ninth review, N11): beside an
    unreadable ``config.toml``, other files are replaced only when a ledger or a checkpoint
    shows that a run wrote there.
    """
    from fedprivopt.simulation.files import (
        CHECKPOINT,
        CONFIG_FILE,
        LEDGER_FILE,
        LOCK_FILE,
        PREVIOUS_CHECKPOINT,
    )

    others = set(os.listdir(run_dir)) - {CONFIG_FILE, CONFIG_FILE + ".tmp", LOCK_FILE}
    if others and not any(
        (run_dir / name).is_file() for name in (LEDGER_FILE, CHECKPOINT, PREVIOUS_CHECKPOINT)
    ):
        raise ValueError(
            f"cell {cell.label}: {run_dir} holds an unreadable {CONFIG_FILE} and "
            f"{', '.join(sorted(others)[:3])} but no ledger or checkpoint: not recognisably a "
            "run, so --overwrite does not replace it; remove it or choose another --out"
        )


def _audited(cell: Cell, run_dir: Path, *, overwrite: bool, hint: str) -> CellPlan:
    """Reuse, resume or (``overwrite``) rerun a cell whose stored configuration is its own.

    The run's files get every check of ``--resume``, under the run directory's lock, and may
    show no more rounds released than the cell asks for; a run another process is writing is
    refused, also with ``overwrite``.
    """
    from fedprivopt.simulation.audit import audit_run_dir

    try:
        with lock_run_dir(run_dir):
            run = audit_run_dir(run_dir, cell.task, engine=False)
        _check_rounds(run, cell)
        _check_tuning_plan(run, cell)
        if run.unfinished() is not None:  # to be resumed: refused when planned, not when run
            check_appended_not_linked(run_dir)
    except LockHeldError as exc:
        raise ValueError(f"cell {cell.label}: {exc}") from None
    except ValueError as exc:
        if not overwrite:
            raise StaleCellError(
                f"cell {cell.label}: its earlier run fails the checks of --resume: {exc}; {hint}"
            ) from None
        why = f"the earlier run failed the checks of --resume ({exc})"
        return CellPlan(cell, run_dir, RERUN, why)
    why = run.unfinished()
    start = run.alg.round_num if run.checkpoint is not None else 0
    return CellPlan(cell, run_dir, REUSE if why is None else RESUME, why or "", start)


def _check_rounds(run, cell: Cell) -> None:
    """Refuse a run whose files show more rounds released than ``cell`` asks for."""
    rounds = cell.config.strategy.num_server_rounds
    released = max(run.last_released, run.alg.round_num)
    if released > rounds:  # config.toml edited down after
        raise ValueError(
            f"its files show rounds up to {released} released, more than the "
            f"num-server-rounds = {rounds} of this cell"
        )


def _check_tuning_plan(run, cell: Cell) -> None:
    """Refuse a tuning's trial whose ledger names another plan than the cell's (or none).

    A ``compare`` cell (no plan) may not be a tuning's trial (copied or linked there).
    """
    if cell.tuning_plan is None:
        run.refuse_trial()
    elif run.ledger is not None:
        run.ledger.check_tuning_plan(cell.tuning_plan)


def load_cell(plan: CellPlan):
    """The finished run of ``plan``'s cell, checked again under its lock as it is read.

    The plan checked a reused cell before the grid ran, and other cells ran since: a run
    directory replaced or resumed meanwhile (by another terminal, or while ``compare`` was
    suspended) must not be reported as the cell's. So every cell, reused or just run, is read
    holding its lock, after its configuration is compared with the cell's again and its files
    pass every check of ``--resume`` and show a finished run.

    Raises
    ------
    ValueError
        Naming the cell and what changed.
    """
    from fedprivopt.simulation.audit import audit_run_dir
    from fedprivopt.simulation.files import CONFIG_FILE
    from fedprivopt.simulation.rundata import load_run

    cell = plan.cell
    try:
        with lock_run_dir(plan.run_dir):
            diff = first_difference(load_config(plan.run_dir / CONFIG_FILE), cell.config)
            if diff is not None:
                key, old, new = diff
                raise ValueError(f"its run has {key} = {_short(old)}, the cell {_short(new)}")
            run = audit_run_dir(plan.run_dir, cell.task, engine=False)
            _check_rounds(run, cell)
            _check_tuning_plan(run, cell)
            why = run.unfinished()
            if why is not None:
                raise ValueError(f"it is not finished: {why}")
            return load_run(plan.run_dir)
    except (LockHeldError, ValueError, OSError, RecursionError) as exc:
        raise ValueError(
            f"cell {cell.label}: its run directory changed while this comparison ran ({exc}); "
            "run compare again"
        ) from None


def run_cell(plan: CellPlan, *, progress: bool = False) -> None:
    """Carry out ``plan``: run, resume or rerun the cell's simulation, or nothing (reuse)."""
    from fedprivopt.simulation.run import resume, simulate

    cell = plan.cell
    if plan.action == RUN:
        simulate(cell.config, plan.run_dir, progress=progress, task=cell.task,
                 tuning_plan=cell.tuning_plan)  # fmt: skip
    elif plan.action == RESUME:
        resume(plan.run_dir, progress=progress, tuning_plan=cell.tuning_plan)
    elif plan.action == RERUN:
        simulate(cell.config, plan.run_dir, progress=progress, overwrite=True, task=cell.task,
                 tuning_plan=cell.tuning_plan)  # fmt: skip
