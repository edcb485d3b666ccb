"""Issue 15, twenty-seventh hostile review: regression tests of its findings.

a. ``simulate toy.toml --engine flower --set round-timeout=1e-9`` was accepted (any number of
   seconds > 0 was): the server waited for no reply, every update of every round was lost
   (``timed_out`` = the cohort) while every round was charged to ε (rc 0, ε 10.28 for 2 rounds
   of nothing). ``round-timeout`` is now at least 1 s (``MIN_ROUND_TIMEOUT``; a toy round on
   the Flower engine takes 0.1-0.2 s, its first about 9 s, and 1 s lost none): rc 2, one line
   naming the key and its bound, before anything is written.
b. ``simulate toy.toml --set client-cpus=1e300`` (also ``client-gpus``) was accepted and
   silently ignored on the fast engine (the Flower engine's check against the machine runs
   only for that engine). Both are now in ``[0, 1e6]`` on every engine: rc 2, one line naming
   the key and its range.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.cli import main
from tests.reliability.test_twentythird_review import one_line_error

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"


def _simulate(tmp_path, capsys, *argv: str) -> tuple[int, str]:
    """``fedprivopt simulate`` in process: its exit code and standard error."""
    capsys.readouterr()
    try:
        code = main(["simulate", *argv, "--quiet"])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


# -- a: a round timeout no reply can meet ---------------------------------------------------------
@pytest.mark.parametrize("value", ["1e-9", "0.001", "0.5", "5e-324"])
@pytest.mark.parametrize("engine", ["fast", "flower"])
def test_a_a_round_timeout_below_one_second_is_refused_naming_the_key(
    tmp_path, capsys, value, engine
):
    out = tmp_path / "r"
    code, err = _simulate(
        tmp_path, capsys, str(TOY), "--engine", engine, "--rounds", "2", "--out", str(out),
        "--set", f"round-timeout={value}",
    )  # fmt: skip
    one_line_error(code, err, "round-timeout", ">= 1")
    assert not out.exists()


def test_a_a_round_timeout_of_one_second_or_more_is_taken():
    from fedprivopt.simulation.config import resolve_config

    for value in (1, 1.0, 20.0, 3600.0, 1e308):
        assert resolve_config({"round-timeout": value}).round_timeout == value


# -- b: client resources beyond any node, ignored by the fast engine ------------------------------
@pytest.mark.parametrize("key", ["client-cpus", "client-gpus"])
@pytest.mark.parametrize("value", ["1e300", "1e7", "1.5e308"])
def test_b_client_resources_beyond_any_node_are_refused_on_the_fast_engine(
    tmp_path, capsys, key, value
):
    out = tmp_path / "r"
    code, err = _simulate(
        tmp_path, capsys, str(TOY), "--rounds", "2", "--out", str(out), "--set", f"{key}={value}"
    )
    one_line_error(code, err, key, "[0, 1e+06]")
    assert not out.exists()


def test_b_client_resources_in_range_are_taken():
    from fedprivopt.simulation.config import resolve_config

    for value in (0, 0.5, 1, 64.0, 1e6):
        config = resolve_config({"client-cpus": value, "client-gpus": value})
        assert config.client_cpus == config.client_gpus == value
