"""Issue 15, forty-fifth hostile review (contract: the privacy contract, measured): tests.

1. ``deploy local --nodes 2 toy.toml --rounds 2`` (also the Flower engine of ``simulate``).
   Before: ``summary.json``'s ``not_covered`` named the round metrics of ``metrics.jsonl``
   and TensorBoard only, while the run's ``deploy/serverapp.log`` logs every round's cohort
   size (``round 1: epsilon=7.551 cohort=9``) and its ``superlink.log`` and
   ``supernode-N.log`` which nodes were sent each round's training (with a node per user,
   the sampled users themselves). Now ``not_covered`` of a Flower-engine run names those
   logs (``summary_privacy.not_covered``); fast-engine runs unchanged.
"""

from __future__ import annotations

from pathlib import Path

from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.summary_privacy import not_covered

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def test_1_not_covered_of_a_flower_run_names_its_logs() -> None:
    task = ToyClassificationTask(num_users=40, seed=0)
    flower = not_covered(load_config(TOY, {"engine": "flower"}), task)
    assert "deploy/serverapp.log" in flower and "cohort=" in flower
    assert "superlink.log" in flower and "supernode-N.log" in flower
    assert flower.endswith("so publish the models, epsilon and evaluations, not these rows")
    fast = not_covered(load_config(TOY, {}), task)
    assert "serverapp.log" not in fast
