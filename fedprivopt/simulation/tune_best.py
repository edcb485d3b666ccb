"""The released trial of a tuning, recomputed from the trials' own run directories.

``compare-tuned`` must not take ``summary.json``'s ``best`` on trust: an edited ``best`` would
report a worse trial as the tuned release. :func:`recompute_best` scores every trial of
``tune.json`` from its run directory as ``fedprivopt tune`` scored it
(:func:`~fedprivopt.simulation.tune.run_trials`: a trial is finished when its run is, and its
final metric and evaluation loss are finite; anything else lost) and applies the same rule
(:func:`~fedprivopt.simulation.tune.select_best`: the best finite score, ties to the lowest
trial number, ``eval_loss`` minimized).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedprivopt.core.text import shown

__all__ = ["check_best", "recompute_best"]


def _score(run_dir: Path, task: Any, metric: str) -> tuple[str, float]:
    """``(status, score)`` of one trial's run directory, as ``tune`` scored it."""
    from fedprivopt.data.locks import LockHeldError
    from fedprivopt.simulation.audit import audit_run_dir
    from fedprivopt.simulation.cell_plans import quiet_resume_notes
    from fedprivopt.simulation.divergence import final_status
    from fedprivopt.simulation.rundata import load_run
    from fedprivopt.simulation.rundir import reading_lock

    if not run_dir.is_dir():
        return "failed", math.nan
    try:
        with reading_lock(run_dir), quiet_resume_notes():  # nothing is resumed here
            if audit_run_dir(run_dir, task, engine=False).unfinished() is not None:
                return "failed", math.nan
            run = load_run(run_dir)
    except LockHeldError as exc:  # running now: its score is not known yet, nothing was edited
        raise ValueError(f"{run_dir}: {exc}; try again once it has finished") from None
    except (ValueError, OSError):
        return "failed", math.nan
    return final_status(run, metric)


def recompute_best(
    path: str | Path, plan: dict[str, Any], task_of: Callable[[dict[str, Any]], Any]
) -> str | None:
    """The label of the trial ``tune`` releases from these run directories (``None``: none).

    Parameters
    ----------
    path : str or pathlib.Path
        The tuning directory.
    plan : dict
        Its ``tune.json`` (``metric`` and ``trials``).
    task_of : callable
        A trial's entry of ``plan["trials"]`` to its built task.
    """
    from fedprivopt.simulation.tune import Trial, TrialResult, select_best

    metric = plan["metric"]
    results = []
    for i, entry in enumerate(plan["trials"], start=1):
        status, score = _score(Path(path) / "runs" / entry["trial"], task_of(entry), metric)
        trial = Trial(i, entry["trial"], entry["hyperparameters"], entry["seed"])
        results.append(TrialResult(trial, status, score))
    best = select_best(results, maximize=metric != "eval_loss")
    return None if best is None else best.trial.label


def check_best(path: str | Path, stated: str, recomputed: str | None) -> None:
    """Refuse a summary whose ``best`` is not the recomputed one, naming ``summary.json``."""
    if stated != recomputed:
        raise ValueError(
            f"{Path(path) / 'summary.json'}: its best trial {shown(stated)} is not the one its "
            f"runs select ({shown(recomputed) if recomputed else 'none'}, by the tuning's metric "
            "and rule); the tuning's files were edited"
        )
