"""Issue 15, forty-first hostile review (wire: Flower messages, replies, deployment): tests.

1. ``clients.reply_updates(message, updates, clip_bits=...)`` (a ClientApp of one's own; the
   message asks for users ``[1]`` of a model of 5 entries) with an update of shape ``(5, 1)``,
   ``(3,)`` (the trainable parameters only), ``(6,)`` or ``()``; an update for user 5, whom the
   message did not ask for (a ClientApp that trains every hosted user); a clip bit keyed by
   another user than its update, or none where the message asks for clip bits (adaptive
   clipping). Before: every one was sent. The server rejects an update of another shape and one
   without its clip bit, and drops an unrequested one: each such round released noise only,
   charged, without a word at the node, and user 5's update left the node without the sampling
   the accountant assumes. Now ``ValueError`` naming ``updates[user]`` or ``clip_bits[user]``
   (``messages._check_update`` against the message's flat model, ``messages._Asked``);
   fedprivopt's own ClientApp and the example app reply as before.
2. ``clients.TrainMessage.read(message)`` (a ClientApp of one's own; documented to raise
   ``ValueError``) of a message whose ``preconditioner`` record holds no array ``p``, or whose
   preconditioner or model array is of non-native byte order (a server of another machine, or
   bytes a proxy mangled). Before: ``KeyError: 'p'``, and torch's ``ValueError: given numpy
   array has byte order different ...`` naming neither record nor array. Now ``ValueError``
   naming the record and the array (``messages._tensor``).
3. ``TrainMessage.clip_bit(private, user_id)`` (a ClientApp of one's own, adaptive clipping)
   with ``user_id`` 1.5, ``True`` or ``"1"``, or ``private`` a tensor; ``TrainMessage.privatize``
   of a list. Before: the ids were read through ``int()`` as user 1, whose count-noise draw
   they got (``privatize`` refuses them), a tensor raised ``AttributeError: ... 'norm'``, and the
   list ``AttributeError: 'list' object has no attribute 'device'``. Now ``ValueError`` naming
   ``user_id``, ``private`` or ``update``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig
from fedprivopt.clients.messages import TrainMessage, reply_updates
from tests.messages import delivered


def _train_message(*, users=(1,), clip_bit: bool = False, arrays=None, **records):
    local = LocalConfig(learning_rate=0.1, clip_norm=1.0, clip_bit=clip_bit)
    settings = P.ClientSettings(local, seed=0)
    config = P.encode_train_config(users=list(users), round_num=1, settings=settings)
    if arrays is None:
        arrays = ArrayRecord({"w": torch.zeros(3), "b": torch.zeros(2)})  # 5 entries as one
    return delivered({P.CONFIG_RECORD: config, P.ARRAYS_RECORD: arrays, **records}, "train")


# -- finding 1: a reply holds only the asked users' flat updates, with their clip bits ---------


@pytest.mark.parametrize(
    ("updates", "extra", "named"),
    [
        ({1: torch.zeros(5, 1)}, {}, r"updates\[1\] .* got a 2-dimensional tensor"),
        (
            {1: torch.zeros(3)},
            {},
            r"updates\[1\] .* model's 5 entries .* got one of another length",
        ),
        ({1: torch.zeros(6)}, {}, r"updates\[1\] .* got one of another length"),
        ({1: torch.tensor(0.0)}, {}, r"updates\[1\] .* got a 0-dimensional tensor"),
        ({5: torch.zeros(5)}, {}, r"updates\[5\]: the message did not ask for user 5"),
        ({1: torch.zeros(5)}, {"clip_bits": {7: 1.0}}, r"clip_bits\[7\] is the clip bit of no"),
    ],
    ids=["2-d", "short", "long", "0-d", "unasked-user", "bit-of-no-update"],
)
def test_1_a_reply_holds_only_the_asked_users_flat_updates(updates, extra, named) -> None:
    message = _train_message()
    with pytest.raises(ValueError, match=named):
        reply_updates(message, updates, **extra)  # before: sent, then rejected or dropped
    reply = reply_updates(message, {1: torch.ones(5, dtype=torch.float64)})
    np.testing.assert_array_equal(P.read_updates(reply.content)[1], np.ones(5, np.float32))


def test_1_an_update_without_the_clip_bit_the_message_asks_for_is_refused() -> None:
    message = _train_message(users=(1, 2), clip_bit=True)
    with pytest.raises(ValueError, match=r"clip_bits\[2\] is missing: the server asked"):
        reply_updates(message, {1: torch.zeros(5), 2: torch.zeros(5)}, clip_bits={1: 1.0})
    reply = reply_updates(message, {1: torch.zeros(5), 2: torch.zeros(5)}, clip_bits={1: 1, 2: 0})
    assert reply.content["update/2"][P.CLIP_BIT_ARRAY].numpy().tolist() == [0.0]
    # a message without the model or the users: refused since the forty-fifth review (wire 7),
    # where no check ran and any user's update was sent
    bare = delivered({}, "train")
    with pytest.raises(ValueError, match=r"^updates\[9\]: the message names no users"):
        reply_updates(bare, {9: torch.zeros(2, 2).reshape(-1)})


# -- finding 2: TrainMessage.read names the record and array it cannot read ---------------------


def _record(name: str, array: np.ndarray) -> ArrayRecord:
    return ArrayRecord({name: Array(array)})


@pytest.mark.parametrize(
    ("records", "named"),
    [
        (
            {P.PRECONDITIONER_RECORD: _record("q", np.ones(5, np.float32))},
            r"ArrayRecord 'preconditioner' holds no array 'p', got \['q'\]",
        ),
        (
            {P.PRECONDITIONER_RECORD: _record("p", np.ones(5, ">f4"))},
            r"ArrayRecord 'preconditioner': array 'p' cannot be read as a tensor",
        ),
        (
            {"arrays": _record("w", np.zeros(5, ">f4"))},
            r"ArrayRecord 'arrays': array 'w' cannot be read as a tensor",
        ),
    ],
    ids=["no-p", "big-endian-p", "big-endian-model"],
)
def test_2_train_message_read_names_what_it_cannot_read(records, named) -> None:
    arrays = records.pop("arrays", None)
    with pytest.raises(ValueError, match=named):  # before: KeyError, or torch's line
        TrainMessage.read(_train_message(arrays=arrays, **records))
    good = {P.PRECONDITIONER_RECORD: _record("p", np.full(5, 2.0, np.float32))}
    request = TrainMessage.read(_train_message(**good))
    assert request.preconditioner.tolist() == [2.0] * 5 and list(request.state) == ["w", "b"]


# -- finding 3: TrainMessage.clip_bit and privatize check their arguments ----------------------


@pytest.mark.parametrize("user", [1.5, True, "1"])
def test_3_clip_bit_takes_an_integer_user_id(user) -> None:
    request = TrainMessage.read(_train_message(users=(1,), clip_bit=True))
    private = request.privatize(torch.full((5,), 0.1), 1)
    with pytest.raises(ValueError, match="user_id must be an integer >= 0"):
        request.clip_bit(private, user)  # before: user 1's report
    assert request.clip_bit(private, np.int64(1)) == request.clip_bit(private, 1) == 1.0


def test_3_clip_bit_and_privatize_name_what_is_not_an_update() -> None:
    request = TrainMessage.read(_train_message(users=(1,), clip_bit=True))
    with pytest.raises(ValueError, match="private must be the PrivateUpdate"):
        request.clip_bit(torch.zeros(5), 1)  # before: AttributeError
    with pytest.raises(ValueError, match=r"update must be a floating-point torch\.Tensor"):
        request.privatize([0.1] * 5, 1)  # before: AttributeError ... 'device'
