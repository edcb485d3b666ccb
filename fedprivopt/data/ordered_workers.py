"""Worker processes that compute a list of jobs, yielded in order, and stop at once when asked.

``data synth`` draws its chunks of users in worker processes (:mod:`fedprivopt.data.
synthetic_rows`). Twenty-eighth review of issue 15: through a ``ProcessPoolExecutor`` of forked
workers, a signal to the process group (Ctrl-C at a terminal, SIGHUP when the terminal closed)
printed each worker's "interrupted twice; ended at once" line after the command's one line (a
forked worker runs the parent's signal handlers), and SIGTERM of the group (``kill -TERM
-PGID``, a service manager) hung for over a minute; stopping the workers at once instead (a
kill) hung the interpreter's exit in 1 of about 15 tries: the pool's thread, reading a result a
killed worker had half written, waited for the rest for ever (the parent holds the pipe's other
end too, so no end of file comes).

Here each worker has its own pipe, whose other end only the worker holds, and the parent reads
the results in its own thread: a worker that dies is an end of file, and an interrupted parent
kills its workers (they only compute) and joins them, with no thread left to wait for. The
workers ignore the ending signals (blocked from the fork until they do): they are the parent's.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["ENDING_SIGNALS", "in_order"]

#: What ends a command (Ctrl-C, ``kill``, a closed terminal): the parent's to handle.
ENDING_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def _serve(conn, initializer: Callable[..., None], initargs: tuple, function: Callable) -> None:
    """A worker: ignore the ending signals, run ``initializer``, then answer each request."""
    for sig in ENDING_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, ENDING_SIGNALS)
    failed: Exception | None = None
    try:
        initializer(*initargs)
    except Exception as exc:  # reported with the first request
        failed = exc
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if request is None:
            return
        if failed is not None:
            conn.send((False, failed))
            continue
        try:
            reply = (True, function(*request))
        except Exception as exc:
            reply = (False, exc)
        conn.send(reply)


def _ended(process, index: int) -> ValueError:
    """The error of a worker that ended without the result of job ``index``."""
    process.join(1.0)
    return ValueError(
        f"a worker process (PID {process.pid}) ended without its result (job {index}, exit code "
        f"{process.exitcode}: killed, or out of memory); run the command again, with fewer "
        "--workers if memory is short"
    )


def in_order(
    function: Callable[..., Any],
    jobs: Sequence[tuple],
    workers: int,
    initializer: Callable[..., None],
    initargs: tuple = (),
) -> Iterator[Any]:
    """Yield ``function(*job)`` for every job of ``jobs``, in order, from ``workers`` processes.

    Each worker runs ``initializer(*initargs)`` first. Job ``i`` goes to worker ``i % workers``,
    which gets its next job as soon as its result is taken: at most ``workers`` jobs are being
    computed and one is being consumed. A job's exception is raised here; a worker that dies is
    a ``ValueError`` naming it. When the caller stops early (an exception, a signal, the
    generator closed) the workers are killed and joined before this returns. Workers are forked
    where the platform can (spawn elsewhere: ``function`` and ``initializer`` must then be
    importable).
    """
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    count = max(1, min(workers, len(jobs)))
    processes, conns = [], []
    finished = False
    try:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, ENDING_SIGNALS)
        try:
            for _ in range(count):
                mine, theirs = context.Pipe()
                process = context.Process(
                    target=_serve, args=(theirs, initializer, initargs, function), daemon=True
                )
                process.start()
                theirs.close()  # only the worker holds its end: its death is an end of file
                processes.append(process)
                conns.append(mine)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for i in range(min(count, len(jobs))):
            _send(conns[i], processes[i], jobs[i], i)
        for i in range(len(jobs)):
            k = i % count
            try:
                ok, value = conns[k].recv()
            except (EOFError, OSError):
                raise _ended(processes[k], i) from None
            if i + count < len(jobs):
                _send(conns[k], processes[k], jobs[i + count], i + count)
            if not ok:
                raise value
            yield value
        finished = True
    finally:
        _end(processes, conns, finished)


def _send(conn, process, job: tuple, index: int) -> None:
    try:
        conn.send(job)
    except OSError:  # a dead worker's pipe
        raise _ended(process, index) from None


def _end(processes: list, conns: list, finished: bool) -> None:
    """Stop the workers: ask them to end after the last job, else kill them; then join them."""
    for process, conn in zip(processes, conns, strict=True):
        asked = False
        if finished:
            with contextlib.suppress(OSError):
                conn.send(None)
                asked = True
        if not asked:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                process.kill()
    for process, conn in zip(processes, conns, strict=True):
        process.join(10.0)
        if process.is_alive():
            process.kill()
            process.join()
        conn.close()
