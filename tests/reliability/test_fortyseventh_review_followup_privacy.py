"""Forty-seventh review of issue 15, follow-up privacy: the first wave's privacy-path fixes.

1. ``reply_updates(message, {1: update}, clip_bits={1: clip_bit(0.2, 1.0)})`` for a
   distributed-noise message (``count-noise-std`` 0.1; the mechanisms reviewer's open row, the
   sending side of mechanisms 2): the exact bit 1.0 was sent as a share, so the node's un-noised
   bit reached the server, which rejects it (``NoisyCountAggregator.check``) but has seen it.
2. A ``LocalTrainer`` subclass (the egress reviewer's open row egress 6) whose ``precondition``
   kept an Adagrad-like accumulator on the trainer (``self.acc = ... + grad * grad``), training
   users 0-3 on one trainer: user 3's update after users 0-2 differed from its own by 0.254 in an
   entry (norm 0.783): the earlier users' gradients reached a later user's update.
3. A ClientApp of one's own sending its clipped update without its noise share in a
   distributed-noise round (the wire reviewer's open row wire 4; ``DPStrategy`` in process,
   ``min-shares`` 1, every node replying ``0.01`` in each entry of a 3-entry model): accepted as
   shares, the released model ``[0.0125 0.0125 0.0125]`` exactly with seed 3, no noise at all,
   reported with noise std 0.559 and charged epsilon 3.41 (``share_floor`` is 0 for d <= 200).
4. A replacement ``add_noise`` (``privatize_update(..., add_noise=...)``, a ``LocalTrainer``
   subclass's) drawing its share from torch's global generator (``torch.randn_like``) or from a
   generator of its own seeded with a constant: sent, a share not of the operating system's
   entropy in secure mode, known to whoever knows the seed.
5. A replacement ``add_noise`` returning ``10 * vector + noise`` (10,000 entries, share std 0.5
   C): sent holding 9.8 C along the update, which the server keeps in distributed mode (up to
   ``C + s (sqrt(d) + 10)`` = 56 C).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from fedprivopt import wire as P
from fedprivopt.clients import (
    LocalConfig,
    LocalTrainer,
    TrainMessage,
    privatize_update,
    reply_updates,
)
from fedprivopt.clients.privatize import NoisedShare
from fedprivopt.models import build_task, initial_flat
from fedprivopt.privacy import RngFactory
from fedprivopt.privacy.adaptive_clip import clip_bit
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


# -- 1: the exact bit sent as a share in a distributed-noise message ------------------------------


@pytest.mark.parametrize(
    "bit", [clip_bit(0.2, 1.0), 0.0, 0.5, -0.5, np.float32(1.0)], ids=["1", "0", "+h", "-h", "np"]
)
def test_1_the_exact_bit_is_not_sent_as_a_share(bit) -> None:
    message = _message(clip_bit=True, count_noise_std=0.1)
    with pytest.raises(ValueError, match=r"clip_bits\[1\] .*not the bit itself") as caught:
        reply_updates(message, {1: torch.zeros(18)}, clip_bits={1: bit})
    assert "got another number" in str(caught.value)
    reply = reply_updates(
        message, {1: torch.zeros(18)}, clip_bits={1: NoisedShare(0.61, 0.1)}
    )  # a share
    assert float(reply.content[P.update_key(1)][P.CLIP_BIT_ARRAY].numpy()[0]) == 0.61
    server = _message(clip_bit=True)  # server mode: the bit itself is what is sent
    reply = reply_updates(server, {1: torch.zeros(18)}, clip_bits={1: 1.0})
    assert float(reply.content[P.update_key(1)][P.CLIP_BIT_ARRAY].numpy()[0]) == 1.0
    tiny = _message(clip_bit=True, count_noise_std=1e-4)  # below NOISELESS_MIN_STD, as the server
    reply_updates(tiny, {1: torch.zeros(18)}, clip_bits={1: NoisedShare(0.5, 1e-4)})


# -- 2: a LocalTrainer subclass keeping an override's state on the trainer (egress 6) -------------

TASK = build_task("toy", **PARAMS)
CONFIG = LocalConfig(learning_rate=0.1, epochs=1, batch_size=4, clip_norm=10.0, max_examples=8)


class _Rebound(LocalTrainer):  # the egress reviewer's reproducer: a class default, set anew
    acc = None

    def precondition(self, grad, preconditioner):
        self.acc = grad * grad if self.acc is None else self.acc + grad * grad
        return grad / (self.acc.sqrt() + 1e-3)


class _InPlace(LocalTrainer):  # preallocated in __init__, accumulated in place; a list; NumPy
    def __init__(self, task, **kwargs):
        super().__init__(task, **kwargs)
        self.acc = torch.zeros(self.spec.numel, dtype=self.spec.dtype)
        self.seen: list = []
        self.total = np.zeros(1)

    def precondition(self, grad, preconditioner):
        self.acc.add_(grad * grad)
        self.seen.append(float(grad.norm()))
        self.total += float(grad.abs().sum())
        scale = 1.0 + 0.1 * len(self.seen) + 0.01 * float(self.total[0])
        return grad / (self.acc.sqrt() + 1e-3) / scale


class _Raising(_Rebound):  # a failing user (its data damaged) after its accumulator was set
    def precondition(self, grad, preconditioner):
        out = super().precondition(grad, preconditioner)
        if self.fail:
            raise RuntimeError("damaged record")
        return out

    fail = False


def _update(kind, users, fail=()):
    trainer = kind(TASK, device="cpu")
    start = initial_flat(TASK)
    for user in users:
        trainer.fail = user in fail
        try:
            delta = trainer.train(
                start, user_id=user, round_num=1, config=CONFIG, rngs=RngFactory(seed=0)
            ).delta
        except RuntimeError:
            continue
    return trainer, delta


@pytest.mark.parametrize("kind", [_Rebound, _InPlace], ids=["rebound", "in-place"])
def test_2_an_override_s_state_on_the_trainer_does_not_reach_the_next_user(kind) -> None:
    _, alone = _update(kind, [3])
    trainer, after = _update(kind, [0, 3])  # before: 0.254 apart in an entry (users 0-2 first)
    assert torch.equal(after, alone)
    if kind is _Rebound:
        assert "acc" not in vars(trainer)  # set back to the class's None after every user
        _, failed = _update(_Raising, [0, 3], fail=(0,))  # user 0 raised mid-way
        assert torch.equal(failed, alone)
    else:
        assert float(trainer.acc.abs().sum()) == 0.0 and trainer.seen == []
        assert trainer.total[0] == 0.0


def test_2_what_the_app_sets_between_users_is_kept() -> None:
    class Scaled(LocalTrainer):
        scale = 1.0

        def precondition(self, grad, preconditioner):
            return grad * self.scale

    trainer = Scaled(TASK, device="cpu")
    start = initial_flat(TASK)
    one = trainer.train(start, user_id=3, round_num=1, config=CONFIG, rngs=RngFactory(seed=0))
    trainer.scale = 0.5  # the app's own setting, outside a user's training
    half = trainer.train(start, user_id=3, round_num=1, config=CONFIG, rngs=RngFactory(seed=0))
    assert trainer.scale == 0.5
    assert not torch.equal(half.delta, one.delta)
    fresh = Scaled(TASK, device="cpu")
    fresh.scale = 0.5
    again = fresh.train(start, user_id=3, round_num=1, config=CONFIG, rngs=RngFactory(seed=0))
    assert torch.equal(half.delta, again.delta)


# -- 3: an update without its noise share in a distributed-noise message (wire 4) -----------------


def test_3_an_update_without_its_noise_share_is_not_sent() -> None:
    message = _message(noise_std=0.3)
    request = TrainMessage.read(message)
    clipped = torch.full((18,), 0.01)  # the reproducer's reply: clipped, no share
    private = request.privatize(clipped, 1).vector
    weaker = privatize_update(clipped, clip_norm=1.0, noise_std=0.1, generator=torch.Generator())
    edited = request.privatize(clipped, 4).vector
    edited.copy_(clipped)  # the share taken out again, in place
    for update in (clipped, private * 2, weaker.vector, edited):
        with pytest.raises(ValueError, match=r"updates\[1\] must be the vector of .*noise-std 0.3"):
            reply_updates(message, {1: update})  # before: sent, accepted by the server as a share
    for update in (private, private.detach(), private.clone()):  # itself, or an exact copy
        reply = reply_updates(message, {1: update})
        assert torch.equal(torch.from_numpy(P.read_updates(reply.content)[1]), private)
    server = _message()  # server mode (noise-std 0): a hand-made update is sent as before
    assert set(P.read_updates(reply_updates(server, {1: clipped}).content)) == {1}


# -- 4: a replacement add_noise drawing its share elsewhere than from its generator ---------------


def _global(vector, std, generator):  # torch's global generator, the one given left unused
    return vector + std * torch.randn_like(vector)


def _constant(vector, std, generator):  # a generator of its own, of a constant seed
    own = torch.Generator().manual_seed(0)
    return vector + std * torch.randn(vector.shape, generator=own, dtype=vector.dtype)


def _honest(vector, std, generator):
    return vector + std * torch.randn(vector.shape, generator=generator, dtype=vector.dtype)


@pytest.mark.parametrize("replacement", [_global, _constant], ids=["global", "constant"])
def test_4_a_share_not_drawn_from_its_generator_is_refused(replacement) -> None:
    update = torch.full((18,), 0.01)
    private = dict(clip_norm=1.0, noise_std=0.3)
    with pytest.raises(ValueError, match="add_noise drew nothing from the generator"):
        privatize_update(update, **private, generator=torch.Generator(), add_noise=replacement)

    class Own(LocalTrainer):
        def add_noise(self, delta, std, generator):
            return replacement(delta, std, generator)

    config = LocalConfig(learning_rate=0.1, batch_size=4, max_examples=8, **private)
    with pytest.raises(ValueError, match="add_noise drew nothing from the generator"):
        Own(TASK, device="cpu").train(
            initial_flat(TASK), user_id=1, round_num=1, config=config, rngs=RngFactory(seed=0)
        )
    out = privatize_update(update, **private, generator=torch.Generator(), add_noise=_honest)
    assert out.vector.shape == (18,)


# -- 5: a replacement add_noise scaling the clipped update beside its share -----------------------


def test_5_an_add_noise_scaling_the_update_is_refused() -> None:
    def scaled(vector, std, generator):  # the share drawn honestly, the update scaled by 10
        return 10 * vector + std * torch.randn(vector.shape, generator=generator)

    update = torch.full((10000,), 1.0)
    private = dict(clip_norm=1.0, noise_std=0.5)
    with pytest.raises(ValueError, match="add_noise changed the clipped update itself"):
        # before: sent, 9.8 C along the update (the server keeps up to 56 C here)
        privatize_update(update, **private, generator=torch.Generator(), add_noise=scaled)
    for seed in range(20):  # an honest replacement, in float16 too
        half = update.half()
        gen = torch.Generator().manual_seed(seed)
        privatize_update(half, **private, generator=gen, add_noise=_honest)
