"""Exclusive inter-process file locks (POSIX ``flock``; no-ops elsewhere).

:func:`file_lock` waits for the lock (several processes building the same files, one at a time);
:func:`exclusive_lock` never waits: it holds the lock or raises ``ValueError`` naming the process
that holds it (its PID is written into the lock file).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from fedprivopt.core.text import shown

__all__ = [
    "DATA_LOCK",
    "LockHeldError",
    "exclusive_lock",
    "file_lock",
    "probe_lock",
    "refuse_filesystem_root",
    "unlockable",
]

_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)

#: The lock file of a StackOverflow data directory: held by a task while it generates its
#: synthetic files (waiting) and by ``fedprivopt data synth`` (refusing to wait for another).
DATA_LOCK = ".stackoverflow.lock"


def refuse_filesystem_root(path: str | os.PathLike, what: str) -> None:
    """Raise ``ValueError`` if ``path`` is, or resolves to, the root of the file system.

    The data layer writes its own files into the directories it is given (a dataset, token
    stores with their lock files); the root ``/`` holds the system's directories, not ours.
    Thirty-first review of issue 15 (data): ``task-params.cache-dir = "/"`` wrote a token store
    and its lock file into ``/`` and ``fedprivopt data synth --out /`` the dataset's four files
    (rc 0, as root). ``what`` leads the message (``cache_dir``, ``argument --out: ...``).
    """
    real = os.path.realpath(path)  # "/tmp/..", "//", a link to "/" (loops: left as written)
    if os.path.dirname(real) == real:
        raise ValueError(
            f"{what} {shown(str(path))} is the root of the file system, which holds the system's "
            "directories: choose a directory of its own"
        )


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
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or Path(path).is_symlink():
            _refuse_link(Path(path))
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        # eighteenth review of issue 15, finding 6: a FIFO ended a task's data generation with
        # "File or stream is not seekable." (rc 2, naming no file) and a token cache's build in
        # a traceback (rc 1)
        os.close(fd)
        raise ValueError(f"lock file {path} is not a regular file; remove it (it holds no data)")
    with open(fd, "r+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say_waiting(Path(path), handle.fileno())
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        except OSError as exc:
            raise unlockable(path, exc) from None
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _say_waiting(path: Path, fd: int) -> None:
    """Say on stderr, once, that the lock ``path`` is held and this process waits for it.

    Twenty-first review of issue 15: a run whose task generates its synthetic dataset waited
    for ``data synth`` writing the same directory without a word, for as long as that took, and
    forever when it was suspended (Ctrl-Z). The holder's PID is named when its lock file holds
    one (:func:`exclusive_lock` writes it; at most 32 bytes are read).
    """
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    holder = f"process {text}" if text.isdigit() else "another process"
    print(
        f"fedprivopt: waiting for {holder}, which holds {path} while it writes the files there "
        "(a suspended process must be resumed or stopped first)",
        file=sys.stderr,
        flush=True,
    )


def unlockable(path: str | os.PathLike, exc: OSError) -> OSError:
    """The error of ``flock`` failing on ``path`` for a reason other than another holder.

    Thirty-seventh review of issue 15 (environment, finding 4): on a file system that keeps no
    locks (an NFS mount whose lock service does not answer: ``ENOLCK``, "No locks available";
    some FUSE file systems: ``ENOSYS``, ``EOPNOTSUPP``) ``flock`` raised an ``OSError`` naming no
    file, which ``simulate``, ``compare`` and ``data synth`` ended in a traceback (rc 1). It
    names ``path`` now, and where to run instead.
    """
    why = exc.strerror or str(exc)
    return OSError(
        exc.errno,
        f"cannot be locked ({why}): the file system does not keep the locks by which fedprivopt "
        "allows one writer; use a directory on a local disk, or enable locking on this one",
        os.fspath(path),
    )


def _refuse_link(path: Path) -> None:
    """Refuse a lock file that is a symbolic link (fifteenth review of issue 15).

    Opened through the link, the linked file would get a PID and be emptied on release
    (:func:`exclusive_lock`), or be created where the link points (:func:`file_lock`).
    """
    raise ValueError(
        f"lock file {path} is a symbolic link (to {os.readlink(path)!r}"[:300]
        + "); remove the link (it holds no run data): fedprivopt writes its PID "
        "into a lock file and empties it, and must not do so to the linked file"
    ) from None


class LockHeldError(ValueError):
    """Another process holds the lock (:attr:`pid`: its process id, ``None`` if unknown)."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


def _holder(path: Path) -> int | None:
    """The PID written into a held lock file (the holder writes it right after locking)."""
    for _ in range(50):
        try:
            text = path.read_text().strip()
        except OSError:
            text = ""
        if text.isdigit():
            return int(text)
        time.sleep(0.01)
    return None


def _in_use(path: Path, what: str) -> LockHeldError:
    """The refusal of ``what``, whose lock file ``path`` another process holds (its PID named)."""
    pid = _holder(path)
    holder = f"process {pid}" if pid is not None else "another process (PID unknown)"
    return LockHeldError(
        f"{what} is in use by {holder} (lock file {path}); wait for it to finish or stop it first",
        pid,
    )


def probe_lock(path: str | os.PathLike, *, what: str) -> None:
    """Raise :class:`LockHeldError` naming the holder if another open file holds ``path``.

    Nothing is created or written: for a process refused because the directory of ``path`` is
    held (:func:`~fedprivopt.simulation.rundir.lock_directory`), whose lock file may no longer
    be the holder's. Thirty-eighth review of issue 15 (rundirs 2): such a refusal took the lock
    of the file found there, wrote its PID into it and emptied it; a user's file hard-linked in
    place of the holder's ``run.lock`` (``ln notes.txt R/run.lock``) was emptied. A missing
    file returns; one that is not a regular file (a link, FIFO, directory) is refused naming it,
    as :func:`exclusive_lock` refuses it.
    """
    path = Path(path)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        with exclusive_lock(path, what=what):  # raises before it writes anything
            return  # pragma: no cover - replaced by a regular file meanwhile
    import fcntl

    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link since the lstat
            _refuse_link(path)
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(path, what) from None
        except OSError:
            return  # a file system without locks: the caller's own refusal says enough
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike, *, what: str = "") -> Iterator[Path]:
    """Hold an exclusive lock on ``path`` for the ``with`` block, without waiting.

    The lock file is created if absent (its parent must exist) and holds this process's PID
    while locked (emptied on release). The lock is ``flock``'s: it belongs to the open file, so
    a second claim in the same process is refused too, and the kernel releases it when the
    holder dies (a stale file with a dead PID does not block anyone). After locking, the path is
    checked to still name the locked file, so a holder may delete the file before releasing it.

    Parameters
    ----------
    path : path-like
        The lock file.
    what : str
        What the lock protects, for the error message (default: the lock file's directory).

    Raises
    ------
    LockHeldError
        (a ``ValueError``) when another open file holds the lock; the message names the
        holder's PID.
    ValueError
        When ``path`` is not a regular file (a FIFO, a device), naming it.
    """
    path = Path(path)
    what = what or f"{str(path.parent)!r}"
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no protection
        yield path
        return
    for _ in range(100):
        try:
            # O_NOFOLLOW: a lock file that is a symbolic link would have the linked file emptied
            # and a PID written into it (fifteenth review of issue 15: a user's file, emptied)
            fd = os.open(path, _LOCK_FLAGS, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP or path.is_symlink():
                _refuse_link(path)
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device (issue 15, ninth review)
            os.close(fd)
            raise ValueError(
                f"lock file {path} is not a regular file; remove it (it holds no run data)"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _in_use(path, what) from None
        except OSError as exc:
            os.close(fd)
            raise unlockable(path, exc) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the file was removed or replaced after we opened it: lock the new one
    else:  # pragma: no cover - a file replaced 100 times in a row
        raise LockHeldError(f"{what}: lock file {path} keeps being replaced", None)
    try:
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # a full disk (fourteenth review of issue 15): name the file
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        yield path
    finally:
        try:
            if os.path.exists(path) and os.path.samestat(os.fstat(fd), os.stat(path)):
                os.ftruncate(fd, 0)
        except OSError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
