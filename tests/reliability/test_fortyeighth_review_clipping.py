"""Forty-eighth review of issue 15 (clipping): every public clipping function within C.

2. The tag task's vectorized cohort trainer (``task.cohort_trainer().train``, the fast engine's
   default for the tag presets) at a clip norm below ``MIN_CLIP_NORM`` (the Python API's
   ``LocalConfig``; runs refuse it) with a normal clip factor: ``LocalConfig(learning_rate=1e-40,
   clip_norm=3e-45)`` from a zero model. ``TagCohortTrainer._clip`` scaled each user by a product
   with ``clip_factor``'s factor, whose margin does not cover subnormal results' absolute
   rounding: users of exact norm 1.75 C (1.03 C at ``C = 1e-44``), where ``LocalTrainer``
   (``clip_l2``) gives at most C. Such a C now takes ``clip_l2``, as ``clip_l2``'s own fast path
   does.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from fedprivopt.clients import LocalConfig
from fedprivopt.models import initial_flat
from fedprivopt.privacy import RngFactory
from tests.tag_synth import make_synth_dir, tag_task


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return make_synth_dir(tmp_path_factory, "r48-clipping")


def _exact_sq(vector: torch.Tensor) -> Fraction:
    return sum((Fraction(x) ** 2 for x in vector.double().tolist() if x), Fraction(0))


@pytest.mark.parametrize("clip", [1e-44, 3e-45])
def test_2_vectorized_tag_clip_below_min_clip_norm_stays_within_c(synth_dir, clip):
    task = tag_task(synth_dir)
    w = torch.zeros_like(initial_flat(task))
    cfg = LocalConfig(learning_rate=1e-40, epochs=1, batch_size=1000, clip_norm=clip)
    got = dict(task.cohort_trainer(device="cpu", chunk_users=4).train(
        w, list(range(6)), round_num=1, config=cfg, rngs=RngFactory(seed=1)
    ))  # fmt: skip
    assert len(got) == 6
    for user, update in got.items():
        dense = update.to_dense() if hasattr(update, "to_dense") else update
        assert _exact_sq(dense) <= Fraction(clip) ** 2, user
