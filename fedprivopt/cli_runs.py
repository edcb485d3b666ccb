"""The command line's ``simulate`` and ``compare``: from a preset and flags to runs and a report.

:func:`load_preset` and :func:`build_checked_run` turn a bad preset, ``--set`` or task parameter
into a :class:`~fedprivopt.cli_args.UsageError` naming it, before anything is written;
``compare``'s grid (its cells, their reuse and the lock on ``--out``) is orchestrated here, the
argument parsing in :func:`add_simulate` and :func:`add_compare`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from fedprivopt.cli_args import (
    MAX_SEED,
    POSITIVE,
    SEED,
    HelpFormatter,
    UsageError,
    check_out_dir,
    check_path_text,
    int_at_least,
    int_in,
    name_task_param,
    preset_path,
    shown,
    task_param_error,
)

__all__ = [
    "add_compare",
    "add_simulate",
    "build_checked_run",
    "cmd_compare",
    "cmd_simulate",
    "compare_cells",
    "compare_overrides",
    "load_preset",
    "note_unused",
    "refuse_table_against_flags",
    "set_overrides",
]


def build_checked_run(config, where: str = "config", task=None, out=None):
    """``build_run(config, task)``; bad settings and unknown task parameters are usage errors.

    ``out``: the command's ``--out``; a task ``data-dir`` or ``cache-dir`` inside it is refused
    before the task is built (which may generate data there).
    """
    from fedprivopt.simulation.run import build_run, check_task_dirs_outside

    with task_errors(where, config.task_params, config.task, every_value_error=True):
        if out is not None:
            check_task_dirs_outside(config, out)
        return build_run(config, task)


@contextlib.contextmanager
def task_errors(where: str, params: dict, task: object, *, every_value_error: bool):
    """A task parameter's error inside the block is a usage error led by ``where``, naming it.

    A ``ValueError`` names the parameters of ``task`` (the config's ``task``, ``None`` when
    unknown) as the config writes them (``task-params.KEY``: :func:`name_task_param`); with
    ``every_value_error`` false one that names no task parameter goes on as it was. A
    ``TypeError`` of a task constructor's keywords (:func:`task_param_error`) is one line; any
    other is a bug and goes on.
    """
    try:
        yield
    except ValueError as exc:
        from fedprivopt.models.registry import task_parameters

        named = name_task_param(str(exc), params, task_parameters(task))
        if not every_value_error and named == str(exc):
            raise
        raise UsageError(f"{where}: {named}") from None
    except TypeError as exc:
        message = task_param_error(exc)
        if message is None:
            raise
        raise UsageError(f"{where}: {message}") from None


def load_preset(path: str | os.PathLike, overrides: dict | None = None, where: str = "config"):
    """``load_config``; an unreadable or too deeply nested file is a usage error naming it."""
    from fedprivopt.simulation.config import load_config

    try:
        return load_config(path, overrides)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from None
    except RecursionError:
        raise UsageError(f"{where}: config file {str(path)!r} is nested too deeply") from None
    except OSError as exc:
        raise UsageError(
            f"{where}: config file {str(path)!r} cannot be read: {exc.strerror or exc}"
        ) from None


# -- simulate ----------------------------------------------------------------------------------


_CELL_KEYS = {
    "strategy": "every cell sets its own (--strategies)",
    "seed": "every cell sets its own (the preset's seed, +1, ...: --seeds)",
    "noise-multiplier": "every cell sets its own (--noise-multipliers, or --set noise-multiplier)",
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


_FLAG_KEYS = (
    ("strategy", "strategy"),
    ("engine", "engine"),
    ("rounds", "num-server-rounds"),
    ("seed", "seed"),
    ("tensorboard", "tensorboard"),
)
"""The shorthand flags and the preset key each sets."""


def set_overrides(args: argparse.Namespace) -> dict:
    """The preset overrides of ``--set KEY=VALUE`` and the shorthand flags (``--rounds``, ...)."""
    from fedprivopt.simulation.config_presets import parse_override
    from fedprivopt.simulation.tune_grid import empty_table_error, sets_nothing

    out = {}
    for text in args.set or []:
        try:
            key, value = parse_override(text)
        except ValueError as exc:
            raise UsageError(f"argument --set: {exc}") from None
        except RecursionError:
            raise UsageError(f"argument --set: {shown(text)} is nested too deeply") from None
        if sets_nothing(value):  # silently dropped (nineteenth review of issue 15, finding 1)
            raise UsageError(empty_table_error("--set", key, value))
        if key in out and out[key] != value:  # the last would silently win
            merged = _merged_tables(out[key], value)
            if merged is None:
                raise UsageError(
                    f"argument --set: {key}={value!r} contradicts an earlier --set {key}="
                    f"{out[key]!r}; give one of them"
                )
            value = merged
        out[key] = value
    for flag, key in _FLAG_KEYS:
        value = getattr(args, flag, None)
        if value is None:
            continue
        if key in out and out[key] != value:  # the shorthand would silently win
            raise UsageError(
                f"argument --{flag}: {value!r} contradicts --set {key}={out[key]!r}; "
                "give one of them"
            )
        out[key] = value
    return out


def _merged_tables(old: object, new: object) -> dict | None:
    """Two ``--set`` tables of one key as one, else ``None`` where a key of both differs.

    Thirty-fifth review of issue 15 (found by the lifecycle reviewer): ``--set
    'task-params={seed=1}' --set 'task-params={num-users=40}'`` was refused as contradicting,
    though the two set different keys (as ``--set task-params.seed=1 --set
    task-params.num-users=40`` do).
    """
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return None
    out = dict(old)
    for key, value in new.items():
        if key in out and out[key] != value:
            value = _merged_tables(out[key], value)
            if value is None:
                return None
        out[key] = value
    return out


def refuse_table_against_flags(args: argparse.Namespace, sets: dict, strategy: str) -> None:
    """Refuse ``--set strategies.S.KEY=V`` of the run's strategy ``S`` beside ``KEY``'s flag.

    Twenty-ninth review of issue 15: ``simulate toy.toml --strategy fedavg --rounds 1 --set
    strategies.fedavg.num-server-rounds=3`` (also ``--set num-server-rounds=1``, ``--engine``,
    ``--seed``; and in ``tune``) ran 3 rounds: the strategy's table is applied over the other
    overrides, so the flag, the one run's setting, silently lost where ``--set
    num-server-rounds=3`` beside it is refused. ``compare`` is left alone: there a table of
    one strategy beside a flag or ``--set`` for all is an exception for that strategy (as
    ``--tune-grid S:KEY`` replaces an unprefixed ``KEY``), and each row shows its settings.
    """
    from fedprivopt.simulation.config_presets import flat_overrides

    flags = {key: f"--{flag}" for flag, key in _FLAG_KEYS if getattr(args, flag, None) is not None}
    try:
        flat = flat_overrides(sets)
    except ValueError as exc:
        raise UsageError(f"argument --set: {exc}") from None
    prefix = f"strategies.{strategy}."
    for key, value in flat.items():
        name = key.removeprefix(prefix)
        if name == key or name not in flat or flat[name] == value:
            continue
        other = flat[name]
        source = f"{flags[name]} {other!r}" if name in flags else f"--set {name}={other!r}"
        raise UsageError(
            f"argument --set: {key}={value!r} contradicts {source}, which it would silently "
            f"override for {strategy}; give one of them"
        )


def cmd_simulate(args: argparse.Namespace) -> int:
    """``fedprivopt simulate``: one run with metrics, summary and checkpoints."""
    from fedprivopt.simulation.files import CONFIG_FILE
    from fedprivopt.simulation.run import resume, simulate

    if args.resume is not None:
        if (
            args.config is not None
            or args.set
            or any(
                getattr(args, f) is not None
                for f in ("strategy", "engine", "rounds", "seed", "out", "tensorboard")
            )
        ):
            raise UsageError(
                "argument --resume: give only the run directory (its config.toml "
                "is the configuration)"
            )
        # the paths as checked, "~" expanded (twenty-fifth review of issue 15, finding 9:
        # simulate --out "~/x" created a directory named "~" where compare, tune and data
        # synth wrote into the home directory, and --resume "~/x" looked for "./~/x")
        run_dir = check_path_text(args.resume, "--resume")
        stored = run_dir / CONFIG_FILE
        params, task = {}, None
        if stored.is_file():  # unreadable or nested too deeply
            stored_config = load_preset(stored, where="argument --resume")
            params, task = stored_config.task_params, stored_config.task
            from fedprivopt.simulation.engines import check_flower_resources

            try:  # this machine's devices and CPUs: the line names the file that asks for them
                check_flower_resources(stored_config)
            except ValueError as exc:  # (thirty-fifth review of issue 15, the lifecycle reviewer)
                raise UsageError(f"{stored}: {exc}") from None
        outcome = _resume_checked(resume, run_dir, stored, params, task, progress=not args.quiet)
    else:
        if args.config is None:
            raise UsageError("argument CONFIG: a preset file is required (or --resume DIR)")
        out = check_out_dir(args.out) if args.out is not None else None
        sets = set_overrides(args)
        config = load_preset(args.config, sets)
        refuse_table_against_flags(args, sets, config.strategy.strategy)
        note_unused([config])  # a shared preset's other knobs, or a mistake
        if out is None:  # named by an error creating it, as a given --out is
            out = check_out_dir(f"runs/{config.strategy.strategy}-seed{config.strategy.seed}")
            args.out = str(out)
        # validates everything before anything is written
        task, _ = build_checked_run(config, out=out)
        outcome = simulate(config, out, progress=not args.quiet, task=task)
    final = outcome.rows[-1] if outcome.rows else {}
    metric = next((k for k in (outcome.metric, "eval_loss") if k in final), None)
    shown = f", {metric} = {final[metric]:.4f}" if metric else ""
    print(
        f"{outcome.rounds_completed} rounds ({outcome.stopped_reason}){shown}, "
        f"epsilon = {outcome.epsilon:.4g}; results in {outcome.out_dir}"
    )
    if outcome.diverged is not None:  # its final metrics describe an overflowed model
        from fedprivopt.simulation.divergence import warning_line

        print(warning_line(outcome.diverged, metric), file=sys.stderr)
    return 0


def _resume_checked(resume, run_dir, stored, params: dict, task, *, progress: bool):
    """``resume(run_dir)``; a bad task parameter in ``stored`` is a usage error naming it.

    Twenty-seventh review of issue 15: ``cache_dir = "/x"`` (or ``token_cache = true``) added
    under ``[task-params]`` of a run's ``config.toml`` passes the ledger check (a key that only
    says where data lives is not privacy-relevant), and ``simulate --resume`` ended in the
    task's ``TypeError: ... unexpected keyword argument 'cache_dir'`` traceback, rc 1; a bad
    value of such a key (``data_dir = 5``) was one line that named neither the file nor the
    key (``data_dir must be a non-empty path, got 5``). As :func:`build_checked_run` does, the
    message names the key (``params``: the stored ``[task-params]``), prefixed with the file.
    """
    with task_errors(str(stored), params, task, every_value_error=False):
        return resume(run_dir, progress=progress)


def add_simulate(sub) -> None:
    """Add ``simulate`` to the subcommands ``sub``."""
    from fedprivopt.simulation.config import ENGINES
    from fedprivopt.strategies.config import STRATEGIES

    p = sub.add_parser(
        "simulate",
        help="simulate federated training of one strategy",
        description="Run one federated simulation from a preset (TOML) and write metrics.jsonl, "
        "summary.json, config.toml and checkpoints to the output directory.",
        epilog="examples:\n"
        "  fedprivopt simulate simulations/toy.toml --strategy dp-fedadam --rounds 20\n"
        "  fedprivopt simulate simulations/toy.toml --set noise-multiplier=0.8 --out runs/a\n"
        "  fedprivopt simulate --resume runs/a",
        formatter_class=HelpFormatter,
    )
    p.add_argument("config", nargs="?", type=preset_path, metavar="CONFIG", help="preset TOML file")
    p.add_argument("--strategy", choices=STRATEGIES, help="override the preset's strategy")
    p.add_argument("--engine", choices=ENGINES, help="fast (in process) or flower (Ray)")
    p.add_argument("--rounds", type=int_at_least(1), metavar="R", help="num-server-rounds")
    p.add_argument("--seed", type=SEED, metavar="S", help=f"root seed, in [0, {MAX_SEED}]")
    p.add_argument("--out", metavar="DIR", help="run directory (default runs/<strategy>-seed<S>)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        # twenty-ninth review of issue 15: the example was --set task-params.num-users=50,
        # which every preset refuses alone (population must equal the task's users)
        help="override any preset key, e.g. --set clip-norm=0.5 "
        "--set task-params.num-users=50 --set population=50 (repeatable)",
    )
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its checkpoint")
    p.add_argument(
        "--tensorboard",
        action="store_true",
        default=None,
        help="also write TensorBoard event files next to metrics.jsonl (tensorboard = true)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-round progress on stderr")
    p.set_defaults(func=cmd_simulate)


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
    cells, tasks = [], {}  # each distinct task is built (its data read) once
    for name, sigma, seed in points:
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
        (out / "runs").mkdir(parents=True, exist_ok=True)  # fails here, before any progress
        locked = contextlib.ExitStack()
        try:
            locked.enter_context(lock_compare_dir(out))  # a second compare here: its holder
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        with locked:
            return _compare_locked(args, out, cells)


def note_unused(configs: list, only: dict | None = None) -> None:
    """Say on stderr which strategies do not use keys that are set, one line per set of keys.

    ``configs`` are run configurations. ``simulate`` names every such key of its one strategy;
    ``compare`` only the keys of ``only`` (its ``--set``s): a preset shared by several
    strategies holds options some of them ignore by design. A ``[side-information]`` table
    counts too: only ``adadps`` reads it (thirty-fourth review of issue 15: ``simulate
    toy.toml --set strategy=dp-fedavg --set side-information.kind=public-users`` ran without
    a word, its summary showing the table it never used).
    """
    from fedprivopt.models.side_information_config import KEY as SIDE_INFORMATION
    from fedprivopt.models.side_information_config import SideInformationSpec
    from fedprivopt.simulation.tune_grid import keys_without_effect

    by_keys: dict[tuple, list[str]] = {}
    for config in configs:
        strategy = config.strategy
        unused = set(keys_without_effect(strategy))
        if strategy.strategy != "adadps" and config.side_information != SideInformationSpec():
            unused.add(SIDE_INFORMATION)
        if only is not None:  # --set strategies.<this strategy>.KEY sets KEY for it
            own = f"strategies.{strategy.strategy}."
            given = {key.removeprefix(own) for key in only}
            given |= {SIDE_INFORMATION for key in given if key.startswith(SIDE_INFORMATION)}
            unused &= given
        if unused:
            names = by_keys.setdefault(tuple(sorted(unused)), [])
            if strategy.strategy not in names:
                names.append(strategy.strategy)
    for unused, names in by_keys.items():
        verb, pronoun = ("does", "it ignores") if len(names) == 1 else ("do", "they ignore")
        print(
            f"note: {', '.join(names)} {verb} not use {', '.join(unused)} "
            f"(other strategies' options, or ones {pronoun})",
            file=sys.stderr,
        )


def _compare_locked(args: argparse.Namespace, out: Path, cells: list) -> int:
    """``compare``'s plan, runs and report, holding ``out``'s lock."""
    from fedprivopt.simulation.cells import load_cell, plan_cells, remove_report, run_cell
    from fedprivopt.simulation.parallel import check_parallel
    from fedprivopt.simulation.report import write_report

    try:
        plans = plan_cells(out, cells, overwrite=args.overwrite)
        check_parallel(plans, args.jobs)
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
            announce(i, plan)
            run_cell(plan, progress=not args.quiet)
    for plan in plans:  # each read under its lock, checked again: nothing changed meanwhile
        try:
            runs.append(load_cell(plan))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        origins[plan.cell.label] = plan.describe()
    report = write_report(
        out, runs, title=f"fedprivopt compare: {args.config}", metric=args.metric, origins=origins
    )
    earlier = sum(plan.action in ("reuse", "resume") for plan in plans)
    note = f" ({earlier} of {len(plans)} runs from an earlier call)" if earlier else ""
    print(f"report: {report}{note}")
    return 0


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
        "progress is off with J > 1; at most this machine's memory over 256 MiB (a worker holds "
        "its own tasks)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (neither each cell's line nor its rounds): only the report "
        "line, notes, warnings and errors",
    )
    p.set_defaults(func=cmd_compare, strategy=None, seed=None)
