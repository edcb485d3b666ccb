"""glibc's malloc: keep freed memory in the process for the next round.

A round of the fast engine allocates and frees the same large temporaries again and again (a
chunk's logits, gradient rows, streams: megabytes each). glibc's default adjusts its thresholds
as it goes, and still returns freed memory to the kernel at the top of the heap and serves some
of these from fresh ``mmap``s, so the next round pages the same memory in again. With the
threshold for ``mmap`` at its largest (32 MB on 64-bit) and heap trimming above 1 GB only, the
real-size tag round at 100 clients on 2 cores took 0.155-0.167 s against 0.175-0.188 s
(``benchmarks/NOTES.md``, entry 18); either setting alone made it slower (0.23 and 0.31 s), since
setting one turns off glibc's adjustment of both. The price: the process keeps up to its peak
heap instead of returning it between rounds.

Also the memory a tensor may take (:func:`check_fits`): a length that cannot fit in the device's
memory is refused naming the parameter before torch's allocator sees it. Nothing here imports
torch at import time.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

__all__ = [
    "MMAP_THRESHOLD",
    "PROCESS_MEMORY",
    "TRIM_THRESHOLD",
    "available_memory",
    "check_fits",
    "device_memory",
    "keep_freed_memory",
    "physical_memory",
    "processes_that_fit",
]

_M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
#: glibc's largest accepted ``mmap`` threshold on 64-bit (HEAP_MAX_SIZE / 2)
MMAP_THRESHOLD = 32 << 20
#: free memory at the top of the heap kept up to this size
TRIM_THRESHOLD = 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's ``mmap`` and trim thresholds for this process (once); whether they are set.

    Only on Linux with glibc's ``mallopt``, and only when the user set neither
    ``MALLOC_MMAP_THRESHOLD_`` nor ``MALLOC_TRIM_THRESHOLD_`` (their values are kept). Allocation
    only: results are the same to the bit.
    """
    user_set = {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"} & set(os.environ)
    if not sys.platform.startswith("linux") or user_set:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def physical_memory() -> int:
    """Bytes of physical memory of this machine (``0`` where it cannot be read)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):  # pragma: no cover - not POSIX
        return 0


def available_memory() -> int | None:
    """Bytes of memory available now (Linux's ``MemAvailable``), ``None`` where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


PROCESS_MEMORY = 256 * 2**20
"""Memory a worker process of a run holds at least: torch and its own copy of the task (a
``compare --jobs`` worker 220 MB, a ``fast-actors`` shard 262 MB, measured for the toy task;
StackOverflow tasks hold more)."""


def processes_that_fit(most: int, memory: int, each: int = PROCESS_MEMORY) -> int:
    """How many processes of ``each`` bytes ``memory`` bytes hold: in ``[1, most]``.

    ``most`` where the memory is not known (``memory <= 0``, as :func:`physical_memory` gives
    it then). The bound of ``compare --jobs`` and of the worker processes a run starts in a
    private Ray instance (``fast-actors``, the Flower engine's client actors).
    """
    return most if memory <= 0 else max(1, min(most, memory // each))


def device_memory(device: object) -> int:
    """Bytes of memory of ``device`` (a ``torch.device``); ``0`` where it is not known.

    The machine's physical memory on the CPU, the GPU's total on CUDA, 0 on other devices.
    """
    kind = getattr(device, "type", None)
    if kind == "cpu":
        return physical_memory()
    if kind == "cuda":
        import torch

        try:
            return int(torch.cuda.get_device_properties(device).total_memory)
        except (RuntimeError, AssertionError, ValueError):  # no such GPU: torch says so later
            return 0
    return 0


def check_fits(name: str, count: int, itemsize: int, device: object) -> int:
    """``count`` unless ``count`` entries of ``itemsize`` bytes exceed ``device``'s memory.

    A short API review of issue 15: a ``numel`` or ``dim`` of 10**12 reached torch's allocator
    (a ``RuntimeError``, or, below the overcommit limit, the kernel's OOM killer at the first
    write). Raises ``ValueError`` naming ``name`` and the largest count that fits.
    """
    memory = device_memory(device)
    if memory > 0 and count * itemsize > memory:
        raise ValueError(
            f"{name} must be at most {memory // itemsize:,} on this {getattr(device, 'type', '')} "
            f"device ({itemsize}-byte entries in {memory / 2**30:.3g} GiB of memory), got "
            f"{count:,}"
        )
    return count
