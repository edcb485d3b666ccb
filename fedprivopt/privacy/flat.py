"""Flatten a model's state dict into one vector and back.

Clipping and noise act on the *whole* update of a user, so every model is handled as one flat
vector. :class:`FlatSpec` remembers names, shapes and dtypes so that :func:`unflatten` restores the
original tensors exactly (each with its own dtype) and rejects vectors of the wrong length.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from fedprivopt.core.text import shown

__all__ = ["FlatSpec", "flatten", "unflatten"]


@dataclass(frozen=True)
class FlatSpec:
    """Layout of a flattened state dict.

    Attributes
    ----------
    names : tuple of str
        Keys in flattening order.
    shapes : tuple of tuple of int
        Shape of each tensor.
    dtypes : tuple of torch.dtype
        Dtype of each tensor, restored by :func:`unflatten`.
    dtype : torch.dtype
        Dtype of the flat vector: the promoted type of all entries, at least ``float32``.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    dtype: torch.dtype

    def __post_init__(self) -> None:
        # a short API review of issue 15: FlatSpec("a", 3, None, None) ended in a TypeError
        # from unflatten; every field is checked when the spec is made
        n = len(self.names) if isinstance(self.names, tuple) else -1
        ok = n >= 0 and all(isinstance(name, str) for name in self.names)
        ok = ok and isinstance(self.shapes, tuple) and len(self.shapes) == n
        ok = ok and all(_is_shape(shape) for shape in self.shapes)
        ok = ok and isinstance(self.dtypes, tuple) and len(self.dtypes) == n
        ok = ok and all(isinstance(dt, torch.dtype) for dt in self.dtypes)
        if not (ok and isinstance(self.dtype, torch.dtype) and self.dtype.is_floating_point):
            raise ValueError(
                "FlatSpec needs names (a tuple of str), shapes (a tuple of int tuples >= 0) and "
                "dtypes (a tuple of torch.dtype) of one length, and a floating dtype"
            )

    @property
    def sizes(self) -> tuple[int, ...]:
        """Number of elements of each tensor."""
        return tuple(math.prod(s) for s in self.shapes)

    @property
    def numel(self) -> int:
        """Length of the flat vector."""
        return sum(self.sizes)

    def check(self, flat: torch.Tensor, *, name: str = "flat") -> None:
        """Raise ``ValueError`` unless ``flat`` is a 1-D vector of length :attr:`numel`."""
        if not isinstance(flat, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(flat).__name__}")
        if flat.dim() != 1 or flat.numel() != self.numel:
            raise ValueError(
                f"{name} must be a 1-D tensor of length {self.numel}, got shape {tuple(flat.shape)}"
            )


def _is_shape(shape: object) -> bool:
    return isinstance(shape, tuple) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    )


def _unflattenable(value: torch.Tensor) -> str | None:
    """Why ``value`` cannot be an entry of a flat vector (``None`` if it can).

    Thirty-eighth review of issue 15: a sparse, quantized or float8 tensor ended in torch's
    ``RuntimeError`` (reshape of a sparse tensor, type promotion), and a meta tensor gave a flat
    vector without data.
    """
    if value.layout is not torch.strided:
        return f"a dense (strided) tensor is needed, got layout {value.layout}"
    if value.is_quantized:
        return f"a quantized tensor ({value.dtype}) has no floating-point entries to flatten"
    if value.device.type == "meta":
        return "a tensor on the meta device holds no data"
    if value.dtype.is_floating_point and value.dtype.itemsize < 2:
        return f"float8 ({value.dtype}) is not supported; use float16 or wider"
    return None


def flatten(state: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, FlatSpec]:
    """Concatenate the tensors of ``state`` into one 1-D vector.

    Parameters
    ----------
    state : Mapping[str, torch.Tensor]
        A state dict (iteration order is kept).

    Returns
    -------
    flat : torch.Tensor
        1-D tensor on the device of the first entry, with dtype the promotion of all entries
        (``float32`` at least, so integer buffers survive a round trip while their values are
        exact in it: up to ``2^24`` in float32; ``2^24 + 1`` and ``2^40 + 1`` come back as
        ``2^24`` and ``2^40``).
    spec : FlatSpec
        What :func:`unflatten` needs to restore ``state``.
    """
    if not isinstance(state, Mapping):  # an AttributeError before (a short API review)
        raise ValueError(f"state must be a mapping of names to tensors, got {type(state).__name__}")
    if len(state) == 0:
        raise ValueError("state must contain at least one tensor")
    names, shapes, dtypes, parts = [], [], [], []
    dtype = torch.float32
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"state[{shown(key)}] must be a torch.Tensor, got {type(value).__name__}"
            )
        problem = _unflattenable(value)
        if problem is not None:
            raise ValueError(f"state[{shown(key)}] cannot be flattened: {problem}")
        names.append(str(key))
        shapes.append(tuple(value.shape))
        dtypes.append(value.dtype)
        parts.append(value)
        dtype = torch.promote_types(dtype, value.dtype)
    if not dtype.is_floating_point:
        raise ValueError(f"cannot flatten tensors of dtype {dtype} into a floating-point vector")
    device = parts[0].device
    flat = torch.cat([p.detach().to(device=device, dtype=dtype).reshape(-1) for p in parts])
    return flat, FlatSpec(tuple(names), tuple(shapes), tuple(dtypes), dtype)


def unflatten(flat: torch.Tensor, spec: FlatSpec) -> dict[str, torch.Tensor]:
    """Split a flat vector back into a state dict described by ``spec``.

    Each tensor gets its original shape and dtype (integer entries are rounded to nearest).
    """
    if not isinstance(spec, FlatSpec):  # an AttributeError before (a short API review)
        raise ValueError(f"spec must be a FlatSpec, got {type(spec).__name__}")
    spec.check(flat)
    out: dict[str, torch.Tensor] = {}
    for name, shape, dt, chunk in zip(
        spec.names, spec.shapes, spec.dtypes, torch.split(flat, spec.sizes), strict=True
    ):
        if not dt.is_floating_point and not dt.is_complex and dt != torch.bool:
            chunk = torch.round(chunk)
        out[name] = chunk.reshape(shape).to(dt)
    return out
