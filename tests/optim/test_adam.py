import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivopt.optim import AdamState, adam, flower_fedadam

from ._helpers import randn, run

DELTA = (0.1, -0.2, 0.0)


def t64(*values):
    return torch.tensor(values, dtype=torch.float64)


NO_BC_STEP = t64(0.1 * 0.01 / 0.011, -0.1 * 0.02 / 0.021, 0.0)


def test_no_bias_correction_hand_computed():
    # m = 0.1 * delta = [0.01, -0.02, 0]; v = 0.01 * delta^2 = [1e-4, 4e-4, 0];
    # step = 0.1 * m / (sqrt(v) + 1e-3) = [0.1 * 0.01 / 0.011, 0.1 * -0.02 / 0.021, 0].
    tx = adam(learning_rate=0.1, beta1=0.9, beta2=0.99, tau=1e-3, bias_correction=False)
    (step,), state = run(tx, [t64(*DELTA)])
    torch.testing.assert_close(step, NO_BC_STEP)
    torch.testing.assert_close(state.mu, t64(0.01, -0.02, 0.0))
    torch.testing.assert_close(state.nu, t64(1e-4, 4e-4, 0.0))
    assert state.count == 1


def test_bias_corrected_first_step_hand_computed():
    # t = 1: m_hat = delta, v_hat = delta^2, step = 0.1 * delta / (|delta| + 1e-3).
    tx = adam(learning_rate=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    (step,), _ = run(tx, [t64(*DELTA)])
    torch.testing.assert_close(step, t64(0.1 * 0.1 / 0.101, -0.1 * 0.2 / 0.201, 0.0))


def test_tau_none_follows_the_noise_std_passed_each_round():
    # tau None: tau_t = sqrt(Phi_t). t = 1: step = 0.1 * delta / (|delta| + sqrt(Phi_t)), and the
    # second round uses its own Phi: the same steps as fixed taus 0.03 then 0.5.
    tx = adam(learning_rate=0.1, tau=None)
    state = tx.init(t64(0, 0, 0))
    step, state = tx.update(t64(*DELTA), state, noise_variance=0.03**2)
    torch.testing.assert_close(step, t64(0.1 * 0.1 / 0.13, -0.1 * 0.2 / 0.23, 0.0))
    step2, _ = tx.update(t64(*DELTA), state, noise_variance=0.25)
    fixed = [adam(learning_rate=0.1, tau=tau) for tau in (0.03, 0.5)]
    s1 = fixed[0].init(t64(0, 0, 0))
    _, s1 = fixed[0].update(t64(*DELTA), s1)
    expected, _ = fixed[1].update(t64(*DELTA), s1)
    torch.testing.assert_close(step2, expected)
    assert tx.hparams["tau"] is None


@pytest.mark.parametrize("noise_variance", [None, 0.0, -1.0, float("nan")])
def test_tau_none_needs_a_positive_noise_variance(noise_variance):
    tx = adam(learning_rate=0.1, tau=None)
    with pytest.raises(ValueError, match="noise_variance"):
        tx.update(t64(*DELTA), tx.init(t64(0, 0, 0)), noise_variance=noise_variance)


def test_raw_tau_first_step_hand_computed():
    # t = 1, tau on the raw sqrt(v): 0.1 * (sqrt(0.01) / 0.1) * m / (sqrt(v) + 1e-3), which at
    # t = 1 equals the uncorrected step because sqrt(1 - 0.99) / (1 - 0.9) = 1.
    tx = adam(learning_rate=0.1, tau_placement="raw")
    (step,), _ = run(tx, [t64(*DELTA)])
    torch.testing.assert_close(step, NO_BC_STEP)
    # With count_offset = 1 the exponent is t = 2: scale sqrt(1 - 0.99**2) / (1 - 0.9**2).
    tx = adam(learning_rate=0.1, tau_placement="raw", count_offset=1)
    (step,), _ = run(tx, [t64(*DELTA)])
    scale = math.sqrt(1 - 0.99**2) / (1 - 0.9**2)
    torch.testing.assert_close(step, NO_BC_STEP * scale)


def _kingma_reference(deltas, lr, b1, b2, eps):
    """Algorithm 1 of Kingma & Ba in float64 numpy, written out independently."""
    m = np.zeros_like(deltas[0])
    v = np.zeros_like(deltas[0])
    steps = []
    for t, g in enumerate(deltas, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1**t)
        v_hat = v / (1 - b2**t)
        steps.append(lr * m_hat / (np.sqrt(v_hat) + eps))
    return steps


def test_matches_kingma_reference_over_several_steps(gen):
    deltas = [randn(50, gen, std=0.05, dtype=torch.float64) for _ in range(6)]
    tx = adam(learning_rate=0.02, beta1=0.8, beta2=0.95, tau=1e-4)
    steps, _ = run(tx, deltas)
    expected = _kingma_reference([d.numpy() for d in deltas], 0.02, 0.8, 0.95, 1e-4)
    for ours, ref in zip(steps, expected, strict=True):
        np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-12, atol=1e-15)


def test_conventions_differ_after_the_first_step(gen):
    deltas = [randn(20, gen, std=1e-3, dtype=torch.float64) for _ in range(3)]
    corrected, _ = run(adam(learning_rate=0.1, tau=1e-3), deltas)
    raw, _ = run(adam(learning_rate=0.1, tau=1e-3, tau_placement="raw"), deltas)
    # tau is comparable to |delta| here, so where tau sits changes the step by far more than
    # float error (about sqrt(1 - beta2^t) on tau).
    assert (corrected[1] - raw[1]).abs().max() > 1e-3


@settings(max_examples=40, deadline=None)
@given(value=st.floats(-10.0, 10.0, allow_nan=False), tau=st.floats(1e-6, 1.0))
def test_first_bias_corrected_step_is_bounded_by_learning_rate(value, tau):
    tx = adam(learning_rate=0.3, tau=tau)
    (step,), _ = run(tx, [torch.full((2,), value, dtype=torch.float64)])
    expected = 0.3 * value / (abs(value) + tau)
    torch.testing.assert_close(step, torch.full((2,), expected, dtype=torch.float64))
    assert step.abs().max() < 0.3


def test_float32_in_float32_out(gen):
    tx = adam(learning_rate=0.1)
    params = randn(10, gen)
    steps, state = run(tx, [randn(10, gen, std=0.1) for _ in range(3)], params=params)
    assert all(s.dtype == torch.float32 for s in steps)
    assert isinstance(state, AdamState)
    assert state.mu.dtype == state.nu.dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"learning_rate": 0.1, "beta1": 1.0}, "beta1"),
        ({"learning_rate": 0.1, "beta1": -0.5}, "beta1"),
        ({"learning_rate": 0.1, "beta2": 1.0}, "beta2"),
        ({"learning_rate": 0.1, "tau": 0.0}, "tau"),
        ({"learning_rate": 0.1, "bias_correction": 1}, "bias_correction"),
        ({"learning_rate": 0.1, "tau_placement": "inside"}, "tau_placement"),
        ({"learning_rate": 0.1, "count_offset": -1}, "count_offset"),
        ({"learning_rate": 0.1, "count_offset": 1.0}, "count_offset"),
    ],
)
def test_validation_names_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        adam(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"eta": 0.0}, "eta"),
        ({"beta_1": 1.0}, "beta_1"),
        ({"beta_2": 2.0}, "beta_2"),
        ({"tau": -1.0}, "tau"),
    ],
)
def test_flower_fedadam_validation_uses_flower_names(kwargs, name):
    with pytest.raises(ValueError, match=name):
        flower_fedadam(**kwargs)


def test_flower_fedadam_records_its_adam_arguments():
    tx = flower_fedadam(eta=0.05, beta_1=0.8, beta_2=0.9, tau=1e-2)
    assert dict(tx.hparams) == {
        "name": "adam",
        "learning_rate": 0.05,
        "beta1": 0.8,
        "beta2": 0.9,
        "tau": 1e-2,
        "bias_correction": True,
        "tau_placement": "raw",
        "count_offset": 1,
    }
