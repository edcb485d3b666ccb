import math

import numpy as np
import pytest
import torch

from fedprivopt.optim import AdamBCState, adam, adam_bc, noise_corrected_second_moment

from ._helpers import randn, run


def t64(*values):
    return torch.tensor(values, dtype=torch.float64)


def test_first_step_hand_computed():
    # t = 1: m_hat = delta, v_hat = delta^2 = [0.09, 0.0025, 0.04], Phi_hat = 0.01;
    # v_hat - Phi = [0.08, -0.0075, 0.03] -> floored at 1e-4 -> [0.08, 1e-4, 0.03].
    tx = adam_bc(learning_rate=0.1, gamma=1e-4, noise_variance=0.01, beta1=0.9, beta2=0.99)
    (step,), state = run(tx, [t64(0.3, 0.05, -0.2)])
    expected = t64(0.1 * 0.3 / math.sqrt(0.08), 0.1 * 0.05 / 0.01, -0.1 * 0.2 / math.sqrt(0.03))
    torch.testing.assert_close(step, expected)
    assert state.floor_fraction == pytest.approx(1.0 / 3.0)
    assert state.noise_ema == pytest.approx(0.01 * 0.01)  # (1 - beta2) * Phi
    assert isinstance(state, AdamBCState) and state.count == 1


def _reference(deltas, phis, lr, b1, b2, gamma):
    """The DP-AdamBC update written out in float64 numpy, independently of the module.

    ``gamma=None``: the floor is the bias-corrected noise variance of that step.
    """
    m = np.zeros_like(deltas[0])
    v = np.zeros_like(deltas[0])
    e = 0.0
    steps = []
    for t, (g, phi) in enumerate(zip(deltas, phis, strict=True), start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        e = b2 * e + (1 - b2) * phi
        floor = e / (1 - b2**t) if gamma is None else gamma
        denom = np.sqrt(np.maximum(v / (1 - b2**t) - e / (1 - b2**t), floor))
        steps.append(lr * (m / (1 - b1**t)) / denom)
    return steps


def test_floor_follows_a_moving_noise_variance(gen):
    """gamma=None: the floor is Phi_hat_t, so it moves when the noise does (adaptive clipping)."""
    deltas = [randn(40, gen, std=0.1, dtype=torch.float64) for _ in range(8)]
    phis = [0.004 * 1.5**t for t in range(1, 9)]  # the clip norm growing by 1.22 a round
    tx = adam_bc(learning_rate=0.05, gamma=None, noise_variance=lambda t: 0.004 * 1.5**t)
    steps, _ = run(tx, deltas)
    expected = _reference([d.numpy() for d in deltas], phis, 0.05, 0.9, 0.99, None)
    for ours, ref in zip(steps, expected, strict=True):
        np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-10, atol=1e-14)
    # with a constant Phi it is the fixed floor gamma = Phi
    fixed, _ = run(adam_bc(learning_rate=0.05, gamma=0.004, noise_variance=0.004), deltas)
    follow, _ = run(adam_bc(learning_rate=0.05, gamma=None, noise_variance=0.004), deltas)
    for a, b in zip(fixed, follow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0.0)
    with pytest.raises(ValueError, match=r"gamma = None .* needs noise variance > 0"):
        run(adam_bc(learning_rate=0.05, gamma=None, noise_variance=0.0), deltas[:1])


def test_two_steps_hand_computed():
    # Step 2 with beta1 = 0.5, beta2 = 0.5, Phi = 0.01, deltas [0.3] then [0.1]:
    # m = 0.5*0.15 + 0.05 = 0.125 -> m_hat = 0.125/0.75; v = 0.5*0.045 + 0.005 = 0.0275 ->
    # v_hat = 0.0275/0.75; Phi_hat = (0.5*0.005 + 0.005)/0.75 = 0.01.
    tx = adam_bc(learning_rate=1.0, gamma=1e-6, noise_variance=0.01, beta1=0.5, beta2=0.5)
    steps, _ = run(tx, [t64(0.3), t64(0.1)])
    expected = (0.125 / 0.75) / math.sqrt(0.0275 / 0.75 - 0.01)
    assert float(steps[1]) == pytest.approx(expected, rel=1e-12)


def test_matches_reference_with_varying_noise(gen):
    deltas = [randn(40, gen, std=0.1, dtype=torch.float64) for _ in range(8)]
    phis = [0.004 * (1 + t % 3) for t in range(1, 9)]
    tx = adam_bc(learning_rate=0.05, gamma=1e-5, noise_variance=lambda t: 0.004 * (1 + t % 3))
    steps, _ = run(tx, deltas)
    expected = _reference([d.numpy() for d in deltas], phis, 0.05, 0.9, 0.99, 1e-5)
    for ours, ref in zip(steps, expected, strict=True):
        np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-10, atol=1e-14)


def test_per_call_noise_variance_equals_callable(gen):
    deltas = [randn(10, gen, std=0.1, dtype=torch.float64) for _ in range(5)]
    by_callable = adam_bc(learning_rate=0.1, gamma=1e-4, noise_variance=lambda t: 0.001 * t)
    by_call = adam_bc(learning_rate=0.1, gamma=1e-4, noise_variance=None)
    overridden = adam_bc(learning_rate=0.1, gamma=1e-4, noise_variance=123.0)
    state_a = by_callable.init(deltas[0])
    state_b = by_call.init(deltas[0])
    state_c = overridden.init(deltas[0])
    for t, delta in enumerate(deltas, start=1):
        step_a, state_a = by_callable.update(delta, state_a)
        step_b, state_b = by_call.update(delta, state_b, noise_variance=0.001 * t)
        step_c, state_c = overridden.update(delta, state_c, noise_variance=0.001 * t)
        torch.testing.assert_close(step_a, step_b, rtol=0, atol=0)
        torch.testing.assert_close(step_a, step_c, rtol=0, atol=0)


def test_constant_noise_ema_is_exactly_phi_after_bias_correction():
    tx = adam_bc(learning_rate=0.1, gamma=1e-4, noise_variance=0.02)
    _, state = run(tx, [t64(0.1, 0.2)] * 7)
    assert state.noise_ema / (1 - 0.99**7) == pytest.approx(0.02, rel=1e-12)


def test_zero_noise_reduces_to_bias_corrected_adam(gen):
    # Phi = 0: denominator sqrt(max(v_hat, gamma)); with gamma, tau -> 0 it is m_hat / sqrt(v_hat).
    deltas = [randn(100, gen, std=0.1, dtype=torch.float64) for _ in range(6)]
    bc_steps, _ = run(adam_bc(learning_rate=0.1, gamma=1e-30, noise_variance=0.0), deltas)
    adam_steps, _ = run(adam(learning_rate=0.1, tau=1e-15, bias_correction=True), deltas)
    for a, b in zip(bc_steps, adam_steps, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=0)
    # ... and a floor on v_hat is not the same as adding tau: with a large gamma they differ.
    far, _ = run(adam_bc(learning_rate=0.1, gamma=1e-2, noise_variance=0.0), deltas)
    assert (far[-1] - adam_steps[-1]).abs().max() > 1e-3


def test_pure_noise_centres_corrected_second_moment_on_zero(gen):
    phi = 0.04
    n = 100_000
    tx = adam_bc(learning_rate=0.1, gamma=1e-3 * phi, noise_variance=phi)
    state = tx.init(torch.zeros(n))
    for _ in range(10):
        _, state = tx.update(randn(n, gen, std=math.sqrt(phi)), state)
        corrected = noise_corrected_second_moment(state, beta2=0.99)
        v_hat = corrected + phi
        # The uncorrected v_hat sits at Phi (so a wrong correction would fail below) ...
        assert float(v_hat.mean()) == pytest.approx(phi, rel=0.03)
        # ... while v_hat - Phi_hat centres on 0 (std of this mean is about 0.005 Phi).
        assert abs(float(corrected.double().mean())) < 0.025 * phi
    assert 0.3 < state.floor_fraction < 0.7  # about half the pure-noise coordinates hit gamma


def test_pure_noise_with_varying_variance_centres_on_zero(gen):
    n = 100_000
    phis = [0.01, 0.05, 0.02, 0.08, 0.03]
    tx = adam_bc(learning_rate=0.1, gamma=1e-6, noise_variance=None, beta2=0.5)
    state = tx.init(torch.zeros(n))
    for phi in phis:
        _, state = tx.update(randn(n, gen, std=math.sqrt(phi)), state, noise_variance=phi)
    corrected = noise_corrected_second_moment(state, beta2=0.5)
    # Phi_hat is the bias-corrected EMA of the Phi_t, not the last Phi_t (0.03) nor their mean.
    phi_hat = sum(0.5 * 0.5 ** (5 - t) * p for t, p in enumerate(phis, start=1)) / (1 - 0.5**5)
    assert float((corrected + phi_hat).mean()) == pytest.approx(phi_hat, rel=0.03)
    assert abs(float(corrected.double().mean())) < 0.03 * phi_hat


def test_noise_corrected_second_moment_needs_an_update():
    tx = adam_bc(learning_rate=0.1, gamma=1e-4, noise_variance=0.01)
    with pytest.raises(ValueError, match="count"):
        noise_corrected_second_moment(tx.init(torch.zeros(3)), beta2=0.99)


def test_missing_or_bad_per_round_noise_variance():
    tx = adam_bc(learning_rate=0.1, gamma=1e-4, noise_variance=None)
    state = tx.init(torch.zeros(3))
    with pytest.raises(ValueError, match="noise_variance"):
        tx.update(torch.ones(3), state)
    with pytest.raises(ValueError, match="noise_variance"):
        tx.update(torch.ones(3), state, noise_variance=-1.0)
    bad_callable = adam_bc(learning_rate=0.1, gamma=1e-4, noise_variance=lambda t: math.nan)
    with pytest.raises(ValueError, match="noise_variance"):
        bad_callable.update(torch.ones(3), bad_callable.init(torch.zeros(3)))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"learning_rate": -0.1}, "learning_rate"),
        ({"gamma": 0.0}, "gamma"),
        ({"gamma": math.inf}, "gamma"),
        ({"noise_variance": -0.5}, "noise_variance"),
        ({"noise_variance": "0.1"}, "noise_variance"),
        ({"beta1": 1.0}, "beta1"),
        ({"beta2": 1.5}, "beta2"),
    ],
)
def test_validation_names_the_parameter(kwargs, name):
    base = {"learning_rate": 0.1, "gamma": 1e-4, "noise_variance": 0.01}
    with pytest.raises(ValueError, match=name):
        adam_bc(**{**base, **kwargs})
