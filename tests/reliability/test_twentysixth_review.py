"""Issue 15, twenty-sixth hostile review: regression tests of its findings.

1. A command started with standard output or standard error closed (``>&-``, ``2>&-``, as a
   daemon, a cron line or a supervisor may start it): ``fedprivopt epsilon … >&-`` ended in an
   ``AttributeError: 'NoneType' object has no attribute 'write'`` traceback (rc 1; the guard of
   standard output added by the twenty-fifth review wrapped ``None``: before it, the line was
   silently lost and rc was 0), ``simulate toy.toml --out R >&-`` the same after writing the
   run, and ``simulate toy.toml --out R 2>&-`` stopped at its first progress line
   (``sys.stderr.isatty()`` of ``None``: rc 1, no run). Now closed descriptors 0-2 get the null
   device (a file the run opens cannot take them) and a closed standard output is reported as
   any failure of standard output (rc 2, one line naming it, the run kept); a closed standard
   error drops the diagnostics and the command completes (rc 0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"
EPSILON = ["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--rounds", "10",
           "--delta", "1e-5"]  # fmt: skip


def one_line_error(code: int, err: str, *parts: str) -> str:
    """rc 2, no traceback, one stderr line holding every one of ``parts``."""
    assert code == 2, err
    assert "Traceback" not in err and err.endswith("\n"), err
    assert len(err.splitlines()) == 1, err
    for part in parts:
        assert part in err, (part, err)
    return err


def _env(tmp_path) -> dict[str, str]:
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    env["FLWR_HOME"] = str(tmp_path / "flwr")
    env.pop("FEDPRIVOPT_DEBUG", None)
    return env


def _console_closed(argv: list[str], tmp_path, close: tuple[int, ...]) -> tuple[int, str, str]:
    """The ``fedprivopt`` program with descriptors ``close`` closed: code, stdout, stderr.

    A closed descriptor's output is read back from nowhere: "" is returned for it.
    """
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    code = "from fedprivopt.cli import console; console()"

    def closing() -> None:
        for fd in close:
            os.close(fd)

    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *argv], stdout=out, stderr=err, env=_env(tmp_path),
            cwd=ROOT, preexec_fn=closing,
        )  # fmt: skip
        try:
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()  # by its PID, even when the test fails
                proc.wait()
    return rc, out_path.read_text(), err_path.read_text()


def test_1_closed_stdout_is_one_line(tmp_path):
    rc, _, err = _console_closed(EPSILON, tmp_path, (1,))
    one_line_error(rc, err, "fedprivopt epsilon: error: cannot write standard output")


def test_1_closed_stdout_keeps_the_run(tmp_path):
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "2", "--out", str(out), "--quiet"]
    rc, _, err = _console_closed(argv, tmp_path, (1,))
    one_line_error(rc, err, "cannot write standard output: Bad file descriptor")
    assert json.loads((out / "summary.json").read_text())["rounds_completed"] == 2


@pytest.mark.parametrize("argv", [EPSILON, ["simulate", str(TOY), "--rounds", "2"]],
                         ids=["epsilon", "simulate"])  # fmt: skip
def test_1_closed_stderr_completes(tmp_path, argv):
    if argv[0] == "simulate":
        argv = [*argv, "--out", str(tmp_path / "run")]
    rc, out, _ = _console_closed(argv, tmp_path, (2,))
    assert rc == 0
    assert out.count("\n") == 1 and ("epsilon = " in out or "results in" in out), out
    if argv[0] == "simulate":
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["rounds_completed"] == 2
