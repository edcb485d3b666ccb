"""ADADP's noise-calibrated tolerance and its safety factor."""

import math

import pytest
import torch

from fedprivopt.optim import NOISE_MARGIN, adadp, adadp_error, noise_calibrated_tolerance


def test_noise_calibrated_tolerance_closed_form():
    tol = noise_calibrated_tolerance(learning_rate=2.0, noise_std=0.03, dim=5_000_000)
    assert tol == pytest.approx(NOISE_MARGIN * 2.0 * 0.03 * math.sqrt(2_500_000))
    assert noise_calibrated_tolerance(
        learning_rate=1.0, noise_std=0.1, dim=8, margin=2.0
    ) == pytest.approx(2.0 * 0.1 * 2.0)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"noise_std": -1.0}, "noise_std"),
        ({"noise_std": math.nan}, "noise_std"),
        ({"dim": 0}, "dim"),
        ({"dim": 2.5}, "dim"),
        ({"margin": 0.0}, "margin"),
    ],
)
def test_noise_calibrated_tolerance_rejects_bad_input(kwargs, name):
    base = {"learning_rate": 1.0, "noise_std": 0.1, "dim": 10}
    with pytest.raises(ValueError, match=name):
        noise_calibrated_tolerance(**{**base, **kwargs})


def test_pure_noise_error_is_the_predicted_one():
    # two independent noised means of pure noise: err(eta) = eta * s * sqrt(d/2) within 1%
    d, s, lr = 200_000, 0.05, 0.7
    g = torch.Generator().manual_seed(0)
    w = torch.zeros(d)
    d1 = torch.randn(d, generator=g) * s
    d2 = torch.randn(d, generator=g) * s
    full = w + lr * d1
    two_half = w + 0.5 * lr * d1 + 0.5 * lr * d2
    err = adadp_error(full, two_half)
    tol = noise_calibrated_tolerance(learning_rate=lr, noise_std=s, dim=d, margin=1.0)
    assert err == pytest.approx(tol, rel=0.01)


def test_safety_factor_scales_the_learning_rate_factor():
    w = torch.zeros(4)
    d1 = torch.tensor([1.0, 0.0, 0.0, 0.0])
    d2 = torch.tensor([0.0, 0.0, 0.0, 0.0])
    # err = (lr/2) * 1 = 0.05 at lr 0.1; tau/err = 0.8 -> sqrt 0.894
    plain = adadp(learning_rate=0.1, tolerance=0.04, alpha_min=0.1, alpha_max=10.0)
    safe = adadp(learning_rate=0.1, tolerance=0.04, alpha_min=0.1, alpha_max=10.0, safety=0.9)
    a = plain.update(plain.init(), w, d1, d2)
    b = safe.update(safe.init(), w, d1, d2)
    assert a.error == pytest.approx(0.05) == b.error
    assert a.factor == pytest.approx(math.sqrt(0.8))
    assert b.factor == pytest.approx(0.9 * math.sqrt(0.8))
    with pytest.raises(ValueError, match="safety"):
        adadp(learning_rate=0.1, tolerance=0.04, safety=1.5)


def test_settled_error_stays_below_tolerance_with_safety():
    # deterministic error proportional to eta (the noise-dominated regime): with s = 1 the rate
    # converges to err = tau from below; with s = 0.9 it settles at err = 0.81 tau.
    w = torch.zeros(2)
    d1 = torch.tensor([2.0, 0.0])
    d2 = torch.tensor([0.0, 0.0])  # err = eta while |w1| = 2 eta < 1
    ctl = adadp(learning_rate=0.01, tolerance=0.2, safety=0.9)
    state = ctl.init()
    for _ in range(200):
        res = ctl.update(state, w, d1, d2)
        assert res.accepted
        state = res.state
    assert state.learning_rate == pytest.approx(0.81 * 0.2, rel=1e-3)
    plain = adadp(learning_rate=0.01, tolerance=0.2)
    state = plain.init()
    for _ in range(200):
        state = plain.update(state, w, d1, d2).state
    assert state.learning_rate == pytest.approx(0.2, rel=1e-3)  # err -> tau itself
