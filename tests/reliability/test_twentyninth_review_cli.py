"""Issue 15, twenty-ninth hostile review (command line): regression tests of its findings.

1. An empty cell directory counted as a cell for the report rule (the open item the
   twenty-seventh review's follow-up left): ``compare toy.toml --strategies fedavg --out P``,
   ``P`` holding an empty ``runs/dp-fedavg__sigma0.5__seed0/`` (``mkdir -p``, or a cell whose
   files were deleted) and the user's ``report.md`` and ``summary.csv``, replaced both (rc 0);
   the same for ``tune --out Q`` beside an empty ``runs/trial-001/`` and for ``compare
   --tune-grid … --out S`` beside an empty ``tune/<cell>/``. A report of ours never stands
   beside cells that are all empty (it is removed before the first cell changes and written
   after the last), so a cell, trial or tuned cell now counts only when it holds a run's
   ``config.toml`` (a tuning's ``tune.json``): rc 2, one line naming ``report.md``, nothing
   changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    env["FLWR_HOME"] = str(tmp_path / "flwr")
    env["HOME"] = str(tmp_path / "home")
    env["PYTHONPATH"] = str(ROOT)
    env.pop("FEDPRIVOPT_DEBUG", None)
    return env


def _cli(tmp_path: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedprivopt.cli", *argv],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# -- finding 1: an empty cell directory is no cell -------------------------------------------------

TUNE = ["--grid", "server-learning-rate=0.5,1", "--mean-trials", "1", "--rounds", "1"]
TUNED = ["--strategies", "dp-fedavg", "--tune-grid", *TUNE[1:]]
EMPTY_CELLS = {
    "compare": (
        "runs/dp-fedavg__sigma0.5__seed0",
        ["compare", str(TOY), "--strategies", "fedavg", "--rounds", "1"],
    ),
    "tune": ("runs/trial-001", ["tune", str(TOY), *TUNE]),
    "compare --tune-grid": ("tune/dp-fedavg__sigma0.5__seed0", ["compare", str(TOY), *TUNED]),
}


@pytest.mark.parametrize("command", sorted(EMPTY_CELLS))
def test_1_a_report_beside_only_empty_cells_is_the_users(tmp_path, command):
    cell, argv = EMPTY_CELLS[command]
    out = tmp_path / "P"
    (out / cell).mkdir(parents=True)
    (out / "report.md").write_text("my notes\n")
    proc = _cli(tmp_path, *argv, "--out", str(out))
    line = _one_line(proc)  # was rc 0, the user's report.md replaced
    assert "holds 'report.md'" in line, line
    assert (out / "report.md").read_text() == "my notes\n"
    assert sorted(p.name for p in out.iterdir()) == ["report.md", cell.split("/")[0]]


def test_1_a_report_beside_a_run_cell_is_still_replaced(tmp_path):
    out = tmp_path / "P"
    argv = ["compare", str(TOY), "--strategies", "fedavg", "--rounds", "1", "--out", str(out)]
    assert _cli(tmp_path, *argv).returncode == 0
    (out / "runs" / "dp-fedavg__sigma0.5__seed0").mkdir()  # an empty cell beside a real one
    again = _cli(tmp_path, *argv)
    assert again.returncode == 0, again.stderr
    assert "1 of 1 runs from an earlier call" in again.stdout, again.stdout
