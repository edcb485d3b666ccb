"""Issue 15, thirty-ninth hostile review (mechanisms: clipping, the noised sum, accountants): tests.

1. ``NoisyMeanAggregator.aggregate`` of an update on the meta device (``torch.empty(4,
   device="meta")``), of a ``RowSparse`` whose rows or values are on the meta device or whose
   values are a sparse tensor, and of a sparse COO or CSR update (a hostile or broken reply
   among honest ones). Before: the meta and sparse-values cases raised torch's
   ``NotImplementedError`` ("Cannot copy out of meta tensor; no data!", "Could not run
   'aten::as_strided' ... 'SparseCPU'") out of the whole aggregation, so one malformed entry
   failed the round, where the docstring says it is rejected with its reason; a sparse COO
   update was rejected as "contains NaN or Inf". Now each is rejected alone, with its reason
   (``sparse.dense_problem``: ``a tensor on the meta device holds no data``, ``a dense
   (strided) tensor is needed, got layout torch.sparse_coo``), the honest entries summed as
   before; a meta ``sum_noise`` is refused as not a (floating tensor, variance) pair.
2. ``NoisyCountAggregator(...).aggregate([(0, report), (1, 1.0)], ...)`` (adaptive clipping's
   noised count; ``AdaptiveClipping.screen`` checks a round's replies with the same
   ``check``) with a one-element clip report on the meta device or sparse, server and
   distributed mode. Before: torch's ``RuntimeError`` ("Tensor.item() cannot be called on meta
   tensors", "reshape is not implemented for sparse tensors") out of the whole count. Now the
   report is rejected alone ("clip bit must be one finite number", ``adaptive_clip._scalar``)
   and the other counted.
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.privacy.adaptive_clip import NoisyCountAggregator
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.sparse import RowSparse


def _aggregator() -> NoisyMeanAggregator:
    return NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1.0, expected_cohort_size=2)


def _malformed() -> dict[str, object]:
    honest_rows = torch.tensor([0])
    return {
        "meta": torch.empty(4, device="meta"),
        "coo": torch.tensor([3.0, 0.0, 4.0, 0.0]).to_sparse(),
        "csr": torch.tensor([[3.0, 0.0, 4.0, 0.0]]).to_sparse_csr(),
        "rows on meta": RowSparse(torch.empty(1, dtype=torch.int64, device="meta"),
                                  torch.tensor([[0.6, 0.0, 0.8, 0.0]]), 4),
        "values on meta": RowSparse(honest_rows, torch.empty(1, 4, device="meta"), 4),
        "sparse values": RowSparse(honest_rows, torch.tensor([[0.6, 0.0, 0.8, 0.0]]).to_sparse(),
                                   4),
    }  # fmt: skip


@pytest.mark.parametrize("case", list(_malformed()))
def test_a_meta_or_sparse_update_is_rejected_alone_with_its_reason(case):
    bad = _malformed()[case]
    honest = torch.tensor([0.6, 0.0, 0.8, 0.0])
    result = _aggregator().aggregate(
        [(0, honest), (1, bad)], dim=4, generator=torch.Generator().manual_seed(0)
    )
    assert result.metrics["accepted"] == 1.0
    assert set(result.rejected) == {1}
    reason = result.rejected[1]
    assert "meta device" in reason or "dense (strided)" in reason
    assert "NaN" not in reason
    alone = _aggregator().aggregate(
        [(0, honest)], dim=4, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(result.delta_tilde, alone.delta_tilde)


def test_a_meta_sum_noise_is_refused_naming_it():
    with pytest.raises(ValueError, match="sum_noise must be a"):
        _aggregator().aggregate(
            [(0, torch.tensor([0.6, 0.0, 0.8, 0.0]))],
            dim=4,
            sum_noise=(torch.empty(4, device="meta"), 1.0),
        )


@pytest.mark.parametrize("mode", ["server", "distributed"])
@pytest.mark.parametrize("layout", ["meta", "sparse"])
def test_a_meta_or_sparse_clip_report_is_rejected_alone(mode, layout):
    counter = NoisyCountAggregator(
        count_stddev=1.0,
        expected_cohort_size=4,
        noise_mode=mode,
        min_shares=2 if mode == "distributed" else None,
    )
    report = torch.empty(1, device="meta") if layout == "meta" else torch.ones(1).to_sparse()
    honest = 1.0 if mode == "server" else 0.73  # a share, not an exact bit (47th, mechanisms 2)
    result = counter.aggregate(
        [(0, report), (1, honest)], generator=torch.Generator().manual_seed(0)
    )
    assert result.counted == 1
    assert result.rejected == {0: "clip bit must be one finite number"}
