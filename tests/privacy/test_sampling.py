import math

import numpy as np
import pytest
import torch

from fedprivopt.privacy import FixedSizeSampler, PoissonSampler, RngFactory, make_sampler


def test_poisson_is_reproducible_by_seed_and_round():
    s = PoissonSampler(1000, 0.05, RngFactory(seed=4))
    assert torch.equal(s.sample(3), PoissonSampler(1000, 0.05, RngFactory(seed=4)).sample(3))
    assert not torch.equal(s.sample(3), s.sample(4))
    assert not torch.equal(s.sample(3), s.sample(3, purpose="second-cohort"))


def test_poisson_inclusion_is_independent_with_rate_q():
    n, q, rounds = 400, 0.05, 2000
    s = PoissonSampler(n, q, RngFactory(seed=0))
    counts = np.zeros(n)
    sizes = []
    for r in range(rounds):
        ids = s.sample(r).numpy()
        assert np.all(np.diff(ids) > 0) and ids.min(initial=0) >= 0 and ids.max(initial=0) < n
        counts[ids] += 1
        sizes.append(len(ids))
    # cohort size ~ Binomial(n, q): mean and variance
    assert np.mean(sizes) == pytest.approx(n * q, abs=4 * math.sqrt(n * q * (1 - q) / rounds))
    assert np.var(sizes) == pytest.approx(n * q * (1 - q), rel=0.15)
    # every user joins with the same marginal probability
    per_user = counts / rounds
    assert abs(per_user.mean() - q) < 0.002
    assert per_user.std() == pytest.approx(math.sqrt(q * (1 - q) / rounds), rel=0.2)
    assert s.expected_cohort_size == 20.0


def test_poisson_rate_one_takes_everyone():
    assert PoissonSampler(7, 1.0).sample(0).tolist() == list(range(7))


def test_fixed_size_draws_m_distinct_users_uniformly():
    n, m, rounds = 50, 5, 4000
    s = FixedSizeSampler(n, m, RngFactory(seed=1))
    counts = np.zeros(n)
    for r in range(rounds):
        ids = s.sample(r).numpy()
        assert len(ids) == m and len(set(ids)) == m
        counts[ids] += 1
    assert counts.sum() == m * rounds
    assert np.abs(counts / rounds - m / n).max() < 0.025
    assert s.sample_rate == 0.1 and s.expected_cohort_size == 5.0


def test_invalid_sampler_arguments():
    with pytest.raises(ValueError, match="sample_rate"):
        PoissonSampler(10, 0.0)
    with pytest.raises(ValueError, match="sample_rate"):
        PoissonSampler(10, 1.5)
    with pytest.raises(ValueError, match="population"):
        PoissonSampler(0, 0.5)
    with pytest.raises(ValueError, match="cohort_size"):
        FixedSizeSampler(10, 11)
    with pytest.raises(ValueError, match="sampling"):
        make_sampler("uniform", population=10, sample_rate=0.1)
    assert make_sampler("poisson", population=100, cohort_size=10).sample_rate == 0.1


@pytest.mark.parametrize("kind", ["poisson", "fixed"])
def test_population_is_bounded_before_anything_is_drawn(kind):
    """Issue 15: population 10**9 was accepted and its first round allocated 8 GB."""
    from fedprivopt.privacy.sampling import MAX_POPULATION

    with pytest.raises(ValueError, match=r"population must be an integer in \[1, 100000000\]"):
        make_sampler(kind, population=10**9, sample_rate=0.5, cohort_size=5)
    assert make_sampler(kind, population=MAX_POPULATION, cohort_size=5).population == 10**8


def test_one_sampling_spec_builds_the_sampler_and_its_event():
    from fedprivopt.privacy.sampling import SamplingSpec

    poisson = SamplingSpec("poisson", 200, cohort_size=10)
    assert poisson.sample_rate == 0.05
    assert poisson.sampler().sample_rate == poisson.event(1.0).sample_rate == 0.05
    fixed = SamplingSpec("fixed", 200, cohort_size=10)
    assert fixed.sampler().cohort_size == fixed.event(1.0).cohort_size == 10
    assert fixed.event(1.0).sampling == "fixed" and poisson.event(2.0).noise_multiplier == 2.0
    assert SamplingSpec("poisson", sample_rate=0.1).event(1.0).sample_rate == 0.1  # no N needed
    with pytest.raises(ValueError, match="needs population to build a sampler"):
        SamplingSpec("poisson", sample_rate=0.1).sampler()
    with pytest.raises(ValueError, match="poisson sampling needs sample_rate"):
        SamplingSpec("poisson", cohort_size=10)
    with pytest.raises(ValueError, match="fixed sampling needs population and cohort_size"):
        SamplingSpec("fixed", 200)
