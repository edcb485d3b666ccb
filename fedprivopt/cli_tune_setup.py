"""What ``fedprivopt tune`` checks and derives from its flags before it writes anything.

:func:`prepare_tuning` makes every check of ``tune``'s flags and grid points (the trial-count
distribution, each point's run built and checked, the single run's privacy bound, the selection
metric and whether the selection reads private users' data, the tuning seed) and returns the
:class:`TuningSetup` that :func:`~fedprivopt.cli_tune.cmd_tune` runs; ``compare --tune-grid``
(:mod:`fedprivopt.cli_compare_tune`) makes the same checks for every cell before its first tuning.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedprivopt.cli_args import UsageError, check_out_dir
from fedprivopt.cli_runs import (
    build_checked_run,
    load_preset,
    refuse_table_against_flags,
    set_overrides,
)

__all__ = [
    "TuningSetup",
    "check_selection",
    "plan_tuning",
    "prepare_tuning",
    "trial_count_of",
    "tuning_seed",
]


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
    from fedprivopt.simulation.tune_notes import selection_users

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
    """The plan ``tune.json`` records (:func:`~fedprivopt.simulation.tune_plan.plan_document`)."""


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
    from fedprivopt.simulation.tune import draw_trials, parse_grid
    from fedprivopt.simulation.tune_dir import check_tune_dir
    from fedprivopt.simulation.tune_grid import check_grid_overrides, refuse_table_spellings
    from fedprivopt.simulation.tune_plan import plan_digest, plan_document
    from fedprivopt.simulation.tune_replan import stored_grid

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
    # forty-eighth review of issue 15 (compare; sameness 7): =1.0,2.0 after =1,2 continues it
    grid = stored_grid(out, grid, lambda point: load_preset(args.config, {**overrides, **point}))
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
