"""``compare --jobs J``: the grid's cells in J worker processes, the same runs as one at a time.

The interruption test starts ``fedprivopt compare`` in a new session and kills whatever is
left of that session by PID in ``finally``, also when the test fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedprivopt.simulation.checkpoint import load_checkpoint
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import simulate
from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_signals import SETTINGS, Cli, wait_for, wait_gone

ROOT = Path(__file__).resolve().parents[2]
TOY = str(ROOT / "simulations" / "toy.toml")
SMALL = ["--set", "num-server-rounds=4", "--set", "population=6",
         "--set", "task-params.num-users=6", "--set", "clients-per-round=3"]  # fmt: skip


def _compare(out: Path, *extra: str) -> list[str]:
    # not --quiet: the tests read the cells' "[i/n] cell" lines, which --quiet omits
    grid = ["--strategies", "dp-fedavg,fedavg", "--seeds", "2", "--noise-multipliers", "0.7,1.3"]
    return ["compare", TOY, *grid, "--out", str(out), *SMALL, *extra]


def _rows(summary_csv: Path) -> list[list[str]]:
    """summary.csv without its timing column (seconds per round)."""
    lines = summary_csv.read_text().splitlines()
    header = lines[0].split(",")
    keep = [i for i, name in enumerate(header) if name != "seconds_per_round"]
    return [[line.split(",")[i] for i in keep] for line in lines]


def test_parallel_cells_are_the_runs_of_one_at_a_time(tmp_path):
    code, _, err = run_cli(_compare(tmp_path / "serial"))
    assert code == 0, err
    code, _, err = run_cli(_compare(tmp_path / "parallel", "--jobs", "3"))
    assert code == 0, err
    # every cell announced once, in order, as one at a time does
    lines = err.splitlines()
    assert [line.split("]")[0] for line in lines] == [f"[{i}/6" for i in range(1, 7)], err
    assert _rows(tmp_path / "serial" / "summary.csv") == _rows(
        tmp_path / "parallel" / "summary.csv"
    )
    runs = sorted(p.name for p in (tmp_path / "serial" / "runs").iterdir())
    assert len(runs) == 6
    for name in runs:
        a = load_checkpoint(tmp_path / "serial" / "runs" / name)["algorithm"]["params"]
        b = load_checkpoint(tmp_path / "parallel" / "runs" / name)["algorithm"]["params"]
        assert torch.equal(a, b), name
    # a second call reuses every cell without starting a worker
    code, _, err = run_cli(_compare(tmp_path / "parallel", "--jobs", "3"))
    assert code == 0 and err.count("(reuse)") == 6, err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--jobs", "0"], "argument --jobs"),
        (["--jobs", "257"], "argument --jobs"),
        (["--jobs", "2", "--engine", "flower"], "argument --jobs: 2 runs cells in parallel"),
        (["--jobs", "2", "--set", "fast-actors=2"], "uses Ray actors"),
        (["--jobs", "2", "--tune-grid", "server-learning-rate=0.5,1", "--mean-trials", "2"],
         "argument --jobs: applies only without --tune-grid"),
    ],
)  # fmt: skip
def test_jobs_out_of_range_or_beside_ray_is_refused_in_one_line(tmp_path, extra, message):
    out = tmp_path / "C"
    code, stdout, err = run_cli(_compare(out, *extra))
    assert code == 2 and stdout == "", err
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (out / "runs").exists() or not any((out / "runs").iterdir())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_ctrl_c_stops_every_worker_and_the_same_command_continues(tmp_path):
    out = tmp_path / "C"
    sets = [f"--set={k}={v}" for k, v in SETTINGS.items() if k != "ray-cpus"]
    # not --quiet: the cells' lines are read
    argv = ["compare", TOY, "--strategies", "dp-fedavg", "--seeds", "3", "--out", str(out),
            "--jobs", "2", *sets]  # fmt: skip
    run = Cli(argv, tmp_path, "compare")
    runs = out / "runs"
    try:
        # both workers are inside a run: each has released and checkpointed a round
        wait_for(
            lambda: len(list(runs.glob("*/checkpoint.pt"))) >= 2, 240, "two checkpoints", run.proc
        )
        run.remember()
        started = time.monotonic()
        os.killpg(run.proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        try:
            code = run.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("still running 60 s after Ctrl-C") from None
        seconds = time.monotonic() - started
        wait_gone(run.seen, 15)  # the workers too
    finally:
        run.cleanup()
    err = run.stderr()
    assert code == 130 and seconds < 30, (code, seconds, err[-3000:])
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err[-3000:]
    assert lines[-1].startswith("fedprivopt compare: interrupted; the same command continues it")
    assert all(line.startswith("[") for line in lines[:-1]), err
    assert not (out / "report.md").exists()
    stopped = [
        p.parent for p in runs.glob("*/checkpoint.pt") if not (p.parent / "summary.json").exists()
    ]
    assert stopped, "no run was stopped mid-way"

    # the same command again, in this process: the interrupted call is the one that needs a
    # process (its workers are spawned processes either way)
    code, _, again_err = run_cli(argv)
    assert code == 0, again_err[-3000:]
    assert "(resume)" in again_err
    # each run resumed by a worker is the run an uninterrupted simulate makes
    for run_dir in stopped:
        config = load_config(run_dir / "config.toml")
        reference = simulate(config, tmp_path / f"reference-{run_dir.name}")
        assert torch.equal(load_checkpoint(run_dir)["algorithm"]["params"], reference.params)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["epsilon"] == pytest.approx(reference.epsilon, rel=1e-12)
