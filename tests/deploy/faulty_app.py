"""A Flower app whose ClientApp injects faults, for the deployment tests.

The repository's app (``pyproject.toml``) names ``fedprivopt.clients.client_app:app`` as its
ClientApp, which knows nothing of faults (issue 16). :func:`faulty_app_dir` writes a copy of that
app (the files of its FAB, :func:`~fedprivopt.deploy.local.stage_app`) whose ``clientapp``
component is a module written here: the deployment ClientApp wrapped by
:func:`tests.faults.make_faulty_client_app` with the chosen faults. ``tests/faults.py`` travels in
the copy's FAB, so the SuperNodes' ClientApp processes import it from there. Run it with
``deploy_local(..., app_dir=faulty_app_dir(...))``.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

from fedprivopt.deploy.local import REPO_ROOT, stage_app
from tests.faults import parse_fault_users

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["CLIENT_APP", "SLOW_FAULT_SECONDS", "faulty_app_dir"]

SLOW_FAULT_SECONDS = 120.0
"""How long a node with a ``slow`` fault user sleeps before replying: longer than the round timeout
of any test deployment, so its users always time out (``deploy local`` stops it at the end)."""

CLIENT_APP = "tests.faulty_client_app"
"""The module of the copy's ``clientapp`` component (its attribute ``app``)."""

_CARRIED = ("tests/__init__.py", "tests/faults.py")
_SOURCE = '''"""The deployment ClientApp with faults (written by tests/deploy/faulty_app.py)."""

from fedprivopt.clients.client_app import app as deployed
from tests.faults import make_faulty_client_app

app = make_faulty_client_app({faults!r}, app=deployed, sleep_seconds={sleep!r})
'''


def _set(text: str, key: str, value: str) -> str:
    """``text`` with the one line ``key = ...`` of a TOML file set to ``key = value``."""
    new, count = re.subn(rf"(?m)^{re.escape(key)} = .*$", f"{key} = {value}", text)
    if count != 1:
        raise ValueError(f"expected one {key!r} line in the app's pyproject.toml, found {count}")
    return new


def faulty_app_dir(
    dst: str | Path, fault_users: str, *, sleep_seconds: float = SLOW_FAULT_SECONDS
) -> Path:
    """Write the repository's Flower app into ``dst`` with a faulty ClientApp; returns ``dst``.

    Parameters
    ----------
    dst : str or Path
        A new directory.
    fault_users : str
        ``"user:fault,..."`` (:func:`tests.faults.parse_fault_users`).
    sleep_seconds : float
        How long a node hosting a ``slow`` user sleeps before replying.
    """
    faults = parse_fault_users(fault_users)
    app = stage_app(REPO_ROOT, dst)
    if app != Path(dst):
        raise RuntimeError("stage_app could not copy the app (Flower moved its internals)")
    for rel in _CARRIED:
        (app / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_ROOT / rel, app / rel)
    module = CLIENT_APP.replace(".", "/") + ".py"
    (app / module).write_text(_SOURCE.format(faults=faults, sleep=float(sleep_seconds)))
    pyproject = app / "pyproject.toml"
    text = pyproject.read_text()
    include = tomllib.loads(text)["tool"]["flwr"]["app"]["fab-include"]
    text = _set(text, "fab-include", json.dumps([*include, *_CARRIED, module]))
    text = _set(text, "clientapp", json.dumps(f"{CLIENT_APP}:app"))
    pyproject.write_text(text)
    return app
