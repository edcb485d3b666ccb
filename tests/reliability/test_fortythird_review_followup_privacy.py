"""Follow-up (privacy) of the forty-third hostile review of issue 15: today's api, mechanisms
and wire fixes, looked at for bypasses, regressions and twin paths.

Findings
--------
1. api 8's one secure draw a round, by purpose, kept the draw of the last round sampled only:
   ``alg.sample(1)``, then ``alg.sample(2)``, then ``alg.sample(1)`` drew round 1 anew, so a
   caller could still draw round 1 until a chosen user was in it (interleaving another round)
   and ``aggregate(1, updates, cohort=users)`` summed that cohort, charged as a Poisson sample
   of rate q. Before: the third call gave another cohort. Now every unreleased round keeps its
   draw (``ServerAlgorithm.sample``, by purpose and round; a finished round's are forgotten in
   ``_finish``).
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
    _train,
)

# -- finding 1: a secure round drawn again after another round was drawn -----------------------


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp"])
def test_1_a_secure_rounds_draw_survives_a_draw_of_another_round(strategy):
    alg = build_algorithm(_config(secure=True, strategy=strategy), torch.zeros(4))
    first = alg.sample(1)
    draws = []
    for _ in range(10):
        alg.sample(2)
        draws.append(alg.sample(1))  # was a new draw of round 1 each time
    assert all(d == first for d in draws)
    later = alg.sample(3)
    drive_round(alg, 1, _train)
    assert alg.sample(3) == later  # an unreleased round keeps its draw past round 1
