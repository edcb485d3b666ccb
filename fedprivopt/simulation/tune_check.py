"""What ``fedprivopt compare-tuned`` checks before it reports a tuning's released trial.

``fedprivopt tune`` writes ``tune.json`` (:mod:`fedprivopt.simulation.tune_plan`) before any
trial runs: the base configuration (the preset with the call's overrides), the grid, the
distribution of the number of trials, the tuning seed, δ and the drawn trials (label,
hyperparameters, run seed).
:func:`check_tuning` then recomputes the tuning's ε from what the files show, never trusting one
file alone:

* ``summary.json`` must agree with ``tune.json`` (distribution, seed, δ, grid, metric,
  strategy, trials), and ``tune.json``'s trials must be those its seed draws
  (:func:`~fedprivopt.simulation.tune_plan.cross_check`,
  :func:`~fedprivopt.simulation.tune_plan.check_draws`);
* every trial's ``config.toml`` must be the base configuration with the trial's hyperparameters
  and seed, its privacy ledger must match that configuration
  (:meth:`~fedprivopt.simulation.ledger.RunLedger.check_config`), state the same δ and name
  ``tune.json``'s plan by its digest (:func:`~fedprivopt.simulation.tune_plan.plan_digest`,
  recorded when the trial started), so that a grid or trial count rewritten in ``tune.json``
  and ``summary.json`` alike is refused unless every trial's ledger is rewritten too;
* the single run's bound is recomputed from the base configuration over every grid point
  (:func:`~fedprivopt.simulation.tune.planned_ledger`,
  :func:`~fedprivopt.simulation.tune.dominating_plan`), raised to any trial ledger beyond it;
* the released run must be the best trial's directory inside ``runs/``, and pass the audit a
  resume makes (:func:`~fedprivopt.simulation.audit.audit_run_dir`).

The ε used is the largest of the recomputed one and those the summary states.

The per-trial checks (a trial's ``config.toml`` and ledger, and the ε its other files state)
are in :mod:`fedprivopt.simulation.tune_trials` (split from this module).
"""

from __future__ import annotations

import contextlib
import math
import operator
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedprivopt.core.text import shown
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.tuning import (
    composed_tuning_epsilon,
    finite_orders,
    tuning_epsilon,
)
from fedprivopt.simulation.files import SMALL_FILE_LIMIT, check_regular, parse_json
from fedprivopt.simulation.tune_plan import (
    PLAN_FILE,
    check_draws,
    cross_check,
    plan_digest,  # also the public path docs/RELIABILITY.md names (tune_check.plan_digest)
    read_trial_count,
    same_json,
)
from fedprivopt.simulation.tune_trials import check_trial, load_trial_config

__all__ = [
    "TunedCheck",
    "check_tuning",
    "check_tunings",
    "composed_epsilon",
    "plan_digest",
]


@dataclass(frozen=True)
class TunedCheck:
    """A tuning directory that passed :func:`check_tuning`.

    Attributes
    ----------
    path : pathlib.Path
    epsilon : float
        The tuning's ε: the largest of the recomputed one and those the summary states.
    best_dir : pathlib.Path
        The released trial's run directory (inside ``runs/``).
    base_config : RunConfig
        The base configuration (the preset with the call's overrides).
    plan : dict
        ``tune.json``.
    run : RunData
        The released run, read while its directory was locked.
    ledgers : tuple
        The single-run ledgers :attr:`epsilon` was computed from (recomputed from the trials'
        files, and the one ``summary.json`` states); ``None`` for a non-private one.
    trials : TrialCount
        The plan's trial count.
    selection : dict or None
        ``{"private": k, "evaluated": n}``: ``k`` of the ``n`` evaluation users the selection
        read are in the private population (``k > 0``: tuned with
        ``--selection-on-private-users``, the selection not covered by :attr:`epsilon`);
        ``None`` when a task does not say (not checked). Recomputed from the tasks of the grid
        points (:func:`~fedprivopt.simulation.tune_notes.selection_users`).
    """

    path: Path
    epsilon: float
    best_dir: Path
    base_config: Any
    plan: dict[str, Any]
    run: Any
    ledgers: tuple = ()
    trials: Any = None
    selection: dict | None = None


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {what} cannot be read ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not {what}")
    return data


class _Builder:
    """Configurations from the base configuration with overrides, and their built runs."""

    def __init__(self, base_toml: str, tmp: Path) -> None:
        self.base = tmp / "base.toml"
        self.base.write_text(base_toml, encoding="utf-8")
        self.tasks: dict[tuple, Any] = {}

    def config(self, overrides: Mapping[str, Any]):
        return load_trial_config(self.base, overrides)

    def build(self, config):
        from fedprivopt.simulation.cells import task_key
        from fedprivopt.simulation.run import build_run

        key = task_key(config)
        task, alg = build_run(config, self.tasks.get(key))
        self.tasks[key] = task
        return task, alg


def _recomputed_ledger(path: Path, builder: _Builder, plan: dict[str, Any], released):
    """The single run's bound over every grid point, raised to a trial's ledger beyond it.

    As ``tune`` computes it (:func:`~fedprivopt.simulation.tune.check_released` of the
    dominating grid point, at that run's own finite orders); returns the ledger and the orders.
    """
    from fedprivopt.simulation.tune import (
        PrivacyPlan,
        check_released,
        dominating_plan,
        grid_points,
        planned_ledger,
    )

    plans = []
    for point in grid_points(plan["grid"]):
        config = builder.config(point)
        _, alg = builder.build(config)
        plans.append((point, planned_ledger(config, alg)))
    point, ledger = dominating_plan(plans)
    if ledger is None:
        return None, None
    single = PrivacyPlan(
        ledger, point, float(plan["delta"]), "rdp", orders=finite_orders([ledger])
    )  # the costliest run's own orders (as tune: issue 20 review, finding 3)
    try:
        bound, _ = check_released(single, released)
    except ValueError:
        raise ValueError(
            f"{path / 'runs'}: a trial's privacy ledger exceeds the single run its "
            "configuration plans, and no ledger bounds the others"
        ) from None
    return bound.ledger, bound.orders


def _stated_ledger(path: Path, summary: dict[str, Any]):
    led = summary["single_run"]["ledger"]
    if led is None:
        return None
    try:
        return tuple((SubsampledGaussianEvent.from_dict(x["event"]), int(x["count"])) for x in led)
    except ValueError as exc:
        raise ValueError(f"{path / 'summary.json'}: its single_run.ledger: {exc}") from None


def _stated_epsilon(path: Path, summary: dict[str, Any]) -> float:
    """The summary's ``epsilon``: a number >= 0 (``inf``: a non-private tuning), never NaN."""
    value = summary["epsilon"]
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or value < 0
    ):
        raise ValueError(
            f"{path / 'summary.json'}: its epsilon {shown(value)} is not a number >= 0; the "
            "tuning's files were edited"
        )
    return float(value)


def _best_dir(path: Path, summary: dict[str, Any], plan: dict[str, Any]) -> Path:
    best = summary["best"]
    label = best.get("trial")
    if label not in {t["trial"] for t in plan["trials"]}:
        raise ValueError(f"{path / 'summary.json'}: its best trial {shown(label)} is no trial")
    runs = (path / "runs").resolve()
    wanted = runs / str(label)
    stated = best.get("run_dir")
    if not isinstance(stated, str) or (path / stated).resolve() != wanted:
        raise ValueError(
            f"{path / 'summary.json'}: best.run_dir {shown(stated)} is not the best trial's "
            f"directory inside {runs}; refusing to report another run"
        )
    return wanted


def check_tuning(path: str | Path) -> TunedCheck:
    """Check a tuning directory and recompute its ε (see the module docstring).

    Raises
    ------
    ValueError
        Naming the file whose content disagrees, or the directory when it is no finished
        tuning or released no trial.
    """
    from fedprivopt.data.locks import LockHeldError
    from fedprivopt.simulation.audit import audit_run_dir
    from fedprivopt.simulation.rundata import load_run
    from fedprivopt.simulation.rundir import reading_lock
    from fedprivopt.simulation.tune_best import check_best, recompute_best
    from fedprivopt.simulation.tune_notes import selection_users

    path = Path(path)
    for name in ("summary.json", PLAN_FILE):  # a FIFO would block, a 20 GB file fill memory
        check_regular(path / name, limit=SMALL_FILE_LIMIT)  # eighteenth review of issue 15
    if not (path / "summary.json").is_file():
        raise ValueError(f"{path}: not a finished tuning (no summary.json)")
    summary = _read_json(path / "summary.json", "a tuning's summary")
    if summary.get("kind") != "fedprivopt-tune":
        raise ValueError(f"{path}: its summary.json is not a tuning's (fedprivopt tune)")
    if not summary.get("best"):
        raise ValueError(f"{path}: the tuning released no trial")
    if not (path / PLAN_FILE).is_file():
        raise ValueError(
            f"{path}: no {PLAN_FILE} (written by tune before its trials), so its epsilon "
            "cannot be checked; run the tuning again with this version"
        )
    plan = _read_json(path / PLAN_FILE, "a tuning's plan")
    try:
        if plan.get("kind") != "fedprivopt-tune-plan":
            raise ValueError(f"{path / PLAN_FILE}: not a tuning's plan")
        cross_check(path, summary, plan)
        trials = read_trial_count(path, plan["trial_count"])
        check_draws(path, plan, trials)
        best_dir = _best_dir(path, summary, plan)
        delta = float(plan["delta"])
        stated_ledger = _stated_ledger(path, summary)
        stated_eps = _stated_epsilon(path, summary)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"{path}: its summary.json or {PLAN_FILE} cannot be read ({shown(str(exc))})"
        ) from None
    with tempfile.TemporaryDirectory() as tmp:
        builder = _Builder(str(plan["base_config"]), Path(tmp))
        try:
            base = builder.config({})
        except ValueError as exc:
            raise ValueError(f"{path / PLAN_FILE}: its base_config: {exc}") from None
        if not same_json(base.strategy.delta, delta):
            raise ValueError(f"{path / PLAN_FILE}: its delta disagrees with its base_config")
        released = {}
        digest = plan_digest(plan)
        entries = {e.get("trial"): e for e in summary["trials"] if isinstance(e, Mapping)}
        for trial in plan["trials"]:
            led = check_trial(path, builder, trial, delta, digest, entries.get(trial["trial"]))
            if led is not None:
                released[trial["trial"]] = led
        if best_dir.name not in released:
            raise ValueError(
                f"{best_dir}: the released trial has no privacy ledger naming {PLAN_FILE}'s plan"
            )
        try:
            ledger, orders = _recomputed_ledger(path, builder, plan, released)
        except ValueError as exc:
            raise ValueError(f"{path / PLAN_FILE}: {exc}") from None
        selection = selection_users(builder.tasks.values())  # every grid point's task

        def task_of(entry):
            return builder.build(builder.config({**entry["hyperparameters"],
                                                 "seed": entry["seed"]}))[0]  # fmt: skip

        # the released trial's own checks first: thirty-eighth review of issue 15 (reports,
        # finding 2): a data directory holding other data (or a task module edited) failed
        # every trial, and the refusal said "its runs select none ...; the tuning's files were
        # edited", not what changed
        try:
            with reading_lock(best_dir):
                task, _ = builder.build(builder.config({}))
                try:
                    state = audit_run_dir(best_dir, task, engine=False)
                except ValueError as exc:  # named once: most checks name the trial's file
                    text = str(exc)
                    raise ValueError(
                        text if text.startswith(f"{best_dir}/") else f"{best_dir}: {text}"
                    ) from None
                why = state.unfinished()
                if why is not None:
                    raise ValueError(f"{best_dir}: the released trial is not finished ({why})")
                run = load_run(best_dir)
        except LockHeldError as exc:  # running now (as tune_best._score says it)
            raise ValueError(f"{best_dir}: {exc}; try again once it has finished") from None
        check_best(path, best_dir.name, recompute_best(path, plan, task_of))
    candidates = [stated_eps]
    candidates.append(math.inf if ledger is None else tuning_epsilon(ledger, delta, trials, orders))
    if stated_ledger is not None:
        candidates.append(tuning_epsilon(stated_ledger, delta, trials, orders))
    ledgers = (ledger,) if stated_ledger is None else (ledger, stated_ledger)
    return TunedCheck(path, max(candidates), best_dir, base, plan, run, ledgers, trials,
                      selection)  # fmt: skip


def composed_epsilon(checks: Sequence[TunedCheck], count: int) -> float:
    """ε of publishing ``count`` tunings of one plan (a report row's seeds) on the same users.

    Each tuning's ``RepeatAndSelectDpEvent`` self-composed ``count`` times
    (:func:`~fedprivopt.privacy.tuning.composed_tuning_epsilon`), over every ledger of
    ``checks`` (the tunings that released a trial; ``count`` may be larger, counting those
    that released nothing), and never less than one tuning's ε.

    Forty-third review of issue 15 (reports, finding 1): ``composed_epsilon(iter(checks), 2)``
    (a one-shot iterable, as a generator over tunings gives) read the checks once for their
    own ε and found none left to compose: it returned one tuning's ε (9.03) where publishing
    both costs 13.33. ``checks`` is read into a list first.
    """
    checks = list(checks)
    if not checks:
        raise ValueError("checks: empty; need at least one checked tuning")
    # finding 6: composed_epsilon([c1, c2], 1) gave one tuning's 9.03 for two (13.33)
    with contextlib.suppress(TypeError):  # a count that is no integer: refused below
        if operator.index(count) < len(checks):
            raise ValueError(
                f"count must be at least the number of checks ({len(checks)}): every tuning "
                f"given is published, got {shown(count)}"
            )
    eps = [check.epsilon for check in checks]
    for check in checks:
        delta = float(check.plan["delta"])
        eps += [math.inf if led is None else composed_tuning_epsilon(led, delta, check.trials,
                                                                     count)
                for led in check.ledgers]  # fmt: skip
    return max(eps)


def check_tunings(paths: Sequence[str | Path]) -> list[TunedCheck]:
    """:func:`check_tuning` of each path; refuse one given twice or tunings that are not seeds.

    Tunings of one strategy make one row of the report, their tunings its seeds: they must be
    different directories, with different tuning seeds, of one base configuration (but its
    seed), grid, trial distribution and metric.

    Raises
    ------
    ValueError
        Naming the second directory and what it repeats or changes.
    """
    from fedprivopt.simulation.cell_plans import first_difference

    checked: list[TunedCheck] = []
    seen: dict[Path, str] = {}
    for text in paths:
        resolved = Path(text).resolve()
        if resolved in seen:
            raise ValueError(
                f"TUNED: {shown(str(text))} names the directory of {shown(seen[resolved])} "
                "again; a tuning counts once, not as two seeds"
            )
        seen[resolved] = str(text)
        one = check_tuning(text)
        for other in checked:
            if other.plan["strategy"] != one.plan["strategy"]:
                continue
            for key in ("grid", "trial_count", "metric"):
                if key == "grid" and _same_grid(other.plan, one.plan):
                    continue  # forty-eighth review of issue 15 (compare 4): =1,2 and =1.0,2.0
                if not same_json(other.plan[key], one.plan[key]):
                    raise ValueError(
                        f"TUNED: {shown(str(text))} has another {key} than "
                        f"{shown(str(other.path))}; tunings of one strategy are its seeds only "
                        "when they differ in the seed alone"
                    )
            diff = first_difference(
                _without_seed(other.base_config), _without_seed(one.base_config)
            )
            if diff is not None:
                key, old, new = diff
                raise ValueError(
                    f"TUNED: {shown(str(text))} has {key} = {shown(new)}, "
                    f"{shown(str(other.path))} {shown(old)}; tunings of one strategy are its "
                    "seeds only when their configurations differ in the seed alone"
                )
            if other.plan["seed"] == one.plan["seed"]:
                raise ValueError(
                    f"TUNED: {shown(str(text))} has the tuning seed of {shown(str(other.path))}; "
                    "the same tuning cannot be two of its seeds"
                )
        checked.append(one)
    return checked


def _same_grid(first: Mapping[str, Any], second: Mapping[str, Any]) -> bool:
    """Whether two tunings' grids make the same trials from ``second``'s base configuration.

    Forty-eighth review of issue 15 (compare 4; sameness 7's twin): ``compare-tuned T T4`` of
    ``tune ... --grid server-learning-rate=1,2 --seed 1 --out T`` and the same with ``=1.0,2.0
    --seed 2 --out T4`` was refused as "another grid", though each value makes the same trial
    configuration: a tuning run again to match the spelling is a release more. The grids are
    compared value by value (:func:`~fedprivopt.simulation.tune_replan.same_grid`).
    """
    from fedprivopt.simulation.tune_replan import same_grid

    old, new = first.get("grid"), second.get("grid")
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return False
    with tempfile.TemporaryDirectory() as tmp:
        try:
            builder = _Builder(str(second["base_config"]), Path(tmp))
        except (OSError, KeyError):
            return False
        return same_grid(old, new, builder.config)


def _without_seed(config):
    import dataclasses

    return dataclasses.replace(config, strategy=dataclasses.replace(config.strategy, seed=0))
