"""An existing tuning directory and a call with another plan (issue 15, ninth review, N5).

``tune`` reuses a tuning's trials (a stopped call continues) only when the whole plan is the one
its ``tune.json`` records: base configuration, strategy, grid, trial distribution (distribution,
mean, shape), seed and metric. A call with another plan is refused naming the first flag that
differs; with ``--overwrite`` the earlier tuning is removed (every trial's run files, its
``tune.json`` and report) and the tuning starts over, so the trials of two plans never mix and
the ε of a released model is always that of the plan that drew it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedprivopt.simulation.files import SMALL_FILE_LIMIT, parse_json
from fedprivopt.simulation.tune_plan import PLAN_FILE, same_json

__all__ = [
    "check_discardable",
    "check_plan",
    "discard_tuning",
    "plan_difference",
    "read_plan",
    "same_grid",
    "stored_grid",
]

_FLAGS = (
    ("strategy", "--strategy"),
    ("grid", "--grid"),
    ("trial_count.distribution", "--distribution"),
    ("trial_count.mean", "--mean-trials"),
    ("trial_count.shape", "--nb-shape"),
    ("seed", "--seed"),
    ("metric", "--metric"),
)


def _get(doc: Mapping[str, Any], dotted: str) -> Any:
    value: Any = doc
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _grid_order(grid: Any) -> list[str]:
    """The keys of a plan's grid in the order its trials draw them (``[]``: no grid)."""
    return [str(key) for key in grid] if isinstance(grid, Mapping) else []


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _base_difference(old_toml: Any, new_toml: str) -> str:
    """The first differing key of two base configurations, as one phrase."""
    from fedprivopt.simulation.cell_plans import first_difference
    from fedprivopt.simulation.config import load_config

    if not isinstance(old_toml, str):
        return "its base configuration is missing"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            old_path, new_path = Path(tmp) / "old.toml", Path(tmp) / "new.toml"
            old_path.write_text(old_toml, encoding="utf-8")
            new_path.write_text(new_toml, encoding="utf-8")
            diff = first_difference(load_config(old_path), load_config(new_path))
    except (ValueError, OSError, RecursionError):
        diff = None
    if diff is None:
        return "its base configuration differs"
    key, old, new = diff
    return f"its base configuration has {key} = {_short(old)}, this call {_short(new)}"


def read_plan(out: str | Path) -> dict[str, Any] | None:
    """``out/tune.json``, the plan of an earlier tuning in ``out``; ``None`` when there is none.

    Raises
    ------
    ValueError
        Saying why the file cannot be a plan: not a regular file, larger than
        :data:`~fedprivopt.simulation.files.SMALL_FILE_LIMIT`, not a JSON object (or not JSON).
    OSError, RecursionError
        From reading or parsing it.
    """
    path = Path(out) / PLAN_FILE
    if not os.path.lexists(path):
        return None
    if not path.is_file():
        raise ValueError("not a regular file")
    if path.stat().st_size > SMALL_FILE_LIMIT:
        raise ValueError("larger than 64 MiB")
    stored = parse_json(path.read_text(encoding="utf-8"))
    if not isinstance(stored, dict):
        raise ValueError("not a JSON object")
    return stored


def plan_difference(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> str | None:
    """The first difference between two ``tune.json`` plans, naming its flag; ``None``: same.

    Parameters
    ----------
    stored, wanted : mapping
        Plan documents (:func:`~fedprivopt.simulation.tune_plan.plan_document`): the one in
        the directory and the one of this call.
    """
    if not same_json(stored.get("base_config"), wanted.get("base_config")):
        why = _base_difference(stored.get("base_config"), wanted["base_config"])
        return f"CONFIG, --set or a flag such as --rounds differs: {why}"
    for key, flag in _FLAGS:
        old, new = _get(stored, key), _get(wanted, key)
        if not same_json(old, new):
            if key == "seed" and "os-entropy" in (stored.get("seed_source"),
                                                  wanted.get("seed_source")):  # fmt: skip
                # a secret seed is never printed (issue 20 review, finding 1)
                return f"{flag} differs: one of the two tunings drew a secret seed"
            return f"{flag} differs: the earlier tuning has {_short(old)}, this call {_short(new)}"
    if not same_json(stored.get("trials"), wanted.get("trials")):
        order = _grid_order(stored.get("grid")), _grid_order(wanted.get("grid"))
        if order[0] != order[1]:
            # thirty-fifth review of issue 15 (tuning, finding 1): the same --grid flags in
            # another order were "the drawn trials differ (the tuning was made by another
            # version)"
            return (
                f"--grid differs: the earlier tuning gave its keys in the order "
                f"{', '.join(order[0])}, this call {', '.join(order[1])}; a trial's values are "
                "drawn from the seed key by key in that order, so give the --grid flags in the "
                "earlier order to continue it"
            )
        return "the drawn trials differ (the tuning was made by another version)"
    return None


def stored_grid(
    out: str | Path, grid: Mapping[str, Sequence[Any]], config_of: Callable[[dict], Any]
) -> dict[str, tuple[Any, ...]]:
    """``grid``, or the grid of the tuning in ``out`` where it makes the same trials.

    Forty-eighth review of issue 15 (compare; the forty-seventh review's open row sameness 7):
    ``tune toy.toml --grid server-learning-rate=1,2 ... --out T``, then the same with
    ``--grid server-learning-rate=1.0,2.0``, was refused as a tuning of another plan, though
    every trial's configuration is the same (the key is a float). The grids are compared
    value by value through the configurations they make (``config_of(overrides)``: the base
    configuration with ``overrides``, compared by
    :func:`~fedprivopt.simulation.cell_plans.first_difference`, so a value is coerced to its
    key's type and a task parameter is compared as given); where every value makes its stored
    value's configuration, the stored grid is returned, so ``tune.json``, the drawn trials and
    the plan digest their ledgers record stay as an earlier call wrote them. Keys in another
    order, another count of values or any other value: ``grid`` itself (the plan's check
    names the difference). A plan that cannot be read is left to that check too.
    """
    try:
        plan = read_plan(out)
    except (OSError, ValueError, RecursionError):
        return dict(grid)
    old = plan.get("grid") if isinstance(plan, Mapping) else None
    if not isinstance(old, Mapping) or not same_grid(old, grid, config_of):
        return dict(grid)
    return {key: tuple(values) for key, values in old.items()}


def same_grid(
    old: Mapping[str, Any], new: Mapping[str, Sequence[Any]], config_of: Callable[[dict], Any]
) -> bool:
    """Whether grids ``old`` and ``new`` make the same trials, value by value (:func:`stored_grid`).

    The same keys in the same order, as many values each, and each value making the
    configuration (``config_of(overrides)``) its counterpart makes.
    """
    from fedprivopt.simulation.cell_plans import first_difference

    if list(old) != list(new):  # another order draws other trials (named by check_plan)
        return False
    if same_json(old, {k: list(v) for k, v in new.items()}):
        return True
    for key, values in new.items():
        before = old[key]
        if not isinstance(before, list | tuple) or len(before) != len(values):
            return False
        for a, b in zip(before, values, strict=True):
            try:
                if first_difference(config_of({key: a}), config_of({key: b})) is not None:
                    return False
            except Exception:  # a stored value this version refuses: not the same grid
                return False
    return True


def check_plan(out: str | Path, wanted: Mapping[str, Any], *, overwrite: bool) -> bool:
    """Whether ``out`` holds a tuning of another plan that ``overwrite`` lets this call replace.

    Call it with the tuning's lock held. ``False``: no earlier plan, or the same one (its trials
    may be reused).

    Raises
    ------
    ValueError
        Without ``overwrite``, when ``out/tune.json`` records another plan or cannot be read:
        one line naming the first differing flag and ``--overwrite``.
    """
    hint = "pass --overwrite to discard it and start over, or choose another --out"
    try:
        stored = read_plan(out)
    except (OSError, ValueError, RecursionError) as exc:
        if overwrite:
            return True
        raise ValueError(f"{Path(out) / PLAN_FILE} cannot be read ({exc}); {hint}") from None
    if stored is None:
        return False
    why = plan_difference(stored, wanted)
    if why is None:
        return False
    if overwrite:
        return True
    raise ValueError(
        f"--out {str(out)!r} holds a tuning of another plan ({why}); its trials are not reused "
        f"for another plan: {hint}"
    )


def check_discardable(out: str | Path) -> list[Path]:
    """What :func:`discard_tuning` would remove from ``out/runs``, checked; nothing is removed.

    ``compare --tune-grid`` checks every cell this way before its first tuning runs.

    Raises
    ------
    ValueError
        Naming an entry of ``runs/`` that is not a run, a trial another process holds, or a
        report file that is a directory.
    """
    from fedprivopt.simulation.rundir import check_claimable
    from fedprivopt.simulation.tune_dir import TUNE_FILES

    out = Path(out)
    runs = out / "runs"
    entries = sorted(runs.iterdir()) if runs.is_dir() else []
    for entry in entries:
        if entry.is_symlink() or not entry.is_dir():
            raise ValueError(
                f"{entry} is not a trial's run directory; --overwrite removes only an earlier "
                "tuning's runs: remove it or choose another --out"
            )
        check_claimable(entry, overwrite=True)
    for name in (*TUNE_FILES, PLAN_FILE):
        path = out / name
        if path.is_dir() and not path.is_symlink():
            raise ValueError(f"{path} is a directory, not a file tune wrote")
    return entries


def discard_tuning(out: str | Path) -> None:
    """Remove an earlier tuning in ``out``: every trial's run files, ``tune.json`` and report.

    Everything is checked first (:func:`check_discardable`), so a refusal removes nothing.

    Raises
    ------
    ValueError
        Naming an entry of ``runs/`` that is not a run, or a trial another process holds.
    """
    from fedprivopt.simulation.rundir import lock_run_dir, remove_run_files
    from fedprivopt.simulation.tune_dir import TUNE_FILES

    out = Path(out)
    entries = check_discardable(out)
    for entry in entries:
        with lock_run_dir(entry):
            remove_run_files(entry)
            for name in os.listdir(entry):  # only debris is left: run.lock, config.toml.tmp
                (entry / name).unlink(missing_ok=True)
        entry.rmdir()
    for name in (*TUNE_FILES, PLAN_FILE):
        (out / name).unlink(missing_ok=True)
