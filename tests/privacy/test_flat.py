import pytest
import torch

from fedprivopt.privacy import flatten, unflatten


def _state():
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(3, 4, generator=g),
        "b": torch.randn(4, generator=g),
        "steps": torch.tensor(7, dtype=torch.int64),
        "h": torch.randn(2, 2, generator=g).to(torch.float16),
    }


def test_round_trip_keeps_values_shapes_dtypes_and_order():
    state = _state()
    flat, spec = flatten(state)
    assert flat.dim() == 1 and flat.numel() == 12 + 4 + 1 + 4 == spec.numel
    assert flat.dtype == torch.float32
    back = unflatten(flat, spec)
    assert list(back) == list(state)
    for k, v in state.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        assert torch.equal(back[k], v)


def test_flat_dtype_is_promoted_to_the_widest_float():
    flat, spec = flatten({"a": torch.zeros(2), "b": torch.zeros(3, dtype=torch.float64)})
    assert flat.dtype == torch.float64 == spec.dtype
    back = unflatten(flat, spec)
    assert back["a"].dtype == torch.float32 and back["b"].dtype == torch.float64


def test_flat_order_follows_state_order():
    flat, _ = flatten({"x": torch.tensor([1.0, 2.0]), "y": torch.tensor([3.0])})
    assert flat.tolist() == [1.0, 2.0, 3.0]


def test_unflatten_rejects_wrong_length_and_shape():
    _, spec = flatten(_state())
    with pytest.raises(ValueError, match="length 21"):
        unflatten(torch.zeros(20), spec)
    with pytest.raises(ValueError, match="1-D"):
        unflatten(torch.zeros(21, 1), spec)


def test_flatten_rejects_empty_and_non_tensors():
    with pytest.raises(ValueError, match="at least one"):
        flatten({})
    with pytest.raises(ValueError, match="state\\['a'\\]"):
        flatten({"a": [1.0, 2.0]})
