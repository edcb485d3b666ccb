"""Issue 15, forty-first hostile review (mechanisms: clipping, noise, accounting): tests.

1. The tag task's vectorized cohort trainer (``task.cohort_trainer``, the fast engine's
   default for the tag presets) at a tiny clip norm with a huge update: ``LocalConfig(
   learning_rate=1e21, clip_norm=1e-25)`` (one local step of 20 synthetic users). Before: each
   user was scaled by ``clip_factor``'s factor cast to float32, where ``C / norm`` (about
   1e-46 to 1e-40) is subnormal or 0: updates of norm up to 1.89 C (the square of norm / C
   up to 3.59), and at ``learning_rate=1e22`` updates of exactly 0, where ``LocalTrainer``
   (``clip_l2``) sends updates of norm C (the server re-clipped the sum; the model trained
   nothing). Now a user whose factor is below the dtype's normal range is clipped by
   ``clip_l2`` (``TagCohortTrainer._clip``): exact norm at most C, within 1e-6 of
   ``LocalTrainer``'s update; ordinary factors as before, to the bit.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from fedprivopt.clients import LocalConfig, LocalTrainer
from fedprivopt.models import initial_flat
from fedprivopt.privacy import RngFactory
from tests.tag_synth import make_synth_dir, tag_task


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return make_synth_dir(tmp_path_factory, "r41-mechanisms")


def _exact_sq(vector: torch.Tensor) -> Fraction:
    return sum((Fraction(x) ** 2 for x in vector.double().tolist() if x), Fraction(0))


@pytest.mark.parametrize("learning_rate", [1e21, 1e22])
def test_1_vectorized_tag_clip_at_a_subnormal_factor(synth_dir, learning_rate):
    task = tag_task(synth_dir)
    w = initial_flat(task)
    clip = 1e-25
    cfg = LocalConfig(learning_rate=learning_rate, epochs=1, batch_size=1000, clip_norm=clip)
    rngs = RngFactory(seed=1)
    users = list(range(6))
    got = dict(task.cohort_trainer(device="cpu", chunk_users=4).train(
        w, users, round_num=1, config=cfg, rngs=rngs
    ))  # fmt: skip
    local = LocalTrainer(task, device="cpu")
    for user in users:
        ref = local.train(w, user_id=user, round_num=1, config=cfg, rngs=rngs).delta
        dense = got[user].to_dense()
        assert _exact_sq(dense) <= Fraction(clip) ** 2, user
        torch.testing.assert_close(dense / clip, ref / clip, rtol=1e-5, atol=1e-6)
