import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.simulation.checkpoint import load_checkpoint
from fedprivopt.simulation.config import load_config, resolve_config
from fedprivopt.simulation.config_presets import parse_override
from fedprivopt.simulation.files import CHECKPOINT, read_rows
from fedprivopt.simulation.run import resume, simulate

PRESET = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = {
    "population": 12,
    "clients-per-round": 4,
    "task-params.num-users": 12,
    "num-server-rounds": 6,
}


def small_config(**extra):
    return load_config(PRESET, {**SMALL, **extra})


def final_params(out: Path) -> torch.Tensor:
    return load_checkpoint(out)["algorithm"]["params"]


def test_simulate_writes_metrics_summary_config_and_checkpoints(tmp_path):
    outcome = simulate(small_config(**{"eval-every": 2}), tmp_path / "run")
    out = outcome.out_dir
    rows = read_rows(out / "metrics.jsonl")
    assert [r["round"] for r in rows] == [2, 4, 6]
    for row in rows:
        for key in ("epsilon", "delta", "eval_loss", "eval_accuracy", "cohort_size", "seconds"):
            assert key in row
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 6 and summary["stopped_reason"] == "rounds"
    assert summary["epsilon"] == rows[-1]["epsilon"] == outcome.epsilon
    assert summary["final"]["eval_accuracy"] == rows[-1]["eval_accuracy"]
    assert summary["primary_metric"] == outcome.metric == "eval_accuracy"  # the toy task's
    assert load_config(out / "config.toml") == small_config(**{"eval-every": 2})
    assert torch.equal(final_params(out), outcome.params)
    with pytest.raises(ValueError, match="already holds a run"):
        simulate(small_config(), out)


def test_budget_stops_the_run_before_exceeding_it(tmp_path):
    outcome = simulate(
        small_config(**{"target-epsilon": 12.0, "num-server-rounds": 50}), tmp_path / "b"
    )
    assert outcome.stopped_reason == "budget" and 0 < outcome.rounds_completed < 50
    assert outcome.epsilon <= 12.0


def _spawn(args, env=None):
    return subprocess.Popen(
        [sys.executable, "-m", "fedprivopt.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )


@pytest.fixture(scope="module")
def reference_8(tmp_path_factory):
    """The uninterrupted 8-round run both kill -9 cases must reproduce (read only)."""
    out = tmp_path_factory.mktemp("ref8") / "ref"
    return simulate(load_config(PRESET, {**SMALL, "num-server-rounds": 8}), out)


@pytest.mark.parametrize("kill_after_rows", [1, 3])
def test_kill_9_then_resume_gives_the_uninterrupted_model_and_epsilon(
    tmp_path, kill_after_rows, reference_8
):
    sets = [f"--set={k}={v}" for k, v in {**SMALL, "num-server-rounds": 8}.items()]
    reference = reference_8
    out = tmp_path / "killed"
    proc = _spawn(["simulate", str(PRESET), "--out", str(out), "--quiet", *sets])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if len(read_rows(out / "metrics.jsonl")) >= kill_after_rows:
                break
            time.sleep(0.01)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL  # it really was killed mid-run
    outcome = resume(out)
    assert outcome.rounds_completed == 8
    assert torch.equal(outcome.params, reference.params)
    assert outcome.epsilon == reference.epsilon
    assert [r["round"] for r in read_rows(out / "metrics.jsonl")] == list(range(1, 9))


def test_corrupt_checkpoint_falls_back_to_the_previous_one(tmp_path):
    full = simulate(small_config(), tmp_path / "full")
    partial = simulate(small_config(**{"num-server-rounds": 4}), tmp_path / "p")
    out = partial.out_dir
    (out / CHECKPOINT).write_bytes(b"torn write")  # round-4 checkpoint destroyed
    text = (
        (out / "config.toml").read_text().replace("num-server-rounds = 4", "num-server-rounds = 6")
    )
    (out / "config.toml").write_text(text)
    outcome = resume(out)
    assert outcome.rounds_completed == 6
    assert torch.equal(outcome.params, full.params) and outcome.epsilon == full.epsilon


@pytest.mark.parametrize(("strategy", "ema"), [("dp-fedadam", 0.0), ("dp2", 0.5)])
def test_fast_and_flower_engines_end_with_the_same_model(tmp_path, strategy, ema):
    # with ema-decay both engines evaluate the moving average, not the last iterate
    extra = {
        "ema-decay": ema,
        "num-server-rounds": 3,
        "strategy": strategy,
        "server-learning-rate": 0.1,
        "dp2-s1": 1,
        "dp2-s2": 1,
        "ray-cpus": 2,
    }
    fast = simulate(small_config(**extra, engine="fast"), tmp_path / "fast")
    flower = simulate(small_config(**extra, engine="flower"), tmp_path / "flower")
    torch.testing.assert_close(flower.params, fast.params, rtol=0, atol=1e-6)
    assert flower.epsilon == fast.epsilon
    assert [r["round"] for r in flower.rows] == [1, 2, 3]
    assert flower.rows[-1]["eval_loss"] == pytest.approx(fast.rows[-1]["eval_loss"], rel=1e-5)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--set", "client-lr=0.1"], "unknown key 'client-lr'"),
        (["--set", "clip-norm=-1"], "clip-norm"),
        (["--set", "noise-multiplier=abc"], "noise-multiplier"),
        (["--set", "local-epochs=0"], "local-epochs"),
        (["--set", "engine=spark"], "engine"),
        (["--set", "round-timeout=0"], "round-timeout must be a number of seconds >= 1"),
        (["--set", "population=13"], "population"),
        (["--set", "task=nope"], "unknown task 'nope'"),
        (["--set", "oops"], "--set"),
    ],
)
def test_bad_config_exits_2_naming_the_key_before_training(tmp_path, capsys, argv, needle):
    out = tmp_path / "never"
    try:
        code = main(["simulate", str(PRESET), "--out", str(out), "--quiet", *argv])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()  # nothing was written


def test_missing_and_invalid_config_files(tmp_path, capsys):
    assert main(["simulate", str(tmp_path / "none.toml"), "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("strategy = [unclosed")
    assert main(["simulate", str(bad), "--quiet"]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_overrides_parse_toml_values():
    assert parse_override("clip-norm=0.5") == ("clip-norm", 0.5)
    assert parse_override("strategy=dp-fedadam") == ("strategy", "dp-fedadam")
    assert parse_override("secure=true") == ("secure", True)
    assert parse_override("task-params.num-users=7") == ("task-params.num-users", 7)
    cfg = resolve_config({"task-params.num-users": 7, "population": 7, "clients-per-round": 2})
    assert cfg.task_params == {"num_users": 7}


def test_per_strategy_tables_apply_with_the_right_precedence():
    assert load_config(PRESET).strategy.server_learning_rate == 1.0
    adam = load_config(PRESET, {"strategy": "dp-fedadam"})
    assert adam.strategy.server_learning_rate == 0.05
    forced = load_config(PRESET, {"strategy": "dp-fedadam", "server-learning-rate": 0.2})
    assert forced.strategy.server_learning_rate == 0.2
    assert load_config(PRESET, {"strategy": "dp2"}).strategy.options.dp2_s1 == 2


def test_secure_rounds_are_recorded_in_the_ledger_before_the_next_broadcast(tmp_path):
    from fedprivopt.simulation.files import LEDGER_FILE

    config = small_config(**{"secure": True, "checkpoint-every": 3, "eval-every": 3})
    outcome = simulate(config, tmp_path / "s")
    lines = read_rows(outcome.out_dir / LEDGER_FILE)
    rounds = [line["round"] for line in lines if line["kind"] == "round"]
    assert rounds == list(range(1, 7))  # every round, not only the checkpointed ones
    assert [line["events"] for line in lines if line["kind"] == "round"] == rounds
