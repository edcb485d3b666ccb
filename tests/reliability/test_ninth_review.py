"""Issue 15, ninth hostile review (N1-N13): each case failed before its fix.

A tuning directory re-used by another plan (N5), run and lock files that are FIFOs or devices
(N1-N3, N12), ``deploy local --timeout`` (N4), a task parameter in both spellings (N6), the
messages of ``data info`` and ``data synth --tags`` (N7, N8), ``compare --quiet`` (N9),
``--resume`` of a config with fewer rounds than released (N10), a cell recognised by file names
alone (N11) and ``clip_l2``'s argument types (N13).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_misuse_cli import SMALL, TOY, compare, simulate, usage_error


def _tune(out: Path, *extra: str) -> list[str]:
    return ["tune", str(TOY), "--strategy", "dp-fedavg", "--rounds", "1", "--mean-trials", "1",
            "--seed", "1", "--out", str(out), *SMALL, *extra]  # fmt: skip


def _state(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` and its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.name != "tune.lock"
    }


# -- N5: a tuning's trials are reused only under its own plan -------------------------------------


@pytest.fixture(scope="module")
def tuning(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("n5") / "U1"
    code, _, err = run_cli(_tune(out, "--grid", "noise-multiplier=0.5,1.0"))
    assert code == 0, err
    return out


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--grid", "noise-multiplier=0.7,1.0"], "--grid"),
        (["--grid", "noise-multiplier=0.5,1.0", "--distribution", "poisson"], "--distribution"),
        (["--grid", "noise-multiplier=0.5,1.0", "--nb-shape", "2"], "--nb-shape"),
        (["--grid", "noise-multiplier=0.5,1.0", "--metric", "eval_loss"], "--metric"),
        (["--grid", "noise-multiplier=0.5,1.0", "--set", "delta=1e-6"], "delta"),
    ],
)
def test_tune_into_a_tuning_of_another_plan_is_refused(tuning, tmp_path, extra, flag):
    import shutil

    out = tmp_path / "U"
    shutil.copytree(tuning, out)
    before = _state(out)
    line = usage_error(run_cli(_tune(out, *extra)), flag, "--overwrite", "another plan")
    assert "tune" in line
    assert _state(out) == before


def test_tune_overwrite_of_another_plan_starts_over(tuning, tmp_path):
    import shutil

    out = tmp_path / "U"
    shutil.copytree(tuning, out)
    (out / "runs" / "trial-009").mkdir()  # a trial of the earlier plan this one does not draw
    (out / "runs" / "trial-009" / "config.toml").write_text(
        (out / "runs" / "trial-001" / "config.toml").read_text()
    )
    code, _, err = run_cli(_tune(out, "--grid", "noise-multiplier=0.7,1.0", "--overwrite"))
    assert code == 0, err
    plan = json.loads((out / "tune.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert plan["grid"] == {"noise-multiplier": [0.7, 1.0]}
    assert [t["origin"] for t in summary["trials"]] == ["ran in this call"]
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["trial-001"]
    old = json.loads((tuning / "summary.json").read_text())
    assert summary["epsilon"] < old["epsilon"]  # ε of the plan that drew the released trial


def test_tune_overwrite_keeps_a_stranger_in_runs(tuning, tmp_path):
    import shutil

    out = tmp_path / "U"
    shutil.copytree(tuning, out)
    (out / "runs" / "trial-001" / "thesis.tex").write_text("mine")
    before = _state(out)
    usage_error(run_cli(_tune(out, "--grid", "noise-multiplier=0.7,1.0", "--overwrite")),
                "thesis.tex")  # fmt: skip
    assert _state(out) == before


def test_tune_with_the_same_plan_still_reuses(tuning, tmp_path):
    import shutil

    out = tmp_path / "U"
    shutil.copytree(tuning, out)
    code, _, err = run_cli(_tune(out, "--grid", "noise-multiplier=0.5,1.0"))
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trials"][0]["origin"].startswith("reused")


# -- N3: lock files that are FIFOs ----------------------------------------------------------------


@pytest.mark.parametrize("command", ["simulate", "compare", "tune"])
def test_a_fifo_lock_file_is_refused(tmp_path, command):
    out = tmp_path / "out"
    argv = {
        "simulate": lambda: simulate(str(out)),
        "compare": lambda: compare(str(out)),
        "tune": lambda: _tune(out, "--grid", "noise-multiplier=0.5,1.0"),
    }[command]()
    out.mkdir()
    if command != "simulate":
        (out / "runs").mkdir()  # an earlier comparison's or tuning's directory
    lock = {"simulate": "run.lock", "compare": "compare.lock", "tune": "tune.lock"}[command]
    os.mkfifo(out / lock)
    usage_error(run_cli(argv), lock, "not a regular file")
