"""When a ``compare`` cell's earlier run may be used again: each cell's plan, and its run read back.

A later ``compare`` into the same ``OUT`` uses a cell's run again only when the configuration
stored in it (``config.toml``, written by :func:`~fedprivopt.simulation.run.simulate`) is the
configuration this call resolves for the cell, key for key (:func:`first_difference`), and its
files pass every check ``--resume`` makes (:func:`~fedprivopt.simulation.audit.audit_run_dir`:
the configuration against the privacy ledger's header, the checkpoint against the ledger, every
reported ε against the ledger). A finished run (by its checkpoint and ledger,
:meth:`~fedprivopt.simulation.audit.RunDirState.unfinished`) is *reused*, an unfinished one
*resumed* from its checkpoint. Any difference (more rounds, another clip norm, another task
parameter) or a failed check makes the cell *stale*: :func:`plan_cells` refuses the whole grid
before anything runs, naming the cell and the first differing key or the check, unless
``overwrite`` is set, in which case the stale cell is *rerun* from scratch (its directory is
replaced). Cells with no run yet are *run*. :func:`load_cell` reads a cell's finished run,
checked again under its lock. The cells and their plans: :mod:`fedprivopt.simulation.cells`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedprivopt.core.text import cut_middle
from fedprivopt.core.text import shown as _short
from fedprivopt.data.locks import LockHeldError
from fedprivopt.simulation.cells import RERUN, RESUME, REUSE, RUN, Cell, CellPlan, StaleCellError
from fedprivopt.simulation.config import RunConfig, load_config
from fedprivopt.simulation.files import (
    LEDGER_FILE,
    check_appended_not_linked,
    check_replaced,
    toml_value,
)
from fedprivopt.simulation.ledger_lines import OLD_LEDGER_SUFFIX
from fedprivopt.simulation.rundir import lock_run_dir

__all__ = ["cell_difference", "first_difference", "load_cell", "plan_cells", "quiet_resume_notes"]


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
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        # forty-seventh review of issue 15 (sameness 6): a table inside an array (a task
        # parameter opts = [{flag = true}]) was compared with ==, so [{flag = 1}] (or 1.0 for 1)
        # was the same configuration and its cell reused
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
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


def first_difference(
    stored: RunConfig,
    wanted: RunConfig,
    *,
    defaults: Mapping[str, Any] | None = None,
    relocatable: bool = False,
) -> tuple[str, Any, Any] | None:
    """The first key (in preset order) whose value differs, with both values; ``None`` if equal.

    Keys are the preset's kebab-case names (``num-server-rounds``, ``task-params.num-users``);
    a task parameter set on one side only shows as ``(not set)`` on the other.

    ``defaults``: the keyword defaults of the task's factory
    (:func:`~fedprivopt.models.registry.task_defaults`), given where both configurations name
    the same task: a task parameter set on one side only, at that default, is the same as not
    set. ``relocatable``: leave out the task parameters that say only where the data lives
    (:data:`~fedprivopt.simulation.ledger_lines.RELOCATABLE_TASK_PARAMS`), for a caller that
    compares the data by its identity instead, as ``--resume``'s header check does.
    """
    from fedprivopt.simulation.ledger_lines import RELOCATABLE_TASK_PARAMS

    old, new = stored.to_mapping(), wanted.to_mapping()
    if defaults:
        old, new = _with_defaults(old, new, defaults), _with_defaults(new, old, defaults)
    a, b = _flat(old), _flat(new)
    skipped = tuple(
        f"task-params.{k.replace('_', '-')}" for k in RELOCATABLE_TASK_PARAMS if relocatable
    )
    for key in [*b, *(k for k in a if k not in b)]:
        if any(key == s or key.startswith(s + ".") for s in skipped):
            continue
        left, right = a.get(key, _MISSING), b.get(key, _MISSING)
        if not _same(left, right):
            return key, left, right
    return None


def _with_defaults(
    mapping: dict[str, Any], other: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """``mapping`` with each task parameter ``other`` sets at its default ``defaults`` added."""
    mine, theirs = mapping.get("task-params", {}), other.get("task-params", {})
    if not isinstance(mine, Mapping) or not isinstance(theirs, Mapping):
        return mapping
    added = {
        k: v
        for k, v in theirs.items()
        if k not in mine and k in defaults and _same(_plain(defaults[k]), v)
    }
    return {**mapping, "task-params": {**mine, **added}} if added else mapping


def _plain(value: Any) -> Any:
    """A factory's default as a configuration holds it: a tuple as a list."""
    return list(value) if isinstance(value, tuple) else value


def cell_difference(
    stored: RunConfig, cell: Cell
) -> tuple[tuple[str, Any, Any] | None, tuple[str, Any, Any] | None]:
    """The first difference of a cell's stored configuration, as its reuse compares it.

    Forty-eighth review of issue 15 (compare; the forty-seventh review's open row sameness 8):
    a cell made without a task parameter was refused as stale when the call gave it at the
    task's default (``--set task-params.heterogeneity=0.5`` on the toy task), and one whose
    ``task-params.data-dir`` was spelled otherwise (``/tmp/D``, ``/tmp/x/../D``), each advising
    ``--overwrite``, which releases the cell's rounds again. A parameter at the task factory's
    default is now the same as one not set, and where the cell's task identifies its data
    (:func:`~fedprivopt.models.task.data_identity` beyond its code) the data's place is left
    out: the audit compares that identity with the run's ledger, as ``--resume`` does.

    Returns
    -------
    (difference, moved)
        ``difference``: the first differing key and both values, or ``None``; ``moved``: where
        ``difference`` is ``None`` but the data's place differs, that key and both values (the
        run's ledger must then record the data's identity: :func:`_check_moved`).
    """
    from fedprivopt.models.registry import task_defaults

    same_task = stored.task == cell.config.task
    defaults = task_defaults(cell.config.task) if same_task else None
    diff = first_difference(stored, cell.config, defaults=defaults)
    if diff is None or not same_task or not _identifies_data(cell.task):
        return diff, None
    moved = first_difference(stored, cell.config, defaults=defaults, relocatable=True)
    return (moved, None) if moved is not None else (None, diff)


def _identifies_data(task: Any) -> bool:
    """Whether ``task``'s data identity says more than its code's digest."""
    from fedprivopt.models.task import TASK_SOURCE, data_identity

    if task is None:
        return False
    try:
        identity = data_identity(task)
    except ValueError:  # a TaskError: refused where the run's files are checked
        return False
    return isinstance(identity, dict) and any(key != TASK_SOURCE for key in identity)


def _check_resumable_there(stored: RunConfig, wanted: RunConfig) -> None:
    """Refuse to resume a run whose data directory is not the cell's own (by the file system).

    A resume reads the data where the run's ``config.toml`` says (compare 6 of the
    forty-eighth review: a cell made on ``data-dir = L``, a link since removed, then stopped,
    was planned as resumed with the cell's ``RD`` and failed when its turn came, ``L: missing
    stackoverflow.sqlite``, after the report was removed; with ``synthetic = true`` the resume
    would generate the dataset again at ``L``).
    """
    then = stored.task_params.get("data_dir")
    now = wanted.task_params.get("data_dir")
    if then is None or now is None or then == now:
        return
    try:
        same = os.path.samefile(os.path.expanduser(str(then)), os.path.expanduser(str(now)))
    except (OSError, ValueError, TypeError):
        same = False
    if not same:
        raise ValueError(
            f"its run is unfinished and a resume reads its data where its config.toml "
            f"says, task-params.data-dir = {_as_toml(then)}, not this call's {_as_toml(now)}: "
            "put the data back there, or give that data-dir"
        )


def _check_moved(run: Any, moved: tuple[str, Any, Any] | None) -> None:
    """Refuse a run whose data's place differs when its ledger records no data to compare."""
    from fedprivopt.models.task import TASK_SOURCE

    if moved is None:
        return
    data = None if run.ledger is None else run.ledger.header.get("data")
    if not isinstance(data, Mapping) or not any(key != TASK_SOURCE for key in data):
        key, old, new = moved
        raise ValueError(
            f"its run was made with {key} = {_as_toml(old)}, this call asks for "
            f"{_as_toml(new)}, and its privacy ledger records no identity of the task's data "
            "to compare the two by"
        )


@contextlib.contextmanager
def quiet_resume_notes() -> Iterator[None]:
    """Hold back the privacy ledger's notes on a resume while a run's files are only checked.

    Thirty-eighth review of issue 15 (reports, finding 1): ``compare`` of a secure cell stopped
    after round 3's ledger line and before its checkpoint of round 3 (the newest of round 2)
    printed ``1 privacy events of rounds released after round 2 stay accounted ...; a round
    redone from round 3 on is a new release`` twice, once when the cell was planned (its
    files checked as ``--resume`` checks them) and once when it was resumed; ``compare-tuned``
    printed it for an unfinished trial, which it redoes nothing of. The note belongs to the
    resume that redoes the rounds, which says it (``simulate --resume`` says it once).
    """
    logger = logging.getLogger("fedprivopt.simulation.ledger")

    def drop(record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING

    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def _leads_out(run_dir: Path, out: str | Path) -> str | None:
    """Where ``run_dir`` really is when a link takes it out of ``out`` (a loop: as written)."""
    try:
        place, top = run_dir.resolve(), Path(out).resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symbolic-link loop (Python 3.11)
        return str(run_dir)
    return None if place.is_relative_to(top) else str(place)


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
        diff, moved = cell_difference(stored, cell)
        if diff is None:
            plans.append(_audited(cell, run_dir, overwrite=overwrite, hint=hint, moved=moved))
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
        if plan.action != REUSE and (place := _leads_out(plan.run_dir, out)) is not None:
            # thirty-eighth review of issue 15 (rundirs): a linked runs/ (the cell's parent)
            # let --overwrite replace another comparison's cell, whose report then lied
            raise ValueError(
                f"cell {plan.cell.label}: {plan.run_dir} leads out of --out through a symbolic "
                f"link (to {place}); a compare writes only inside --out: remove the link or "
                "choose another --out"
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


def _audited(
    cell: Cell,
    run_dir: Path,
    *,
    overwrite: bool,
    hint: str,
    moved: tuple[str, Any, Any] | None = None,
) -> CellPlan:
    """Reuse, resume or (``overwrite``) rerun a cell whose stored configuration is its own.

    The run's files get every check of ``--resume``, under the run directory's lock, and may
    show no more rounds released than the cell asks for; a run another process is writing is
    refused, also with ``overwrite``.
    """
    from fedprivopt.simulation.audit import audit_run_dir

    try:
        with lock_run_dir(run_dir), quiet_resume_notes():  # the resume says it (finding 1)
            run = audit_run_dir(run_dir, cell.task, engine=False)
        _check_moved(run, moved)
        if moved is not None and run.unfinished() is not None:
            _check_resumable_there(run.config, cell.config)
        _check_rounds(run, cell)
        _check_tuning_plan(run, cell)
        if run.unfinished() is not None:  # to be resumed: refused when planned, not when run
            check_appended_not_linked(run_dir)
            # a directory where the resume replaces a file: refused by run.resume, but only
            # when the cell's turn came, after the report was removed and the cells before it
            # ran (forty-first review follow-up, ledger, open for compare)
            check_replaced(run_dir, extra=(LEDGER_FILE + OLD_LEDGER_SUFFIX,))
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
            diff, moved = cell_difference(load_config(plan.run_dir / CONFIG_FILE), cell)
            if diff is not None:
                key, old, new = diff
                raise ValueError(f"its run has {key} = {_short(old)}, the cell {_short(new)}")
            with quiet_resume_notes():  # an unfinished run is refused here, not resumed
                run = audit_run_dir(plan.run_dir, cell.task, engine=False)
            _check_moved(run, moved)
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
