"""Issue 15, forty-first hostile review (processes: one writer per run directory): tests.

1. ``deploy local --out D`` (or the Python API ``deploy_local(out=D)``; both call
   ``deploy.out_checks.check_out_claimable``) while another process holds ``D`` as a run
   directory and has written only ``run.lock`` there (``simulate --out D`` between its lock and
   its ``config.toml``; forced in-process with ``NewRunDir``). Before: every check passed (a
   finished start's debris, ``run.lock`` alone, is let through without asking whether it is
   held), so the deployment wrote ``D/deploy/`` into the other run's directory and started the
   SuperLink and SuperNodes; ``compare``, ``tune`` and ``data synth`` refuse such a directory.
   Now refused before anything is created, naming the holder's PID
   (``out_checks.check_not_held`` probes the directory's ``flock``); the same debris with no
   holder is still claimable. (No Flower process is started.)
"""

from __future__ import annotations

import os

import pytest

from fedprivopt.data.locks import LockHeldError
from fedprivopt.deploy.out_checks import check_out_claimable
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.rundir import NewRunDir

TOY = os.path.join(os.path.dirname(__file__), "..", "..", "simulations", "toy.toml")


def test_1_deploy_out_held_by_a_starting_run_is_refused(tmp_path):
    config = load_config(TOY)
    out = tmp_path / "D"
    out.mkdir()
    with NewRunDir(out):
        assert sorted(os.listdir(out)) == ["run.lock"]
        with pytest.raises(LockHeldError) as info:
            check_out_claimable(out, config)
        message = str(info.value)
        assert f"in use by process {os.getpid()}" in message and "--out" in message
        assert "\n" not in message
        assert sorted(os.listdir(out)) == ["run.lock"]  # nothing written
    # a start's debris with nobody holding it stays claimable (the thirty-ninth review's rule)
    (out / "run.lock").write_text("")
    check_out_claimable(out, config)
    check_out_claimable(tmp_path / "new", config)  # a new directory too
