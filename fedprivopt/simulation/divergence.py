"""Divergence: a run whose evaluation loss, task metric or model became non-finite.

One notion for every reader of a run. ``fedprivopt tune`` counts a trial ``diverged`` when its
final task metric or evaluation loss is not finite (:func:`final_status`, also what
``compare-tuned`` recomputes). A run's ``summary.json`` names, as ``diverged``, the first round
whose evaluation (loss or task metric, :func:`row_diverged`) or released model was not finite,
``None`` when none was; ``simulate`` warns on stderr and ``compare``'s report marks the cell.

Issue 15, twelfth review (minor, fixed in its follow-up): ``--set server-learning-rate=1e308``
overflowed the toy model, every evaluation loss was NaN from round 1, and ``summary.json``
reported the accuracy of the overflowed model (0.343) with ``stopped_reason`` ``rounds`` and
nothing else. The run is not stopped: what it released is released and charged in its ledger
either way, and its summary now says from which round its results describe an overflowed model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "DIVERGED_KEY",
    "checked_round",
    "earliest",
    "final_status",
    "first_diverged",
    "row_diverged",
    "warning_line",
]

DIVERGED_KEY = "diverged"
"""``summary.json``'s key: the first diverged round, or ``None``."""

_LOSS = "eval_loss"


def _finite(value: Any) -> bool:
    """Whether a value a run recorded as a metric is a finite number."""
    if isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError, OverflowError):
        return False


def row_diverged(row: Mapping[str, Any], metric: str) -> bool:
    """Whether an evaluation (a metrics row) has a non-finite ``eval_loss`` or ``metric``.

    A key the row does not hold does not count (a task may report no loss).
    """
    return any(key in row and not _finite(row[key]) for key in (_LOSS, metric))


def first_diverged(rows: Iterable[Mapping[str, Any]], metric: str) -> int | None:
    """The first round ≥ 1 whose row :func:`row_diverged` (a round written twice: its last row)."""
    by_round: dict[int, Mapping[str, Any]] = {}
    for row in rows:
        try:
            by_round[int(row["round"])] = row
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
    found = (r for r, row in by_round.items() if r >= 1 and row_diverged(row, metric))
    return min(found, default=None)


def checked_round(value: Any, rounds: int | None = None) -> int | None:
    """``value`` if it is a round number (an ``int`` ≥ 1, at most ``rounds``), else ``None``.

    What a stored ``diverged`` (in ``summary.json`` or a checkpoint) may hold; anything else
    is not a round and is ignored (the rows and the model still show a divergence).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value if rounds is None or value <= rounds else None


def earliest(*rounds: int | None) -> int | None:
    """The smallest of the given rounds, ignoring ``None`` (``None`` if all are)."""
    return min((r for r in rounds if r is not None), default=None)


def final_status(run: Any, metric: str) -> tuple[str, float]:
    """``(status, score)`` of a finished run as ``tune`` scores a trial.

    ``status`` is ``"finished"`` when the final ``metric`` (the score) and, where the run
    reports one, the final evaluation loss are finite, else ``"diverged"``.

    Parameters
    ----------
    run : RunData
        The loaded run (:func:`~fedprivopt.simulation.rundata.load_run`).
    metric : str
        The task metric a trial is judged by.
    """
    score = run.final_value(metric)
    loss_ok = not run.has_metric(_LOSS) or math.isfinite(run.final_value(_LOSS))
    return ("finished" if math.isfinite(score) and loss_ok else "diverged"), score


def warning_line(round_num: int, metric: str | None = None) -> str:
    """The line ``simulate`` (and ``deploy local``) print on stderr after a diverged run."""
    what = f"its final {metric} describes" if metric else "its final metrics describe"
    return (
        f"warning: the model diverged at round {round_num} (an evaluation loss or metric, or the "
        f"model, became non-finite): {what} an overflowed model; summary.json records "
        f"{DIVERGED_KEY} = {round_num} (lower the learning rates)"
    )
