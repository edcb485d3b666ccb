"""The user's own ClientApp: their training loop, then fedprivopt's clip and noise-share step.

fedprivopt's server samples *users*, not nodes. It first asks every node which users it hosts
(``query``), then sends each node the sampled users it hosts (``train``). For each user this app
loads the global model, runs its own training loop (:func:`flower_app.task.train`), and passes
the update ``Δ = w_local − w_global`` through :meth:`~fedprivopt.clients.TrainMessage.privatize`:
``fedprivopt.clients.privatize_update`` with the clip norm, noise share and generator the server
put in the message (keys listed in ``docs/FLOWER.md``). Only the privatized updates go back.
"""

from __future__ import annotations

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedprivopt.clients import (
    TrainMessage,
    hosted_users,
    reply_task_error,
    reply_updates,
    reply_users,
)
from fedprivopt.models.task import TaskError
from fedprivopt.privacy import derive_seed
from flower_app.config import data_seed, population
from flower_app.task import build_model, load_user, train

app = ClientApp()


def _population(context: Context) -> int:
    return population(context.run_config)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which users this node hosts (from partition-id / num-partitions)."""
    return reply_users(msg, hosted_users(context, _population(context)))


@app.train()
def train_users(msg: Message, context: Context) -> Message:
    """Train every requested user this node hosts and send back their privatized updates."""
    request = TrainMessage.read(msg)
    if request.preconditioner is not None:
        # the task's error (not a node's failure): the server ends the run rather than release
        # a round that trained nobody (this app's ServerApp refuses such strategies at start)
        # reason= sends this line, which holds nothing of a user's data (by default the reply
        # names no more than the error's type: a task's error text may hold a user's values)
        said = (
            "this example's training loop does not precondition gradients; use dp-fedavg, "
            "dp-fedadam, dp-fedadam-bc or dp-fedavg-adadp (not adadps or dp2)"
        )
        return reply_task_error(msg, TaskError(said), reason=said)
    data = data_seed(context.run_config)
    hosted = set(hosted_users(context, _population(context)))
    model = build_model(0)
    updates, clip_bits, rejected = {}, {}, 0
    for user in request.users:
        if user not in hosted:
            rejected += 1
            continue
        x, y = load_user(user, seed=data)
        # the user's own choices: a shuffle generator and the examples used this round
        seed = derive_seed(request.seed, request.round_num, "shuffle", request.stream, user)
        shuffle = torch.Generator().manual_seed(seed)
        if request.local.max_examples is not None:
            keep = torch.randperm(len(y), generator=shuffle)[: request.local.max_examples]
            x, y = x[keep], y[keep]
        model.load_state_dict(request.state)
        train(
            model,
            x,
            y,
            learning_rate=request.local.learning_rate,
            epochs=request.local.epochs,
            batch_size=request.local.batch_size,
            generator=shuffle,
        )
        delta = request.flatten(model.state_dict()) - request.global_flat
        private = request.privatize(delta, user)  # clip to C, add the noise share (if any)
        updates[user] = private.vector
        bit = request.clip_bit(private, user)  # adaptive clipping only
        if bit is not None:
            clip_bits[user] = bit
    return reply_updates(msg, updates, rejected=rejected, clip_bits=clip_bits)
