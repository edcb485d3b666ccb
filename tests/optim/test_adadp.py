import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivopt.optim import ADADPController, ADADPState, adadp, adadp_error

W = (1.0, 3.0)
D1 = (0.5, -1.0)
D2 = (0.3, -0.5)
LR = 0.2
# Full step w1 = [1.1, 2.8]; half step [1.05, 2.9]; two half steps [1.08, 2.85];
# w1 - w_hat = [0.02, -0.05], scaled by max(1, |w1|) = [1.1, 2.8].
ERR = math.hypot(0.02 / 1.1, 0.05 / 2.8)


def t64(*values):
    return torch.tensor(values, dtype=torch.float64)


def test_points_and_error_hand_computed():
    ctl = adadp(learning_rate=LR, tolerance=1.0)
    state = ctl.init()
    torch.testing.assert_close(ctl.full_step(state, t64(*W), t64(*D1)), t64(1.1, 2.8))
    torch.testing.assert_close(ctl.half_step(state, t64(*W), t64(*D1)), t64(1.05, 2.9))
    assert adadp_error(t64(1.1, 2.8), t64(1.08, 2.85)) == pytest.approx(ERR, rel=1e-12)
    # max(1, |w1|) is elementwise on the full-step point, including its sign.
    assert adadp_error(t64(-4.0, 0.5), t64(-3.0, 0.0)) == pytest.approx(math.hypot(0.25, 0.5))


def test_accept_keeps_two_half_steps_and_factor_clips_at_alpha_max():
    ctl = adadp(learning_rate=LR, tolerance=0.05)  # sqrt(0.05 / 0.02548) = 1.40 -> 1.1
    result = ctl.update(ctl.init(), t64(*W), t64(*D1), t64(*D2))
    assert result.accepted
    torch.testing.assert_close(result.params, t64(1.08, 2.85))
    assert result.error == pytest.approx(ERR, rel=1e-12)
    assert result.factor == 1.1
    assert result.state == ADADPState(learning_rate=pytest.approx(0.22), accepted=1, rejected=0)


def test_reject_keeps_params_and_factor_inside_bounds():
    tol = 0.025  # err = 0.02548 > tol
    ctl = adadp(learning_rate=LR, tolerance=tol)
    w = t64(*W)
    result = ctl.update(ctl.init(), w, t64(*D1), t64(*D2))
    assert not result.accepted
    assert torch.equal(result.params, w)
    factor = math.sqrt(tol / ERR)  # 0.9905, inside [0.9, 1.1]
    assert result.factor == pytest.approx(factor, rel=1e-12)
    assert result.state.learning_rate == pytest.approx(LR * factor, rel=1e-12)
    assert (result.state.accepted, result.state.rejected) == (0, 1)


def test_linear_rule_and_alpha_min_clip():
    tol = 0.025
    linear = adadp(learning_rate=LR, tolerance=tol, error_exponent=1.0)
    result = linear.update(linear.init(), t64(*W), t64(*D1), t64(*D2))
    assert result.factor == pytest.approx(tol / ERR, rel=1e-12)
    strict = adadp(learning_rate=LR, tolerance=0.01)  # sqrt(0.01 / 0.02548) = 0.63 -> 0.9
    result = strict.update(strict.init(), t64(*W), t64(*D1), t64(*D2))
    assert result.factor == 0.9 and not result.accepted
    assert result.state.learning_rate == pytest.approx(0.18)


def test_zero_error_grows_by_alpha_max():
    ctl = adadp(learning_rate=0.5, tolerance=1e-3, alpha_max=1.25)
    d = t64(0.4, -0.2)
    result = ctl.update(ctl.init(), t64(0.0, 0.0), d, d)
    assert result.error == 0.0 and result.accepted and result.factor == 1.25
    torch.testing.assert_close(result.params, 0.5 * d)


def test_counters_accumulate_over_rounds():
    ctl = adadp(learning_rate=LR, tolerance=0.0255)
    state = ctl.init()
    w = t64(*W)
    outcomes = []
    for _ in range(4):
        result = ctl.update(state, w, t64(*D1), t64(*D2))
        outcomes.append(result.accepted)
        state, w = result.state, result.params
    assert state.accepted == sum(outcomes) and state.rejected == 4 - sum(outcomes)
    assert state.accepted >= 1 and state.rejected >= 1


def test_float32_kept():
    ctl = adadp(learning_rate=0.1, tolerance=1.0)
    w = torch.tensor([1.0, -1.0])
    result = ctl.update(ctl.init(), w, torch.tensor([0.1, 0.2]), torch.tensor([0.0, 0.1]))
    assert result.params.dtype == torch.float32
    with pytest.raises(ValueError, match="delta_2 must have dtype"):
        ctl.update(ctl.init(), w, torch.zeros(2), torch.zeros(2, dtype=torch.float64))


def test_non_finite_error_is_a_failed_step():
    # as in the authors' code: a NaN error keeps the (diverged) step, both count as failed
    ctl = adadp(learning_rate=0.1, tolerance=1.0)
    res = ctl.update(ctl.init(), torch.zeros(2), torch.tensor([math.nan, 0.0]), torch.zeros(2))
    assert math.isnan(res.error) and not res.accepted and res.state.rejected == 1
    assert bool(res.params.isnan().any()) and res.state.learning_rate == pytest.approx(0.09)


@settings(max_examples=60, deadline=None)
@given(
    d1=st.lists(st.floats(-5, 5), min_size=3, max_size=3),
    d2=st.lists(st.floats(-5, 5), min_size=3, max_size=3),
    lr=st.floats(1e-3, 2.0),
    tol=st.floats(1e-4, 1.0),
)
def test_factor_bounded_and_acceptance_rule(d1, d2, lr, tol):
    ctl = adadp(learning_rate=lr, tolerance=tol)
    w = t64(0.5, -2.0, 0.0)
    result = ctl.update(ctl.init(), w, t64(*d1), t64(*d2))
    assert 0.9 <= result.factor <= 1.1
    assert result.accepted == (result.error <= tol)
    assert result.state.learning_rate == pytest.approx(lr * result.factor)
    expected = w + 0.5 * lr * (t64(*d1) + t64(*d2)) if result.accepted else w
    torch.testing.assert_close(result.params, expected)


def test_state_round_trip():
    state = ADADPState(learning_rate=0.3, accepted=4, rejected=2)
    assert ADADPState.from_dict(state.to_dict()) == state
    assert state.to_dict() == {"learning_rate": 0.3, "accepted": 4, "rejected": 2}


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"tolerance": -1.0}, "tolerance"),
        ({"alpha_min": 0.0}, "alpha_min"),
        ({"alpha_min": 1.2}, "alpha_min"),
        ({"alpha_max": 0.5}, "alpha_max"),
        ({"error_exponent": 0.0}, "error_exponent"),
    ],
)
def test_validation_names_the_parameter(kwargs, name):
    base = {"learning_rate": 0.1, "tolerance": 1.0}
    with pytest.raises(ValueError, match=name):
        adadp(**{**base, **kwargs})
    with pytest.raises(ValueError, match=name):
        ADADPController(**{**base, **kwargs})


def test_hparams_record():
    assert dict(adadp(learning_rate=0.1, tolerance=0.5).hparams) == {
        "name": "adadp",
        "learning_rate": 0.1,
        "tolerance": 0.5,
        "alpha_min": 0.9,
        "alpha_max": 1.1,
        "error_exponent": 0.5,
        "safety": 1.0,
    }
