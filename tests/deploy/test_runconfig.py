"""The Flower app's run config: declared keys, translation both ways, the ClientApp adapter."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict
from flwr.common.config import fuse_dicts

from fedprivopt import wire as P
from fedprivopt.deploy.client_app import client_context
from fedprivopt.deploy.local import REPO_ROOT
from fedprivopt.deploy.runconfig import (
    DEPLOY_KEYS,
    SIMULATION_ONLY_KEYS,
    app_config_defaults,
    run_config_from_flower,
    task_params_from_flower,
    to_flower_overrides,
)
from fedprivopt.models.side_information_config import PARAMETERS
from fedprivopt.simulation.config import RunConfig, load_config
from fedprivopt.strategies.config import StrategyConfig

TOY = REPO_ROOT / "simulations" / "toy.toml"


@pytest.fixture(scope="module")
def defaults() -> dict:
    return app_config_defaults(REPO_ROOT)


def test_the_app_declares_every_preset_key(defaults):
    strategy_keys = StrategyConfig.keys()
    run_keys = {f.name.replace("_", "-") for f in dataclasses.fields(RunConfig)} - {
        "strategy",
        "task-params",
        "side-information",
        *SIMULATION_ONLY_KEYS,
    }
    declared = set(defaults)
    assert strategy_keys <= declared
    assert run_keys <= declared
    # the side-information table: the kind and every parameter of every kind, unset by default
    side = {"side-information.kind"} | {
        f"side-information.{key}" for params in PARAMETERS.values() for key in params
    }
    assert {k for k in declared if k.startswith("side-information")} == side
    assert defaults["side-information.kind"] == "auto"
    assert all(defaults[k] == "" for k in side - {"side-information.kind"})
    assert set(DEPLOY_KEYS) <= declared
    assert {"task-params.num-users", "task-params.seed"} <= declared
    flwr_app = load_config(TOY)  # the app's defaults are the toy preset
    config, options = run_config_from_flower(defaults)
    assert config.strategy == flwr_app.strategy
    assert config.task == flwr_app.task and config.task_params == flwr_app.task_params
    assert config.engine == "flower"
    assert options.min_nodes == 1
    # fault injection is the tests' own Flower app (tests/deploy/faulty_app.py), not a key here
    assert not any("fault" in key for key in declared)


def test_components_point_at_module_level_apps():
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    app = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["publisher"] == "fedprivopt"
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp

    from fedprivopt.deploy import client_app, server_app

    assert app["components"]["serverapp"] == "fedprivopt.deploy.server_app:app"
    assert app["components"]["clientapp"] == "fedprivopt.deploy.client_app:app"
    assert isinstance(server_app.app, ServerApp) and isinstance(client_app.app, ClientApp)


@pytest.mark.parametrize("strategy", ["dp-fedadam-bc", "dp2", "dp-fedavg-adadp", "fedadam"])
def test_overrides_reproduce_the_preset_through_flowers_fusion(defaults, strategy):
    config = load_config(
        TOY,
        {"strategy": strategy, "target-epsilon": 5.0, "task-params.examples-per-user": [3, 9]},
    )
    overrides = to_flower_overrides(config, app_keys=defaults, extra={"out": "/tmp/x"})
    fused = fuse_dicts(defaults, overrides)  # what the SuperLink does (unknown keys are errors)
    back, options = run_config_from_flower(fused)
    assert back.strategy == config.strategy
    assert back.task_params == config.task_params  # a list survives, as JSON
    assert dataclasses.replace(back, engine=config.engine) == config
    assert options.out == "/tmp/x"


def test_unset_nullable_keys_and_task_params_json(defaults):
    config, _ = run_config_from_flower({**defaults, "target-epsilon": ""})
    assert config.strategy.target_epsilon is None
    config, _ = run_config_from_flower({**defaults, "target-epsilon": 2.5})
    assert config.strategy.target_epsilon == 2.5
    flat = {**defaults, "task-params-json": json.dumps({"num-users": 40, "seed": 3})}
    assert task_params_from_flower(flat) == {"num_users": 40, "seed": 3}
    assert task_params_from_flower(defaults) == {"num_users": 40, "seed": 0}


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"bogus": 1}, "bogus"),
        ({"noise-multiplier": -1.0}, "noise-multiplier"),
        ({"min-nodes": 0}, "min-nodes"),
        ({"task-params-json": "[1, 2]"}, "task-params-json"),
        ({"fault-users": "0:raise"}, "fault-users"),  # not a key of the production app
    ],
)
def test_bad_run_config_names_the_key(defaults, change, needle):
    with pytest.raises(ValueError, match=needle):
        run_config_from_flower({**defaults, **change})


def test_client_context_gives_the_clientapp_its_task_params(defaults):
    ctx = Context(
        run_id=1,
        node_id=2,
        node_config={"partition-id": 0, "num-partitions": 2},
        state=RecordDict(),
        run_config={**defaults, "task-params.num-users": 6, "device": "cpu"},
    )
    out = client_context(ctx)
    assert json.loads(out.run_config[P.RUN_TASK_PARAMS]) == {"num_users": 6, "seed": 0}
    assert not any(k.startswith("task-params.") for k in out.run_config)
    assert out.run_config[P.RUN_CLIENT_DEVICE] == "cpu"
    assert out.state is ctx.state and out.node_config is ctx.node_config
    assert "task-params.num-users" in ctx.run_config  # the original is not modified


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pathspec, inside Flower's FAB build
def test_stage_app_copies_exactly_the_fab_files(tmp_path):
    from flwr.cli.build import build_fab_from_disk

    from fedprivopt.deploy.local import stage_app

    staged = stage_app(REPO_ROOT, tmp_path / "fedprivopt")
    files = {p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()}
    assert "pyproject.toml" in files
    assert "fedprivopt/deploy/server_app.py" in files
    assert "fedprivopt/clients/client_app.py" in files
    assert not any(f.startswith(("tests/", "docs/", ".venv/", "runs/")) for f in files)
    assert not any("__pycache__" in f for f in files)
    import io
    import zipfile

    fab = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(Path(staged))))
    assert set(fab.namelist()) == files | {".info/CONTENT"}


def test_out_dir_of_the_server_app(tmp_path, monkeypatch):
    from fedprivopt.deploy.server_app import _out_dir

    assert _out_dir(str(tmp_path / "r-{run_id}"), 42) == tmp_path / "r-42"
    monkeypatch.chdir(tmp_path)
    assert _out_dir("runs/deploy/{run_id}", 7) == tmp_path / "runs" / "deploy" / "7"
