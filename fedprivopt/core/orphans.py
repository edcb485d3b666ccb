"""Worker processes that do not outlive the process that forked them (Linux).

A pool of forked workers (``data synth``'s generators, the token cache's encoders) outlived a
parent killed by SIGKILL (the out-of-memory killer, ``kill -9``): each worker blocked for ever
writing its result into a pipe whose read end it holds itself, kept its memory (300 MB each at
300,000 users) and kept the descriptor of the data directory's lock it inherited, so the next
``data synth`` into that directory was refused "in use by process N" (a dead PID) and a task
waited for the lock for ever (twenty-first review of issue 15). :func:`die_with_parent` asks
the kernel to kill the worker when its parent dies (``PR_SET_PDEATHSIG``); such workers compute
only, so nothing is lost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

__all__ = ["die_with_parent", "fork_refusal", "fork_refused"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """Have this (forked or spawned) process sent ``sig`` when its parent ``parent`` dies.

    Call it first in a pool's initializer, with the PID the parent had when it started the
    process (passed in the initializer's arguments): if the parent died before the call, this
    process is sent ``sig`` at once. The parent is compared by PID, not with 1: where orphans
    go to a subreaper (``systemd --user``, ``tini -s``), an orphan's parent is not PID 1
    (thirty-first review of issue 15: a ``compare --jobs`` worker checked ``getppid() == 1``
    and lived on). ``sig`` is SIGKILL for workers that only compute; ``compare``'s workers take
    SIGTERM, which ends a run with its files kept. A no-op where ``prctl`` is missing (not
    Linux).
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig))
    if os.getppid() != parent:  # the parent died between the start and the call
        os.kill(os.getpid(), int(sig))


def fork_refused(exc: BaseException) -> bool:
    """Whether ``exc`` is the kernel refusing to start a process (``fork``: EAGAIN).

    Forty-third review of issue 15 (processes 2): under a limit on processes (``ulimit -u``, a
    container's or systemd's pids limit) the start of the watchdog, the SuperLink, a SuperNode,
    ``flwr run`` or Ray's processes ended the command in a 20-line ``BlockingIOError``
    traceback, rc 1. Only an EAGAIN raised where ``subprocess`` starts the child is meant (not a
    file's EAGAIN, which names its file).

    Follow-up of that review (outputs 3): ``data synth --out D --workers 2`` (its workers forked
    by :mod:`multiprocessing`: ``os.fork`` in ``popen_fork``'s ``_launch``) still ended in the
    traceback, and from Python 3.13 ``subprocess`` starts most children (the ``flwr`` calls of
    ``deploy local``) with ``os.posix_spawn`` in ``_posix_spawn``, whose EAGAIN names the
    program: each is one of :data:`_STARTS`.
    """
    import errno

    if not isinstance(exc, OSError) or exc.errno != errno.EAGAIN:
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    name = tb.tb_frame.f_code.co_name
    return name in _STARTS and (exc.filename is None or name == "_posix_spawn")


#: Where the standard library starts a process: the function of the innermost frame of the
#: EAGAIN a refused ``fork``, ``clone`` or ``posix_spawn`` raises (they are C functions).
_STARTS = frozenset(
    {
        "_execute_child",  # subprocess: _fork_exec
        "_posix_spawn",  # subprocess, Python >= 3.13 in most cases: its error names the program
        "_launch",  # multiprocessing's popen_fork: os.fork (the "fork" and "forkserver" methods)
        "spawnv_passfds",  # multiprocessing.util: the "spawn" and "forkserver" methods
    }
)


def fork_refusal(exc: BaseException) -> str | None:
    """The one line to say for ``exc`` when :func:`fork_refused` holds, else ``None``.

    What ``deploy local`` and the command line print (after their own prefix).
    """
    if not isinstance(exc, OSError) or not fork_refused(exc):
        return None
    return (
        f"a process could not be started ({exc.strerror or exc}): this user's (or the "
        "container's) limit on processes and threads is reached (ulimit -u, a pids limit); stop "
        "other processes or raise the limit"
    )
