"""Issue 15, thirty-fourth hostile review (the deployment): regression tests.

1. ``deploy local toy.toml --nodes 1 --insecure --rounds 1 --out 'runs/x-{run_id}'`` (the app's
   default ``out`` in ``pyproject.toml`` is ``runs/deploy/{run_id}``, docs/DEPLOYMENT.md): the
   ServerApp replaced the placeholder and wrote the whole run into ``runs/x-<Flower's run id>``
   while the deployment waited for ``runs/x-{run_id}/summary.json``; when the run ended it said
   ``fedprivopt deploy local: failed: run N ended (finished:completed: N/A) without writing
   .../runs/x-{run_id}/summary.json; ServerApp log:`` and 40 lines of log, rc 1, for a run
   that had finished (ε 8.607) in another directory, and left ``runs/x-{run_id}/deploy``. Now
   rc 2 before anything is written or started, one line naming ``--out`` and the placeholder
   (``deploy.local.check_out``, also in the Python API's ``deploy_local``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.deploy import local as deploy_module
from fedprivopt.deploy.local import deploy_local
from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_misuse_cli import TOY, usage_error

SMALL = ["--set", "population=6", "--set", "task-params.num-users=6",
         "--set", "clients-per-round=3"]  # fmt: skip


def _deploy(out: Path, *extra: str, preset: Path | str = TOY) -> tuple[int, str, str]:
    return run_cli(["deploy", "local", "--nodes", "1", "--insecure", str(preset), "--rounds",
                    "1", "--out", str(out), "--quiet", *extra])  # fmt: skip


@pytest.fixture
def no_deployment(monkeypatch):
    """``deploy_local`` replaced by a failure: what the command says before it starts anything."""
    calls = []

    def refuse(**kwargs):
        calls.append(kwargs)
        raise RuntimeError("not started (test)")

    monkeypatch.setattr(deploy_module, "deploy_local", refuse)
    return calls


def test_1_an_out_with_the_run_id_placeholder_is_refused_before_anything(tmp_path, no_deployment):
    out = tmp_path / "x-{run_id}"
    line = usage_error(_deploy(out, *SMALL), "argument --out", "{run_id}")
    assert "x-{run_id}" in line, line
    assert not no_deployment and list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match=r"\{run_id\}"):  # the Python API too, first
        deploy_local(nodes=1, tls=False, out=str(out), app_dir=tmp_path)
    _deploy(tmp_path / "plain", *SMALL)  # the same without it reaches the deployment
    assert len(no_deployment) == 1
