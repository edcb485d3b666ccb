"""Modules made without running PyTorch's default initialization, and without SymPy.

A task fills its model's parameters from a generator of its own seed: PyTorch's default
initialization would draw from the global generator, so the layers are made on the ``meta``
device and materialized on the CPU uninitialized, then filled.

``Module.to_empty`` (and ``torch.nn.utils.skip_init``, which calls it) materializes with
``torch.empty_like`` of a meta tensor; that goes through torch's Python reference
implementations and imports SymPy, the first time in a process (measured: 1.1-1.4 s on the
2-core machine). Every command, Ray actor and ClientApp process that built a model paid it.
:func:`materialize` makes the same uninitialized tensors with ``torch.empty``.
"""

from __future__ import annotations

import torch

__all__ = ["materialize"]


def materialize(module: torch.nn.Module) -> torch.nn.Module:
    """Give ``module``'s ``meta`` parameters and buffers uninitialized CPU storage, in place.

    The same as ``module.to_empty(device="cpu")`` for a module made on the ``meta`` device
    (contiguous tensors of the same shapes and dtypes; ``requires_grad`` kept), without the
    SymPy import. Returns ``module``.
    """
    return module._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device="cpu"))
