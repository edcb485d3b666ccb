"""Issue 15, twenty-fifth hostile review: regression tests of its findings.

1. ``deploy local --nodes 2 simulations/toy.toml --set min-nodes=V`` converted ``V`` with
   ``int()`` unchecked (with a preset; without one only ``>= 1`` was checked): ``1.5``, ``"2"``
   and ``true`` ran as 1, 2 and 1; ``inf`` and ``[1]`` ended in ``OverflowError`` and
   ``TypeError`` tracebacks (rc 1); ``abc`` and ``nan`` in ``int()``'s messages naming no key;
   ``0``, ``-3`` and ``1e300`` started the SuperLink and both SuperNodes and failed in the
   ServerApp (rc 1, Flower's lines, ``OUT/deploy`` left behind); ``5`` (more than ``--nodes``)
   waited for nodes that never come until ``--timeout``. Now ``--set min-nodes must be an integer
   in [1, --nodes=2], got ...``: rc 2, one line, before anything is written or started.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.test_fuzz_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"


def one_line_error(code: int, err: str, *parts: str) -> str:
    """rc 2, no traceback, one stderr line holding every one of ``parts``."""
    assert code == 2, err
    assert "Traceback" not in err and err.endswith("\n"), err
    assert len(err.splitlines()) == 1, err
    for part in parts:
        assert part in err, (part, err)
    return err


@pytest.fixture
def no_deployment(monkeypatch):
    """Fail at once if ``deploy local`` gets past its checks (nothing may start)."""
    import fedprivopt.simulation.run as run

    def started(*args, **kwargs):
        raise AssertionError("deploy local went on to build the run")

    monkeypatch.setattr(run, "build_run", started)


@pytest.mark.parametrize(
    "value", ["1.5", "'2'", "true", "inf", "nan", "[1]", "abc", "0", "-3", "1e300", "5"]
)
@pytest.mark.parametrize("preset", [True, False], ids=["preset", "app-config"])
def test_1_deploy_min_nodes_checked(tmp_path, no_deployment, value, preset):
    out = tmp_path / "dl"
    argv = ["deploy", "local", "--nodes", "2", "--insecure", "--rounds", "1", "--out", str(out)]
    argv += [str(TOY)] if preset else []
    code, _, err = run_cli([*argv, "--set", f"min-nodes={value}", "--quiet"])
    one_line_error(code, err, "min-nodes", "[1, --nodes=2]")
    assert not out.exists()
