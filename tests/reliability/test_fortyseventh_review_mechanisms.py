"""Forty-seventh review of issue 15, mechanisms: regression tests of its findings.

1. ``NoisyMeanAggregator(clip_norm=1, noise_multiplier=s, expected_cohort_size=10).aggregate(
   ..., dim=20000, sum_noise=TreeNoise(std=s, ...).release(1))`` (the tree's noise handed to the
   documented mechanism as it comes: ``release`` returns the noise and its node count, where
   ``sum_noise`` is the noise and its variance) reported ``noise_std`` 0.1 for any node std:
   the mean carried 0.2 at ``s = 2`` and 0.05 at ``s = 0.5`` (more noise reported than added);
   a variance below the aggregator's ``σ²C²`` (a tree of another std) was taken as well. Now
   the variance must be at least ``σ²C²`` and, for more than 200 entries, fit the draws' own
   mean square (within the ``e^-50`` bounds of Laurent and Massart).
2. Adaptive clipping in distributed-noise mode (dp-fedavg, sigma 0.8, 10 of 40, ``m_min`` 4), a
   ``drive_round`` callback (or a ClientApp of one's own) that sends each user's exact bit
   (``clip_bit(norm, C)``, 1.0) as its clip report, without ``count_share``'s noise: every
   report was accepted as a share, no top-up was drawn, and the count was released without
   noise (fraction 1.4 = 9/10 + 1/2 exactly in round 1, 1.8 and 1.5 after), reported with
   count noise std 0.075 and charged as noised (epsilon 5.38 after 3 rounds). Now a report
   that is exactly a bit or a centred bit (0, 1, -1/2, 1/2) is no share: rejected, and its
   update left out.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedprivopt.privacy.adaptive_clip import NoisyCountAggregator, clip_bit, count_share
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.privacy.tree import TreeNoise
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round

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


# -- finding 2: a clip report without its count-noise share is no share ----------------------


@pytest.mark.parametrize("report", [0.0, 1.0, -0.5, 0.5, np.float32(1.0)])
def test_2_a_noiseless_clip_report_is_no_share(report):
    counter = NoisyCountAggregator(
        count_stddev=0.5, expected_cohort_size=10, noise_mode="distributed", min_shares=4
    )
    assert counter.check(report)[1] is not None  # before: (report, None), counted
    generator = torch.Generator().manual_seed(0)
    shares = [count_share(1.0, counter.share_std(), generator) for _ in range(200)]
    assert all(counter.check(share)[1] is None for share in shares)


class _Reported(dict):
    clip_bits: dict


def test_2_exact_bits_in_distributed_mode_are_not_released_unnoised():
    config = StrategyConfig.from_mapping(
        {"strategy": "dp-fedavg", "population": 40, "clients-per-round": 10, "delta": 1e-4,
         "num-server-rounds": 1, "noise-multiplier": 0.8, "seed": 0,
         "noise-mode": "distributed", "adaptive-clipping": True}
    )  # fmt: skip
    alg = build_algorithm(config, torch.zeros(1000))
    generator = torch.Generator().manual_seed(1)

    def train(request):
        local = request.settings.local
        out = _Reported({u: torch.randn(1000, generator=generator) * local.noise_std
                         for u in request.users})  # fmt: skip
        out.clip_bits = {u: clip_bit(0.1, local.clip_norm) for u in request.users}
        return out

    result = drive_round(alg, 1, train)
    assert result.metrics["accepted"] == 0.0  # before: 9, the count 9/10 + 1/2 = 1.4 exactly
    assert result.metrics["clip_count_fraction"] != 0.5 + result.metrics["cohort_size"] / 10


# -- finding 3: PrivacyAccountant.set_ledger of something that is no list of pairs ------------


@pytest.mark.parametrize("bad", [None, 5, "ab", [1.0], [("e", 5, 1)], [["e"]], "dict"])
def test_3_set_ledger_refuses_what_is_no_list_of_pairs_naming_it(bad):
    from fedprivopt.privacy.accounting import PrivacyAccountant
    from fedprivopt.privacy.events import SubsampledGaussianEvent

    event = SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=1.0)
    bad = {event: 5} if bad == "dict" else bad
    accountant = PrivacyAccountant()
    accountant.step(event, count=2)
    with pytest.raises(
        ValueError, match=r"ledger.* must be a .*\(SubsampledGaussianEvent, count\)"
    ):
        accountant.set_ledger(bad)  # before: TypeError 'cannot unpack', 'not iterable'
    assert accountant.num_events == 2
    accountant.set_ledger([(event, 5)])
    assert accountant.num_events == 5


# -- finding 4: samplers and the tree built without an RngFactory --------------------------


@pytest.mark.parametrize("rngs", [None, 0, torch.Generator()])
def test_4_samplers_and_the_tree_refuse_rngs_that_is_no_rng_factory(rngs):
    from fedprivopt.privacy.sampling import FixedSizeSampler, PoissonSampler
    from fedprivopt.privacy.tree import TreeCohorts

    builds = [
        lambda: TreeNoise(std=1.0, restart_rounds=4, rngs=rngs, dim=8),
        lambda: TreeCohorts(population=10, cohort_size=2, restart_rounds=4, rngs=rngs),
        lambda: PoissonSampler(10, 0.5, rngs),
        lambda: FixedSizeSampler(10, 2, rngs),
    ]
    for build in builds:  # before: built; the first draw raised AttributeError
        with pytest.raises(ValueError, match=r"rngs must be an RngFactory"):
            build()
    assert PoissonSampler(10, 1.0, RngFactory(seed=0)).sample(1).tolist() == list(range(10))
