"""Lock files themselves: where one may be, how one is opened, and the PID written into it.

:func:`refuse_filesystem_root` refuses the root of the file system as a directory to write;
:func:`open_lock` opens a lock file, refusing a symbolic link (:func:`refuse_link`);
:func:`unlockable` names a file system that keeps no locks; :func:`name_holder` and
:func:`unname_holder` write this process's PID into a locked file of its own and empty it.
Split from :mod:`fedprivopt.data.locks`, whose locks open their files with them.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from fedprivopt.core.text import shown

__all__ = [
    "directory_held",
    "name_holder",
    "open_lock",
    "refuse_filesystem_root",
    "refuse_link",
    "unlockable",
    "unname_holder",
]


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


def name_holder(fd: int) -> bool:
    """Write this process's PID into locked file ``fd`` if it is a file of its own.

    Forty-second review of issue 15 (processes 1): :func:`~fedprivopt.data.locks.file_lock`
    wrote nothing, so its file kept the PID of an earlier
    :func:`~fedprivopt.data.locks.exclusive_lock` holder killed with SIGKILL (``data synth``
    killed, its lock file never emptied). While a task generated its dataset there under this
    lock, ``data synth --out D --overwrite`` said ``D`` was in use by that dead PID, in the test
    a ``sleep`` that had been given it: the user was told to stop an unrelated process. A file
    with other hard links (a user's) is never written; ``True`` if this one was.
    """
    try:
        if os.fstat(fd).st_nlink != 1:
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:  # a full disk: the lock holds all the same, its PID goes unnamed
        return False
    return True


def unname_holder(fd: int, path: Path, own: bool) -> None:
    """Empty locked file ``fd`` on release if :func:`name_holder` wrote it and ``path`` is it."""
    if not own:
        return
    try:
        st = os.fstat(fd)
        if st.st_nlink == 1 and os.path.samestat(st, os.stat(path)):
            os.ftruncate(fd, 0)
    except OSError:
        pass


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


def open_lock(path: Path, flags: int) -> int:
    """``os.open`` of lock file ``path`` (``flags`` with ``O_NOFOLLOW``); a link is refused.

    O_NOFOLLOW: a lock file that is a symbolic link would have the linked file emptied and a PID
    written into it (fifteenth review of issue 15: a user's file, emptied).
    """
    try:
        return os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            refuse_link(path)
        raise


def refuse_link(path: Path) -> None:
    """Refuse a lock file that is a symbolic link (fifteenth review of issue 15).

    Opened through the link, the linked file would get a PID and be emptied on release
    (:func:`~fedprivopt.data.locks.exclusive_lock`), or be created where the link points
    (:func:`~fedprivopt.data.locks.file_lock`).
    """
    raise ValueError(
        f"lock file {path} is a symbolic link (to {os.readlink(path)!r}"[:300]
        + "); remove the link (it holds no run data): fedprivopt writes its PID "
        "into a lock file and empties it, and must not do so to the linked file"
    ) from None


def directory_held(directory: str | os.PathLike) -> bool:
    """Whether another open file holds ``directory`` itself locked (an exclusive ``flock``).

    Asked with a shared lock, let go at once; nothing is written. ``False`` where the directory
    cannot be opened as one (missing, a symbolic link, not a directory), on a file system that
    keeps no locks, and where ``flock`` does not exist (Windows). A deployment holds its log
    directory so (``deploy local``: ``OUT/deploy``), which ``deploy.local_checks``'s
    ``check_not_deploying`` and ``data synth``'s claim of a directory ask.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return False
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(directory, flags)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
