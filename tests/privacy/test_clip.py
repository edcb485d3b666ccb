import math

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis.extra.numpy import arrays

from fedprivopt.privacy import clip_l2, l2_norm

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False, width=32)
vectors = arrays(dtype="float32", shape=st.integers(1, 300), elements=finite)
clip_norms = st.floats(min_value=1e-3, max_value=1e3)


def _norm64(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t.double()))


@settings(max_examples=300, deadline=None)
@given(vec=vectors, c=clip_norms)
# found in a fresh-clone run: the squares underflow to 0 in float32, and the norm was reported 0
@example(vec=np.array([1.04109664e-29, 1.04109664e-29], dtype=np.float32), c=1.0)
def test_norm_after_clipping_is_at_most_c(vec, c):
    out = clip_l2(torch.from_numpy(vec), c)
    assert _norm64(out.vector) <= c * (1 + 1e-6)
    assert out.norm == pytest.approx(_norm64(torch.from_numpy(vec)), rel=1e-6, abs=1e-30)
    assert out.clipped == (out.norm > c)


@settings(max_examples=300, deadline=None)
@given(vec=vectors, c=clip_norms)
def test_direction_is_kept(vec, c):
    x = torch.from_numpy(vec).double()
    out = clip_l2(torch.from_numpy(vec), c).vector.double()
    nx, no = _norm64(x), _norm64(out)
    if nx == 0:
        assert no == 0
        return
    # same direction: the normalised vectors coincide (cosine similarity 1)
    assert float(torch.dot(x, out)) / (nx * no) == pytest.approx(1.0, abs=1e-5)


@settings(max_examples=200, deadline=None)
@given(vec=vectors)
def test_identity_below_the_clip_norm(vec):
    x = torch.from_numpy(vec)
    c = _norm64(x) * 1.5 + 1e-3
    out = clip_l2(x, c)
    assert not out.clipped
    assert torch.equal(out.vector, x)


def test_zero_vector_is_safe():
    out = clip_l2(torch.zeros(10), 1.0)
    assert torch.equal(out.vector, torch.zeros(10))
    assert out.norm == 0.0 and out.clipped is False
    assert not torch.isnan(out.vector).any()


def test_clip_scales_to_exactly_c():
    out = clip_l2(torch.tensor([3.0, 4.0]), 1.0)
    assert out.clipped and out.norm == 5.0
    assert torch.allclose(out.vector, torch.tensor([0.6, 0.8]))


def test_dtype_and_shape_kept():
    x = torch.full((2, 3), 10.0, dtype=torch.float64)
    out = clip_l2(x, 1.0)
    assert out.vector.dtype == torch.float64 and out.vector.shape == (2, 3)


def test_huge_finite_float64_entries_do_not_overflow_the_norm():
    x = torch.tensor([1e200, 1e200], dtype=torch.float64)
    out = clip_l2(x, 2.0)
    assert out.norm == pytest.approx(math.sqrt(2) * 1e200)
    assert l2_norm(out.vector) == pytest.approx(2.0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_vectors_are_rejected(bad):
    with pytest.raises(ValueError, match="NaN or Inf"):
        clip_l2(torch.tensor([1.0, bad]), 1.0)


@pytest.mark.parametrize("c", [0.0, -1.0, float("inf"), float("nan")])
def test_invalid_clip_norm(c):
    with pytest.raises(ValueError, match="clip_norm"):
        clip_l2(torch.ones(3), c)
