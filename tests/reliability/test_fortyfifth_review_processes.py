"""Issue 15, forty-fifth hostile review (processes: signals, locks and processes): tests.

1. A second command inside a deployment's directory during the deployment's start: ``deploy
   local toy.toml --nodes 1 --rounds 40 --out D`` started (``D`` then holds only its
   ``deploy/``, held with ``deploy.lock``; the ServerApp claims ``D`` some 30 s later), then
   ``deploy local toy.toml --nodes 1 --insecure --rounds 1 --out D/x`` (also the Python API
   ``deploy_local(out="D/x")``). Before: every check passed (``check_not_deploying`` asks
   ``D/x/deploy`` only; ``refuse_inside_held`` knows ``D/deploy`` as a held log directory, not
   ``D`` as the directory a deployment is about to claim): the second deployment made
   ``D/x/deploy`` and started its SuperLink and SuperNodes, and the first one's ServerApp then
   found ``D`` "not empty" and failed after its processes had started (the forty-third review
   measured that failure: rc 1 after 63 s, 31 lines of log and a traceback). ``data synth
   --out D/x`` was refused already (follow-up of the forty-third review, outputs 1). Now rc 2
   before anything is written: ``argument --out: D/x is inside the deployment's directory D,
   which process N is writing: choose a directory outside it``
   (``deploy.out_checks.refuse_inside_writing``, which ``check_out_claimable`` calls for the
   command line and the API). ``simulate``, ``compare``, ``tune`` and ``compare-tuned`` into
   ``D/x`` still write there (rc 0, measured): their ``--out`` check is
   ``simulation.run_places.refuse_inside_held`` (an open row for its owner). (In-process: the
   deployment's hold of ``D/deploy`` taken with ``rundir.lock_directory``, as ``deploy_local``
   takes it; no process starts.)
2. A renamed parent while a deployment starts: ``deploy local toy.toml --nodes 1 --insecure
   --rounds 40 --out PP/D``, ``mv PP PP2`` once ``PP/D/deploy`` appeared (its SuperLink
   starting). Before: rc 2 and ``fedprivopt deploy local: error: argument --out:
   /abs/PP/D/deploy/superlink.log: No such file or directory`` (measured): the SuperLink's log,
   read by path while the processes start (``session.wait_port``, ``wait_nodes``), was gone, and
   the error was said as bad input of ``--out``. Now ``deploy_local`` asks
   ``session.out_in_place`` on a file error too: rc 1, ``failed: --out PP/D was moved or
   replaced while the deployment ran; its run is now in PP2/D: ...`` (as for a move later in
   the run, forty-fourth review, processes 2); ``processes.json`` goes with the moved logs.
   (In-process: ``deploy_local`` with its ``_run`` replaced by the move and a read of the log
   by path; no process starts.)
3. The same move later in the start: ``mv PP PP2`` once the SuperNodes are online, or after
   ``flwr run`` and before the ServerApp claims ``PP/D`` (its start takes seconds). Before
   (reasoned from the code and measured in-process): the run was submitted with ``out =
   /abs/PP/D``; the ServerApp made ``PP/D`` anew (``NewRunDir`` makes parents) and wrote this
   deployment's run there, and ``follow`` said ``what is at PP/D now is not this
   deployment's`` and stopped it: the run, its ledger included, left at a place the line
   disowns. Now ``session.out_in_place`` is asked before ``flwr run`` too (nothing submitted,
   the ``moved or replaced`` line), and after it ``follow`` says, where the moved directory
   holds no run and the ServerApp's log (moved with it) says it writes this run to ``PP/D``:
   ``--out PP/D was moved or replaced while the deployment started (its logs are now in
   PP2/D/deploy); its ServerApp, given the path PP/D, made that directory anew and wrote the
   run there: fedprivopt simulate --resume PP/D continues it``. (In-process: ``deploy_local``
   with the start's helpers replaced, ``/bin/true`` for Flower's programs; ``follow`` with a
   stand-in deployment; no Flower.)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fedprivopt.deploy.local_checks import DEPLOY_LOCK
from fedprivopt.deploy.out_checks import check_out_claimable
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.rundir import lock_directory

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def test_1_a_deployment_inside_a_starting_deployments_directory_is_refused(tmp_path, capsys):
    from fedprivopt.cli import main
    from fedprivopt.deploy.local import deploy_local

    d = tmp_path / "D"
    (d / "deploy").mkdir(parents=True)
    config = load_config(TOY)
    inside = "is inside the deployment's directory"
    with lock_directory(d / "deploy", DEPLOY_LOCK, what=f"--out {d}"):
        for out in (d / "x", d / "x" / "y"):
            with pytest.raises(ValueError, match=inside):
                check_out_claimable(out, config)
        with pytest.raises(ValueError, match=inside):
            deploy_local(nodes=1, tls=False, config_path=str(TOY), out=str(d / "x"))
        argv = ["deploy", "local", str(TOY), "--nodes", "1", "--insecure", "--rounds", "1"]
        assert main([*argv, "--out", str(d / "x"), "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and inside in err[0] and "Traceback" not in err[0], err
    assert sorted(p.name for p in d.iterdir()) == ["deploy"]  # nothing written into D
    check_out_claimable(d / "x", config)  # the deployment gone: D/x may be written


def test_2_out_moved_while_the_processes_start_is_said_as_moved(tmp_path, monkeypatch):
    import fedprivopt.deploy.local as local

    out = tmp_path / "PP" / "D"

    def run(dep, nodes, tls, node_auth, app, flower_overrides, out_dir, deadline):
        os.rename(tmp_path / "PP", tmp_path / "PP2")
        (out_dir / "deploy" / "superlink.log").read_bytes()  # by path, as wait_port reads it

    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setattr(local, "_run", run)
    with pytest.raises(RuntimeError) as caught:
        local.deploy_local(nodes=1, tls=False, config_path=str(TOY), out=str(out), timeout=60)
    line = str(caught.value)
    assert "was moved or replaced while the deployment ran" in line
    assert f"its run is now in {tmp_path / 'PP2' / 'D'}" in line and "\n" not in line
    assert (tmp_path / "PP2" / "D" / "deploy" / "processes.json").is_file()


def test_3_out_moved_before_the_run_is_submitted_submits_nothing(tmp_path, monkeypatch):
    import fedprivopt.deploy.local as local

    out = tmp_path / "PP" / "D"
    calls: list[tuple[str, ...]] = []

    def flwr(self, *args, timeout=120.0):
        calls.append(args)
        return {"success": True, "run-id": 7}

    def nodes_online(*args, **kwargs):
        os.rename(tmp_path / "PP", tmp_path / "PP2")

    def followed(*args, **kwargs):
        raise AssertionError("the run was submitted")

    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setattr(local, "stage_app", lambda src, dst: Path(dst))
    monkeypatch.setattr(local, "executable", lambda name: "/bin/true")
    monkeypatch.setattr(local, "write_connection", lambda *args, **kwargs: None)
    monkeypatch.setattr(local, "wait_port", lambda *args, **kwargs: None)
    monkeypatch.setattr(local, "wait_nodes", nodes_online)
    monkeypatch.setattr(local, "follow", followed)
    monkeypatch.setattr(local.Deployment, "flwr", flwr)
    with pytest.raises(RuntimeError) as caught:
        local.deploy_local(nodes=1, tls=False, config_path=str(TOY), out=str(out), timeout=60)
    assert "was moved or replaced while the deployment ran" in str(caught.value)
    assert not [c for c in calls if c[:1] == ("run",)], calls
    assert not out.exists()


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

    def say(self, text):
        pass

    def check_alive(self):
        pass


@pytest.mark.parametrize("ours", [True, False])
def test_3_a_run_made_anew_at_a_moved_out_is_named(tmp_path, ours):
    from fedprivopt.deploy.session import follow

    out = tmp_path / "PP" / "D"
    (out / "deploy").mkdir(parents=True)
    run = "7" if ours else "8"
    (out / "deploy" / "serverapp.log").write_text(
        f"INFO : [fedprivopt] run {run} writes to {out}\n"
    )
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rename(tmp_path / "PP", tmp_path / "PP2")
        out.mkdir(parents=True)  # made anew by the ServerApp, given out's path
        (out / "config.toml").write_text("strategy = 'dp-fedavg'\n")
        (out / "metrics.jsonl").write_text('{"round": 1, "epsilon": 7.551}\n')
        dep = _Deployment(tmp_path / "PP2" / "D" / "deploy" / "serverapp.log", fd)
        with pytest.raises(RuntimeError) as caught:
            follow(dep, out, "7", time.monotonic() + 5.0)
    finally:
        os.close(fd)
    line = str(caught.value)
    assert "\n" not in line
    if ours:
        assert "made that directory anew and wrote the run there" in line
        assert line.endswith(f"fedprivopt simulate --resume {out} continues it")
    else:  # another run's ServerApp: as before
        assert "is not this deployment's" in line
