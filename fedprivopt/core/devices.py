"""A device argument checked before torch sees it.

A short API review of issue 15: ``device=0``, ``-1`` or ``"1"`` given to the noise samplers,
``RngFactory.generator``, ``TreeNoise`` or the aggregator ended in torch's ``RuntimeError``
("Cannot access accelerator device when none is available", "Invalid device string"). They are
``ValueError`` naming the parameter here. torch is imported when a device is checked.
"""

from __future__ import annotations

from typing import Any

from fedprivopt.core.text import shown

__all__ = ["check_device"]


def check_device(device: object, name: str = "device") -> Any:
    """``device`` as a ``torch.device`` this machine has, or ``ValueError`` naming ``name``.

    Takes a ``torch.device`` or what ``torch.device()`` takes (``"cpu"``, ``"cuda:1"``, an
    index of the current accelerator); a CUDA device must exist here, another device type
    must take an allocation here, and the meta device (no data) is refused.
    """
    import torch

    if isinstance(device, bool):
        raise ValueError(f"{name} must be a torch.device or a device name, got {device!r}")
    try:
        out = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(
            f"{name} must be a torch.device or a device name such as 'cpu' or 'cuda:0' that "
            f"this machine has, got {shown(device)}"
        ) from None
    if out.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (out.index or 0) >= count:
            raise ValueError(
                f"{name} {str(out)!r} is not on this machine ({count} CUDA device(s) visible)"
            )
    elif out.type == "meta":
        # follow-up of the fortieth review of issue 15 (privacy 1): a meta device gave the
        # aggregator a sum without data (an honest update rejected as NaN, a release of no
        # numbers reported as noised) and noise without values
        raise ValueError(
            f"{name} must be a device that holds data, got 'meta' (tensors there have none)"
        )
    elif out.type != "cpu":
        try:  # 'mps' or 'xla' on a machine without them: torch's NotImplementedError before
            torch.empty(0, device=out)
        except (RuntimeError, NotImplementedError):
            raise ValueError(
                f"{name} {str(out)!r} is not on this machine (torch cannot allocate there)"
            ) from None
    return out
