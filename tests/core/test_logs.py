"""The command line's logging: absl's first note must not double Flower's log lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import logging
from flwr.common.logger import log
from absl import logging as absl_logging
from fedprivopt.cli import main

main(["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--rounds", "3",
      "--delta", "1e-5"])
absl_logging.warning("a note from dp-accounting")  # absl calls basicConfig() if no handler
log(logging.INFO, "flower says hello")
logging.getLogger("fedprivopt.probe").warning("a warning of ours")
logging.getLogger("fedprivopt.probe").info("an info line of ours")
"""


def test_an_absl_note_does_not_double_flower_lines_or_reformat_ours(tmp_path):
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "FLWR_HOME": str(tmp_path)}  # fmt: skip
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=root, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    err = done.stderr.splitlines()
    assert sum("flower says hello" in line for line in err) == 1, err  # before: 2
    assert "INFO:flwr:flower says hello" not in err
    assert "a warning of ours" in err  # the message alone, as before the note
    assert not any("an info line of ours" in line for line in err)
    assert not any("a note from dp-accounting" in line for line in err)  # absl at ERROR
