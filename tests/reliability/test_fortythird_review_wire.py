"""Issue 15, forty-third hostile review (wire: Flower messages, replies, the ClientApp): tests.

1. ``wire.encode_train_config`` (what a ServerApp writes into every train message; public, as
   ``decode_train_config`` is) and the ``wire.ClientSettings`` it encodes, given what is no user
   id, round, stream, seed or flag: users ``[0.5, 1.7]``, ``[True]``, ``["3"]`` or a NumPy float
   array ``[1.0, 2.5]``, ``round_num`` 2.9 or -1, ``stream`` 5 or ``""``, ``seed`` 1.5, ``"7"``
   or -1, ``secure`` ``"false"``, ``report_private_metrics`` ``"no"``. Before: written through
   ``int()``, ``str()`` and ``bool()``: users ``[0, 1]``, ``[1]``, ``[3]`` and ``[1, 2]`` (users
   the caller never named were trained), round 2 (the noise keys of another round), stream
   ``"5"``, seed 1, secure true and private metrics asked for, without a word; -1 and ``""``
   written for the ClientApp to refuse (``decode_train_config`` refuses every one of these since
   the thirty-first review). Now ``ValueError`` naming ``users``, ``round_num``, ``stream``,
   ``seed``, ``secure`` or ``report_private_metrics`` before a message is built
   (``ClientSettings.__post_init__``, ``encode_train_config``), which also refuses a private
   round asking for private metrics (``check_private_metrics``); what fedprivopt's strategies
   write encodes and decodes as before.
2. ``clients.make_client_app(task=..., task_params=...)`` (a ClientApp's default task, for
   ``flwr.simulation.run_simulation``, whose run config is empty) and
   ``get_task_and_trainer(task, task_params)``: a JSON string repeating a key
   (``'{"num_users": 4, "num_users": 6}'``), a mapping of one parameter in two spellings
   (``{"num-users": 4, "num_users": 6}``), a key that is no string (``{1: 2}``), a value JSON
   cannot hold (``Path("/tmp")``). Before: the last repeated key was taken without a word (a task
   of 6 users), the two spellings and ``{1: 2}`` were accepted and every node failed its first
   message with the task constructor's ``TypeError`` (the run then waits ``node_wait``), the
   ``Path`` raised json's ``TypeError`` naming no parameter; the run config's
   ``task-params-json`` refuses the first two (forty-second review, wire 5). Now ``ValueError``
   naming ``task_params`` and the key, when the app is made (``client_app._canonical_params``,
   with ``wire.json_object`` and ``wire.snake_case_params``, which ``task-params-json`` uses
   too); a kebab-case name is read as its snake_case one, as in the run config.
3. fedprivopt's ClientApp given an ``evaluate`` message (a ServerApp of one's own asking the
   nodes to evaluate) whose model array is of non-native byte order (``>f4``: a server on a
   big-endian machine), cut short, or of another serialization (``stype`` ``torch.Tensor``).
   Before: torch's ``ValueError: given numpy array has byte order different from the native
   byte order``, NumPy's ``EOFError`` or Flower's ``TypeError``, from Flower's
   ``to_torch_state_dict``, naming neither the record nor the array, where the ``train``
   handler names both (forty-first review, wire 2). Now ``ValueError: evaluate message's
   ArrayRecord 'arrays': array 'weight' cannot be read as a tensor: ...``
   (``clients.messages.read_model``, which ``TrainMessage.read`` uses too).
4. ``DPStrategy``'s user query (``strategies.discovery``) on a grid (in process, no Flower
   engine) where node 100's answer comes twice, or where the SuperLink answers for node 100 with
   its own error reply (``NODE_UNAVAILABLE``, sent by the SuperLink, node id 1). Before: the
   query's replies were keyed by their sender, so the second answer ended the run with
   ``ValueError: user 0 is hosted by nodes 100 and 100: two SuperNodes have the same
   partition-id ...`` (a round takes a node's first reply and ignores the second), and the
   SuperLink's reply was said as ``node 1 failed the user query``. Now a reply is the node's
   whose query it answers (its ``reply_to_message_id``, else its sender, as a round's replies
   are read) and a node's first reply counts (``UserDiscovery._read_users``): the run trains
   all 4 users, or names node 100 and counts its 2 users unhosted.
5. fedprivopt's ClientApp given an ``evaluate`` message naming two users, ``[4, 1]`` or
   ``[1, 4]``, of a task whose model's forward keeps what it saw (a running mean in a plain
   attribute, as a task by reference may). Before: one model was loaded for the whole message,
   so user 4's data moved user 1's metrics: ``[4, 1]`` reported accuracy 0.382 and ``[1, 4]``
   0.5 for the same users and model (the forty-second review's lead found the same in the
   server's central evaluation). Now every user is evaluated on the model as built
   (``LocalTrainer.load_global`` per user, ``client_app._evaluate``): both orders report the
   example-weighted mean of each user alone.
6. ``clients.make_client_app(task="toy", device=...)`` with ``device`` ``None`` (what
   ``LocalTrainer`` takes for its default), ``5``, ``True``, ``""``, ``"CPU"`` or ``"meta"``.
   Before: taken (as ``str(device)``), and every node then failed every message with ``device
   must be a torch.device ... got 'None'``, naming no parameter of the call; the run waited
   ``node_wait`` and ended "none of the connected nodes hosts a user". Now ``ValueError`` naming
   ``device`` when the app is made (``client_app._check_device_name``: ``"auto"`` or a device
   torch reads that holds data; whether the node has it is checked on the node, as before).
7. The public functions of the wire (a ServerApp or ClientApp of one's own) given what is no
   record, mapping or message: ``wire.read_updates(None)`` (or a dict), ``wire.task_params(None)``
   (or a list of pairs), ``wire.decode_train_config(None)``, ``wire.check_private_metrics(None)``,
   ``clients.messages.hosted_users(None, 4)``, ``reply_task_error("m", TaskError(...))``,
   ``strategies.flower.arrays_to_flat(None)`` (or a state dict), ``flower_arrays.
   wire_preconditioner`` of a NumPy array, ``wire_spec(None)``, ``wire.parse_update_key(None)``.
   Before: ``AttributeError`` (``'NoneType' object has no attribute 'array_records'``, ``'get'``,
   ``'node_config'``, ``'to_torch_state_dict'``, ``'detach'``, ``'dtypes'``, ``'startswith'``),
   ``TypeError`` or Flower's ``MessageInitializationError``, naming no parameter (the forty-second
   review, wire 3, fixed the message functions of ``clients.messages``, not these). Now
   ``ValueError`` naming ``content``, ``run_config``, ``record``, ``context``, ``message``,
   ``preconditioner`` or ``spec``; ``parse_update_key`` says ``None`` (no update key), as it does
   for every other string that is not one.
8. ``clients.TrainMessage.read`` (a ClientApp of one's own, docs/FLOWER.md: divide every local
   gradient by ``request.preconditioner``) of a train message whose preconditioner ``p`` has one
   entry, one entry fewer than the model (17 of 18), a zero, a NaN, or complex values. Before:
   read as given (an app dividing by a one-entry ``p`` broadcasts it over the model; a zero or
   NaN makes every step infinite or NaN, so the server rejects every update and the round
   releases noise only), where fedprivopt's own ClientApp refuses each (its trainer). Now
   ``ValueError: train message's ArrayRecord 'preconditioner': array 'p' must hold 18 real
   values, finite and > 0 ...`` (``messages._check_preconditioner``); a float16, float32 or
   float64 vector of the model's length (flat or ``(18, 1)``) is read as before.
9. fedprivopt's ClientApp (``wire.decode_train_config``) given a train config holding a known key
   in snake_case (``count_noise_std`` 0.3, ``clip_bit``, ``report_private_metrics``,
   ``noise_std``, ``local_epochs``), as a ServerApp of one's own writing the config by hand may.
   Before: the key was ignored without a word and its default used: with ``count_noise_std``
   the node sent each user's exact clip bit where the server meant to ask for a noised share
   (distributed mode); ``local_epochs`` 3 beside ``local-epochs`` 1 trained one epoch. Now
   ``ValueError: train config key 'count_noise_std' is 'count-noise-std' in another spelling;
   ...``; keys that are no spelling of a known one are ignored as before.
10. ``DPStrategy`` (in process, the grid of finding 4) given a train reply of node 100 holding,
    beside its users' updates, 500 updates under keys it was not asked for (``update/1000`` to
    ``update/1499``: a ClientApp keying its updates by position, or training every hosted
    user). Before: one warning a key, 500 lines for the reply (a line for each such user in
    every round). Now one warning a reply naming the first key and how many more
    (``ReplyCollection._said_unrequested``); ``unrequested`` still counts 500.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig
from fedprivopt.clients.client_app import app, get_task_and_trainer, make_client_app
from fedprivopt.clients.messages import TrainMessage
from fedprivopt.models import build_task
from fedprivopt.privacy.flat import flatten
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy, flat_to_arrays
from tests.messages import delivered, reply_metadata

LOCAL = LocalConfig(learning_rate=0.5, clip_norm=1.0)
SETTINGS = P.ClientSettings(LOCAL, seed=5)


# -- finding 1: encode_train_config writes only what decode_train_config takes ------------------

ENCODED = {
    "users floats": ({"users": [0.5, 1.7]}, "users"),
    "users bool": ({"users": [True]}, "users"),
    "users str": ({"users": ["3"]}, "users"),
    "users numpy floats": ({"users": np.array([1.0, 2.5])}, "users"),
    "users one string": ({"users": "12"}, "users"),
    "round 2.9": ({"round_num": 2.9}, "round_num"),
    "round -1": ({"round_num": -1}, "round_num"),
    "stream 5": ({"stream": 5}, "stream"),
    "stream empty": ({"stream": ""}, "stream"),
}


@pytest.mark.parametrize("name", sorted(ENCODED))
def test_1_encode_train_config_refuses_what_is_no_user_round_or_stream(name):
    changes, parameter = ENCODED[name]
    arguments = {"users": [1, 4], "round_num": 2, "settings": SETTINGS, **changes}
    with pytest.raises(ValueError, match=f"^{parameter} must be"):
        P.encode_train_config(**arguments)


SETTINGS_GIVEN = {
    "seed 1.5": ({"seed": 1.5}, "seed"),
    "seed string": ({"seed": "7"}, "seed"),
    "seed -1": ({"seed": -1}, "seed"),
    "seed 2**63": ({"seed": 2**63}, "seed"),
    "secure string": ({"secure": "false"}, "secure"),
    "private metrics string": ({"report_private_metrics": "no"}, "report_private_metrics"),
    "local not a LocalConfig": ({"local": {"learning_rate": 0.5}}, "local"),
}


@pytest.mark.parametrize("name", sorted(SETTINGS_GIVEN))
def test_1_client_settings_refuse_what_is_no_seed_or_flag(name):
    changes, parameter = SETTINGS_GIVEN[name]
    with pytest.raises(ValueError, match=f"^{parameter} must be"):
        P.ClientSettings(**{"local": LOCAL, "seed": 5, **changes})


def test_1_a_private_round_asking_for_private_metrics_is_not_encoded():
    settings = P.ClientSettings(LOCAL, seed=5, report_private_metrics=True)  # clip-norm 1
    with pytest.raises(ValueError, match="'report-private-metrics' is true in a private round"):
        P.encode_train_config(users=[1], round_num=1, settings=settings)


def test_1_what_the_strategies_write_encodes_and_decodes_as_before():
    settings = P.ClientSettings(LOCAL, seed=2**63 - 1, secure=True)
    record = P.encode_train_config(
        users=np.array([4, 1]), round_num=np.int64(3), settings=settings, stream="train-2"
    )
    decoded = P.decode_train_config(record)
    assert decoded.users == (4, 1) and decoded.round_num == 3 and decoded.stream == "train-2"
    assert decoded.settings == settings
    public = P.ClientSettings(LocalConfig(learning_rate=0.5), seed=0, report_private_metrics=True)
    record = P.encode_train_config(users=(u for u in [2]), round_num=0, settings=public)
    assert P.decode_train_config(record).settings.report_private_metrics is True


# -- finding 2: a ClientApp's default task parameters are read as the run config's ----------------

DEFAULT_PARAMS = {
    "repeated key": ('{"num_users": 4, "num_users": 6}', "task_params repeats the key 'num_users'"),
    "two spellings": (
        {"num-users": 4, "num_users": 6},
        "task_params key 'num-users' and task_params key 'num_users' are both given",
    ),
    "key no string": ({1: 2}, r"task_params keys must be parameter names \(strings\), got 1"),
    "a path": ({"data_dir": Path("/tmp")}, "task_params must hold JSON values"),
}


@pytest.mark.parametrize("name", sorted(DEFAULT_PARAMS))
def test_2_make_client_app_refuses_task_params_the_run_config_refuses(name):
    params, message = DEFAULT_PARAMS[name]
    with pytest.raises(ValueError, match=f"^{message}"):
        make_client_app(task="toy", task_params=params, device="cpu")


def test_2_get_task_and_trainer_builds_one_spelling_as_the_run_config():
    kebab, _ = get_task_and_trainer("toy", '{"num-users": 4, "dim": 3}', "cpu")
    snake, _ = get_task_and_trainer("toy", {"num_users": 4, "dim": 3}, "cpu")
    assert kebab is snake and kebab.num_users == 4  # one cache entry: the same parameters
    with pytest.raises(ValueError, match="'num-users' and task_params key 'num_users'"):
        get_task_and_trainer("toy", {"num-users": 4, "num_users": 6}, "cpu")


# -- finding 3: the evaluate handler names an array it cannot read -------------------------------

TOY = {"num_users": 10, "dim": 5, "num_classes": 3, "seed": 2}


def _node() -> Context:
    """Node 1 of 3 of the toy task (users 1, 4, 7), as fedprivopt's ClientApp reads it."""
    run_config = {P.RUN_TASK: "toy", P.RUN_TASK_PARAMS_JSON: json.dumps(TOY), P.RUN_DEVICE: "cpu"}
    nodes = {P.NODE_PARTITION_ID: 1, P.NODE_NUM_PARTITIONS: 3}
    return Context(
        run_id=1, node_id=11, node_config=nodes, state=RecordDict(), run_config=run_config
    )


def _model_arrays(weight: Array | None = None) -> ArrayRecord:
    state = build_task("toy", **TOY).build_model().state_dict()
    arrays = {name: Array(tensor.numpy()) for name, tensor in state.items()}
    if weight is not None:
        arrays["weight"] = weight
    return ArrayRecord(arrays)


UNREADABLE = {
    "big-endian": Array(np.zeros((3, 5), ">f4")),
    "cut": Array("float32", (3, 5), "numpy.ndarray", b""),
    "torch stype": Array("float32", (3, 5), "torch.Tensor", b"abc"),
}


@pytest.mark.parametrize("name", sorted(UNREADABLE))
def test_3_evaluate_names_the_array_it_cannot_read(name):
    message = delivered({P.ARRAYS_RECORD: _model_arrays(UNREADABLE[name])}, "evaluate")
    with pytest.raises(ValueError, match=r"^evaluate message's ArrayRecord 'arrays': array 'weigh"):
        app(message, _node())


def test_3_evaluate_and_train_read_a_good_model_as_before():
    evaluated = app(delivered({P.ARRAYS_RECORD: _model_arrays()}, "evaluate"), _node())
    assert evaluated.content[P.EVAL_METRICS][P.EVAL_NUM_EXAMPLES] > 0
    config = P.encode_train_config(users=[1], round_num=1, settings=SETTINGS)
    train = delivered({P.CONFIG_RECORD: config, P.ARRAYS_RECORD: _model_arrays()}, "train")
    assert list(P.read_updates(app(train, _node()).content)) == [1]
    bad = delivered({P.CONFIG_RECORD: config, P.ARRAYS_RECORD: _model_arrays(UNREADABLE["cut"])},
                    "train")  # fmt: skip
    with pytest.raises(ValueError, match=r"^train message's ArrayRecord 'arrays': array 'weight'"):
        app(bad, _node())


# -- finding 4: the user query takes a node's first reply, and names the node a reply is for ----

NODES = {100: [0, 1], 101: [2, 3]}


class _QueryGrid:
    """The part of Flower's grid DPStrategy uses: node 100 answers the query as ``how`` says."""

    def __init__(self, how: str):
        self.how = how

    def get_node_ids(self):
        return list(NODES)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # as a grid pushes it
            node = msg.metadata.dst_node_id
            if msg.metadata.message_type == "query":
                content = RecordDict({P.USERS_RECORD: ConfigRecord({P.USER_IDS: NODES[node]})})
                reply = Message(content, metadata=reply_metadata(msg, node))
                if node == 100 and self.how == "unavailable":  # the SuperLink's, for the node
                    error = Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node unavailable")
                    reply = Message(error, metadata=reply_metadata(msg, 1))
                replies += [reply, reply] if node == 100 and self.how == "twice" else [reply]
                continue
            content = RecordDict()
            users = list(msg.content.config_records[P.CONFIG_RECORD][P.USERS])
            if node == 100 and self.how == "by position":  # and every other hosted user
                users += list(range(1000, 1500))
            for user in users:
                delta = ArrayRecord({P.DELTA_ARRAY: Array(np.full(3, 0.1, np.float32))})
                content[P.update_key(user)] = delta
            replies.append(Message(content, metadata=reply_metadata(msg, node)))
        return replies


def _run(grid) -> list[dict]:
    config = StrategyConfig(population=4, clients_per_round=4, noise_multiplier=0.8, seed=5)
    flat, spec = flatten({"w": torch.zeros(3)})
    rows: list[dict] = []
    strategy = DPStrategy(
        build_algorithm(config, flat),
        spec,
        node_wait=0.0,
        on_round=lambda r, _: rows.append(r.metrics),
    )
    strategy.start(grid, flat_to_arrays(flat, spec), 1, timeout=1.0)
    return rows


def test_4_a_node_answering_the_user_query_twice_is_read_once(server_side):
    (row,) = _run(_QueryGrid("twice"))  # before: ValueError user 0 is hosted by nodes 100 and 100
    assert row["received"] == 4 and row["unhosted"] == 0


def test_4_the_superlinks_error_reply_names_the_node_it_is_for(server_side, caplog):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        (row,) = _run(_QueryGrid("unavailable"))
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "node 100 failed the user query" in said and "node 1 failed" not in said  # before: 1
    assert row["received"] == 2 and row["unhosted"] == 2


# -- finding 5: the evaluate handler gives every user the model as built ------------------------


class _Keeping(torch.nn.Module):
    """A toy model whose forward centres its input by the feature mean of its last call."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner
        self.seen = None  # a plain attribute: the last batch's feature mean

    def forward(self, x):
        if self.seen is not None:
            x = x - self.seen
        self.seen = x.detach().mean(0)
        return self.inner(x)


def keeping_task(**params):
    """The toy task with :class:`_Keeping` models (a task by reference for the ClientApp)."""
    task = build_task("toy", **params)
    build = task.build_model
    task.build_model = lambda: _Keeping(build())
    return task


def _evaluated(users: list[int]) -> dict:
    run_config = {
        P.RUN_TASK: f"{__name__}:keeping_task",
        P.RUN_TASK_PARAMS_JSON: json.dumps(TOY),
        P.RUN_DEVICE: "cpu",
    }
    nodes = {P.NODE_PARTITION_ID: 1, P.NODE_NUM_PARTITIONS: 3}
    context = Context(
        run_id=1, node_id=11, node_config=nodes, state=RecordDict(), run_config=run_config
    )
    arrays = ArrayRecord(keeping_task(**TOY).build_model().state_dict())
    config = ConfigRecord({P.USERS: users})
    message = delivered({P.ARRAYS_RECORD: arrays, P.CONFIG_RECORD: config}, "evaluate")
    return dict(app(message, context).content[P.EVAL_METRICS])


def test_5_evaluate_reports_each_user_without_the_users_before():
    alone = {user: _evaluated([user]) for user in (1, 4)}
    weighted = sum(alone[u][P.EVAL_ACCURACY] * alone[u][P.EVAL_NUM_EXAMPLES] for u in (1, 4))
    for order in ([1, 4], [4, 1]):
        both = _evaluated(order)  # before: [4, 1] reported accuracy 0.382, [1, 4] 0.5
        assert both[P.EVAL_NUM_EXAMPLES] == 34
        assert both[P.EVAL_ACCURACY] == pytest.approx(weighted / 34)


# -- finding 6: make_client_app names a device it cannot read when the app is made -------------


@pytest.mark.parametrize("device", [None, 5, True, "", "CPU", "meta"], ids=repr)
def test_6_make_client_app_refuses_what_is_no_device(device):
    with pytest.raises(ValueError, match=r"^device must be 'auto' or the name of a device"):
        make_client_app(task="toy", device=device)


def test_6_devices_are_taken_as_before():
    for device in ("auto", "cpu", "cpu:0", "cuda", "cuda:3", torch.device("cpu")):
        make_client_app(task="toy", device=device)  # whether the node has it: checked there


# -- finding 7: the wire's public functions name what is no record, mapping or message ----------


def _wire_calls():
    from fedprivopt.clients.messages import hosted_users, reply_task_error
    from fedprivopt.models.task import TaskError
    from fedprivopt.strategies.flower_arrays import arrays_to_flat, wire_preconditioner, wire_spec

    return {
        "read_updates None": (lambda: P.read_updates(None), "content"),
        "read_updates dict": (lambda: P.read_updates({"update/1": 1}), "content"),
        "task_params None": (lambda: P.task_params(None), "run_config"),
        "task_params list": (lambda: P.task_params([("task", "toy")]), "run_config"),
        "decode None": (lambda: P.decode_train_config(None), "record"),
        "private metrics None": (lambda: P.check_private_metrics(None), "record"),
        "hosted_users None": (lambda: hosted_users(None, 4), "context"),
        "task error str": (lambda: reply_task_error("m", TaskError("x")), "message"),
        "arrays_to_flat None": (lambda: arrays_to_flat(None), "record"),
        "arrays_to_flat dict": (lambda: arrays_to_flat({"w": torch.zeros(2)}), "record"),
        "preconditioner numpy": (lambda: wire_preconditioner(np.ones(3)), "preconditioner"),
        "wire_spec None": (lambda: wire_spec(None), "spec"),
    }


@pytest.mark.parametrize(
    "name",
    [
        "read_updates None",
        "read_updates dict",
        "task_params None",
        "task_params list",
        "decode None",
        "private metrics None",
        "hosted_users None",
        "task error str",
        "arrays_to_flat None",
        "arrays_to_flat dict",
        "preconditioner numpy",
        "wire_spec None",
    ],
)
def test_7_the_wires_functions_name_what_is_no_record_mapping_or_message(name):
    call, parameter = _wire_calls()[name]
    with pytest.raises(ValueError, match=f"^{parameter} must be"):
        call()


def test_7_an_update_key_that_is_no_string_is_no_update_key():
    assert P.parse_update_key(None) is None and P.parse_update_key(5) is None  # AttributeError
    assert P.parse_update_key("update/7") == 7


# -- finding 8: TrainMessage.read refuses a preconditioner fedprivopt's trainer refuses ----------

PRECONDITIONERS = {
    "one entry": np.ones(1, np.float32),
    "one short": np.ones(17, np.float32),
    "a zero": np.r_[np.zeros(1), np.ones(17)].astype(np.float32),
    "a NaN": np.r_[np.full(1, np.nan), np.ones(17)].astype(np.float32),
    "complex": np.ones(18, np.complex64),
}


def _with_preconditioner(p: np.ndarray):
    config = P.encode_train_config(users=[1], round_num=1, settings=SETTINGS)
    record = ArrayRecord({P.PRECONDITIONER_ARRAY: Array(p)})
    content = {P.CONFIG_RECORD: config, P.ARRAYS_RECORD: _model_arrays()}
    return delivered({**content, P.PRECONDITIONER_RECORD: record}, "train")


@pytest.mark.parametrize("name", sorted(PRECONDITIONERS))
def test_8_train_message_read_refuses_a_preconditioner_that_is_no_model_vector(name):
    message = _with_preconditioner(PRECONDITIONERS[name])
    with pytest.raises(ValueError, match=r"ArrayRecord 'preconditioner': array 'p' must hold 18 "):
        TrainMessage.read(message)  # before: read, and an app of one's own divided by it


def test_8_a_model_vector_of_any_real_dtype_is_read_as_before():
    for p in (np.full(18, 2.0, np.float32), np.ones(18), np.ones((18, 1), np.float16)):
        read = TrainMessage.read(_with_preconditioner(p))
        assert read.preconditioner.shape == (18,) and bool((read.preconditioner > 0).all())


# -- finding 9: a train config key in another spelling is refused, not ignored -----------------

SNAKE_KEYS = {
    "count_noise_std": 0.3,
    "clip_bit": True,
    "report_private_metrics": True,
    "noise_std": 0.2,
    "local_epochs": 3,
}


@pytest.mark.parametrize("key", sorted(SNAKE_KEYS))
def test_9_a_train_config_key_in_snake_case_is_refused(key):
    adaptive = P.ClientSettings(
        LocalConfig(learning_rate=0.5, clip_norm=1.0, clip_bit=True), seed=5
    )
    config = dict(P.encode_train_config(users=[1], round_num=1, settings=adaptive))
    if key.replace("_", "-") in (P.CLIP_BIT, P.COUNT_NOISE_STD, P.REPORT_PRIVATE_METRICS):
        config.pop(key.replace("_", "-"))  # optional: only the other spelling; else both given
    config[key] = SNAKE_KEYS[key]
    message = delivered(
        {P.CONFIG_RECORD: ConfigRecord(config), P.ARRAYS_RECORD: _model_arrays()}, "train"
    )
    spelled = key.replace("_", "-")
    with pytest.raises(ValueError, match=f"^train config key '{key}' is '{spelled}' in another"):
        app(message, _node())  # before: count_noise_std ignored, the exact clip bit sent


def test_9_other_unknown_keys_are_ignored_as_before():
    config = dict(P.encode_train_config(users=[1], round_num=1, settings=SETTINGS))
    config["future-key"] = 1
    config["x_y"] = 2
    assert P.decode_train_config(ConfigRecord(config)).users == (1,)


# -- finding 10: a reply's updates under unrequested keys are said in one warning ----------------


def test_10_a_replys_unrequested_keys_are_one_warning(server_side, caplog):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        (row,) = _run(_QueryGrid("by position"))
    said = [r.getMessage() for r in caplog.records if "unrequested key" in r.getMessage()]
    assert said == ["node 100 sent an update under an unrequested key 'update/1000' and 499 more"]
    assert row["unrequested"] == 500 and row["received"] == 4  # before: 500 warnings
