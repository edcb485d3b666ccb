"""An exclusive inter-process file lock (POSIX ``flock``; a no-op elsewhere)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

__all__ = ["file_lock"]


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if absent; its parent must exist).

    Several processes (Ray workers, SuperNodes, concurrent runs) may build the same files at
    once; under this lock one of them builds, the others wait and then find the files current.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
