"""Row-sparse updates are checked, re-clipped and summed like the dense vectors they stand for."""

import math

import pytest
import torch

from fedprivopt.privacy import RngFactory
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.sparse import RowSparse, RowSparseBatch

WIDTH, ROWS = 4, 6
DIM = WIDTH * ROWS


def _sparse(rows, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(len(rows), WIDTH, generator=gen) * scale
    return RowSparse(torch.tensor(rows, dtype=torch.int64), values, DIM)


def test_to_dense_and_add_to():
    s = _sparse([0, 2, 5], 0)
    dense = s.to_dense()
    assert dense.shape == (DIM,)
    assert torch.equal(dense.view(ROWS, WIDTH)[[0, 2, 5]], s.values)
    assert float(dense.view(ROWS, WIDTH)[[1, 3, 4]].abs().sum()) == 0.0
    total = torch.ones(DIM)
    s.add_to(total, alpha=0.5)
    torch.testing.assert_close(total, 1 + 0.5 * dense)


@pytest.mark.parametrize(
    ("update", "needle"),
    [
        (RowSparse(torch.tensor([0, 0]), torch.zeros(2, WIDTH), DIM), "strictly increasing"),
        (RowSparse(torch.tensor([3, 1]), torch.zeros(2, WIDTH), DIM), "strictly increasing"),
        (RowSparse(torch.tensor([6]), torch.zeros(1, WIDTH), DIM), "out of range"),
        (RowSparse(torch.tensor([-1]), torch.zeros(1, WIDTH), DIM), "out of range"),
        (RowSparse(torch.tensor([0]), torch.zeros(1, WIDTH), DIM + 4), "length"),
        (RowSparse(torch.tensor([0]), torch.zeros(1, 5), DIM), "does not divide"),
        (RowSparse(torch.tensor([0]), torch.zeros(1, WIDTH, dtype=torch.float64), DIM), "dtype"),
        (RowSparse(torch.tensor([0.0]), torch.zeros(1, WIDTH), DIM), "int64"),
        (RowSparse(torch.tensor([0, 1]), torch.zeros(1, WIDTH), DIM), "one row"),
        (RowSparse(torch.tensor([0]), torch.zeros(WIDTH), DIM), "shape"),
    ],
)
def test_malformed_row_sparse_updates_are_rejected(update, needle):
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1.0, expected_cohort_size=2.0)
    result = agg.aggregate([(7, update)], dim=DIM, generator=RngFactory(0).generator(1, "n"))
    assert needle in result.rejected[7]
    assert result.metrics["accepted"] == 0.0


def test_sparse_and_dense_aggregates_agree():
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=0.7, expected_cohort_size=3.0)
    updates = [_sparse([0, 2], 1), _sparse([1, 2, 5], 2, scale=0.01), _sparse([], 3)]
    updates[2] = RowSparse(torch.empty(0, dtype=torch.int64), torch.empty(0, WIDTH), DIM)
    gens = [RngFactory(5).generator(1, "server-noise") for _ in range(2)]
    sparse = agg.aggregate(list(enumerate(updates)), dim=DIM, generator=gens[0])
    dense = agg.aggregate(
        [(i, u.to_dense()) for i, u in enumerate(updates)], dim=DIM, generator=gens[1]
    )
    torch.testing.assert_close(sparse.delta_tilde, dense.delta_tilde, rtol=0, atol=1e-7)
    assert sparse.metrics == pytest.approx(dense.metrics, rel=1e-6)


@pytest.mark.parametrize("poison", ["huge", "nan", "inf"])
def test_a_hostile_row_sparse_update_moves_the_mean_by_at_most_c_over_m(poison):
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1.0, expected_cohort_size=4.0)
    honest = [(u, _sparse([u % ROWS], u, scale=0.1)) for u in range(3)]
    bad = _sparse([0, 3, 4], 9, scale=1e6)
    if poison != "huge":
        bad.values[1, 2] = math.nan if poison == "nan" else math.inf
    gens = [RngFactory(5).generator(1, "server-noise") for _ in range(2)]
    with_bad = agg.aggregate([*honest, (99, bad)], dim=DIM, generator=gens[0])
    without = agg.aggregate(honest, dim=DIM, generator=gens[1])
    moved = float((with_bad.delta_tilde - without.delta_tilde).norm())
    assert moved <= 1.0 / 4.0 * (1 + 1e-5)
    assert torch.isfinite(with_bad.delta_tilde).all()
    if poison == "huge":
        assert with_bad.metrics["server_clipped"] == 1.0 and moved > 0.2
    else:
        assert 99 in with_bad.rejected and moved == 0.0


# -- batches: a chunk of users handed over at once -------------------------------------------


def _batch(updates):
    """A RowSparseBatch of ``(user, RowSparse)`` pairs (rows back to back)."""
    from fedprivopt.privacy.sparse import RowSparseBatch

    counts = [u.rows.numel() for _, u in updates]
    ptr = torch.zeros(len(updates) + 1, dtype=torch.int64)
    ptr[1:] = torch.cumsum(torch.tensor(counts, dtype=torch.int64), 0)
    return RowSparseBatch(
        tuple(user for user, _ in updates),
        torch.cat([u.rows for _, u in updates]),
        torch.cat([u.values for _, u in updates]),
        ptr,
        DIM,
    )


def _mixed_updates():
    """Honest users of every size (some above the clip norm), and hostile ones between them."""
    honest = [
        (0, _sparse([0, 2], 1)),
        (1, _sparse([1, 2, 5], 2, scale=0.01)),
        (2, RowSparse(torch.empty(0, dtype=torch.int64), torch.empty(0, WIDTH), DIM)),
        (3, _sparse([0, 1, 2, 3, 4, 5], 4, scale=3.0)),
    ]
    nan = _sparse([3, 4], 5)
    nan.values[1, 0] = math.nan
    inf = _sparse([1], 6)
    inf.values[0, 3] = -math.inf
    huge = _sparse([0, 5], 7, scale=1e30)  # squares overflow float32: measured after rescaling
    hostile = [
        (4, nan),
        (5, inf),
        (6, huge),
        (7, RowSparse(torch.tensor([2, 2]), torch.ones(2, WIDTH), DIM)),
        (8, RowSparse(torch.tensor([5, 6]), torch.ones(2, WIDTH), DIM)),
        (9, RowSparse(torch.tensor([3, 1]), torch.ones(2, WIDTH), DIM)),
    ]
    return [*honest[:2], *hostile[:3], *honest[2:], *hostile[3:]]


@pytest.mark.parametrize("noise_mode", ["server", "distributed"])
def test_a_batch_aggregates_exactly_as_its_users_alone(noise_mode):
    agg = NoisyMeanAggregator(
        clip_norm=1.0, noise_multiplier=0.7, expected_cohort_size=3.0, noise_mode=noise_mode,
        min_shares=2 if noise_mode == "distributed" else None,
    )  # fmt: skip
    updates = _mixed_updates()
    gens = [RngFactory(5).generator(1, "server-noise") for _ in range(3)]
    alone = agg.aggregate(updates, dim=DIM, generator=gens[0])
    batched = agg.aggregate([_batch(updates[:4]), _batch(updates[4:])], dim=DIM, generator=gens[1])
    mixed = agg.aggregate([updates[0], _batch(updates[1:7]), *updates[7:]], dim=DIM,
                          generator=gens[2])  # fmt: skip
    for result in (batched, mixed):
        assert torch.equal(result.delta_tilde, alone.delta_tilde)  # the same sum, to the bit
        assert result.metrics == alone.metrics
        assert result.rejected == alone.rejected
    if noise_mode == "distributed":  # a row-sparse update is no (dense) noise share: rejected
        assert set(alone.rejected) == set(range(10)) and alone.metrics["accepted"] == 0.0
        return  # (thirty-fifth review of issue 15, mechanisms 6)
    assert set(alone.rejected) == {4, 5, 7, 8, 9}
    assert "NaN or Inf" in alone.rejected[4] and "NaN or Inf" in alone.rejected[5]
    assert "strictly increasing" in alone.rejected[7] and "out of range" in alone.rejected[8]
    assert alone.metrics["accepted"] == 5.0 and alone.metrics["received"] == 10.0


@pytest.mark.parametrize("scale", [1e-3, 0.3, 1.0, 7.0, 1e6, 1e30, 3e38])
def test_each_user_of_a_batch_moves_the_sum_by_at_most_the_clip_norm(scale):
    agg = NoisyMeanAggregator(clip_norm=0.5, noise_multiplier=0.0, expected_cohort_size=1.0)
    users = [(u, _sparse(sorted({u % ROWS, (3 * u + 1) % ROWS}), u, scale=scale)) for u in range(9)]
    for user, update in users:
        alone = agg.aggregate([_batch([(user, update)])], dim=DIM).delta_tilde
        assert float(alone.double().norm()) <= 0.5  # the re-clipped update, as the sum sees it
    mean = agg.aggregate([_batch(users)], dim=DIM).delta_tilde  # non-private: the plain mean
    assert float(mean.double().norm()) <= 0.5 * (1 + 1e-6)


def test_a_malformed_batch_rejects_all_its_users_and_only_them():
    from fedprivopt.privacy.sparse import RowSparseBatch

    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1.0, expected_cohort_size=2.0)
    good = _batch([(1, _sparse([0], 1)), (2, _sparse([3], 2))])
    bad_ptr = RowSparseBatch((3, 4), good.rows, good.values, torch.tensor([0, 2, 1]), DIM)
    short_ptr = RowSparseBatch((3, 4), good.rows, good.values, torch.tensor([0, 2]), DIM)
    bad_dtype = RowSparseBatch((5, 6), good.rows, good.values.double(), good.row_ptr, DIM)
    lone = (7, _sparse([1], 3))
    for bad, needle in ((bad_ptr, "nondecreasing"), (short_ptr, "offsets"), (bad_dtype, "dtype")):
        gens = [RngFactory(5).generator(1, "server-noise") for _ in range(2)]
        result = agg.aggregate([bad, lone], dim=DIM, generator=gens[0])
        reference = agg.aggregate([lone], dim=DIM, generator=gens[1])
        assert set(result.rejected) == set(bad.users)
        assert all(needle in r for r in result.rejected.values())
        assert torch.equal(result.delta_tilde, reference.delta_tilde)
        assert result.metrics["received"] == 3.0 and result.metrics["accepted"] == 1.0


def test_segment_norms_agree_with_a_lone_norm_and_flag_nan():
    from fedprivopt.privacy.clip import vector_norm_checked
    from fedprivopt.privacy.sparse import segment_norms_checked

    gen = torch.Generator().manual_seed(3)
    values = torch.randn(40, 7, generator=gen) * torch.logspace(-20, 30, 40)[:, None]
    values[11, 2] = math.nan
    ptr = torch.tensor([0, 3, 3, 10, 12, 20, 21, 40])
    norms = segment_norms_checked(values, ptr)
    for i, norm in enumerate(norms):
        piece = values[int(ptr[i]) : int(ptr[i + 1])]
        if not torch.isfinite(piece).all():
            assert norm is None
            continue
        exact = float(piece.double().norm())
        assert norm == pytest.approx(exact, rel=1e-6, abs=0.0)
        assert norm == pytest.approx(vector_norm_checked(piece), rel=1e-6, abs=0.0)
    assert norms[1] == 0.0 and norms[3] is None


def test_batch_split_clone_and_views():
    updates = [(3, _sparse([0, 4], 1)), (5, _sparse([], 2)), (9, _sparse([1, 2, 5], 3))]
    updates[1] = (5, RowSparse(torch.empty(0, dtype=torch.int64), torch.empty(0, WIDTH), DIM))
    batch = _batch(updates)
    assert len(batch) == 3 and batch.problem(DIM, torch.float32) is None
    assert batch.user_problems(DIM) == [None, None, None]
    split = batch.split()
    clone = batch.clone()
    batch.values.zero_()  # the batch's memory reused: the split and the clone keep their values
    for (u, got), (v, want), i in zip(split, updates, range(3), strict=True):
        assert u == v and torch.equal(got.rows, want.rows) and torch.equal(got.values, want.values)
        assert torch.equal(clone.update(i).values, want.values)
        assert float(batch.update(i).values.abs().sum()) == 0.0


def test_segment_norms_of_entries_whose_squares_underflow_are_not_zero():
    from fedprivopt.privacy.sparse import segment_norms_checked

    values = torch.full((3, WIDTH), 1e-29)
    values[2] = 0.0
    norms = segment_norms_checked(values, torch.tensor([0, 2, 3]))
    assert norms[0] == pytest.approx(float(values[:2].double().norm()), rel=1e-6)
    assert norms[1] == 0.0


# -- sixth review: the server's re-clip is within C for every dtype and layout -----------------


def _exact_sq(t: torch.Tensor):
    """Exact squared L2 norm (a Fraction) of a float32 or float64 tensor."""
    from fractions import Fraction

    import numpy as np

    a = np.abs(t.detach().reshape(-1).cpu().numpy())
    vals, counts = np.unique(a, return_counts=True)
    if len(vals) < 1000:  # few distinct values (the crafted cases): count them
        return sum(int(c) * Fraction(float(v)) ** 2 for v, c in zip(vals, counts, strict=True))
    assert a.dtype == np.float32  # many: 24-bit integer mantissas, summed per exponent
    mant, exp = np.frexp(a.astype(np.float64))
    m = (mant * 2.0**24).astype(np.int64)
    exp = exp.astype(np.int64) - 24
    hi, lo = m >> 12, m & 4095  # m² = hi²·2^24 + 2·hi·lo·2^12 + lo², each sum fits int64
    total = Fraction(0)
    for e in np.unique(exp):
        h, low = hi[exp == e], lo[exp == e]
        s = (int((h * h).sum()) << 24) + (int((2 * h * low).sum()) << 12) + int((low * low).sum())
        total += s * Fraction(2) ** int(2 * e)
    return total


def _one_row(x: torch.Tensor) -> RowSparse:
    return RowSparse(torch.tensor([0]), x.view(1, -1), x.numel())


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("case", ["randn-2M", "crafted-65536"])
def test_server_reclip_of_a_row_sparse_update_is_within_c(case, batched):
    """Row norms were taken in float32 (torch's vector_norm), off by more than clip_factor's
    4-ulp margin: 1.0000283·C for randn(2M), 1.0000128·C for 64 entries 1.0 and the rest
    2^-12.6 at width 65,536 (sixth review)."""
    if case == "randn-2M":
        x = torch.randn(2_000_000, generator=torch.Generator().manual_seed(0))
    else:
        x = torch.full((65_536,), 2.0**-12.6)
        x[:64] = 1.0
    n = x.numel()
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=0.0, expected_cohort_size=1.0)
    if batched:
        ptr = torch.tensor([0, 1])
        entry = RowSparseBatch((0,), torch.tensor([0]), x.view(1, -1), ptr, n)
    else:
        entry = (0, _one_row(x))
    out = agg.aggregate([entry], dim=n).delta_tilde
    assert _exact_sq(out) <= 1
    assert float(_exact_sq(out)) > 0.99999  # clipped, not zeroed


def test_server_reclip_of_a_float64_update_is_within_c():
    """n = 10^6 float64 (256 entries 1.0, the rest 2^-27.6): exact norm² 1 + 9.3e-14; the 4-ulp
    margin did not cover float64's norm error over a million entries (sixth review)."""
    x = torch.full((10**6,), 2.0**-27.6, dtype=torch.float64)
    x[:256] = 1.0
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=0.0, expected_cohort_size=1.0)
    for update in (x, _one_row(x)):
        out = agg.aggregate([(0, update)], dim=x.numel(), dtype=torch.float64).delta_tilde
        assert 1 - 1e-9 < _exact_sq(out) <= 1


@pytest.mark.parametrize(
    ("rows", "width"),
    [(1, 1), (3, 7), (1000, 500), (7, (1 << 18) + 3)],  # one block, several, a row wider than one
)
def test_float64_row_squares_are_exact_squares_summed_in_float64(rows, width):
    from fedprivopt.privacy.sparse import _row_sq64

    gen = torch.Generator().manual_seed(rows + width)
    values = torch.randn(rows, width, generator=gen)
    values[0, 0] = 3.4e38  # the largest float32s square exactly in float64
    if width > 1:
        values[-1, -1] = 1e-45  # a float32 subnormal
    got = _row_sq64(values)
    assert got.dtype == torch.float64 and got.shape == (rows,)
    for i in range(rows):
        exact = math.fsum(float(x) * float(x) for x in values[i].tolist())  # exact squares
        assert abs(got[i].item() - exact) <= width * 2.0**-53 * exact
    values[rows // 2, 0] = float("nan")
    assert math.isnan(_row_sq64(values)[rows // 2].item())
