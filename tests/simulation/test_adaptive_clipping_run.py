"""Adaptive clipping in whole runs: ε, budget, both engines, kill -9 and resume, bad keys."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import rdp

from fedprivopt.cli import main
from fedprivopt.privacy.adaptive_clip import update_noise_multiplier
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import LEDGER_FILE, read_rows
from fedprivopt.simulation.run import resume, simulate

PRESET = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
ADAPTIVE = {
    "population": 12,
    "clients-per-round": 4,
    "task-params.num-users": 12,
    "num-server-rounds": 6,
    "adaptive-clipping": True,
    "clip-norm": 0.1,  # 10x too small for the toy task: C must grow
    "clip-count-stddev": 1.0,
}


def adaptive_config(**extra):
    return load_config(PRESET, {**ADAPTIVE, **extra})


def cli_epsilon(capsys, *args):
    capsys.readouterr()
    assert main(["epsilon", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["epsilon"]


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_run_epsilon_equals_fedprivopt_epsilon_and_the_composed_event(tmp_path, capsys, accountant):
    outcome = simulate(adaptive_config(accountant=accountant), tmp_path / "run")
    rows = outcome.rows
    assert rows[0]["clip_norm"] == 0.1
    assert rows[-1]["clip_norm"] > 0.1  # C grew toward the median update norm
    sigma, q, rounds, delta = 0.5, 4 / 12, 6, 1e-4
    args = ["--noise-multiplier", str(sigma), "--sample-rate", str(q), "--rounds", str(rounds)]
    args += ["--delta", str(delta), "--accountant", accountant]
    assert outcome.epsilon == pytest.approx(cli_epsilon(capsys, *args), rel=1e-9)
    ledger = [x for x in read_rows(outcome.out_dir / LEDGER_FILE) if x["kind"] == "round"]
    event = ledger[0]["released"][0]["event"]
    s_delta = update_noise_multiplier(sigma, 1.0)
    assert event["noise_multiplier"] == s_delta and event["count_noise_multiplier"] == 2.0
    if accountant == "rdp":  # dp-accounting's ε of the composed event, built here
        ref = rdp.RdpAccountant()
        inner = dpa.ComposedDpEvent([dpa.GaussianDpEvent(s_delta), dpa.GaussianDpEvent(2.0)])
        ref.compose(dpa.PoissonSampledDpEvent(q, inner), rounds)
        assert outcome.epsilon == pytest.approx(ref.get_epsilon(delta), rel=1e-9)
    for row in rows:
        for key in ("clip_norm", "clip_count_fraction", "update_noise_multiplier"):
            assert key in row
        assert "clipped_fraction" in row


def test_budget_stops_an_adaptive_run_before_exceeding_it(tmp_path):
    outcome = simulate(
        adaptive_config(**{"target-epsilon": 12.0, "num-server-rounds": 50}), tmp_path / "b"
    )
    assert outcome.stopped_reason == "budget" and 0 < outcome.rounds_completed < 50
    assert outcome.epsilon <= 12.0


@pytest.mark.parametrize(
    ("strategy", "mode"), [("dp-fedavg", "server"), ("dp-fedavg-adadp", "distributed")]
)
def test_fast_and_flower_engines_end_with_the_same_model_and_clip_norms(tmp_path, strategy, mode):
    extra = {"num-server-rounds": 3, "strategy": strategy, "noise-mode": mode, "ray-cpus": 2}
    fast = simulate(adaptive_config(**extra, engine="fast"), tmp_path / "fast")
    flower = simulate(adaptive_config(**extra, engine="flower"), tmp_path / "flower")
    torch.testing.assert_close(flower.params, fast.params, rtol=0, atol=1e-6)
    assert flower.epsilon == fast.epsilon
    for a, b in zip(fast.rows, flower.rows, strict=True):
        assert a["clip_norm"] == pytest.approx(b["clip_norm"], rel=1e-12)
        assert a["clip_count_fraction"] == pytest.approx(b["clip_count_fraction"], rel=1e-12)


def _spawn(args):
    return subprocess.Popen(
        [sys.executable, "-m", "fedprivopt.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_kill_9_then_resume_gives_the_same_clip_norm_trajectory(tmp_path):
    settings = {**ADAPTIVE, "num-server-rounds": 8}
    reference = simulate(load_config(PRESET, settings), tmp_path / "ref")
    out = tmp_path / "killed"
    sets = [
        f"--set={k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items()
    ]
    proc = _spawn(["simulate", str(PRESET), "--out", str(out), "--quiet", *sets])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if len(read_rows(out / "metrics.jsonl")) >= 3:
                break
            time.sleep(0.01)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    outcome = resume(out)
    rows = read_rows(out / "metrics.jsonl")
    assert [r["round"] for r in rows] == list(range(1, 9))
    assert [r["clip_norm"] for r in rows] == [r["clip_norm"] for r in reference.rows]
    assert torch.equal(outcome.params, reference.params)
    assert outcome.epsilon == reference.epsilon


def test_resume_with_another_clip_quantile_is_refused(tmp_path):
    outcome = simulate(adaptive_config(**{"num-server-rounds": 2}), tmp_path / "r")
    config = outcome.out_dir / "config.toml"
    config.write_text(config.read_text() + "clip-quantile = 0.7\n")
    with pytest.raises(ValueError, match="clip-quantile"):
        resume(outcome.out_dir)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--set", "clip-quantile=1.5"], "clip-quantile must be a finite number in (0, 1)"),
        (["--set", "clip-learning-rate=0"], "clip-learning-rate"),
        (["--set", "clip-count-stddev=0.2"], "clip-count-stddev must be > noise-multiplier/2"),
        (["--set", "adaptive-clipping=maybe"], "adaptive-clipping"),
    ],
)
def test_bad_keys_exit_2_with_one_line(tmp_path, capsys, argv, needle):
    out = tmp_path / "never"
    sets = ["--set=adaptive-clipping=true", "--set=clip-count-stddev=1.0"]
    sets = [s for s in sets if s.split("=")[1] not in {a.split("=")[0] for a in argv}]
    code = main(["simulate", str(PRESET), "--out", str(out), "--quiet", *sets, *argv])
    assert code == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_an_edited_count_noise_in_the_ledger_is_refused(tmp_path):
    outcome = simulate(adaptive_config(**{"num-server-rounds": 2}), tmp_path / "r")
    path = outcome.out_dir / LEDGER_FILE
    path.write_text(
        path.read_text().replace('"count_noise_multiplier": 2.0', '"count_noise_multiplier": 9.0')
    )
    with pytest.raises(ValueError, match=r"count_noise_multiplier=9\.0.*clip-count-stddev"):
        resume(outcome.out_dir)


def test_summary_states_the_adaptive_clipping_threat_model(tmp_path):
    outcome = simulate(adaptive_config(**{"num-server-rounds": 1}), tmp_path / "s")
    summary = json.loads((outcome.out_dir / "summary.json").read_text())
    assert "adaptive clipping" in summary["threat_model"]
    assert summary["config"]["adaptive-clipping"] is True
