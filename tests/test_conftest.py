"""The suite's own set-up leaves nothing behind."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_run_of_no_test_leaves_no_flower_home(tmp_path):
    # `-k` matching nothing: the session ran no test, and its FLWR_HOME stayed in TMPDIR
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "no_such_test"]
    done = subprocess.run(
        [*argv, "tests/test_conftest.py"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 5, done.stdout[-2000:]  # 5: no test collected
    assert sorted(p.name for p in tmp_path.iterdir()) == []
