"""privatize_update: the client's clip and noise-share step as a public function (issue 18)."""

import math
import typing

import pytest
import torch

from fedprivopt.clients import LocalConfig, LocalTrainer, noise_generator, privatize_update
from fedprivopt.models import build_task, initial_flat
from fedprivopt.privacy import RngFactory


def test_clips_the_whole_vector_to_the_clip_norm():
    out = privatize_update(torch.tensor([3.0, 4.0]), clip_norm=1.0)
    assert out.norm == 5.0 and out.clipped
    torch.testing.assert_close(out.vector, torch.tensor([0.6, 0.8]))
    inside = torch.tensor([0.3, 0.4])
    out = privatize_update(inside, clip_norm=1.0)
    assert out.norm == pytest.approx(0.5) and not out.clipped
    assert torch.equal(out.vector, inside)


def test_no_clip_norm_does_not_clip():
    out = privatize_update(torch.tensor([30.0, 40.0]), clip_norm=None)
    assert out.norm == 50.0 and not out.clipped
    assert torch.equal(out.vector, torch.tensor([30.0, 40.0]))


def test_a_non_finite_update_becomes_zero_and_counts_as_clipped():
    for bad in (float("nan"), float("inf")):
        out = privatize_update(torch.tensor([1.0, bad, 2.0]), clip_norm=1.0)
        assert out.norm == math.inf and out.clipped
        assert torch.equal(out.vector, torch.zeros(3))


def test_the_noise_share_has_the_asked_std_and_comes_from_the_generator():
    zero = torch.zeros(200_000)
    gen = torch.Generator().manual_seed(3)
    out = privatize_update(zero, clip_norm=1.0, noise_std=0.25, generator=gen)
    assert float(out.vector.std()) == pytest.approx(0.25, rel=0.01)
    assert abs(float(out.vector.mean())) < 0.25 * 5 / math.sqrt(zero.numel())
    again = privatize_update(
        zero, clip_norm=1.0, noise_std=0.25, generator=torch.Generator().manual_seed(3)
    )
    assert torch.equal(out.vector, again.vector)
    other = privatize_update(
        zero, clip_norm=1.0, noise_std=0.25, generator=torch.Generator().manual_seed(4)
    )
    assert not torch.equal(out.vector, other.vector)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clip_norm": 0.0}, "clip_norm"),
        ({"clip_norm": float("inf")}, "clip_norm"),
        ({"clip_norm": 1.0, "noise_std": -1.0}, "noise_std"),
        ({"clip_norm": 1.0, "noise_std": float("nan")}, "noise_std"),
        ({"clip_norm": 1.0, "noise_std": 0.1}, "generator"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        privatize_update(torch.ones(3), **kwargs)


def test_an_integer_update_is_refused():
    with pytest.raises(ValueError, match="update"):
        privatize_update(torch.ones(3, dtype=torch.int64), clip_norm=1.0)


class _Capturing(LocalTrainer):
    """A LocalTrainer that remembers the raw update it clips (outside the trainer: its own
    attributes are set back after every user, forty-seventh review follow-up, privacy 2)."""

    seen: typing.ClassVar[list] = []

    def clip(self, delta, clip_norm):
        type(self).seen.append(delta.clone())
        return super().clip(delta, clip_norm)

    @property
    def raw(self):
        return self.seen[-1]


@pytest.mark.parametrize("noise_std", [0.0, 0.05])
def test_equals_what_local_trainer_sends(noise_std):
    """The public function with noise_generator's keys gives LocalTrainer's update bit for bit."""
    task = build_task("toy", num_users=6, dim=5, num_classes=3, seed=1)
    trainer = _Capturing(task, device="cpu")
    config = LocalConfig(
        learning_rate=0.5, epochs=2, batch_size=4, clip_norm=0.1, noise_std=noise_std
    )
    for stream in ("train", "adadp-half"):
        result = trainer.train(
            initial_flat(task),
            user_id=4,
            round_num=3,
            config=config,
            rngs=RngFactory(seed=9),
            stream=stream,
        )
        gen = noise_generator(seed=9, secure=False, round_num=3, user_id=4, stream=stream)
        out = privatize_update(
            trainer.raw, clip_norm=0.1, noise_std=noise_std, generator=gen if noise_std else None
        )
        assert torch.equal(out.vector, result.delta)
        assert (out.norm, out.clipped) == (result.norm, result.clipped)
        assert result.clipped  # the toy task's update is far above 0.1


def test_secure_noise_generators_are_fresh():
    a = noise_generator(seed=None, secure=True, round_num=1, user_id=0)
    b = noise_generator(seed=None, secure=True, round_num=1, user_id=0)
    assert not torch.equal(torch.randn(8, generator=a), torch.randn(8, generator=b))
