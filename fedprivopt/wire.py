"""The wire protocol between fedprivopt's Flower ServerApp (strategies) and ClientApp.

Both sides import the key names from here; the small encode/decode helpers keep the types on the
wire explicit. The train message's settings (:class:`ClientSettings`, :class:`TrainConfig`,
:func:`encode_train_config`, :func:`decode_train_config`, their checks and the config's key names)
are in :mod:`fedprivopt.wire_train`, re-exported here.

Users, not nodes
----------------
A node with ``partition-id`` ``p`` of ``num-partitions`` ``P`` hosts the users
``range(p, num_users, P)`` (:func:`hosted_users`); in simulation ``P = num_users``, so node ``p``
hosts exactly user ``p``.

Messages
--------
**query** (``message_type="query"``)
    content ``ConfigRecord`` :data:`QUERY_RECORD` ``{OP: OP_USERS}`` →
    reply ``MetricRecord`` :data:`USERS_RECORD` ``{USER_IDS: [int, ...]}``.
**train**
    content ``ArrayRecord`` :data:`ARRAYS_RECORD` (the global state dict), optional
    ``ArrayRecord`` :data:`PRECONDITIONER_RECORD` with one flat array
    :data:`PRECONDITIONER_ARRAY` (in its own dtype), ``ConfigRecord`` :data:`CONFIG_RECORD`
    (:func:`encode_train_config`) →
    reply: per trained user ``u`` an ``ArrayRecord`` ``update_key(u)`` with one flat array
    :data:`DELTA_ARRAY` in the dtype of the model as one vector (float64 if any entry is, else
    float32) (and, when :data:`CLIP_BIT` was true, a one-element float64
    array :data:`CLIP_BIT_ARRAY`: the user's clip bit, or in distributed-noise mode its noised
    centred share), and ``MetricRecord`` :data:`TRAIN_METRICS` with
    :data:`USERS_TRAINED` and :data:`USERS_REJECTED` (users not hosted by the node) and, only if
    :data:`REPORT_PRIVATE_METRICS` was true, the per-user lists :data:`NUM_EXAMPLES` and
    :data:`TRAIN_LOSS` (in the order of the trained users in the request).
**evaluate**
    content ``ArrayRecord`` :data:`ARRAYS_RECORD`, optional ``ConfigRecord`` :data:`CONFIG_RECORD`
    with :data:`USERS` (default: all hosted users) → reply ``MetricRecord``
    :data:`EVAL_METRICS` ``{EVAL_LOSS, EVAL_ACCURACY, EVAL_NUM_EXAMPLES}`` (example-weighted
    means over the users' training data; **not** covered by the DP guarantee).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fedprivopt.core.checks import check_int, refuse_repeated_keys
from fedprivopt.core.text import shown
from fedprivopt.wire_train import (  # the train message's settings, re-exported
    BATCH_SIZE,
    CLIP_BIT,
    CLIP_NORM,
    COUNT_NOISE_STD,
    LOCAL_EPOCHS,
    LOCAL_LEARNING_RATE,
    MAX_EXAMPLES,
    MAX_SEED,
    NOISE_STD,
    REPORT_PRIVATE_METRICS,
    REQUIRED_TRAIN_KEYS,
    ROUND,
    SECURE,
    SEED,
    STREAM,
    USERS,
    ClientSettings,
    TrainConfig,
    check_mapping,
    check_private_metrics,
    check_user_ids,
    decode_train_config,
    encode_train_config,
    other_spelling,
)

if TYPE_CHECKING:  # Flower is imported where a record is built, so the fast engine never loads it
    import numpy as np
    from flwr.app import RecordDict

__all__ = [
    "ARRAYS_RECORD",
    "BATCH_SIZE",
    "CLIP_BIT",
    "CLIP_BIT_ARRAY",
    "CLIP_NORM",
    "CONFIG_RECORD",
    "COUNT_NOISE_STD",
    "DELTA_ARRAY",
    "EVAL_ACCURACY",
    "EVAL_LOSS",
    "EVAL_METRICS",
    "EVAL_NUM_EXAMPLES",
    "LOCAL_EPOCHS",
    "LOCAL_LEARNING_RATE",
    "MAX_DELTA_HEADER",
    "MAX_EXAMPLES",
    "MAX_SEED",
    "NODE_NUM_PARTITIONS",
    "NODE_PARTITION_ID",
    "NOISE_STD",
    "NUM_EXAMPLES",
    "OP",
    "OP_USERS",
    "PRECONDITIONER_ARRAY",
    "PRECONDITIONER_RECORD",
    "QUERY_RECORD",
    "REPORT_PRIVATE_METRICS",
    "REQUIRED_TRAIN_KEYS",
    "ROUND",
    "RUN_DEVICE",
    "RUN_TASK",
    "RUN_TASK_PARAMS_JSON",
    "RUN_TASK_PARAMS_PREFIX",
    "SECURE",
    "SEED",
    "STREAM",
    "TRAIN_LOSS",
    "TRAIN_METRICS",
    "UPDATE_PREFIX",
    "USERS",
    "USERS_RECORD",
    "USERS_REJECTED",
    "USERS_TRAINED",
    "USER_IDS",
    "ClientSettings",
    "TrainConfig",
    "check_private_metrics",
    "check_user_ids",
    "decode_train_config",
    "encode_train_config",
    "hosted_users",
    "json_object",
    "long_npy_header",
    "other_spelling",
    "parse_update_key",
    "read_updates",
    "read_user_ids",
    "snake_case_params",
    "task_params",
    "update_key",
    "users_query",
]

# --- run config (context.run_config, i.e. [tool.flwr.app.config]) --------------------------------
# The app's own keys ([tool.flwr.app.config] in pyproject.toml), read by ServerApp and ClientApp.
RUN_TASK = "task"  #: task name for fedprivopt.models.build_task
#: prefix of the task's parameters: Flower flattens the app's [task-params] table into these
RUN_TASK_PARAMS_PREFIX = "task-params."
#: a JSON object of the task's parameters; when not empty it replaces the task-params.<k> keys
RUN_TASK_PARAMS_JSON = "task-params-json"
RUN_DEVICE = "device"  #: optional: "auto" (default), "cpu", "cuda", "cuda:1", ...

# --- node config (set by Flower simulation; --node-config in deployment) -------------------------
NODE_PARTITION_ID = "partition-id"
NODE_NUM_PARTITIONS = "num-partitions"

# --- query ---------------------------------------------------------------------------------------
QUERY_RECORD = "fedprivopt"
OP = "op"
OP_USERS = "users"
USERS_RECORD = "users"
USER_IDS = "user-ids"

# --- train (and evaluate) request ----------------------------------------------------------------
ARRAYS_RECORD = "arrays"
PRECONDITIONER_RECORD = "preconditioner"
PRECONDITIONER_ARRAY = "p"
CONFIG_RECORD = "config"
# the train config's keys (USERS ... COUNT_NOISE_STD) are in fedprivopt.wire_train

# --- train reply ---------------------------------------------------------------------------------
UPDATE_PREFIX = "update/"
DELTA_ARRAY = "delta"
CLIP_BIT_ARRAY = "clip-bit"  #: one float64: the bit [‖Δ‖ ≤ C], or its noised centred share
TRAIN_METRICS = "train-metrics"
USERS_TRAINED = "users-trained"
USERS_REJECTED = "users-rejected"
NUM_EXAMPLES = "num-examples"  #: private, only with REPORT_PRIVATE_METRICS
TRAIN_LOSS = "train-loss"  #: private, only with REPORT_PRIVATE_METRICS

# --- evaluate reply ------------------------------------------------------------------------------
EVAL_METRICS = "eval-metrics"
EVAL_LOSS = "eval-loss"
EVAL_ACCURACY = "eval-accuracy"
EVAL_NUM_EXAMPLES = "num-examples"


def update_key(user_id: int) -> str:
    """Record key of ``user_id``'s update in a train reply: ``"update/<user_id>"``.

    ``user_id`` is an integer ``>= 0`` (numpy's too), else ``ValueError`` naming it
    (thirty-first review of issue 15: 1.5, ``True`` and ``"1"`` became ``update/1``, -1
    ``update/-1``, which :func:`parse_update_key` refuses).
    """
    return f"{UPDATE_PREFIX}{check_int('user_id', user_id, 0)}"


#: Most digits of a user id in an update key (a task's ids are below 2**63).
MAX_USER_DIGITS = 19


def parse_update_key(key: str) -> int | None:
    """Return the user id of an update key, or ``None`` if ``key`` is not one.

    Only the canonical form :func:`update_key` writes is one: ASCII digits without leading
    zeros, so no two keys of a reply name the same user (``update/01`` and ``update/²`` are not
    update keys), and at most :data:`MAX_USER_DIGITS` of them (twenty-ninth review of issue 15:
    a reply's key of 4,301 digits or more raised ``int()``'s "Exceeds the limit (4300 digits)"
    ``ValueError`` out of the strategy's ``aggregate_train``, ending the ServerApp).
    """
    if not isinstance(key, str) or not key.startswith(UPDATE_PREFIX):  # (43rd review, wire 7)
        return None
    rest = key[len(UPDATE_PREFIX) :]
    if not (rest.isascii() and rest.isdigit()) or (rest[0] == "0" and rest != "0"):
        return None
    if len(rest) > MAX_USER_DIGITS:  # no user id of a task is this long
        return None
    return int(rest)


def json_object(key: str, raw: object) -> dict:
    """The JSON object in the run-config value ``raw`` of ``key``, or ``ValueError`` naming it.

    A repeated key is an error (as in TOML), and so is nesting too deep for the parser.
    """
    import json

    from fedprivopt.core.text import shown

    unique = refuse_repeated_keys(lambda name: f"{key} repeats the key {shown(name)}")
    try:
        value = json.loads(str(raw), object_pairs_hook=unique)
    except json.JSONDecodeError as err:
        raise ValueError(f"{key} must be a JSON object: {err}") from None
    except RecursionError:
        raise ValueError(f"{key} must be a JSON object, nested too deeply to read") from None
    except ValueError as err:
        if str(err).startswith(f"{key} repeats"):
            raise
        # eighteenth review of issue 15, finding 3: an integer of over 4,300 digits raised
        # Python's own ValueError ("Exceeds the limit ..."), which named no key
        raise ValueError(f"{key} must be a JSON object of readable values: {err}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{key} must be a JSON object, got {shown(str(raw))}")
    return value


def task_params(run_config: Mapping[str, object]) -> dict[str, object]:
    """The task's keyword parameters (snake_case) from a Flower run config.

    :data:`RUN_TASK_PARAMS_JSON` when it is set and not empty, else the
    :data:`RUN_TASK_PARAMS_PREFIX` keys Flower flattens the app's ``[task-params]`` table into.

    Raises
    ------
    ValueError
        If :data:`RUN_TASK_PARAMS_JSON` is not a JSON object, or names one parameter in two
        spellings (``{"num-users": 6, "num_users": 8}``: forty-second review of issue 15, wire 5;
        the last one was taken without a word, where ``simulate`` refuses two spellings).
    """
    check_mapping("run_config", run_config)
    raw = run_config.get(RUN_TASK_PARAMS_JSON, "")
    if raw not in ("", None):
        return snake_case_params(RUN_TASK_PARAMS_JSON, json_object(RUN_TASK_PARAMS_JSON, raw))
    # two spellings here come from a merge of the app's keys and a user's (deploy local's
    # --set task-params.num_users over num-users; Flower refuses keys the app does not declare):
    # the later one is the user's
    return {
        key[len(RUN_TASK_PARAMS_PREFIX) :].replace("-", "_"): value
        for key, value in run_config.items()
        if key.startswith(RUN_TASK_PARAMS_PREFIX)
    }


def snake_case_params(where: str, params: Mapping[object, object]) -> dict[str, object]:
    """``params`` as ``{snake_case name: value}``: a task's keyword parameters.

    ``where`` names them in errors (``task-params-json``, a ClientApp's ``task_params``).

    Raises
    ------
    ValueError
        For a key that is no string, or one task parameter in two spellings
        (``num-users`` and ``num_users``: forty-second review of issue 15, wire 5, for the run
        config's ``task-params-json``; the forty-third, wire 2, for ``make_client_app``).
    """
    out: dict[str, object] = {}
    spelled: dict[str, str] = {}
    for key, value in params.items():
        if not isinstance(key, str):
            raise ValueError(f"{where} keys must be parameter names (strings), got {shown(key)}")
        name = key.replace("-", "_")
        if name in out:
            raise ValueError(
                f"{where} key {shown(spelled[name])} and {where} key {shown(key)} are both "
                "given: one task parameter in two spellings; give one"
            )
        out[name], spelled[name] = value, key
    return out


def hosted_users(partition_id: int, num_partitions: int, num_users: int) -> list[int]:
    """Users hosted by node ``partition_id`` of ``num_partitions``: ``range(p, N, P)``.

    Both are integers (twenty-fifth review of issue 15, finding 13: a SuperNode started with
    ``--node-config "partition-id=1.9 num-partitions=2.5"`` hosted partition 1 of 2, through
    ``int()``, and ``"1"`` was parsed).
    """
    n_parts = check_int(NODE_NUM_PARTITIONS, num_partitions, 1)
    p = check_int(NODE_PARTITION_ID, partition_id, 0, n_parts - 1)
    return list(range(p, check_int("num_users", num_users, 0), n_parts))


def users_query() -> RecordDict:
    """Content of a query message asking a node which users it hosts."""
    from flwr.app import ConfigRecord, RecordDict

    return RecordDict({QUERY_RECORD: ConfigRecord({OP: OP_USERS})})


def read_user_ids(content: RecordDict) -> list[int]:
    """User ids from the content of a reply to :func:`users_query`.

    Raises
    ------
    ValueError
        Unless the content holds a record :data:`USERS_RECORD` with :data:`USER_IDS`, a list of
        distinct integers ``>= 0`` (twenty-ninth review of issue 15: a reply without the record
        raised ``KeyError`` out of the strategy's user discovery, NaN and ``"a"`` a
        ``ValueError`` from ``int()``, a repeated id "user 0 is hosted by two nodes", while
        ``[0.5, 1.7]``, ``[True, False]``, ``["3"]`` and ``b"abc"`` (users 97, 98, 99) were
        taken as user ids).
    """
    record = content.get(USERS_RECORD) if hasattr(content, "get") else None
    if record is None or not hasattr(record, "get"):
        raise ValueError(f"the reply has no record {USERS_RECORD!r}")
    return list(check_user_ids(f"{USERS_RECORD}.{USER_IDS}", record.get(USER_IDS)))


def read_updates(content: RecordDict) -> dict[int, np.ndarray]:
    """Map user id → flat delta (as sent) from the content of a train reply.

    Raises
    ------
    ValueError
        Naming the record of an update that holds no :data:`DELTA_ARRAY` (fortieth review of
        issue 15, mechanisms 7: ``KeyError: 'delta'``, naming neither the record nor the user),
        or whose :data:`DELTA_ARRAY` cannot be read as a NumPy array (forty-second review, wire
        1: bytes cut short, another serialization than NumPy's or an object array raised
        ``EOFError``, ``TypeError`` or NumPy's own ``ValueError``, naming neither), or whose
        record under an update key is no ``ArrayRecord`` (forty-sixth review, wire 5: skipped).
    """
    if not hasattr(content, "array_records"):  # forty-third review (wire 7): AttributeError
        raise ValueError(f"content must be a reply's RecordDict, got {shown(content)}")
    from flwr.app import ArrayRecord

    out: dict[int, np.ndarray] = {}
    for key, record in content.items():  # records of every kind (forty-sixth review, wire 5)
        user = parse_update_key(key)
        if user is None:
            continue
        where = f"the train reply's record {shown(key)} (user {user})"
        if not isinstance(record, ArrayRecord):  # was skipped: the user's update not read
            raise ValueError(f"{where} must be an ArrayRecord, got a {type(record).__name__}")
        if DELTA_ARRAY not in record:
            raise ValueError(
                f"{where} holds no array {DELTA_ARRAY!r}, got {shown(sorted(record.keys()))}"
            )
        said = f"{where}: array {DELTA_ARRAY!r}"
        header = long_npy_header(record[DELTA_ARRAY])  # not parsed (forty-fifth review, wire 5)
        if header is not None:
            raise ValueError(f"{said} cannot be read as a NumPy array: {header}")
        out[user] = _readable_array(record[DELTA_ARRAY], said)
    return out


MAX_DELTA_HEADER = 1024
"""Most bytes of the ``.npy`` header of an update's delta that the server parses.

A flat array's header is 128 bytes (NumPy pads it to 64); ``np.load`` parses one of up to
10,000 with Python's tokenizer. Forty-fifth review of issue 15 (wire 5): 200 updates whose
forged headers held 10,000 characters took the server 27 s to refuse (0.13 s each, on 2 busy
cores), a round of a rogue node's 10,000 such updates about 20 minutes.
"""


def long_npy_header(array: object) -> str | None:
    """Why a reply's ``array`` is not parsed: a ``.npy`` header above :data:`MAX_DELTA_HEADER`.

    ``None`` for any other array (NumPy reads or refuses it). A flat delta's or a clip bit's
    header is 128 bytes; :class:`~fedprivopt.strategies.flower.DPStrategy` and
    :func:`read_updates` call this before ``Array.numpy()``.
    """
    data = getattr(array, "data", None)
    if not isinstance(data, bytes) or not data.startswith(b"\x93NUMPY") or len(data) < 12:
        return None
    width = 2 if data[6] == 1 else 4  # format 1.0: a 2-byte length; 2.0 and 3.0: 4 bytes
    length = int.from_bytes(data[8 : 8 + width], "little")
    if length <= MAX_DELTA_HEADER:
        return None
    return (
        f"its .npy header holds {length} bytes, more than the {MAX_DELTA_HEADER} of a flat "
        "array's (not parsed)"
    )


def _readable_array(array: object, where: str) -> np.ndarray:
    """``array.numpy()`` of a Flower ``Array``, or ``ValueError`` saying ``where`` it is."""
    try:
        return array.numpy()
    except (TypeError, ValueError, EOFError) as err:
        raise ValueError(f"{where} cannot be read as a NumPy array: {shown(str(err))}") from None
