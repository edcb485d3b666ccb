"""The deployment ClientApp: ``[tool.flwr.app.components] clientapp`` of the Flower app.

It is :data:`fedprivopt.clients.client_app.app` behind a thin adapter for Flower's run config:

- the task parameters arrive flattened (``task-params.<key>``, kebab-case) or as
  ``task-params-json``; the adapter hands the ClientApp the ``task-params`` JSON object it reads
  (:func:`~fedprivopt.deploy.runconfig.task_params_from_flower`, the same rule as the ServerApp);
- the run config's ``device`` becomes the ClientApp's ``client-device``.

Everything else (hosted users from the node config ``partition-id``/``num-partitions``, local
training, clipping, noise shares) is the ClientApp's own behaviour.
"""

from __future__ import annotations

import json

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedprivopt import wire as P
from fedprivopt.clients.client_app import app as _plain_app
from fedprivopt.deploy.runconfig import task_params_from_flower

__all__ = ["app", "client_context"]


def client_context(context: Context) -> Context:
    """A copy of ``context`` whose run config is what the fedprivopt ClientApp reads."""
    run_config = dict(context.run_config)
    params = task_params_from_flower(run_config)
    for key in [k for k in run_config if k.startswith("task-params.")]:
        del run_config[key]
    run_config[P.RUN_TASK_PARAMS] = json.dumps(params, sort_keys=True)
    if "device" in run_config and P.RUN_CLIENT_DEVICE not in run_config:
        run_config[P.RUN_CLIENT_DEVICE] = run_config["device"]
    return Context(
        run_id=context.run_id,
        node_id=context.node_id,
        node_config=context.node_config,
        state=context.state,
        run_config=run_config,
        series_id=getattr(context, "series_id", 0),
    )


def _handle(message: Message, context: Context) -> Message:
    return _plain_app(message, client_context(context))


def _make_app() -> ClientApp:
    client_app = ClientApp()
    client_app.query()(_handle)
    client_app.train()(_handle)
    client_app.evaluate()(_handle)
    return client_app


app = _make_app()
