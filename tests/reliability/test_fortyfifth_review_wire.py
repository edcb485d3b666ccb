"""Issue 15, forty-fifth hostile review (wire: Flower messages, replies, the ClientApp): tests.

1. fedprivopt's ClientApp (node 1 of 3, toy; ``wire.decode_train_config``, every ClientApp's
   reader of a train config) given a distributed adaptive-clipping train config whose
   ``count-noise-std`` 0.3 is written in another case or with other separators:
   ``Count-Noise-Std``, ``countNoiseStd``, ``COUNT_NOISE_STD``, ``count noise std`` or
   ``count-noise-std `` (a ServerApp of one's own writing the config by hand). Before: the key
   was ignored and its default 0 used, so the node sent each user's exact clip bit (``[1.0,
   1.0]``) where a noised centred share was meant (``[0.51, 0.91]``): one unnoised bit of each
   user a round, outside epsilon (the forty-third review, wire 9, refused snake_case only). Now
   ``ValueError: train config key 'countNoiseStd' is 'count-noise-std' in another spelling``
   (``wire_train.decode_train_config``, by the key's letters and digits in lower case); keys
   that spell no known key are ignored as before.
2. ``wire.decode_train_config`` (every ClientApp's reader of a train config) with
   ``local-learning-rate`` 0, -1 or 1e300, ``local-epochs`` 10,001 or ``count-noise-std`` 1e101
   (a ServerApp of one's own). Before: taken by the keys' own checks and refused by
   ``LocalConfig`` as ``learning_rate must be a finite number in (0, 3.40282e+38], got 0.0``
   (``epochs``, ``count_noise_std`` alike), naming no key of the config (the forty-fourth
   review, wire 4, fixed the seed's, said to be the one such key). Now ``train config
   'local-learning-rate' must be a finite number in (0, 3.40282e+38], got 0.0`` and so on
   (``LocalConfig``'s ranges, the key named); the largest values taken as before.
3. Python API of a ServerApp of one's own: ``strategies.flower.arrays_to_flat(record)`` (the
   documented way to get the flat model and its spec from an ``ArrayRecord``) of a record whose
   array is big-endian (``>f4``: a model saved on another machine), cut short, of ``stype``
   ``torch.Tensor`` or of strings. Before: ``record.to_torch_state_dict()`` raised torch's
   ``ValueError: given numpy array has byte order different from the native byte order``,
   NumPy's ``EOF: reading array data``, or Flower's or torch's ``TypeError``, naming no array
   (the forty-second review, wire 1, fixed ``read_updates`` and ``check_initial_arrays``, the
   forty-third, wire 3, the ClientApp's ``read_model``). Now ``ValueError: record: array 'w'
   cannot be read as a tensor: ...`` (``flower_arrays.arrays_to_flat``); a native record flattens
   as before.
4. fedprivopt's ClientApp (node 1 of 3, toy: users 1, 4, 7) given an evaluate message whose
   config names users ``[4]`` under ``Users`` (or whose ConfigRecord is ``Config``), and a train
   message (``TrainMessage.read``, a ClientApp of one's own too) whose preconditioner record is
   ``Preconditioner`` (a ServerApp of one's own writing them by hand; the forty-third review,
   wire 9, and finding 1 refuse a train config's key so). Before: ignored: the evaluate reply
   held the metrics of all three hosted users (39 examples) where the server named user 4 (7),
   and DP2's or AdaDPS' clients trained without their preconditioner, an update of another
   model than the server's step assumes. Now ``ValueError: evaluate message's config key 'Users'
   is 'users' in another spelling`` (``client_app._known_spellings``) and ``train message's
   ArrayRecord 'Preconditioner' is 'preconditioner' in another spelling``
   (``TrainMessage.read``), with ``wire.other_spelling`` (public, the check of finding 1);
   exact names as before.
5. ``DPStrategy`` in process (a grid of one's own) given a train reply of node 100 whose 200
   updates each hold a forged ``.npy`` header of 10,000 characters (a rogue or broken node).
   Before: ``np.load`` parsed every header with Python's tokenizer (0.13 s each on 2 busy
   cores: 27 s for the reply, about 20 minutes for a round of 10,000 such updates), and said
   each in a warning holding NumPy's ``Cannot parse header: ...`` with the header whole: 200
   lines and 2.0 MB of log for the reply, every round (the forty-third review, wire 10, made a
   reply's unrequested keys one warning). Now a delta whose header holds more than
   ``MAX_DELTA_HEADER`` (1,024) bytes is not parsed (a flat array's holds 128), and a reply's
   undecodable updates are one warning, ``node 100: undecodable update of user 0 and 199 more:
   its .npy header holds 9991 bytes ...``, the reason cut (``flower_replies._long_header``,
   ``ReplyCollection._said_undecodable``); each is still rejected and counted (``received``
   200, ``accepted`` 0); the test takes 1 s where it took 27. A clip bit (adaptive clipping)
   with such a header beside a valid delta is not parsed either: the reply is rejected for
   its bit, as one NumPy refuses; ``wire.read_updates`` (a ServerApp of one's own) refuses
   such a delta without parsing it (``wire.long_npy_header``, ``wire.MAX_DELTA_HEADER``).
6. ``DPStrategy.discover_users`` (in process) where node 101 answers the user query with its
   users 2 and 3 and 3,000,000 ids outside the population of 4 (a rogue or misconfigured node).
   Before: every id was kept in ``user_nodes`` (3,000,004 entries, about 240 MB held for the
   whole run, and walked every round of a tree run), though no id outside the population is
   ever sampled. Now only the population's users are kept (``UserDiscovery._read_users``): 4
   entries; the test answers with 1,000 such ids. A node hosting none of the population is
   said as before (``none of the connected nodes hosts a user of the population``).
7. ``clients.reply_updates(message, {5: u})`` (a ClientApp of one's own) for a train message
   that names no users: no ConfigRecord ``config`` (a plain Flower strategy's train message), a
   config without ``users``, or ``users`` ``[1.5]``. Before: user 5's update was sent (the
   check of the asked users, forty-first review, wire 1, ran only where the message holds a
   valid list), so an app training every hosted user sent unsampled users' updates. Now
   ``ValueError: updates[5]: the message names no users ...`` (``replies._Asked.check``); a
   message naming users is answered as before, and a reply of no update is still built.

The tests run fedprivopt's ClientApp and DPStrategy in process (no Flower engine, no Ray).
"""

from __future__ import annotations

import json
import logging
import struct
import uuid

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig, TrainMessage
from fedprivopt.clients.client_app import app
from fedprivopt.clients.messages import reply_updates
from fedprivopt.models import build_task
from fedprivopt.privacy.flat import flatten
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy, arrays_to_flat, flat_to_arrays
from tests.messages import delivered, reply_metadata

TOY = {"num_users": 10, "dim": 5, "num_classes": 3, "seed": 2}
SETTINGS = P.ClientSettings(LocalConfig(learning_rate=0.5, clip_norm=1.0, noise_std=0.2), seed=5)
ADAPTIVE = P.ClientSettings(
    LocalConfig(
        learning_rate=0.5, clip_norm=1.0, noise_std=0.2, clip_bit=True, count_noise_std=0.3
    ),
    seed=5,
)


def _node() -> Context:
    """Node 1 of 3 of the toy task (users 1, 4, 7), as fedprivopt's ClientApp reads it."""
    run_config = {P.RUN_TASK: "toy", P.RUN_TASK_PARAMS_JSON: json.dumps(TOY), P.RUN_DEVICE: "cpu"}
    nodes = {P.NODE_PARTITION_ID: 1, P.NODE_NUM_PARTITIONS: 3}
    return Context(
        run_id=1, node_id=11, node_config=nodes, state=RecordDict(), run_config=run_config
    )


def _model_arrays() -> ArrayRecord:
    state = build_task("toy", **TOY).build_model().state_dict()
    return ArrayRecord({k: Array(v.numpy()) for k, v in state.items()})


def _train(config: dict, **records) -> object:
    content = {P.CONFIG_RECORD: ConfigRecord(config), P.ARRAYS_RECORD: _model_arrays(), **records}
    return app(delivered(content, "train"), _node())


# -- finding 1: a train config key in another case or with other separators is refused ----------

SPELLINGS = ["Count-Noise-Std", "countNoiseStd", "COUNT_NOISE_STD", "count noise std",
             "count-noise-std "]  # fmt: skip


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_1_count_noise_std_in_another_case_or_separators_is_refused(spelling):
    config = dict(P.encode_train_config(users=[1, 4], round_num=1, settings=ADAPTIVE))
    config[spelling] = config.pop(P.COUNT_NOISE_STD)
    said = f"^train config key '{spelling}' is 'count-noise-std' in another spelling"
    with pytest.raises(ValueError, match=said):
        _train(config)  # before: ignored, each user's exact clip bit 1.0 sent


def test_1_the_known_spelling_sends_noised_shares_and_other_keys_are_ignored():
    config = dict(P.encode_train_config(users=[1, 4], round_num=1, settings=ADAPTIVE))
    config["future-key"] = 1
    config["Clip-Norms"] = 2.0  # no known key's spelling
    reply = _train(config)
    bits = [reply.content[f"update/{u}"][P.CLIP_BIT_ARRAY].numpy()[0] for u in (1, 4)]
    assert all(b not in (0.0, 1.0) for b in bits)  # noised centred shares


# -- finding 2: every train config key out of LocalConfig's range is named as the key ------------

OUT_OF_RANGE = {
    P.LOCAL_LEARNING_RATE: [0.0, -1.0, 1e300],
    P.LOCAL_EPOCHS: [10_001],
    P.COUNT_NOISE_STD: [1e101],
}


@pytest.mark.parametrize(
    ("key", "value"), [(k, v) for k, values in OUT_OF_RANGE.items() for v in values]
)
def test_2_a_value_out_of_local_configs_range_names_the_train_config_key(key, value):
    config = dict(P.encode_train_config(users=[1], round_num=1, settings=ADAPTIVE))
    config[key] = value
    with pytest.raises(ValueError, match=f"^train config '{key}' must be"):
        P.decode_train_config(config)  # before: "learning_rate must be ...", naming no key


def test_2_the_largest_values_are_taken_as_before():
    config = dict(P.encode_train_config(users=[1], round_num=1, settings=ADAPTIVE))
    config.update({P.LOCAL_LEARNING_RATE: 3.4028234663852886e38, P.LOCAL_EPOCHS: 10_000})
    config[P.COUNT_NOISE_STD] = 1e100
    local = P.decode_train_config(config).settings.local
    assert (local.epochs, local.count_noise_std) == (10_000, 1e100)


# -- finding 3: arrays_to_flat names an array it cannot read -------------------------------------


def _cut() -> Array:
    array = Array(np.ones(3, np.float32))
    array.data = array.data[:-4]
    return array


def _torch_stype() -> Array:
    array = Array(np.ones(3, np.float32))
    array.stype = "torch.Tensor"
    return array


UNREADABLE = {
    "big-endian": lambda: Array(np.ones(3, ">f4")),
    "cut short": _cut,
    "torch stype": _torch_stype,
    "strings": lambda: Array(np.array(["a", "b"])),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_3_arrays_to_flat_names_an_array_it_cannot_read(case):
    record = ArrayRecord({"w": UNREADABLE[case](), "b": Array(np.zeros(2, np.float32))})
    with pytest.raises(ValueError, match=r"^record: array 'w' cannot be read as a tensor: "):
        arrays_to_flat(record)  # before: torch's, NumPy's or Flower's error, naming no array


def test_3_a_native_record_flattens_as_before():
    flat, spec = arrays_to_flat(_model_arrays())
    state = build_task("toy", **TOY).build_model().state_dict()
    assert spec.names == tuple(state) and torch.equal(
        flat, torch.cat([v.reshape(-1) for v in state.values()])
    )


# -- finding 4: an evaluate config or a train message's record in another spelling is refused ---


def _evaluate(config_name: str, key: str) -> object:
    content = {P.ARRAYS_RECORD: _model_arrays(), config_name: ConfigRecord({key: [4]})}
    return app(delivered(content, "evaluate"), _node())


@pytest.mark.parametrize(("record", "key"), [("config", "Users"), ("Config", "users")])
def test_4_an_evaluate_config_in_another_spelling_is_refused(record, key):
    wrong = key if key != "users" else record
    with pytest.raises(ValueError, match=f"^evaluate message's .* '{wrong}' is '{wrong.lower()}'"):
        _evaluate(record, key)  # before: every hosted user evaluated (39 examples, not 7)


def test_4_the_users_named_are_evaluated_as_before():
    metrics = _evaluate("config", "users").content[P.EVAL_METRICS]
    (x, _), all_hosted = build_task("toy", **TOY).user_data(4), _evaluate("x", "y")
    assert (
        metrics[P.EVAL_NUM_EXAMPLES]
        == x.shape[0]
        < all_hosted.content[P.EVAL_METRICS][P.EVAL_NUM_EXAMPLES]
    )


def test_4_a_preconditioner_record_in_another_spelling_is_refused():
    config = dict(P.encode_train_config(users=[1], round_num=1, settings=SETTINGS))
    p = ArrayRecord({P.PRECONDITIONER_ARRAY: Array(np.full(18, 2.0, np.float32))})
    said = "^train message's ArrayRecord 'Preconditioner' is 'preconditioner' in another spelling"
    with pytest.raises(ValueError, match=said):
        _train(config, Preconditioner=p)  # before: ignored, trained without it
    assert not _train(config, preconditioner=p).has_error()


# -- finding 5: a reply's undecodable updates are said in one warning, cut -----------------------


def _forged() -> Array:
    """A float32 delta of 3 entries whose ``.npy`` header is 10,000 characters NumPy refuses."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), " + "'x" * 4000 + "}"
    header = header.ljust(9990) + "\n"
    array = Array(np.ones(3, np.float32))
    array.data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode()
    return array


class _ForgingGrid:
    """Node 100 hosts users 0-199 and answers every train message with forged updates."""

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
                    {P.update_key(u): ArrayRecord({P.DELTA_ARRAY: _forged()}) for u in users}
                )
            replies.append(Message(content, metadata=reply_metadata(msg, 100)))
        return replies


def test_5_a_replys_undecodable_updates_are_one_warning_cut(server_side, caplog):
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
        strategy.start(_ForgingGrid(), flat_to_arrays(flat, spec), 1, timeout=1.0)
    said = [r.getMessage() for r in caplog.records if "undecodable" in r.getMessage()]
    assert len(said) == 1 and len(said[0]) < 300  # before: 200 lines of 10,000+ characters
    assert said[0].startswith("node 100: undecodable update of user 0 and 199 more: ")
    assert "its .npy header holds 9991 bytes" in said[0]  # not parsed
    assert rows[0]["received"] == 200 and rows[0]["accepted"] == 0


class _ForgedBitGrid(_ForgingGrid):
    """Node 100 answers with valid deltas, each beside a clip bit of a forged header."""

    def send_and_receive(self, messages, *, timeout=None):
        replies = super().send_and_receive(messages, timeout=timeout)
        for reply in replies:
            for key in list(reply.content.array_records):
                delta = Array(np.full(3, 0.01, np.float32))
                reply.content[key] = ArrayRecord(
                    {P.DELTA_ARRAY: delta, P.CLIP_BIT_ARRAY: _forged()}
                )
        return replies


def test_5_a_clip_bit_of_a_long_header_is_not_parsed(server_side, monkeypatch):
    parsed = []
    load = np.load

    def counting(file, *args, **kwargs):  # the headers np.load is given to parse
        parsed.append(int.from_bytes(file.getvalue()[8:10], "little"))
        return load(file, *args, **kwargs)

    monkeypatch.setattr(np, "load", counting)
    config = StrategyConfig.from_mapping(
        {
            "population": 20,
            "clients-per-round": 20,
            "noise-multiplier": 0.8,
            "clip-norm": 0.5,
            "adaptive-clipping": True,
        }
    )
    flat, spec = flatten({"w": torch.zeros(3)})
    rows: list[dict] = []
    strategy = DPStrategy(
        build_algorithm(config, flat),
        spec,
        node_wait=0.0,
        on_round=lambda r, _: rows.append(r.metrics),
    )
    strategy.start(_ForgedBitGrid(), flat_to_arrays(flat, spec), 1, timeout=1.0)
    assert parsed and max(parsed) <= 1024  # before: 20 headers of 9,991 bytes parsed
    assert rows[0]["received"] == 20 and rows[0]["accepted"] == 0


def test_5_read_updates_refuses_a_long_header_unparsed():
    content = RecordDict({"update/1": ArrayRecord({P.DELTA_ARRAY: _forged()})})
    said = r"^the train reply's record 'update/1' \(user 1\): array 'delta' cannot be read as a"
    with pytest.raises(ValueError, match=said + " NumPy array: its .npy header holds 9991 bytes"):
        P.read_updates(content)  # before: parsed (0.13 s), NumPy's "Cannot parse header"
    valid = RecordDict({"update/1": ArrayRecord({P.DELTA_ARRAY: Array(np.ones(3, np.float32))})})
    assert P.read_updates(valid)[1].tolist() == [1.0, 1.0, 1.0]


# -- finding 6: user ids outside the population are not kept --------------------------------------


class _ManyIdsGrid:
    """Node 100 hosts users 0 and 1; node 101 users 2, 3 and 1,000 ids outside the population."""

    def get_node_ids(self):
        return [100, 101]

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # as a grid pushes it
            node = msg.metadata.dst_node_id
            ids = [0, 1] if node == 100 else [2, 3, *range(10**6, 10**6 + 1000)]
            content = RecordDict({P.USERS_RECORD: ConfigRecord({P.USER_IDS: ids})})
            replies.append(Message(content, metadata=reply_metadata(msg, node)))
        return replies


def test_6_user_ids_outside_the_population_are_not_kept(server_side):
    config = StrategyConfig(population=4, clients_per_round=4, noise_multiplier=0.8, seed=5)
    flat, spec = flatten({"w": torch.zeros(3)})
    strategy = DPStrategy(build_algorithm(config, flat), spec, node_wait=0.0)
    mapping = strategy.discover_users(_ManyIdsGrid())  # before: 1,004 entries
    assert mapping == strategy.user_nodes == {0: 100, 1: 100, 2: 101, 3: 101}


# -- finding 7: reply_updates sends no update for a message that names no users ------------------

NO_USERS = {
    "no config": {},
    "no users": {P.CONFIG_RECORD: ConfigRecord({P.ROUND: 1})},
    "users [1.5]": {P.CONFIG_RECORD: ConfigRecord({P.USERS: [1.5]})},
}


@pytest.mark.parametrize("case", sorted(NO_USERS))
def test_7_no_update_is_sent_for_a_message_naming_no_users(case):
    message = delivered({P.ARRAYS_RECORD: _model_arrays(), **NO_USERS[case]}, "train")
    with pytest.raises(ValueError, match=r"^updates\[5\]: the message names no users"):
        reply_updates(message, {5: torch.full((18,), 0.01)})  # before: update/5 sent
    assert list(reply_updates(message, {}).content.array_records) == []


def test_7_a_message_naming_users_is_answered_as_before():
    config = P.encode_train_config(users=[5], round_num=1, settings=SETTINGS)
    message = delivered({P.ARRAYS_RECORD: _model_arrays(), P.CONFIG_RECORD: config}, "train")
    vector = TrainMessage.read(message).privatize(torch.full((18,), 0.01), 5).vector  # noise-std
    assert "update/5" in reply_updates(message, {5: vector}).content
