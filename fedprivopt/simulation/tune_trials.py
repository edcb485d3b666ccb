"""The per-trial checks of a tuning: each trial's ``config.toml`` and the ledger it released.

Split from :mod:`fedprivopt.simulation.tune_check` (the forty-third review's module splits),
whose :func:`~fedprivopt.simulation.tune_check.check_tuning` calls :func:`check_trial` for every
trial of ``tune.json``: the trial's ``config.toml`` must be the base configuration with the
trial's hyperparameters and seed, its privacy ledger must match it, state the tuning's δ and name
the plan by its digest, and compose to at least every ε the trial's other files (its metrics,
summary and checkpoint, the tuning's ``summary.json`` entry) state. A trial with neither
``config.toml`` nor ledger counts as one that released nothing only where none of its files
states that it ran. :func:`load_trial_config` reads a configuration for both modules.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedprivopt.core.text import shown
from fedprivopt.simulation.tune_plan import PLAN_FILE, same_json

__all__ = ["check_trial", "load_trial_config", "stated_run"]


def load_trial_config(path: Path, overrides: Mapping[str, Any] | None = None):
    """``load_config``; a file nested too deeply for the TOML parser is a ``ValueError``.

    Nineteenth review of issue 15: a ``tune.json`` whose ``base_config`` (or a trial's
    ``config.toml``) nested 100,000 arrays ended ``compare-tuned`` in a ``RecursionError``
    traceback.
    """
    from fedprivopt.simulation.config import load_config

    try:
        return load_config(path, overrides)
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to read (not written by fedprivopt)") from None


def check_trial(
    path: Path, builder: Any, trial: dict[str, Any], delta: float, digest: str, entry=None
):
    """A trial's ``config.toml`` and ledger; its ledger's total (``None``: no ledger).

    ``entry``: the trial's entry of the tuning's ``summary.json`` (what ``tune`` found).
    ``builder``: :func:`~fedprivopt.simulation.tune_check.check_tuning`'s, whose
    ``config(overrides)`` is the base configuration with ``overrides``.
    """
    from fedprivopt.simulation.cell_plans import first_difference
    from fedprivopt.simulation.files import (
        CHECKPOINT,
        CONFIG_FILE,
        LEDGER_FILE,
        METRICS_FILE,
        PREVIOUS_CHECKPOINT,
        SUMMARY_FILE,
    )
    from fedprivopt.simulation.ledger import RunLedger

    run_dir = path / "runs" / trial["trial"]
    left = [name for name in (CHECKPOINT, PREVIOUS_CHECKPOINT, METRICS_FILE, SUMMARY_FILE)
            if (run_dir / name).exists()]  # fmt: skip
    # what says the trial ran, if anything: its files left, or the tuning's summary.json
    ran = "its " + ", ".join(left) + " remain" if left else stated_run(entry)
    if not (run_dir / CONFIG_FILE).exists() and not (run_dir / LEDGER_FILE).exists():
        # forty-third review follow-up (ledger 2): a trial's directory removed, or its ledger
        # and config.toml, passed as a trial that failed before its run started (released
        # nothing), where the trial's files or summary.json state that it ran
        if ran:
            raise ValueError(
                f"{run_dir}: "
                f"{f'its {CONFIG_FILE} and {LEDGER_FILE} are' if run_dir.is_dir() else 'it is'} "
                "missing, but the trial ran "
                f"({ran}), so what it released cannot be bounded; the tuning's files were edited"
            )
        return None  # a trial that failed before its run started released nothing
    expected = builder.config({**trial["hyperparameters"], "seed": trial["seed"]})
    stored = load_trial_config(run_dir / CONFIG_FILE)
    diff = first_difference(stored, expected)
    if diff is not None:
        key, old, new = diff
        raise ValueError(
            f"{run_dir / CONFIG_FILE}: has {key} = {shown(old)}, but {trial['trial']} of "
            f"{PLAN_FILE} runs {key} = {shown(new)}; not this tuning's trial"
        )
    _refuse_dangling_ledger(run_dir / LEDGER_FILE, ran)
    ledger = RunLedger.read(run_dir)
    if ledger is None:
        # forty-third review of issue 15 (reports 3): a trial whose ledger was deleted counted
        # as one that released nothing (compare-tuned 19.03, not 22.14)
        if ran:
            # forty-fifth review follow-up (ledger 4): without a checkpoint, tune cannot rebuild
            # the ledger (it refuses since finding 3; it ran the trial again before)
            how = "put the trial's files back (it has no checkpoint to rebuild the ledger from)"
            if (run_dir / CHECKPOINT).exists() or (run_dir / PREVIOUS_CHECKPOINT).exists():
                how = ("run the same tune command again, which rebuilds the ledger from the "
                       "trial's checkpoint, then report it")  # fmt: skip
            raise ValueError(
                f"{run_dir / LEDGER_FILE}: missing or empty, but the trial ran ({ran}), so what "
                f"it released cannot be bounded; {how}"
            )
        return None
    ledger.check_config(stored, source=str(run_dir / CONFIG_FILE))
    stated = ledger.header.get("delta")
    if not same_json(stated, delta):
        raise ValueError(
            f"{run_dir / LEDGER_FILE}: its header's delta {shown(stated)} disagrees with the "
            f"tuning's {shown(delta)}"
        )
    try:
        ledger.check_tuning_plan(digest)
    except ValueError as exc:
        raise ValueError(f"{exc}; {PLAN_FILE} or the trial's files were edited") from None
    _check_covered(run_dir, ledger, delta, entry)
    return ledger.total()


def _refuse_dangling_ledger(path: Path, ran: str) -> None:
    """Refuse a trial's ledger ``path`` that is a symbolic link which cannot be followed.

    Forty-sixth review of issue 15 (ledger, open; follow-up 2): ``compare-tuned T`` of a
    tuning whose ``trial-001/privacy_ledger.jsonl`` was moved to another disk and linked back,
    that disk not mounted, said the ledger was "missing or empty" and advised running the same
    tune command again, which refuses the link (a resume appends to it): advice that cannot be
    followed, and no word of the link. A loop of links is named alike.

    Raises
    ------
    ValueError
        Naming ``path`` and the link's target.
    """
    if not os.path.islink(path) or os.path.exists(path):
        return
    try:
        target = os.readlink(path)
    except OSError:  # removed meanwhile: read as a missing ledger
        return
    why = f"the trial ran ({ran})" if ran else "the trial may have run"
    raise ValueError(
        f"{path}: a symbolic link to {target!r} that cannot be followed (its target does not "
        f"exist, or the links loop), but {why}, so what it released cannot be bounded; put its "
        "target back (mount its disk) or a copy of the ledger in place of the link, then "
        "report it"
    )


def stated_run(entry: Any) -> str:
    """Why the tuning's ``summary.json`` entry says the trial ran (empty if it does not)."""
    if not isinstance(entry, Mapping):
        return ""
    rounds, name = entry.get("rounds_completed"), f"summary.json's {shown(entry.get('trial'))}"
    if isinstance(rounds, int) and not isinstance(rounds, bool) and rounds > 0:
        return f"{name} states {rounds} rounds completed"
    return f"{name} states it finished" if entry.get("status") == "finished" else ""


def _check_covered(run_dir: Path, ledger: Any, delta: float, entry: Any = None) -> None:
    """Refuse a trial's ledger that composes to less than its other files state.

    Forty-third review of issue 15 (reports, finding 4): a trial's ledger cut to its header (and
    ``summary.json``'s ``single_run`` set to the plan) gave ``compare-tuned`` 19.03, not 22.14.
    Its follow-up (ledger 2): the same with the trial's rows, summary and checkpoints removed
    passed; ``entry`` (the trial's entry of the tuning's ``summary.json``) states its ε too.
    """
    from fedprivopt.simulation.audit import read_summary
    from fedprivopt.simulation.files import LEDGER_FILE, METRICS_FILE, read_rows, stated_epsilons
    from fedprivopt.simulation.rundata_epsilon import checkpoint_epsilon_header

    if not ledger.header.get("private"):
        return
    stated = stated_epsilons(read_rows(run_dir / METRICS_FILE), read_summary(run_dir))
    found = checkpoint_epsilon_header(run_dir, delta)
    if found is not None:
        stated.append((f"{found[0]} (its privacy accountant)", found[1]))
    if isinstance(entry, Mapping):
        stated += [("entry in the tuning's summary.json", eps)
                   for _, eps in stated_epsilons([], entry)]  # fmt: skip
    if not stated:
        return
    where, most = max(stated, key=lambda item: item[1])
    have = ledger.epsilon(delta)
    if not most <= have * (1 + 1e-6):
        raise ValueError(
            f"{run_dir / LEDGER_FILE} composes to epsilon {have:.6g}, but the trial's {where} "
            f"states {most:.6g}: its ledger is incomplete (truncated or edited), so what the "
            "trial released cannot be bounded by it; the tuning's files were edited"
        )
