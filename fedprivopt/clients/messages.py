"""Flower messages for a ClientApp of one's own: read what fedprivopt's server sends, build replies.

fedprivopt's strategies (:class:`~fedprivopt.strategies.flower.DPStrategy`) sample **users**, not
nodes, and talk to every node with two message types (:mod:`fedprivopt.wire`):

``query``
    "which users do you host?" — answer with :func:`reply_users` (:func:`hosted_users` gives the
    users of a node from its ``partition-id`` and ``num-partitions``).
``train``
    the global model, the sampled users this node hosts and how to train them —
    :meth:`TrainMessage.read` decodes it; after local training, each user's update goes through
    :meth:`TrainMessage.privatize` (:func:`~fedprivopt.clients.privatize_update` with the
    message's clip norm, noise share and generator) and :func:`reply_updates` sends them back,
    one ``ArrayRecord`` per user and nothing private.

A task that breaks its protocol (:class:`~fedprivopt.models.task.TaskError`) is answered with
:func:`reply_task_error`, an error reply of code :data:`TASK_ERROR` whose reason names the task's
member and the exception's type (or what was expected), nothing of a user's data: the server ends
the run with it when every node asked in a round answered so, as the fast engine stops at the
first such user; the node logs the error whole.

fedprivopt's own ClientApp (:mod:`fedprivopt.clients.client_app`) uses these same functions, so a
user's ClientApp that uses them speaks exactly its protocol. This module imports Flower; import
it where Flower is installed. The reply to a ``train`` message (:func:`reply_updates` and the
checks of each update it sends) is in :mod:`fedprivopt.clients.replies`, re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict

from fedprivopt import wire as P
from fedprivopt.clients.privatize import (
    PrivateUpdate,
    keep_for_user,
    noise_generator,
    privatize_update,
    privatized_for,
)
from fedprivopt.clients.replies import message_content as _content
from fedprivopt.clients.replies import reply_updates
from fedprivopt.clients.trainer import clip_report
from fedprivopt.core.checks import check_int
from fedprivopt.core.local import LocalConfig
from fedprivopt.core.text import shown
from fedprivopt.models.task import TaskError, state_to_flat
from fedprivopt.models.task_calls import sent_reason
from fedprivopt.privacy.flat import FlatSpec, flatten
from fedprivopt.privacy.rng import RngFactory

__all__ = [
    "ARRAY_RECORDS",
    "TASK_ERROR",
    "TrainMessage",
    "check_record_kinds",
    "hosted_users",
    "read_model",
    "reply_task_error",
    "reply_updates",
    "reply_users",
]

TASK_ERROR = 1015
"""Code of the error reply of a ClientApp whose task broke its protocol (:func:`reply_task_error`).

Flower's own codes (``flwr.common.constant.ErrorCode``) are 0-8: the ClientApp raised, crashed,
did not load, or the node or its reply is unavailable.
"""


def hosted_users(context: Context, num_users: int) -> list[int]:
    """The users a node hosts: ``range(partition-id, num_users, num-partitions)``.

    Parameters
    ----------
    context : flwr.app.Context
        The node's context; its ``node_config`` must hold ``partition-id`` and
        ``num-partitions`` (Flower's simulation sets both; a SuperNode gets them with
        ``--node-config``).
    num_users : int
        The population ``N`` (the run config's ``population``).

    Raises
    ------
    ValueError
        If a key is missing or out of range.
    """
    if not isinstance(context, Context):  # forty-third review (wire 7): AttributeError
        raise ValueError(f"context must be a flwr.app.Context, got {shown(context)}")
    node_config = context.node_config
    for key in (P.NODE_PARTITION_ID, P.NODE_NUM_PARTITIONS):
        if key not in node_config:
            raise ValueError(
                f"node config has no {shown(key)}; start the SuperNode with --node-config "
                f'"{P.NODE_PARTITION_ID}=<p> {P.NODE_NUM_PARTITIONS}=<P>"'
            )
    return P.hosted_users(
        node_config[P.NODE_PARTITION_ID], node_config[P.NODE_NUM_PARTITIONS], num_users
    )


def reply_users(message: Message, users: Iterable[int]) -> Message:
    """The reply to a ``query`` message: the ids of the users this node hosts.

    Raises
    ------
    ValueError
        If ``message`` is not fedprivopt's users query, or ``users`` are not distinct integers
        ``>= 0`` (twenty-ninth review of issue 15: ``[0.5, 1.7]``, ``[True]`` and ``["3"]`` were
        sent as users 0, 1, 1 and 3; the server now takes such an answer as a node error).
    """
    record = _content(message).config_records.get(P.QUERY_RECORD)
    op = None if record is None else record.get(P.OP)
    if op != P.OP_USERS:
        raise ValueError(
            f"unknown query: expected ConfigRecord {P.QUERY_RECORD!r} with "
            f"{P.OP!r}={P.OP_USERS!r}, got {shown(op)}"
        )
    if isinstance(users, (str, bytes)) or not isinstance(users, Iterable):
        raise ValueError(f"users must be a list of user ids, got {shown(users)}")
    ids = list(P.check_user_ids("users", list(users)))
    return Message(RecordDict({P.USERS_RECORD: MetricRecord({P.USER_IDS: ids})}), reply_to=message)


@dataclass(frozen=True)
class TrainMessage:
    """A decoded ``train`` message of fedprivopt's server.

    Attributes
    ----------
    users : tuple of int
        The sampled users to train (all hosted by this node unless the server erred).
    round_num : int
        Server round (``round``).
    stream : str
        ``stream``: ``"train"``, or ADADP's second cohort.
    local : LocalConfig
        ``local-learning-rate``, ``local-epochs``, ``batch-size``, ``max-examples`` (``None``:
        all), ``clip-norm`` (``None``: no clipping) and ``noise-std``.
    seed : int
        ``seed``: the clients' seed (derived one-way from the run's root seed).
    secure : bool
        ``secure``: draw noise shares from the operating system's entropy.
    report_private_metrics : bool
        Whether the server asks for example counts and losses (non-private baselines only).
    state : dict of str to torch.Tensor
        The global model's state dict (``arrays``), in the server's key order.
    preconditioner : torch.Tensor or None
        Flat ``P > 0`` (AdaDPS, DP2's adaptive rounds): divide every local gradient by it.
    """

    users: tuple[int, ...]
    round_num: int
    stream: str
    local: LocalConfig
    seed: int
    secure: bool
    report_private_metrics: bool
    state: dict[str, torch.Tensor]
    preconditioner: torch.Tensor | None = None

    @classmethod
    def read(cls, message: Message) -> TrainMessage:
        """Decode and check a ``train`` message.

        Raises
        ------
        ValueError
            If a record or a key is missing or has the wrong type or range.
        """
        content = _content(message)
        check_record_kinds(content, "train", ARRAY_RECORDS, (P.CONFIG_RECORD,))
        if P.CONFIG_RECORD not in content.config_records:
            raise ValueError(f"train message has no ConfigRecord {P.CONFIG_RECORD!r}")
        if P.ARRAYS_RECORD not in content.array_records:
            raise ValueError(f"message has no ArrayRecord {P.ARRAYS_RECORD!r}")
        request = P.decode_train_config(content.config_records[P.CONFIG_RECORD])
        for name in content:  # a record of any kind (forty-sixth review, wire 4)
            # forty-fifth review of issue 15 (wire 4): a preconditioner record spelled otherwise
            # ('Preconditioner') was ignored, and DP2's or AdaDPS' clients trained without it
            spelled = P.other_spelling(name, (P.ARRAYS_RECORD, P.PRECONDITIONER_RECORD))
            if spelled is not None:
                raise ValueError(
                    f"train message's {type(content[name]).__name__} {shown(name)} is "
                    f"{spelled!r} in another spelling; the record is {spelled!r}"
                )
        preconditioner = None
        if P.PRECONDITIONER_RECORD in content.array_records:
            record = content.array_records[P.PRECONDITIONER_RECORD]
            if P.PRECONDITIONER_ARRAY not in record:
                raise ValueError(
                    f"train message's ArrayRecord {P.PRECONDITIONER_RECORD!r} holds no array "
                    f"{P.PRECONDITIONER_ARRAY!r}, got {shown(sorted(record.keys()))}"
                )
            preconditioner = _tensor(P.PRECONDITIONER_RECORD, P.PRECONDITIONER_ARRAY, record)
            preconditioner = preconditioner.reshape(-1)
        state = read_model(message)
        if preconditioner is not None:
            _check_preconditioner(preconditioner, sum(t.numel() for t in state.values()))
        settings = request.settings
        return cls(
            users=request.users,
            round_num=request.round_num,
            stream=request.stream,
            local=settings.local,
            seed=settings.seed,
            secure=settings.secure,
            report_private_metrics=settings.report_private_metrics,
            state=state,
            preconditioner=preconditioner,
        )

    def __post_init__(self) -> None:
        # what the message held, to find a training that changed it in place (privatize)
        state = self.state if isinstance(self.state, Mapping) else {}
        kept = {k: v.detach().clone() for k, v in state.items() if isinstance(v, torch.Tensor)}
        pre = self.preconditioner
        pre = pre.detach().clone() if isinstance(pre, torch.Tensor) else None
        object.__setattr__(self, "_as_read", (kept, pre))

    def _refuse_changed(self) -> None:
        """Raise ``ValueError`` when the message's model or preconditioner changed since read.

        Forty-seventh review of issue 15 (api 2): a ClientApp of one's own that loaded each
        user's model with ``model.load_state_dict(request.state, assign=True)`` (torch's way
        for a model built on the meta device; its parameters are then the message's tensors)
        trained ``request.state`` itself: the next user started from the previous user's local
        model, so its update held that user's training (0.305 apart from the user trained
        alone; a sensitivity of several C under a charge of C), and the first user's update was
        0 where ``global_flat`` was first read after its training. Parameters made views of
        ``request.global_flat`` (``vector_to_parameters``) and an Adagrad-like ``request.
        preconditioner`` updated in place did alike. Refused at the first such user's
        :meth:`privatize`, before anything is sent.
        """
        kept, pre = self.__dict__["_as_read"]
        changed = None
        state = self.state
        if not isinstance(state, Mapping) or list(state) != list(kept):
            changed = "state"
        elif not all(_same_bits(state[k], v) for k, v in kept.items()):
            changed = "state"
        elif "global_flat" in self.__dict__:
            if not _same_bits(self.__dict__["global_flat"], flatten(kept)[0]):
                changed = "global_flat"
        if changed is None and pre is not None and not _same_bits(self.preconditioner, pre):
            changed = "preconditioner"
        if changed is not None:
            raise ValueError(
                f"request.{changed} changed in place since the message was read (a model loaded "
                "with load_state_dict(request.state, assign=True), parameters that are views of "
                "request.global_flat, or a preconditioner updated in place, trains it): the next "
                "user would start from this user's training; train on a copy "
                "(model.load_state_dict(request.state), request.global_flat.clone()); nothing "
                "was privatized"
            )

    @cached_property
    def spec(self) -> FlatSpec:
        """The flat layout of the global model (the server's: its state dict's key order)."""
        return flatten(self.state)[1]

    @cached_property
    def global_flat(self) -> torch.Tensor:
        """The global model as one flat vector in the layout :attr:`spec`."""
        return flatten(self.state)[0]

    def flatten(self, state: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """A state dict with the global model's keys as one flat vector in the server's layout.

        ``flatten(model.state_dict()) - global_flat`` is the update the server expects.
        ``ValueError`` naming ``state`` for anything but a mapping of names to tensors.
        """
        if not isinstance(state, Mapping) or not all(
            isinstance(v, torch.Tensor) for v in state.values()
        ):
            raise ValueError(f"state must be a state dict (names to tensors), got {shown(state)}")
        return state_to_flat({k: v.detach() for k, v in state.items()}, self.spec)

    def noise_generator(self, user_id: int, device: torch.device | str = "cpu") -> torch.Generator:
        """The generator of ``user_id``'s noise share.

        :func:`~fedprivopt.clients.noise_generator` keyed by this message's seed, secure mode,
        round and stream, on ``device`` (the update's).
        """
        return noise_generator(
            seed=self.seed,
            secure=self.secure,
            round_num=self.round_num,
            user_id=user_id,
            stream=self.stream,
            device=device,
        )

    def privatize(self, update: torch.Tensor, user_id: int) -> PrivateUpdate:
        """Clip ``update`` and add its noise share as this message asks.

        :func:`~fedprivopt.clients.privatize_update` with the message's ``clip-norm`` and
        ``noise-std`` and :meth:`noise_generator` of ``user_id`` (made only when the share is
        not zero). The result's ``vector`` is what :func:`reply_updates` sends.
        """
        self._refuse_changed()
        std = self.local.noise_std
        # a list or an array is refused by privatize_update, naming update (forty-first review
        # of issue 15, wire 3: AttributeError 'list' object has no attribute 'device')
        device = update.device if isinstance(update, torch.Tensor) else "cpu"
        private = privatize_update(
            update,
            clip_norm=self.local.clip_norm,
            noise_std=std,
            generator=self.noise_generator(user_id, device) if std > 0 else None,
        )
        if isinstance(user_id, int) and not isinstance(user_id, bool):
            keep_for_user(private.vector, user_id)  # reply_updates sends it for that user only
        return private

    def clip_bit(self, private: PrivateUpdate, user_id: int) -> float | None:
        """What ``user_id`` reports for adaptive clipping, or ``None`` when the server did not ask.

        With ``clip-bit`` in the message (adaptive clipping): the bit ``[norm ≤ C]`` of the
        update's pre-clip norm, or in distributed-noise mode (``count-noise-std > 0``) its
        noised centred share, exactly as :class:`~fedprivopt.clients.LocalTrainer` reports it.
        Pass it to :func:`reply_updates` as ``clip_bits``.
        """
        # forty-first review of issue 15 (wire 3): user ids 1.5, True and "1" were read through
        # int() as user 1 (its count-noise draw), where privatize refuses them, and a private
        # that is no PrivateUpdate raised AttributeError
        user_id = check_int("user_id", user_id, 0)
        if not isinstance(private, PrivateUpdate):
            raise ValueError(
                f"private must be the PrivateUpdate of TrainMessage.privatize, got {shown(private)}"
            )
        if not self.local.clip_bit:
            return None
        made_for = privatized_for(private.vector)
        if made_for and user_id not in made_for:
            # forty-eighth review of issue 15 (privacy 1): the last user's PrivateUpdate, kept
            # past the loop, gave every user its bit: that user counted once for each
            raise ValueError(
                f"private is the PrivateUpdate TrainMessage.privatize made for user "
                f"{min(made_for)}, not user {user_id}: report each user's bit from its own "
                "update (one user counted for several would change the clip count by more "
                "than one)"
            )
        rngs = RngFactory(seed=None, secure=True) if self.secure else RngFactory(seed=self.seed)
        keys = (self.stream, user_id)
        return clip_report(float(private.norm), self.local, rngs, self.round_num, keys)


#: The ArrayRecords of a train message (the model, the preconditioner): :func:`check_record_kinds`.
ARRAY_RECORDS = (P.ARRAYS_RECORD, P.PRECONDITIONER_RECORD)


def check_record_kinds(
    content: RecordDict, kind: str, arrays: Iterable[str], configs: Iterable[str]
) -> None:
    """``ValueError`` for a record named in ``arrays`` or ``configs`` that is of another kind.

    A record of ``content`` named in ``arrays`` must be an ``ArrayRecord``, one named in
    ``configs`` a ``ConfigRecord``; ``kind`` (``"train"``, ``"evaluate"``) names the message.

    Forty-sixth review of issue 15 (wire 4): a train message whose ``preconditioner`` was a
    ``MetricRecord`` (or a ``ConfigRecord``) of the same values, and an evaluate message whose
    ``config`` naming users ``[4]`` was a ``MetricRecord`` (a ServerApp of one's own choosing the
    record that holds lists of numbers) were read as holding none: DP2's or AdaDPS' clients
    trained without their preconditioner, and the evaluate reply held the metrics of every hosted
    user (39 examples) where the server named one (7), as the forty-fifth review's records
    spelled otherwise (wire 4) were.
    """
    wanted = {**dict.fromkeys(arrays, ArrayRecord), **dict.fromkeys(configs, ConfigRecord)}
    for name, record_type in wanted.items():
        if name in content and not isinstance(content[name], record_type):
            article = "an" if record_type is ArrayRecord else "a"
            raise ValueError(
                f"{kind} message's record {name!r} must be {article} {record_type.__name__}, got "
                f"a {type(content[name]).__name__}"
            )


def reply_task_error(message: Message, error: TaskError, *, reason: str | None = None) -> Message:
    """The reply to a message whose handling found the task breaking its protocol.

    An error reply of code :data:`TASK_ERROR`, so the server can tell a task's error (the same on
    every node: the run cannot go on) from a node that failed, and name it. Thirty-third review
    of issue 15: a ClientApp's ``TaskError`` reached the server as Flower's
    ``CLIENT_APP_RAISED_EXCEPTION`` with Ray's traceback as its reason, so a Flower run whose
    every user failed so released noise-only rounds to the end (rc 0, about 680 lines of
    warnings and tracebacks), where the fast engine stops at the first such user.

    Parameters
    ----------
    message : Message
        The message answered.
    error : TaskError
        The task's error. Its text is not sent: it may hold a user's values.
    reason : str, optional
        The reply's reason, which reaches the server outside the privacy guarantee: it must hold
        nothing computed from a user's data. By default what fedprivopt's check gave ``error``
        to send (:func:`~fedprivopt.models.task_calls.sent_reason`: the task's member and the
        exception's type, or what was expected) and that the full message is in the node's log.

    Notes
    -----
    Forty-sixth review of issue 15 (wire, open; the follow-up's privacy 1): the reason was the
    error's text: ``user_data(4)`` returning one label fewer than examples sent user 4's example
    count (``a torch.float32 tensor of shape (7, 5)``), a ``KeyError`` of a token of the user's
    data sent the token (``'alice@example.com'``). Log the error on the node (fedprivopt's
    ClientApp logs it whole, with its traceback).

    Raises
    ------
    ValueError
        If ``error`` is not a :class:`~fedprivopt.models.task.TaskError`.
    TypeError
        If ``reason`` is neither ``None`` nor a ``str``.
    """
    if not isinstance(error, TaskError):
        raise ValueError(f"error must be a TaskError, got {shown(error)}")
    if reason is None:
        reason = sent_reason(error)
    elif not isinstance(reason, str):
        raise TypeError(f"reason must be a str or None, got {shown(reason)}")
    _content(message)  # forty-third review (wire 7): Flower's MessageInitializationError
    return Message(Error(code=TASK_ERROR, reason=reason), reply_to=message)


def _same_bits(a: object, b: torch.Tensor) -> bool:
    """Whether tensor ``a`` holds exactly ``b``'s shape, dtype and bytes (NaN equal to itself)."""
    if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.layout != torch.strided or a.device.type == "meta":
        return False
    raw = a.detach().to(b.device).reshape(-1).contiguous()
    return torch.equal(raw.view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


def read_model(message: Message) -> dict[str, torch.Tensor]:
    """The global model of a ``train`` or ``evaluate`` message: its ``arrays`` as a state dict.

    Raises
    ------
    ValueError
        If the message has no ArrayRecord ``arrays``, or an array of it cannot be read as a
        tensor (non-native byte order, damaged bytes, another serialization, an object array),
        naming the record and the array. Forty-third review of issue 15 (wire 3): the ClientApp's
        ``evaluate`` handler read them with Flower's ``to_torch_state_dict``, so such an array
        raised torch's, NumPy's or Flower's own error (``ValueError``, ``EOFError``,
        ``TypeError``) naming neither, where a ``train`` message's names both (forty-first
        review, wire 2).
    """
    content = _content(message)
    if P.ARRAYS_RECORD not in content.array_records:
        raise ValueError(f"message has no ArrayRecord {P.ARRAYS_RECORD!r}")
    kind = "evaluate" if str(message.metadata.message_type).startswith("evaluate") else "train"
    arrays = content.array_records[P.ARRAYS_RECORD]
    return {name: _tensor(P.ARRAYS_RECORD, name, arrays, kind) for name in arrays}


def _check_preconditioner(p: torch.Tensor, length: int) -> None:
    """``ValueError`` unless ``p`` is ``length`` real values, finite and ``> 0``.

    Forty-third review of issue 15 (wire 8): one entry (broadcast by an app dividing by it),
    another length, zeros, NaN or complex values were read; fedprivopt's trainer refuses them.
    """
    real = not p.is_complex()
    if real and p.numel() == length and bool(torch.all(torch.isfinite(p) & (p > 0))):
        return
    what = f"{p.numel()} {p.dtype} entries" if real and p.numel() != length else "other values"
    raise ValueError(
        f"train message's ArrayRecord {P.PRECONDITIONER_RECORD!r}: array "
        f"{P.PRECONDITIONER_ARRAY!r} must hold {length} real values, finite and > 0 (one for each "
        f"entry of the model), got {what}"
    )


def _tensor(record_name: str, name: str, record: ArrayRecord, kind: str = "train") -> torch.Tensor:
    """The array ``name`` of a message's ``record`` as a tensor, or ``ValueError`` naming both.

    Forty-first review of issue 15 (wire 2): :meth:`TrainMessage.read` (documented to raise
    ``ValueError``) raised ``KeyError: 'p'`` for a preconditioner record without its array,
    and torch's or Flower's own errors, naming no record, for an array of another serialization
    or of non-native byte order.
    """
    try:
        return torch.from_numpy(record[name].numpy())
    except (TypeError, ValueError, EOFError) as err:  # np.load of hostile bytes raises these
        raise ValueError(
            f"{kind} message's ArrayRecord {record_name!r}: array {shown(name)} cannot be read "
            f"as a tensor: {shown(str(err))}"
        ) from None
