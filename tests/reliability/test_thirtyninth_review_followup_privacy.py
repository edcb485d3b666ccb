"""Issue 15, thirty-ninth hostile review, follow-up (privacy: today's fixes of what is released).

1. A nested tensor (``torch.nested.nested_tensor([...])``, whose layout is ``torch.strided``) as
   an update, as a ``RowSparse``'s rows or values, or as adaptive clipping's one-element clip
   report, through ``NoisyMeanAggregator.aggregate``, ``NoisyCountAggregator.aggregate`` and a
   ``drive_round`` train callback (dp-fedavg server and distributed mode, ADADP): the close
   variant of the thirty-ninth review's mechanisms 1 and 2 (meta and sparse tensors). Before:
   ``sparse.dense_problem`` and ``adaptive_clip._scalar`` looked at the layout only, so torch's
   ``RuntimeError`` ("NestedTensorImpl doesn't support sizes") came out of the whole
   aggregation (the round failed for one malformed entry). Now the entry is rejected alone
   ("a dense (strided) tensor is needed, got a nested tensor", "clip bit must be one finite
   number") and the honest ones summed as before (the same noised mean as without it).
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.privacy.adaptive_clip import NoisyCountAggregator
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.sparse import RowSparse
from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
)

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")

# -- finding 1: a nested tensor is rejected alone ---------------------------------------------

_HONEST = [0.6, 0.0, 0.8, 0.0]


def _nested(**kw):
    return torch.nested.nested_tensor([torch.tensor(_HONEST)], **kw)


def _nested_entries():
    return {
        "nested": _nested(),
        "nested jagged": _nested(layout=torch.jagged),
        "row-sparse nested values": RowSparse(torch.tensor([0]), _nested(), 4),
        "row-sparse nested rows": RowSparse(
            torch.nested.nested_tensor([torch.tensor([0])]), torch.tensor([_HONEST]), 4
        ),
    }


def _mean(entries):
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1.0, expected_cohort_size=2)
    return agg.aggregate(entries, dim=4, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("case", list(_nested_entries()))
def test_1_a_nested_update_is_rejected_alone(case):
    honest = torch.tensor(_HONEST)
    result = _mean([(0, honest), (1, _nested_entries()[case])])  # RuntimeError before
    assert result.metrics["accepted"] == 1.0 and set(result.rejected) == {1}
    assert "nested tensor" in result.rejected[1]
    assert torch.equal(result.delta_tilde, _mean([(0, honest)]).delta_tilde)


@pytest.mark.parametrize("mode", ["server", "distributed"])
def test_1_a_nested_clip_report_is_rejected_alone(mode):
    counter = NoisyCountAggregator(
        count_stddev=1.0,
        expected_cohort_size=4,
        noise_mode=mode,
        min_shares=2 if mode == "distributed" else None,
    )
    report = torch.nested.nested_tensor([torch.ones(1)])
    result = counter.aggregate([(0, report), (1, 1.0)], generator=torch.Generator().manual_seed(0))
    assert result.counted == 1
    assert result.rejected == {0: "clip bit must be one finite number"}


@pytest.mark.parametrize(
    "strategy,changes",
    [("dp-fedavg", {}), ("dp-fedavg", {"noise-mode": "distributed"}), ("dp-fedavg-adadp", {})],
)
def test_1_a_callback_sending_a_nested_update_has_it_rejected(strategy, changes):
    def train(request):
        out = {u: torch.full((4,), 0.1) for u in request.users}
        out[request.users[0]] = torch.nested.nested_tensor([torch.full((4,), 0.1)])
        return out

    alg = build_algorithm(_config(strategy=strategy, **changes), torch.zeros(4))
    result = drive_round(alg, 1, train)  # RuntimeError out of the round before
    assert result.rejected and all("nested tensor" in why for why in result.rejected.values())
