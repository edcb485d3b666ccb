"""The command line's ``compare``: a grid of strategies x noise multipliers x seeds, and a report.

:func:`compare_cells` resolves and checks every cell of the grid (one task, built once) before
anything runs; :func:`cmd_compare` reuses, resumes or reruns each cell's run in ``OUT/runs/``
under the lock on ``--out`` (:mod:`fedprivopt.simulation.cells`) and writes the report; the
argument parsing is :func:`add_compare`. ``compare --tune-grid`` is
:mod:`fedprivopt.cli_compare_tune`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from fedprivopt.cli_args import (
    POSITIVE,
    HelpFormatter,
    UsageError,
    check_out_dir,
    int_at_least,
    int_in,
    preset_path,
)
from fedprivopt.cli_runs import build_checked_run, load_preset, note_unused, set_overrides

__all__ = ["add_compare", "cmd_compare", "compare_cells", "compare_overrides"]


_CELL_KEYS = {
    "strategy": "every cell sets its own (--strategies)",
    "seed": "every cell sets its own (the preset's seed, +1, ...: --seeds)",
    # forty-second review of issue 15 (reports, docs note): since the forty-first review a cell
    # runs at its strategy's own noise multiplier, which a [strategies.<name>] table of the
    # preset file sets; the line named only the two flags
    "noise-multiplier": (
        "every cell sets its own (a [strategies.<name>] table in the preset file, "
        "--noise-multipliers, or --set noise-multiplier for every strategy)"
    ),
}


def compare_overrides(args: argparse.Namespace) -> dict:
    """``compare``'s :func:`set_overrides`, refusing the keys its grid sets for every cell."""
    from fedprivopt.simulation.tune_grid import refuse_table_spellings

    sets = set_overrides(args)
    try:
        refuse_table_spellings(sets, _CELL_KEYS)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if "strategy" in sets:  # every cell sets its own: the --set would be silently ignored
        raise UsageError("argument --set: strategy is the grid's (use --strategies)")
    if args.noise_multipliers and "noise-multiplier" in sets:
        raise UsageError(
            "argument --noise-multipliers: it contradicts --set noise-multiplier; give one of them"
        )
    return sets


def _float_list(text: str) -> list[float]:
    values = []
    for part in text.split(","):
        values.append(POSITIVE(part.strip()))
    return values


def compare_cells(args: argparse.Namespace, base) -> list:
    """The grid's cells, each resolved and validated before anything runs."""
    from fedprivopt.simulation.cells import Cell, cell_label, grid, task_key
    from fedprivopt.strategies.config import STRATEGIES

    if args.strategies is None:
        strategies = list(STRATEGIES)
    else:
        strategies = [name.strip() for name in args.strategies.split(",")]
        if not all(strategies):
            raise UsageError(
                f"argument --strategies: expected names separated by commas (of "
                f"{', '.join(STRATEGIES)}), got {args.strategies!r}"
            )
    sigmas = args.noise_multipliers or [base.strategy.noise_multiplier]
    try:
        mean = getattr(args, "mean_trials", None) if getattr(args, "tune_grid", None) else None
        points = grid(strategies, sigmas, base.strategy.seed, args.seeds, mean)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    own = {} if not args.noise_multipliers else None  # strategy -> the preset's sigma for it
    cells, tasks = [], {}  # each distinct task is built (its data read) once
    for name, sigma, seed in points:
        if own is not None and sigma is not None:
            sigma = own.get(name)
            if sigma is None:
                sigma = own[name] = _preset_sigma(args, name)
        overrides = {**set_overrides(args), "strategy": name, "seed": seed}
        if sigma is not None:
            overrides["noise-multiplier"] = sigma
        where = f"config ({name}, sigma {sigma or 0.0:g}, seed {seed})"
        config = load_preset(args.config, overrides, where=where)
        key = task_key(config)
        if cells and config.task != cells[0].config.task:
            _refuse_other_task(cells[0], name, config)
        tasks[key], _ = build_checked_run(config, where=where, task=tasks.get(key), out=args.out)
        cells.append(Cell(cell_label(name, sigma or 0.0, seed), config, tasks[key]))
    return cells


def _preset_sigma(args: argparse.Namespace, name: str) -> float:
    """The noise multiplier the preset (and ``--set``) gives strategy ``name``.

    Forty-first review of issue 15 (reports 1): without ``--noise-multipliers`` every cell ran
    at the noise multiplier of the preset's own strategy, its ``[strategies.<name>]`` table
    included: ``compare toy.toml --strategies dp-fedavg,dp-fedadam`` with
    ``[strategies.dp-fedavg] noise-multiplier = 1.0`` ran dp-fedadam at 1.0 where its preset
    (and ``simulate --strategy dp-fedadam``) says 0.5, and a ``[strategies.dp-fedadam]``
    noise multiplier (a per-strategy calibration to equal epsilon) was silently replaced by the
    preset's strategy's. The default is each strategy's own, as ``simulate`` and ``tune`` read it.
    """
    config = load_preset(args.config, {**set_overrides(args), "strategy": name}, f"config ({name})")
    return config.strategy.noise_multiplier


def _refuse_other_task(first, name: str, config) -> None:
    """Refuse a cell whose task differs from the first cell's.

    Thirty-first review of issue 15: ``--set strategies.fedavg.task=...`` compared two tasks;
    the report left out every cell lacking the metric it chose, rc 0. (Task parameters that
    differ by strategy run, and the report names them: twenty-ninth review.)
    """
    from fedprivopt.core.text import shown

    raise UsageError(
        f"config: strategy {first.config.strategy.strategy} trains task "
        f"{shown(first.config.task)} and strategy {name} task {shown(config.task)} (a "
        "strategies.<name>.task sets one): a comparison trains every strategy on one task "
        "(compare the other task in a comparison of its own)"
    )


def cmd_compare(args: argparse.Namespace) -> int:
    """``fedprivopt compare``: a grid of strategies x noise multipliers x seeds, and a report.

    A cell's earlier run in ``--out`` is reused (or resumed) only when its stored configuration
    equals the cell's; otherwise the call is refused before anything runs, or, with
    ``--overwrite``, the cell is rerun (:mod:`fedprivopt.simulation.cells`).
    """
    from fedprivopt.simulation.cells import COMPARE_LOCK, check_compare_dir, lock_compare_dir
    from fedprivopt.simulation.rundir import removed_if_unused

    out = check_out_dir(args.out)
    try:
        if args.jobs > 1:
            from fedprivopt.simulation.parallel import check_jobs

            check_jobs(args.jobs)
        check_compare_dir(out)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    sets = compare_overrides(args)
    base = load_preset(args.config, sets)
    cells = compare_cells(args, base)
    note_unused([cell.config for cell in cells], sets)
    if args.metric is not None:  # before any run: a metric no run reports failed only at the end
        from fedprivopt.simulation.tune import check_metric

        tasks = {id(c.task): c.task for c in cells if c.task is not None}
        try:
            check_metric(args.metric, list(tasks.values()))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    with removed_if_unused(out, COMPARE_LOCK):  # a failure before any cell: nothing left
        out.mkdir(parents=True, exist_ok=True)  # fails here, before any progress
        locked = contextlib.ExitStack()
        try:
            locked.enter_context(lock_compare_dir(out))  # a second compare here: its holder
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        # forty-third review of issue 15 (lead 3): made before the lock, a refused compare's
        # empty runs/ was left in the directory of the tune that held it
        (out / "runs").mkdir(exist_ok=True)
        with locked:
            return _compare_locked(args, out, cells)


def _compare_locked(args: argparse.Namespace, out: Path, cells: list) -> int:
    """``compare``'s plan, runs and report, holding ``out``'s lock."""
    from fedprivopt.simulation.cell_plans import load_cell, plan_cells
    from fedprivopt.simulation.cells import (
        check_vanished_cells,
        leftover_note,
        remove_report,
        run_cell,
    )
    from fedprivopt.simulation.parallel import check_parallel
    from fedprivopt.simulation.report import write_report
    from fedprivopt.simulation.rundir import check_output_held

    def in_place() -> None:  # forty-fourth review follow-up of issue 15 (ledger, open row)
        try:
            check_output_held(out, "comparison")
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    try:
        plans = plan_cells(out, cells, overwrite=args.overwrite)
        check_parallel(plans, args.jobs)
        check_vanished_cells(out)  # forty-fifth review of issue 15 (lead 4)
        remove_report(out)  # before a cell changes: a stopped call leaves no stale report
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    def announce(i: int, plan) -> None:
        # --quiet: no progress at all, the cells' lines included (twenty-eighth review of issue
        # 15: `compare --quiet` still printed "[i/n] cell" for every cell)
        if args.quiet:
            return
        note = "" if plan.action == "run" else f" ({plan.action})"
        print(f"[{i}/{len(plans)}] {plan.cell.label}{note}", file=sys.stderr, flush=True)

    runs, origins = [], {}
    if args.jobs > 1:
        from fedprivopt.simulation.parallel import run_plans

        run_plans(plans, args.jobs, announce)
    else:
        for i, plan in enumerate(plans, 1):
            in_place()
            announce(i, plan)
            run_cell(plan, progress=not args.quiet)
    in_place()
    for plan in plans:  # each read under its lock, checked again: nothing changed meanwhile
        try:
            runs.append(load_cell(plan))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        origins[plan.cell.label] = plan.describe()
    # forty-fifth review of issue 15 (reports, finding 2): runs of earlier calls left in OUT/runs
    left = leftover_note(out, [plan.cell.label for plan in plans])
    title = f"fedprivopt compare: {args.config}"
    report = write_report(
        out, runs, title=title, metric=args.metric, origins=origins, issues=[left] if left else []
    )
    earlier = sum(plan.action in ("reuse", "resume") for plan in plans)
    note = f" ({earlier} of {len(plans)} runs from an earlier call)" if earlier else ""
    print(f"report: {report}{note}")
    return 0


class _NoSeedFlag(argparse.Action):
    """``--seed``, which ``compare`` does not have: one line naming what does its work."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(
            f"argument {option_string}: compare has no --seed (and --seed is not --seeds): a "
            "grid's seeds start at the preset's seed (--set seed=S) and --seeds K counts them"
        )


def add_compare(sub) -> None:
    """Add ``compare`` to the subcommands ``sub``."""
    from fedprivopt.simulation.cells import MAX_SEEDS
    from fedprivopt.simulation.config import ENGINES
    from fedprivopt.simulation.parallel import MAX_JOBS

    p = sub.add_parser(
        "compare",
        help="compare strategies over noise levels and seeds, with a report and plots",
        description="Run every strategy x noise multiplier x seed of a preset (non-private "
        "baselines once per seed) and write OUT/summary.csv, OUT/report.md, "
        "OUT/metric_vs_round.png and OUT/privacy_utility.png. A run already in OUT/runs/ is "
        "reused (or, if unfinished, resumed) only when its stored config.toml equals the "
        "configuration this call resolves for it; a different one is refused (exit 2, naming "
        "the run and the first differing key) unless --overwrite is given. report.md lists "
        "where each run comes from. At most 10,000 runs per grid.",
        epilog="example:\n  fedprivopt compare simulations/toy.toml "
        "--strategies dp-fedavg,dp-fedadam,fedavg --noise-multipliers 0.5,1 --seeds 2",
        formatter_class=HelpFormatter,
    )
    p.add_argument("config", type=preset_path, metavar="CONFIG", help="preset TOML file")
    p.add_argument(
        "--strategies", metavar="A,B,...", help="strategies (default: every registered one)"
    )
    p.add_argument(
        "--noise-multipliers",
        type=_float_list,
        metavar="S1,S2,...",
        help="noise multipliers (default: the preset's)",
    )
    p.add_argument(
        "--seeds",
        type=int_in(1, MAX_SEEDS),
        default=1,
        metavar="K",
        help=f"seeds per cell (the preset's seed, +1, ...), at most {MAX_SEEDS:,}: every seed is "
        "a full run of every cell",
    )
    # forty-eighth review of issue 15 (compare 5): "--seed 2" (simulate's and tune's flag) was
    # taken by argparse as an abbreviation of --seeds: two seeds 0 and 1, not seed 2, rc 0
    p.add_argument("--seed", action=_NoSeedFlag, nargs="?", help=argparse.SUPPRESS)
    p.add_argument("--out", default="runs/compare", metavar="DIR", help="output directory")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="rerun (replacing its directory) every run in OUT/runs/ whose stored configuration "
        "differs from this call's; runs with the same configuration are still reused",
    )
    p.add_argument("--engine", choices=ENGINES, help="fast (in process) or flower (Ray)")
    p.add_argument("--rounds", type=int_at_least(1), metavar="R", help="num-server-rounds")
    p.add_argument(
        "--metric",
        choices=("eval_accuracy", "eval_recall_at_5", "eval_precision_at_5", "eval_loss"),
        help="task metric of the report (default: the task's own: accuracy for single-label "
        "tag prediction and the toy task, recall@5 for multi-label tag prediction)",
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a preset key")
    p.add_argument(
        "--tensorboard",
        action="store_true",
        default=None,
        help="also write TensorBoard event files next to metrics.jsonl (tensorboard = true)",
    )
    p.add_argument(
        "--jobs",
        type=int_in(1, MAX_JOBS),
        default=1,
        metavar="J",
        help="run up to J cells at a time, each in its own process with one CPU thread (fast "
        "engine in process only; about J times sooner for small models on J cores); per-round "
        "progress is off with J > 1; at most 256, and at most this machine's memory over 256 MiB "
        "(a worker holds its own tasks)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (neither each cell's line nor its rounds): only the report "
        "line, notes, warnings and errors",
    )
    p.set_defaults(func=cmd_compare, strategy=None, seed=None)
