"""The reply to a ``train`` message: :func:`reply_updates` and the checks of what it sends.

Every user's flat update (one ``ArrayRecord`` per user, in the dtype of the message's model), its
clip bit when the server asked, and the reply's counts; each update is checked against what the
message asked (its users, the model's flat length) before it leaves the node.
:func:`message_content` is the check of a message that every reader and reply here and in
:mod:`fedprivopt.clients.messages` uses. Split from :mod:`fedprivopt.clients.messages`, which
re-exports :func:`reply_updates`. This module imports Flower.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from fedprivopt import wire as P
from fedprivopt.clients.privatize import NoisedShare, noised_std, privatized_for
from fedprivopt.core.checks import check_int, check_real
from fedprivopt.core.text import shown
from fedprivopt.privacy.adaptive_clip import NOISELESS_MIN_STD, NOISELESS_REPORTS
from fedprivopt.privacy.aggregate_checks import KeptReads
from fedprivopt.privacy.plain import foreign_tensor
from fedprivopt.privacy.sparse import dense_problem

__all__ = ["message_content", "reply_updates"]


def reply_updates(
    message: Message,
    updates: Mapping[int, torch.Tensor],
    *,
    rejected: int = 0,
    clip_bits: Mapping[int, float] | None = None,
    num_examples: list[int] | None = None,
    losses: list[float] | None = None,
) -> Message:
    """The reply to a ``train`` message: every user's flat update and two counts.

    Every update is sent in the dtype of the message's model as one flat vector (float64 for a
    float64 model, else float32), which the server sums in. Thirty-fourth review of issue 15
    (the tasks reviewer's report): every update was sent as float32, and the Flower engine's
    server rejected all of a float64 model's (``dtype torch.float32 != torch.float64``),
    releasing noise-only rounds (``eval_accuracy`` 0.435 where the fast engine trains to 0.775).

    Parameters
    ----------
    message : flwr.app.Message
        The train message.
    updates : Mapping[int, torch.Tensor]
        User id → the privatized flat update (:attr:`~fedprivopt.clients.PrivateUpdate.vector`).
    rejected : int
        Requested users this node does not host (``users-rejected``), an integer ``>= 0``.
    clip_bits : Mapping[int, float], optional
        Adaptive clipping: user id → its clip bit (or noised share), a finite real number
        (:meth:`~fedprivopt.clients.messages.TrainMessage.clip_bit` gives it); only where the
        message asks for them (``clip-bit`` true), since a user's bit is private.
    num_examples, losses : list, optional
        Per-user example counts (integers ``>= 0``) and training losses (real numbers), one
        for each update, in the order of ``updates``; sent only when the server asked for them
        (non-private baselines). **Private**: a DP run never sends them.

    Raises
    ------
    ValueError
        Naming ``rejected``, ``clip_bits[user]``, ``updates[user]`` (a dense floating-point
        tensor holding data), ``num_examples`` or ``losses`` (when sent) when it is not as
        said above, or ``report-private-metrics`` when
        the message asks for private metrics in a private round
        (:func:`~fedprivopt.wire.check_private_metrics`).
    """
    # fortieth review of issue 15 (mechanisms 6): rejected "3", -1 and 1.7 were sent as 3, -1
    # and 1, None raised int()'s TypeError; a clip bit of None or NaN was sent as NaN, "1" as
    # 1.0 and a two-element tensor as two numbers (the server then drops the user's update)
    rejected = check_int("rejected", rejected, 0)
    message_content(message)
    for name, given in (("updates", updates), ("clip_bits", clip_bits or {})):
        if not isinstance(given, Mapping):  # forty-second review (wire 3): AttributeError
            raise ValueError(f"{name} must be a mapping of user id to value, got {shown(given)}")
    reply = RecordDict()
    bits = {} if clip_bits is None else clip_bits
    dtype, length = _flat_layout(message)
    asked = _Asked.of(message)
    record = message.content.config_records.get(P.CONFIG_RECORD)
    # private: only when the server asked with true itself, not with a value bool() takes for
    # it ("no", 1: thirty-first review of issue 15), and never in a private round (forty-second
    # review, wire 2: clip-norm 1 with report-private-metrics true sent them)
    report = record is not None and record.get(P.REPORT_PRIVATE_METRICS, False) is True
    if report:
        P.check_private_metrics(record)  # before the updates' own checks: the message's
    for user in bits:
        if user not in updates:  # a bit keyed otherwise than its update: that update is refused
            raise ValueError(
                f"clip_bits[{shown(user)}] is the clip bit of no user in updates "
                f"{shown(sorted(map(str, updates)))}: key each bit by its update's user id"
            )
    # follow-up of the forty-fifth review of issue 15 (privacy 2; the api reviewer's row open
    # for wire): a ClientApp of one's own that trained every user into one workspace it reused
    # and stored it for each (updates[user] = work) sent the last user's update for every user
    # (all 0.03), which the server, decoding copies, cannot see; each update is sent as it is
    # read, so updates read from one memory not written between their reads are refused
    read, given_all = KeptReads(), []
    shares: dict = {}  # a noised update's digest -> its user (privacy 3)
    for user, vector in updates.items():
        key = P.update_key(user)  # an integer id >= 0 (ValueError naming user_id)
        asked.check(user)
        given, vector = vector, _plain_update(user, vector)
        _check_update(user, vector, length)
        _refuse_other_users(user, given)  # as it is read (a lazy mapping's workspace)
        given_all.append((user, given))
        read.keep(user, given)
        delta = vector.to(device="cpu", dtype=dtype)
        if asked.noise_std > 0:
            _keep_share(user, delta, shares)
        arrays = {P.DELTA_ARRAY: Array(delta.numpy())}
        if user in bits:
            # a user's clip bit is private: it leaves the node only where the server asks
            # (forty-fourth review of issue 15, wire 2: the exact bit of an app computing its
            # own was sent beside the update of a round without adaptive clipping)
            if not asked.clip_bit:
                raise ValueError(
                    f"clip_bits[{shown(user)}]: the message does not ask for clip bits "
                    f"({P.CLIP_BIT} is not true: no adaptive clipping this round), and a user's "
                    "clip bit is private; send none (TrainMessage.clip_bit gives None then)"
                )
            bit = _clip_bit(user, bits[user], asked.count_std)
            arrays[P.CLIP_BIT_ARRAY] = Array(np.array([bit], dtype=np.float64))
        elif asked.clip_bit:
            raise ValueError(
                f"clip_bits[{shown(user)}] is missing: the server asked for clip bits "
                f"({P.CLIP_BIT} = true, adaptive clipping) and rejects an update without its "
                "bit (TrainMessage.clip_bit gives it)"
            )
        reply[key] = ArrayRecord(arrays)
    read.refuse()
    for user, given in given_all:
        asked.check_noised(user, given)
    _refuse_one_share(shares)
    _refuse_equal_shares(bits, asked.count_std)
    metrics: dict[str, int | float | list[int] | list[float]] = {
        P.USERS_TRAINED: len(updates),
        P.USERS_REJECTED: rejected,
    }
    if report:
        metrics[P.NUM_EXAMPLES] = _per_user("num_examples", num_examples, len(updates))
        metrics[P.TRAIN_LOSS] = _per_user("losses", losses, len(updates))
    reply[P.TRAIN_METRICS] = MetricRecord(metrics)
    return Message(reply, reply_to=message)


def _per_user(name: str, values: object, count: int) -> list[int] | list[float]:
    """``values`` (``num_examples`` or ``losses``) as the list a reply's metrics hold.

    ``None`` or empty: none sent; else one for each of the ``count`` updates, in their order:
    example counts integers ``>= 0``, losses real numbers (NaN of a diverged user too), NumPy's
    taken. Forty-fourth review of issue 15 (wire 3): a list of another length was sent (the
    losses of every batch read as the users'), -3 examples sent, and NumPy integers, a loss
    ``1`` beside ``0.9``, or a tensor raised Flower's ``TypeError`` (or torch's
    ``RuntimeError``) naming no parameter.
    """
    if values is None:
        return []
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{name} must be a list, one value a user in updates, got {shown(values)}")
    if values and len(values) != count:
        raise ValueError(
            f"{name} must hold one value for each of the {count} updates, in their order, "
            f"got {len(values)}"
        )
    if name == "num_examples":
        return [check_int(f"{name}[{i}]", v, 0) for i, v in enumerate(values)]
    out = []
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{name}[{i}] must be a real number, got {shown(value)}")
        out.append(float(value))
    return out


@dataclass(frozen=True)
class _Asked:
    """What a train message's config asks of its reply: its users, and whether clip bits."""

    users: frozenset[int] | None
    clip_bit: bool
    count_std: float | None = 0.0
    noise_std: float = 0.0

    @classmethod
    def of(cls, message: Message) -> _Asked:
        """Read from ``message``'s config (``users`` ``None`` where it holds no valid list).

        ``count_std``: the message's ``count-noise-std`` (``0``: server mode, a report is the
        bit itself), ``None`` where it is not a number ``>= 0`` (no report is then checked).
        """
        record = message.content.config_records.get(P.CONFIG_RECORD)
        if record is None:
            return cls(None, False)
        try:
            users = frozenset(P.check_user_ids(P.USERS, record.get(P.USERS)))
        except ValueError:
            users = None
        try:
            count_std = check_real(P.COUNT_NOISE_STD, record.get(P.COUNT_NOISE_STD, 0.0), low=0.0)
        except ValueError:
            count_std = None
        try:
            noise_std = check_real(P.NOISE_STD, record.get(P.NOISE_STD, 0.0), low=0.0)
        except ValueError:  # TrainMessage.read refuses it; any share is then asked for
            noise_std = math.inf
        return cls(users, record.get(P.CLIP_BIT, False) is True, count_std, noise_std)

    def check(self, user: int) -> None:
        """``ValueError`` naming ``updates[user]`` when the message did not ask for ``user``.

        Forty-first review of issue 15 (wire 1): an update of a user the server did not sample
        (a ClientApp of one's own that trains every hosted user, or keys updates by position)
        was sent; the server drops it as unrequested, but the user's update had left the node
        without the sampling the accountant assumes, and the sampled users' updates were lost.
        """
        # its int value, which the reply's key holds (follow-up, privacy 4: an int subclass
        # comparing as an asked user sent the update of another, its value)
        if self.users is None:
            # forty-fifth review of issue 15 (wire 7): a message naming no users (no config, no
            # 'users' or an invalid list: another server's train message) let any update go
            raise ValueError(
                f"updates[{shown(user)}]: the message names no users (its ConfigRecord "
                f"{P.CONFIG_RECORD!r} holds no valid {P.USERS!r} list: not a train message of "
                "fedprivopt's server, TrainMessage.read refuses it); no update is sent"
            )
        if int(user) not in self.users:
            raise ValueError(
                f"updates[{shown(user)}]: the message did not ask for user {shown(user)} (it "
                f"asks for {shown(sorted(self.users))}); reply only for the users it names "
                "(TrainMessage.users) that this node hosts"
            )

    def check_noised(self, user: object, vector: object) -> None:
        """``ValueError`` naming ``updates[user]`` when it lacks the message's noise share.

        In distributed-noise mode (``noise-std`` above 0) an update must be one
        :func:`~fedprivopt.clients.privatize_update` noised with that std (``TrainMessage.
        privatize``'s vector), unchanged since (:func:`~fedprivopt.clients.privatize.
        noised_std`). Follow-up of the forty-seventh review of issue 15 (privacy 3; wire 4): a
        ClientApp of one's own sending its clipped update without its share was accepted, and
        the server cannot tell on a model of at most 200 entries: the round was released with
        no noise at all, charged as noised.
        """
        if self.noise_std > 0 and not noised_std(vector) >= self.noise_std:
            raise ValueError(
                f"updates[{shown(user)}] must be the vector of TrainMessage.privatize (or "
                f"privatize_update with the message's noise-std), unchanged and uncopied "
                "(reply_updates moves it to the CPU and the model's dtype itself): the message "
                f"asks for a noise share ({P.NOISE_STD} {self.noise_std:.6g}, distributed "
                "noise), and an update without it would release the round without that noise "
                "(the server cannot tell on a small model)"
            )


def _refuse_other_users(user: object, vector: object) -> None:
    """``ValueError`` naming ``updates[user]`` when it is another user's privatized update.

    A vector :meth:`~fedprivopt.clients.messages.TrainMessage.privatize` made for another user
    (or a copy of one: :func:`~fedprivopt.clients.privatize.privatized_for`). Forty-eighth review
    of issue 15 (privacy 1): a ClientApp of one's own that kept the last user's ``private`` past
    its loop and sent ``private.vector.clone()`` for every user (the shared-memory refusal's
    ``.clone()`` followed) had that user's update summed once for each, in server and
    distributed mode alike: a sensitivity of k C under a charge of C.
    """
    made_for = privatized_for(vector)
    if made_for and int(user) not in made_for:
        raise ValueError(
            f"updates[{shown(user)}] is (a copy of) the update TrainMessage.privatize made for "
            f"user {min(made_for)}, not user {shown(user)}: send each user's own update (one "
            "user's update summed for several is a sensitivity of several C); nothing was sent"
        )


def _keep_share(user: object, delta: torch.Tensor, shares: dict) -> None:
    """Keep ``delta``'s digest for ``user`` (its first other user under ``shares[None]``)."""
    key = hashlib.sha256(delta.contiguous().numpy().data).digest()  # not a copy of its values
    if key in shares:
        shares.setdefault(None, (shares[key], user))
    else:
        shares[key] = user


def _refuse_one_share(shares: dict) -> None:
    """``ValueError`` when two users' updates hold the same values (distributed-noise mode).

    Every update carries a noise share of its own user's stream, so two equal ones are one
    user's update sent for both (:func:`_keep_share` kept their digests as they were read).
    Forty-eighth review of issue 15 (privacy 3; privacy 1 through ``privatize_update`` called
    directly, the documented alternative to ``TrainMessage.privatize``): ``{u: private.vector.
    clone() for u in users}`` with the last user's ``private`` was sent, that user's update
    summed once for each user.
    """
    if None in shares:
        first, second = shares[None]
        raise ValueError(
            f"updates[{shown(first)}] and updates[{shown(second)}] hold the same values, one "
            "noised update (each user's holds a noise share of its own): send each user's own "
            "update (one user's update summed for several is a sensitivity of several C); "
            "nothing was sent"
        )


def _refuse_equal_shares(bits: Mapping[int, object], count_std: float | None) -> None:
    """``ValueError`` when two users' clip-bit shares are one report (distributed mode).

    :meth:`~fedprivopt.clients.messages.TrainMessage.clip_bit` gives each call a
    :class:`~fedprivopt.clients.privatize.NoisedShare` of its own, so one given for two users
    is one user's report sent for both: that user counted once for each (forty-eighth review of
    issue 15, privacy 1: ``dict.fromkeys(users, bit)``). Equal values are not refused: two
    seeded streams may coincide (each is one of 2**32).
    """
    if not count_std:
        return
    seen: dict[int, object] = {}
    for user, bit in bits.items():
        if isinstance(bit, NoisedShare) and id(bit) in seen:
            raise ValueError(
                f"clip_bits[{shown(seen[id(bit)])}] and clip_bits[{shown(user)}] are one "
                "report: send each user's own (TrainMessage.clip_bit of its own update); one "
                "user's report counted for several would change the clip count by more than one"
            )
        seen[id(bit)] = user


def _plain_update(user: object, vector: object) -> object:
    """``vector`` read through ``torch.Tensor.detach`` (a plain alias, no copy), as measured.

    Follow-up of the forty-third review of issue 15 (privacy 2): an update read by its own
    ``detach`` (norm 0.004 measured, 100s returned) was sent at norm 424 where C = 1, which in
    distributed-noise mode the server accepts up to ``C + s(sqrt(d) + 10)``; a subclass but
    ``Parameter`` is refused, as ``privatize_update`` and ``clip_l2`` refuse it.
    """
    if not isinstance(vector, torch.Tensor):
        return vector
    reason = foreign_tensor(vector)
    if reason is not None:
        raise ValueError(
            f"updates[{shown(user)}] must be a user's flat update (PrivateUpdate.vector): {reason}"
        )
    return torch.Tensor.detach(vector)


def _clip_bit(user: object, bit: object, count_std: float | None = None) -> float:
    """``bit`` as a float, or ``ValueError`` naming ``clip_bits[user]`` and its type only.

    With ``count_std`` (the message's ``count-noise-std``) ``0`` the report must be the bit, 0
    or 1; above 0 a noised share within the server's bound, ``1/2 + 11 count_std``. Forty-
    seventh review of issue 15 (egress 4): a report of ``norm / C`` (0.7312) was sent, the
    server rejected it and logged its value (``clip bit must be 0 or 1, got 0.7312``): the
    user's exact update norm, not noised, in the server's log.

    Follow-up of the forty-sixth review of issue 15 (privacy 6): the refusal showed the value
    (``got True``): an app sending the exact bit (``PrivateUpdate.clipped``, a bool, where
    :meth:`TrainMessage.clip_bit` gives the noised report) had it reach the server not noised,
    as the text of the error Flower sends as its reply's reason.
    """
    try:
        value = check_real(f"clip_bits[{shown(user)}]", bit)
    except ValueError:
        raise ValueError(
            f"clip_bits[{shown(user)}] must be a finite real number (TrainMessage.clip_bit's "
            f"report), got a {type(bit).__name__}"
        ) from None
    if count_std == 0.0 and value not in (0.0, 1.0):
        rule = "the bit [norm <= C], 0 or 1 (no count noise: count-noise-std is 0)"
    elif count_std and not abs(value) <= 0.5 + 11.0 * count_std:
        rule = f"a noised share within 1/2 + 11 count-noise-std = {0.5 + 11.0 * count_std:.6g}"
    elif count_std and count_std >= NOISELESS_MIN_STD and value in NOISELESS_REPORTS:
        # follow-up of the forty-seventh review of issue 15 (privacy 1; mechanisms 2's sending
        # side): the exact bit (clip_bit's 1.0, or a centred 0.5) was sent as a share: the
        # server rejects it (NoisyCountAggregator.check) but has seen the node's un-noised bit
        rule = "a noised share (count_share's bit with its count noise), not the bit itself"
    elif count_std and not (isinstance(bit, NoisedShare) and bit.std >= count_std):
        # follow-up of the forty-seventh review of issue 15 (privacy 6): a share of one's own
        # (count_share with a mistaken std, 0.5000000001) was kept by the server, not noised
        rule = (
            "a noised share as TrainMessage.clip_bit gives it (its count noise of the "
            "message's count-noise-std), not one computed otherwise"
        )
    else:
        return value
    # not its value: it may be computed from the user's update (norm / C)
    raise ValueError(
        f"clip_bits[{shown(user)}] must be TrainMessage.clip_bit's report, {rule}; got another "
        "number (the server would reject it)"
    )


def _check_update(user: object, vector: object, length: int | None = None) -> None:
    """``ValueError`` naming ``updates[user]`` unless it is the model's flat update.

    A dense real floating tensor with data, one-dimensional, of ``length`` entries (the
    message's model as one flat vector; ``None``: not checked). Fortieth review of issue 15
    (mechanisms 8): a NumPy array, a list or ``None`` ended in ``AttributeError: ... has no
    attribute 'detach'``, a meta or sparse tensor in torch's ``NotImplementedError`` or
    ``TypeError``, and a complex (or int64) one was sent as its real part (cast) with only
    torch's warning. Forty-first review (wire 1): an update of another shape (``(d, 1)``, the
    trainable parameters only, one entry short) was sent, and the server rejected it, so every
    such round released noise only, charged, without a word at the node.
    """
    if isinstance(vector, torch.Tensor) and vector.is_floating_point():
        problem = dense_problem(vector)
        if problem is None and (vector.dim() != 1 or length not in (None, vector.numel())):
            entries = "" if length is None else f" of the model's {length} entries"
            # not its shape (forty-seventh review of issue 15, egress 1): per-example updates
            # stacked ((27, 18)) sent a user's example count as the error reply's reason
            got = (
                "one of another length"
                if vector.dim() == 1
                else f"a {vector.dim()}-dimensional tensor"
            )
            problem = (
                f"a one-dimensional tensor{entries} (TrainMessage.flatten(state) - "
                f"TrainMessage.global_flat) is needed, got {got} (its shape is not shown: it "
                "may follow a user's data)"
            )
    else:
        what = vector.dtype if isinstance(vector, torch.Tensor) else type(vector).__name__
        problem = f"a floating-point torch.Tensor is needed, got {what}"
    if problem is not None:
        raise ValueError(
            f"updates[{shown(user)}] must be a user's flat update (PrivateUpdate.vector): {problem}"
        )


def _flat_layout(message: Message) -> tuple[torch.dtype, int | None]:
    """The dtype and length of the message's model as one flat vector.

    The dtype is float32, or float64 if any entry is, as :func:`~fedprivopt.privacy.flat.flatten`
    promotes the model's entries (from float32); a message without the model, or with arrays
    of no numeric dtype, gives float32. The length is the entries of every array (``None``
    without the model, or where an array's shape is not a list of integers >= 0).
    """
    dtype = torch.float32
    length: int | None = 0
    record = message.content.array_records.get(P.ARRAYS_RECORD)
    for array in (record or {}).values():
        with contextlib.suppress(TypeError, ValueError):
            entry = torch.from_numpy(np.empty(0, dtype=np.dtype(array.dtype))).dtype
            dtype = torch.promote_types(dtype, entry)
        shape = getattr(array, "shape", None)
        if (
            length is not None
            and isinstance(shape, (list, tuple))
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
        ):
            length += math.prod(shape)
        else:
            length = None
    flat = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    return flat, length if record else None


def message_content(message: object) -> RecordDict:
    """``message.content``, or ``ValueError`` naming ``message`` (not a Flower message).

    Forty-second review of issue 15 (wire 3): ``AttributeError: 'str' object has no attribute
    'content'`` (and ``updates``, ``users``, ``state`` alike), naming no parameter.
    """
    if not isinstance(message, Message):
        raise ValueError(f"message must be a flwr.app.Message, got {shown(message)}")
    return message.content
