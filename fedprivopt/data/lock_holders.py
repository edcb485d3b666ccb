"""Who holds a lock file: ``/proc/locks`` and ``/proc/<pid>/fdinfo`` read (Linux; else unknown).

:func:`lock_holders` lists the PIDs ``/proc/locks`` shows holding a file's ``flock``;
:func:`named_holder` says which PID to name in a refusal or a wait, given the PID the lock
file holds: a listed process only if it still holds the lock, else the one that does, and none
of another PID namespace. Split from :mod:`fedprivopt.data.locks`, whose locks name their
holders with it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["lock_holders", "named_holder", "suspended"]


def named_holder(path: str | os.PathLike, pid: int | None) -> int | None:
    """The PID to name for lock file ``path``, whose file says ``pid`` (see ``locks._holder``).

    Follow-up of the forty-second review of issue 15 (outputs 2): with no holder listed, the
    file's PID was named if alive here (for a ``/proc/locks`` that lists nothing), but between
    sibling containers ``/proc/locks`` hides the other's lock and its PID 1 is this namespace's
    init: ``in use by process 1``, the refused process itself. Named now only where
    ``/proc/locks`` does not list this process's own lock either (:func:`_lists_own_locks`).

    Forty-third review of issue 15 (processes 1): ``/proc/locks`` keeps the PID of the process
    that took the ``flock``, also once it has died (SIGKILL) while a child it forked holds the
    lock on; that PID may then be another process's. A listed PID is named only if it still
    holds the file locked (:func:`_living_holder`), else the process that does.
    """
    holders = lock_holders(path)
    if holders is None:  # not Linux, or unreadable: the file says it, as before
        return pid
    visible = sorted(p for p in holders if p > 0)
    if pid in holders or visible:
        return _living_holder(path, pid if pid in holders else visible[0])
    if holders or pid is None or not _alive(pid) or _lists_own_locks():
        return None  # hidden here: a holder in another PID namespace
    return pid  # a /proc/locks that lists nothing (a sandbox): the file's PID, as before


def _living_holder(path: str | os.PathLike, listed: int) -> int | None:
    """``listed`` (a PID ``/proc/locks`` shows for ``path``) if it holds the lock, else who does.

    ``None`` when the listed process holds nothing and no holder is found. Only ``/proc``'s
    ``fdinfo`` is read (the lock's device and inode, as in ``/proc/locks``), never the files the
    processes have open, so a hung network mount of another process's cannot block this.
    """
    try:
        key = _lock_key(os.stat(path))
    except OSError:
        return listed
    asked = _holds(listed, key)
    if asked:
        return listed
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        pids = []
    found = [pid for pid in pids if pid != listed and _holds(pid, key)]
    if found:
        return min(found)
    if asked is None:  # cannot be asked (another user's), and no process here shows it: it
        return listed  # (follow-up of the forty-third review, outputs 2)
    # a kernel whose fdinfo shows no locks (before Linux 3.8) finds none: the listing, as before
    return listed if _alive(listed) and not _shows_fd_locks() else None


def _lock_key(st: os.stat_result) -> tuple[str, str]:
    """The file ``st`` as a lock line names it: ``MAJ:MIN:INODE``, and the inode alone."""
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}", str(st.st_ino)


def _flock_on(text: bytes, key: tuple[str, str]) -> bool:
    """Whether an ``fdinfo`` (``lock:`` lines, as ``/proc/locks``'s) shows a ``flock`` on ``key``.

    The inode alone where the device differs (btrfs subvolumes, overlay: see
    :func:`lock_holders`).
    """
    for line in text.decode("ascii", "replace").splitlines():
        parts = line.split()  # "lock:  1: FLOCK  ADVISORY  WRITE 412 fe:00:4252419 0 EOF"
        if len(parts) >= 7 and parts[0] == "lock:" and parts[2] == "FLOCK":
            if parts[6] == key[0] or parts[6].rpartition(":")[2] == key[1]:
                return True
    return False


def _holds(pid: int, key: tuple[str, str]) -> bool | None:
    """Whether process ``pid`` holds a ``flock`` on file ``key`` (``None``: not readable here).

    Follow-up of the forty-third review of issue 15 (outputs 2): under ``/proc`` mounted with
    ``hidepid=2`` (``hidepid=invisible``, as shared machines mount it) another user's process
    has no ``/proc/<pid>`` at all; it was taken for gone, and ``data synth --out D`` beside
    another user's running ``data synth`` said ``in use by another process (PID unknown)``
    where the PID was named before. A process that is there (``kill`` refused) is asked no
    further, as one whose ``fdinfo`` cannot be read.
    """
    where = f"/proc/{pid}/fdinfo"
    try:
        fds = os.listdir(where)
    except PermissionError:
        return None
    except OSError:
        return None if _another_users(pid) else False  # hidden, or gone
    for fd in fds:
        try:
            with open(f"{where}/{fd}", "rb") as f:
                if _flock_on(f.read(65536), key):
                    return True
        except OSError:
            continue
    return False


def _shows_fd_locks() -> bool:
    """Whether this kernel's ``/proc/<pid>/fdinfo`` shows the locks held through a descriptor."""

    def shown(fd: int) -> bool:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
            return _flock_on(f.read(65536), _lock_key(os.fstat(fd)))

    return _probe_own_lock(shown)


def _lists_own_locks() -> bool:
    """Whether ``/proc/locks`` lists a ``flock`` this process holds (on an anonymous file)."""
    return _probe_own_lock(lambda fd: os.getpid() in (lock_holders(f"/proc/self/fd/{fd}") or ()))


def _probe_own_lock(seen: Callable[[int], bool]) -> bool:
    """``seen(fd)`` while this process holds a shared ``flock`` on an anonymous file ``fd``.

    ``False`` where no such file can be made (not Linux: nothing is listed either) or the probe
    fails.
    """
    import fcntl

    try:
        fd = os.memfd_create("fedprivopt-lock-probe", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return seen(fd)
    except OSError:
        return False
    finally:
        os.close(fd)


def _another_users(pid: int) -> bool:
    """Whether a process ``pid`` exists here that this user may not signal (another user's)."""
    if pid <= 0:
        return False  # 0 would ask about this process's group
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except (OSError, OverflowError):
        return False
    return False


def suspended(pid: int | None) -> bool:
    """Whether process ``pid`` is stopped (Ctrl-Z, SIGSTOP, a debugger): it runs no further.

    Forty-seventh review of issue 15 (processes 2): a holder suspended while it held a lock
    (``data synth --out D`` stopped with Ctrl-Z) was named with "wait for it to finish", which
    it never does until it is resumed. ``False`` where ``/proc`` does not say.
    """
    if pid is None or pid <= 0:
        return False
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            text = f.read(4096)
    except OSError:
        return False
    # the command name (field 2) may hold spaces and parentheses: the state follows the last ')'
    state = text[text.rfind(b")") + 2 :][:1]
    return state in (b"T", b"t")


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists in this PID namespace."""
    if pid <= 0:
        return False  # 0 would ask about this process's group
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # another user's
    except (ProcessLookupError, OverflowError):
        return False
    return True


def lock_holders(path: str | os.PathLike) -> set[int] | None:
    """The PIDs ``/proc/locks`` shows holding a ``flock`` on ``path``'s file (``None``: unknown).

    PIDs as this process's PID namespace sees them; a process it does not see (another
    container's) is left out, or shown as 0 by older kernels. Waiters (``->``) are left out.
    """
    try:
        st = os.stat(path)
        with open(_PROC_LOCKS, "rb") as f:
            text = f.read(16 * 2**20).decode("ascii", "replace")
    except OSError:
        return None
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    exact, same_inode = set(), set()
    for line in text.splitlines():
        parts = line.split()  # "1: FLOCK  ADVISORY  WRITE 412 fe:00:4252419 0 EOF"
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[4].lstrip("-").isdigit():
            if parts[5] == key:
                exact.add(int(parts[4]))
            elif parts[5].rpartition(":")[2] == str(st.st_ino):
                same_inode.add(int(parts[4]))
    # the kernel names the device of the inode locked, which stat shows otherwise on btrfs
    # subvolumes and overlay mounts (a container's): then the inode number alone
    return exact or same_inode


_PROC_LOCKS = "/proc/locks"
