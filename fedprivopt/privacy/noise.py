"""Gaussian noise from explicit generators.

All noise on the privacy path is drawn here, from a ``torch.Generator`` the caller passes in (see
:class:`fedprivopt.privacy.rng.RngFactory`). No function touches a global random state.

Floating-point caveat: like every library that samples Gaussians in floating point (Opacus, TF
Privacy), the noise is drawn by torch's sampler in the vector's precision. Mironov (2012) showed
that the low-order bits of such samples can leak information in theory; the guarantee reported by
the accountant is the guarantee of the ideal real-valued mechanism.

References
----------
I. Mironov, "On significance of the least significant bits for differential privacy", CCS 2012.
"""

from __future__ import annotations

import torch

__all__ = ["add_gaussian_noise", "gaussian_noise"]


def _check_std(std: float) -> float:
    std = float(std)
    if not (std >= 0 and std < float("inf")):
        raise ValueError(f"std must be a finite number >= 0, got {std}")
    return std


def gaussian_noise(
    numel: int,
    std: float,
    *,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Draw a vector of i.i.d. ``N(0, std**2)`` entries.

    Parameters
    ----------
    numel : int
        Length of the vector.
    std : float
        Standard deviation, ``>= 0``.
    generator : torch.Generator
        Source of randomness (required; its device decides the default device).
    dtype : torch.dtype
        Floating-point dtype of the result.
    device : torch.device or str, optional
        Device of the result; defaults to the generator's device.
    """
    if not isinstance(generator, torch.Generator):
        raise ValueError("generator must be a torch.Generator (global RNGs are never used)")
    if int(numel) < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    std = _check_std(std)
    device = generator.device if device is None else torch.device(device)
    out = torch.empty(int(numel), dtype=dtype, device=device)
    if std == 0.0:
        return out.zero_()
    return out.normal_(0.0, std, generator=generator)


def add_gaussian_noise(
    vector: torch.Tensor, std: float, *, generator: torch.Generator
) -> torch.Tensor:
    """Return ``vector + N(0, std**2 I)`` (a new tensor, same dtype and device)."""
    noise = gaussian_noise(
        vector.numel(), std, generator=generator, dtype=vector.dtype, device=vector.device
    )
    return vector + noise.reshape(vector.shape)
