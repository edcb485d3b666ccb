"""``flwr run .`` as a Flower user types it (issue 18): Flower's default local SuperLink.

In a fresh ``FLWR_HOME``, ``flwr run .`` writes Flower's default configuration (the ``local``
connection), starts a local SuperLink in simulation mode (detached: it keeps running afterwards)
and runs the app. That SuperLink installs the app's dependencies with ``uv sync`` into a fresh
runtime environment; ``[tool.uv] exclude-dependencies`` in ``pyproject.toml`` makes that resolve
offline and install nothing, so the app runs in the installed environment. The test gives the
SuperLink free ports and a private home, runs 2 rounds, and stops the SuperLink (and whatever it
started) by PID, also when the run fails.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedprivopt.deploy.local import REPO_ROOT
from fedprivopt.simulation.files import read_rows
from tests.procs import alive, flwr_run_env
from tests.procs import process_tree as _tree
from tests.procs import stop_processes as _stop

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(
    not (BIN / "flwr").exists() or not (BIN / "flower-superlink").exists(),
    reason="Flower's commands are not installed next to this interpreter",
)


def test_flwr_run_dot_runs_two_rounds_on_the_local_superlink(tmp_path):
    home, out = tmp_path / "flwr-home", tmp_path / "out"
    env, marker = flwr_run_env(home, BIN)
    overrides = f'num-server-rounds=2 out="{out}"'
    try:
        done = subprocess.run(
            [str(BIN / "flwr"), "run", ".", "--run-config", overrides, "--stream"],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=480,
        )
        started = _tree(marker)
        assert started, "flwr run started no local SuperLink"
    finally:
        _stop(_tree(marker))
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "No additional application dependencies needed installation" in log
    assert (out / "summary.json").is_file(), log[-3000:]  # flwr run exits 0 on a failed run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and summary["stopped_reason"] == "rounds"
    assert [r["round"] for r in read_rows(out / "metrics.jsonl")] == [1, 2]
    assert not alive(started), "the local SuperLink or its children are still running"
