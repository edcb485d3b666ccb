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

__all__ = ["MAX_LOCAL_NODES", "MAX_TIMEOUT", "deploy_local"]

# SuperNodes one machine runs for a local deployment: each is a process (~200 MB) with its log
# and pipes; 100,000 ended in EMFILE with a traceback (seventh review of issue 15, F8).
MAX_LOCAL_NODES = 64

MAX_TIMEOUT = 30 * 24 * 3600.0
"""The longest ``--timeout`` of a local deployment (30 days): above it, millisecond waits
overflow (issue 15, N4). Here, not in :mod:`fedprivopt.deploy.local`, so the command line's
help does not import the deployment tooling."""


def __getattr__(name: str) -> Any:
    if name == "deploy_local":
        from fedprivopt.deploy.local import deploy_local

        return deploy_local
    raise AttributeError(f"module 'fedprivopt.deploy' has no attribute {name!r}")
