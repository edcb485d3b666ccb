"""Issue 15, forty-sixth hostile review (wire: Flower messages, replies, the ClientApp): tests.

1. ``DPStrategy`` in process (a grid of one's own) reading a train reply of node 100, asked for
   users 0-1,999 (one SuperNode hosting many users), that holds their 2,000 updates, or 2,000
   updates under keys not asked of it (a rogue node). Before: each key was looked up in the
   node's list of asked users (``user not in self._node_users.get(node, [])``): a scan of the
   list per key, quadratic in the users a node hosts: a reply of 20,000 asked updates took 5 s
   to read (0.3 s of it decoding), 20,000 unasked keys beside them 9 s more, every round (a
   rogue node's 200,000 keys against 20,000 asked users about 15 minutes). Now the node's users
   are one set a reply (``ReplyCollection._updates``): 2.8 s and 0.4 s, linear; the test counts
   the scans of the list (0 where there were 4,000), and the updates read, ``unrequested`` and
   ``dropped`` are as before.
2. ``DPStrategy`` in process (a grid of one's own) whose node 100 hosts 200 users and answers
   with updates of another shape for a third of them and float64 updates of a float32 model for
   the rest (a ClientApp of one's own training another model, or a rogue node). Before: one
   warning a rejected user, ``round 1: rejected the update of user 0: shape (4,) != (3,)``: 200
   lines a round (2,000 lines and 145 kB a round at 2,000 users), where a reply's unrequested
   and undecodable updates are one warning each (forty-third review, wire 10; forty-fifth, wire
   5). Now one warning a round, by reason: ``round 1: rejected 200 updates: user 0 and 66 more:
   shape (4,) != (3,); user 1 and 132 more: dtype torch.float64 != torch.float32``, at most
   five reasons shown and the rest counted (``strategies.flower.rejected_text``); ``rejected``
   and ``accepted`` as before.
3. fedprivopt's ClientApp (node 1 of 3, toy by reference) given an evaluate message (a
   ServerApp of one's own; fedprivopt's server sends none) for a task whose ``evaluate_data``
   returns its metrics as tensors (``cross_entropy``'s loss), leaves out ``accuracy``, returns a
   string, raises, or calls ``sys.exit(0)``. Before: called unchecked (the one member of a task
   no engine checks): Flower's ``TypeError: Not all values are of valid type``, ``KeyError:
   'accuracy'``, ``TypeError: unsupported operand type(s)``, the task's ``RuntimeError`` and
   ``SystemExit`` out of the handler, naming neither the task nor the metric (the node's
   failure). Now tensors of one value are read as numbers (the toy's metrics to 1e-7), and the
   rest is the task's error reply (``TaskError``, code ``TASK_ERROR``): ``Bad.evaluate_data(model,
   x, y) must return a mapping with the numbers 'loss' and 'accuracy'; got none for 'accuracy',
   ...`` (``client_app._user_metrics``, through ``task_calls.task_call`` as ``user_data`` and
   ``loss`` are in training).
4. fedprivopt's ClientApp (node 1 of 3, toy: users 1, 4, 7) given an evaluate message whose
   ``config`` naming users ``[4]`` is a ``MetricRecord``, and ``TrainMessage.read`` (a ClientApp
   of one's own too) of a train message whose ``preconditioner`` is a ``MetricRecord`` or a
   ``ConfigRecord`` of its 18 values (a ServerApp of one's own choosing the record that holds
   lists of numbers). Before: read as holding none: the evaluate reply held the metrics of all
   three hosted users (39 examples) where the server named user 4 (7), and DP2's or AdaDPS'
   clients trained without their preconditioner (``preconditioner`` None), as the forty-fifth
   review's records spelled otherwise (wire 4) were. Now ``ValueError: evaluate message's record
   'config' must be a ConfigRecord, got a MetricRecord`` and ``train message's record
   'preconditioner' must be an ArrayRecord, got a MetricRecord``
   (``clients.messages.check_record_kinds``); a record of another kind spelled otherwise
   (``Preconditioner``) is refused as an ArrayRecord so spelled is; the right kinds as before.
5. ``DPStrategy`` in process (a grid of one's own) whose node 100 sends each asked user's update
   as a ``MetricRecord`` (or ``ConfigRecord``) ``{"delta": [...]}`` under ``update/<user>`` (a
   ClientApp of one's own choosing the record that holds lists of numbers); ``wire.read_updates``
   (a ServerApp of one's own) of such a reply. Before: only ``ArrayRecord`` s were looked at, so
   the updates were not seen: every user counted as ``dropped`` (``received`` 0), without a
   word, every round; ``read_updates`` returned ``{}``. Now each is an undecodable update,
   rejected and counted (``received`` 20, ``rejected`` 20, ``dropped`` 0) in the reply's one
   warning, ``node 100: undecodable update of user 0 and 19 more: its record is a MetricRecord,
   not an ArrayRecord holding the array 'delta'`` (``ReplyCollection._updates``), and
   ``read_updates`` raises ``ValueError: the train reply's record 'update/1' (user 1) must be an
   ArrayRecord, got a MetricRecord``.

The tests run fedprivopt's ClientApp and DPStrategy in process (no Flower engine, no Ray).
"""

from __future__ import annotations

import json
import logging
import uuid

import numpy as np
import pytest
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig
from fedprivopt.clients.client_app import app
from fedprivopt.clients.messages import TASK_ERROR, TrainMessage
from fedprivopt.models import build_task
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.privacy.flat import flatten
from fedprivopt.strategies import StrategyConfig, build_algorithm, flower
from fedprivopt.strategies.flower import DPStrategy, flat_to_arrays
from tests.messages import delivered, reply_metadata

# -- finding 1: a reply's keys are looked up in a set of the node's users, not its list -----------


class _CountingList(list):
    """A node's list of asked users that counts the membership scans made of it."""

    scans = 0

    def __contains__(self, item: object) -> bool:
        type(self).scans += 1
        return super().__contains__(item)


def _read_reply(first: int, count: int, asked: int) -> tuple[DPStrategy, dict]:
    """Node 100, asked for users ``0..asked-1``, replies with users ``first..first+count-1``."""
    flat, spec = flatten({"w": torch.zeros(2)})
    config = StrategyConfig(population=4 * asked, clients_per_round=asked, noise_multiplier=0.8)
    strategy = DPStrategy(build_algorithm(config, flat), spec, node_wait=0.0)
    message = delivered({}, "train", dst_node_id=100)
    strategy._sent = [message]
    strategy._node_users = {100: _CountingList(range(asked))}
    delta = ArrayRecord({P.DELTA_ARRAY: Array(np.full(2, 0.01, np.float32))})
    content = RecordDict({P.update_key(u): delta for u in range(first, first + count)})
    reply = Message(content, metadata=reply_metadata(message, 100))
    return strategy, strategy._updates([reply])


def test_1_a_replys_keys_are_not_each_a_scan_of_the_nodes_users():
    _CountingList.scans = 0
    strategy, updates = _read_reply(0, 2000, 2000)
    assert sorted(updates) == list(range(2000))
    assert torch.equal(updates[1999], torch.full((2,), 0.01))
    assert strategy.unrequested == 0 and strategy.lost["dropped"] == 0
    strategy, updates = _read_reply(2000, 2000, 2000)  # a rogue node's keys, none asked
    assert updates == {} and strategy.unrequested == 2000
    assert strategy.lost["dropped"] == 2000
    assert _CountingList.scans == 0  # before: 4,000 scans of a list of 2,000 users


# -- finding 2: a round's rejected updates are one warning, by reason -----------------------------


class _OtherModelGrid:
    """Node 100 hosts users 0-199 and sends updates of another shape or dtype for each."""

    def get_node_ids(self):
        return [100]

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # as a grid pushes it
            if msg.metadata.message_type == "query":
                content = RecordDict({P.USERS_RECORD: ConfigRecord({P.USER_IDS: list(range(200))})})
            else:
                users = msg.content.config_records[P.CONFIG_RECORD][P.USERS]
                content = RecordDict(
                    {
                        P.update_key(u): ArrayRecord(
                            {
                                P.DELTA_ARRAY: Array(
                                    np.full(4, 0.01, np.float32)
                                    if u % 3 == 0
                                    else np.full(3, 0.01, np.float64)
                                )
                            }
                        )
                        for u in users
                    }
                )
            replies.append(Message(content, metadata=reply_metadata(msg, 100)))
        return replies


def test_2_a_rounds_rejected_updates_are_one_warning_by_reason(server_side, caplog):
    config = StrategyConfig(population=200, clients_per_round=200, noise_multiplier=0.8, seed=5)
    flat, spec = flatten({"w": torch.zeros(3)})
    rows: list[dict] = []
    strategy = DPStrategy(
        build_algorithm(config, flat),
        spec,
        node_wait=0.0,
        on_round=lambda r, _: rows.append(r.metrics),
    )
    with caplog.at_level(logging.WARNING, logger="flwr"):
        strategy.start(_OtherModelGrid(), flat_to_arrays(flat, spec), 1, timeout=1.0)
    said = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert said == [  # before: 200 lines, one a user
        "round 1: rejected 200 updates: user 0 and 66 more: shape (4,) != (3,); user 1 and 132 "
        "more: dtype torch.float64 != torch.float32"
    ]
    assert rows[0]["rejected"] == 200 and rows[0]["accepted"] == 0


def test_2_rejected_text_shows_five_reasons_and_counts_the_rest():
    assert flower.rejected_text(3, {7: "contains NaN or Inf"}) == (
        "round 3: rejected the update: user 7: contains NaN or Inf"
    )
    text = flower.rejected_text(2, {u: f"reason {u % 8}" for u in range(16)})
    assert text == (
        "round 2: rejected 16 updates: user 0 and 1 more: reason 0; user 1 and 1 more: reason 1; "
        "user 2 and 1 more: reason 2; user 3 and 1 more: reason 3; user 4 and 1 more: reason 4; "
        "6 more for 3 other reasons"
    )


# -- finding 3: the evaluate handler reads evaluate_data's metrics as the task's protocol ---------

TOY = {"num_users": 10, "dim": 5, "num_classes": 3, "seed": 2}


class _Evaluating(ToyClassificationTask):
    """The toy task whose ``evaluate_data`` returns what ``kind`` says."""

    kind = "floats"

    def evaluate_data(self, model, x, y):
        kind = type(self).kind
        if kind == "exit":
            raise SystemExit(0)
        if kind == "raises":
            raise RuntimeError("boom")
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        accuracy = (out.argmax(1) == y).float().mean()
        return {
            "floats": {"loss": loss.detach().item(), "accuracy": accuracy.item()},
            "tensors": {"loss": loss, "accuracy": accuracy},
            "no accuracy": {"loss": loss.detach().item()},
            "string": {"loss": "high", "accuracy": 0.5},
        }[kind]


def evaluating_task(**params):
    """The task factory the run config names (a task by reference)."""
    return _Evaluating(**params)


def _evaluate(kind: str, monkeypatch) -> Message:
    monkeypatch.setattr(_Evaluating, "kind", kind)
    run_config = {
        P.RUN_TASK: f"{__name__}:evaluating_task",
        P.RUN_TASK_PARAMS_JSON: json.dumps(TOY),
        P.RUN_DEVICE: "cpu",
    }
    nodes = {P.NODE_PARTITION_ID: 1, P.NODE_NUM_PARTITIONS: 3}
    context = Context(
        run_id=1, node_id=11, node_config=nodes, state=RecordDict(), run_config=run_config
    )
    state = build_task("toy", **TOY).build_model().state_dict()
    arrays = ArrayRecord({k: Array(v.numpy()) for k, v in state.items()})
    return app(delivered({P.ARRAYS_RECORD: arrays}, "evaluate"), context)


def test_3_tensor_metrics_of_evaluate_data_are_read_as_numbers(monkeypatch):
    floats = _evaluate("floats", monkeypatch).content.metric_records[P.EVAL_METRICS]
    tensors = _evaluate("tensors", monkeypatch)  # before: Flower's TypeError
    assert not tensors.has_error()
    got = tensors.content.metric_records[P.EVAL_METRICS]
    assert got[P.EVAL_NUM_EXAMPLES] == floats[P.EVAL_NUM_EXAMPLES] == 39
    assert got[P.EVAL_LOSS] == pytest.approx(floats[P.EVAL_LOSS], abs=1e-7)
    assert got[P.EVAL_ACCURACY] == pytest.approx(floats[P.EVAL_ACCURACY], abs=1e-7)


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("no accuracy", "; got none for 'accuracy', keys ['loss']"),
        ("string", "; got a str for 'loss'"),
        ("raises", None),
        ("exit", "; it called sys.exit(0)"),
    ],
)
def test_3_evaluate_data_breaking_its_protocol_is_the_tasks_error(kind, said, monkeypatch):
    reply = _evaluate(kind, monkeypatch)  # before: KeyError, TypeError, RuntimeError, SystemExit
    assert reply.has_error() and reply.error.code == TASK_ERROR
    # the reply names the member and the type or the rule; what was got is in the node's log
    # only (the forty-sixth review's follow-up, privacy 1; the reason was the error's text)
    node_log = "; the full message is in the node's log"
    if said is None:
        assert reply.error.reason == "_Evaluating.evaluate_data raised RuntimeError" + node_log
    elif kind == "exit":
        assert reply.error.reason == "_Evaluating.evaluate_data called sys.exit()" + node_log
    else:
        rule = (
            "_Evaluating.evaluate_data(model, x, y) must return a mapping with the numbers "
            "'loss' and 'accuracy'"
        )
        assert reply.error.reason == rule + node_log


# -- finding 4: a message's record of another kind is refused, not read as none -------------------


def _node() -> Context:
    """Node 1 of 3 of the toy task (users 1, 4, 7)."""
    run_config = {P.RUN_TASK: "toy", P.RUN_TASK_PARAMS_JSON: json.dumps(TOY), P.RUN_DEVICE: "cpu"}
    nodes = {P.NODE_PARTITION_ID: 1, P.NODE_NUM_PARTITIONS: 3}
    return Context(
        run_id=1, node_id=11, node_config=nodes, state=RecordDict(), run_config=run_config
    )


def _model_arrays() -> ArrayRecord:
    state = build_task("toy", **TOY).build_model().state_dict()
    return ArrayRecord({k: Array(v.numpy()) for k, v in state.items()})


def test_4_an_evaluate_config_of_another_kind_is_refused():
    message = delivered(
        {P.ARRAYS_RECORD: _model_arrays(), P.CONFIG_RECORD: MetricRecord({P.USERS: [4]})},
        "evaluate",
    )
    said = "^evaluate message's record 'config' must be a ConfigRecord, got a MetricRecord$"
    with pytest.raises(ValueError, match=said):
        app(message, _node())  # before: the metrics of users 1, 4 and 7 (39 examples)
    asked = delivered(
        {P.ARRAYS_RECORD: _model_arrays(), P.CONFIG_RECORD: ConfigRecord({P.USERS: [4]})},
        "evaluate",
    )
    assert app(asked, _node()).content.metric_records[P.EVAL_METRICS][P.EVAL_NUM_EXAMPLES] == 7


def _train_message(**records) -> Message:
    settings = P.ClientSettings(LocalConfig(learning_rate=0.5, clip_norm=1.0), seed=5)
    config = P.encode_train_config(users=[1, 4], round_num=1, settings=settings)
    content = {P.CONFIG_RECORD: config, P.ARRAYS_RECORD: _model_arrays(), **records}
    return delivered(content, "train")


@pytest.mark.parametrize("record", [MetricRecord, ConfigRecord])
def test_4_a_preconditioner_of_another_kind_is_refused(record):
    message = _train_message(**{P.PRECONDITIONER_RECORD: record({"p": [2.0] * 18})})
    said = (
        f"^train message's record 'preconditioner' must be an ArrayRecord, got a {record.__name__}$"
    )
    with pytest.raises(ValueError, match=said):
        TrainMessage.read(message)  # before: preconditioner None, trained without it
    spelled = _train_message(Preconditioner=record({"p": [2.0] * 18}))
    said = f"^train message's {record.__name__} 'Preconditioner' is 'preconditioner' in another"
    with pytest.raises(ValueError, match=said):
        TrainMessage.read(spelled)
    p = ArrayRecord({P.PRECONDITIONER_ARRAY: Array(np.full(18, 2.0, np.float32))})
    read = TrainMessage.read(_train_message(**{P.PRECONDITIONER_RECORD: p}))
    assert torch.equal(read.preconditioner, torch.full((18,), 2.0))


# -- finding 5: an update under its key in a record of another kind is rejected, not unseen -------


class _MetricUpdatesGrid:
    """Node 100 hosts users 0-19 and sends each update as a ``record`` of its values."""

    record = MetricRecord

    def get_node_ids(self):
        return [100]

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # as a grid pushes it
            if msg.metadata.message_type == "query":
                content = RecordDict({P.USERS_RECORD: ConfigRecord({P.USER_IDS: list(range(20))})})
            else:
                users = msg.content.config_records[P.CONFIG_RECORD][P.USERS]
                content = RecordDict(
                    {P.update_key(u): self.record({P.DELTA_ARRAY: [0.01] * 3}) for u in users}
                )
            replies.append(Message(content, metadata=reply_metadata(msg, 100)))
        return replies


@pytest.mark.parametrize("record", [MetricRecord, ConfigRecord])
def test_5_an_update_in_a_record_of_another_kind_is_rejected_and_said(
    record, server_side, caplog, monkeypatch
):
    monkeypatch.setattr(_MetricUpdatesGrid, "record", record)
    config = StrategyConfig(population=20, clients_per_round=20, noise_multiplier=0.8, seed=5)
    flat, spec = flatten({"w": torch.zeros(3)})
    rows: list[dict] = []
    strategy = DPStrategy(
        build_algorithm(config, flat),
        spec,
        node_wait=0.0,
        on_round=lambda r, _: rows.append(r.metrics),
    )
    with caplog.at_level(logging.WARNING, logger="flwr"):
        strategy.start(_MetricUpdatesGrid(), flat_to_arrays(flat, spec), 1, timeout=1.0)
    said = [r.getMessage() for r in caplog.records if "undecodable" in r.getMessage()]
    assert said == [
        f'node 100: undecodable update of user 0 and 19 more: "its record is a '
        f"{record.__name__}, not an ArrayRecord holding the array 'delta'\""
    ]
    # before: received 0 and dropped 20, without a word
    assert rows[0]["received"] == rows[0]["rejected"] == 20 and rows[0]["dropped"] == 0


def test_5_read_updates_refuses_an_update_in_a_record_of_another_kind():
    content = RecordDict({"update/1": MetricRecord({P.DELTA_ARRAY: [0.01] * 3})})
    said = r"^the train reply's record 'update/1' \(user 1\) must be an ArrayRecord, got a Metric"
    with pytest.raises(ValueError, match=said):
        P.read_updates(content)  # before: {}
