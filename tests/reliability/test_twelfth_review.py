"""Issue 15, twelfth hostile review (findings 1-4): each case failed before its fix.

Finding 1: a run's JSON files (``metrics.jsonl``, ``privacy_ledger.jsonl``, ``summary.json``,
``tune.json``) nested 100,000 deep ended in a ``RecursionError`` traceback (rc 1) in
``--resume``, ``compare`` and ``compare-tuned``; an integer of 5,000 digits in them, in
``config.toml`` or in ``--set`` gave Python's "Exceeds the limit (4300 digits)" with neither the
file nor the key. Finding 2: a ``metrics.jsonl`` or ledger whose damage holds no newline (a
3 GB hole of zero bytes) was read whole: a ``MemoryError`` traceback under a 4 GB limit.
Finding 3: ``min-shares`` above the population was accepted with distributed noise (a guarantee
against the server that needs more honest shares than there are users), and ``min-shares`` /
``min-shares-quantile`` were ignored with server noise. Finding 4: a private run's
``summary.json`` said nothing of the exact, un-noised counts and norms of the users' updates in
``metrics.jsonl`` (rule 9 of the privacy contract).

Run against the code before the fixes (the changed modules restored from the commit before,
2026-11-25): every test failed there except the controls, named as such.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from fedprivopt.simulation.files import LINE_LIMIT
from fedprivopt.strategies.config import StrategyConfig
from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_misuse_cli import SMALL, TOY, usage_error

DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "1" + "0" * 5000


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("twelfth") / "run"
    code, _, err = run_cli(["simulate", str(TOY), "--rounds", "2", "--out", str(out), *SMALL])
    assert code == 0, err[-2000:]
    return out


def _copy(finished: Path, tmp_path: Path) -> Path:
    """A copy of the finished run, its configuration raised to 4 rounds (so resume runs)."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    config = out / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 2", "num-server-rounds = 4"))
    return out


def _append(path: Path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


# -- finding 1: deep nesting and huge integers in a run's files ---------------------------------

DAMAGE = {
    "metrics-deep": ("metrics.jsonl", lambda p: _append(p, '{"round": 3, "x": ' + DEEP + "}\n")),
    "metrics-huge-int": ("metrics.jsonl", lambda p: _append(p, '{"round": ' + HUGE + "}\n")),
    "ledger-deep": ("privacy_ledger.jsonl", lambda p: _append(p, '{"x": ' + DEEP + "}\n")),
    "ledger-huge-int": ("privacy_ledger.jsonl", lambda p: _append(p, '{"round": ' + HUGE + "}\n")),
    "summary-deep": ("summary.json", lambda p: p.write_text('{"x": ' + DEEP + "}")),
    "config-huge-int": ("config.toml", lambda p: p.write_text(f"max-examples = {HUGE}\n")),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_resume_names_a_file_too_deep_or_with_a_huge_integer(finished, tmp_path, case):
    name, damage = DAMAGE[case]
    out = _copy(finished, tmp_path)
    damage(out / name)
    usage_error(run_cli(["simulate", "--resume", str(out), "--quiet"]), name)


def test_compare_names_the_cell_whose_ledger_is_too_deep(tmp_path):
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--out", str(out),
            *SMALL]  # fmt: skip
    assert run_cli(argv)[0] == 0
    (cell,) = (out / "runs").iterdir()
    _append(cell / "privacy_ledger.jsonl", '{"x": ' + DEEP + "}\n")
    usage_error(run_cli(argv), f"cell {cell.name}", "privacy_ledger.jsonl", "nested too deeply")


def test_compare_tuned_names_a_tune_json_too_deep(tmp_path):
    out = tmp_path / "t"
    argv = ["tune", str(TOY), "--rounds", "1", "--mean-trials", "1", "--seed", "3",
            "--grid", "server-learning-rate=0.3,1", "--out", str(out), *SMALL]  # fmt: skip
    assert run_cli(argv)[0] == 0
    (out / "tune.json").write_text('{"x": ' + DEEP + "}")
    usage_error(run_cli(["compare-tuned", str(out), "--out", str(tmp_path / "rep")]), "tune.json")
    usage_error(run_cli(argv), "tune.json", "nested too deeply")


@pytest.mark.parametrize("key", ["seed", "clip-norm"])
def test_a_huge_integer_in_set_names_the_key(tmp_path, key):
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "1", "--out", str(out), *SMALL,
            "--set", f"{key}={HUGE}"]  # fmt: skip
    usage_error(run_cli(argv), f"{key} must be")
    assert not out.exists()


# -- finding 2: a line of a run's .jsonl file is bounded ----------------------------------------


@pytest.mark.parametrize("name", ["metrics.jsonl", "privacy_ledger.jsonl"])
def test_a_hole_without_newline_is_refused_without_reading_it_whole(finished, tmp_path, name):
    out = _copy(finished, tmp_path)
    path = out / name
    os.truncate(path, path.stat().st_size + LINE_LIMIT + 1)  # a sparse hole of zero bytes
    line = usage_error(run_cli(["simulate", "--resume", str(out), "--quiet"]), name)
    assert f"longer than {LINE_LIMIT} bytes" in line


@pytest.mark.parametrize("name", ["metrics.jsonl", "privacy_ledger.jsonl"])
def test_a_short_torn_tail_still_resumes(finished, tmp_path, name):  # control
    out = _copy(finished, tmp_path)
    _append(out / name, "\0" * 4096)
    code, _, err = run_cli(["simulate", "--resume", str(out), "--quiet"])
    assert code == 0, err[-2000:]
    assert json.loads((out / "summary.json").read_text())["rounds_completed"] == 4


# -- finding 3: min-shares ----------------------------------------------------------------------


def test_min_shares_above_the_population_is_refused():
    base = {"population": 12, "clients-per-round": 4, "noise-mode": "distributed"}
    with pytest.raises(ValueError, match=r"min-shares must be in \[0, population = 12\]"):
        StrategyConfig.from_mapping({**base, "min-shares": 13})
    assert StrategyConfig.from_mapping({**base, "min-shares": 12}).min_shares == 12  # control


@pytest.mark.parametrize("setting", ["min-shares=3", "min-shares-quantile=0.1"])
def test_share_keys_with_server_noise_are_refused_in_one_line(tmp_path, setting):
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "1", "--out", str(out), *SMALL, "--set", setting]
    usage_error(run_cli(argv), setting.split("=")[0], "noise-mode 'distributed'")
    assert not out.exists()
    StrategyConfig.from_mapping({"min-shares": 0, "min-shares-quantile": 0.01})  # defaults: ok


# -- finding 4: the summary says what epsilon does not cover ------------------------------------


def test_a_private_summary_names_the_uncovered_round_metrics(finished):
    summary = json.loads((finished / "summary.json").read_text())
    row = json.loads((finished / "metrics.jsonl").read_text().splitlines()[-1])
    assert "epsilon does not cover them" in summary["not_covered"]
    for key in ("cohort_size", "clipped_fraction", "mean_norm", "server_clipped"):
        assert key in row and key in summary["not_covered"]


def test_a_non_private_summary_has_nothing_uncovered(tmp_path):
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "1", "--out", str(out), *SMALL,
            "--strategy", "fedavg"]  # fmt: skip
    assert run_cli(argv)[0] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["not_covered"] is None and summary["threat_model"].startswith("not private")
