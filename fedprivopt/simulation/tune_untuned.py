"""Checks of ``compare-tuned``'s ``--untuned`` runs and ``--out``.

An untuned row stands for hyperparameters that were *not* chosen on the private data by a
tuning. A trial of a tuning (a run directory inside a tuning's ``runs/``) is such a choice: shown
as an untuned row it would be reported at its single run's ε, below what its tuning spent, so
:func:`check_untuned_path` refuses it. Untuned runs of one strategy and noise multiplier make one
row whose runs are its seeds: :func:`check_untuned_seeds` refuses runs that differ in another
hyperparameter, as :func:`~fedprivopt.simulation.tune_check.check_tunings` does for tunings.
:func:`check_out_outside` keeps the report out of every tuning given.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedprivopt.core.text import shown

__all__ = ["check_out_outside", "check_untuned_path", "check_untuned_seeds"]


def _tuning_of(path: Path) -> Path | None:
    """The tuning directory whose ``runs/`` holds (or is) ``path``, or that ``path`` is."""
    from fedprivopt.simulation.tune_check import PLAN_FILE

    path = path.resolve()
    if (path / PLAN_FILE).exists():
        return path
    for folder in (path, *path.parents):
        if folder.name == "runs" and (folder.parent / PLAN_FILE).exists():
            return folder.parent
    return None


def check_untuned_path(text: str, runs: Sequence[Any] = ()) -> None:
    """Refuse an ``--untuned`` path (or one of its loaded ``runs``) inside a tuning's ``runs/``.

    Raises
    ------
    ValueError
        Naming ``--untuned``, the path and the tuning.
    """
    for path in (Path(text), *(Path(r.path) for r in runs)):
        tuning = _tuning_of(path)
        if tuning is not None:
            raise ValueError(
                f"argument --untuned: {shown(str(path))} is (or holds) a trial of the tuning "
                f"{shown(str(tuning))}; its hyperparameters were chosen on the private data, so "
                "it cannot be an untuned run (give the tuning as TUNED)"
            )


def _config(run: Any):
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.files import CONFIG_FILE

    try:
        config = load_config(Path(run.path) / CONFIG_FILE)
    except (OSError, ValueError):
        return None
    import dataclasses

    return dataclasses.replace(config, strategy=dataclasses.replace(config.strategy, seed=0))


def check_untuned_seeds(runs: Sequence[Any]) -> None:
    """Refuse untuned runs of one strategy and σ whose configurations differ beyond the seed.

    Raises
    ------
    ValueError
        Naming ``--untuned``, both runs and the first differing key.
    """
    from fedprivopt.simulation.cells import first_difference

    first: dict[tuple, tuple[Any, Any]] = {}
    for run in runs:
        config = _config(run)
        if config is None:
            continue
        key = (run.strategy, run.noise_multiplier)
        if key not in first:
            first[key] = (run, config)
            continue
        other, other_config = first[key]
        diff = first_difference(other_config, config)
        if diff is not None:
            name, old, new = diff
            raise ValueError(
                f"argument --untuned: {shown(str(run.path))} has {name} = {shown(new)}, "
                f"{shown(str(other.path))} {shown(old)}; runs of one strategy and noise "
                "multiplier are its seeds only when their configurations differ in the seed alone"
            )


def check_out_outside(out: Path, tuned: Sequence[str]) -> None:
    """Refuse an ``--out`` equal to or inside a TUNED directory.

    Raises
    ------
    ValueError
        Naming ``--out`` and the tuning.
    """
    resolved = out.resolve()
    for text in tuned:
        root = Path(text).resolve()
        if resolved == root or root in resolved.parents:
            raise ValueError(
                f"argument --out: {shown(str(out))} is inside the tuning {shown(text)}; writing "
                "there would change the tuning; choose a directory outside it"
            )
