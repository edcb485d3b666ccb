"""fedprivopt.clients.messages: a ClientApp of one's own speaks fedprivopt's protocol (issue 18)."""

import json

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict

from fedprivopt import wire as P
from fedprivopt.clients import (
    LocalConfig,
    LocalTrainer,
    TrainMessage,
    hosted_users,
    reply_updates,
    reply_users,
)
from fedprivopt.clients.client_app import app as fedprivopt_app
from fedprivopt.models import build_task, initial_flat
from fedprivopt.privacy import RngFactory
from tests.messages import delivered

PARAMS = {"num_users": 10, "dim": 5, "num_classes": 3, "seed": 2}
RUN_CONFIG = {P.RUN_TASK: "toy", P.RUN_TASK_PARAMS_JSON: json.dumps(PARAMS), P.RUN_DEVICE: "cpu"}


def _context(partition=1, partitions=3):
    node_config = {P.NODE_PARTITION_ID: partition, P.NODE_NUM_PARTITIONS: partitions}
    return Context(
        run_id=1, node_id=11, node_config=node_config, state=RecordDict(), run_config=RUN_CONFIG
    )


def _message(task, users, local, *, round_num=2, stream="train", precond=None, **settings):
    settings = P.ClientSettings(local=local, seed=5, **settings)
    config = P.encode_train_config(
        users=users, round_num=round_num, settings=settings, stream=stream
    )
    content = {
        P.ARRAYS_RECORD: ArrayRecord(task.build_model().state_dict()),
        P.CONFIG_RECORD: config,
    }
    if precond is not None:
        content[P.PRECONDITIONER_RECORD] = ArrayRecord({P.PRECONDITIONER_ARRAY: Array(precond)})
    return delivered(content, "train")


def test_train_message_reads_every_key_the_server_sends():
    task = build_task("toy", **PARAMS)
    local = LocalConfig(
        learning_rate=0.3, epochs=2, batch_size=4, max_examples=7, clip_norm=0.5, noise_std=0.02
    )
    precond = np.full(18, 2.0, dtype=np.float32)
    msg = _message(task, [4, 1], local, round_num=6, stream="adadp-half", precond=precond)
    request = TrainMessage.read(msg)
    assert request.users == (4, 1) and request.round_num == 6 and request.stream == "adadp-half"
    assert request.local == local
    assert (request.seed, request.secure, request.report_private_metrics) == (5, False, False)
    assert torch.equal(request.preconditioner, torch.from_numpy(precond))
    assert torch.equal(request.global_flat, initial_flat(task))
    model = task.build_model()
    assert torch.equal(request.flatten(model.state_dict()), initial_flat(task))


def test_a_message_without_its_records_is_refused():
    with pytest.raises(ValueError, match=P.CONFIG_RECORD):
        TrainMessage.read(delivered({}, "train"))
    local = P.encode_train_config(
        users=[1], round_num=1, settings=P.ClientSettings(LocalConfig(learning_rate=0.1), seed=0)
    )
    with pytest.raises(ValueError, match=P.ARRAYS_RECORD):
        TrainMessage.read(delivered({P.CONFIG_RECORD: local}, "train"))


def _own_train(message, context):
    """A user's ClientApp body: its own training (here LocalTrainer without clip or noise), then
    the public privacy step and the reply helpers."""
    task = build_task("toy", **PARAMS)
    request = TrainMessage.read(message)
    hosted = set(hosted_users(context, task.num_users))
    trainer = LocalTrainer(task, device="cpu")
    plain = LocalConfig(
        learning_rate=request.local.learning_rate,
        epochs=request.local.epochs,
        batch_size=request.local.batch_size,
    )
    updates, bits = {}, {}
    for user in request.users:
        if user not in hosted:
            continue
        raw = trainer.train(
            request.global_flat,
            user_id=user,
            round_num=request.round_num,
            config=plain,
            rngs=RngFactory(seed=request.seed),
            stream=request.stream,
        ).delta
        private = request.privatize(raw, user)
        updates[user] = private.vector
        bit = request.clip_bit(private, user)
        if bit is not None:
            bits[user] = bit
    rejected = sum(u not in hosted for u in request.users)
    return reply_updates(message, updates, rejected=rejected, clip_bits=bits)


@pytest.mark.parametrize("adaptive", [False, True])
def test_own_client_app_replies_as_fedprivopts_own(adaptive):
    """Same local model in, the same bytes out: updates, noise shares, clip bits, counts."""
    task = build_task("toy", **PARAMS)
    local = LocalConfig(
        learning_rate=0.5,
        epochs=2,
        batch_size=4,
        clip_norm=0.1,
        noise_std=0.01,
        clip_bit=adaptive,
        count_noise_std=0.3 if adaptive else 0.0,
    )
    msg = _message(task, [4, 1, 2], local, round_num=3)
    ours = _own_train(msg, _context()).content
    theirs = fedprivopt_app(msg, _context()).content
    assert set(ours.array_records) == set(theirs.array_records) == {"update/4", "update/1"}
    for key, record in theirs.array_records.items():
        assert list(ours[key]) == list(record)
        for name in record:
            np.testing.assert_array_equal(ours[key][name].numpy(), record[name].numpy())
    assert dict(ours[P.TRAIN_METRICS]) == dict(theirs[P.TRAIN_METRICS])
    assert dict(ours[P.TRAIN_METRICS]) == {P.USERS_TRAINED: 2, P.USERS_REJECTED: 1}
    assert not ours.config_records


def test_private_metrics_are_sent_only_when_the_server_asks():
    task = build_task("toy", **PARAMS)
    local = LocalConfig(learning_rate=0.1)
    update = {1: torch.zeros(18)}
    asked = _message(task, [1], local, report_private_metrics=True)
    reply = reply_updates(asked, update, num_examples=[7], losses=[0.5])
    assert reply.content[P.TRAIN_METRICS][P.NUM_EXAMPLES] == [7]
    reply = reply_updates(_message(task, [1], local), update, num_examples=[7], losses=[0.5])
    assert set(reply.content[P.TRAIN_METRICS]) == {P.USERS_TRAINED, P.USERS_REJECTED}


def test_updates_go_back_as_float32_cpu_arrays():
    task = build_task("toy", **PARAMS)
    msg = _message(task, [1], LocalConfig(learning_rate=0.1))
    reply = reply_updates(msg, {1: torch.ones(18, dtype=torch.float64)})
    assert P.read_updates(reply.content)[1].dtype == np.float32


def test_users_query_and_hosted_users():
    reply = reply_users(delivered(P.users_query(), "query"), hosted_users(_context(1, 3), 10))
    assert P.read_user_ids(reply.content) == [1, 4, 7]
    with pytest.raises(ValueError, match="unknown query"):
        reply_users(delivered({P.QUERY_RECORD: ConfigRecord({P.OP: "x"})}, "query"), [1])
    bare = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(ValueError, match=P.NODE_PARTITION_ID):
        hosted_users(bare, 10)
