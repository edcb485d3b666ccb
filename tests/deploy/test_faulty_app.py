"""The tests' faulty Flower app: the production app with a fault-injecting ClientApp component."""

from __future__ import annotations

import runpy
import sys

import pytest
from flwr.clientapp import ClientApp

from fedprivopt.clients import client_app
from fedprivopt.deploy.local import REPO_ROOT, stage_app
from fedprivopt.deploy.runconfig import app_config_defaults
from tests.deploy.faulty_app import CLIENT_APP, faulty_app_dir
from tests.faults import parse_fault_users

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_fault_users():
    assert parse_fault_users("") == {}
    assert parse_fault_users("0:raise,3:nan") == {0: "raise", 3: "nan"}


@pytest.mark.parametrize("spec", ["x:raise", "1:explode"])
def test_bad_fault_users_name_the_key(spec):
    with pytest.raises(ValueError, match="fault-users"):
        parse_fault_users(spec)


def test_the_faulty_app_differs_from_the_app_only_in_its_clientapp(tmp_path):
    app = faulty_app_dir(tmp_path / "app", "0:raise,1:slow", sleep_seconds=7.0)
    flwr = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert flwr["components"] == {
        "serverapp": "fedprivopt.deploy.server_app:app",
        "clientapp": f"{CLIENT_APP}:app",
    }
    assert app_config_defaults(app) == app_config_defaults(REPO_ROOT)
    # its FAB carries the fault injection; the production app's does not
    module = CLIENT_APP.replace(".", "/") + ".py"
    staged = stage_app(app, tmp_path / "fab")
    files = {p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()}
    assert {"tests/__init__.py", "tests/faults.py", module} <= files
    assert "fedprivopt/clients/client_app.py" in files
    plain = stage_app(REPO_ROOT, tmp_path / "plain")
    assert not any(p.name == "faults.py" for p in plain.rglob("*.py"))
    # the component wraps the deployment ClientApp with the chosen faults
    source = (app / module).read_text()
    assert "make_faulty_client_app({0: 'raise', 1: 'slow'}, app=deployed, sleep_seconds=7.0)" in (
        source
    )
    namespace = runpy.run_path(str(app / module))
    assert isinstance(namespace["app"], ClientApp) and namespace["app"] is not client_app.app
    assert namespace["deployed"] is client_app.app
