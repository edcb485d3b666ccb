"""The train message's settings: its config keys, :class:`ClientSettings` and their encoding.

:class:`ClientSettings` (what the server tells every client of a request about how to train),
:class:`TrainConfig` (a decoded train config), :func:`encode_train_config` /
:func:`decode_train_config` (the ``ConfigRecord`` :data:`~fedprivopt.wire.CONFIG_RECORD` of a
train message) and their checks (:func:`check_private_metrics`, :func:`check_user_ids`,
:func:`check_mapping`), with the config's key names. Split from :mod:`fedprivopt.wire`, which
re-exports every name here and documents the messages.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedprivopt.core.checks import check_bool, check_int, check_real
from fedprivopt.core.local import MAX_COUNT_NOISE_STD, MAX_EPOCHS, MAX_LEARNING_RATE, LocalConfig
from fedprivopt.core.text import shown

if TYPE_CHECKING:  # Flower is imported where a record is built, so the fast engine never loads it
    from flwr.app import ConfigRecord

__all__ = [
    "BATCH_SIZE",
    "CLIP_BIT",
    "CLIP_NORM",
    "COUNT_NOISE_STD",
    "LOCAL_EPOCHS",
    "LOCAL_LEARNING_RATE",
    "MAX_EXAMPLES",
    "MAX_SEED",
    "NOISE_STD",
    "REPORT_PRIVATE_METRICS",
    "REQUIRED_TRAIN_KEYS",
    "ROUND",
    "SECURE",
    "SEED",
    "STREAM",
    "USERS",
    "ClientSettings",
    "TrainConfig",
    "check_mapping",
    "check_private_metrics",
    "check_user_ids",
    "decode_train_config",
    "encode_train_config",
    "other_spelling",
]

# --- train (and evaluate) config: the keys of wire.CONFIG_RECORD ---------------------------------
USERS = "users"
ROUND = "round"
STREAM = "stream"
LOCAL_LEARNING_RATE = "local-learning-rate"
LOCAL_EPOCHS = "local-epochs"
BATCH_SIZE = "batch-size"
MAX_EXAMPLES = "max-examples"  #: 0 = no cap
CLIP_NORM = "clip-norm"  #: 0 = no clipping
NOISE_STD = "noise-std"  #: std of each client's noise share; 0 = none
SEED = "seed"
SECURE = "secure"
REPORT_PRIVATE_METRICS = "report-private-metrics"  #: optional, default false
CLIP_BIT = "clip-bit"  #: optional, default false: report the clip bit (adaptive clipping)
COUNT_NOISE_STD = "count-noise-std"  #: optional, default 0: std of the count-noise share

#: The keys every train config holds (the others are optional).
REQUIRED_TRAIN_KEYS = (
    USERS,
    ROUND,
    STREAM,
    LOCAL_LEARNING_RATE,
    LOCAL_EPOCHS,
    BATCH_SIZE,
    MAX_EXAMPLES,
    CLIP_NORM,
    NOISE_STD,
    SEED,
    SECURE,
)


#: The largest seed a train config carries (a protobuf ``sint64``; :func:`~fedprivopt.privacy.rng.
#: derive_seed` gives the clients' seed in ``[0, MAX_SEED]``).
MAX_SEED = 2**63 - 1


def check_mapping(name: str, value: object) -> Mapping:
    """``value`` if it is a mapping, else ``ValueError`` naming ``name``.

    Forty-third review of issue 15 (wire 7): ``task_params(None)``, ``decode_train_config(None)``
    and ``check_private_metrics(None)`` raised ``AttributeError`` or ``TypeError``, naming none.
    """
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a mapping of keys to values, got {shown(value)}")
    return value


def check_user_ids(name: str, ids: object) -> tuple[int, ...]:
    """``ids`` as a tuple of ints if it is a list of distinct integers ``>= 0``.

    The one check of a list of user ids on the wire: a node's answer to the users query
    (:func:`~fedprivopt.wire.read_user_ids`), a train config's :data:`USERS`
    (:func:`decode_train_config`), the users a ClientApp evaluates or answers with. Integers of
    any kind (numpy's) are ids; ``True``, ``0.5``, ``"3"`` and ``None`` are not (thirty-first
    review of issue 15: the first took only ``int``, the second any integral, with two
    messages).

    Raises
    ------
    ValueError
        Naming ``name``, with the value shown cut (``core.text.shown``).
    """
    if not isinstance(ids, list) or any(
        isinstance(u, bool) or not isinstance(u, numbers.Integral) or u < 0 for u in ids
    ):
        raise ValueError(f"{name} must be a list of integers >= 0, got {shown(ids)}")
    users = tuple(int(u) for u in ids)
    if len(set(users)) != len(users):
        raise ValueError(f"{name} repeats a user id: {shown(list(users))}")
    return users


@dataclass(frozen=True)
class ClientSettings:
    """What the server tells every client of a request about how to train.

    The one typed form of a train message's settings: the server algorithm builds it, the fast
    engine uses it as is, and :func:`encode_train_config` / :func:`decode_train_config` carry it
    over Flower's messages.

    Attributes
    ----------
    local : LocalConfig
        Local training (``clip_norm`` ``None``: no clipping; ``noise_std`` 0: no noise share).
    seed : int
        Seed of the clients' generators; ignored in secure mode (OS entropy).
    secure : bool
        Whether clients draw their noise from OS entropy.
    report_private_metrics : bool
        Whether clients return per-user example counts and losses (non-private runs only).
    """

    local: LocalConfig
    seed: int
    secure: bool = False
    report_private_metrics: bool = False

    def __post_init__(self) -> None:
        # forty-third review of issue 15 (wire 1): nothing was checked, and encode_train_config
        # wrote int() and bool() of what it was given (seed 1.5 as 1, secure "false" as true)
        if not isinstance(self.local, LocalConfig):
            raise ValueError(f"local must be a LocalConfig, got {shown(self.local)}")
        object.__setattr__(self, "seed", check_int("seed", self.seed, 0, MAX_SEED))
        check_bool("secure", self.secure)
        check_bool("report_private_metrics", self.report_private_metrics)


@dataclass(frozen=True)
class TrainConfig:
    """A decoded train config: which users to train, in which round and stream, and how."""

    users: tuple[int, ...]
    round_num: int
    stream: str
    settings: ClientSettings


def encode_train_config(
    *,
    users: Iterable[int],
    round_num: int,
    settings: ClientSettings,
    stream: str = "train",
) -> ConfigRecord:
    """Build the :data:`~fedprivopt.wire.CONFIG_RECORD` of a train message.

    ``None`` options of ``settings.local`` are sent as ``0`` (``max_examples``, ``clip_norm``). In
    secure mode the seed is ignored by clients. :data:`CLIP_BIT` and :data:`COUNT_NOISE_STD` are
    sent only with adaptive clipping (``settings.local.clip_bit``).

    Raises
    ------
    ValueError
        Naming ``users`` (distinct integers ``>= 0``), ``round_num`` (an integer ``>= 0``),
        ``stream`` (a non-empty string) or ``settings``, or ``report-private-metrics`` asked in a
        private round (:func:`check_private_metrics`): what the ClientApp would refuse.
    """
    if not isinstance(settings, ClientSettings):
        raise ValueError(f"settings must be a ClientSettings, got {type(settings).__name__}")
    # forty-third review of issue 15 (wire 1): int() and str() wrote users [0.5, 1.7] as [0, 1],
    # [True] as [1], ["3"] as [3], round 2.9 as 2 and stream 5 as "5", where the ClientApp
    # refuses each of them (decode_train_config): a message is what decode_train_config takes
    if isinstance(users, (str, bytes)) or not isinstance(users, Iterable):
        raise ValueError(f"users must be a list of user ids, got {shown(users)}")
    user_ids = list(check_user_ids("users", list(users)))
    round_num = check_int("round_num", round_num, 0)
    if not isinstance(stream, str) or not stream:
        raise ValueError(f"stream must be a non-empty string, got {shown(stream)}")
    from flwr.app import ConfigRecord

    local = settings.local
    adaptive = {CLIP_BIT: True, COUNT_NOISE_STD: float(local.count_noise_std)}
    record = ConfigRecord(
        {
            USERS: user_ids,
            ROUND: round_num,
            STREAM: stream,
            LOCAL_LEARNING_RATE: float(local.learning_rate),
            LOCAL_EPOCHS: int(local.epochs),
            BATCH_SIZE: int(local.batch_size),
            MAX_EXAMPLES: int(local.max_examples or 0),
            CLIP_NORM: float(local.clip_norm or 0.0),
            NOISE_STD: float(local.noise_std),
            SEED: int(settings.seed),
            SECURE: bool(settings.secure),
            REPORT_PRIVATE_METRICS: bool(settings.report_private_metrics),
            **(adaptive if local.clip_bit else {}),
        }
    )
    check_private_metrics(record)  # a private round's never leave a node
    return record


def check_private_metrics(record: Mapping[str, object]) -> None:
    """``ValueError`` naming :data:`REPORT_PRIVATE_METRICS` when a private round asks for them.

    A round is private unless :data:`CLIP_NORM` and :data:`NOISE_STD` are 0 and neither
    :data:`CLIP_BIT` nor :data:`COUNT_NOISE_STD` is set (a missing or odd value is private).
    Forty-second review of issue 15 (wire 2): a train message with ``clip-norm`` 1 and
    ``report-private-metrics`` true, which no fedprivopt server sends (it asks in non-private
    runs only), made the ClientApp send each user's exact example count and training loss.
    """
    if check_mapping("record", record).get(REPORT_PRIVATE_METRICS, False) is not True:
        return
    for name, default in ((CLIP_NORM, None), (NOISE_STD, None), (CLIP_BIT, False),
                          (COUNT_NOISE_STD, 0)):  # fmt: skip
        value = record.get(name, default)
        quiet = value is False or (type(value) in (int, float) and value == 0)
        if not quiet:
            raise ValueError(
                f"train config {REPORT_PRIVATE_METRICS!r} is true in a private round ({name!r} "
                f"is {shown(value)}): fedprivopt's server asks for the users' example counts and "
                "training losses only in non-private runs, and a private round's never leave "
                "the node"
            )


def other_spelling(name: object, known: Iterable[str]) -> str | None:
    """The key of ``known`` that ``name`` spells in another case or with other separators.

    ``None`` when ``name`` is one of ``known`` or spells none of them. Two spellings are one key
    when their letters and digits, in lower case, are the same (``count-noise-std``,
    ``count_noise_std``, ``countNoiseStd``, ``COUNT-NOISE-STD``, ``"count noise std"``): a
    message's reader refuses such a key rather than ignore it (forty-third review of issue 15,
    wire 9, snake_case; forty-fifth, wire 1, the rest).
    """
    keys = list(known)
    if name in keys:
        return None
    bare = _bare(name)
    return next((key for key in keys if _bare(key) == bare), None)


def _bare(name: object) -> str:
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


def decode_train_config(record: Mapping[str, object]) -> TrainConfig:
    """Parse and validate a train :data:`~fedprivopt.wire.CONFIG_RECORD`.

    Raises
    ------
    ValueError
        If a required key is missing, a value has the wrong type or range, a user id is
        repeated, or a private round asks for private metrics (:func:`check_private_metrics`).
    """
    known = (*REQUIRED_TRAIN_KEYS, REPORT_PRIVATE_METRICS, CLIP_BIT, COUNT_NOISE_STD)
    for name in check_mapping("record", record):
        # forty-third review of issue 15 (wire 9): a known key in snake_case (count_noise_std,
        # clip_bit) was ignored, so the node sent its exact clip bits, as the server never asked;
        # forty-fifth review (wire 1): in other case or separators too (countNoiseStd,
        # Count-Noise-Std, COUNT_NOISE_STD, "count noise std", "count-noise-std ")
        spelled = other_spelling(name, known)
        if spelled is not None:
            raise ValueError(
                f"train config key {shown(name)} is {spelled!r} in another spelling; the key is "
                f"{spelled!r}"
            )
    missing = [k for k in REQUIRED_TRAIN_KEYS if k not in record]
    if missing:
        raise ValueError(f"train config is missing keys {missing}")

    def key(name: str) -> str:
        return f"train config {name!r}"

    # ints >= 0 as read_user_ids takes them (thirtieth review of issue 15: [0.5], [True] and
    # ["3"] were trained as users 0, 1 and 3, ["a"] raised int()'s message naming no key)
    users = check_user_ids(key(USERS), record[USERS])
    # every other key has its type too (thirty-first review of issue 15: int(), float() and
    # bool() made max-examples 0.5 "no cap", local-epochs 2.9 two epochs, round 1.5 round 1,
    # "32" a batch size and secure "false" true)
    max_examples = check_int(key(MAX_EXAMPLES), record[MAX_EXAMPLES], 0)
    clip_norm = check_real(key(CLIP_NORM), record[CLIP_NORM], low=0.0)
    stream = record[STREAM]
    if not isinstance(stream, str) or not stream:
        raise ValueError(f"{key(STREAM)} must be a non-empty string, got {shown(stream)}")
    # LocalConfig's ranges, the key named (forty-fifth review of issue 15, wire 2: a learning
    # rate of 0, -1 or 1e300, 10,001 epochs or a count-noise std of 1e101 were taken here and
    # refused by LocalConfig as "learning_rate must be ...", naming no key of the config)
    local = LocalConfig(
        learning_rate=check_real(
            key(LOCAL_LEARNING_RATE),
            record[LOCAL_LEARNING_RATE],
            low=0.0,
            high=MAX_LEARNING_RATE,
            low_open=True,
        ),
        epochs=check_int(key(LOCAL_EPOCHS), record[LOCAL_EPOCHS], 1, MAX_EPOCHS),
        batch_size=check_int(key(BATCH_SIZE), record[BATCH_SIZE], 1),
        max_examples=max_examples or None,
        clip_norm=clip_norm or None,
        noise_std=check_real(key(NOISE_STD), record[NOISE_STD], low=0.0),
        clip_bit=check_bool(key(CLIP_BIT), record.get(CLIP_BIT, False)),
        count_noise_std=check_real(
            key(COUNT_NOISE_STD),
            record.get(COUNT_NOISE_STD, 0.0),
            low=0.0,
            high=MAX_COUNT_NOISE_STD,
        ),
    )
    settings = ClientSettings(
        local=local,
        # ClientSettings' range, the key named (forty-fourth review of issue 15, wire 4: -1 was
        # taken here and refused there as "seed must be ...", naming no key of the config)
        seed=check_int(key(SEED), record[SEED], 0, MAX_SEED),
        secure=check_bool(key(SECURE), record[SECURE]),
        report_private_metrics=check_bool(
            key(REPORT_PRIVATE_METRICS), record.get(REPORT_PRIVATE_METRICS, False)
        ),
    )
    check_private_metrics(record)
    return TrainConfig(
        users=users,
        round_num=check_int(key(ROUND), record[ROUND], 0),
        stream=stream,
        settings=settings,
    )
