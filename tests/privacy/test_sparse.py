"""Row-sparse updates are checked, re-clipped and summed like the dense vectors they stand for."""

import math

import pytest
import torch

from fedprivopt.privacy import RngFactory
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.sparse import RowSparse

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
