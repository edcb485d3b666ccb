"""Validation helpers shared by the server transforms (private to :mod:`fedprivopt.optim`).

Hyperparameters are checked once, at construction, and every failure is a ``ValueError`` whose
message names the parameter and its valid range. Tensors are checked on every call, because a
shape, dtype or device mismatch between the noised mean update and the optimizer state is a
programming error that must not be silently broadcast or cast away.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Integral, Real

import torch

__all__ = [
    "check_bool",
    "check_int",
    "check_noise_variance_spec",
    "check_params",
    "check_real",
    "check_vector",
    "resolve_noise_variance",
]


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    left = "(" if low_open else "["
    right = ")" if high_open else "]"
    lo = "-inf" if low == -math.inf else f"{low:g}"
    hi = "inf" if high == math.inf else f"{high:g}"
    return f"{left}{lo}, {hi}{right}"


def check_real(
    name: str,
    value: object,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Return ``value`` as a finite float inside the interval, or raise ``ValueError``.

    Parameters
    ----------
    name : str
        Parameter name used in the error message.
    value : object
        The value to check; ``bool`` is rejected even though it is a number.
    low, high : float
        Interval bounds; infinite bounds are always open.
    low_open, high_open : bool
        Whether the bounds themselves are excluded.

    Returns
    -------
    float
        The validated value.

    Raises
    ------
    ValueError
        If ``value`` is not a real number, is NaN or infinite, or lies outside the interval.
    """
    low_open = low_open or low == -math.inf
    high_open = high_open or high == math.inf
    interval = _interval(low, high, low_open, high_open)
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a real number in {interval}, got {value!r}")
    out = float(value)
    ok = math.isfinite(out)
    ok = ok and (out > low if low_open else out >= low)
    ok = ok and (out < high if high_open else out <= high)
    if not ok:
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}")
    return out


def check_int(name: str, value: object, *, low: int = 0) -> int:
    """Return ``value`` as an int ``>= low``, or raise ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < low:
        raise ValueError(f"{name} must be an integer in [{low}, inf), got {value!r}")
    return int(value)


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a ``bool``, or raise ``ValueError`` naming ``name``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_params(params: object) -> torch.Tensor:
    """Check that ``params`` is a flat floating-point tensor (the input of every ``init``)."""
    if not isinstance(params, torch.Tensor):
        raise ValueError(f"params must be a torch.Tensor, got {type(params).__name__}")
    if params.ndim != 1:
        raise ValueError(f"params must be a flat 1-D tensor, got shape {tuple(params.shape)}")
    if not params.is_floating_point():
        raise ValueError(f"params must have a floating dtype, got {params.dtype}")
    return params


def check_vector(name: str, value: object, like: torch.Tensor) -> torch.Tensor:
    """Check that ``value`` has the shape, dtype and device of the state tensor ``like``.

    Nothing is broadcast or cast: a float64 update fed to a float32 state is an error, so the
    returned step always has the dtype the state was initialised with.
    """
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.shape != like.shape:
        raise ValueError(
            f"{name} must have shape {tuple(like.shape)} (that of the state), "
            f"got {tuple(value.shape)}"
        )
    if value.dtype != like.dtype:
        raise ValueError(
            f"{name} must have dtype {like.dtype} (that of the state), got {value.dtype}"
        )
    if value.device != like.device:
        raise ValueError(
            f"{name} must be on device {like.device} (that of the state), got {value.device}"
        )
    return value


NoiseVarianceSpec = float | Callable[[int], float] | None


def check_noise_variance_spec(value: object, *, allow_none: bool) -> NoiseVarianceSpec:
    """Validate a ``noise_variance`` hyperparameter: a float ``>= 0``, a callable, or ``None``."""
    if value is None:
        if allow_none:
            return None
        raise ValueError("noise_variance must be a float in [0, inf) or a callable, got None")
    if callable(value):
        return value
    return check_real("noise_variance", value, low=0.0)


def resolve_noise_variance(spec: NoiseVarianceSpec, override: object, t: int) -> float:
    """Return the per-coordinate noise variance of the ``t``-th update (1-based).

    A per-call ``override`` wins over the constructor's ``spec``; a callable ``spec`` is called
    with ``t``. The result is validated as a finite float ``>= 0``.
    """
    if override is not None:
        return check_real("noise_variance", override, low=0.0)
    if spec is None:
        raise ValueError(
            "noise_variance must be passed to update() when the transform was built with "
            "noise_variance=None (a float in [0, inf))"
        )
    if callable(spec):
        return check_real("noise_variance", spec(t), low=0.0)
    return float(spec)
