"""Tree aggregation in a real Flower deployment (SuperLink and SuperNodes on this machine).

One restart period of two rounds, three users a round out of six: the deployment's second cohort
comes from the users on connected nodes who have not taken part in the period, its checkpoint holds
the period's participation ledger (every user once), its ε is dp-accounting's for one tree period,
and the in-process simulation of the same configuration ends with the same model.

A period's restart (the ledger emptied, the tree begun again) is the strategy's own code, the same
in a deployment as on the Flower engine: ``tests/simulation/test_tree_run.py`` runs seven rounds in
periods of three on both engines. Here it cost two more deployment rounds (about 25 s of the suite
on two cores: each round waits for the SuperNodes' 3-second polls and starts ClientApp processes).
"""

import json
import sys
from pathlib import Path

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import rdp

from fedprivopt.deploy import deploy_local
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import simulate
from tests.deploy.test_local import RUN, USERS

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(
    not (BIN / "flower-superlink").exists() or not (BIN / "flower-supernode").exists(),
    reason="Flower's deployment commands are not installed next to this interpreter",
)
TREE = {**RUN, "num-server-rounds": 2, "noise-mechanism": "tree", "tree-restart-rounds": 2}


@pytest.fixture(autouse=True)
def _small_processes(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_a_tree_deployment_matches_the_simulation_and_checks_each_user_in_once(tmp_path):
    out = deploy_local(nodes=2, tls=False, overrides=TREE, out=str(tmp_path / "d"), timeout=420)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 2
    assert summary["noise_mechanism"] == "tree" and summary["tree_restart_rounds"] == 2
    acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_SPECIAL)
    acc.compose(dpa.SingleEpochTreeAggregationDpEvent(1.0, 2))
    assert summary["epsilon"] == pytest.approx(acc.get_epsilon(TREE["delta"]), rel=1e-12)

    state = torch.load(out / "checkpoint.pt", weights_only=True)["algorithm"]
    ledger = state["tree"]["cohorts"]
    assert ledger["period"] == 0 and sorted(ledger["users"].tolist()) == list(range(USERS))

    sim = simulate(load_config(out / "config.toml", {"engine": "fast"}), tmp_path / "sim")
    torch.testing.assert_close(state["params"], sim.params, rtol=0, atol=1e-6)
    assert sim.epsilon == pytest.approx(summary["epsilon"], rel=1e-12)
