"""Interrupting a run: signals become one exception, and the processes a run starts end with it.

- :class:`Interrupted`: what :func:`~fedprivopt.simulation.run.simulate` and
  :func:`~fedprivopt.simulation.run.resume` raise when Ctrl-C (SIGINT), SIGTERM or SIGHUP stops
  a run. It is a ``KeyboardInterrupt`` and names the run directory; the command line turns it
  into one line and exit code ``128 + signal`` (130 for Ctrl-C).
- :func:`signals_raise`: SIGTERM and SIGHUP raise it, as Ctrl-C raises ``KeyboardInterrupt``.
  ``ray.init`` replaces the SIGTERM handler with ``sys.exit(15)``; :func:`as_interrupt`
  recognises that ``SystemExit`` too.
- :func:`stoppable_grid`: Flower's simulation runs the ServerApp in a thread that is not a
  daemon; after Ctrl-C it would wait for replies from the stopped Ray backend for up to
  ``round-timeout`` and keep the interpreter from exiting. Through this grid it stops at its next
  call instead (after finishing the round it is recording).
- :func:`signals_stop`: during a Flower simulation the first signal only sets that grid's stop
  event, so Flower and Ray end in their own order (the ServerApp returns, Flower sets its stop
  event, the workers finish their client jobs, Ray shuts down). A ``KeyboardInterrupt`` raised
  at an arbitrary point of Flower's thread joins or of ``ray.shutdown`` can leave the process
  running (seen once in CI, still running 60 s after Ctrl-C).
- A first signal while torch loads (every command imports it as it builds its parser) is raised
  once torch has loaded: raised inside torch's C++ start-up, it aborted the process (rc 134).
- :func:`held`: a first signal during a block that must not be cut (a round recorded in the
  ledger until its checkpoint is saved) is raised when the block ends.
- A second signal ends the process at once (:func:`end_now`), wherever the first one left it:
  with one line and exit code ``128 +`` the first signal, as a kill would (``--resume`` and the
  watchdogs already handle a killed run). Raised again during the unwinding or the interpreter's
  shutdown, it printed tracebacks from ``atexit`` callbacks and ``__del__`` methods, or aborted
  the process (rc -6; twenty-second review of issue 15). :func:`handle_until_exit` keeps this
  for the rest of a program's life, after the command has returned.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from fedprivopt.core.progress import bars_abandoned

__all__ = [
    "ENDING_SIGNALS",
    "Interrupted",
    "Stopped",
    "as_interrupt",
    "begin",
    "end_interrupted",
    "end_now",
    "finished",
    "handle_until_exit",
    "held",
    "reported",
    "signals_raise",
    "signals_stop",
    "stoppable_grid",
]

FIRST_PULL_WAIT = 0.05
"""Seconds before the second pull for replies on a grid without ``pull_interval``."""
MAX_PULL_WAIT = 1.0
"""Longest wait between two pulls for replies on a grid without ``pull_interval``."""


ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that end a command: Ctrl-C, ``kill`` and a closed terminal."""


class _Signals:
    """What this process has received, shared by every handler of this module.

    ``received``: the ending signals so far, in order. ``line``: what :func:`end_now` prints (the
    command's one line), ``None`` once the command has printed its own. ``code``: the exit code of
    a command that has returned, else ``None``. ``program``: set by :func:`handle_until_exit`;
    otherwise (a caller of the Python API) what was received is forgotten when the outermost
    handling block ends, so the caller's next run starts afresh. ``depth``: blocks open.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self.line: str | None = "fedprivopt: interrupted twice; ended at once"
        self.code: int | None = None
        self.program = False
        self.depth = 0


_SIGNALS = _Signals()


def begin(line: str) -> None:
    """A command starts: nothing received yet; ``line`` is what a second signal prints."""
    _SIGNALS.received = []
    _SIGNALS.line = line
    _SIGNALS.code = None


def second_line(line: str | None) -> str | None:
    """What a second signal prints from now on (:func:`end_now`); returns what it printed before.

    For a command that knows more once it has begun than :func:`begin` was told (its run
    directory). Forty-fourth review of issue 15 (processes 3): a deployment interrupted twice
    (Ctrl-C, then Ctrl-C while it stopped its processes) said only ``fedprivopt deploy local:
    interrupted twice; ended at once, as a kill would``; ``fedprivopt simulate --resume OUT``
    continues its run, as ``simulate``'s own line says of ``--resume``.
    """
    previous, _SIGNALS.line = _SIGNALS.line, line
    return previous


def reported() -> None:
    """The command has printed its own line about the interruption: a second signal adds none."""
    _SIGNALS.line = None


def finished(code: int) -> None:
    """The command returned ``code``: a signal from now on ends the process with it, silently."""
    _SIGNALS.line = None
    _SIGNALS.code = int(code)


def end_now(signum: int) -> None:
    """End the process at once, as a kill would: one line (unless said), no cleanup handlers.

    The exit code is the finished command's, else ``128 +`` the first signal received. What a run
    wrote stays as a kill leaves it: the ledger, the last checkpoint and the lock are safe against
    a kill, and the :class:`~fedprivopt.simulation.watchdog.Watchdog` processes and
    ``PR_SET_PDEATHSIG`` stop the processes the run started.
    """
    first = _SIGNALS.received[0] if _SIGNALS.received else signum
    code = _SIGNALS.code if _SIGNALS.code is not None else 128 + first
    # a progress bar still shown (the Flower engine's while Ray stops): its line ended and the
    # cursor shown again (thirty-eighth review of issue 15, signals 1)
    said = bars_abandoned()
    if _SIGNALS.line is not None:
        said += (_SIGNALS.line + "\n").encode("utf-8", "backslashreplace")
    if said:
        with contextlib.suppress(OSError):
            os.write(2, said)
    os._exit(code)


def _record(signum: int) -> None:
    """Note an ending signal; if one came before (or the command has returned), end now."""
    if _SIGNALS.received or _SIGNALS.code is not None:
        end_now(signum)
    _SIGNALS.received.append(int(signum))


def _raise(signum: int, frame: object) -> None:
    if not (_SIGNALS.received or _SIGNALS.code is not None) and (
        _torch_loading() or _in_fork_hook(frame)
    ):
        _defer(signum)
        return
    if _HOLDING and not (_SIGNALS.received or _SIGNALS.code is not None):
        if _HELD:  # a second one during the block ends the process at once
            _SIGNALS.received.append(_HELD[0])
            end_now(signum)
        _HELD.append(int(signum))
        return
    _record(signum)
    if sys.unraisablehook is not _unraisable:
        _PREVIOUS_HOOK[:] = [sys.unraisablehook]
        sys.unraisablehook = _unraisable
    raise Interrupted(signum)


_HOLDING: list[bool] = []
"""One entry per :func:`held` block open in the main thread."""
_HELD: list[int] = []
"""A first signal that came during a :func:`held` block, sent again when the block ends."""


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A first ending signal (Ctrl-C, SIGTERM, SIGHUP) inside is sent again when the block ends.

    It then reaches the handler that was in place before the block (this module's, which
    raises :class:`Interrupted`; Flower's in a deployment's ServerApp; Python's own). A second
    one meanwhile ends the process at once (:func:`end_now`), as a kill would. Only in the main
    thread; elsewhere (the ServerApp thread of a Flower simulation, whose first signal only
    stops the run after the round it records) this does nothing. A block left by an exception
    of its own sends it too.

    Forty-eighth review of issue 15 (processes 1): a signal after a round's ledger line and
    before its checkpoint (the metrics row's fsync, the checkpoint's own write) stopped the run
    without the round's model: a secure tree run could never be resumed, and a secure Gaussian
    run's ``--resume`` released the round again with new noise, charged twice (toy, 3 rounds:
    epsilon 13.70 where 12.17).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _HOLDING.append(True)
    try:
        with _handling(ENDING_SIGNALS, _raise):
            yield
    finally:
        _HOLDING.pop()
        if not _HOLDING and _HELD:
            signal.raise_signal(_HELD.pop())  # its handler runs before the next line


_PREVIOUS_HOOK: list[Any] = []
"""The ``sys.unraisablehook`` that :func:`_unraisable` replaced (when the first signal came)."""


def _unraisable(unraisable: Any) -> None:
    """Send a first signal's :class:`Interrupted` again where the interpreter could only print it.

    Forty-sixth review of issue 15 (processes 2): a handler that runs inside a finalizer (a
    ``__del__``: each ``subprocess.Popen`` dropped after a ``flwr`` call of ``deploy local``; a
    ``weakref.finalize`` or ``atexit`` callback), which the interpreter calls from C, raised
    :class:`Interrupted` there: ``Exception ignored in: ...``, and the command went on as if no
    signal had come. The signal is held back (:func:`_defer`, no longer counted as received)
    and raised in the code that follows. Anything else goes to the hook that was in place.
    """
    exc = unraisable.exc_value
    if isinstance(exc, Interrupted) and _SIGNALS.received == [exc.signum] and not _DEFERRED:
        if _SIGNALS.code is None:
            _SIGNALS.received.clear()
            _defer(exc.signum)
            return
    hook = _PREVIOUS_HOOK[0] if _PREVIOUS_HOOK else sys.__unraisablehook__
    hook(unraisable)


#: ``logging``'s functions that ``os.register_at_fork`` runs in this process around each of its
#: forks (Python 3.11 and 3.12: the first two; 3.13: the last two): they take and give back the
#: module's lock, outside any ``try``.
_LOGGING_FORK_HOOKS = frozenset({"_acquireLock", "_releaseLock", "_prepareFork", "_afterFork"})


def _in_fork_hook(frame: Any, *, held: bool = False) -> bool:
    """Whether ``frame`` (where a signal's handler runs) is inside a hook run around a fork.

    ``held``: or inside :func:`_unraisable`, which holds a signal back (processes 2).

    Forty-sixth review of issue 15 (processes 1): a signal that came while the process forked
    (``subprocess`` with a ``preexec_fn``: every process ``deploy local`` starts; Ray's, the
    ``os.fork`` of a probe) had its handler run in ``logging``'s after-fork hook, which the
    interpreter calls from C: :class:`Interrupted` raised there was only printed (``Exception
    ignored in: <function _releaseLock>``) and lost, and the hook never gave back the module's
    lock. ``kill PID`` of ``deploy local`` as it started ``flwr log`` let the deployment run on to
    its end, rc 0, and a ``logging`` call of any other thread would have waited for ever.
    """
    while frame is not None:
        if (
            getattr(frame, "f_globals", {}).get("__name__") == "logging"
            and frame.f_code.co_name in _LOGGING_FORK_HOOKS
        ):
            return True
        if held and frame.f_code is _unraisable.__code__:
            return True
        frame = frame.f_back
    return False


_DEFERRED: list[int] = []
"""A first signal that came while torch was loading, to be raised once it has loaded."""

REPLAY_POLL = 0.01
"""Seconds between two checks whether torch has loaded, with a signal waiting."""


def _torch_loading() -> bool:
    """Whether ``import torch`` is under way (its module runs, in this or another thread).

    torch's start-up runs Python code from C++ (``torch._C._c10d_init`` among others): an
    exception raised there cannot pass the C++ frames, and the process aborts (``terminate
    called after throwing an instance of 'python_error'`` or ``'pybind11::error_already_set'``,
    rc 134, 89 lines of stack). Twenty-ninth review of issue 15: SIGTERM 4.5 s into ``compare``
    under heavy load (every command imports torch as it builds its parser), 1 of 20 tries; every
    time when the signal comes from a Python function that ``_c10d_init`` calls.
    """
    spec = getattr(sys.modules.get("torch"), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _defer(signum: int) -> None:
    """Hold a first signal back until torch has loaded, then send it again (:func:`_replay`).

    Likewise a first signal whose handler runs in a hook around a fork (:func:`_in_fork_hook`):
    sent again once the hook has returned, it is raised where the fork was made.

    A second signal meanwhile ends the process at once, as after any first one.
    """
    if _DEFERRED:
        _SIGNALS.received.append(_DEFERRED[0])
        end_now(signum)
    _DEFERRED.append(int(signum))
    threading.Thread(target=_replay, name="fedprivopt-signal", daemon=True).start()


def _replay() -> None:
    """Once torch has loaded, the signal held back reaches the main thread again.

    Likewise once the main thread has left the hook around a fork it was in.
    """
    main = threading.main_thread().ident
    while _torch_loading() or _in_fork_hook(sys._current_frames().get(main), held=True):
        time.sleep(REPLAY_POLL)
    if _DEFERRED:
        signum = _DEFERRED.pop()
        signal.pthread_kill(threading.main_thread().ident, signum)


def end_interrupted() -> None:
    """An ``atexit`` callback, run last: an interrupted command's process ends now, with its code.

    Python resets the signal handlers after the ``atexit`` callbacks, then tears its modules
    down; a second Ctrl-C in that last window killed the process by SIGINT (rc -2 where 130 was
    due, 6 of 8 runs of ``simulate stackoverflow-tp.toml`` with a second Ctrl-C 0.01-0.2 s after
    the first). An interrupted command has nothing left to do there: its files are closed and
    its processes stopped. The standard streams are flushed first. A command that was not
    interrupted exits as usual.
    """
    code = _SIGNALS.code
    if code is None or code < 128:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def handle_until_exit() -> None:
    """For a program's life: a first ending signal raises :class:`Interrupted`, a second ends it.

    Nothing restores the previous handlers: after :func:`finished`, a signal during the
    interpreter's shutdown ends the process at once with the command's exit code. Only in the
    main thread; for the ``fedprivopt`` program, not for a caller of its ``main``. SIGHUP
    ignored when the program starts stays ignored, as the command's own blocks
    (:func:`signals_raise`) leave it: ``nohup`` ignores it so that the run outlives its terminal
    (thirty-first review of issue 15: ``nohup fedprivopt simulate …`` stopped with 129 when the
    terminal closed). Ctrl-C and SIGTERM are the program's whatever it inherited (a shell
    script's background job starts with SIGINT ignored; a Ctrl-C of the script's process group
    stops the run with its one line, resumable, as before).
    """
    if threading.current_thread() is threading.main_thread():
        _SIGNALS.program = True
        for sig in ENDING_SIGNALS:
            with contextlib.suppress(ValueError, OSError):
                if sig != signal.SIGHUP or signal.getsignal(sig) is not signal.SIG_IGN:
                    signal.signal(sig, _raise)


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal; what it released is kept and can be resumed.

    Parameters
    ----------
    signum : int
        The signal (SIGINT for Ctrl-C).
    out_dir : Path, optional
        The run directory (``--resume`` continues it).
    """

    def __init__(self, signum: int = signal.SIGINT, out_dir: Path | None = None) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = int(signum)
        self.out_dir = out_dir

    @property
    def exit_code(self) -> int:
        """``128 + signum``, as a shell reports a process ended by that signal."""
        return 128 + self.signum


class Stopped(Exception):
    """Raised in the ServerApp thread by :func:`stoppable_grid` once the run is stopped."""


def as_interrupt(exc: BaseException) -> Interrupted | None:
    """The interruption ``exc`` stands for, or None.

    ``KeyboardInterrupt`` (Ctrl-C, or :func:`signals_raise`), and ``SystemExit(15)``: the SIGTERM
    handler ``ray.init`` installs in the driver. A plain ``KeyboardInterrupt`` stands for the first
    signal received, if one was: Ray's core worker turns any exception of a signal handler that
    runs while it waits into one (twenty-ninth review of issue 15: SIGHUP or SIGTERM while the
    fast engine's actors started ended with 130, Ctrl-C's code).
    """
    if isinstance(exc, Interrupted):
        return exc
    if isinstance(exc, KeyboardInterrupt):
        return Interrupted(_SIGNALS.received[0] if _SIGNALS.received else signal.SIGINT)
    if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM:
        return Interrupted(signal.SIGTERM)
    return None


@contextlib.contextmanager
def _handling(signals: tuple[int, ...], handler: Any) -> Iterator[None]:
    """Install ``handler`` for ``signals`` in the main thread; restore the previous ones on exit.

    The previous handlers are restored also over one installed meanwhile (``ray.init`` does, for
    SIGTERM). Outside the main thread nothing is installed. A signal ignored when the block
    starts stays ignored: a ``compare --jobs`` worker leaves SIGHUP (and Ctrl-C) to its parent,
    and its run's :func:`signals_raise` made each worker print "interrupted twice; ended at
    once" when a closed terminal signalled the process group (twenty-eighth review of issue 15).
    """
    previous = {}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _SIGNALS.depth += 1
    try:
        for sig in signals:
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        _SIGNALS.depth -= 1
        if _SIGNALS.depth == 0 and not _SIGNALS.program:
            _SIGNALS.received = []
            if sys.unraisablehook is _unraisable and _PREVIOUS_HOOK:  # a caller's own again
                sys.unraisablehook = _PREVIOUS_HOOK.pop()


@contextlib.contextmanager
def signals_raise(
    signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP),
) -> Iterator[None]:
    """Make ``signals`` (SIGTERM and SIGHUP) raise :class:`Interrupted`, as Ctrl-C does.

    A second ending signal ends the process at once (:func:`end_now`). The previous handlers
    are restored on exit. Outside the main thread this does nothing.
    """
    with _handling(signals, _raise):
        yield


@contextlib.contextmanager
def signals_stop(stop: threading.Event) -> Iterator[list[int]]:
    """Make the first SIGINT, SIGTERM or SIGHUP set ``stop``; a second ends the process at once.

    Yields the list of signals received (empty if none), for the caller to raise
    :class:`Interrupted` once the stopped work has ended. The previous handlers are restored on
    exit. Outside the main thread this does nothing.
    """
    received: list[int] = []

    def handler(signum: int, frame: object) -> None:
        _record(signum)
        received.append(signum)
        stop.set()

    with _handling(ENDING_SIGNALS, handler):
        yield received


def stoppable_grid(grid: Any, stop: threading.Event) -> Any:
    """``grid`` (a Flower ``Grid``) whose calls raise :class:`Stopped` once ``stop`` is set.

    ``send_and_receive`` is Flower's (push, then pull until every reply arrived or ``timeout``
    passed), with ``stop`` checked between pulls. A grid with a ``pull_interval`` (Flower's
    simulation grid, 0.1 s) is pulled at that interval. Flower's deployment grid has none and
    sleeps 3 s between pulls, which a round's latency pays on every cohort; here the wait starts
    at :data:`FIRST_PULL_WAIT` and doubles while nothing arrives, up to :data:`MAX_PULL_WAIT`
    (a pull request a second at most from the one ServerApp).
    """
    from flwr.serverapp import Grid

    interval = getattr(grid, "pull_interval", None)
    first, most = (FIRST_PULL_WAIT, MAX_PULL_WAIT) if interval is None else (interval, interval)

    class StoppableGrid(Grid):
        def _check(self) -> None:
            if stop.is_set():
                raise Stopped("the run was interrupted")

        def set_run(self, run: Any) -> None:
            grid.set_run(run)

        @property
        def run(self) -> Any:
            return grid.run

        def create_message(self, *args: Any, **kwargs: Any) -> Any:
            return grid.create_message(*args, **kwargs)

        def get_node_ids(self) -> Iterable[int]:
            self._check()
            return grid.get_node_ids()

        def get_nodes(self) -> Iterable[Any]:
            self._check()
            return grid.get_nodes()

        def push_messages(self, messages: Iterable[Any]) -> Iterable[str]:
            self._check()
            return grid.push_messages(messages)

        def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Any]:
            self._check()
            return grid.pull_messages(message_ids)

        def send_and_receive(
            self, messages: Iterable[Any], *, timeout: float | None = None
        ) -> Iterable[Any]:
            pending = set(self.push_messages(messages))
            end = None if timeout is None else time.monotonic() + timeout
            replies: list[Any] = []
            wait = first
            while end is None or time.monotonic() < end:
                got = list(self.pull_messages(pending))
                replies.extend(got)
                pending.difference_update(m.metadata.reply_to_message_id for m in got)
                if not pending:
                    break
                wait = first if got else min(2 * wait, most)
                stop.wait(wait)
            return replies

    return StoppableGrid()
