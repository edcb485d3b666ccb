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
2. ``clients.reply_updates(message, updates, clip_bits={1: 1.0})`` (a ClientApp of one's own
   that computes each user's clip bit itself) for a train message that does not ask for clip
   bits (no ``clip-bit``: a round without adaptive clipping; server or distributed noise).
   Before: the user's exact bit ``[norm <= C]`` was sent beside the update (the server ignores
   it, but it left the node: in distributed mode an honest-but-curious server saw one bit of
   each user's data a round, unnoised and outside epsilon), where an update of a user the
   message does not ask for is refused (forty-first review, wire 1). Now ``ValueError:
   clip_bits[1]: the message does not ask for clip bits ...`` (``clients.replies.reply_updates``);
   bits a message asks for are sent as before, and a private round asking for private metrics
   is refused first, as before.
3. ``clients.reply_updates(message, updates, num_examples=..., losses=...)`` (a ClientApp of one's
   own) for a non-private round asking for the users' example counts and losses
   (``report-private-metrics``): one count for two users, a loss for every batch (3 for 2
   users), a count of -3 or 27.5, a loss ``"a"``, one number, a tensor; NumPy integers, a loss
   ``1`` beside ``0.9``. Before: lists of another length were sent (misaligned with the users,
   for a ServerApp reading them), -3 sent, and the rest ended in Flower's ``TypeError`` ("Not all
   values are of valid type", "All values in a list must be of the same valid type"),
   ``TypeError: 'int' object is not iterable`` or torch's ``RuntimeError``, naming no parameter.
   Now ``ValueError`` naming ``num_examples`` or ``losses`` (``replies._per_user``); NumPy
   values and an integer loss are sent as numbers, a NaN loss (a diverged user) as before.
4. ``wire.decode_train_config`` (every ClientApp's reader of a train config) with ``seed`` -1 or
   ``-(2**63)`` (a ServerApp of one's own). Before: taken by the key's own check (from
   ``-(2**63)``) and refused by ``ClientSettings`` as ``seed must be an integer in [0, ...]``, the
   one train config key whose error did not say it is one. Now ``train config 'seed' must be an
   integer in [0, 9223372036854775807]``; ``MAX_SEED`` read as before.
5. fedprivopt's ClientApp given a train or evaluate message whose model is not its task's (the
   toy model's tensors as a compiled model names them, ``_orig_mod.weight``: a ServerApp of
   one's own), and ``DPStrategy`` with that model on a grid of three such nodes (in process).
   Before: ``state_to_flat``'s ``ValueError`` was each node's failure (Flower's
   ``CLIENT_APP_RAISED_EXCEPTION``), counted as ``failed``, and the run released noise-only
   rounds, charged, to its end (3 rounds, epsilon 8.94, ``stopped_reason`` "rounds": rc 0). Now
   the node answers with the task's error (``client_app._task_model``, code ``TASK_ERROR``:
   "the message's model is not the model of the node's task (ToyClassificationTask): ...
   unexpected keys ['_orig_mod.weight', '_orig_mod.bias']"), so the server ends the run in
   round 1 before it is released (epsilon 0), as it does when every node asked says so.
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Context, RecordDict

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig, TrainMessage
from fedprivopt.clients.client_app import app
from fedprivopt.clients.messages import TASK_ERROR, reply_updates
from fedprivopt.clients.privatize import NoisedShare
from fedprivopt.models import build_task
from fedprivopt.models.task import TaskError
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy, arrays_to_flat
from tests.messages import delivered, reply_metadata

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


# -- finding 2: a clip bit leaves the node only where the message asks for one -------------------


def _toy_message(settings: P.ClientSettings) -> object:
    state = build_task("toy", **TOY).build_model().state_dict()
    return delivered(
        {
            P.CONFIG_RECORD: P.encode_train_config(users=[1], round_num=1, settings=settings),
            P.ARRAYS_RECORD: ArrayRecord({k: Array(v.numpy()) for k, v in state.items()}),
        },
        "train",
    )


@pytest.mark.parametrize("noise_std", [0.0, 0.2], ids=["server", "distributed"])
def test_2_a_clip_bit_the_message_does_not_ask_for_is_refused(noise_std):
    local = LocalConfig(learning_rate=0.5, clip_norm=1.0, noise_std=noise_std)
    message = _toy_message(P.ClientSettings(local, seed=5))  # no adaptive clipping
    # privatized: in distributed mode a hand-made update is refused (forty-seventh review
    # follow-up, privacy 3)
    update = {1: TrainMessage.read(message).privatize(torch.full((18,), 0.01), 1).vector}
    with pytest.raises(ValueError, match=r"^clip_bits\[1\]: the message does not ask for clip"):
        reply_updates(message, update, clip_bits={1: 1.0})  # before: the exact bit was sent
    assert P.CLIP_BIT_ARRAY not in reply_updates(message, update).content["update/1"]


def test_2_clip_bits_asked_for_are_sent_as_before():
    local = LocalConfig(learning_rate=0.5, clip_norm=1.0, clip_bit=True, count_noise_std=0.3)
    message = _toy_message(P.ClientSettings(local, seed=5))
    reply = reply_updates(
        message, {1: torch.full((18,), 0.01)}, clip_bits={1: NoisedShare(0.7, 0.3)}
    )
    assert reply.content["update/1"][P.CLIP_BIT_ARRAY].numpy().tolist() == [0.7]
    asked = app(message, _node()).content["update/1"]  # fedprivopt's ClientApp: one share
    assert asked[P.CLIP_BIT_ARRAY].numpy().shape == (1,)


# -- finding 3: the example counts and losses of a non-private round are checked ----------------

PER_USER = {
    "one count for two users": ({"num_examples": [27]}, "num_examples must hold one value"),
    "a loss a batch": ({"losses": [0.9, 1.3, 0.7]}, "losses must hold one value"),
    "negative count": ({"num_examples": [-3, 7]}, r"num_examples\[0\] must be an integer >= 0"),
    "a count of 27.5": ({"num_examples": [27.5, 7]}, r"num_examples\[0\] must be an integer"),
    "a string loss": ({"losses": ["a", 1.3]}, r"losses\[0\] must be a real number"),
    "one number": ({"num_examples": 5}, "num_examples must be a list"),
    "a tensor": ({"losses": torch.tensor([0.9, 1.3])}, "losses must be a list"),
}


def _baseline_message() -> object:
    """A train message of a non-private round asking for the users' counts and losses."""
    settings = P.ClientSettings(LocalConfig(learning_rate=0.5), seed=5, report_private_metrics=True)
    state = build_task("toy", **TOY).build_model().state_dict()
    return delivered(
        {
            P.CONFIG_RECORD: P.encode_train_config(users=[1, 4], round_num=1, settings=settings),
            P.ARRAYS_RECORD: ArrayRecord({k: Array(v.numpy()) for k, v in state.items()}),
        },
        "train",
    )


UPDATES = {1: torch.zeros(18), 4: torch.zeros(18)}


@pytest.mark.parametrize("case", sorted(PER_USER))
def test_3_counts_and_losses_not_one_a_user_are_refused(case):
    given, said = PER_USER[case]
    values = {"num_examples": [27, 7], "losses": [0.9, 1.3], **given}
    with pytest.raises(ValueError, match=f"^{said}"):  # before: sent, or Flower's TypeError
        reply_updates(_baseline_message(), UPDATES, **values)


def test_3_numpy_values_and_a_diverged_loss_are_sent_as_numbers():
    counts = [np.int64(27), np.int64(7)]  # before: Flower's TypeError naming nothing
    reply = reply_updates(_baseline_message(), UPDATES, num_examples=counts, losses=[1, np.nan])
    metrics = reply.content[P.TRAIN_METRICS]
    assert metrics[P.NUM_EXAMPLES] == [27, 7]
    assert metrics[P.TRAIN_LOSS][0] == 1.0 and np.isnan(metrics[P.TRAIN_LOSS][1])
    sent = app(_baseline_message(), _node()).content[P.TRAIN_METRICS]  # fedprivopt's own app
    assert len(sent[P.NUM_EXAMPLES]) == len(sent[P.TRAIN_LOSS]) == 2


# -- finding 4: a train config's seed out of range is named as its key ---------------------------


@pytest.mark.parametrize("seed", [-1, -(2**63)])
def test_4_a_negative_seed_names_the_train_config_key(seed):
    config = dict(P.encode_train_config(users=[1], round_num=1, settings=SETTINGS))
    config[P.SEED] = seed
    with pytest.raises(ValueError, match=r"^train config 'seed' must be an integer in \[0, 9223"):
        P.decode_train_config(config)  # before: "seed must be ...", naming no key of the config
    config[P.SEED] = P.MAX_SEED
    assert P.decode_train_config(config).settings.seed == P.MAX_SEED


# -- finding 5: a model that is not the task's is the task's error, which ends the run -----------


def _renamed_arrays() -> ArrayRecord:
    """The toy model as a compiled model's state dict names it (``_orig_mod.weight``)."""
    state = build_task("toy", **TOY).build_model().state_dict()
    return ArrayRecord({f"_orig_mod.{k}": Array(v.numpy()) for k, v in state.items()})


@pytest.mark.parametrize("kind", ["train", "evaluate"])
def test_5_the_client_app_answers_another_model_with_the_tasks_error(kind):
    content = {P.ARRAYS_RECORD: _renamed_arrays()}
    if kind == "train":
        content[P.CONFIG_RECORD] = P.encode_train_config(users=[1], round_num=1, settings=SETTINGS)
    reply = app(delivered(content, kind), _node())  # before: ValueError, a node's failure
    assert reply.has_error() and reply.error.code == TASK_ERROR
    assert reply.error.reason.startswith("the message's model is not the model of the node's task")
    assert "unexpected keys ['_orig_mod.weight', '_orig_mod.bias']" in reply.error.reason


class _AppGrid:
    """Three nodes running fedprivopt's ClientApp in process (no Flower engine)."""

    def get_node_ids(self):
        return [100, 101, 102]

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # as a grid pushes it
            node = msg.metadata.dst_node_id
            context = _node()
            context.node_config[P.NODE_PARTITION_ID] = node - 100
            reply = app(msg, context)
            reply.__dict__["_metadata"] = reply_metadata(msg, node)
            replies.append(reply)
        return replies


def test_5_a_server_sending_another_model_ends_before_a_round_is_released(server_side):
    config = StrategyConfig.from_mapping(
        {"population": 10, "clients-per-round": 5, "noise-multiplier": 0.8, "clip-norm": 0.5}
    )
    arrays = _renamed_arrays()
    flat, spec = arrays_to_flat(arrays)
    strategy = DPStrategy(build_algorithm(config, flat), spec, node_wait=0.0)
    with pytest.raises(TaskError, match=r"is not the model of the node's task .* asked in round 1"):
        strategy.start(_AppGrid(), arrays, num_rounds=3, timeout=10)  # before: 3 rounds, rc 0
    assert strategy.algorithm.round_num == 0 and strategy.algorithm.epsilon() == 0.0
