"""L2 clipping of a user's whole update."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = ["ClipResult", "clip_factor", "clip_l2", "l2_norm", "vector_norm_checked"]


class ClipResult(NamedTuple):
    """Outcome of :func:`clip_l2`.

    Attributes
    ----------
    vector : torch.Tensor
        The clipped vector, same dtype and device as the input.
    norm : float
        L2 norm of the input before clipping.
    clipped : bool
        Whether the input was scaled down (its norm exceeded the clip norm).
    """

    vector: torch.Tensor
    norm: float
    clipped: bool


def l2_norm(vector: torch.Tensor) -> float:
    """L2 norm of a tensor of any shape.

    Accumulated in the tensor's own precision (at least float32): torch's blocked reductions keep
    the relative error far below the clipping margin, and a float64 copy of a 5M-entry update
    would cost more than the rest of the aggregation.
    """
    dtype = torch.float64 if vector.dtype == torch.float64 else torch.float32
    norm = float(torch.linalg.vector_norm(vector.detach(), dtype=dtype))
    if dtype == torch.float32 and norm < 1e-15 and (norm > 0.0 or bool(vector.detach().any())):
        # squares of tiny float32 entries lose precision (subnormals) or vanish (below 1e-22 they
        # underflow to 0, and a nonzero vector measured 0): measure in float64 (rare)
        norm = float(torch.linalg.vector_norm(vector.detach(), dtype=torch.float64))
    return norm


def clip_factor(norm: float, clip_norm: float, dtype: torch.dtype = torch.float32) -> float:
    """Factor that brings a vector of L2 norm ``norm`` inside the ball of radius ``clip_norm``.

    ``1.0`` when ``norm <= clip_norm``; otherwise a hair below ``clip_norm / norm`` (4 units in the
    last place of ``dtype``), so that rounding in the norm or in the product can never leave the
    scaled vector above ``clip_norm``.
    """
    if norm <= clip_norm:
        return 1.0
    margin = 1.0 - 4.0 * torch.finfo(dtype).eps if dtype.is_floating_point else 1.0
    return clip_norm / norm * margin


def vector_norm_checked(vector: torch.Tensor) -> float:
    """:func:`l2_norm`, raising ``ValueError`` if ``vector`` contains NaN or Inf."""
    norm = l2_norm(vector)
    if not math.isfinite(norm):
        if bool(torch.isfinite(vector).all()):
            # Finite entries whose squares overflow: rescale first, then measure.
            scale = float(vector.detach().abs().max())
            return scale * l2_norm(vector / scale)
        raise ValueError("vector contains NaN or Inf; it cannot be clipped")
    return norm


def clip_l2(vector: torch.Tensor, clip_norm: float) -> ClipResult:
    """Scale ``vector`` so that its L2 norm is at most ``clip_norm``.

    The result is ``vector * min(1, clip_norm / ||vector||)`` (see :func:`clip_factor`): the
    direction is kept, a vector already inside the ball is returned unchanged (the same values),
    and the zero vector is safe.

    Parameters
    ----------
    vector : torch.Tensor
        The whole update of one user, any shape (usually flat).
    clip_norm : float
        The clip norm ``C > 0``.

    Returns
    -------
    ClipResult
        Clipped vector, pre-clip norm and whether it was clipped.

    Raises
    ------
    ValueError
        If ``clip_norm`` is not a positive finite number, or ``vector`` contains NaN or Inf (such
        an update has no direction to keep; callers reject it).
    """
    clip_norm = float(clip_norm)
    if not (clip_norm > 0 and clip_norm < float("inf")):
        raise ValueError(f"clip_norm must be a finite number > 0, got {clip_norm}")
    norm = vector_norm_checked(vector)
    factor = clip_factor(norm, clip_norm, vector.dtype)
    if factor == 1.0:
        return ClipResult(vector, norm, False)
    return ClipResult(vector * factor, norm, True)
