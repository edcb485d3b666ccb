"""The tuning's plan, ``tune.json``: its content, its digest, and its checks against the files.

``fedprivopt tune`` writes ``tune.json`` (:func:`plan_document`) before any trial runs: the base
configuration (the preset with the call's overrides), the grid, the distribution of the number of
trials, the tuning seed, δ and the drawn trials (label, hyperparameters, run seed). Every trial's
ledger header records the plan's digest (:func:`plan_digest`) when the trial starts.
``compare-tuned`` (:func:`~fedprivopt.simulation.tune_check.check_tuning`) reads the plan's
trial count back (:func:`read_trial_count`), refuses a ``summary.json`` that disagrees with it
(:func:`cross_check`) and a plan whose trials are not those its seed draws (:func:`check_draws`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedprivopt.core.text import shown
from fedprivopt.privacy.tuning import TrialCount

__all__ = [
    "PLAN_FILE",
    "PLAN_IDENTITY",
    "check_draws",
    "cross_check",
    "plan_digest",
    "plan_document",
    "read_trial_count",
    "same_json",
]

PLAN_FILE = "tune.json"
PLAN_VERSION = 1


def plan_document(
    *,
    preset: str,
    strategy: str,
    metric: str,
    base_config_toml: str,
    grid: Mapping[str, Sequence[Any]],
    overrides: Mapping[str, Any],
    trials: TrialCount,
    seed: int,
    delta: float,
    drawn: Sequence[Any],
    seed_secret: bool = False,
) -> dict[str, Any]:
    """The content of ``tune.json``, written before any trial runs.

    ``seed_secret``: the seed was drawn from OS entropy (``seed_source`` ``"os-entropy"``); this
    file, the operator's, is then the only one that records it.
    """
    return {
        "kind": "fedprivopt-tune-plan",
        "version": PLAN_VERSION,
        "preset": preset,
        "strategy": strategy,
        "metric": metric,
        "base_config": base_config_toml,
        "grid": {k: list(v) for k, v in grid.items()},
        "overrides": dict(overrides),
        "trial_count": trials.to_dict(),
        "seed": seed,
        "seed_source": "os-entropy" if seed_secret else "--seed",
        "delta": delta,
        "trials": [
            {"trial": t.label, "hyperparameters": t.hyperparameters, "seed": t.seed} for t in drawn
        ],
    }


PLAN_IDENTITY = ("base_config", "strategy", "metric", "grid", "trial_count", "seed", "delta",
                 "trials")  # fmt: skip
"""The keys of ``tune.json`` that make a plan (what ``tune`` compares before reusing trials)."""


def plan_digest(plan: Mapping[str, Any]) -> str:
    """SHA-256 of a plan's :data:`PLAN_IDENTITY` keys, as canonical JSON.

    Every trial's ledger header records it (``tuning_plan``) when the trial starts; the
    preset's path and the seed's source are not part of it (a call from another directory
    continues the same plan).
    """
    identity = {key: plan.get(key) for key in PLAN_IDENTITY}
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def same_json(a: Any, b: Any) -> bool:
    """JSON equality that tells ``1`` from ``1.0`` and ``true`` from ``1``."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def read_trial_count(path: Path, data: Any) -> TrialCount:
    """``tune.json``'s ``trial_count`` (``data``) as a :class:`TrialCount`."""
    dist = data["distribution"]
    try:
        return TrialCount(dist, data["mean"], None if dist == "poisson" else data["shape"])
    except ValueError as exc:  # nineteenth review of issue 15: the message named no file
        raise ValueError(f"{path / PLAN_FILE}: its trial_count: {exc}") from None


def cross_check(path: Path, summary: dict[str, Any], plan: dict[str, Any]) -> None:
    """``summary.json`` against ``tune.json``: any disagreement is refused, naming the key."""
    for key in ("strategy", "metric", "grid", "overrides", "trial_count", "seed", "delta"):
        if key == "seed" and summary.get(key) is None and plan.get("seed_source") == "os-entropy":
            continue  # a secret seed is kept out of summary.json
        if not same_json(summary.get(key), plan.get(key)):
            raise ValueError(
                f"{path / 'summary.json'}: its {key} {shown(summary.get(key))} disagrees with "
                f"{PLAN_FILE}'s {shown(plan.get(key))}; the tuning's files were edited"
            )
    stated = [(r.get("trial"), r.get("hyperparameters"), r.get("seed")) for r in summary["trials"]]
    planned = [(t["trial"], t["hyperparameters"], t["seed"]) for t in plan["trials"]]
    if not same_json(stated, planned):
        raise ValueError(
            f"{path / 'summary.json'}: its trials disagree with {PLAN_FILE}'s; the tuning's files "
            "were edited"
        )


def check_draws(path: Path, plan: dict[str, Any], trials: TrialCount) -> None:
    """``tune.json``'s trials must be those its seed draws, and ``runs/`` hold no other."""
    from fedprivopt.simulation.tune import draw_trials

    grid = {k: tuple(v) for k, v in plan["grid"].items()}
    try:
        drawn = [(t.label, t.hyperparameters, t.seed)
                 for t in draw_trials(grid, trials, int(plan["seed"]))]  # fmt: skip
    except ValueError as exc:  # nineteenth review of issue 15: the message named no file
        raise ValueError(f"{path / PLAN_FILE}: its seed, grid or trial count: {exc}") from None
    planned = [(t["trial"], t["hyperparameters"], t["seed"]) for t in plan["trials"]]
    if not same_json(drawn, planned):
        raise ValueError(
            f"{path / PLAN_FILE}: its trials are not those its seed, grid and trial count draw; "
            "the tuning's files were edited"
        )
    runs = path / "runs"
    labels = {t["trial"] for t in plan["trials"]}
    extra = sorted(p.name for p in runs.iterdir() if p.name not in labels) if runs.is_dir() else []
    if extra:
        raise ValueError(f"{runs}: holds {shown(extra[0])}, not a trial of {path / PLAN_FILE}")
