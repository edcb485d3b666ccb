"""The Flower app's run config: declared keys, translation both ways, the ClientApp adapter."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict
from flwr.common.config import fuse_dicts

from fedprivopt import wire as P
from fedprivopt.deploy.local import REPO_ROOT
from fedprivopt.deploy.runconfig import (
    DEPLOY_KEYS,
    SIMULATION_ONLY_KEYS,
    app_config_defaults,
    run_config_from_flower,
    to_flower_overrides,
)
from fedprivopt.models.side_information_config import PARAMETERS
from fedprivopt.simulation.config import RunConfig, load_config
from fedprivopt.strategies.config import StrategyConfig
from tests.messages import delivered

TOY = REPO_ROOT / "simulations" / "toy.toml"


@pytest.fixture(scope="module")
def defaults() -> dict:
    return app_config_defaults(REPO_ROOT)


def test_the_app_declares_every_preset_key(defaults):
    # every shared key; a strategy's options may be declared, and any can go through JSON
    strategy_keys = StrategyConfig.shared_keys()
    run_keys = {f.name.replace("_", "-") for f in dataclasses.fields(RunConfig)} - {
        "strategy",
        "task-params",
        "side-information",
        *SIMULATION_ONLY_KEYS,
    }
    declared = set(defaults)
    assert strategy_keys <= declared
    assert run_keys <= declared
    options = {k for k in declared if k in StrategyConfig.option_keys()}
    assert {"dp2-s1", "beta1", "adadp-safety"} <= options  # those a user sets by hand
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

    from fedprivopt.clients import client_app
    from fedprivopt.deploy import server_app

    assert app["components"]["serverapp"] == "fedprivopt.deploy.server_app:app"
    assert app["components"]["clientapp"] == "fedprivopt.clients.client_app:app"
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


def test_an_option_the_app_does_not_declare_travels_as_json(defaults):
    config = load_config(TOY, {"strategy": "dp2", "dp2-s1": 3, "dp2-beta": 0.5})
    app_keys = {k: v for k, v in defaults.items() if k != "dp2-s1"}  # e.g. a newly added option
    overrides = to_flower_overrides(config, app_keys=app_keys)
    assert "dp2-s1" not in overrides and overrides["dp2-beta"] == 0.5
    assert json.loads(overrides["strategy-options-json"]) == {"dp2-s1": 3}
    back, _ = run_config_from_flower(fuse_dicts(app_keys, overrides))
    assert back.strategy == config.strategy and back.strategy.options.dp2_s1 == 3
    assert to_flower_overrides(config, app_keys=defaults)["strategy-options-json"] == ""
    with pytest.raises(ValueError, match="strategy-options-json: 'seed' is not a strategy option"):
        run_config_from_flower({**defaults, "strategy-options-json": '{"seed": 1}'})
    with pytest.raises(ValueError, match="strategy-options-json must be a JSON object"):
        run_config_from_flower({**defaults, "strategy-options-json": "[1]"})
    # a fifth review: a RecursionError escaped, a repeated key was taken silently (last one
    # won), and a nested value was named 'server-momentum.x'
    for raw, needle in (
        ("[" * 100000 + "]" * 100000, "nested too deeply"),
        ('{"a":' * 100000 + "1" + "}" * 100000, "nested too deeply"),
        ('{"server-momentum": 0.5, "server-momentum": 0.9}', "repeats the key 'server-momentum'"),
        ('{"server-momentum": {"x": 1}}', "server-momentum must be a number"),
    ):
        with pytest.raises(ValueError, match=needle):
            run_config_from_flower({**defaults, "strategy-options-json": raw})
    with pytest.raises(ValueError, match="task-params-json repeats the key 'seed'"):
        run_config_from_flower({**defaults, "task-params-json": '{"seed": 1, "seed": 2}'})


def test_unset_nullable_keys_and_task_params_json(defaults):
    config, _ = run_config_from_flower({**defaults, "target-epsilon": ""})
    assert config.strategy.target_epsilon is None
    config, _ = run_config_from_flower({**defaults, "target-epsilon": 2.5})
    assert config.strategy.target_epsilon == 2.5
    flat = {**defaults, "task-params-json": json.dumps({"num-users": 40, "seed": 3})}
    assert P.task_params(flat) == {"num_users": 40, "seed": 3}
    assert P.task_params(defaults) == {"num_users": 40, "seed": 0}


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


def test_the_clientapp_reads_the_apps_split_task_params_itself(defaults):
    # Flower flattens [tool.flwr.app.config.task-params] into task-params.<key>: the ClientApp
    # component (no adapter) reads them, so node 1 of 2 hosts users 1, 3, 5 of num-users = 6
    from fedprivopt.clients.client_app import app

    def hosted(run_config):
        ctx = Context(
            run_id=1,
            node_id=2,
            node_config={"partition-id": 1, "num-partitions": 2},
            state=RecordDict(),
            run_config=run_config,
        )
        reply = app(delivered(P.users_query(), "query", dst_node_id=2), ctx)
        return P.read_user_ids(reply.content)

    assert hosted({**defaults, "task-params.num-users": 6, "device": "cpu"}) == [1, 3, 5]
    assert hosted({**defaults, "task-params-json": '{"num-users": 4}'}) == [1, 3]


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
