"""A task referenced by module path runs in ``fedprivopt deploy local`` (issue 18).

The module must travel in the app's FAB: the SuperNodes' ClientApp processes and the SuperLink's
ServerApp process import it from the installed FAB. The test writes the repository's app (the
files of its FAB) plus ``tests/models/minimal_task.py``, listed in ``fab-include``.
"""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from fedprivopt.deploy.local import REPO_ROOT, deploy_local, stage_app
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import read_rows
from fedprivopt.simulation.run import simulate

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(
    not (BIN / "flower-superlink").exists() or not (BIN / "flower-supernode").exists(),
    reason="Flower's deployment commands are not installed next to this interpreter",
)

REF = "tests.models.minimal_task:make_task"
CARRIED = ("tests/__init__.py", "tests/models/__init__.py", "tests/models/minimal_task.py")
RUN = {
    "strategy": "dp-fedadam",
    "population": 4,
    "clients-per-round": 2,
    "num-server-rounds": 1,  # the task is what is tried here; each round costs about 10 s
    "noise-multiplier": 1.0,
    "clip-norm": 1.0,
    "delta": 1e-3,
    "seed": 0,
    "server-learning-rate": 0.1,
    "local-learning-rate": 0.5,
    "batch-size": 4,
    "task": REF,
    "task-params.num-users": 4,
    "task-params.seed": 3,
}


@pytest.fixture(autouse=True)
def _small_processes(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def app_with_task(dst: Path) -> Path:
    """The repository's app with the minimal task module added to its FAB."""
    app = stage_app(REPO_ROOT, dst)
    for rel in CARRIED:
        (app / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_ROOT / rel, app / rel)
    pyproject = app / "pyproject.toml"
    text = pyproject.read_text()
    include = tomllib.loads(text)["tool"]["flwr"]["app"]["fab-include"]
    text, count = re.subn(
        r"(?m)^fab-include = .*$", f"fab-include = {json.dumps([*include, *CARRIED])}", text
    )
    assert count == 1
    pyproject.write_text(text)
    return app


def test_a_referenced_task_runs_in_a_deployment(tmp_path, monkeypatch):
    app = app_with_task(tmp_path / "app")
    monkeypatch.chdir(tmp_path)  # the module is importable only from the FAB, not from here
    out = deploy_local(
        nodes=2, tls=False, overrides=RUN, out=str(tmp_path / "d"), timeout=420, app_dir=app
    )
    summary = json.loads((out / "summary.json").read_text())
    rows = read_rows(out / "metrics.jsonl")
    assert summary["task"] == REF and summary["rounds_completed"] == 1
    assert [r["round"] for r in rows] == [1]
    assert all(r["node_errors"] == 0 for r in rows)
    # the same configuration simulated in process ends with the same model
    monkeypatch.chdir(REPO_ROOT)
    sim = simulate(load_config(out / "config.toml", {"engine": "fast"}), tmp_path / "sim")
    deployed = torch.load(out / "checkpoint.pt", weights_only=True)["algorithm"]["params"]
    torch.testing.assert_close(deployed, sim.params, rtol=0, atol=1e-6)
