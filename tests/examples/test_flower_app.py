"""``flwr run examples/flower-app``: a user's own ServerApp and ClientApp with our DP strategy.

The example (``examples/flower-app``, ``docs/FLOWER.md``) has its own ``pyproject.toml``. The
test runs it as a Flower user types it, on Flower's default local SuperLink (a local simulation,
2 SuperNodes) in a private ``FLWR_HOME`` on free loopback ports, with a budget that admits
exactly 2 of 3 rounds, and checks the ε the ServerApp reports after every round against the
accountant, the budget stop and the accuracy. The SuperLink, which ``flwr run`` leaves running,
and everything it started are stopped by PID, also when the run fails.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedprivopt.core.text import epsilon_text
from fedprivopt.privacy import PrivacyAccountant, make_round_event
from tests.procs import alive, flwr_run_env, process_tree, stop_processes

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "flower-app"
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(
    not (BIN / "flwr").exists() or not (BIN / "flower-superlink").exists(),
    reason="Flower's commands are not installed next to this interpreter",
)

# the example's [tool.flwr.app.config]
SIGMA, POPULATION, COHORT, DELTA = 0.7, 100, 20.0, 1e-3


def _epsilons(rounds: int) -> list[float]:
    accountant = PrivacyAccountant(accountant="rdp")
    event = make_round_event(SIGMA, sample_rate=COHORT / POPULATION)
    out = []
    for _ in range(rounds):
        accountant.step(event)
        out.append(accountant.epsilon(DELTA))
    return out


def test_flwr_run_of_the_example_app_reports_epsilon_and_stops_at_the_budget(tmp_path):
    home, metrics = tmp_path / "flwr-home", tmp_path / "metrics.jsonl"
    expected = _epsilons(3)
    target = (expected[1] + expected[2]) / 2  # admits rounds 1 and 2, not round 3
    env, marker = flwr_run_env(home, BIN)
    overrides = f'num-server-rounds=3 target-epsilon={target!r} metrics-file="{metrics}"'
    started: dict[int, str] = {}
    try:
        done = subprocess.run(
            [
                str(BIN / "flwr"),
                "run",
                "examples/flower-app",
                "--stream",
                "--run-config",
                overrides,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=480,
        )
        started = process_tree(marker)
    finally:
        stop_processes(process_tree(marker))
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert started, "flwr run started no local SuperLink"
    assert "No additional application dependencies needed installation" in log
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rounds, final = rows[:-1], rows[-1]
    assert [r["round"] for r in rounds] == [0, 1, 2], log[-3000:]
    for row, eps in zip(rounds[1:], expected, strict=False):
        assert row["epsilon"] == pytest.approx(eps, rel=1e-9)
        # rounded up as every shown epsilon (forty-second review, docs: it was rounded to nearest)
        shown = epsilon_text(eps, places=4)
        assert f"[flower_app] round {row['round']}: epsilon={shown}" in log
        # once (forty-third review, docs 17's twin: after dp-accounting's first note through
        # absl every Flower line was printed twice, 'INFO:flwr:[flower_app] round 1: ...')
        assert log.count(f"[flower_app] round {row['round']}: epsilon=") == 1, log[-3000:]
        assert row["received"] == row["accepted"] == row["cohort_size"] > 0
        assert row["failed"] == row["dropped"] == row["unhosted"] == 0
    assert final == {
        "stopped_reason": "budget",
        "rounds": 2,
        "epsilon": pytest.approx(expected[1], rel=1e-9),
        "delta": DELTA,
        "not_covered": rounds[0]["not_covered"],  # the round metrics' exact view, outside ε
    }
    assert "mean_norm" in final["not_covered"]
    assert "stopping before round 3: it would exceed target epsilon" in log
    assert "failed to converge" not in log  # dp-accounting's notes on dropped orders
    assert rounds[2]["accuracy"] > rounds[0]["accuracy"] + 0.1
    assert not alive(started), "the local SuperLink or its children are still running"
    assert not list(APP.glob("*.lock")), "flwr run wrote into the example's directory"
