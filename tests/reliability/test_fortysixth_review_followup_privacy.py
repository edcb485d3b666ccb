"""Issue 15, forty-sixth hostile review, follow-up (privacy: today's api, mechanisms, wire fixes).

1. fedprivopt's ClientApp (node 1 of 3, toy by reference) given a train message for users
   [1, 4] (private or not, seeded or secure) of a task whose ``user_data(4)`` returns one label
   fewer than examples, raises ``KeyError`` of a token of the user's data or calls
   ``sys.exit(len(x))``, whose ``loss`` returns a per-example vector, or an evaluate message of
   a task whose ``evaluate_data`` raises with a value of the data or leaves out ``accuracy``
   (the wire reviewer's open row, /tmp/r46/wire/p3.py). Before: the error reply's reason
   (``TASK_ERROR``) was the error's text, sent to the server outside epsilon: ``...; got a tuple
   of 2 (a torch.float32 tensor of shape (7, 5), ...)`` (user 4's example count),
   ``Keyed.user_data(4) raised KeyError at ...: 'alice@example.com'`` (the token),
   ``it called sys.exit(7)``, ``got a torch.float32 tensor of shape (4,)`` (a minibatch's
   examples). Now (the lead's decision) the reply names the task's member and the
   exception's type, or what fedprivopt's check expected, and says the full message is in the
   node's log (``task_calls.sent_reason``, ``messages.reply_task_error``); the ClientApp logs
   the error whole with its traceback (Flower's logger); in process (the fast engine,
   ``user_examples``) the error is raised whole as before. A ``TaskError`` of one's own given to
   ``reply_task_error`` is sent as the task's error without its text, unless ``reason=`` is
   given.

2. The same ClientApp where the task's ``user_data(4)`` runs out of memory (torch's CPU
   allocator's ``RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate
   960000000 bytes``, or a ``MemoryError`` naming what it held), which ``task_call`` passes on as
   the machine's, not the task's. Before: raised out of the ClientApp whole, so Flower sent its
   text (the bytes: user 4's examples) as the error reply's reason. Now ``client_app._replying``
   logs it and raises ``MemoryError: the node ran out of memory answering a train message
   (RuntimeError); the full message is in the node's log``: a node's failure as before.

3. A ``drive_round`` callback returning a ``dict`` subclass of one's own with the class
   attribute ``sorted_by_user = True`` (the bool, as ``simulation.fast.StreamedUpdates`` sets it)
   holding one workspace reused for every user (api 6's case through the attribute its fix
   accepts; dp-fedavg and ADADP, sigma 1e-6). Before: the streamed path, where one memory is
   not refused: the last user summed once for every user, model 0.45 where that user alone
   moves it 0.05 (a sensitivity of 9C under a charge of C). Now a dict (which holds every value
   at once) never declares a streamed cohort (``AlgorithmAggregation._aggregate_in_round``):
   refused as ``the updates of users 0 and 1 are held in the same memory``; distinct updates
   summed as before.

4. Privacy 1's regression: fedprivopt's own data-free task errors of the ClientApp's trainer
   (a model with no trainable parameter, ``build_model()`` returning one model twice, a loss
   of another model) lost their text in the reply (``the node's task broke its protocol
   (TaskError)``): each is sent whole again (``sent_as`` in ``clients.trainer`` and
   ``clients.model_layout``).

5. api 1's refusals of a replacement ``clip`` through ``privatize_update`` (a ClientApp of
   one's own, docs/FLOWER.md: Flower sends an exception's text as its error reply's reason):
   a clip of each of two layers to C, a clip returning the plain tensor, and an update given as
   an integer tensor. Before: ``clip returned an update of L2 norm 1.41421 above clip_norm 1``
   (the norm of a user's update, not noised), ``got tensor([0.1000, 0.1000, ...])`` and
   ``got tensor([3, 1, 4, ...])`` (the user's values). Now the texts name the rule and the
   type only (``clients.privatize._checked_clip``, ``_refuse_other_tensor``,
   ``privatize_update``); the refusals are as before.

6. ``reply_updates(message, updates, clip_bits={1: private.clipped})`` (a ClientApp of one's
   own sending the exact bit, a bool, where ``TrainMessage.clip_bit`` gives the noised
   report; also a bool tensor or the string 'True'). Before: ``clip_bits[1] must be a real
   number in (-inf, inf), got True``: the exact clip bit reached the server, not noised, as the
   text Flower sends as the error reply's reason. Now ``got a bool`` (``clients.replies.
   _clip_bit``): the type only; real bits sent as before.

No Flower or Ray is started: the ClientApp is called in process, as the wire tests do.
"""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig, privatize_update
from fedprivopt.clients.client_app import clear_cache, make_client_app
from fedprivopt.clients.messages import TASK_ERROR, reply_task_error, reply_updates
from fedprivopt.models import build_task
from fedprivopt.models.task import TaskError
from fedprivopt.models.task_calls import user_examples
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.privacy.clip import ClipResult, clip_l2
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.messages import delivered

TOY = {"num_users": 10, "dim": 5, "num_classes": 3, "seed": 2}
NODE_LOG = "; the full message is in the node's log"

# -- finding 1: an error reply carries nothing computed from a user's data ---------------------


class Leaky(ToyClassificationTask):
    """``user_data(4)``: one label fewer than examples; a token; ``sys.exit(len(x))``."""

    kind = "short"

    def user_data(self, user_id):
        x, y = super().user_data(user_id)
        if user_id != 4:
            return x, y
        if self.kind == "short":
            return x, y[:-1]
        if self.kind == "token":
            return {}["alice@example.com"]
        if self.kind == "exit":
            sys.exit(int(x.shape[0]))
        if self.kind == "oom":
            tried = x.shape[0] * 137_142_857  # as torch says it: a size of the user's data
            raise RuntimeError(f"DefaultCPUAllocator: can't allocate memory: you tried {tried}")
        if self.kind == "memory":
            raise MemoryError(f"holding the {x.shape[0]} rows of alice@example.com")
        return x, y

    def loss(self, model, x, y):
        if self.kind == "vector":  # per-example losses: a shape of the minibatch's examples
            return torch.nn.functional.cross_entropy(model(x), y, reduction="none")
        return super().loss(model, x, y)

    def evaluate_data(self, model, x, y):
        if self.kind == "eval-raise":
            raise ValueError(f"bad row {x[0].tolist()}")
        if self.kind == "eval-keys":
            return {"loss": 0.5, f"rows_{x.shape[0]}": 1.0}
        return super().evaluate_data(model, x, y)


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


def _arrays() -> ArrayRecord:
    state = build_task("toy", **TOY).build_model().state_dict()
    return ArrayRecord({k: Array(v.numpy()) for k, v in state.items()})


def _reply(kind: str, monkeypatch, *, private=True, secure=False, message="train", users=(1, 4)):
    """The ClientApp's reply to ``message`` for ``users``.

    Since the forty-seventh review (egress 5) a train message's user that fails is left out
    alone: the node answers with the error only when none of its users trained, so the error
    cases ask for user 4 alone.
    """
    monkeypatch.setattr(Leaky, "kind", kind)
    users = list(users)
    clear_cache()
    clip = 1.0 if private else None
    local = LocalConfig(learning_rate=0.5, batch_size=4, clip_norm=clip, noise_std=0.0)
    if message == "train":
        settings = P.ClientSettings(local, seed=5, secure=secure)
        config = P.encode_train_config(users=users, round_num=1, settings=settings)
    else:
        config = ConfigRecord({P.USERS: users})
    content = {P.CONFIG_RECORD: config, P.ARRAYS_RECORD: _arrays()}
    try:
        return make_client_app()(delivered(content, message), _context())
    finally:
        clear_cache()


SEEDED, SECURE, NOT_PRIVATE = (True, False), (True, True), (False, False)
CASES = [  # kind, message, (private, secure), the reason's start
    ("short", "train", SEEDED, "Leaky.user_data must return (x, y): two tensors with one row per"),
    ("short", "train", SECURE, "Leaky.user_data must return (x, y): two tensors with one row per"),
    ("short", "train", NOT_PRIVATE, "Leaky.user_data must return (x, y): two tensors with one"),
    ("token", "train", SEEDED, "Leaky.user_data raised KeyError"),
    ("token", "train", NOT_PRIVATE, "Leaky.user_data raised KeyError"),
    ("exit", "train", SECURE, "Leaky.user_data called sys.exit()"),
    ("vector", "train", SEEDED, "Leaky.loss() must return the mean loss of the minibatch, a "),
    ("short", "evaluate", SEEDED, "Leaky.user_data must return (x, y): two tensors with one row"),
    ("eval-raise", "evaluate", SEEDED, "Leaky.evaluate_data raised ValueError"),
    ("eval-keys", "evaluate", SEEDED, "Leaky.evaluate_data(model, x, y) must return a mapping"),
]
FOUND = {  # what each error found, in the node's log only
    "short": "shape (7, 5)",
    "token": "alice@example.com",
    "exit": "sys.exit(7)",
    "vector": "tensor of shape (",
    "eval-raise": "bad row",
    "eval-keys": "rows_",
}


@pytest.mark.parametrize(("kind", "message", "mode", "start"), CASES)
def test_1_an_error_reply_names_the_member_and_type_not_the_users_data(
    kind, message, mode, start, monkeypatch, caplog
):
    private, secure = mode
    caplog.set_level(logging.DEBUG, logger="flwr")  # a SuperNode's level; restored after
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(caplog.handler)
    try:
        reply = _reply(
            kind, monkeypatch, private=private, secure=secure, message=message, users=[4]
        )
    finally:
        flwr_logger.removeHandler(caplog.handler)
    assert reply.has_error() and reply.error.code == TASK_ERROR
    reason = reply.error.reason
    # before: 'shape (7, 5)', 'alice@example.com', 'sys.exit(7)', 'shape (3,)', 'bad row', 'rows_7'
    assert FOUND[kind] not in reason, reason
    assert reason.startswith(start) and reason.endswith(NODE_LOG), reason
    assert "(4)" not in reason and " at " not in reason and "got" not in reason
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert FOUND[kind] in logged  # the node's log holds the error whole
    assert any(r.exc_info for r in caplog.records)  # with its traceback (at DEBUG)


def test_1_in_process_the_error_is_raised_whole(monkeypatch):
    monkeypatch.setattr(Leaky, "kind", "short")
    with pytest.raises(
        TaskError, match=r"got a tuple of 2 \(a torch.float32 tensor of shape \(7, 5"
    ):
        user_examples(Leaky(**TOY), 4)  # the fast engine's own call: the user owns the data


def test_1_a_task_error_of_ones_own_is_sent_without_its_text(server_side):
    message = delivered({}, "train")
    reply = reply_task_error(message, TaskError("user 4: alice@example.com"))
    assert reply.error.reason == "the node's task broke its protocol (TaskError)" + NODE_LOG
    said = reply_task_error(message, TaskError("x"), reason="my task failed")
    assert said.error.reason == "my task failed"
    with pytest.raises(TypeError, match="reason must be a str or None"):
        reply_task_error(message, TaskError("x"), reason=5)


def test_1_legitimate_replies_are_unchanged(monkeypatch):
    reply = _reply("none", monkeypatch)
    assert not reply.has_error()
    assert sorted(reply.content.array_records) == ["update/1", "update/4"]


# -- finding 2: running out of memory is a node's failure that names no size of a user's data ----


@pytest.mark.parametrize(("kind", "found"), [("oom", "959999999"), ("memory", "alice@example.com")])
def test_2_out_of_memory_on_a_users_data_leaves_the_node_without_its_text(
    kind, found, monkeypatch, caplog
):
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(caplog.handler)
    try:
        with pytest.raises(MemoryError) as raised:  # Flower sends its type and text
            _reply(kind, monkeypatch, users=[4])
    finally:
        flwr_logger.removeHandler(caplog.handler)
    said = str(raised.value)  # before: the allocator's bytes (7 rows), the user's token
    assert found not in said and said.endswith(NODE_LOG), said
    assert said.startswith("the node ran out of memory answering a train message")
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert found in "\n".join(r.getMessage() for r in caplog.records)  # the node's log


# -- finding 3: a dict declaring a streamed cohort with the bool True ---------------------------


class _Flagged(dict):
    sorted_by_user = True  # the bool api 6's fix accepts; a dict holds its values at once


def _one_workspace(request):
    work, out, last = torch.zeros(4), _Flagged(), max(request.users)
    for user in sorted(request.users):
        work.fill_(1.0 if user == last else 0.0)
        out[user] = work
    return out


def _own_memory(request):
    last = max(request.users)
    return _Flagged({u: torch.full((4,), 1.0 if u == last else 0.0) for u in request.users})


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp"])
def test_3_a_dict_with_sorted_by_user_true_is_no_streamed_cohort(strategy):
    config = StrategyConfig.from_mapping(
        {"strategy": strategy, "population": 40, "clients-per-round": 10,
         "noise-multiplier": 1e-6, "clip-norm": 1.0, "seed": 0}
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"users \d+ and \d+ are held in the same memory"):
        drive_round(build_algorithm(config, torch.zeros(4)), 1, _one_workspace)  # 0.45 before
    honest = drive_round(build_algorithm(config, torch.zeros(4)), 1, _own_memory)
    assert float(honest.params.max()) < 0.1


# -- finding 4: fedprivopt's own data-free task errors are sent whole ---------------------------


class Frozen(ToyClassificationTask):
    def build_model(self):
        model = super().build_model()
        for p in model.parameters():
            p.requires_grad_(False)
        return model


def frozen(**params):
    return Frozen(**params)


def test_4_a_data_free_task_error_of_the_trainer_is_sent_whole(monkeypatch):
    monkeypatch.setattr(Leaky, "kind", "none")
    context = _context()
    context.run_config[P.RUN_TASK] = f"{__name__}:frozen"
    clear_cache()
    try:
        reply = make_client_app()(delivered(P.users_query(), "query"), context)
    finally:
        clear_cache()
    said = "the model of Frozen.build_model() has no trainable parameter (a torch.nn.Parameter"
    assert reply.has_error() and reply.error.reason.startswith(said), reply.error.reason
    assert reply.error.reason.endswith("there is nothing to train" + NODE_LOG)


# -- finding 5: a refused replacement clip names no value of the user's update ------------------


def _per_layer(delta, clip_norm):
    half = delta.numel() // 2
    parts = [clip_l2(delta[:half], clip_norm).vector, clip_l2(delta[half:], clip_norm).vector]
    return ClipResult(torch.cat(parts), float(delta.norm()), True)


def _plain(delta, clip_norm):
    return clip_l2(delta, clip_norm).vector  # the tensor, not its ClipResult


@pytest.mark.parametrize(
    ("update", "clip", "said", "found"),
    [
        (torch.full((100,), 1.0), _per_layer, "above clip_norm 1", "1.41421"),
        (
            torch.full((100,), 1.0),
            _plain,
            "ClipResult (vector, norm, clipped), got a Tensor",
            "0.1",
        ),
        (torch.tensor([3, 1, 4, 1, 5]), None, "torch.Tensor, got a torch.int64 tensor", "3, 1, 4"),
    ],
)
def test_5_a_refused_clip_or_update_names_no_value_of_the_update(update, clip, said, found):
    with pytest.raises(ValueError) as refused:
        privatize_update(update, clip_norm=1.0, clip=clip)
    assert said in str(refused.value) and found not in str(refused.value), refused.value


# -- finding 6: a refused clip bit names its type, not its value --------------------------------


@pytest.mark.parametrize("bit", [True, torch.tensor(True), "True"])
def test_6_a_refused_clip_bit_names_its_type_not_the_bit(bit, server_side):
    local = LocalConfig(learning_rate=0.1, clip_norm=1.0, clip_bit=True)
    config = P.encode_train_config(users=[1], round_num=1, settings=P.ClientSettings(local, seed=0))
    arrays = ArrayRecord({"w": torch.zeros(3), "b": torch.zeros(2)})
    message = delivered({P.CONFIG_RECORD: config, P.ARRAYS_RECORD: arrays}, "train")
    with pytest.raises(ValueError, match=r"clip_bits\[1\] must be a finite real number") as said:
        reply_updates(message, {1: torch.zeros(5)}, clip_bits={1: bit})
    assert "True" not in str(said.value) and "tensor" not in str(said.value), said.value
    reply = reply_updates(message, {1: torch.zeros(5)}, clip_bits={1: 1.0})
    assert reply.content["update/1"][P.CLIP_BIT_ARRAY].numpy().tolist() == [1.0]
