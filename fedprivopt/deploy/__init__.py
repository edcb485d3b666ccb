"""Deployment: the Flower app (ServerApp, ClientApp) and a local SuperLink with SuperNodes.

- :mod:`fedprivopt.deploy.server_app` / :mod:`fedprivopt.deploy.client_app`: the components of the
  Flower app declared in ``pyproject.toml`` (``flwr run . <connection>``);
- :func:`deploy_local`: one run on a local SuperLink with N SuperNodes (TLS, node keys), stopped
  by PID afterwards;
- :mod:`fedprivopt.deploy.cli`: ``fedprivopt deploy local ...``, part of the command line (the
  layer above this package).

The names are imported lazily, so the ServerApp and ClientApp processes (which import
``fedprivopt.deploy.*_app``) do not load the deployment tooling. See ``docs/DEPLOYMENT.md``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["deploy_local"]


def __getattr__(name: str) -> Any:
    if name == "deploy_local":
        from fedprivopt.deploy.local import deploy_local

        return deploy_local
    raise AttributeError(f"module 'fedprivopt.deploy' has no attribute {name!r}")
