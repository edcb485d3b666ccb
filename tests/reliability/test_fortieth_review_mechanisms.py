"""Issue 15, fortieth hostile review (mechanisms: clipping, noise, aggregation, the wire): tests.

1. ``clip_l2(torch.tensor([0.1], dtype=torch.float64), Fraction(1, 10))`` (a clip norm that is
   no float: a ``Fraction``, the integer ``2**54 - 1`` with a vector ``[2.0**54]``, a
   ``numpy.longdouble`` of ``1 - 2**-60`` with ``[1.0]``; ``clip_factor`` alike). Before: the
   clip norm was read as the nearest float, which lies above it, and the vector was returned
   unclipped (``clipped`` False) with an exact norm above ``C`` (0.1000000000000000055 for
   1/10; 2**54 for 2**54 - 1; 1 for 1 - 2**-60). Now the clip norm is read as the largest float
   not above it (``clip._float_at_most``): every result's exact norm is at most ``C``, and a
   float ``C`` is read as before (every run's bits unchanged).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from fedprivopt.privacy.clip import clip_factor, clip_l2


def _exact_sq_norm(vector: torch.Tensor) -> Fraction:
    return sum((Fraction(x) ** 2 for x in vector.double().reshape(-1).tolist()), Fraction(0))


# -- finding 1: a clip norm that is no float ---------------------------------------------------


@pytest.mark.parametrize(
    ("vector", "clip_norm"),
    [
        ([0.1], Fraction(1, 10)),
        ([2.0**54], 2**54 - 1),
        ([1.0], np.longdouble(1) - np.longdouble(2) ** -60),
    ],
)
def test_clip_l2_stays_within_a_clip_norm_that_is_no_float(vector, clip_norm) -> None:
    v = torch.tensor(vector, dtype=torch.float64)
    exact = Fraction(*clip_norm.as_integer_ratio())
    out = clip_l2(v, clip_norm)
    assert _exact_sq_norm(out.vector) <= exact**2
    factor = clip_factor(float(v.norm()), clip_norm, torch.float64)
    assert _exact_sq_norm(v * factor) <= exact**2


def test_a_float_clip_norm_is_read_as_before() -> None:
    v = torch.tensor([0.5, 0.5], dtype=torch.float64)
    assert clip_l2(v, 1.0).vector is v
    assert clip_factor(2.0, 1.0, torch.float64) == 0.5 * (1 - 4 * torch.finfo(torch.float64).eps)
    assert clip_l2(v, torch.tensor(1.0)).vector is v  # a one-element tensor as before
