import random

import numpy as np
import pytest
import torch

from fedprivopt.privacy import RngFactory, add_gaussian_noise, derive_seed, gaussian_noise


def test_measured_std_within_5_percent_over_a_million_draws():
    rngs = RngFactory(seed=123)
    for std in (0.01, 1.0, 3.7):
        x = gaussian_noise(1_000_000, std, generator=rngs.generator(5, "noise"))
        assert x.shape == (1_000_000,)
        assert abs(float(x.std()) / std - 1) < 0.05
        assert abs(float(x.mean())) < 5 * std / 1000  # 5 standard errors


def test_same_seed_and_round_give_the_same_noise():
    a = gaussian_noise(1000, 1.0, generator=RngFactory(seed=9).generator(3, "noise"))
    b = gaussian_noise(1000, 1.0, generator=RngFactory(seed=9).generator(3, "noise"))
    assert torch.equal(a, b)


def test_different_rounds_purposes_and_seeds_are_independent():
    rngs = RngFactory(seed=9)
    base = gaussian_noise(200_000, 1.0, generator=rngs.generator(3, "noise"))
    others = [
        gaussian_noise(200_000, 1.0, generator=rngs.generator(4, "noise")),
        gaussian_noise(200_000, 1.0, generator=rngs.generator(3, "client-noise", 17)),
        gaussian_noise(200_000, 1.0, generator=RngFactory(seed=10).generator(3, "noise")),
    ]
    for other in others:
        assert not torch.equal(base, other)
        corr = float(torch.corrcoef(torch.stack([base, other]))[0, 1])
        assert abs(corr) < 5 / np.sqrt(200_000)  # 5 standard errors of a zero correlation


def test_no_global_rng_is_touched_or_used():
    rngs = RngFactory(seed=1)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone())
    a = add_gaussian_noise(torch.zeros(1000), 2.0, generator=rngs.generator(1, "noise"))
    after = (random.getstate(), np.random.get_state()[1], torch.get_rng_state())
    assert before[0] == after[0]
    assert np.array_equal(before[1], after[1])
    assert torch.equal(before[2], after[2])
    # seeding the global generators differently changes nothing
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    b = add_gaussian_noise(torch.zeros(1000), 2.0, generator=rngs.generator(1, "noise"))
    assert torch.equal(a, b)


def test_secure_mode_draws_fresh_seeds_from_the_os():
    rngs = RngFactory(seed=None, secure=True)
    a = gaussian_noise(64, 1.0, generator=rngs.generator(1, "noise"))
    b = gaussian_noise(64, 1.0, generator=rngs.generator(1, "noise"))
    assert not torch.equal(a, b)
    with pytest.raises(ValueError, match="secure"):
        RngFactory(seed=3, secure=True)
    with pytest.raises(ValueError, match="seed"):
        RngFactory(seed=None)


def test_noise_keeps_dtype_device_and_shape():
    x = torch.zeros(3, 5, dtype=torch.float64)
    y = add_gaussian_noise(x, 1.0, generator=RngFactory(seed=0).generator(0, "n"))
    assert y.dtype == torch.float64 and y.shape == (3, 5)
    assert torch.equal(x, torch.zeros(3, 5, dtype=torch.float64))  # input untouched
    z = gaussian_noise(4, 0.0, generator=RngFactory(seed=0).generator(0, "n"))
    assert torch.equal(z, torch.zeros(4))


def test_invalid_arguments():
    g = RngFactory(seed=0).generator(0, "n")
    with pytest.raises(ValueError, match="std"):
        gaussian_noise(3, -1.0, generator=g)
    with pytest.raises(ValueError, match="generator"):
        gaussian_noise(3, 1.0, generator=None)
    with pytest.raises(ValueError, match="seed"):
        derive_seed(-1, 2)


def test_derive_seed_is_stable_and_keyed():
    assert derive_seed(1, 2, "noise") == derive_seed(1, 2, "noise")
    assert len({derive_seed(1, r, "noise") for r in range(1000)}) == 1000
    assert derive_seed(1, 2, "noise") != derive_seed(1, 2, "sampling")
    assert derive_seed(1, 2, "3") != derive_seed(1, 2, 3)
    assert 0 <= derive_seed(2**62, 5) < 2**63
