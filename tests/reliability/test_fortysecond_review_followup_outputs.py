"""Issue 15, forty-second hostile review, follow-up (outputs: today's fixes of bad input, the
data readers, locks, signals, processes and deployment): tests.

1. Input 5's variant through the Python API of a deployment:
   ``deploy_local(nodes=1, config_path=toy.toml, out="~nosuchuser/x")`` (a ``~user`` of no user
   of the machine; also a ``pathlib.Path``). Input 5 refused it on the command line
   (``cli_args.check_path_text``) and as a task's directory, but the API took it to
   ``local_checks.check_not_deploying``. Before: pathlib's ``RuntimeError: Could not determine
   home directory.`` (the documented ``ValueError`` naming the argument is what every other
   bad ``out`` gets). Now ``local_checks.check_out`` refuses it naming ``--out``, as the command
   line does, before anything is written or started (no Flower, no Ray).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedprivopt.deploy.local import deploy_local

REPO = Path(__file__).resolve().parents[2]
TOY = str(REPO / "simulations" / "toy.toml")
NO_USER = "~fedprivopt-no-such-user-42"


@pytest.mark.parametrize("kind", [str, Path])
def test_1_deploy_local_out_of_a_user_of_none(tmp_path, monkeypatch, kind):
    assert os.path.expanduser(NO_USER) == NO_USER  # no such user here
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setenv("FLWR_DISABLE_UPDATE_CHECK", "1")
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))
    with pytest.raises(ValueError, match=r"argument --out: .*starts with ~, but names no user"):
        deploy_local(nodes=1, config_path=TOY, out=kind(f"{NO_USER}/x"))
    assert os.listdir(tmp_path) == []  # nothing written, nothing started
