"""Forty-seventh review of issue 15, mechanisms: regression tests of its findings.

1. ``NoisyMeanAggregator(clip_norm=1, noise_multiplier=s, expected_cohort_size=10).aggregate(
   ..., dim=20000, sum_noise=TreeNoise(std=s, ...).release(1))`` (the tree's noise handed to the
   documented mechanism as it comes: ``release`` returns the noise and its node count, where
   ``sum_noise`` is the noise and its variance) reported ``noise_std`` 0.1 for any node std:
   the mean carried 0.2 at ``s = 2`` and 0.05 at ``s = 0.5`` (more noise reported than added);
   a variance below the aggregator's ``σ²C²`` (a tree of another std) was taken as well. Now
   the variance must be at least ``σ²C²`` and, for more than 200 entries, fit the draws' own
   mean square (within the ``e^-50`` bounds of Laurent and Massart).
"""

from __future__ import annotations

import math

import pytest
import torch

from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.privacy.tree import TreeNoise

# -- finding 1: sum_noise's variance is the variance of its draws, at least sigma^2 C^2 -------


@pytest.mark.parametrize("std", [0.5, 2.0])
def test_1_sum_noise_variance_must_be_that_of_its_draws(std):
    dim = 20_000
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=std, expected_cohort_size=10)
    users = [(u, torch.zeros(dim)) for u in range(3)]
    tree = TreeNoise(std=std, restart_rounds=4, rngs=RngFactory(seed=0), dim=dim)
    with pytest.raises(ValueError, match=r"sum_noise"):
        # before: accepted, noise_std 0.1 reported where the mean carried std / 10
        agg.aggregate(users, dim=dim, sum_noise=tree.release(1))
    tree = TreeNoise(std=std, restart_rounds=4, rngs=RngFactory(seed=0), dim=dim)
    for round_num in (1, 2, 3, 4):  # the tree's own variance (nodes * std^2), as a strategy
        noise, nodes = tree.release(round_num)
        out = agg.aggregate(users, dim=dim, sum_noise=(noise, nodes * std**2))
        measured = float(out.delta_tilde.double().std())
        assert out.noise_std == pytest.approx(std * math.sqrt(nodes) / 10)
        assert measured == pytest.approx(out.noise_std, rel=0.05)


def test_1_sum_noise_below_the_aggregators_variance_is_refused():
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=2.0, expected_cohort_size=1.0)
    noise = torch.randn(4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"below the aggregator's sigma\^2 C\^2 = 4"):
        agg.aggregate([(0, torch.zeros(4))], dim=4, sum_noise=(noise, 1.0))
    assert agg.aggregate([], dim=4, sum_noise=(2.0 * noise, 4.0)).noise_std == 2.0
