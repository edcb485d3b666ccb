import io

import pytest
import torch

from fedprivopt.optim import (
    ADADPState,
    AdamBCState,
    AdamState,
    DP2State,
    MomentumState,
    adam,
    adam_bc,
    apply_step,
    dp2,
    flower_fedadam,
    momentum_sgd,
    state_from_dict,
    state_to_dict,
)

from ._helpers import randn

TRANSFORMS = {
    "momentum_sgd": (lambda: momentum_sgd(learning_rate=0.3, momentum=0.8), MomentumState),
    "nesterov": (
        lambda: momentum_sgd(learning_rate=0.3, momentum=0.8, nesterov=True),
        MomentumState,
    ),
    "adam": (lambda: adam(learning_rate=0.1), AdamState),
    "flower_fedadam": (lambda: flower_fedadam(eta=0.1), AdamState),
    "adam_bc": (lambda: adam_bc(learning_rate=0.1, gamma=1e-4, noise_variance=0.01), AdamBCState),
    "dp2": (
        lambda: dp2(
            sgd_learning_rate=0.5,
            adaptive_learning_rate=0.05,
            s1=2,
            s2=2,
            epsilon=1e-3,
            noise_variance=0.01,
            subtract_noise_variance=True,
        ),
        DP2State,
    ),
    "dp2-noise-first": (
        lambda: dp2(
            sgd_learning_rate=0.5,
            adaptive_learning_rate=0.05,
            s1=1,
            s2=2,
            epsilon=1e-3,
            noise_first=True,
        ),
        DP2State,
    ),
}


def _save_load(d):
    buffer = io.BytesIO()
    torch.save(d, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_state_dict_round_trip_resumes_identically(name, gen):
    factory, state_type = TRANSFORMS[name]
    tx = factory()
    params = randn(16, gen)
    deltas = [randn(16, gen, std=0.1) for _ in range(7)]
    state = tx.init(params)
    for delta in deltas[:3]:
        _, state = tx.update(delta, state, params)
    loaded = _save_load(state_to_dict(state))
    restored = state_from_dict(state_type, loaded)
    assert isinstance(restored, state_type)
    assert restored.to_dict().keys() == state.to_dict().keys()
    # Continue both the original and the restored state: every step must be identical.
    for delta in deltas[3:]:
        step_a, state = tx.update(delta, state, params)
        step_b, restored = tx.update(delta, restored, params)
        assert torch.equal(step_a, step_b)
    for key, value in state_to_dict(state).items():
        other = state_to_dict(restored)[key]
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, other), key
        else:
            assert value == other and type(value) is type(other), key


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_step_and_state_keep_dtype(name, dtype, gen):
    tx = TRANSFORMS[name][0]()
    params = randn(8, gen, dtype=dtype)
    state = tx.init(params)
    for _ in range(5):
        step, state = tx.update(randn(8, gen, std=0.1, dtype=dtype), state, params)
        assert step.dtype == dtype and step.device == params.device
        assert torch.isfinite(step).all()
    for value in state_to_dict(state).values():
        if isinstance(value, torch.Tensor):
            assert value.dtype == dtype


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_update_is_pure(name, gen):
    tx = TRANSFORMS[name][0]()
    params = randn(8, gen)
    state = tx.init(params)
    _, state = tx.update(randn(8, gen), state, params)
    before = {
        k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state.to_dict().items()
    }
    delta = randn(8, gen)
    delta_copy, params_copy = delta.clone(), params.clone()
    tx.update(delta, state, params)
    for key, value in state.to_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, before[key]), key
        else:
            assert value == before[key], key
    assert torch.equal(delta, delta_copy) and torch.equal(params, params_copy)


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_mismatched_inputs_are_rejected(name):
    tx = TRANSFORMS[name][0]()
    state = tx.init(torch.zeros(4))
    with pytest.raises(ValueError, match="delta_tilde must have shape"):
        tx.update(torch.zeros(5), state)
    with pytest.raises(ValueError, match="delta_tilde must have dtype"):
        tx.update(torch.zeros(4, dtype=torch.float64), state)
    with pytest.raises(ValueError, match="params must have shape"):
        tx.update(torch.zeros(4), state, torch.zeros(3))
    with pytest.raises(ValueError, match="params must be a flat 1-D tensor"):
        tx.init(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="params must have a floating dtype"):
        tx.init(torch.zeros(4, dtype=torch.int64))


DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_device_is_kept(name, device, gen):
    tx = TRANSFORMS[name][0]()
    params = randn(8, gen).to(device)
    state = tx.init(params)
    for _ in range(4):
        step, state = tx.update(randn(8, gen, std=0.1).to(device), state, params)
        assert step.device == params.device and step.dtype == torch.float32
    elsewhere = "meta" if device == "cpu" else "cpu"
    with pytest.raises(ValueError, match="delta_tilde must be on device"):
        tx.update(torch.zeros(8, device=elsewhere), state)


def test_state_from_dict_rejects_bad_keys_and_kinds():
    good = {"count": 1, "momentum": torch.zeros(2)}
    assert state_from_dict(MomentumState, good).count == 1
    with pytest.raises(ValueError, match=r"missing \['momentum'\]"):
        state_from_dict(MomentumState, {"count": 1})
    with pytest.raises(ValueError, match=r"unexpected \['extra'\]"):
        state_from_dict(MomentumState, {**good, "extra": 3})
    with pytest.raises(ValueError, match=r"MomentumState\.momentum must be a torch\.Tensor"):
        state_from_dict(MomentumState, {"count": 1, "momentum": [0.0, 0.0]})
    with pytest.raises(ValueError, match=r"MomentumState\.count must be an int"):
        state_from_dict(MomentumState, {"count": 1.5, "momentum": torch.zeros(2)})
    with pytest.raises(ValueError, match="state_type must be a dataclass type"):
        state_from_dict(dict, good)


def test_float_fields_accept_ints_and_bool_fields_accept_ints():
    adadp_state = ADADPState.from_dict({"learning_rate": 1, "accepted": 0, "rejected": 2})
    assert adadp_state.learning_rate == 1.0 and isinstance(adadp_state.learning_rate, float)
    tx = dp2(sgd_learning_rate=1.0, adaptive_learning_rate=1.0, s1=1, s2=1, epsilon=0.1)
    d = tx.init(torch.zeros(2)).to_dict()
    d["adaptive"] = 1
    assert DP2State.from_dict(d).adaptive is True


def test_hparams_are_read_only():
    tx = adam(learning_rate=0.1)
    with pytest.raises(TypeError):
        tx.hparams["learning_rate"] = 1.0  # type: ignore[index]
    assert tx.hparams["name"] == "adam"


def test_apply_step_returns_a_new_tensor():
    params = torch.tensor([1.0, 2.0])
    out = apply_step(params, torch.tensor([0.5, -0.5]))
    assert torch.equal(out, torch.tensor([1.5, 1.5]))
    assert torch.equal(params, torch.tensor([1.0, 2.0]))
