"""The command line's ``tune``: private hyperparameter tuning.

``fedprivopt tune PRESET --strategy S --grid KEY=V1,V2,... --mean-trials K --out DIR`` runs a
random number of trials (Papernot & Steinke 2022), releases the best and writes
``OUT/summary.json`` with the ε of the whole procedure beside one run's
(:mod:`fedprivopt.simulation.tune`, :mod:`fedprivopt.simulation.tune_report`).

Every flag and every grid point is checked before anything is written (exit 2, one line):
:func:`~fedprivopt.cli_tune_setup.prepare_tuning`. ``compare-tuned`` is
:mod:`fedprivopt.cli_compare_tuned`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from fedprivopt.cli_args import (
    MAX_SEED,
    SEED,
    HelpFormatter,
    UsageError,
    float_range,
    int_at_least,
    preset_path,
)
from fedprivopt.cli_tune_setup import prepare_tuning
from fedprivopt.core.text import epsilon_text

__all__ = ["METRICS", "add_tune", "cmd_tune"]

METRICS = ("eval_accuracy", "eval_recall_at_5", "eval_precision_at_5", "eval_loss")
"""``--metric``'s choices: the task metrics of ``tune`` and ``compare-tuned``."""


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


def cmd_tune(args: argparse.Namespace) -> int:
    """``fedprivopt tune``: the best of a random number of trials, with the tuning's ε."""
    from fedprivopt.simulation.cell_plans import plan_cells
    from fedprivopt.simulation.files import atomic_write
    from fedprivopt.simulation.ledger import RunLedger
    from fedprivopt.simulation.rundir import lock_directory, removed_if_unused
    from fedprivopt.simulation.tune import check_released, run_trials, select_best
    from fedprivopt.simulation.tune_dir import (
        TUNE_LOCK,
        check_leftover_trials,
        check_vanished_trials,
        remove_outputs,
    )
    from fedprivopt.simulation.tune_plan import PLAN_FILE
    from fedprivopt.simulation.tune_replan import check_plan, discard_tuning
    from fedprivopt.simulation.tune_report import costliest_text, summary_of, write_tune_outputs

    setup = prepare_tuning(args)
    out, trials, metric, document = setup.out, setup.trials, setup.metric, setup.document
    if args.overwrite and not getattr(args, "in_comparison", False):
        _refuse_replacing_a_cell(out, document)
    strategy = setup.base.strategy.strategy
    with removed_if_unused(out, TUNE_LOCK):  # a failure before any trial: nothing left
        out.mkdir(parents=True, exist_ok=True)
        locked = contextlib.ExitStack()
        try:
            locked.enter_context(lock_directory(out, TUNE_LOCK, what=f"tuning {str(out)!r}"))
            (out / "runs").mkdir(exist_ok=True)  # after the lock (forty-third review, lead 3)
            # ninth review of issue 15 (N5): a tuning's trials are reused only under its own plan
            if check_plan(out, document, overwrite=args.overwrite):
                discard_tuning(out)
                (out / "runs").mkdir(exist_ok=True)
            check_leftover_trials(out, [t.label for t in trials])
            check_vanished_trials(out)  # forty-fifth review of issue 15 (reports, finding 3)
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

            def start(trial, action: str) -> None:
                _in_place(out)  # forty-fourth review follow-up of issue 15 (ledger, open row)
                progress.start(trial, action)

            try:
                results = run_trials(plans, trials, metric=metric, on_start=start,
                                     on_done=progress.done)  # fmt: skip
            finally:
                progress.close()
            _in_place(out)
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
            f"{len(trials)} trials, {shown}; epsilon = {epsilon_text(summary['epsilon'])} for "
            f"the tuning (one run: {epsilon_text(summary['epsilon_single_run'])}"
            f"{costliest_text(summary)}) at delta = "
            f"{summary['delta']:g}; report: {report}"
        )
        return 0


def _in_place(out: Path) -> None:
    """Stop (``UsageError``) if the tuning's directory was moved or replaced while it ran."""
    from fedprivopt.simulation.rundir import check_output_held

    try:
        check_output_held(out, "tuning")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


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


def add_tune(sub) -> None:
    """Add ``tune`` to the subcommands ``sub``."""
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
        choices=METRICS,
        help="selection metric (default: the task's own; eval_loss is minimized)",
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a preset key")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_tune, seed=None, tensorboard=None)
