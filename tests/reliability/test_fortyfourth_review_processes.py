"""Issue 15, forty-fourth hostile review (processes: signals, locks and processes): tests.

1. A joined Ray cluster's head lost during a run of ``compare`` or ``tune`` (``--set
   fast-actors=1 --set ray-address=H:P``; each cell or trial joins the cluster and is watched by
   ``cluster_watch.HeadWatch``). Before: the run ended with ``... its last checkpoint is kept:
   resume the run (--resume) once the cluster is back``, rc 2; neither command has
   ``--resume`` (``compare ... --resume``: ``unrecognized arguments``), the same command
   continues them. Now the line says so too (``HeadWatch.line``). (In-process: a watch of a
   port nothing listens on, with a short grace, its line captured; no Ray.)
2. A renamed parent and a second command on the same path: ``deploy local toy.toml --nodes 1
   --insecure --rounds 40 --out PP/D`` running (its first row written), ``mv PP PP2; mkdir
   PP; simulate toy.toml --rounds 1 --out PP/D``. Before: the deployment, which reads its
   run's rows and ``summary.json`` by path (``session.follow``), took the new run's for its
   own: ``[deploy] finished: 1 rounds (rounds), epsilon=7.551``, then ``1 rounds (rounds),
   eval_accuracy = 0.5233, epsilon = 7.551; results in PP/D`` with rc 0 (measured), and stopped
   its own 40-round run, left in ``PP2/D``. Now the deployment holds a descriptor of the
   directory it locked and ends when ``PP/D`` no longer names it: ``failed: --out PP/D was
   moved or replaced while the deployment ran; its run is now in PP2/D (fedprivopt simulate
   --resume PP2/D continues it): ...`` (``session.out_in_place``, in ``follow`` and before the
   summary is read); ``processes.json`` goes with the moved logs. (In-process: ``follow`` with a
   stand-in deployment whose ``flwr log`` never ends; no Flower.)
3. ``deploy local toy.toml --nodes 1 --insecure --rounds 40 --out DD`` interrupted twice: Ctrl-C
   at round 1, and again 1 s later while it stopped its processes. Before: rc 130 and
   ``fedprivopt deploy local: interrupted twice; ended at once, as a kill would``, nothing on
   how the run goes on (measured; ``simulate``'s line names ``--resume``; ``fedprivopt simulate
   --resume DD`` then ran to 40 rounds, ε 46.85). Now the line ends ``(a run that released a
   round is continued with fedprivopt simulate --resume DD)`` (``interrupt.second_line``, set
   by ``deploy.cli.run_deploy_command`` once ``--out`` is known, restored after). (In-process:
   the command line with ``deploy_local`` replaced by two SIGTERMs to this process, ``os._exit``
   made to raise; no process starts.)
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

from fedprivopt.deploy.session import follow
from fedprivopt.simulation.cluster_watch import HeadWatch


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_1_a_lost_head_says_how_compare_and_tune_continue():
    said: list[str] = []
    done = threading.Event()

    def lost(line: str) -> None:
        said.append(line)
        done.set()

    watch = HeadWatch(f"127.0.0.1:{_closed_port()}", "ray-address", interval=0.01, grace=0.02,
                      on_lost=lost)  # fmt: skip
    with watch:
        assert done.wait(10.0)
    (line,) = said
    assert "resume the run (--resume)" in line  # simulate's way, as before
    assert "a compare or tune: run the same command again" in line
    assert "\n" not in line


class _Streaming:
    """A ``flwr log --stream`` that never ends."""

    def poll(self):
        return None


class _Procs:
    def __init__(self, log):
        self.log = log

    def log_path(self, name):
        return self.log

    def start(self, role, argv, log_name):
        return _Streaming()


class _Deployment:
    def __init__(self, log, out_fd):
        self.procs = _Procs(log)
        self.out_fd = out_fd
        self.said = []

    def say(self, text):
        self.said.append(text)

    def check_alive(self):
        pass


def test_2_a_moved_out_is_not_taken_for_the_run(tmp_path):
    out = tmp_path / "PP" / "D"
    out.mkdir(parents=True)
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        dep = _Deployment(tmp_path / "serverapp.log", fd)
        (out / "config.toml").write_text("strategy = 'dp-fedavg'\n")
        (out / "metrics.jsonl").write_text('{"round": 1, "epsilon": 7.551}\n')
        os.rename(tmp_path / "PP", tmp_path / "PP2")
        out.mkdir(parents=True)  # another command's run, finished, at the same path
        (out / "summary.json").write_text('{"rounds_completed": 1}\n')
        with pytest.raises(RuntimeError) as caught:
            follow(dep, out, "1", time.monotonic() + 5.0)
        line = str(caught.value)
        assert "was moved or replaced while the deployment ran" in line
        moved = tmp_path / "PP2" / "D"
        assert f"its run is now in {moved}" in line
        assert f"fedprivopt simulate --resume {moved} continues it" in line
        assert "\n" not in line
    finally:
        os.close(fd)


def test_2_an_out_in_place_is_followed_as_before(tmp_path):
    out = tmp_path / "D"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        dep = _Deployment(tmp_path / "serverapp.log", fd)
        (out / "metrics.jsonl").write_text('{"round": 1, "epsilon": 7.551}\n')
        (out / "summary.json").write_text('{"rounds_completed": 1}\n')
        follow(dep, out, "1", time.monotonic() + 5.0)
        assert dep.said == ["round 1: epsilon=7.551"]
    finally:
        os.close(fd)


class _Exited(BaseException):
    pass


def test_3_a_deployment_interrupted_twice_names_the_resume(tmp_path, monkeypatch, capfd):
    import argparse
    from pathlib import Path

    from fedprivopt.deploy.cli import add_deploy_subcommand
    from fedprivopt.simulation import interrupt

    def interrupted_twice(**kwargs):
        try:
            signal.raise_signal(signal.SIGTERM)
        except KeyboardInterrupt:
            signal.raise_signal(signal.SIGTERM)  # while it stops its processes
        raise AssertionError("a second signal ends the process at once")

    def exit_(code):
        raise _Exited(code)

    monkeypatch.setattr("fedprivopt.deploy.local.deploy_local", interrupted_twice)
    monkeypatch.setattr(os, "_exit", exit_)
    parser = argparse.ArgumentParser(prog="fedprivopt")
    add_deploy_subcommand(parser.add_subparsers())
    toy = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
    out = tmp_path / "DD"
    argv = ["deploy", "local", str(toy), "--nodes", "1", "--insecure", "--rounds", "1"]
    args = parser.parse_args([*argv, "--out", str(out), "--quiet"])
    # as the command line runs a command (cli.main)
    interrupt.begin("fedprivopt deploy: interrupted twice; ended at once, as a kill would")
    with pytest.raises(_Exited) as ended, interrupt.signals_raise(interrupt.ENDING_SIGNALS):
        args.func(args)
    assert ended.value.args == (128 + signal.SIGTERM,)
    lines = capfd.readouterr().err.strip().splitlines()
    assert lines[-1] == (
        "fedprivopt deploy local: interrupted twice; ended at once, as a kill would (a run that "
        f"released a round is continued with fedprivopt simulate --resume {out})"
    )
