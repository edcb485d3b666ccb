import math

import pytest
import torch

from fedprivopt import optim
from fedprivopt.optim import DP2State, dp2, phase, preconditioner

from ._helpers import randn


def t64(*values):
    return torch.tensor(values, dtype=torch.float64)


def make(**overrides):
    kwargs = {
        "sgd_learning_rate": 0.5,
        "adaptive_learning_rate": 0.1,
        "s1": 2,
        "s2": 3,
        "epsilon": 1e-3,
        "beta": 0.9,
    }
    return dp2(**{**kwargs, **overrides})


def test_phase_schedule_s1_2_s2_3_over_12_rounds(gen):
    tx = make()
    state = tx.init(torch.zeros(4))
    seen = []
    for _ in range(12):
        seen.append(phase(state))
        _, state = tx.update(randn(4, gen), state)
    sgd, ada = "sgd", "adaptive"
    assert seen == [sgd, sgd, ada, ada, ada, sgd, sgd, ada, ada, ada, sgd, sgd]
    assert state.count == 12


def test_steps_switch_and_accumulator_hand_computed():
    tx = make()
    state = tx.init(torch.zeros(2, dtype=torch.float64))
    assert preconditioner(state) is None
    d1, d2 = t64(0.2, -0.4), t64(0.6, 0.0)
    step, state = tx.update(d1, state)
    torch.testing.assert_close(step, 0.5 * d1)
    torch.testing.assert_close(state.accumulator, d1)
    assert preconditioner(state) is None and phase(state) == "sgd"
    step, state = tx.update(d2, state)
    torch.testing.assert_close(step, 0.5 * d2)
    # Switch: G = [0.8, -0.4], G/s1 = [0.4, -0.2], v = 0.1 * [0.16, 0.04] = [0.016, 0.004].
    torch.testing.assert_close(state.accumulator, t64(0.0, 0.0), rtol=0, atol=0)
    torch.testing.assert_close(state.second_moment, t64(0.016, 0.004))
    expected_p = t64(math.sqrt(0.016) + 1e-3, math.sqrt(0.004) + 1e-3)
    assert phase(state) == "adaptive"
    torch.testing.assert_close(preconditioner(state), expected_p)
    # Adaptive rounds: clients already preconditioned, so the step is lr_adaptive * delta.
    d3 = t64(1.0, -2.0)
    step, state = tx.update(d3, state)
    torch.testing.assert_close(step, 0.1 * d3)


def test_adaptive_inputs_never_touch_v_or_accumulator(gen):
    tx = make(s1=1, s2=4)
    state = tx.init(torch.zeros(5))
    _, state = tx.update(randn(5, gen), state)  # one SGD round, then the switch
    v, p = state.second_moment.clone(), state.preconditioner.clone()
    for _ in range(4):
        assert phase(state) == "adaptive"
        _, state = tx.update(1e3 * randn(5, gen), state)  # huge adaptive-round inputs
        assert torch.equal(state.second_moment, v)
        assert torch.equal(state.preconditioner, p)
        assert torch.equal(state.accumulator, torch.zeros(5))
    assert phase(state) == "sgd"
    # The next switch folds only the SGD-round input into v.
    d = randn(5, gen)
    _, state = tx.update(d, state)
    torch.testing.assert_close(state.second_moment, 0.9 * v + 0.1 * d.square())


def test_second_cycle_ema_of_v():
    tx = make(s1=2, s2=1, beta=0.5)
    state = tx.init(torch.zeros(1, dtype=torch.float64))
    for d in (1.0, 3.0):  # G/s1 = 2 -> v = 0.5 * 4 = 2
        _, state = tx.update(t64(d), state)
    assert float(state.second_moment) == pytest.approx(2.0)
    _, state = tx.update(t64(100.0), state)  # adaptive round
    for d in (0.0, 2.0):  # G/s1 = 1 -> v = 0.5 * 2 + 0.5 * 1 = 1.5
        _, state = tx.update(t64(d), state)
    assert float(state.second_moment) == pytest.approx(1.5)
    assert float(preconditioner(state)) == pytest.approx(math.sqrt(1.5) + 1e-3)


def test_noise_first_applies_preconditioner_on_server():
    tx = make(s1=1, s2=2, noise_first=True)
    state = tx.init(torch.zeros(2, dtype=torch.float64))
    _, state = tx.update(t64(0.3, -0.1), state)
    p = preconditioner(state)
    torch.testing.assert_close(p, t64(math.sqrt(0.1 * 0.09) + 1e-3, math.sqrt(0.1 * 0.01) + 1e-3))
    d = t64(0.5, 0.5)
    step, state = tx.update(d, state)
    torch.testing.assert_close(step, 0.1 * d / p)
    assert tx.hparams["noise_first"] is True


def test_scale_by_preconditioner_divides_the_adaptive_step_by_mean_p():
    tx = make(s1=1, s2=2, scale_by_preconditioner=True)
    plain = make(s1=1, s2=2)
    states = [t.init(torch.zeros(2, dtype=torch.float64)) for t in (tx, plain)]
    steps = []
    for t, state in zip((tx, plain), states, strict=True):
        sgd_step, state = t.update(t64(0.3, -0.1), state)
        torch.testing.assert_close(sgd_step, 0.5 * t64(0.3, -0.1))  # SGD rounds unchanged
        p = preconditioner(state)
        step, _ = t.update(t64(0.5, 0.5), state)
        steps.append(step)
    mean_p = (math.sqrt(0.1 * 0.09) + math.sqrt(0.1 * 0.01)) / 2 + 1e-3
    torch.testing.assert_close(p.mean().item(), mean_p)
    torch.testing.assert_close(steps[0], steps[1] / mean_p)
    torch.testing.assert_close(steps[1], 0.1 * t64(0.5, 0.5))
    assert tx.hparams["scale_by_preconditioner"] is True
    # noise-first already divides by P: the option is off there
    assert (
        make(noise_first=True, scale_by_preconditioner=True).hparams["scale_by_preconditioner"]
        is False
    )


def test_noise_variance_subtraction_floors_at_zero():
    # Phi = 1 per round, s1 = 2: the noise variance of G/s1 is Phi/s1 = 0.5.
    tx = make(s1=2, s2=1, noise_variance=1.0, subtract_noise_variance=True)
    state = tx.init(torch.zeros(2, dtype=torch.float64))
    for d in (t64(0.1, 2.0), t64(0.1, 2.0)):  # G/s1 = [0.1, 2.0]
        _, state = tx.update(d, state)
    # [0.01 - 0.5, 4 - 0.5] -> floored [0, 3.5]; v = 0.1 * that.
    torch.testing.assert_close(state.second_moment, t64(0.0, 0.35))
    torch.testing.assert_close(state.preconditioner, t64(1e-3, math.sqrt(0.35) + 1e-3))
    assert state.accumulator_noise_variance == 0.0  # reset with the accumulator


def test_varying_noise_variance_is_summed_over_the_sgd_phase():
    # Per-call Phi_t of 0.2 and 0.6: variance of G/2 is (0.2 + 0.6) / 4 = 0.2.
    tx = make(s1=2, s2=1, noise_variance=None, subtract_noise_variance=True, beta=0.0)
    state = tx.init(torch.zeros(1, dtype=torch.float64))
    _, state = tx.update(t64(1.0), state, noise_variance=0.2)
    assert state.accumulator_noise_variance == pytest.approx(0.2)
    _, state = tx.update(t64(1.0), state, noise_variance=0.6)
    assert float(state.second_moment) == pytest.approx(1.0 - 0.2)
    # Adaptive rounds need no noise variance.
    _, state = tx.update(t64(5.0), state)
    with pytest.raises(ValueError, match="noise_variance"):
        tx.update(t64(1.0), state)  # SGD round without one


def test_without_subtraction_noise_variance_is_ignored():
    plain = make(s1=1, s2=1)
    noisy = make(s1=1, s2=1, noise_variance=5.0, subtract_noise_variance=False)
    a = plain.update(t64(0.5), plain.init(torch.zeros(1, dtype=torch.float64)))[1]
    b = noisy.update(t64(0.5), noisy.init(torch.zeros(1, dtype=torch.float64)))[1]
    assert torch.equal(a.second_moment, b.second_moment)


def test_float32_kept_and_state_type(gen):
    tx = make(s1=1, s2=1, noise_first=True)
    state = tx.init(randn(6, gen))
    for _ in range(4):
        step, state = tx.update(randn(6, gen), state)
        assert step.dtype == torch.float32
    assert isinstance(state, DP2State)
    assert state.preconditioner.dtype == state.second_moment.dtype == torch.float32


def test_clip_norm_adaptive_is_recorded():
    assert make().hparams["clip_norm_adaptive"] is None
    tx = make(clip_norm_adaptive=0.25)
    assert tx.hparams["clip_norm_adaptive"] == 0.25
    assert tx.hparams["s1"] == 2 and tx.hparams["s2"] == 3 and tx.hparams["name"] == "dp2"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"sgd_learning_rate": 0.0}, "sgd_learning_rate"),
        ({"adaptive_learning_rate": -1.0}, "adaptive_learning_rate"),
        ({"s1": 0}, "s1"),
        ({"s2": 1.5}, "s2"),
        ({"s2": True}, "s2"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"beta": 1.0}, "beta"),
        ({"noise_variance": -1.0}, "noise_variance"),
        ({"subtract_noise_variance": "no"}, "subtract_noise_variance"),
        ({"noise_first": 0}, "noise_first"),
        ({"clip_norm_adaptive": 0.0}, "clip_norm_adaptive"),
    ],
)
def test_validation_names_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        make(**kwargs)


# -- max_noise_step: a step's noise per coordinate is at most kappa (stage 10c/10d of issue 14) --


def test_max_noise_step_bounds_the_sgd_and_the_adaptive_rate():
    # sqrt(phi) 0.1; rates sgd 0.5, adaptive 0.1. kappa 0.02: the SGD rate becomes 0.2, the
    # adaptive one (noise 0.1 x 0.1 = 0.01 <= 0.02) is kept; kappa 0.005: adaptive 0.05
    d = t64(1.0, -1.0)
    tx = make(s1=1, s2=1, max_noise_step=0.02)
    sgd_step, _ = tx.update(d, tx.init(torch.zeros(2, dtype=torch.float64)), noise_variance=0.01)
    torch.testing.assert_close(sgd_step, 0.2 * d)
    ada_step, _ = tx.update(d, _after_one_sgd_round(tx), noise_variance=0.01)
    torch.testing.assert_close(ada_step, 0.1 * d)
    tight = make(s1=1, s2=1, max_noise_step=0.005)
    ada_step, _ = tight.update(d, _after_one_sgd_round(tight), noise_variance=0.01)
    torch.testing.assert_close(ada_step, 0.05 * d)
    assert tx.hparams["max_noise_step"] == 0.02
    assert "max_noise_step" not in make().hparams


def _after_one_sgd_round(tx):
    state = tx.init(torch.zeros(2, dtype=torch.float64))
    _, state = tx.update(t64(0.3, -0.1), state, noise_variance=0.0)
    assert phase(state) == "adaptive"
    return state


def test_max_noise_step_bounds_the_scaled_rate():
    d = t64(0.5, 0.5)
    scaled = make(s1=1, s2=2, scale_by_preconditioner=True, max_noise_step=0.01)
    state = _after_one_sgd_round(scaled)
    mean_p = float(preconditioner(state).mean())  # rate 0.1 / mean_p is about 3.7 > 0.01 / 0.1
    step, _ = scaled.update(d, state, noise_variance=0.01)
    torch.testing.assert_close(step, 0.1 * d)  # kappa / sqrt(phi) = 0.1
    assert 0.1 / mean_p > 0.1


def test_max_noise_step_bounds_each_coordinate_of_a_noise_first_adaptive_round():
    """Stage 12: the noise a noise-first step adds to a coordinate, eta sqrt(phi)/P_i, is <= kappa.

    After one SGD round of (0.3, -0.1), P = (0.0959, 0.0326) and eta/P = (1.04, 3.07); at
    sqrt(phi) = 0.1 and kappa = 0.2 the cap is 2: the first coordinate keeps its rate, the second
    is bounded. Before, noise-first adaptive rounds ignored the bound (step 0.1 d / P).
    """
    d = t64(0.5, 0.5)
    first = make(s1=1, s2=2, noise_first=True, max_noise_step=0.2)
    state = _after_one_sgd_round(first)
    p = preconditioner(state)
    step, _ = first.update(d, state, noise_variance=0.01)
    torch.testing.assert_close(step, t64(0.1 * 0.5 / float(p[0]), 2.0 * 0.5))
    assert 0.1 / float(p[1]) > 2.0  # the second coordinate's own rate was above the cap
    loose = make(s1=1, s2=2, noise_first=True, max_noise_step=1.0)  # cap 10: reached nowhere
    step, _ = loose.update(d, _after_one_sgd_round(loose), noise_variance=0.01)
    torch.testing.assert_close(step, 0.1 * d / p)
    unbounded = make(s1=1, s2=2, noise_first=True)
    step, _ = unbounded.update(d, _after_one_sgd_round(unbounded), noise_variance=0.01)
    torch.testing.assert_close(step, 0.1 * d / p)
    step, _ = first.update(d, _after_one_sgd_round(first), noise_variance=0.0)  # no noise
    torch.testing.assert_close(step, 0.1 * d / p)


def test_without_noise_the_rates_are_kept():
    tx = make(s1=1, s2=1, max_noise_step=1e-9)
    state = tx.init(torch.zeros(2, dtype=torch.float64))
    step, state = tx.update(t64(1.0, 1.0), state)  # no noise_variance passed: no bound
    torch.testing.assert_close(step, 0.5 * t64(1.0, 1.0))
    step, _ = tx.update(t64(1.0, 1.0), state, noise_variance=0.0)
    torch.testing.assert_close(step, 0.1 * t64(1.0, 1.0))


@pytest.mark.parametrize("kappa", [0.0, -1.0, math.nan, math.inf, "1", True])
def test_max_noise_step_is_validated(kappa):
    with pytest.raises(ValueError, match="max_noise_step"):
        make(max_noise_step=kappa)


def test_the_mean_of_p_does_not_overflow_where_every_entry_is_finite():
    """dp2-epsilon 1e38: a float32 mean of P overflowed to inf (eighteenth review, observation)."""
    from fedprivopt.optim import preconditioner_mean

    tx = make(s1=1, s2=2, epsilon=1e38, scale_by_preconditioner=True)
    state = tx.init(torch.zeros(1000, dtype=torch.float32))
    _, state = tx.update(torch.zeros(1000, dtype=torch.float32), state)
    assert float(preconditioner(state).mean()) == math.inf  # what the float32 mean gives
    assert preconditioner_mean(state) == pytest.approx(1e38, rel=1e-6)
    step, _ = tx.update(torch.ones(1000, dtype=torch.float32), state)
    assert float(step[0]) == pytest.approx(0.1 / 1e38, rel=1e-5) and float(step[0]) > 0


@pytest.mark.parametrize(
    "args", [(1.0, -1.0, 1.0), (float("nan"), 0.5, 1.0), (1.0, float("nan"), 1.0), (-1.0, 0.5, 1.0)]
)
def test_capped_rate_refuses_a_negative_or_nan_rate_or_bound(args):
    """Nineteenth review of issue 15: -1.0 (a negative rate) and NaN came back unchecked."""
    with pytest.raises(ValueError, match="must be a finite number"):
        optim.capped_rate(*args)
    assert optim.capped_rate(2.0, 0.5, 1.0) == 0.5 and optim.capped_rate(2.0, 0.0, 1.0) == 0.0
    for args in ((1.0, -0.0, 1.0), (-0.0, 1.0, 1.0), (-0.0, 1.0, None)):  # no negative zero
        assert math.copysign(1.0, optim.capped_rate(*args)) == 1.0


def test_preconditioner_mean_names_a_state_that_is_not_dp2s():
    with pytest.raises(TypeError, match="DP2State"):
        optim.preconditioner_mean(None)
