"""L2 clipping of a user's whole update."""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["ClipResult", "clip_l2", "l2_norm"]


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
    """L2 norm of a tensor of any shape, accumulated in float64."""
    return float(torch.linalg.vector_norm(vector.detach(), dtype=torch.float64))


def clip_l2(vector: torch.Tensor, clip_norm: float) -> ClipResult:
    """Scale ``vector`` so that its L2 norm is at most ``clip_norm``.

    The result is ``vector * min(1, clip_norm / ||vector||)``: the direction is kept, a vector
    already inside the ball is returned unchanged (the same values), and the zero vector is safe.

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
    norm = l2_norm(vector)
    if norm != norm or norm == float("inf"):
        if bool(torch.isfinite(vector).all()):
            # Finite entries whose squares overflow float64: rescale first, then measure.
            scale = float(vector.detach().abs().max())
            norm = scale * l2_norm(vector / scale)
        else:
            raise ValueError("vector contains NaN or Inf; it cannot be clipped")
    if norm <= clip_norm:
        return ClipResult(vector, norm, False)
    factor = clip_norm / norm
    return ClipResult(vector * factor, norm, True)
