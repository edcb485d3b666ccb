"""Secure mode: generators seeded from OS entropy and Opacus' floating-point hardened Gaussian
sampler (sum of four draws, halved; Holohan & Braghin 2021); seeded mode unchanged."""

import math

import pytest
import torch
from scipy import stats

from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.noise import add_gaussian_noise, gaussian_noise, secure_gaussian_noise
from fedprivopt.privacy.rng import RngFactory, SecureGenerator
from fedprivopt.simulation.run import simulate
from tests.simulation.test_run import small_config


def _seeded(cls, seed):
    gen = cls()
    gen.manual_seed(seed)
    return gen


def test_secure_factory_makes_secure_generators_and_seeded_does_not():
    secure = RngFactory(seed=None, secure=True)
    assert isinstance(secure.generator(1, "server-noise"), SecureGenerator)
    plain = RngFactory(seed=3).generator(1, "server-noise")
    assert type(plain) is torch.Generator
    a = gaussian_noise(64, 1.0, generator=secure.generator(1, "server-noise"))
    b = gaussian_noise(64, 1.0, generator=secure.generator(1, "server-noise"))
    assert not torch.equal(a, b)  # the same (round, purpose): fresh OS entropy each time


def test_secure_noise_has_the_right_distribution():
    std, n = 1.7, 400_000
    x = gaussian_noise(n, std, generator=RngFactory(seed=None, secure=True).generator(1, "n"))
    assert x.dtype == torch.float32 and x.shape == (n,)
    x = x.double()
    # sample variance: standard error sqrt(2/n) ~ 0.22 %; the bound is loose (about 9 SE)
    assert abs(float(x.var()) / std**2 - 1) < 0.02
    assert abs(float(x.mean())) < 5 * std / math.sqrt(n)
    assert stats.kstest(x[:50_000].numpy() / std, "norm").pvalue > 1e-4


def test_secure_sampler_is_opacus_secure_mode_bit_for_bit():
    from opacus.optimizers.optimizer import _generate_noise

    for std, n in ((0.7, 1001), (3.0, 17)):
        ours = secure_gaussian_noise(n, std, generator=_seeded(torch.Generator, 5))
        theirs = _generate_noise(
            std, torch.empty(n), generator=_seeded(torch.Generator, 5), secure_mode=True
        )
        assert torch.equal(ours, theirs)
    # and it is what a secure-mode generator gets from gaussian_noise / add_gaussian_noise
    ours = gaussian_noise(99, 0.5, generator=_seeded(SecureGenerator, 8))
    assert torch.equal(ours, secure_gaussian_noise(99, 0.5, generator=_seeded(torch.Generator, 8)))
    x = torch.ones(3, 33, dtype=torch.float64)
    y = add_gaussian_noise(x, 0.5, generator=_seeded(SecureGenerator, 8))
    ref = secure_gaussian_noise(99, 0.5, generator=_seeded(torch.Generator, 8), dtype=x.dtype)
    assert y.dtype == torch.float64 and torch.equal(y, x + ref.reshape(3, 33))
    zero = secure_gaussian_noise(5, 0.0, generator=_seeded(torch.Generator, 1))
    assert torch.equal(zero, torch.zeros(5))


def test_seeded_sampler_is_unchanged_one_draw_per_entry():
    rngs = RngFactory(seed=9)
    ref = torch.empty(1000).normal_(0.0, 2.0, generator=rngs.generator(3, "server-noise"))
    assert torch.equal(gaussian_noise(1000, 2.0, generator=rngs.generator(3, "server-noise")), ref)
    # forcing the secure sampler on a seeded generator is possible (and reproducible)
    a = gaussian_noise(50, 1.0, generator=_seeded(torch.Generator, 2), secure=True)
    b = gaussian_noise(50, 1.0, generator=_seeded(torch.Generator, 2), secure=True)
    assert torch.equal(a, b)


def test_secure_server_noise_on_the_mean_has_the_accounted_std():
    sigma, clip, m_bar, dim = 1.3, 0.5, 10.0, 300_000
    agg = NoisyMeanAggregator(clip_norm=clip, noise_multiplier=sigma, expected_cohort_size=m_bar)
    out = agg.aggregate(
        [], dim=dim, generator=RngFactory(seed=None, secure=True).generator(1, "server-noise")
    )
    assert out.noise_std == pytest.approx(sigma * clip / m_bar)
    assert abs(float(out.delta_tilde.double().std()) / out.noise_std - 1) < 0.01


SECURE_RUN = {"num-server-rounds": 3}


def test_two_secure_runs_differ_and_seeded_runs_are_reproducible(tmp_path):
    seeded = [simulate(small_config(**SECURE_RUN), tmp_path / f"seeded{i}") for i in range(2)]
    assert torch.equal(seeded[0].params, seeded[1].params)
    assert seeded[0].rows == [
        {**row, "seconds": seeded[0].rows[i]["seconds"]} for i, row in enumerate(seeded[1].rows)
    ]
    secure = [
        simulate(small_config(secure=True, **SECURE_RUN), tmp_path / f"secure{i}") for i in range(2)
    ]
    assert not torch.equal(secure[0].params, secure[1].params)
    assert not torch.equal(secure[0].params, seeded[0].params)
    # the privacy accounting does not depend on where the randomness comes from
    assert secure[0].epsilon == secure[1].epsilon == seeded[0].epsilon
