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
2. The thirty-third review's open item: ``deploy local --set vectorize=false`` (also
   ``engine=fast``, ``client-cpus=3``, ``client-gpus``, ``ray-cpus``, ``cohort-chunk``,
   ``fast-actors=2``) was accepted and ignored without a word, and ``--set
   ray-address=127.0.0.1:6379`` was refused with the fast engine's advice ``(set fast-actors,
   or leave ray-address unset)``, after which (``--set fast-actors=1``) it was accepted and
   ignored too. Decided per key: given with ``--set``, every simulation-only key is refused
   (rc 2, one line naming the keys: a deployment has no Ray and no fast engine), except
   ``engine=flower`` (what a deployment is); a preset's own values (a cluster's preset with
   ``ray-address`` and ``fast-actors``; every preset's ``engine``, left out) are said to be
   ignored in one ``note:`` line, as ``simulate`` notes keys its strategy does not use.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.deploy import local as deploy_module
from fedprivopt.deploy.local import REPO_ROOT, deploy_local, resolve_deployment
from fedprivopt.deploy.runconfig import SIMULATION_ONLY_KEYS
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


@pytest.mark.parametrize(
    "setting",
    ["engine=fast", "client-cpus=3", "client-gpus=0.5", "ray-cpus=2", "vectorize=false",
     "cohort-chunk=4", "fast-actors=2", "ray-address=127.0.0.1:6379"],  # fmt: skip
)
def test_2_a_simulation_only_key_given_with_set_is_refused(tmp_path, no_deployment, setting):
    key = setting.split("=")[0]
    line = usage_error(_deploy(tmp_path / "d", *SMALL, "--set", setting), "argument --set", key)
    assert "deployment" in line and "fast-actors >= 1" not in line, line
    assert not no_deployment and not (tmp_path / "d").exists()


def test_2_engine_flower_is_taken_and_a_presets_own_keys_are_noted(tmp_path, no_deployment):
    config, _, _ = resolve_deployment(str(TOY), {"engine": "flower"}, REPO_ROOT)
    assert config.engine == "flower"
    preset = tmp_path / "cluster.toml"
    preset.write_text(
        TOY.read_text().replace('engine = "fast"', 'engine = "fast"\nvectorize = false\n'
                                'fast-actors = 2\nray-address = "127.0.0.1:6379"')
    )  # fmt: skip
    code, _, err = _deploy(tmp_path / "d", *SMALL, preset=preset)
    assert code == 1 and len(no_deployment) == 1, err
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1, err
    assert all(key in notes[0] for key in ("ray-address", "vectorize", "fast-actors")), notes
    assert "engine" not in notes[0].split("(")[0], notes
    code, _, err = _deploy(tmp_path / "d", *SMALL)  # toy.toml's engine = "fast": no note
    assert code == 1 and "note:" not in err, err
    assert set(SIMULATION_ONLY_KEYS) >= {"ray-address", "vectorize", "fast-actors", "engine"}
