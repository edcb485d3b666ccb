import json
import pickle

import numpy as np
import pytest
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    RecordDict,
)

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig, LocalTrainer
from fedprivopt.clients.client_app import app, clear_cache, get_task_and_trainer, make_client_app
from fedprivopt.models import build_task, initial_flat
from fedprivopt.privacy import RngFactory
from tests.messages import delivered

PARAMS = {"num_users": 10, "dim": 5, "num_classes": 3, "seed": 2}
RUN_CONFIG = {P.RUN_TASK: "toy", P.RUN_TASK_PARAMS_JSON: json.dumps(PARAMS), P.RUN_DEVICE: "cpu"}


def _context(partition=1, partitions=3, run_config=RUN_CONFIG):
    node_config = {P.NODE_PARTITION_ID: partition, P.NODE_NUM_PARTITIONS: partitions}
    return Context(
        run_id=1,
        node_id=11,
        node_config=node_config,
        state=RecordDict(),
        run_config=dict(run_config),
    )


def _task():
    return build_task("toy", **PARAMS)


def _arrays(task, flat=None):
    model = task.build_model()
    if flat is not None:
        model = LocalTrainer(task, device="cpu").load_global(flat)
    return ArrayRecord(model.state_dict())


def _train_content(task, users, local, *, stream="train", **settings):
    settings = P.ClientSettings(local=local, seed=5, **settings)
    config = P.encode_train_config(users=users, round_num=2, settings=settings, stream=stream)
    return {P.ARRAYS_RECORD: _arrays(task), P.CONFIG_RECORD: config}


def test_query_returns_the_hosted_users():
    reply = app(delivered(P.users_query(), "query"), _context(partition=1, partitions=3))
    assert not reply.has_error()
    assert P.read_user_ids(reply.content) == [1, 4, 7]
    reply = app(delivered(P.users_query(), "query"), _context(partition=2, partitions=10))
    assert P.read_user_ids(reply.content) == [2]


def test_unknown_query_fails():
    content = {P.QUERY_RECORD: ConfigRecord({P.OP: "secrets"})}
    with pytest.raises(ValueError, match="unknown query"):
        app(delivered(content, "query"), _context())


def test_train_reply_carries_one_clipped_update_per_user_and_nothing_private():
    task = _task()
    local = LocalConfig(learning_rate=0.5, epochs=2, batch_size=4, clip_norm=0.1, noise_std=0.01)
    msg = delivered(_train_content(task, [4, 1, 2], local), "train")
    reply = app(msg, _context(partition=1, partitions=3))
    content = reply.content
    assert set(content.array_records) == {"update/4", "update/1"}
    assert set(content.metric_records) == {P.TRAIN_METRICS}
    assert dict(content[P.TRAIN_METRICS]) == {P.USERS_TRAINED: 2, P.USERS_REJECTED: 1}
    assert not content.config_records
    updates = P.read_updates(content)
    trainer = LocalTrainer(task, device="cpu")
    for user, delta in updates.items():
        assert list(content[P.update_key(user)]) == [P.DELTA_ARRAY]
        assert delta.dtype == np.float32 and delta.shape == (5 * 3 + 3,)
        assert np.linalg.norm(delta - 0) < 0.1 + 0.01 * 6 * 5  # clipped (+ small noise)
        want = trainer.train(
            initial_flat(task),
            user_id=user,
            round_num=2,
            config=local,
            rngs=RngFactory(seed=5),
            stream="train",
        )
        np.testing.assert_array_equal(delta, want.delta.numpy())


def test_private_metrics_only_when_asked():
    task = _task()
    local = LocalConfig(learning_rate=0.1)
    msg = delivered(_train_content(task, [1, 7], local, report_private_metrics=True), "train")
    reply = app(msg, _context())
    metrics = reply.content[P.TRAIN_METRICS]
    assert metrics[P.USERS_TRAINED] == 2
    assert metrics[P.NUM_EXAMPLES] == [task.user_size(1), task.user_size(7)]
    assert len(metrics[P.TRAIN_LOSS]) == 2 and all(v > 0 for v in metrics[P.TRAIN_LOSS])


def test_foreign_users_are_skipped():
    task = _task()
    msg = delivered(_train_content(task, [0, 2, 3], LocalConfig(learning_rate=0.1)), "train")
    reply = app(msg, _context(partition=1, partitions=3))
    assert not P.read_updates(reply.content)
    assert dict(reply.content[P.TRAIN_METRICS]) == {P.USERS_TRAINED: 0, P.USERS_REJECTED: 3}


def test_preconditioner_record_and_stream_are_used():
    task = _task()
    local = LocalConfig(learning_rate=0.4, batch_size=4)
    flat = initial_flat(task)
    content = _train_content(task, [1], local, stream="cohort-2")
    content[P.PRECONDITIONER_RECORD] = ArrayRecord(
        {P.PRECONDITIONER_ARRAY: Array(np.full(flat.numel(), 2.0, dtype=np.float32))}
    )
    delta = P.read_updates(app(delivered(content, "train"), _context()).content)[1]
    half = LocalConfig(learning_rate=0.2, batch_size=4)
    want = LocalTrainer(task, device="cpu").train(
        flat, user_id=1, round_num=2, config=half, rngs=RngFactory(seed=5), stream="cohort-2"
    )
    np.testing.assert_allclose(delta, want.delta.numpy(), rtol=1e-5, atol=1e-7)


def test_secure_mode_noise_is_fresh():
    task = _task()
    local = LocalConfig(learning_rate=0.1, clip_norm=1.0, noise_std=0.5)
    msg = delivered(_train_content(task, [1], local, secure=True), "train")
    a = P.read_updates(app(msg, _context()).content)[1]
    b = P.read_updates(app(msg, _context()).content)[1]
    assert not np.array_equal(a, b)


def test_train_with_a_broadcast_model_of_float64_numpy_arrays():
    task = _task()
    flat = initial_flat(task) + 0.1
    state = LocalTrainer(task, device="cpu").load_global(flat).state_dict()
    arrays = ArrayRecord({k: Array(v.double().numpy()) for k, v in reversed(state.items())})
    content = _train_content(task, [1], LocalConfig(learning_rate=0.1))
    content[P.ARRAYS_RECORD] = arrays
    delta = P.read_updates(app(delivered(content, "train"), _context()).content)[1]
    trainer = LocalTrainer(task, device="cpu")
    want = trainer.train(
        flat, user_id=1, round_num=2, config=LocalConfig(learning_rate=0.1), rngs=RngFactory(seed=5)
    )
    # in the layout of the message's model, its tensors reversed (forty-fourth review of issue
    # 15, wire 1: the node's own layout was sent, and the server read weight's entries as bias')
    sent = torch.cat(list(reversed(torch.split(want.delta, trainer.spec.sizes))))
    np.testing.assert_allclose(delta, sent.numpy(), rtol=1e-6, atol=1e-7)


def test_evaluate_on_the_nodes_users():
    task = _task()
    reply = app(delivered({P.ARRAYS_RECORD: _arrays(task)}, "evaluate"), _context())
    metrics = reply.content[P.EVAL_METRICS]
    model = task.build_model()
    xs, ys = zip(*(task.user_data(u) for u in (1, 4, 7)), strict=True)
    want = task.evaluate_data(model, torch.cat(xs), torch.cat(ys))
    assert metrics[P.EVAL_NUM_EXAMPLES] == sum(len(y) for y in ys)
    assert metrics[P.EVAL_LOSS] == pytest.approx(want["loss"], rel=1e-5)
    assert metrics[P.EVAL_ACCURACY] == pytest.approx(want["accuracy"], rel=1e-9)
    only = {P.ARRAYS_RECORD: _arrays(task), P.CONFIG_RECORD: ConfigRecord({P.USERS: [4, 5]})}
    metrics = app(delivered(only, "evaluate"), _context()).content[P.EVAL_METRICS]
    assert metrics[P.EVAL_NUM_EXAMPLES] == task.user_size(4)


def test_task_comes_from_run_config_or_factory_default():
    with pytest.raises(ValueError, match="no 'task'"):
        app(delivered(P.users_query(), "query"), _context(run_config={}))
    custom = make_client_app(task="toy", task_params={"num_users": 4}, device="cpu")
    reply = custom(
        delivered(P.users_query(), "query"), _context(partition=0, partitions=2, run_config={})
    )
    assert P.read_user_ids(reply.content) == [0, 2]
    reply = custom(delivered(P.users_query(), "query"), _context(partition=0, partitions=2))
    assert P.read_user_ids(reply.content) == [0, 2, 4, 6, 8]  # the run config wins
    with pytest.raises(ValueError, match="unknown task"):
        make_client_app(task="nope")


def test_node_config_is_required():
    ctx = _context()
    ctx.node_config = {}
    with pytest.raises(ValueError, match="partition-id"):
        app(delivered(P.users_query(), "query"), ctx)


def test_task_and_trainer_are_cached_and_the_app_pickles_small():
    clear_cache()
    a = get_task_and_trainer("toy", json.dumps(PARAMS), "cpu")
    b = get_task_and_trainer("toy", dict(reversed(PARAMS.items())), "cpu")
    assert a[0] is b[0] and a[1] is b[1]
    assert len(pickle.dumps(app)) < 10_000  # the handlers do not carry the cache along
    with pytest.raises(ValueError, match="task_params"):
        get_task_and_trainer("toy", "[1, 2]")
