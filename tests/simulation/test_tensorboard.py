"""TensorBoard event files equal metrics.jsonl (issue 18), read back with TensorBoard's reader."""

import itertools
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedprivopt.cli import main
from fedprivopt.simulation import tensorboard
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import METRICS_FILE, read_rows
from fedprivopt.simulation.run import simulate
from fedprivopt.simulation.tensorboard import TensorBoardLog, scalars

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = {"num-server-rounds": 3, "population": 12, "task-params.num-users": 12}


def read_events(run_dir: Path) -> dict[str, dict[int, float]]:
    """Every scalar of the event files in ``run_dir``: tag -> step -> value."""
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def assert_events_equal_rows(run_dir: Path) -> list[dict]:
    rows = read_rows(run_dir / METRICS_FILE)
    events = read_events(run_dir)
    expected = {key for row in rows for key in scalars(row)}
    assert set(events) == expected
    assert {"epsilon", "eval_accuracy", "clipped_fraction", "noise_std", "seconds"} <= expected
    for row in rows:
        for key, value in scalars(row).items():
            got = events[key][row["round"]]
            if math.isnan(value):
                assert math.isnan(got)
            else:  # TensorBoard stores float32
                assert got == pytest.approx(value, rel=1e-6, abs=1e-30), (key, row["round"])
    assert all(set(steps) == {r["round"] for r in rows} for steps in events.values())
    return rows


def test_simulate_writes_event_files_equal_to_metrics_jsonl(tmp_path):
    config = load_config(TOY, {**SMALL, "tensorboard": True, "strategy": "dp-fedadam"})
    simulate(config, tmp_path / "run")
    assert list((tmp_path / "run").glob("events.out.tfevents.*.run"))
    rows = assert_events_equal_rows(tmp_path / "run")
    assert [r["round"] for r in rows] == [1, 2, 3]


def test_no_event_files_by_default(tmp_path):
    simulate(load_config(TOY, SMALL), tmp_path / "run")
    assert not list((tmp_path / "run").glob("events.out.tfevents.*"))


def test_compare_gives_every_run_its_own_event_files(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg,dp-fedadam", "--seeds", "2"]
    argv += ["--rounds", "2", "--out", str(out), "--quiet", "--tensorboard"]
    argv += ["--set", "population=12", "--set", "task-params.num-users=12"]
    assert main(argv) == 0
    runs = sorted(p for p in (out / "runs").iterdir() if p.is_dir())
    assert len(runs) == 4
    seen = set()
    for run in runs:
        (event,) = run.glob("events.out.tfevents.*")
        assert event.name.endswith(f".{run.name}")  # the cell's label ends its file name
        rows = assert_events_equal_rows(run)
        seen.add(tuple(r["eval_loss"] for r in rows))
    assert len(seen) == 4  # four different runs, four different curves
    # the grid again: every cell is reused, its event files kept
    assert main(argv) == 0
    assert all(len(list(run.glob("events.out.tfevents.*"))) == 1 for run in runs)


def test_a_resumed_log_purges_the_redone_rounds(tmp_path):
    first = TensorBoardLog(tmp_path, first_round=1)
    for r in (1, 2, 3):
        first.add_row({"round": r, "epsilon": float(r), "eval_loss": 10.0 + r})
    first.close()
    second = TensorBoardLog(tmp_path, first_round=3)  # round 3 is redone after a kill
    for r in (3, 4):
        second.add_row({"round": r, "epsilon": float(r), "eval_loss": 20.0 + r})
    second.close()
    events = read_events(tmp_path)
    assert events["eval_loss"] == {1: 11.0, 2: 12.0, 3: 23.0, 4: 24.0}
    assert events["epsilon"] == {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}


def test_a_resume_in_the_same_second_past_file_nine_purges_too(tmp_path, monkeypatch):
    # event files are read in the order of their names: the 10th of a process (unpadded) came
    # before its 9th written in the same second, and the resumed rounds were lost
    monkeypatch.setattr(tensorboard, "_FILE_NUMBER", itertools.count(9))
    monkeypatch.setattr(tensorboard, "time", SimpleNamespace(time=lambda: 1.7e9))
    test_a_resumed_log_purges_the_redone_rounds(tmp_path)
