"""Private hyperparameter tuning (``fedprivopt tune``): draw the trials, run them, pick the best.

The procedure of Papernot and Steinke (2022): draw the number of trials ``K`` from a known
distribution (:class:`~fedprivopt.privacy.tuning.TrialCount`), run ``K`` independent trials, each
a normal simulation whose hyperparameters are drawn uniformly from the grid, and release only the
best trial by the task metric of its final evaluation. A trial that fails (raises) or diverges (a
non-finite metric or evaluation loss) counts as a trial and loses.

Privacy. Every trial is accounted by its own run (its privacy ledger). The tuning bound needs one
run's RDP curve that holds for *every* trial: :func:`planned_ledger` is what a grid point's run
may release at most (its rounds, or fewer where the target ε of the preset stops it; the target
applies to each single run), and :func:`dominating_plan` picks the grid point whose RDP curve is
at least every other's at every order (a run with hyperparameters drawn at random is a mixture,
whose Rényi divergence is at most the largest of its components'). The whole procedure's ε is
then :func:`~fedprivopt.privacy.tuning.tuning_epsilon` of that ledger. After the trials,
:func:`check_released` makes sure no trial's ledger exceeds the bound (a resumed secure-mode run
charges redone rounds again).

Randomness. All draws come from explicit generators keyed by the tuning seed
(:func:`~fedprivopt.privacy.rng.derive_seed`): ``K`` from ``("tune", "count")``, trial ``i``'s
hyperparameters from ``("tune", "trial", i)`` and its run seed from ``("tune", "run", i)``, so
trial ``i`` is the same whatever ``K`` is, and every trial has its own seed (independent runs).

Trials are run as ``compare`` runs its cells (:mod:`fedprivopt.simulation.cells`): one run
directory per trial under ``OUT/runs/``, an earlier call's run reused (or resumed) only when its
stored configuration equals the trial's. What ``--out`` may hold, and the files ``tune`` writes
there: :mod:`fedprivopt.simulation.tune_dir`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedprivopt.core.text import shown
from fedprivopt.privacy.accounting import compose_epsilon
from fedprivopt.privacy.accounting_state import Ledger, merge_ledger
from fedprivopt.privacy.rng import derive_seed
from fedprivopt.privacy.tuning import (
    TrialCount,
    finite_orders,
    ledger_rdp,
    mechanisms_of,
    rdp_dominates,
    tuning_epsilon,
)
from fedprivopt.simulation.tune_grid import (
    FORBIDDEN_GRID_KEYS,
    MAX_GRID_POINTS,
    TUNABLE_TASK_PARAMS,
    grid_points,
    parse_grid,
)

__all__ = [
    "FORBIDDEN_GRID_KEYS",
    "MAX_GRID_POINTS",
    "TUNABLE_TASK_PARAMS",
    "PrivacyPlan",
    "Trial",
    "TrialResult",
    "check_metric",
    "check_released",
    "dominating_plan",
    "draw_trials",
    "grid_points",
    "parse_grid",
    "planned_ledger",
    "select_best",
]

_RUN_SEED_MODULUS = 2**31


# -- the trials --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One trial: its number (from 1), run directory name, hyperparameters and run seed."""

    index: int
    label: str
    hyperparameters: dict[str, Any]
    seed: int


def draw_trials(grid: Mapping[str, Sequence[Any]], trials: TrialCount, seed: int) -> list[Trial]:
    """Draw ``K ~ trials`` and each trial's hyperparameters (uniform per key) and run seed.

    Each key's value is drawn uniformly and independently, so a trial's point is uniform over
    the grid. See the module docstring for the generators.
    """
    count = trials.sample(np.random.default_rng(derive_seed(seed, "tune", "count")))
    width = max(3, len(str(count)))
    out = []
    for i in range(1, count + 1):
        rng = np.random.default_rng(derive_seed(seed, "tune", "trial", i))
        point = {key: values[int(rng.integers(len(values)))] for key, values in grid.items()}
        run_seed = derive_seed(seed, "tune", "run", i) % _RUN_SEED_MODULUS
        out.append(Trial(i, f"trial-{i:0{width}d}", point, run_seed))
    return out


# -- privacy -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrivacyPlan:
    """The single run's privacy bound behind the tuning ε.

    Attributes
    ----------
    ledger : tuple of (SubsampledGaussianEvent, int) or None
        What one run may release at most (``None``: the strategy is not private).
    point : dict
        The grid point whose run it is.
    delta : float
    accountant : str
        The runs' own accountant (the tuning ε is always RDP).
    accountant_settings : dict
        ``pld_discretization`` and ``prv_eps_error`` of the runs' accountant.
    target_epsilon : float or None
        The preset's target ε, which applies to each single run.
    orders : tuple of float or None
        The RDP orders of the tuning bound (``None``: dp-accounting's default list); orders at
        which dp-accounting gives :attr:`ledger` itself a non-finite RDP are left out
        (:func:`~fedprivopt.privacy.tuning.finite_orders` of that ledger alone), as
        ``RepeatAndSelectDpEvent`` of that run does.
    """

    ledger: Ledger | None
    point: dict[str, Any]
    delta: float
    accountant: str
    accountant_settings: dict[str, float] = field(default_factory=dict)
    target_epsilon: float | None = None
    orders: tuple[float, ...] | None = None

    def epsilon_single_run(self, accountant: str = "rdp") -> float:
        """ε of one run that releases :attr:`ledger`, by ``accountant``."""
        if self.ledger is None:
            return math.inf
        kwargs = self.accountant_settings if accountant == self.accountant else {}
        return compose_epsilon(self.ledger, self.delta, accountant=accountant, **kwargs)

    def epsilon(self, trials: TrialCount) -> float:
        """ε of the whole tuning (RDP, ``RepeatAndSelectDpEvent``)."""
        if self.ledger is None:
            return math.inf
        return tuning_epsilon(self.ledger, self.delta, trials, self.orders)


def planned_ledger(config, alg) -> Ledger | None:
    """The most a run of ``config`` releases (``None`` when the strategy is not private).

    The events of rounds ``1 .. num-server-rounds`` (``alg.round_events(r)``: under tree
    aggregation a period's event at its first round only), or of as many rounds as its target ε
    allows: the largest ``n`` whose ε stays within it, by the run's own accountant (a run stops
    before the round that would exceed the target; ε grows with ``n``, so bisection finds it).
    """
    if not alg.round_events():
        return None
    s = config.strategy
    every = alg.round_events()  # what a charging round releases
    # tree aggregation: a period's first round releases its event, the other rounds nothing
    uniform = all(alg.round_events(r) == every for r in range(1, s.num_server_rounds + 1))

    def rounds(n: int) -> Ledger:
        if uniform:
            return merge_ledger((event, n) for event in every)
        counts: dict[Any, int] = {}
        for r in range(1, n + 1):
            for event in alg.round_events(r):
                counts[event] = counts.get(event, 0) + 1
        return merge_ledger(counts.items())

    total = s.num_server_rounds
    if s.target_epsilon is None:
        return rounds(total)
    acc = alg.accountant
    kwargs = {"pld_discretization": acc.pld_discretization, "prv_eps_error": acc.prv_eps_error}

    def within(n: int) -> bool:
        return compose_epsilon(rounds(n), s.delta, accountant=acc.accountant, **kwargs) <= (
            s.target_epsilon
        )

    lo, hi = 0, total  # within(lo) holds (nothing released); find the largest n within
    if within(hi):
        return rounds(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if within(mid) else (lo, mid)
    return rounds(lo)


def dominating_plan(
    plans: Sequence[tuple[dict[str, Any], Ledger | None]],
    orders: tuple[float, ...] | None = None,
) -> tuple[dict[str, Any], Ledger | None]:
    """The ``(point, ledger)`` whose RDP curve is at least every other's at every order.

    A non-private point makes the whole tuning non-private (its ledger ``None``). Curves are
    compared at ``orders`` (default: dp-accounting's), leaving out the orders where the curve
    compared against is not finite (dp-accounting failed there: ``rdp_dominates``). The
    tuning bound is computed at the orders where the chosen ledger alone is finite
    (``finite_orders([ledger])``): RDP is monotone in σ, the sampling rate and the rounds, so
    its value bounds the others there too (issue 20 review, finding 3: dropping a cheaper
    point's failed orders raised ε).

    Raises
    ------
    ValueError
        Naming ``--grid``, when the points mix mechanisms of different neighbouring relations
        (Poisson sampling, fixed-size sampling, tree aggregation; named), or no point's
        curve bounds all the others (e.g. fewer rounds at a smaller noise multiplier).
    """
    for point, ledger in plans:
        if ledger is None:
            return point, None
    relations = {e.neighboring_relation for _, ledger in plans for e, _ in ledger}
    if len(relations) > 1:
        raise ValueError(f"argument --grid: its points mix {mechanisms_of(relations)}")
    distinct: dict[Ledger, dict[str, Any]] = {}
    for point, ledger in plans:
        distinct.setdefault(ledger, point)
    curves = {ledger: ledger_rdp(ledger, orders) for ledger in distinct}
    for ledger, curve in curves.items():
        if all(rdp_dominates(curve, other) for other in curves.values()):
            return distinct[ledger], ledger
    first, second = list(distinct.values())[:2]
    raise ValueError(
        f"argument --grid: its points spend privacy differently and none spends at least as "
        f"much as every other at every RDP order (e.g. {shown(first)} and {shown(second)}); "
        "tune over keys that leave the privacy events alone, or make one point the costliest"
    )


def _dominated_by(ledger: Ledger, bound: Ledger) -> bool:
    """Whether ``ledger`` releases no event more often than ``bound`` does (count by count)."""
    allowed: dict[Any, int] = {}
    for event, count in bound:
        allowed[event] = allowed.get(event, 0) + count
    for event, count in ledger:
        allowed[event] = allowed.get(event, 0) - count
        if allowed[event] < 0:
            return False
    return True


def check_released(
    plan: PrivacyPlan, released: Mapping[str, Ledger]
) -> tuple[PrivacyPlan, list[str]]:
    """``plan``, raised to a trial's ledger where one released more than it; and notes.

    A trial normally releases at most :attr:`PrivacyPlan.ledger` (fewer rounds when it fails).
    A secure-mode run resumed after an interruption is charged its redone rounds again and can
    release more; the bound then becomes that trial's ledger if it dominates every other.

    Raises
    ------
    ValueError
        When some trial released more than the plan and no ledger bounds all the others.
    """
    if plan.ledger is None:
        return plan, []
    orders = plan.orders  # the bound's own finite orders; a cheaper trial's failures drop none
    bound = ledger_rdp(plan.ledger, orders)
    over = {
        label: led
        for label, led in released.items()
        if not _dominated_by(led, plan.ledger) and not rdp_dominates(bound, ledger_rdp(led, orders))
    }  # a trial at another grid point releases other events, but less at every order
    if not over:
        return plan, []
    candidates = [(plan.point, plan.ledger)] + [({"trial": k}, v) for k, v in over.items()]
    try:
        point, ledger = dominating_plan(candidates, orders)
    except ValueError as exc:
        raise ValueError(
            f"trials {', '.join(over)} released more than the planned single run, and "
            f"{str(exc).removeprefix('argument --grid: ')}"
        ) from None
    orders = finite_orders([ledger], orders)
    notes = [
        f"{label} released more than the planned single run at some RDP order (a resumed "
        "secure-mode run is charged its redone rounds again); the tuning epsilon uses the "
        "largest ledger"
        for label in over
    ]
    return PrivacyPlan(ledger, point, plan.delta, plan.accountant, plan.accountant_settings,
                       plan.target_epsilon, orders), notes  # fmt: skip


# -- results -----------------------------------------------------------------------------------


@dataclass
class TrialResult:
    """What one trial gave.

    Attributes
    ----------
    trial : Trial
    status : {"finished", "diverged", "failed"}
        ``diverged``: finished with a non-finite metric or evaluation loss (its model
        overflowed; it loses whatever its metric); ``failed``: the run raised.
    score : float
        The final task metric (``nan`` unless finished).
    run : RunData or None
        The loaded run (finished and diverged trials).
    error : str
        Why a failed trial failed.
    origin : str
        Where its run comes from (``compare``'s phrases: ran, reused, resumed, rerun).
    """

    trial: Trial
    status: str
    score: float = math.nan
    run: Any = None
    error: str = ""
    origin: str = ""


def check_metric(metric: str | None, tasks: Sequence[Any]) -> None:
    """Refuse a selection ``metric`` that a task's evaluation does not report (``None``: any).

    Each task's initial model (:meth:`~fedprivopt.models.task.Task.build_model`) is evaluated
    once and its metric names (``eval_`` + the keys of :meth:`evaluate`) are compared with
    ``metric``, before any trial runs: a metric no trial reports would make every trial
    ``diverged``.

    Raises
    ------
    ValueError
        Naming ``--metric``, the task and the metrics it reports; or naming the task and a
        metric whose value is not a number (:func:`~fedprivopt.simulation.writer.checked_metrics`).
    """
    import torch

    from fedprivopt.models.task_calls import task_call
    from fedprivopt.simulation.run_checks import initial_model
    from fedprivopt.simulation.writer import checked_metrics

    for task in tasks:
        with torch.no_grad():
            # twenty-third review of issue 15: a task whose evaluate() returned a string failed
            # every trial before its first release, and tune ended rc 0 ("no trial released;
            # epsilon = 13.08 for the tuning"); now refused here, as the run would refuse it.
            # Forty-seventh review (api 5): called unchecked, an evaluate() (or build_model())
            # raising its own exception (a held-out file gone) ended tune in a traceback, rc 1
            call = f"{type(task).__name__}.evaluate()"
            model = initial_model(task)
            with task_call(call, f"{call} must return"):
                metrics = task.evaluate(model)
            names = sorted(checked_metrics(type(task).__name__, metrics))
        if metric is not None and metric not in names:
            raise ValueError(
                f"argument --metric: task {shown(getattr(task, 'name', '?'))} does not report "
                f"{shown(metric)} (it reports {', '.join(names)})"
            )


def select_best(results: Sequence[TrialResult], *, maximize: bool) -> TrialResult | None:
    """The finished trial with the best finite score (ties: the lowest number); ``None`` if none."""
    ok = [r for r in results if r.status == "finished" and math.isfinite(r.score)]
    if not ok:
        return None
    sign = 1.0 if maximize else -1.0
    return max(ok, key=lambda r: (sign * r.score, -r.trial.index))


def run_trials(
    plans: Sequence[Any],
    trials: Sequence[Trial],
    *,
    metric: str,
    on_start: Callable[[Trial, str], None] | None = None,
    on_done: Callable[[TrialResult], None] | None = None,
) -> list[TrialResult]:
    """Carry out every trial's :class:`~fedprivopt.simulation.cells.CellPlan` and load its result.

    ``plans`` come from :func:`~fedprivopt.simulation.cell_plans.plan_cells` over the trials' cells
    (run, reuse, resume or rerun under ``OUT/runs/``). An exception of a trial's run (not an
    interrupt) makes it ``failed``; the others go on.
    """
    from fedprivopt.simulation import cell_plans, cells
    from fedprivopt.simulation.divergence import final_status

    results = []
    for trial, plan in zip(trials, plans, strict=True):
        if on_start is not None:
            on_start(trial, plan.action)
        result = TrialResult(trial, "failed", origin=plan.describe())
        try:
            cells.run_cell(plan, progress=False)
            result.run = cell_plans.load_cell(plan)
        except Exception as exc:  # a failed trial counts as a trial
            result.error = f"{type(exc).__name__}: {exc}"
        else:
            result.status, result.score = final_status(result.run, metric)
        results.append(result)
        if on_done is not None:
            on_done(result)
    return results
