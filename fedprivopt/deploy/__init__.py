"""Deployment: the Flower app (ServerApp, ClientApp) and a local SuperLink with SuperNodes.

- :mod:`fedprivopt.deploy.server_app`: the ServerApp component of the Flower app declared in
  ``pyproject.toml`` (``flwr run . <connection>``); its ClientApp component is
  :mod:`fedprivopt.clients.client_app` itself;
- :func:`deploy_local`: one run on a local SuperLink with N SuperNodes (TLS, node keys), stopped
  by PID afterwards;
- :mod:`fedprivopt.deploy.cli`: ``fedprivopt deploy local ...``, part of the command line (the
  layer above this package).

The names are imported lazily, so the ServerApp processes (which import
``fedprivopt.deploy.server_app``) do not load the deployment tooling. See ``docs/DEPLOYMENT.md``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["deploy_local"]


def __getattr__(name: str) -> Any:
    if name == "deploy_local":
        from fedprivopt.deploy.local import deploy_local

        return deploy_local
    raise AttributeError(f"module 'fedprivopt.deploy' has no attribute {name!r}")
