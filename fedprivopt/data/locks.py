"""Exclusive inter-process file locks (POSIX ``flock``; no-ops elsewhere).

:func:`file_lock` waits for the lock (several processes building the same files, one at a time);
:func:`exclusive_lock` never waits: it holds the lock or raises ``ValueError`` naming the process
that holds it. Either writes its holder's PID into the lock file (emptied on release).

The lock files themselves (the root of the file system refused, a symbolic link refused, the
PID written into a file of its own, a file system without locks named) are in
:mod:`~fedprivopt.data.lock_files`; who holds a lock (``/proc/locks`` and ``/proc/<pid>/fdinfo``
read) in :mod:`~fedprivopt.data.lock_holders`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from fedprivopt.data.lock_files import (
    directory_held,
    name_holder,
    open_lock,
    refuse_filesystem_root,
    refuse_link,
    unlockable,
    unname_holder,
)
from fedprivopt.data.lock_holders import lock_holders, named_holder, suspended

__all__ = [
    "DATA_LOCK",
    "LockHeldError",
    "directory_held",
    "exclusive_lock",
    "file_lock",
    "holds_lock",
    "lock_holders",
    "named_holder",
    "probe_lock",
    "refuse_filesystem_root",
    "unlockable",
]

_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)

#: The lock file of a StackOverflow data directory: held by a task while it generates its
#: synthetic files (waiting) and by ``fedprivopt data synth`` (refusing to wait for another).
DATA_LOCK = ".stackoverflow.lock"


#: How long a lock waits for the shared lock on its directory (:class:`_DirectoryShare`) before
#: going on without it (a run directory's holder keeps an exclusive one there for its run).
_SHARE_WAIT = 0.5


class _DirectoryShare:
    """A shared ``flock`` on a lock file's directory, held with the lock file's own.

    Fortieth review of issue 15 (processes 1): a ``flock`` is its inode's, and a directory
    copied with ``cp -al dA dB`` (as snapshot backups make) shares ``.stackoverflow.lock``'s
    inode with ``dA``: while a process held ``dA``'s lock, ``data synth --out dB --overwrite``
    said ``dB`` was in use by that process and a task on ``dB`` waited for it. A hard-linked lock
    file is detached from its name (:meth:`detach`) only under an exclusive ``flock`` on its
    directory, which no holder of a lock file there can share: each holds this shared one from
    before it checks that the name is its file's until it lets go, so the name is replaced only
    when nobody locks a file through this directory and the holder found is another
    directory's. A directory nobody may open, or one held exclusively for longer than
    :data:`_SHARE_WAIT` (a run directory's lock, :mod:`~fedprivopt.simulation.rundir`), is not
    shared: the lock file is then never detached, as before.
    """

    def __init__(self, directory: Path) -> None:
        try:
            self.fd: int | None = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self.fd = None
        self.shared = False

    def share(self) -> None:
        """Take the shared lock, waiting up to :data:`_SHARE_WAIT` seconds (then without it)."""
        import fcntl

        if self.fd is None or self.shared:
            return
        deadline = time.monotonic() + _SHARE_WAIT
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.005)
                continue
            except OSError:  # a file system without locks: the lock file's own refusal says it
                return
            self.shared = True
            return

    def unshare(self) -> None:
        """Let the shared lock go (while this process waits for the lock file's holder)."""
        import fcntl

        if self.fd is not None and self.shared:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self.shared = False

    def detach(self, path: Path, fd: int) -> bool:
        """Remove ``path`` if it names open file ``fd``, a file with other hard links.

        For a lock file whose ``flock`` another process holds, or this one (a file linked in
        its place, which is not to be written). Done only under the directory's exclusive lock
        (no holder or claimant of a lock file here then), so another holder locks it through
        another directory's name; ``True`` if the name was removed.
        """
        import fcntl

        if self.fd is None or not self.shared or os.fstat(fd).st_nlink < 2:
            return False
        self.unshare()
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.share()
            return False
        try:
            st = path.lstat()
            if stat.S_ISREG(st.st_mode) and os.path.samestat(st, os.fstat(fd)):
                path.unlink()
                return True
            return False
        except FileNotFoundError:
            return True  # removed meanwhile: the caller opens the name again
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self.share()

    def close(self) -> None:
        """Let the shared lock go and close the directory."""
        if self.fd is not None:
            self.unshare()
            os.close(self.fd)
            self.fd = None


def _names(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the open file ``fd``."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


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
    path = Path(path)
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    share = _DirectoryShare(path.parent)
    said = False
    try:
        for _ in range(100):
            share.share()
            fd = open_lock(path, flags)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    # eighteenth review of issue 15, finding 6: a FIFO ended a task's data
                    # generation with "File or stream is not seekable." (rc 2, naming no file)
                    # and a token cache's build in a traceback (rc 1)
                    raise ValueError(
                        f"lock file {path} is not a regular file; remove it (it holds no data)"
                    )
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    # another directory's (cp -al): not ours. Or detached by another claim
                    # here while this one's detach let its share go (follow-up of the fortieth
                    # review, outputs 4): this one waited for the other directory's holder.
                    if share.detach(path, fd) or not _names(fd, path):
                        os.close(fd)
                        continue
                    if not said:
                        _say_waiting(path, fd)
                        said = True
                    share.unshare()  # a claimant here may detach the file while this one waits
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    share.share()
                except OSError as exc:
                    raise unlockable(path, exc) from None
            except BaseException:
                os.close(fd)
                raise
            if _names(fd, path):
                break
            os.close(fd)  # removed or detached while this process waited: lock the new file
        else:  # pragma: no cover - a file replaced 100 times in a row
            raise OSError(errno.EAGAIN, "lock file keeps being replaced", str(path))
        try:
            own = name_holder(fd)
            with _noted(fd):
                yield
        finally:
            unname_holder(fd, path, own)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
    finally:
        share.close()


#: The lock files this process holds (:func:`file_lock`, :func:`exclusive_lock`) by device and
#: inode, each with the threads that hold it (:func:`holds_lock`).
_HELD: dict[tuple[int, int], set[int]] = {}


@contextlib.contextmanager
def _noted(fd: int) -> Iterator[None]:
    """Note for :func:`holds_lock` that this thread holds the lock file open as ``fd``."""
    st = os.fstat(fd)
    key, thread = (st.st_dev, st.st_ino), threading.get_ident()
    _HELD.setdefault(key, set()).add(thread)
    try:
        yield
    finally:
        threads = _HELD.get(key, set())
        threads.discard(thread)
        if not threads:
            _HELD.pop(key, None)


def holds_lock(path: str | os.PathLike) -> bool:
    """Whether this thread holds the lock file ``path`` (:func:`file_lock`, :func:`exclusive_lock`).

    For a function that takes a lock unless its caller already holds it: a second claim of a
    lock this process holds waits for ever (:func:`file_lock`) or is refused
    (:func:`exclusive_lock`). Follow-up of the forty-sixth review of issue 15 (outputs 2):
    :func:`~fedprivopt.data.synthetic.generate`, which ``data synth`` and a task call under the
    data directory's lock, took none when called alone.
    """
    try:
        st = os.stat(path)
    except OSError:
        return False
    return threading.get_ident() in _HELD.get((st.st_dev, st.st_ino), ())


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
    pid = named_holder(path, int(text) if text.isdigit() else None)  # (processes 4)
    holder = f"process {pid}" if pid is not None else "another process"
    if suspended(pid):  # (forty-seventh review, processes 2)
        why = f"it is suspended (Ctrl-Z or SIGSTOP): resume it (fg, or kill -CONT {pid}) or stop it"
    else:
        why = "a suspended process must be resumed or stopped first"
    print(
        f"fedprivopt: waiting for {holder}, which holds {path} while it writes the files there "
        f"({why})",
        file=sys.stderr,
        flush=True,
    )


class LockHeldError(ValueError):
    """Another process holds the lock (:attr:`pid`: its process id, ``None`` if unknown)."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


def _holder(path: Path) -> int | None:
    """The PID of the process holding lock file ``path`` (``None``: unknown, or not visible here).

    The holder writes its PID right after locking; ``/proc/locks`` names the process that took
    the ``flock`` (:func:`lock_holders`). Forty-second review of issue 15 (processes 4): a
    holder in another PID namespace (a container sharing the directory; ``unshare --pid``)
    writes its own namespace's PID, and ``data synth --out D`` said ``D`` was ``in use by
    process 1``: init here. A PID in the file that is not a holder's is not named.
    """
    for _ in range(50):
        try:
            text = path.read_text().strip()
        except OSError:
            text = ""
        if text.isdigit():
            break
        time.sleep(0.01)
    return named_holder(path, int(text) if text.isdigit() else None)


def _in_use(path: Path, what: str) -> LockHeldError:
    """The refusal of ``what``, whose lock file ``path`` another process holds (its PID named)."""
    pid, seen = _holder(path), lock_holders(path)
    if pid is not None:
        holder = f"process {pid}"
    elif seen is not None and not any(p > 0 for p in seen):  # hidden here, or shown as 0
        holder = "a process of another PID namespace (a container sharing this directory)"
    else:
        holder = "another process (PID unknown)"
    advice = "wait for it to finish or stop it first"
    if suspended(pid):
        # forty-seventh review of issue 15 (processes 2): told to wait for a process that was
        # suspended (Ctrl-Z, SIGSTOP), which never finishes until it is resumed
        holder += ", which is suspended (Ctrl-Z or SIGSTOP)"
        advice = f"resume it (fg, or kill -CONT {pid}) and let it finish, or stop it first"
    return LockHeldError(f"{what} is in use by {holder} (lock file {path}); {advice}", pid)


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
            refuse_link(path)
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
def exclusive_lock(
    path: str | os.PathLike, *, what: str = "", share: bool = True
) -> Iterator[Path]:
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
    share : bool
        Whether to hold a shared lock on the lock file's directory with it, under which a lock
        file hard-linked from another directory (``cp -al``) is detached from its name rather
        than taken for this one's (:class:`_DirectoryShare`); ``False`` for a caller holding an
        exclusive lock on that directory itself
        (:func:`~fedprivopt.simulation.rundir.lock_directory`).

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
    guard = _DirectoryShare(path.parent) if share else None
    try:
        fd = _claim(path, what, guard)
    except BaseException:
        if guard is not None:
            guard.close()
        raise
    # Fortieth review of issue 15 (processes 5): a lock file with other hard links (`ln
    # notes.txt D/.stackoverflow.lock`) was emptied and given the PID: the user's file lost. A
    # file with other names is never written (its holder's PID then goes unnamed).
    own = os.fstat(fd).st_nlink == 1
    try:
        try:
            if own:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # a full disk (fourteenth review of issue 15): name the file
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        with _noted(fd):
            yield path
    finally:
        try:
            st = os.fstat(fd)
            if own and st.st_nlink == 1 and os.path.samestat(st, os.stat(path)):
                os.ftruncate(fd, 0)
        except OSError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        if guard is not None:
            guard.close()


def _claim(path: Path, what: str, guard: _DirectoryShare | None) -> int:
    """Open and lock ``path`` without waiting (see :func:`exclusive_lock`); its descriptor."""
    import fcntl

    for _ in range(100):
        if guard is not None:
            guard.share()
        fd = open_lock(path, _LOCK_FLAGS)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device (issue 15, ninth review)
            os.close(fd)
            raise ValueError(
                f"lock file {path} is not a regular file; remove it (it holds no run data)"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            detached = guard is not None and guard.detach(path, fd)
            os.close(fd)
            if detached:  # another directory's file (cp -al): this one gets its own
                continue
            raise _in_use(path, what) from None
        except OSError as exc:
            os.close(fd)
            raise unlockable(path, exc) from None
        except BaseException:
            os.close(fd)
            raise
        if not _names(fd, path):
            os.close(fd)  # the file was removed or replaced after we opened it: lock the new one
            continue
        if guard is not None and (guard.detach(path, fd) or not _names(fd, path)):
            # other names: a file of its own. Follow-up of the fortieth review of issue 15
            # (outputs 3): while the detach let its share go, another claim here detached the
            # name itself and locked the new file; this one then held the old file (another
            # directory's) as this directory's lock: two holders, a PID written into the other
            # directory's file. The name is checked again, and the new file is claimed.
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            continue
        return fd
    # pragma: no cover - a file replaced 100 times in a row
    raise LockHeldError(f"{what}: lock file {path} keeps being replaced", None)
