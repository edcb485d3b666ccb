"""Forty-third review of issue 15: the lead's findings (rows the reviewers left open).

1. ``simulate toy.toml --rounds 1 --set fast-actors=1`` (also ``--engine flower``, ``compare`` and
   ``tune`` with Ray) under a limit on processes (``ulimit -u``, a container's pids limit:
   ``fork`` refused with EAGAIN, injected where the real ``fork_exec`` raises it; the processes
   reviewer's open row). Before: rc 1 and a 30- to 56-line ``BlockingIOError`` traceback
   (``cli.main`` re-raised an ``OSError`` that is not a file's). Now: rc 1 and one line saying a
   process could not be started and what to do (``core.orphans.fork_refused``, shared with
   ``deploy local``'s line since processes 2), nothing left in ``--out``.
2. The Python API ``simulate(config, "s3://b/r")`` and ``resume("s3://b/r")`` (the input
   reviewer's open row; ``simulate --out s3://b/r`` refuses it since input 5), and the deployment's
   run config ``out = "s3://b/r"``. Before: the run written into ``./s3:/b/r``, rc 0. Now:
   ``ValueError`` naming the argument, before anything is written (``core.files.url_refusal``,
   the one wording the command line, the tasks and ``data.generate`` now share too).
"""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.deploy.runconfig import check_run_out
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import resume, simulate

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


@pytest.mark.parametrize("url", ["s3://b/r", "gs://bucket/run", "file:///tmp/x"])
def test_2_the_python_api_refuses_a_url_as_its_run_directory(tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    config = load_config(TOY, {"num-server-rounds": 1})
    with pytest.raises(ValueError, match=r"^out_dir '.*' is a URL \("):
        simulate(config, url)
    with pytest.raises(ValueError, match=r"^out_dir '.*' is a URL \("):
        resume(url)
    with pytest.raises(ValueError, match=r"^out '.*' is a URL \("):
        check_run_out(url)
    assert not any(tmp_path.iterdir())  # nothing written where the URL would have pointed
