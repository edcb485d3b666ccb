"""The command line's ``tune`` and ``compare-tuned``: private hyperparameter tuning.

``fedprivopt tune PRESET --strategy S --grid KEY=V1,V2,... --mean-trials K --out DIR`` runs a
random number of trials (Papernot & Steinke 2022), releases the best and writes
``OUT/summary.json`` with the ε of the whole procedure beside one run's
(:mod:`fedprivopt.simulation.tune`, :mod:`fedprivopt.simulation.tune_report`).
``fedprivopt compare-tuned TUNED... [--untuned DIR...] --out DIR`` writes ``compare``'s report
over tuned strategies at the ε that includes their tuning, optionally beside untuned runs.

Every flag and every grid point is checked before anything is written (exit 2, one line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedprivopt.cli_args import (
    MAX_SEED,
    SEED,
    HelpFormatter,
    UsageError,
    check_out_dir,
    check_path_text,
    float_range,
    int_at_least,
    preset_path,
)
from fedprivopt.cli_runs import (
    build_checked_run,
    load_preset,
    refuse_table_against_flags,
    set_overrides,
)

__all__ = [
    "TuningSetup",
    "add_tune",
    "check_selection",
    "cmd_compare_tuned",
    "cmd_tune",
    "plan_tuning",
    "prepare_tuning",
    "trial_count_of",
    "tuning_seed",
]

_METRICS = ("eval_accuracy", "eval_recall_at_5", "eval_precision_at_5", "eval_loss")


class _TrialProgress:
    """A rich progress bar over the trials on a terminal; one line per trial otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.bar, self.enabled = total, None, enabled
        if enabled and sys.stderr.isatty() and total:
            from fedprivopt.core.progress import stderr_bar

            self.bar, self.task = stderr_bar("trial", total, field="shown")

    def start(self, trial, action: str) -> None:
        point = " ".join(f"{k}={v}" for k, v in trial.hyperparameters.items())
        note = "" if action == "run" else f" ({action})"
        if self.bar is not None:
            self.bar.update(self.task, shown=f"{trial.label} {point}{note}")
        elif self.enabled:
            print(f"[{trial.index}/{self.total}] {trial.label} {point}{note}", file=sys.stderr,
                  flush=True)  # fmt: skip

    def done(self, result) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)
        elif self.enabled:
            print(f"  {result.trial.label}: {result.status}, score {result.score:.4g}"
                  + (f" ({result.error})" if result.error else ""), file=sys.stderr,
                  flush=True)  # fmt: skip

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def trial_count_of(args: argparse.Namespace):
    """The trial-count distribution of ``--distribution``, ``--mean-trials``, ``--nb-shape``."""
    from fedprivopt.privacy.tuning import TrialCount

    if args.distribution == "poisson":
        if args.nb_shape is not None:
            raise UsageError(
                "argument --nb-shape: applies only to --distribution truncated-negative-binomial"
            )
        return TrialCount("poisson", args.mean_trials)
    shape = 1.0 if args.nb_shape is None else args.nb_shape
    try:
        return TrialCount("truncated-negative-binomial", args.mean_trials, shape=shape)
    except ValueError as exc:
        raise UsageError(f"argument --nb-shape/--mean-trials: {exc}") from None


def _refuse_no_round(plans: list) -> None:
    """Refuse grid points whose runs the target ε stops before their first round.

    Thirty-first review of issue 15 (compare, finding 8): ``tune … --set target-epsilon=1``
    (below one round's ε 7.55) ended rc 0 with every trial "diverged" and "no trial released",
    though none diverged: each stopped at its budget having trained nothing (``compare``
    refuses such a grid, twenty-first review). A point of a grid over the noise multiplier or
    the target is refused alike: its trials would lose as "diverged" without training.
    """
    empty = [point for point, ledger in plans if ledger is not None and not ledger]
    if not empty:
        return
    where = "config: " if len(empty) == len(plans) else (
        "argument --grid: at grid point " + ", ".join(f"{k}={v!r}" for k, v in empty[0].items())
        + ", ")  # fmt: skip
    raise UsageError(
        f"{where}target-epsilon is below the epsilon of one round: the trials would stop at "
        "their privacy budget before their first round, training nothing; raise target-epsilon "
        "or the noise multiplier"
    )


def plan_tuning(args, overrides: dict, grid: dict) -> tuple[Any, dict, Any]:
    """Every grid point built and checked; the single run's privacy bound; the tasks."""
    from fedprivopt.models.task import primary_metric
    from fedprivopt.privacy.tuning import finite_orders
    from fedprivopt.simulation.cells import task_key
    from fedprivopt.simulation.tune import (
        PrivacyPlan,
        check_metric,
        dominating_plan,
        grid_points,
        planned_ledger,
    )
    from fedprivopt.simulation.tune_grid import check_point_effect

    tasks: dict[tuple, Any] = {}
    plans, deltas, accountants, first = [], set(), set(), None
    for point in grid_points(grid):
        where = f"config (grid point {', '.join(f'{k}={v!r}' for k, v in point.items())})"
        config = load_preset(args.config, {**overrides, **point}, where=where)
        try:
            check_point_effect(point, config.strategy)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        key = task_key(config)
        task, alg = build_checked_run(config, where=where, task=tasks.get(key), out=args.out)
        tasks[key] = task
        plans.append((point, planned_ledger(config, alg)))
        deltas.add(config.strategy.delta)
        accountants.add(config.strategy.accountant)
        first = first or (config, task, alg)
    _refuse_no_round(plans)
    if len(deltas) > 1:
        raise UsageError("argument --grid: its points have different delta; tune at one delta")
    if len(accountants) > 1:
        raise UsageError(
            "argument --grid: its points use different accountants; tune with one accountant"
        )
    try:
        point, ledger = dominating_plan(plans)
        # the costliest run's own finite orders (issue 20 review, finding 3)
        orders = None if ledger is None else finite_orders([ledger])
    except ValueError as exc:
        raise UsageError(f"argument --grid: {str(exc).removeprefix('argument --grid: ')}") from None
    config, task, alg = first
    acc = alg.accountant
    plan = PrivacyPlan(
        ledger, point, config.strategy.delta, acc.accountant,
        {"pld_discretization": acc.pld_discretization, "prv_eps_error": acc.prv_eps_error},
        config.strategy.target_epsilon,
        orders,
    )  # fmt: skip
    metric = args.metric or primary_metric(task)
    try:  # without --metric, only that every metric is a number
        check_metric(args.metric, list(tasks.values()))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return plan, tasks, metric


def check_selection(args: argparse.Namespace, tasks) -> dict | None:
    """Whether the selection reads private users' data; refuse it unless the flag allows.

    Parameters
    ----------
    args : argparse.Namespace
        ``tune``'s arguments (``selection_on_private_users``).
    tasks : iterable of Task
        The tasks of every grid point.

    Returns
    -------
    dict or None
        ``{"private": k, "evaluated": n}`` (the largest overlap over the tasks), or ``None`` when
        a task does not say (not checked).

    Raises
    ------
    UsageError
        When ``k > 0`` without ``--selection-on-private-users``.
    """
    from fedprivopt.simulation.tune_report import selection_users

    worst = selection_users(tasks)
    if worst is None:
        return None
    if worst["private"] and not getattr(args, "selection_on_private_users", False):
        raise UsageError(
            f"argument --set task-params.eval-split: {worst['private']} of the task's "
            f"{worst['evaluated']} evaluation users are in the private population, so selecting "
            "on them is not covered by the tuning's epsilon; use task-params.eval-split=heldout, "
            "or pass --selection-on-private-users to tune anyway (the report says so)"
        )
    return worst


def tuning_seed(args: argparse.Namespace, out) -> tuple[int, bool]:
    """The tuning seed and whether it is secret (drawn from OS entropy, never printed).

    ``--seed`` is used as given. Without it, ``args.secret_seed`` when set (``compare
    --tune-grid`` checks a cell's tuning with the seed this function drew, then runs it with that
    seed), else the seed of an earlier call into ``out`` that drew its own (``out/tune.json``, the
    operator's file), so an interrupted tuning goes on with its trials; otherwise a 63-bit seed
    comes from :mod:`secrets`.
    """
    import secrets

    from fedprivopt.simulation.tune_replan import read_plan

    if args.tune_seed is not None:
        return args.tune_seed, False
    if getattr(args, "secret_seed", None) is not None:
        return args.secret_seed, True
    with contextlib.suppress(OSError, ValueError, RecursionError):
        stored = read_plan(out) or {}
        seed = stored.get("seed")
        if stored.get("seed_source") == "os-entropy" and type(seed) is int and seed >= 0:
            return seed, True
    return secrets.randbits(63), True


@dataclass
class TuningSetup:
    """What ``tune`` checks and derives from its flags before it writes anything.

    Built by :func:`prepare_tuning`; ``compare --tune-grid`` makes the same checks for every
    cell before its first tuning runs.
    """

    out: Path
    grid: dict
    overrides: dict
    base: Any
    plan: Any
    metric: str
    selection: dict | None
    seed: int
    secret: bool
    trial_count: Any
    trials: list
    cells: list
    document: dict
    """The plan ``tune.json`` records (:func:`~fedprivopt.simulation.tune_check.plan_document`)."""


_TRIAL_KEYS = {"seed": "every trial runs its own seed, drawn from the tuning seed (--seed)"}


def prepare_tuning(args: argparse.Namespace) -> TuningSetup:
    """Every check ``tune`` makes of its flags and grid points, writing nothing.

    Raises
    ------
    UsageError
        Naming the flag (``--grid``, ``--out``, ``--set``, ...).
    """
    from fedprivopt.simulation.cells import Cell, task_key
    from fedprivopt.simulation.config import config_to_toml
    from fedprivopt.simulation.tune import check_tune_dir, draw_trials, parse_grid
    from fedprivopt.simulation.tune_check import plan_digest, plan_document
    from fedprivopt.simulation.tune_grid import check_grid_overrides, refuse_table_spellings

    trial_count = trial_count_of(args)
    out = check_out_dir(args.out)
    try:
        check_tune_dir(out)
        grid = parse_grid(args.grid)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    overrides = set_overrides(args)
    base = load_preset(args.config, overrides)
    refuse_table_against_flags(args, overrides, base.strategy.strategy)
    try:
        check_grid_overrides(grid, overrides, base.strategy.strategy)
        refuse_table_spellings(overrides, _TRIAL_KEYS)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    plan, tasks, metric = plan_tuning(args, overrides, grid)
    selection = check_selection(args, tasks.values())
    seed, secret = tuning_seed(args, out)
    trials = draw_trials(grid, trial_count, seed)
    document = plan_document(
        preset=str(args.config), strategy=base.strategy.strategy, metric=metric,
        base_config_toml=config_to_toml(base), grid=grid, overrides=overrides,
        trials=trial_count, seed=seed, delta=plan.delta, drawn=trials, seed_secret=secret,
    )  # fmt: skip
    digest = plan_digest(json.loads(json.dumps(document)))  # as tune.json will read back
    cells = []
    for trial in trials:
        config = load_preset(args.config, {**overrides, **trial.hyperparameters,
                                           "seed": trial.seed}, where=trial.label)  # fmt: skip
        key = task_key(config)
        cells.append(Cell(trial.label, config, tasks[key], tuning_plan=digest))
    return TuningSetup(out, grid, overrides, base, plan, metric, selection, seed, secret,
                       trial_count, trials, cells, document)  # fmt: skip


def cmd_tune(args: argparse.Namespace) -> int:
    """``fedprivopt tune``: the best of a random number of trials, with the tuning's ε."""
    from fedprivopt.simulation.cells import plan_cells
    from fedprivopt.simulation.files import atomic_write
    from fedprivopt.simulation.ledger import RunLedger
    from fedprivopt.simulation.rundir import lock_directory, removed_if_unused
    from fedprivopt.simulation.tune import (
        TUNE_LOCK,
        check_leftover_trials,
        check_released,
        remove_outputs,
        run_trials,
        select_best,
    )
    from fedprivopt.simulation.tune_check import PLAN_FILE
    from fedprivopt.simulation.tune_replan import check_plan, discard_tuning
    from fedprivopt.simulation.tune_report import costliest_text, summary_of, write_tune_outputs

    setup = prepare_tuning(args)
    out, trials, metric, document = setup.out, setup.trials, setup.metric, setup.document
    if args.overwrite and not getattr(args, "in_comparison", False):
        _refuse_replacing_a_cell(out, document)
    strategy = setup.base.strategy.strategy
    with removed_if_unused(out, TUNE_LOCK):  # a failure before any trial: nothing left
        (out / "runs").mkdir(parents=True, exist_ok=True)
        locked = contextlib.ExitStack()
        try:
            locked.enter_context(lock_directory(out, TUNE_LOCK, what=f"tuning {str(out)!r}"))
            # ninth review of issue 15 (N5): a tuning's trials are reused only under its own plan
            if check_plan(out, document, overwrite=args.overwrite):
                discard_tuning(out)
                (out / "runs").mkdir(exist_ok=True)
            check_leftover_trials(out, [t.label for t in trials])
        except ValueError as exc:
            locked.close()
            raise UsageError(str(exc)) from None
        with locked:
            try:
                plans = plan_cells(out, setup.cells, overwrite=args.overwrite)
                remove_outputs(out)  # before a trial changes: a stopped call leaves no stale report
                atomic_write(out / PLAN_FILE, json.dumps(document, indent=2) + "\n")
            except ValueError as exc:  # a stale trial run (compare's rules), a locked run
                raise UsageError(str(exc)) from None
            progress = _TrialProgress(len(trials), enabled=not args.quiet)
            try:
                results = run_trials(plans, trials, metric=metric, on_start=progress.start,
                                     on_done=progress.done)  # fmt: skip
            finally:
                progress.close()
            released = {}
            for trial in trials:
                ledger = RunLedger.read(out / "runs" / trial.label)
                if ledger is not None:
                    released[trial.label] = ledger.total()
            plan, notes = check_released(setup.plan, released)
            maximize = metric != "eval_loss"
            best = select_best(results, maximize=maximize)
            summary = summary_of(
                preset=str(args.config), strategy=strategy, metric=metric, maximize=maximize,
                grid=setup.grid, overrides=setup.overrides, trials=setup.trial_count,
                seed=setup.seed, plan=plan, results=results, best=best, notes=notes,
                selection=setup.selection, seed_secret=setup.secret,
            )  # fmt: skip
            report = write_tune_outputs(out, summary)
        shown = (
            "no trial released"
            if best is None
            else f"best {best.trial.label} ("
            + ", ".join(f"{k}={v}" for k, v in best.trial.hyperparameters.items())
            + f") {metric} = {best.score:.4f}"
        )
        print(
            f"{len(trials)} trials, {shown}; epsilon = {summary['epsilon']:.4g} for the tuning "
            f"(one run: {summary['epsilon_single_run']:.4g}{costliest_text(summary)}) at delta = "
            f"{summary['delta']:g}; report: {report}"
        )
        return 0


def _refuse_replacing_a_cell(out: Path, document: dict) -> None:
    """Refuse ``tune --overwrite`` of a tuned comparison's cell with another plan.

    Thirty-fourth review of issue 15 (tuning, finding 5): the tuned comparison's notes give each
    cell's ``tune`` command; ``tune … --grid server-learning-rate=0.1,0.2 --out
    C/tune/dp-fedavg__sigma0.5__seed0 --overwrite`` (another grid) discarded the cell's tuning
    and ran another, rc 0, while ``C/report.md`` and ``summary.csv`` still reported the old
    tuning's released trial (server-learning-rate = 1, no longer on disk): a stale report.
    ``compare --tune-grid … --overwrite`` replaces a cell and its report together.
    """
    from fedprivopt.cli_compare_tune import TUNE_DIR
    from fedprivopt.simulation.cells import COMPARE_LOCK
    from fedprivopt.simulation.tune_replan import plan_difference, read_plan

    comparison = out.parent.parent
    if out.parent.name != TUNE_DIR or not (comparison / COMPARE_LOCK).exists():
        return
    try:
        stored = read_plan(out)
        why = None if stored is None else plan_difference(stored, document)
    except (OSError, ValueError, RecursionError):
        why = "its tune.json cannot be read"
    if why is not None:
        raise UsageError(
            f"argument --out: {str(out)!r} is a cell of the tuned comparison {str(comparison)!r}, "
            f"whose report shows its tuning; --overwrite would replace it with another plan "
            f"({why}) and leave that report stale: rerun compare --tune-grid with --overwrite "
            "for the whole comparison, or choose another --out"
        )


_COMPARE_TUNED_EPSILON = (
    "ε of a row whose strategy ends in '(tuned)' is its tuning's (the whole tuning procedure: "
    "RDP, RepeatAndSelectDpEvent), for one tuning, at the δ shown; a row over n tunings costs "
    "their composition (see Notes; epsilon_tunings_composed in summary.csv); ε of any other "
    "row is the accountant's value after each "
    "run's last completed round, at the δ shown; "
)
"""``compare-tuned``'s "Privacy parameters" sentence (it was the untuned runs' alone)."""


def cmd_compare_tuned(args: argparse.Namespace) -> int:
    """``fedprivopt compare-tuned``: compare's report at the ε that includes the tuning."""
    from fedprivopt.cli_compare_tune import composition_lines
    from fedprivopt.core.text import shown
    from fedprivopt.simulation.report import insert_summary_column, write_report
    from fedprivopt.simulation.rundata import load_runs
    from fedprivopt.simulation.tune_check import check_tunings, composed_epsilon
    from fedprivopt.simulation.tune_report import (
        TUNED_SUFFIX,
        load_tuned,
        selection_lines,
        tunings_lines,
    )
    from fedprivopt.simulation.tune_untuned import (
        REPORT_TITLE,
        check_out_outside,
        check_report_dir,
        check_untuned_copies,
        check_untuned_files,
        check_untuned_path,
        check_untuned_seeds,
        tuned_comparison_cells,
    )

    # sixteenth review of issue 15: an empty TUNED ("") was taken for the current directory
    # and the refusal named --out ("'X' is inside the tuning ''")
    tuned = [check_path_text(t, "TUNED") for t in args.tuned]
    out = check_out_dir(args.out)
    try:
        check_out_outside(out, args.tuned)
        check_report_dir(out)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for text in tuned:  # thirty-fourth review of issue 15 (tuning, finding 3)
        cells = tuned_comparison_cells(text)
        if cells and not (text / "summary.json").exists():
            raise UsageError(
                f"TUNED: {shown(str(text))} is a tuned comparison (compare --tune-grid), not one "
                f"tuning; give its {len(cells)} cells' tunings as TUNED "
                f"({shown(str(text / 'tune' / '*'))})"
            )
    runs, by_plan, sigmas = [], {}, {}
    try:
        checks = check_tunings(tuned)
        for checked in checks:  # a strategy's tunings are seeds of one plan
            runs.append(load_tuned(checked.path, checked))
            by_plan.setdefault(checked.plan["strategy"], []).append(checked)
            sigmas.setdefault(checked.plan["strategy"], set()).add(runs[-1].noise_multiplier)
        untuned = []
        for text in args.untuned or []:
            check_untuned_path(check_path_text(text, "--untuned"))
            loaded = load_runs(text)
            check_untuned_path(text, loaded)
            untuned.extend(loaded)
        check_untuned_seeds(untuned)
        check_untuned_copies(tuned, untuned)
        check_untuned_files(untuned)
        runs.extend(untuned)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.metric is not None and not any(run.has_metric(args.metric) for run in runs):
        raise UsageError(f"argument --metric: no run reports {args.metric!r}")
    _check_tuned_metric(args.metric, runs, [run.path for run in runs[: len(runs) - len(untuned)]])
    notes = (
        f"Rows whose strategy ends in '{TUNED_SUFFIX.strip()}' are the released (best) trial of "
        "a `fedprivopt tune`, one per tuning (several tunings of a strategy, e.g. with other "
        "--seed, are its seeds), and their epsilon is that of the **whole tuning procedure** "
        "(RDP, RepeatAndSelectDpEvent), not of the run alone. The other rows are untuned runs "
        "at their own run's epsilon; the hyperparameters they use were not chosen on private "
        "data by this procedure (if they were tuned on the same private data elsewhere, their "
        "epsilon understates what was spent)."
    )
    notes += "\n".join(["", *selection_lines(checks)])  # empty when every selection is covered
    # thirty-first review of issue 15, compare finding 4: a row of n tunings showed one
    # tuning's epsilon, and "Privacy parameters" called it each run's own
    # thirty-second review of issue 15, reports finding 6: tunings of a grid over
    # noise-multiplier that released different sigmas fell into rows of one tuning each (n 1)
    rows = {(s, tuple(sorted(sigmas[s]))): (len(c), composed_epsilon(c, len(c)))
            for s, c in by_plan.items()}  # fmt: skip
    notes += "\n" + "\n".join([*composition_lines(rows, empty=False), *tunings_lines(checks)])
    # thirty-third review of issue 15 (results, finding 7): a row's composed epsilon was in
    # report.md's notes alone; summary.csv has it beside each tuned row (empty: untuned)
    composed = {s + TUNED_SUFFIX: repr(eps) for (s, _), (_, eps) in rows.items()}

    def write() -> Path:
        written = write_report(out, runs, title=REPORT_TITLE, metric=args.metric, notes=notes,
                               epsilon_text=_COMPARE_TUNED_EPSILON)  # fmt: skip
        insert_summary_column(out / "summary.csv", "epsilon_tunings_composed", "epsilon",
                              lambda line: composed.get(line["strategy"], ""))  # fmt: skip
        return written

    report = _write_whole_report(out, write)
    print(f"report: {report}")
    return 0


def _check_tuned_metric(metric: str | None, runs: list, tunings: list[Path]) -> None:
    """Refuse a report metric a tuning's released trial (``runs[i]``, in ``tunings[i]``) lacks.

    Thirty-first review of issue 15 (compare, finding 7): ``compare-tuned T --untuned C``,
    ``C`` of another task, chose ``C``'s metric (or ``--metric`` named it) and skipped ``T``'s
    released trial with a warning: rc 0, a tuned comparison without a tuned row, whose notes
    still gave that tuning's ε.
    """
    from fedprivopt.core.text import shown
    from fedprivopt.simulation.rundata_aggregate import choose_metric

    try:
        chosen = choose_metric(runs) if metric is None else metric
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for path, run in zip(tunings, runs, strict=False):
        if not run.has_metric(chosen):
            how = "given" if metric is not None else "chosen for the runs; give --metric"
            raise UsageError(
                f"argument --metric: {chosen!r} ({how}) is not reported by the released trial "
                f"{shown(str(path))}; compare-tuned reports every tuning it is given"
            )


def _write_whole_report(out: Path, write):
    """``write()``'s report in ``out``, or, if it stops (Ctrl-C, a full disk), no report files.

    Twenty-eighth review of issue 15: Ctrl-C while ``compare-tuned`` wrote its report (2.8 s
    into a 3.3 s call) left ``summary.csv`` and ``metric_vs_round.png`` without ``report.md``,
    and the same command was then refused: "holds 'metric_vs_round.png', which compare-tuned
    did not write". An earlier report of ours in ``out`` (checked before) is removed first, so
    that none of its files is left beside the new ones; a stopped write removes what it wrote,
    and ``out`` itself if this call created it.
    """
    from fedprivopt.simulation.cells import REPORT_FILES

    created = not out.exists()
    for name in REPORT_FILES:
        (out / name).unlink(missing_ok=True)
    try:
        return write()
    except BaseException:
        for name in REPORT_FILES:
            with contextlib.suppress(OSError):
                (out / name).unlink(missing_ok=True)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise


def add_tune(sub) -> None:
    """Add ``tune`` and ``compare-tuned`` to the subcommands ``sub``."""
    from fedprivopt.privacy.tuning import MAX_MEAN_TRIALS, MAX_SHAPE, TRIAL_DISTRIBUTIONS
    from fedprivopt.simulation.config import ENGINES
    from fedprivopt.strategies.config import STRATEGIES

    p = sub.add_parser(
        "tune",
        help="private hyperparameter tuning: the best of a random number of trials",
        description="Run a random number K of trials (Papernot & Steinke, ICLR 2022: K from a "
        "truncated negative binomial or a Poisson distribution with mean --mean-trials), each a "
        "simulation of --strategy with hyperparameters drawn uniformly from the --grid, and "
        "release the best by the task metric of its final evaluation (a failed or diverged "
        "trial counts and loses). OUT/summary.json has 'epsilon' for the whole procedure "
        "(dp-accounting's RDP accountant on RepeatAndSelectDpEvent around one run's events) and "
        "'epsilon_single_run' beside it; a preset's target epsilon applies to each single run. "
        "Trials are OUT/runs/trial-NNN; an earlier call's run is reused (or resumed) only when "
        "its configuration is the trial's, as compare does.",
        epilog="example:\n  fedprivopt tune simulations/toy.toml --strategy dp-fedadam "
        "--grid server-learning-rate=0.01,0.03,0.1 --grid local-learning-rate=0.1,0.5 "
        "--mean-trials 5 --out runs/tune-fedadam",
        formatter_class=HelpFormatter,
    )
    p.add_argument("config", type=preset_path, metavar="PRESET", help="preset TOML file")
    p.add_argument(
        "--strategy", choices=STRATEGIES, help="strategy to tune (default: the preset's)"
    )
    p.add_argument("--grid", action="append", metavar="KEY=V1,V2,...", required=True,
                   help="a preset key and its values, typed as --set types them and "
                   "separated by commas (repeatable; each trial draws every key uniformly)",
                   )  # fmt: skip
    p.add_argument(
        "--mean-trials",
        type=float_range(1.0, MAX_MEAN_TRIALS, lo_open=False, hi_open=False),
        required=True,
        metavar="K",
        help=f"mean number of trials, in [1, {MAX_MEAN_TRIALS:g}]",
    )
    p.add_argument("--distribution", choices=TRIAL_DISTRIBUTIONS,
                   default="truncated-negative-binomial",
                   help="distribution of the number of trials")  # fmt: skip
    p.add_argument(
        "--nb-shape",
        type=float_range(0.0, MAX_SHAPE, lo_open=False, hi_open=False),
        metavar="ETA",
        help=f"shape eta of the truncated negative binomial, in [0, {MAX_SHAPE:g}] (0: "
        "logarithmic, 1: geometric; default 1)",
    )
    p.add_argument("--out", default="runs/tune", metavar="DIR", help="output directory")
    p.add_argument("--seed", dest="tune_seed", type=SEED, metavar="N",
                   help=f"tuning seed, in [0, {MAX_SEED}]: the number of trials, their "
                   "hyperparameters and run seeds; epsilon assumes it stays secret (default: "
                   "drawn from OS entropy, kept only in OUT/tune.json)")  # fmt: skip
    p.add_argument("--selection-on-private-users", action="store_true",
                   help="tune although the task's evaluation users are in the private "
                   "population (e.g. StackOverflow's eval-split test); the selection is then "
                   "NOT covered by epsilon, and the summary says so")  # fmt: skip
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="rerun a trial whose earlier run in OUT/runs has another configuration",
    )
    p.add_argument("--engine", choices=ENGINES, help="fast (in process) or flower (Ray)")
    p.add_argument("--rounds", type=int_at_least(1), metavar="R", help="num-server-rounds")
    p.add_argument(
        "--metric",
        choices=_METRICS,
        help="selection metric (default: the task's own; eval_loss is minimized)",
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a preset key")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_tune, seed=None, tensorboard=None)

    p = sub.add_parser(
        "compare-tuned",
        help="compare tuned strategies at the epsilon that includes their tuning",
        description="Write compare's report (summary.csv, report.md, plots) over the released "
        "trial of each tuning directory, at the epsilon of its whole tuning, optionally beside "
        "untuned runs (a compare output or run directories) at their own epsilon.",
        epilog="example:\n  fedprivopt compare-tuned runs/tune-fedavg runs/tune-fedadam "
        "--untuned runs/compare --out runs/tuned-report",
        formatter_class=HelpFormatter,
    )
    p.add_argument("tuned", nargs="+", metavar="TUNED", help="directories written by tune")
    p.add_argument(
        "--untuned",
        action="append",
        metavar="DIR",
        help="a compare output or run directory to show beside (repeatable)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="report directory")
    p.add_argument("--metric", choices=_METRICS, help="task metric of the report")
    p.set_defaults(func=cmd_compare_tuned)
