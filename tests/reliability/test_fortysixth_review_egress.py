"""Issue 15, forty-sixth hostile review, egress (what leaves a node outside the guarantee).

1. fedprivopt's ClientApp (node 1 of 3, toy by reference) given a train message for users
   [1, 4] of a task whose ``loss`` changes in place a tensor its backward needs
   (``h = torch.sigmoid(model(x)); h.add_(1.0)``), or registers a gradient hook that raises
   naming the minibatch's rows. Autograd's error is raised at the trainer's gradient, outside
   ``task_call``. Before: raised out of the ClientApp whole (``RuntimeError: one of the
   variables needed for gradient computation has been modified by an inplace operation:
   [torch.FloatTensor [27, 3]] ...``), which Flower sends to the server as the error reply's
   reason: user 1's example count (27), outside epsilon. Now the task's error
   (``LocalTrainer.train`` runs the gradient in ``task_call``): the reply says ``the gradient
   of Leaky.loss raised RuntimeError; the full message is in the node's log``, the node logs
   the whole text; in process ``LocalTrainer.train`` raises that ``TaskError`` whole.

No Flower or Ray is started: the ClientApp is called in process, as the wire tests do.
"""

from __future__ import annotations

import json

import pytest
import torch
from flwr.app import Array, ArrayRecord, Context, RecordDict

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig, LocalTrainer
from fedprivopt.clients.client_app import clear_cache, make_client_app
from fedprivopt.clients.messages import TASK_ERROR
from fedprivopt.models import build_task
from fedprivopt.models.task import TaskError
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.privacy.rng import RngFactory
from tests.messages import delivered

TOY = {"num_users": 10, "dim": 5, "num_classes": 3, "seed": 2}


class Leaky(ToyClassificationTask):
    """A loss whose backward raises with a size of the user's minibatch in the text."""

    kind = "inplace"

    def loss(self, model, x, y):
        if self.kind == "inplace":
            h = torch.sigmoid(model(x))
            h.add_(1.0)  # the backward of sigmoid needs h as it was
            return torch.nn.functional.cross_entropy(h, y)
        out = model(x)
        rows = int(x.shape[0])

        def hook(grad):
            raise ValueError(f"bad gradient for the {rows} rows")

        out.register_hook(hook)
        return torch.nn.functional.cross_entropy(out, y)


def leaky(**params):
    return Leaky(**params)


def _context() -> Context:
    run_config = {
        P.RUN_TASK: f"{__name__}:leaky",
        P.RUN_TASK_PARAMS_JSON: json.dumps(TOY),
        P.RUN_DEVICE: "cpu",
    }
    node = {P.NODE_PARTITION_ID: 1, P.NODE_NUM_PARTITIONS: 3}
    return Context(
        run_id=1, node_id=11, node_config=node, state=RecordDict(), run_config=run_config
    )


def _local() -> LocalConfig:
    return LocalConfig(learning_rate=0.5, batch_size=64, clip_norm=1.0, noise_std=0.0)


@pytest.mark.parametrize(("kind", "error"), [("inplace", "RuntimeError"), ("hook", "ValueError")])
def test_1_an_error_of_the_losss_gradient_is_sent_without_its_text(kind, error, monkeypatch):
    monkeypatch.setattr(Leaky, "kind", kind)
    rows = int(leaky(**TOY).user_data(1)[0].shape[0])
    settings = P.ClientSettings(_local(), seed=5, secure=False)
    config = P.encode_train_config(users=[1, 4], round_num=1, settings=settings)
    state = build_task("toy", **TOY).build_model().state_dict()
    arrays = ArrayRecord({k: Array(v.numpy()) for k, v in state.items()})
    clear_cache()
    try:
        reply = make_client_app()(
            delivered({P.CONFIG_RECORD: config, P.ARRAYS_RECORD: arrays}, "train"), _context()
        )
    finally:
        clear_cache()
    assert reply.has_error() and reply.error.code == TASK_ERROR
    reason = reply.error.reason
    assert reason.startswith(f"the gradient of Leaky.loss raised {error}"), reason
    assert str(rows) not in reason and "rows" not in reason


def test_1_in_process_the_trainer_raises_the_tasks_error_whole(monkeypatch):
    monkeypatch.setattr(Leaky, "kind", "inplace")
    task = leaky(**TOY)
    trainer = LocalTrainer(task, device="cpu")
    rows = int(task.user_data(1)[0].shape[0])
    flat = torch.cat([v.reshape(-1) for v in task.build_model().state_dict().values()])
    with pytest.raises(
        TaskError, match=rf"gradient of Leaky\.loss\(\) raised RuntimeError.*\[{rows}, 3\]"
    ):
        trainer.train(flat, user_id=1, round_num=1, config=_local(), rngs=RngFactory(seed=5))
