"""Issue 15, thirty-eighth hostile review (mechanisms: clipping, the sum and its noise): tests.

1. ``NoisyMeanAggregator.aggregate`` (every strategy's sum) of 130 float32 updates at
   ``C = 5.3e36``, ``σ = 1`` (``σC`` within the float32 model's bound): 65 users of
   ``+0.999C`` on one coordinate, then 65 of ``-0.999C`` (exact sum 0): the mean was ``inf``
   in 20 of 20 seeds; with one user fewer it was finite in 20 of 20. The sum was kept in the
   model's dtype, so a partial sum that overflowed stayed infinite whatever noise was added:
   the release said, without noise, whether one user was there. 66 float16 updates of norm
   ``C = 1000`` alike (``inf`` every time where the exact sum plus noise is finite; 256 + 1 is
   256 in bfloat16, so a bfloat16 sum of 300 updates of 1.0 came out 256). The sum is now kept
   in float64 where the model's dtype could overflow (``aggregate.sum_dtype``: float16 and
   bfloat16 always, float32 at a bound above 1.7e30, so every float32 run keeps its bits) and
   rounded to the model's dtype after the noise is added (post-processing): finite, the mean
   about 0, 999 and 1.0; a float64 aggregation at a bound where 10**8 updates could overflow is
   refused.
2. ``ServerAlgorithm.aggregate(1, updates, clip_norm=100)`` (Python API) of a tree run
   (``noise-mechanism = "tree"``) at ``clip-norm = 1``, ``σ = 1``: the update of norm 100 was
   clipped at 100 and got the tree's node noise, drawn for ``C = 1``: released as 10.02 with
   noise std 0.1, a hundredth of the charged noise multiplier (the Gaussian mechanism scales
   its noise with the norm given). Now refused (``clip_norm must be the run's clip-norm 1
   under tree aggregation ...``) before any noise is drawn.
3. ``NoisyMeanAggregator.aggregate`` of a float64 update holding an entry of at least
   ``2^1023`` (``[1.7e308, 0, 0, 0]``), or whose norm exceeds the float range
   (``[1e308] x 4``), dense, ``RowSparse`` or in a ``RowSparseBatch``: ``OverflowError`` from
   ``received.prescaled`` (``factor * 2.0**1024``): one hostile reply failed the whole round.
   Now the factor is scaled by ``math.ldexp`` and an update of infinite measured norm is
   re-clipped by ``clip_l2`` (``received.exact_reclip``): accepted, within ``C``, direction kept.
4. ``flatten({"w": ..., "odd": t})`` with ``t`` sparse, quantized or float8: torch's
   ``RuntimeError`` (reshape, type promotion); on the meta device: a flat vector without data.
   Now ``ValueError: state['odd'] cannot be flattened: ...`` naming the key and why.
5. ``privatize_update(torch.empty(3, device="meta"), clip_norm=1.0)`` (a user's own ClientApp's
   privacy step) and a float8 update (also with ``clip_norm=None``): torch's ``RuntimeError``
   ("Tensor.item() cannot be called on meta tensors") and ``NotImplementedError`` ("isfinite"
   not implemented for 'Float8_e4m3fn'), raised by the finiteness check before ``clip_l2``'s
   refusal. Now ``ValueError`` naming the update and what it must be.
6. ``NoisyMeanAggregator.aggregate([(0, [0.6, 0, 0.8, 0])], dim=4, sum_noise=(torch.randn(1),
   1.0))`` (Python API; the tree's way to hand its noise in), also a 0-dim or an expanded
   ``randn(1).expand(4)`` noise: broadcast, one draw on every coordinate, so the differences of
   the released coordinates were 0.6, 0, 0.8, 0, the update without noise, reported with noise
   std 1.0. Now refused unless the noise has shape ``(dim,)`` and a stride of its own.
7. ``v * clip_factor(l2_norm(v), 1.0, torch.float64)`` for a float64 ``v`` of 10**6 entries
   (256 of 1.0, the rest about 2^-27.6): exact norm ``1 + 4.6e-14``, above ``C``, where the
   docstring said the margin covers a norm measured by ``l2_norm`` (its 4 float64 ulps do not;
   the aggregator had its own correction). ``clip_factor(..., numel=n)`` now aims at
   ``C·(1 − 2·norm_error_bound(n))`` (the aggregator calls it so, the same bits), and the
   docstring says a norm is taken as exact without ``numel``.
8. ``NoisyCountAggregator.aggregate`` (adaptive clipping's count; ``AdaptiveClipping.screen``
   leaves a reply out of the sum when its bit fails the same check) of bits ``np.float32(1.0)``,
   ``np.int64(0)``, ``np.float16(1.0)``, which ``count_share`` takes: each rejected as "clip bit
   must be one finite number", and in a strategy its update left out. NumPy real scalars are
   now read as numbers; bools are still refused.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from fedprivopt.privacy import aggregate
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.sparse import RowSparse, RowSparseBatch

# -- finding 1: a partial sum that overflows is not released as infinite ---------------------


def _mean(updates, *, clip, sigma, dtype, seed=0, m=65.0):
    agg = NoisyMeanAggregator(clip_norm=clip, noise_multiplier=sigma, expected_cohort_size=m)
    gen = torch.Generator().manual_seed(seed)
    return agg.aggregate(updates, dim=2, dtype=dtype, generator=gen).delta_tilde


def test_1_a_float32_sum_whose_partial_sums_overflow_is_released_finite():
    c = 5.3e36
    up, down = torch.tensor([0.999 * c, 0.0]), torch.tensor([-0.999 * c, 0.0])
    # a tensor of its own per user (forty-fifth review, mechanisms 1: one shared is refused)
    everyone = [(u, up.clone()) for u in range(65)] + [(65 + u, down.clone()) for u in range(65)]
    for seed in range(5):
        out = _mean(everyone, clip=c, sigma=1.0, dtype=torch.float32, seed=seed)
        assert out.dtype == torch.float32 and bool(torch.isfinite(out).all())  # was inf
        assert abs(float(out[0])) < 10 * c / 65  # noise only: std σC/m̄
        fewer = _mean(everyone[1:], clip=c, sigma=1.0, dtype=torch.float32, seed=seed)
        assert bool(torch.isfinite(fewer).all())


def test_1_float16_and_bfloat16_sums_are_kept_wider():
    ups = [(u, torch.tensor([999.0, 0.0], dtype=torch.float16)) for u in range(66)]
    out = _mean(ups, clip=1000.0, sigma=1.0, dtype=torch.float16, m=66.0)
    assert out.dtype == torch.float16 and bool(torch.isfinite(out).all())  # was inf
    assert 900 < float(out[0]) < 1100
    ones = [(u, torch.tensor([1.0, 0.0], dtype=torch.bfloat16)) for u in range(300)]
    out = _mean(ones, clip=1.0, sigma=1e-20, dtype=torch.bfloat16, m=300.0)
    assert out.dtype == torch.bfloat16 and float(out[0]) == 1.0  # was 256/300


def test_1_a_batch_sums_as_its_users_alone_in_the_wider_sum():
    rows = torch.zeros(8, dtype=torch.int64)
    values = torch.full((8, 2), 0.7, dtype=torch.bfloat16)
    batch = RowSparseBatch(tuple(range(8)), rows, values, torch.arange(9), 2)
    alone = [(u, RowSparse(rows[:1], values[u : u + 1], 2)) for u in range(8)]
    a = _mean([batch], clip=0.5, sigma=0.1, dtype=torch.bfloat16, m=8.0)
    b = _mean(alone, clip=0.5, sigma=0.1, dtype=torch.bfloat16, m=8.0)
    assert torch.equal(a, b)


def test_1_sum_dtype_keeps_float32_runs_and_refuses_a_float64_overflow():
    sum_dtype = aggregate.sum_dtype
    # forty-eighth review (clipping 1): a private float32 sum is float64 (exact on a grid)
    assert sum_dtype(torch.float32, 1.0) == torch.float64
    assert sum_dtype(torch.float32, float("inf")) == torch.float32  # not private
    assert sum_dtype(torch.float32, 5.3e36) == torch.float64
    assert sum_dtype(torch.float16, 1.0) == torch.float64
    assert sum_dtype(torch.float64, 1e250) == torch.float64
    with pytest.raises(ValueError, match="too large for a float64 model"):
        sum_dtype(torch.float64, 1e305)


# -- finding 2: a tree run's sum is clipped at the norm its node noise is drawn for -----------


def _tree_algorithm():
    from fedprivopt.strategies import StrategyConfig, build_algorithm

    values = {"strategy": "dp-fedavg", "population": 40, "clients-per-round": 10,
              "num-server-rounds": 4, "noise-multiplier": 1.0, "delta": 1e-4, "seed": 0,
              "noise-mechanism": "tree", "tree-restart-rounds": 4, "clip-norm": 1.0}  # fmt: skip
    return build_algorithm(StrategyConfig.from_mapping(values), torch.zeros(4))


def test_2_a_tree_round_refuses_another_clip_norm():
    alg = _tree_algorithm()
    users = alg.sample(1)
    update = {users[0]: torch.tensor([100.0, 0.0, 0.0, 0.0])}
    with pytest.raises(ValueError, match="clip_norm must be the run's clip-norm 1 under tree"):
        alg.aggregate(1, update, clip_norm=100.0, cohort=users)  # was released: 10.02 ± 0.1
    agg = alg.aggregate(1, update, clip_norm=1.0, cohort=users)  # the run's own norm as before
    assert agg.metrics["tree_nodes"] == 1.0 and float(agg.delta_tilde[0]) < 1.0


# -- finding 3: a float64 update near the float maximum is re-clipped, not a crash ------------


@pytest.mark.parametrize("form", ["dense", "row-sparse", "batch"])
@pytest.mark.parametrize("entries", [[1.7e308, 0.0, 0.0, 0.0], [1e308, 1e308, -1e308, 1e308]])
def test_3_a_float64_update_at_the_float_maximum_is_reclipped(form, entries):
    x = torch.tensor(entries, dtype=torch.float64)
    if form == "dense":
        updates = [(0, x)]
    elif form == "row-sparse":
        updates = [(0, RowSparse(torch.zeros(1, dtype=torch.int64), x[None], 4))]
    else:
        updates = [RowSparseBatch((0,), torch.zeros(1, dtype=torch.int64), x[None],
                                  torch.tensor([0, 1]), 4)]  # fmt: skip
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1e-100, expected_cohort_size=1.0)
    gen = torch.Generator().manual_seed(0)
    out = agg.aggregate(updates, dim=4, dtype=torch.float64, generator=gen)  # was OverflowError
    assert out.metrics["accepted"] == 1.0 and not out.rejected
    norm = float(torch.linalg.vector_norm(out.delta_tilde))
    assert 0.999 < norm <= 1.0  # clipped to C in its own direction (noise std 1e-100)
    direction = x / 1e308
    cosine = float(out.delta_tilde @ direction) / norm / float(direction.norm())
    assert cosine > 1 - 1e-12


# -- finding 4: flatten names a tensor it cannot flatten ---------------------------------------


def _quantized() -> torch.Tensor:
    with warnings.catch_warnings():  # torch deprecates quantized tensors (still made)
        warnings.simplefilter("ignore")
        return torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (lambda: torch.eye(3).to_sparse(), "dense"),
        (lambda: torch.empty(3, device="meta"), "meta device"),
        (lambda: torch.ones(2, dtype=torch.float8_e4m3fn), "float8"),
        (lambda: _quantized(), "quantized"),
    ],
)
def test_4_flatten_refuses_what_has_no_flat_entries(value, reason):
    from fedprivopt.privacy.flat import flatten

    state = {"w": torch.ones(2), "odd": value()}
    with pytest.raises(ValueError, match=rf"state\['odd'\] cannot be flattened: .*{reason}"):
        flatten(state)  # was torch's RuntimeError (a meta tensor: a flat vector without data)


# -- finding 5: privatize_update names an update it cannot clip -------------------------------


@pytest.mark.parametrize("clip_norm", [1.0, None])
@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: torch.empty(3, device="meta"), "meta device"),
        (lambda: torch.ones(3, dtype=torch.float8_e4m3fn), "float16, bfloat16, float32 or float64"),
    ],
)
def test_5_privatize_update_refuses_a_meta_or_float8_update(make, reason, clip_norm):
    from fedprivopt.clients.privatize import privatize_update

    with pytest.raises(ValueError, match=rf"update must .*{reason}"):
        privatize_update(make(), clip_norm=clip_norm)  # was RuntimeError / NotImplementedError


# -- finding 6: a sum noise of one draw for every coordinate is refused ------------------------


@pytest.mark.parametrize(
    "noise", [lambda: torch.randn(1), lambda: torch.randn(()), lambda: torch.randn(1).expand(4)]
)
def test_6_sum_noise_must_be_one_draw_per_coordinate(noise):
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1.0, expected_cohort_size=1.0)
    update = torch.tensor([0.6, 0.0, 0.8, 0.0])
    with pytest.raises(ValueError, match=r"sum_noise must hold one draw per coordinate"):
        # was released: the differences of its coordinates were 0.6, 0, 0.8, 0 (noise std 1.0)
        agg.aggregate([(0, update)], dim=4, sum_noise=(noise(), 1.0))
    out = agg.aggregate([(0, update)], dim=4, sum_noise=(torch.randn(4), 1.0))
    assert out.noise_std == 1.0


# -- finding 7: clip_factor can cover l2_norm's measurement error ------------------------------


def _exact_sq_minus(v: torch.Tensor, c: float) -> float:
    """``‖v‖² − c²`` exactly rounded (Dekker's error-free squares summed by ``math.fsum``)."""

    def terms(a: torch.Tensor) -> list[float]:
        t = a * 134217729.0
        hi = t - (t - a)
        lo = a - hi
        return torch.cat([hi * hi, 2 * hi * lo, lo * lo]).tolist()

    return math.fsum(terms(v.abs()) + [-x for x in terms(torch.tensor([c], dtype=v.dtype))])


def test_7_clip_factor_with_numel_keeps_a_float64_vector_within_c():
    from fedprivopt.privacy.clip import clip_factor, l2_norm

    n = 2 * 10**5
    v = torch.full((n,), 2.0**-26.5, dtype=torch.float64)
    v[torch.randperm(n, generator=torch.Generator().manual_seed(0))[:256]] = 1.0
    v = v * (1 + 1e-3 * torch.rand(n, generator=torch.Generator().manual_seed(1), dtype=v.dtype))
    assert _exact_sq_minus(v * clip_factor(l2_norm(v), 1.0, torch.float64), 1.0) > 0  # as before
    factor = clip_factor(l2_norm(v), 1.0, torch.float64, numel=n)
    assert _exact_sq_minus(v * factor, 1.0) <= 0  # was 1 + 4e-14 (no way to cover it)
    assert clip_factor(0.5, 1.0, numel=4) == 1.0 and clip_factor(2.0, 1.0) == 0.5 * (1 - 2**-21)


# -- finding 8: a NumPy scalar clip bit is counted --------------------------------------------


def test_8_a_numpy_scalar_clip_bit_is_counted():
    from fedprivopt.privacy.adaptive_clip import NoisyCountAggregator

    counter = NoisyCountAggregator(count_stddev=1.0, expected_cohort_size=4.0)
    reports = [(0, np.float32(1.0)), (1, np.int64(0)), (2, np.float16(1.0)), (3, 1.0)]
    out = counter.aggregate(reports, generator=torch.Generator().manual_seed(0))
    assert out.counted == 4 and not out.rejected  # 3 were 'clip bit must be one finite number'
    bad = counter.aggregate([(0, np.bool_(True)), (1, True)], generator=torch.Generator())
    assert sorted(bad.rejected) == [0, 1]  # a bool is not a bit the wire sends, as before
