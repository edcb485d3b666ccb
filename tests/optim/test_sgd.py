import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivopt.optim import MomentumState, apply_step, momentum_sgd

from ._helpers import run


def t32(*values):
    return torch.tensor(values, dtype=torch.float32)


def test_plain_step_is_learning_rate_times_delta():
    tx = momentum_sgd(learning_rate=0.5)
    params = t32(1.0, -2.0, 0.0)
    delta = t32(0.2, 0.4, -1.0)
    step, state = tx.update(delta, tx.init(params), params)
    torch.testing.assert_close(step, t32(0.1, 0.2, -0.5), rtol=0, atol=0)
    torch.testing.assert_close(apply_step(params, step), t32(1.1, -1.8, -0.5))
    assert state.count == 1


def test_heavy_ball_hand_computed():
    # m1 = [1, 2]; m2 = 0.5 * m1 + [3, -1] = [3.5, 0]; steps are 0.1 * m.
    tx = momentum_sgd(learning_rate=0.1, momentum=0.5)
    steps, state = run(tx, [t32(1.0, 2.0), t32(3.0, -1.0)])
    torch.testing.assert_close(steps[0], t32(0.1, 0.2))
    torch.testing.assert_close(steps[1], t32(0.35, 0.0))
    torch.testing.assert_close(state.momentum, t32(3.5, 0.0))
    assert state.count == 2


def test_nesterov_hand_computed():
    # step_t = lr * (beta * m_t + delta_t):
    # 0.1 * (0.5 * [1, 2] + [1, 2]) and 0.1 * (0.5 * [3.5, 0] + [3, -1]).
    tx = momentum_sgd(learning_rate=0.1, momentum=0.5, nesterov=True)
    steps, _ = run(tx, [t32(1.0, 2.0), t32(3.0, -1.0)])
    torch.testing.assert_close(steps[0], t32(0.15, 0.3))
    torch.testing.assert_close(steps[1], t32(0.475, -0.1))


@settings(max_examples=40, deadline=None)
@given(
    beta=st.floats(0.0, 0.95),
    k=st.integers(1, 12),
    value=st.floats(-3.0, 3.0, allow_nan=False),
)
def test_constant_delta_gives_geometric_series(beta, k, value):
    tx = momentum_sgd(learning_rate=1.0, momentum=beta)
    delta = torch.full((3,), value, dtype=torch.float64)
    steps, _ = run(tx, [delta] * k)
    expected = value * sum(beta**i for i in range(k))
    torch.testing.assert_close(steps[-1], torch.full((3,), expected, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_is_kept_and_input_state_untouched(dtype):
    tx = momentum_sgd(learning_rate=0.1, momentum=0.9)
    params = torch.zeros(4, dtype=dtype)
    state0 = tx.init(params)
    step, state1 = tx.update(torch.ones(4, dtype=dtype), state0, params)
    step2, _ = tx.update(torch.ones(4, dtype=dtype), state1, params)
    assert step.dtype == dtype and step2.dtype == dtype
    assert state1.momentum.dtype == dtype
    assert torch.equal(state0.momentum, torch.zeros(4, dtype=dtype))
    assert state0.count == 0
    torch.testing.assert_close(step2, torch.full((4,), 0.1 * 1.9, dtype=dtype))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"learning_rate": -1.0}, "learning_rate"),
        ({"learning_rate": math.nan}, "learning_rate"),
        ({"learning_rate": math.inf}, "learning_rate"),
        ({"learning_rate": "0.1"}, "learning_rate"),
        ({"learning_rate": True}, "learning_rate"),
        ({"learning_rate": 0.1, "momentum": 1.0}, "momentum"),
        ({"learning_rate": 0.1, "momentum": -0.1}, "momentum"),
        ({"learning_rate": 0.1, "nesterov": True}, "momentum"),
        ({"learning_rate": 0.1, "momentum": 0.9, "nesterov": "yes"}, "nesterov"),
    ],
)
def test_validation_names_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        momentum_sgd(**kwargs)


def test_validation_message_gives_the_range():
    with pytest.raises(ValueError, match=r"momentum must be .* in \[0, 1\), got 1\.5"):
        momentum_sgd(learning_rate=0.1, momentum=1.5)


def test_state_type():
    tx = momentum_sgd(learning_rate=1.0)
    assert isinstance(tx.init(torch.zeros(2)), MomentumState)
    assert dict(tx.hparams) == {
        "name": "momentum_sgd",
        "learning_rate": 1.0,
        "momentum": 0.0,
        "nesterov": False,
    }


# -- max_noise_step: the step's noise per coordinate is at most kappa (stage 10 of issue 14) --


@pytest.mark.parametrize(
    ("phi", "rate"),
    [(0.04, 2.5), (0.0025, 10.0), (1e-4, 10.0), (0.0, 10.0), (None, 10.0), (4.0, 0.25)],
)
def test_max_noise_step_lowers_the_rate_to_kappa_over_the_noise_std(phi, rate):
    # lr 10, kappa 0.5: sqrt(phi) 0.2 -> 0.5 / 0.2 = 2.5; 0.05 -> 10 (lr, equal); 0.01 -> 50 > lr
    tx = momentum_sgd(learning_rate=10.0, max_noise_step=0.5)
    delta = t32(1.0, -2.0)
    step, _ = tx.update(delta, tx.init(t32(0.0, 0.0)), noise_variance=phi)
    torch.testing.assert_close(step, delta * rate)
    if phi:
        noise_step = rate * math.sqrt(phi)  # what a coordinate's noise moves by
        assert noise_step <= 0.5 + 1e-12


def test_max_noise_step_counts_the_momentums_later_steps():
    # beta 0.5: one round's noise moves a coordinate by rate * sqrt(phi) / (1 - beta) in all,
    # so kappa 0.2 at sqrt(phi) 0.5 gives rate 0.2 * 0.5 / 0.5 = 0.2
    tx = momentum_sgd(learning_rate=1.0, momentum=0.5, max_noise_step=0.2)
    state = tx.init(t32(0.0))
    s1, state = tx.update(t32(1.0), state, noise_variance=0.25)
    s2, state = tx.update(t32(1.0), state, noise_variance=0.0)  # no noise: rate 1
    torch.testing.assert_close(s1, t32(0.2))
    torch.testing.assert_close(s2, t32(1.5))  # m = 0.5 * 1 + 1
    assert 0.2 * 0.5 / (1 - 0.5) <= 0.2 + 1e-12
    assert tx.hparams["max_noise_step"] == 0.2
    assert "max_noise_step" not in momentum_sgd(learning_rate=1.0).hparams


@pytest.mark.parametrize("kappa", [0.0, -1.0, math.nan, math.inf, "0.5", True])
def test_max_noise_step_is_validated(kappa):
    with pytest.raises(ValueError, match="max_noise_step"):
        momentum_sgd(learning_rate=1.0, max_noise_step=kappa)


def test_a_bad_noise_variance_is_named():
    tx = momentum_sgd(learning_rate=1.0, max_noise_step=0.5)
    with pytest.raises(ValueError, match="noise_variance"):
        tx.update(t32(1.0), tx.init(t32(0.0)), noise_variance=-1.0)
