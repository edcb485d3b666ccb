"""Issue 15, forty-fourth hostile review (wire: Flower messages, replies, the ClientApp): tests.

1. fedprivopt's ClientApp (node 1 of 3, toy) given a train message whose model lists its tensors
   in another order than the task's model (``bias`` before ``weight``: a ServerApp of one's own
   whose state dict was read from a file that sorts its keys, as safetensors does), with or
   without a preconditioner (in the server's layout, as the protocol says). Before: the model
   was read by name, but every update was sent in the node's own layout and the preconditioner
   applied in it, where the protocol (docs/FLOWER.md, ``TrainMessage.flatten``) says the server
   reads both in its key order: the server added ``weight``'s update to ``bias`` (``fedavg``
   with ``DPStrategy``, 2 rounds, toy: a model 0.34 away from the same run in the task's order)
   and DP2's or AdaDPS' step sizes of one tensor were used for another. Now the node reads the
   preconditioner in the server's layout and sends each update in it (``client_app._train``,
   with ``_reordered``); a message in the task's order is answered bit for bit as before.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Context, RecordDict

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig
from fedprivopt.clients.client_app import app
from fedprivopt.models import build_task
from tests.messages import delivered

TOY = {"num_users": 10, "dim": 5, "num_classes": 3, "seed": 2}
SETTINGS = P.ClientSettings(LocalConfig(learning_rate=0.5, clip_norm=1.0, noise_std=0.2), seed=5)


def _node() -> Context:
    """Node 1 of 3 of the toy task (users 1, 4, 7), as fedprivopt's ClientApp reads it."""
    run_config = {P.RUN_TASK: "toy", P.RUN_TASK_PARAMS_JSON: json.dumps(TOY), P.RUN_DEVICE: "cpu"}
    nodes = {P.NODE_PARTITION_ID: 1, P.NODE_NUM_PARTITIONS: 3}
    return Context(
        run_id=1, node_id=11, node_config=nodes, state=RecordDict(), run_config=run_config
    )


# -- finding 1: updates (and the preconditioner) in the server's layout --------------------------

SIZES = {"weight": 15, "bias": 3}  # the toy model of TOY: weight (3, 5), bias (3,)


def _train_reply(order: tuple[str, ...], step: dict[str, float] | None = None) -> dict:
    """Users 1 and 4's updates, each split by tensor, for a model sent in ``order``."""
    state = build_task("toy", **TOY).build_model().state_dict()
    content = {
        P.CONFIG_RECORD: P.encode_train_config(users=[1, 4], round_num=1, settings=SETTINGS),
        P.ARRAYS_RECORD: ArrayRecord({name: Array(state[name].numpy()) for name in order}),
    }
    if step is not None:  # the preconditioner, in the server's layout
        p = np.concatenate([np.full(SIZES[name], step[name], np.float32) for name in order])
        content[P.PRECONDITIONER_RECORD] = ArrayRecord({P.PRECONDITIONER_ARRAY: Array(p)})
    reply = app(delivered(content, "train"), _node())
    out = {}
    for user, delta in P.read_updates(reply.content).items():
        pieces = torch.split(torch.from_numpy(delta), [SIZES[name] for name in order])
        out[user] = dict(zip(order, pieces, strict=True))
    return out


@pytest.mark.parametrize("step", [None, {"weight": 1.0, "bias": 50.0}], ids=["plain", "precond"])
def test_1_updates_are_sent_in_the_layout_of_the_servers_model(step):
    ours = _train_reply(("weight", "bias"), step)
    theirs = _train_reply(("bias", "weight"), step)  # before: weight's entries read as bias's
    assert sorted(theirs) == sorted(ours) == [1, 4]
    for user in ours:
        for name in SIZES:
            assert torch.equal(theirs[user][name], ours[user][name]), (user, name)
