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
"""

from __future__ import annotations

import os
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
