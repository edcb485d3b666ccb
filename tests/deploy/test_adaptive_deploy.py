"""Adaptive clipping on a real local deployment: the bits travel on the wire, C and ε match."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from fedprivopt.deploy import deploy_local
from fedprivopt.privacy import compose_epsilon, make_round_event
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import read_rows
from fedprivopt.simulation.run import simulate

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(
    not (BIN / "flower-superlink").exists() or not (BIN / "flower-supernode").exists(),
    reason="Flower's deployment commands are not installed next to this interpreter",
)

USERS = 6
RUN = {
    "strategy": "dp-fedavg",
    "population": USERS,
    "clients-per-round": 3,
    "num-server-rounds": 2,  # round 2 runs at the clip norm round 1's noised count chose
    "noise-multiplier": 1.0,
    "clip-norm": 0.05,
    "adaptive-clipping": True,
    "clip-count-stddev": 1.0,
    "clip-learning-rate": 0.5,
    "delta": 1e-3,
    "seed": 0,
    "local-learning-rate": 0.5,
    "batch-size": 16,
    "task": "toy",
    "task-params.num-users": USERS,
    "task-params.seed": 0,
}


@pytest.fixture(autouse=True)
def _small_processes(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_adaptive_deployment_matches_the_simulation(tmp_path):
    out = deploy_local(nodes=2, tls=False, overrides=RUN, out=str(tmp_path / "d"), timeout=420)
    rows = read_rows(out / "metrics.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 2
    assert all(r["rejected"] == 0 and r["node_errors"] == 0 for r in rows)
    assert rows[0]["clip_norm"] == 0.05 and rows[-1]["clip_norm"] != 0.05
    expected = compose_epsilon([(make_round_event(1.0, sample_rate=3 / USERS), 2)], RUN["delta"])
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-9)
    sim = simulate(load_config(out / "config.toml", {"engine": "fast"}), tmp_path / "sim")
    deployed = torch.load(out / "checkpoint.pt", weights_only=True)["algorithm"]
    simulated = torch.load(tmp_path / "sim" / "checkpoint.pt", weights_only=True)["algorithm"]
    torch.testing.assert_close(deployed["params"], simulated["params"], rtol=0, atol=1e-6)
    assert deployed["clip_states"] == simulated["clip_states"]
    assert [r["clip_norm"] for r in rows] == [r["clip_norm"] for r in sim.rows]
