"""Forty-seventh review of issue 15, egress: what a node sends the server beyond epsilon.

A ClientApp of one's own (docs/FLOWER.md) that lets an exception out has Flower send
``str(type) + str(exception)`` to the server as its error reply's reason, outside epsilon: a
refusal's text must hold nothing computed from a user's data.

1. ``reply_updates(message, {1: per_example})`` of a user's per-example updates stacked (27
   examples of the toy model's 18 entries) sent ``got shape (27, 18)``: the user's example count.
2. ``TrainMessage.clip_bit`` of a ``PrivateUpdate`` whose replacement ``clip`` reported ``norm -
   C`` (``clip_bit`` refusing the negative norm), and ``count_share`` given ``norm / C`` as the
   bit, sent the value: the user's exact update norm.
3. ``privatize_update(delta, clip_norm=1, clip=sparse)`` whose replacement ``clip`` kept the
   entries above a threshold (``vector[vector.abs() > 0.2]``, or an ``add_noise`` alike) sent
   ``got one of shape (10,)``: how many entries of the user's update are above it.
4. ``reply_updates(message, updates, clip_bits={1: norm / C})`` (0.7312) for a server-mode
   adaptive round (``count-noise-std`` 0) sent it; the server rejected it and logged
   ``clip bit must be 0 or 1, got 0.7312`` (a deployment's serverapp.log): the exact norm.
"""

from __future__ import annotations

import re

import pytest
import torch
from flwr.app import ArrayRecord

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig, TrainMessage, privatize_update, reply_updates
from fedprivopt.clients.privatize import NoisedShare
from fedprivopt.models import build_task
from fedprivopt.privacy.adaptive_clip import clip_bit, count_share
from fedprivopt.privacy.clip import ClipResult, clip_l2
from tests.messages import delivered

PARAMS = {"num_users": 10, "dim": 5, "num_classes": 3, "seed": 2}


def _message(**local):
    task = build_task("toy", **PARAMS)
    config = LocalConfig(learning_rate=0.1, epochs=1, batch_size=4, clip_norm=1.0, **local)
    settings = P.ClientSettings(local=config, seed=5)
    record = P.encode_train_config(users=[1, 4], round_num=2, settings=settings, stream="train")
    content = {
        P.ARRAYS_RECORD: ArrayRecord(task.build_model().state_dict()),
        P.CONFIG_RECORD: record,
    }
    return delivered(content, "train")


def _digits(value: float) -> str:
    return f"{abs(value):.6g}"[:6]


# -- egress 1: an update of another shape: the shape is not sent ---------------------------------


@pytest.mark.parametrize("shape", [(27, 18), (27,), (1, 27, 18)], ids=["rows", "long", "3-d"])
def test_1_an_update_of_another_shape_is_refused_without_its_shape(shape) -> None:
    message = _message()
    with pytest.raises(ValueError, match=r"updates\[1\] .* model's 18 entries") as caught:
        reply_updates(message, {1: torch.zeros(shape)})  # per-example rows, or concatenated
    assert "27" not in str(caught.value)  # before: 'got shape (27, 18)', the example count
    reply = reply_updates(message, {1: torch.zeros(18)})
    assert set(P.read_updates(reply.content)) == {1}


# -- egress 2: a clip report of a wrong norm or bit: the value is not sent ------------------------


def test_2_a_clip_report_refused_does_not_send_the_norm() -> None:
    def excess(vector, clip_norm):  # a replacement clip reporting what is above C
        result = clip_l2(vector, clip_norm)
        return ClipResult(result.vector, result.norm - clip_norm, result.clipped)

    update = torch.full((18,), 0.01)
    private = privatize_update(update, clip_norm=1.0, clip=excess)
    request = TrainMessage.read(_message(clip_bit=True))
    with pytest.raises(ValueError, match="norm must be a number >= 0") as caught:
        request.clip_bit(private, 1)
    assert _digits(private.norm) not in str(caught.value)  # before: got -0.957574
    assert not re.search(r"\d\.\d", str(caught.value))
    norm = float(update.norm())
    with pytest.raises(ValueError, match="bit must be 0 or 1") as caught:
        count_share(norm / 1.0, 0.5, torch.Generator().manual_seed(0))
    assert _digits(norm) not in str(caught.value)  # before: got 0.0424264
    with pytest.raises(ValueError, match=r"norm must be a number >= 0 .* got a str"):
        clip_bit("1", 1.0)
    assert clip_bit(norm, 1.0) == 1.0
    assert count_share(1.0, 0.0, torch.Generator()) == 0.5


# -- egress 3: a replacement clip or add_noise of another shape: the shape is not sent -----------


@pytest.mark.parametrize("step", ["clip", "add_noise"])
def test_3_a_replacement_step_of_another_shape_does_not_send_its_shape(step) -> None:
    def sparse_clip(vector, clip_norm):  # keeps the entries above a threshold
        result = clip_l2(vector, clip_norm)
        return ClipResult(result.vector[result.vector.abs() > 0.2], result.norm, result.clipped)

    def sparse_noise(vector, std, generator):
        return vector[vector.abs() > 0.2] + 0.0

    update = torch.tensor([0.1, 0.3, 0.25, 0.0, 0.21, 0.05, 0.4])  # norm 0.6: not clipped
    kept = int((update.abs() > 0.2).sum())
    steps = {"clip": {"clip": sparse_clip}, "add_noise": {"add_noise": sparse_noise}}[step]
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match=rf"{step} must return .* got one of another") as caught:
        privatize_update(update, clip_norm=1.0, noise_std=0.1, generator=g, **steps)
    assert f"({kept},)" not in str(caught.value)  # before: 'got one of shape (4,)'
    out = privatize_update(update, clip_norm=1.0, clip=lambda v, c: clip_l2(v, c))
    assert torch.equal(out.vector, update)


# -- egress 4: a clip report that is no bit is not sent, nor logged by the server ----------------


def test_4_a_clip_report_that_is_no_bit_is_refused_before_it_leaves() -> None:
    from fedprivopt.privacy.adaptive_clip import NoisyCountAggregator

    update = {1: torch.zeros(18)}
    server = _message(clip_bit=True)  # count-noise-std 0: the report is the bit
    with pytest.raises(ValueError, match=r"clip_bits\[1\] must be .* 0 or 1") as caught:
        reply_updates(server, update, clip_bits={1: 0.7312})  # before: sent
    assert "0.73" not in str(caught.value)
    distributed = _message(clip_bit=True, count_noise_std=0.1)  # shares within 1/2 + 1.1
    with pytest.raises(ValueError, match=r"clip_bits\[1\] .* within 1/2 \+ 11") as caught:
        reply_updates(distributed, update, clip_bits={1: 7.312})
    assert "7.31" not in str(caught.value)
    for message, bit in ((server, 1.0), (server, 0), (distributed, NoisedShare(0.7312, 0.1))):
        reply = reply_updates(message, update, clip_bits={1: bit})
        assert float(reply.content[P.update_key(1)][P.CLIP_BIT_ARRAY].numpy()[0]) == bit
    for mode, report in (("server", 0.7312), ("distributed", 7.312)):
        counter = NoisyCountAggregator(
            count_stddev=0.3, expected_cohort_size=4, noise_mode=mode, min_shares=4
        )
        _, reason = counter.check(report)
        assert reason is not None and str(report)[:4] not in reason  # the round's warning's
