"""Fault injection (tests only): a ClientApp whose users misbehave, to test that the server copes.

:func:`make_faulty_client_app` wraps the real ClientApp; after it trains, the replies of chosen
users are corrupted (or the node raises). Use it in simulations to check that a round still
completes, that malformed updates are rejected and counted, that an oversized update is
re-clipped, that a node slower than the round timeout only loses its users' updates, and that
accounting does not change (what is accounted is the sampling, not the arrival). A deployment
runs it through a Flower app of its own, whose ``clientapp`` component wraps the deployment
ClientApp (:func:`tests.deploy.faulty_app.faulty_app_dir`).

No module of ``fedprivopt`` imports this one (``tests/test_layers.py`` checks): the production
ClientApp and run config know nothing of faults (issue 16).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from fedprivopt import wire as P
from fedprivopt.clients.client_app import make_client_app

__all__ = ["FAULTS", "make_faulty_client_app", "parse_fault_users"]

FAULTS = {
    "raise": "the node raises while training (Flower returns an error reply)",
    "nan": "the update contains NaN",
    "inf": "the update contains +Inf",
    "shape": "the update has one entry too many",
    "dtype": "the update is float64",
    "missing": "the update record has no 'delta' array",
    "huge": "the update has norm 1e6 (far above the clip norm)",
    "foreign": "the node also sends an update for a user it was not asked to train",
    "drop": "the node leaves the user's update out of its reply (the user dropped out)",
    "slow": "the node sleeps sleep_seconds before replying (set it above the round timeout: the "
    "reply arrives too late and is ignored)",
    "bad-bit": "the update's clip bit is 2 (adaptive clipping: only 0 or 1 are valid)",
    "no-bit": "the update has no clip bit (adaptive clipping)",
}


def _corrupt(reply: Message, user: int, fault: str) -> None:
    key = P.update_key(user)
    record = reply.content.array_records.get(key)
    if record is None:
        return
    delta = record[P.DELTA_ARRAY].numpy().astype(np.float32)
    if fault == "nan":
        delta[0] = np.nan
    elif fault == "inf":
        delta[-1] = np.inf
    elif fault == "shape":
        delta = np.concatenate([delta, np.zeros(1, np.float32)])
    elif fault == "dtype":
        delta = delta.astype(np.float64)
    elif fault == "huge":
        delta = np.full_like(delta, 1e6 / np.sqrt(delta.size))
    elif fault == "missing":
        reply.content[key] = ArrayRecord({"something-else": Array(delta)})
        return
    elif fault == "foreign":
        reply.content[P.update_key(10**9 + user)] = ArrayRecord({P.DELTA_ARRAY: Array(delta)})
        return
    elif fault == "drop":
        del reply.content[key]
        return
    elif fault == "slow":
        return  # the delay is applied once per message, in _train
    elif fault == "bad-bit":
        bit = Array(np.array([2.0]))
        reply.content[key] = ArrayRecord({P.DELTA_ARRAY: Array(delta), P.CLIP_BIT_ARRAY: bit})
        return
    reply.content[key] = ArrayRecord({P.DELTA_ARRAY: Array(delta)})


def _train(
    message: Message,
    context: Context,
    real: ClientApp,
    faults: dict[int, str],
    sleep_seconds: float,
) -> Message:
    config = message.content.config_records[P.CONFIG_RECORD]
    users = [int(u) for u in config[P.USERS]]
    if any(faults.get(u) == "raise" for u in users):
        raise RuntimeError(f"injected fault: node hosting users {users} crashed")
    if any(faults.get(u) == "slow" for u in users):
        time.sleep(sleep_seconds)
    reply = real(message, context)
    for user in users:
        if user in faults:
            _corrupt(reply, user, faults[user])
    return reply


def _forward(message: Message, context: Context, real: ClientApp) -> Message:
    return real(message, context)


def make_faulty_client_app(
    faults: Mapping[int, str],
    *,
    app: ClientApp | None = None,
    task: str | None = None,
    task_params: str | Mapping[str, object] | None = None,
    sleep_seconds: float = 10.0,
) -> ClientApp:
    """A ClientApp that behaves like ``app`` except for the faulty users.

    Parameters
    ----------
    faults : Mapping[int, str]
        User id → fault name (see :data:`FAULTS`).
    app : ClientApp, optional
        The ClientApp to wrap (e.g. the deployment's,
        :data:`fedprivopt.clients.client_app.app`); default: :func:`make_client_app` with
        ``task`` and ``task_params``.
    task, task_params
        As for :func:`~fedprivopt.clients.client_app.make_client_app`, without ``app``.
    sleep_seconds : float
        How long a node hosting a ``slow`` user sleeps before replying (``>= 0``); make it longer
        than the strategy's round timeout (``DPStrategy.start(..., timeout=...)``).
    """
    unknown = {f for f in faults.values() if f not in FAULTS}
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    if not (float(sleep_seconds) >= 0):
        raise ValueError(f"sleep_seconds must be a number >= 0, got {sleep_seconds!r}")
    real = app if app is not None else make_client_app(task=task, task_params=task_params)
    faulty = ClientApp()
    table = {int(u): str(f) for u, f in faults.items()}
    faulty.query()(functools.partial(_forward, real=real))
    faulty.evaluate()(functools.partial(_forward, real=real))
    faulty.train()(
        functools.partial(_train, real=real, faults=table, sleep_seconds=float(sleep_seconds))
    )
    return faulty


def parse_fault_users(text: str) -> dict[int, str]:
    """Parse ``"user:fault,user:fault"`` (see :data:`FAULTS`); errors name ``fault-users``."""
    faults: dict[int, str] = {}
    for item in str(text).replace(" ", ",").split(","):
        if not item:
            continue
        user, sep, fault = item.partition(":")
        try:
            uid = int(user)
        except ValueError:
            uid = -1
        if not sep or uid < 0 or fault not in FAULTS:
            raise ValueError(
                f"fault-users must be 'user:fault,...' with a user id >= 0 and a fault in "
                f"{', '.join(FAULTS)}; got {item!r}"
            )
        faults[uid] = fault
    return faults
