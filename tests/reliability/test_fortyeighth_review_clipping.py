"""Forty-eighth review of issue 15 (clipping): every public clipping function within C.

1. The sum a release is made of, measured with and without one user: ``NoisyMeanAggregator(
   clip_norm=1, noise_multiplier=1, expected_cohort_size=1).aggregate`` of a float32 cohort of
   1,024 whose first user sends C, then 511 users C and 512 users ``2^-15 (1 + 2^-10)`` (updates
   any user may send; dense pairs, row-sparse, the fast engine's ``RowSparseBatch``, tree noise
   and ``drive_round`` of dp-fedavg alike). The float32 sum rounded each later small update up
   to a whole ulp when the first user was in it and added it exactly when not: the released
   sums (the same seeded noise) differed by 1.0156 C (1.00024 C for a cohort of 128, 1.0624 C
   for 2,048), a sensitivity above the C the noise and epsilon are sized for. Now a private sum
   is float64 and, in server mode for float32, float16 and bfloat16 models, each re-clipped
   update is rounded toward zero to multiples of ``2^(E - 33)`` (``bound < 2^E``): exact for up
   to 2**20 updates (more for a larger expected cohort), whatever the order
   (``aggregate_checks.sum_grid``).

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

import math
import sys
from fractions import Fraction

import pytest
import torch

from fedprivopt.clients import LocalConfig
from fedprivopt.models import initial_flat
from fedprivopt.privacy import RngFactory
from fedprivopt.privacy import aggregate as aggregate_module
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.sparse import RowSparseBatch
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


# -- finding 1: one user's presence changed how the later additions of a float32 sum rounded ----


def _crafted(n: int) -> list[float]:
    """A cohort after its first user: ``B`` updates of C, then updates of just above half an ulp.

    With the first user (C) in it, the float32 sum sits at ``2^k`` and each later small update
    rounds up to a whole ulp; without it, the sum sits below ``2^k`` and adds them exactly.
    """
    b = 2 ** math.floor(math.log2(n / 2)) - 1
    k = math.ceil(math.log2(b + 1))
    return [1.0] * b + [2.0 ** (k - 24) * (1 + 2**-10)] * (n - 1 - b)


def _released(entries, n_users: int, batch: bool) -> torch.Tensor:
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1.0, expected_cohort_size=1.0)
    users = list(range(n_users - len(entries), n_users))
    if batch:  # the fast engine's streamed chunks: one RowSparseBatch, summed by index_add_
        values = torch.tensor(entries).reshape(-1, 1)
        rows = torch.zeros(len(entries), dtype=torch.int64)
        arg = [RowSparseBatch(tuple(users), rows, values, torch.arange(len(entries) + 1), 1)]
    else:
        arg = [(u, torch.tensor([v])) for u, v in zip(users, entries, strict=True)]
    g = torch.Generator().manual_seed(5)  # the same noise with and without the first user
    return agg.aggregate(arg, dim=1, generator=g).delta_tilde.double()


@pytest.mark.parametrize("batch", [False, True])
def test_1_one_user_moves_the_released_sum_by_at_most_c(batch):
    others = _crafted(1024)
    with_user = _released([1.0, *others], 1024, batch)
    without = _released(others, 1024, batch)
    # the release is the float64 sum plus noise cast to float32 (post-processing): its rounding
    # is at most half an ulp each side (2**-14 at 512); before: 1.0156
    ulp = 2.0**-13
    assert abs(float(with_user - without)) <= 1.0 + ulp


def test_1_the_float64_sum_is_exact_whatever_the_other_updates(monkeypatch):
    totals = []

    def zero_noise(dim, std, generator=None, dtype=torch.float32):
        totals.append(sys._getframe(1).f_locals["total"].clone())  # the sum, before any noise
        return torch.zeros(dim, dtype=dtype)

    monkeypatch.setattr(aggregate_module, "gaussian_noise", zero_noise)
    for n in (128, 1024):
        others = _crafted(n)
        _released([1.0, *others], n, False)
        _released(others, n, False)
    for with_user, without in zip(totals[::2], totals[1::2], strict=True):
        assert with_user.dtype == torch.float64
        assert Fraction(float(with_user)) - Fraction(float(without)) <= 1
