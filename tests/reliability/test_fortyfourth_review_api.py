"""Issue 15, forty-fourth hostile review (api: the documented Python API): tests.

1. A single-cohort strategy (dp-fedavg, secure mode): ``a = alg.sample(1)`` and
   ``b = alg.sample(1, "sampling-2")`` (ADADP's purpose of its second cohort), then
   ``alg.aggregate(1, updates, cohort=b, stream="train-2")`` when ``b`` held a chosen user and
   ``a`` did not (the forty-third review's api 8 through the second purpose). Before: the
   stream ``"train-2"`` took the cohort of the ``"sampling-2"`` draw, a second independent draw
   of the round, so the caller chose between two draws: user 7 was in the released cohort in
   44.5% of 200 runs where q is 0.25, charged as one Poisson sample of rate q (epsilon 7.55).
   Now ``AlgorithmCohorts._stream_purpose`` gives ``"sampling-2"`` only to a strategy with two
   cohorts a round (ADADP): ``b`` is refused as users round 1 did not sample; ADADP's second
   cohort is summed by ``aggregate`` only after its first (``stream="train"``), as
   ``run_round`` does.
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.strategies import build_algorithm
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
)


def _updates(users):
    return {u: torch.full((4,), 0.1) for u in users}


# -- finding 1: the second purpose's draw summed by a single-cohort strategy ------------------


@pytest.mark.parametrize("secure", [False, True])
def test_1_a_single_cohort_strategy_sums_no_second_draw(secure):
    alg = build_algorithm(_config(secure=secure), torch.zeros(4))
    first, second = alg.sample(1), alg.sample(1, "sampling-2")
    extra = sorted(set(second) - set(first))
    assert extra  # another draw of the round
    with pytest.raises(ValueError, match=r"cohort holds users round 1 did not sample"):
        alg.aggregate(1, _updates(second), cohort=second, stream="train-2")  # was summed
    assert alg.accountant.num_events == 0
    agg = alg.aggregate(1, _updates(first), cohort=first)
    assert agg.metrics["accepted"] == len(first)


def test_1_adadp_sums_its_second_cohort_after_its_first():
    alg = build_algorithm(_config(secure=True, strategy="dp-fedavg-adadp"), torch.zeros(4))
    first, second = alg.sample(1), alg.sample(1, "sampling-2")
    with pytest.raises(ValueError, match=r"second cohort \(stream 'train-2'\) follows its first"):
        alg.aggregate(1, _updates(second), cohort=second, stream="train-2")  # a choice of two
    alg.aggregate(1, _updates(first), cohort=first, stream="train")
    agg = alg.aggregate(1, _updates(second), cohort=second, stream="train-2")
    assert agg.metrics["accepted"] == len(second)
