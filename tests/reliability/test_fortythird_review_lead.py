"""Forty-third review of issue 15: the lead's findings (rows the reviewers left open).

1. ``simulate toy.toml --rounds 1 --set fast-actors=1`` (also ``--engine flower``, ``compare`` and
   ``tune`` with Ray) under a limit on processes (``ulimit -u``, a container's pids limit:
   ``fork`` refused with EAGAIN, injected where the real ``fork_exec`` raises it; the processes
   reviewer's open row). Before: rc 1 and a 30- to 56-line ``BlockingIOError`` traceback
   (``cli.main`` re-raised an ``OSError`` that is not a file's). Now: rc 1 and one line saying a
   process could not be started and what to do (``core.orphans.fork_refused``, shared with
   ``deploy local``'s line since processes 2), nothing left in ``--out``.
"""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

from fedprivopt.cli import main

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def test_1_simulate_refused_a_process_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    def _execute_child(self, *args, **kwargs):  # fork_exec refused at a pids limit
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", _execute_child)
    out = tmp_path / "run"
    args = ["simulate", str(TOY), "--rounds", "1", "--set", "fast-actors=1", "--out", str(out)]
    code = main([*args, "--quiet"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err and "BlockingIOError" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "simulate: error: a process could not be started" in err
    assert "limit on processes" in err
    assert not out.exists() or not any(out.iterdir())  # nothing written, nothing left
