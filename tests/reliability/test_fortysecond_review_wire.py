"""Issue 15, forty-second hostile review (wire: Flower messages, replies, the ClientApp): tests.

1. ``wire.read_updates(reply.content)`` (the public reader of a train reply, for a ServerApp of
   one's own) of a reply whose ``update/1`` array ``delta`` is damaged or hostile: bytes cut
   short (empty), another serialization than NumPy's (``stype`` ``torch.Tensor``), an object
   array or bytes that are no ``.npy`` file; ``DPStrategy.start`` (``check_initial_arrays``) of
   an ``initial_arrays`` record holding such an array. Before: ``EOFError: No data left in
   file``, Flower's ``TypeError: Unsupported serialization type ...`` or NumPy's own
   ``ValueError`` (``read_updates``; ``check_initial_arrays`` wrapped only the last), naming
   neither the record nor the user, where ``ValueError`` is documented (the fortieth review's
   missing ``delta`` and the forty-first's ``TrainMessage.read`` were fixed, not these). Now
   ``ValueError`` naming the record, the user and the array (``wire._readable_array``), or
   ``initial_arrays`` (``flower_arrays.check_initial_arrays``).
2. A train message asking for the users' private metrics (``report-private-metrics`` true) in a
   private round: ``clip-norm`` 1 (with or without ``noise-std`` 0.2, distributed noise), or
   ``clip-bit`` true, or ``count-noise-std`` 0.3, a combination no fedprivopt server sends (it
   asks for them only in non-private runs, whose rounds have ``clip-norm`` and ``noise-std`` 0):
   a rogue or broken server. Before: fedprivopt's ClientApp (and ``clients.reply_updates`` of a
   ClientApp of one's own) sent every trained user's exact example count and training loss
   (``num-examples`` [27, 7], ``train-loss`` [0.95, 1.34]) beside their clipped updates: values
   of one user's data without noise, outside epsilon (DESIGN.md: nothing else leaves the device
   in DP mode). Now ``ValueError`` naming ``report-private-metrics`` and the key that makes the
   round private (``wire.check_private_metrics``, called by ``decode_train_config``, so by
   ``TrainMessage.read`` and the ClientApp, and by ``reply_updates``); a non-private round's
   metrics go back as before.
3. The functions of a ClientApp of one's own (``clients.messages``) given what is no message,
   mapping or state dict: ``TrainMessage.read("x")`` (or ``None``), ``reply_updates(None,
   ...)``, ``reply_updates(message, [update])`` (or ``None``), ``reply_users(query, None)``,
   ``TrainMessage.flatten(None)``, of a list of pairs or of a state holding a NumPy array.
   Before: ``AttributeError`` (``'str' object has no attribute 'content'``, ``'list' object has
   no attribute 'items'``, ``'numpy.ndarray' object has no attribute 'detach'``) or
   ``TypeError: 'NoneType' object is not iterable``, naming no parameter, where ``ValueError``
   naming it is documented. Now ``ValueError`` naming ``message``, ``updates``, ``users`` or
   ``state`` (``messages._content`` and the checks beside it).
4. ``privacy.received.Tally.arrive`` (what ``NoisyMeanAggregator.aggregate`` counts every entry
   with) of one ``RowSparseBatch`` whose users repeat one (a cohort code of one's own handing
   the aggregator a chunk with a user twice). Before: the repeated user was found by
   ``users.count(u)`` of each user in turn, quadratic: 35 s before the ``ValueError`` for a
   batch of 40,000 users repeating its last, about 15 minutes at 200,000. Now one pass
   (``collections.Counter``), the same error naming the same user. The test counts the scans
   of the list (no timing).
5. A Flower run config whose ``task-params-json`` names one task parameter in two spellings,
   ``{"num-users": 12, "num_users": 14}`` (``deploy local --set task-params-json=...``, ``flwr
   run --run-config``): read by ``wire.task_params`` for the ServerApp
   (``deploy.runconfig.run_config_from_flower``, ``deploy local``'s check) and every ClientApp.
   Before: the last spelling was taken without a word (14 users; the 12 the user also wrote
   dropped), where ``simulate`` refuses two spellings of one task parameter. Now ``ValueError``
   naming both keys (``wire._one_spelling``); the flattened ``task-params.<key>`` keys, where two
   spellings come from ``deploy local``'s merge of the app's ``num-users`` with a user's
   ``--set task-params.num_users`` (Flower refuses undeclared keys), keep the later one, the
   user's.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig
from fedprivopt.clients.client_app import app
from fedprivopt.clients.messages import TrainMessage, reply_updates, reply_users
from fedprivopt.models import build_task
from fedprivopt.privacy.flat import flatten
from fedprivopt.privacy.received import Tally
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower_arrays import check_initial_arrays
from tests.messages import delivered

TOY = {"num_users": 10, "dim": 5, "num_classes": 3, "seed": 2}
RUN_CONFIG = {P.RUN_TASK: "toy", P.RUN_TASK_PARAMS_JSON: json.dumps(TOY), P.RUN_DEVICE: "cpu"}


def _node() -> Context:
    """Node 1 of 3 of the toy task (users 1, 4, 7), as fedprivopt's ClientApp reads it."""
    nodes = {P.NODE_PARTITION_ID: 1, P.NODE_NUM_PARTITIONS: 3}
    return Context(
        run_id=1, node_id=11, node_config=nodes, state=RecordDict(), run_config=RUN_CONFIG
    )


def _toy_train(changes: dict, users=(1, 4)):
    """A toy train message (clip-norm 1, no noise) with ``changes`` to its config."""
    local = LocalConfig(learning_rate=0.5, clip_norm=1.0)
    settings = P.ClientSettings(local, seed=5)
    config = dict(P.encode_train_config(users=list(users), round_num=2, settings=settings))
    config.update(changes)
    state = build_task("toy", **TOY).build_model().state_dict()
    content = {P.CONFIG_RECORD: ConfigRecord(config), P.ARRAYS_RECORD: ArrayRecord(state)}
    return delivered(content, "train")


def _object_array() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.array([object()], dtype=object), allow_pickle=True)
    return buffer.getvalue()


# -- finding 1: a damaged array is one ValueError naming where it is ------------------------------

DAMAGED = {
    "cut": Array("float32", (3,), "numpy.ndarray", b""),
    "torch stype": Array("float32", (3,), "torch.Tensor", b"abc"),
    "object array": Array("object", (1,), "numpy.ndarray", _object_array()),
    "no npy file": Array("float32", (3,), "numpy.ndarray", b"garbage"),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_1_read_updates_names_the_record_of_a_damaged_delta(name):
    content = RecordDict({"update/1": ArrayRecord({P.DELTA_ARRAY: DAMAGED[name]})})
    with pytest.raises(ValueError, match=r"record 'update/1' \(user 1\): array 'delta' cannot be"):
        P.read_updates(content)


def test_1_read_updates_reads_a_good_reply_as_before():
    content = RecordDict({"update/2": ArrayRecord({P.DELTA_ARRAY: Array(np.ones(3, np.float32))})})
    ((user, delta),) = P.read_updates(content).items()
    assert user == 2 and delta.dtype == np.float32 and delta.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_1_initial_arrays_with_a_damaged_array_are_one_value_error(name):
    flat, spec = flatten({"w": torch.zeros(3)})
    algorithm = build_algorithm(StrategyConfig(population=4, clients_per_round=2), flat)
    with pytest.raises(ValueError, match=r"^initial_arrays: "):
        check_initial_arrays(ArrayRecord({"w": DAMAGED[name]}), spec, algorithm)


# -- finding 2: a private round never sends the users' example counts and losses ---------------

PRIVATE_ROUNDS = {
    "clip-norm": {},
    "distributed noise": {P.NOISE_STD: 0.2},
    "clip-bit": {P.CLIP_NORM: 0.0, P.CLIP_BIT: True},
    "count-noise-std": {P.CLIP_NORM: 0.0, P.COUNT_NOISE_STD: 0.3},
}


@pytest.mark.parametrize("name", sorted(PRIVATE_ROUNDS))
def test_2_the_client_app_refuses_private_metrics_in_a_private_round(name):
    changes = {**PRIVATE_ROUNDS[name], P.REPORT_PRIVATE_METRICS: True}
    with pytest.raises(ValueError, match="'report-private-metrics' is true in a private round"):
        app(_toy_train(changes), _node())


@pytest.mark.parametrize("name", sorted(PRIVATE_ROUNDS))
def test_2_reply_updates_refuses_them_too(name):
    message = _toy_train({**PRIVATE_ROUNDS[name], P.REPORT_PRIVATE_METRICS: True}, users=[1])
    with pytest.raises(ValueError, match="'report-private-metrics' is true in a private round"):
        reply_updates(
            message, {1: torch.zeros(18)}, clip_bits={1: 1.0}, num_examples=[27], losses=[0.95]
        )


def test_2_a_non_private_round_still_gets_them():
    changes = {P.CLIP_NORM: 0.0, P.REPORT_PRIVATE_METRICS: True}
    metrics = app(_toy_train(changes), _node()).content[P.TRAIN_METRICS]
    assert metrics[P.NUM_EXAMPLES] == [27, 7] and len(metrics[P.TRAIN_LOSS]) == 2
    private = app(_toy_train({}), _node()).content[P.TRAIN_METRICS]  # not asked: not sent
    assert set(private) == {P.USERS_TRAINED, P.USERS_REJECTED}


# -- finding 3: what is no message, mapping or state dict is named ------------------------------


def _calls():
    message = _toy_train({}, users=[1])
    query = delivered({P.QUERY_RECORD: ConfigRecord({P.OP: P.OP_USERS})}, "query")
    read = TrainMessage.read(message)
    state = build_task("toy", **TOY).build_model().state_dict()
    update = torch.zeros(18)
    return {
        "read str": (lambda: TrainMessage.read("x"), "message"),
        "read None": (lambda: TrainMessage.read(None), "message"),
        "reply to None": (lambda: reply_updates(None, {1: update}), "message"),
        "updates list": (lambda: reply_updates(message, [update]), "updates"),
        "updates None": (lambda: reply_updates(message, None), "updates"),
        "users None": (lambda: reply_users(query, None), "users"),
        "users of None": (lambda: reply_users(None, [1]), "message"),
        "state None": (lambda: read.flatten(None), "state"),
        "state pairs": (lambda: read.flatten(list(state.items())), "state"),
        "state numpy": (lambda: read.flatten({k: v.numpy() for k, v in state.items()}), "state"),
    }


@pytest.mark.parametrize(
    "name",
    [
        "read str",
        "read None",
        "reply to None",
        "updates list",
        "updates None",
        "users None",
        "users of None",
        "state None",
        "state pairs",
        "state numpy",
    ],
)
def test_3_a_client_apps_calls_name_what_is_not_a_message_mapping_or_state(name):
    call, parameter = _calls()[name]
    with pytest.raises(ValueError, match=f"^{parameter} must be"):
        call()


def test_3_the_same_calls_of_good_values_work_as_before():
    message = _toy_train({}, users=[1])
    read = TrainMessage.read(message)
    state = build_task("toy", **TOY).build_model().state_dict()
    assert torch.equal(read.flatten(state), read.global_flat)
    reply = reply_updates(message, {1: read.flatten(state) - read.global_flat})
    assert list(P.read_updates(reply.content)) == [1]
    query = delivered({P.QUERY_RECORD: ConfigRecord({P.OP: P.OP_USERS})}, "query")
    assert reply_users(query, (u for u in [4, 1])).content[P.USERS_RECORD][P.USER_IDS] == [4, 1]


# -- finding 4: a repeated user of a batch is found in one pass ----------------------------------


class _Scanned(list):
    """A list of user ids that counts the calls of ``count`` (one scan of the list each)."""

    scans = 0

    def count(self, value):
        self.scans += 1
        return super().count(value)


@pytest.mark.parametrize("users", [[*range(2000), 1999], [3, 5, 5, 3], [0, 0]])
def test_4_a_user_repeated_in_one_batch_is_found_without_a_scan_per_user(users):
    first = next(u for u in users if users.count(u) > 1)  # the user named before
    given = _Scanned(users)
    with pytest.raises(ValueError, match=f"updates: user {first} appears twice"):
        Tally().arrive(given)
    assert given.scans <= 1  # before: one scan of the list per user up to the repeated one


def test_4_distinct_users_arrive_as_before():
    tally = Tally()
    tally.arrive([2, 0, 1])
    with pytest.raises(ValueError, match="user 1 appears twice"):
        tally.arrive([5, 1])
    assert tally.received == 3 and tally.seen == {0, 1, 2}


# -- finding 5: one task parameter in two spellings of task-params-json is refused ---------------

TWO_SPELLINGS = {P.RUN_TASK: "toy", P.RUN_TASK_PARAMS_JSON: '{"num-users": 12, "num_users": 14}'}


def test_5_task_params_json_with_two_spellings_of_one_parameter_is_refused():
    from fedprivopt.deploy.runconfig import run_config_from_flower

    named = "task-params-json key 'num-users' and task-params-json key 'num_users' are both given"
    with pytest.raises(ValueError, match=named):
        P.task_params(TWO_SPELLINGS)
    with pytest.raises(ValueError, match=named):  # the ServerApp's reader, deploy local's check
        run_config_from_flower(TWO_SPELLINGS)
    query = delivered({P.QUERY_RECORD: ConfigRecord({P.OP: P.OP_USERS})}, "query")
    context = Context(1, 11, _node().node_config, RecordDict(), {**TWO_SPELLINGS})
    with pytest.raises(ValueError, match=named):  # every ClientApp
        app(query, context)


def test_5_one_spelling_and_the_merged_flat_keys_read_as_before():
    assert P.task_params({P.RUN_TASK_PARAMS_JSON: '{"num-users": 12, "seed": 1}'}) == {
        "num_users": 12,
        "seed": 1,
    }
    merged = {"task-params.num-users": 40, "task-params.num_users": 12}  # app's, then the user's
    assert P.task_params(merged) == {"num_users": 12}
