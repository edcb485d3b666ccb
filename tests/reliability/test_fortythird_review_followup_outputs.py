"""Issue 15, follow-up of the forty-third hostile review (outputs: today's fixes of signals,
locks, processes, deployment and of the data readers): tests.

1. A run written inside a running deployment's log directory: ``deploy local --out D`` holds
   ``D/deploy`` (``rundir.lock_directory`` with ``deploy.lock`` there) from its start, some 30 s
   before its ServerApp claims ``D``; meanwhile ``simulate toy.toml --rounds 1 --out D/deploy/x``
   (also ``compare``, ``tune``, ``deploy local`` and the Python API's ``simulate``: one check).
   Before: rc 0, a whole run among the deployment's logs (the processes reviewer's open row):
   ``run_places.refuse_inside_held`` looked only for a held ``run.lock``. Now rc 2, one line:
   ``argument --out: D/deploy/x is inside the deployment's log directory D/deploy, which
   process N holds: ...`` (the PID read from ``deploy.lock``). (In-process: the test holds
   ``D/deploy`` as the deployment does; nothing is started.)
"""

from __future__ import annotations

import os

from fedprivopt.simulation.rundir import lock_directory

TOY = os.path.join(os.path.dirname(__file__), "..", "..", "simulations", "toy.toml")


def test_1_a_run_inside_a_running_deployments_log_directory_is_refused(tmp_path, capsys):
    from fedprivopt.cli import main

    log_dir = tmp_path / "D" / "deploy"
    log_dir.mkdir(parents=True)
    out = log_dir / "x"
    with lock_directory(log_dir, "deploy.lock", what="--out D"):
        code = main(["simulate", TOY, "--rounds", "1", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "inside the deployment's log directory" in err and f"process {os.getpid()} " in err
    assert not out.exists()
