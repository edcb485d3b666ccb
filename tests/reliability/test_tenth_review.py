"""Issue 15, tenth hostile review (findings 1-5): each case failed before its fix.

A tuning grid over keys that choose the private users or the data (1), ``compare
--tune-grid``'s public tuning seeds (2), a compare cell of another plan (3), the size and
silence of a tuned comparison's planning (4), and ``--quiet``, repeated flags, ``--seed``'s
bound and SIGTERM before a run (5).
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_misuse_cli import ROOT, SMALL, TOY, run_child, usage_error


def _tune(out: Path, *extra: str) -> list[str]:
    return ["tune", str(TOY), "--rounds", "1", "--mean-trials", "1", "--seed", "1",
            "--out", str(out), *SMALL, *extra]  # fmt: skip


def _compare(out: Path, *extra: str, grid: str = "server-learning-rate=0.3,1") -> list[str]:
    return ["compare", str(TOY), "--strategies", "dp-fedavg", "--tune-grid", grid,
            "--rounds", "1", "--out", str(out), *SMALL, *extra]  # fmt: skip


def _state(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` and its bytes (lock files aside)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


@pytest.fixture
def entropy(monkeypatch):
    """``secrets.randbits``, which draws a secret tuning seed, as 1000, 1001, ... (known K)."""
    seeds = itertools.count(1000)
    monkeypatch.setattr(secrets, "randbits", lambda bits: next(seeds))


# -- finding 1: a grid may not change which users are private or what the data is -------------


@pytest.mark.parametrize(
    "grid, extra",
    [
        ("side-information.users=1,8", ["--set", "side-information.kind=public-users"]),
        ("side-information.kind=ones,public-users", []),
        ("side-information=ones,public-users", []),
        ("strategies.adadps.side-information.users=1,8", []),
        ("population=12,13", []),
        ("task-params.num-users=12,13", []),
        ("task-params.num_users=12,13", []),
        ("task-params.seed=1,2", []),
        ("task-params.synth-seed=1,2", []),
        ("task-params.eval-split=heldout,test", []),
        ("task-params={seed=1},{seed=2}", []),
        ("task-params.examples-per-user=5,9", []),
        ("task-params.my-own-data-file=a,b", []),
        ("secure=true,false", []),
    ],
)
def test_tune_refuses_a_grid_over_the_private_users_or_the_data(tmp_path, grid, extra):
    out = tmp_path / "T"
    key = grid.partition("=")[0]
    line = usage_error(run_cli(_tune(out, "--strategy", "adadps", "--grid", grid, *extra)),
                       "argument --grid", repr(key), "cannot be tuned")  # fmt: skip
    assert "--set" not in line
    if "users" in key or key in ("population", "side-information.kind", "side-information"):
        assert "chooses which users are private" in line
    if key in ("task-params.examples-per-user", "task-params.my-own-data-file"):
        # of a task's parameters only an allowlist may vary (a user's task cannot say which
        # of its own are safe)
        assert "only embedding-dim, hidden-size, init-bias, train-bias can be tuned" in line
    assert not out.exists()


def test_a_model_parameter_of_the_task_may_be_tuned():
    from fedprivopt.simulation.tune_grid import parse_grid

    grid = parse_grid(["task-params.hidden-size=8,16", "strategies.adadps.local-learning-rate=1,2"])
    assert grid["task-params.hidden-size"] == (8, 16)


def test_compare_refuses_a_tune_grid_over_the_public_users(tmp_path):
    out = tmp_path / "C"
    argv = _compare(out, "--mean-trials", "2", "--set", "side-information.kind=public-users",
                    grid="side-information.users=1,8")  # fmt: skip
    argv[argv.index("dp-fedavg")] = "adadps"
    usage_error(run_cli(argv), "argument --tune-grid", "'side-information.users'",
                "chooses which users are private")  # fmt: skip
    assert not out.exists()


# -- finding 2: compare's tunings draw secret seeds, as tune without --seed ----------------------


def test_compare_tunings_draw_secret_seeds_and_keep_them(tmp_path, entropy):
    out = tmp_path / "C"
    argv = _compare(out, "--mean-trials", "1.5", "--seeds", "2")
    code, _, err = run_cli(argv)
    assert code == 0, err
    cells = ["dp-fedavg__sigma0.5__seed0", "dp-fedavg__sigma0.5__seed1"]
    seeds = []
    for cell in cells:
        plan = json.loads((out / "tune" / cell / "tune.json").read_text())
        summary = json.loads((out / "tune" / cell / "summary.json").read_text())
        assert plan["seed_source"] == summary["seed_source"] == "os-entropy"
        assert summary["seed"] is None and "drawn from OS entropy" in summary["privacy"]
        seeds.append(plan["seed"])
    assert seeds == [1000, 1001]  # not the public cell seeds 0 and 1
    report = (out / "report.md").read_text()
    assert "public, since compare numbers its seeds" not in report
    assert "drawn from OS entropy" in report
    commands = [line for line in report.splitlines() if line.startswith("fedprivopt tune ")]
    assert len(commands) == 2 and not any("--seed" in line for line in commands)
    # a second call continues the same tunings: the seeds of tune.json, every trial reused
    code, _, err = run_cli(argv)
    assert code == 0, err
    for cell, seed in zip(cells, seeds, strict=True):
        assert json.loads((out / "tune" / cell / "tune.json").read_text())["seed"] == seed
        summary = json.loads((out / "tune" / cell / "summary.json").read_text())
        assert all(t["origin"].startswith("reused") for t in summary["trials"])
    code, _, err = run_cli(["compare-tuned", str(out / "tune" / cells[0]),
                            "--out", str(tmp_path / "R")])  # fmt: skip
    assert code == 0, err


# -- finding 3: another plan in a compare cell; stray entries in a tuning's runs/ ---------------


def test_compare_names_the_changed_distribution_and_overwrite_starts_over(tmp_path, monkeypatch):
    monkeypatch.setattr(secrets, "randbits", lambda bits: 0)  # the finding's seed: K = 3
    out = tmp_path / "C"
    code, _, err = run_cli(_compare(out, "--mean-trials", "2"))
    assert code == 0, err
    cell = out / "tune" / "dp-fedavg__sigma0.5__seed0"
    before = _state(out)
    again = _compare(out, "--mean-trials", "2", "--distribution", "poisson")
    usage_error(run_cli(again), "--distribution", "--overwrite", "dp-fedavg__sigma0.5__seed0")
    assert _state(out) == before
    code, _, err = run_cli([*again, "--overwrite"])
    assert code == 0, err
    plan = json.loads((cell / "tune.json").read_text())
    assert plan["trial_count"]["distribution"] == "poisson" and plan["seed"] == 0
    assert sorted(p.name for p in (cell / "runs").iterdir()) == [t["trial"] for t in plan["trials"]]


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_tune_names_the_stray_entries_to_remove(tmp_path, overwrite):
    out = tmp_path / "T"
    code, _, err = run_cli(_tune(out, "--grid", "server-learning-rate=0.3,1"))
    assert code == 0, err
    (out / "runs" / "trial-009").mkdir()
    (out / "runs" / "x").write_text("mine")
    before = _state(out)
    usage_error(run_cli(_tune(out, "--grid", "server-learning-rate=0.3,1", *overwrite)),
                "remove", str(out / "runs" / "trial-009"), str(out / "runs" / "x"))  # fmt: skip
    assert _state(out) == before


# -- finding 4: the size of a tuned comparison, and progress while it is planned ----------------


def test_compare_bounds_the_expected_trials_before_planning(tmp_path):
    out = tmp_path / "C"
    argv = _compare(out, "--mean-trials", "10000", "--seeds", "2")
    usage_error(run_child(argv, timeout=120), "--mean-trials", "--seeds", "10,000", "20,000")
    assert not out.exists()


def test_compare_shows_its_planning(tmp_path, entropy, monkeypatch):
    from fedprivopt import cli_compare_tune

    monkeypatch.setattr(cli_compare_tune, "PLANNING_EVERY_S", 0.0)  # a line for every cell
    out = tmp_path / "C"
    argv = [a for a in _compare(out, "--mean-trials", "1.5", "--seeds", "2") if a != "--quiet"]
    code, _, err = run_cli(argv)
    assert code == 0, err
    lines = err.splitlines()
    planning = [i for i, line in enumerate(lines) if line.startswith("checking tuning ")]
    assert [lines[i].split(":")[0] for i in planning] == ["checking tuning 1/2",
                                                          "checking tuning 2/2"]  # fmt: skip
    assert planning[-1] < lines.index("[1/2] dp-fedavg__sigma0.5__seed0 (tuning)")


def test_one_runs_rdp_curve_is_computed_once(monkeypatch):
    """97% of the planning was dp-accounting's RDP of the same ledger, again for every cell."""
    from fedprivopt.privacy import tuning
    from fedprivopt.privacy.events import SubsampledGaussianEvent

    calls = []
    real = tuning.event_rdp
    monkeypatch.setattr(tuning, "event_rdp", lambda *args: calls.append(args) or real(*args))
    tuning._rdp_curve.cache_clear()
    ledger = [(SubsampledGaussianEvent.poisson(sample_rate=0.25, noise_multiplier=0.5123), 7)]
    first = tuning.ledger_rdp(ledger)
    first[:] = 0.0  # a caller's copy: the remembered curve stays
    again = tuning.ledger_rdp(list(ledger))
    assert len(calls) == 1 and np.all(again > 0)


# -- finding 5: --quiet, repeated flags, --seed, SIGTERM ------------------------------------------


def test_compare_quiet_prints_nothing_but_the_report(tmp_path, entropy):
    out = tmp_path / "C"
    code, stdout, err = run_cli(_compare(out, "--mean-trials", "1.5"))
    assert code == 0 and err == "", err
    assert stdout == f"report: {out / 'report.md'}\n"


def test_compare_quiet_interrupted_prints_one_line(tmp_path, entropy, monkeypatch):
    from fedprivopt.simulation import tune

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tune, "run_trials", interrupted)
    code, _, err = run_cli(_compare(tmp_path / "C", "--mean-trials", "1.5"))
    assert code == 130 and len(err.splitlines()) == 1, err
    assert err.startswith("fedprivopt compare: interrupted")


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--mean-trials", "9", "--grid", "server-learning-rate=0.3,1"], "--mean-trials"),
        (["--rounds", "2", "--grid", "server-learning-rate=0.3,1"], "--rounds"),
        (["--distribution", "poisson", "--distribution", "truncated-negative-binomial",
          "--grid", "server-learning-rate=0.3,1"], "--distribution"),
    ],
)  # fmt: skip
def test_a_repeated_tune_flag_is_refused(tmp_path, argv, flag):
    out = tmp_path / "T"
    usage_error(run_cli(_tune(out, *argv)), f"argument {flag}", "given twice")
    assert not out.exists()


@pytest.mark.parametrize(
    "command, extra, flag",
    [
        ("compare", ["--seeds", "1", "--seeds", "2", "--mean-trials", "2"], "--seeds"),
        ("compare", ["--mean-trials", "2", "--mean-trials", "9"], "--mean-trials"),
        ("simulate", ["--rounds", "2"], "--rounds"),
        ("simulate", ["--seed", "1", "--seed", "2"], "--seed"),
    ],
)
def test_a_repeated_flag_is_refused(tmp_path, command, extra, flag):
    out = tmp_path / "O"
    if command == "compare":
        argv = _compare(out, *extra)
    else:
        argv = ["simulate", str(TOY), "--rounds", "1", "--out", str(out), *SMALL, *extra]
    usage_error(run_cli(argv), f"argument {flag}", "given twice")
    assert not out.exists()


def test_the_same_value_twice_is_still_accepted(tmp_path):
    out = tmp_path / "O"
    argv = ["simulate", str(TOY), "--rounds", "1", "--rounds", "1", "--out", str(out), *SMALL]
    code, _, err = run_cli(argv)
    assert code == 0, err


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["tune", "--seed", "1" + "0" * 4000], ["--seed", "9223372036854775807"]),
        (["tune", "--seed", str(2**63)], ["--seed", "9223372036854775807"]),
        (["simulate", "--seed", str(2**63)], ["--seed", "9223372036854775807"]),
        (["tune", "--nb-shape", "-1e-300"], ["--nb-shape", "must be in [0"]),
    ],
)
def test_seed_is_bounded_and_a_negative_exponent_is_a_value(tmp_path, argv, needles):
    out = tmp_path / "O"
    command, *flags = argv
    full = [command, str(TOY), "--out", str(out), *flags]
    if command == "tune":
        full += ["--grid", "server-learning-rate=0.3,1", "--mean-trials", "2"]
    line = usage_error(run_cli(full), *needles)
    assert "expected one argument" not in line and len(line) <= 2000
    assert not out.exists()


_SIGNAL_AT = """
import os, signal, sys, time
from fedprivopt import cli, cli_tune
where = sys.argv[1]
module = cli if where == "build_parser" else cli_tune
real = getattr(module, where)
def patched(*args):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
    return real(*args)
setattr(module, where, patched)
sys.exit(cli.main(sys.argv[2:]))
"""


@pytest.mark.parametrize("where", ["build_parser", "prepare_tuning"])
def test_sigterm_before_a_run_ends_with_one_line(tmp_path, where):
    out = tmp_path / "T"
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "FLWR_TELEMETRY_ENABLED": "0"}
    argv = [sys.executable, "-c", _SIGNAL_AT, where,
            *_tune(out, "--grid", "server-learning-rate=0.3,1")]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 143, (proc.returncode, proc.stderr[-2000:])
    assert len(proc.stderr.splitlines()) == 1 and "interrupted" in proc.stderr, proc.stderr
    assert not out.exists()
