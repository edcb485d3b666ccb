"""Standard output of a command: its failures told apart from those of the files it writes.

Twenty-fifth review of issue 15, finding 16: ``fedprivopt data info D | head -0`` (a pipe whose
reader left: also ``| true``, ``| grep -q``) ended in a ``BrokenPipeError`` traceback with rc 1
after the command's work was done, and ``fedprivopt simulate … > /dev/full`` (a full disk under
the redirected output) reported ``error: argument --out: OUT: [Errno 28] No space left on
device`` for a run that had been written completely: an error without a file name was taken for
one of ``--out``. :func:`guarded_stdout` marks the errors of writing standard output
(:class:`StdoutError`), and :func:`stdout_failed` reports them: a closed pipe ends the command
quietly with 141 (128 + SIGPIPE, as a process killed by the signal), any other failure is one
line naming standard output, rc 2.

Finding 17 of the same review: ``fedprivopt simulate … 2> LOG`` with ``LOG`` on a full disk, or
``2>&1 | head`` once ``head`` has left, stopped the run at its first progress line (rc 1, a
traceback nobody could read, no checkpoint or summary yet) although its files were being
written elsewhere. Progress lines, notes and errors on standard error are diagnostics:
:func:`stderr_failures_dropped` drops a write there that fails, and the command goes on.

Twenty-sixth review, finding 1: a command started with standard output or error closed
(``>&-``, ``2>&-``, as a daemon or a cron line may start it) has ``sys.stdout`` or
``sys.stderr`` ``None``: ``fedprivopt epsilon … >&-`` ended in an ``AttributeError`` traceback
(rc 1) and ``simulate … 2>&-`` stopped at its first progress line (rc 1, no run). The free
descriptor was also the first one the run's files would take, so a child's output (Ray,
Flower, a SuperNode) could land in them. :func:`closed_streams_filled` puts the null device on
a closed descriptor and a stream on a closed standard stream whose writes fail as a closed
descriptor's do (``EBADF``): standard output reports it (rc 2, one line), standard error drops
it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator

__all__ = [
    "EXIT_BROKEN_PIPE",
    "StdoutError",
    "closed_streams_filled",
    "guarded_stdout",
    "stderr_failures_dropped",
    "stdout_failed",
]

#: Exit code of a command whose standard output's reader left: 128 + SIGPIPE (13).
EXIT_BROKEN_PIPE = 141


class StdoutError(Exception):
    """Writing standard output failed; ``error`` is the ``OSError``."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _Guarded:
    """``stream`` whose ``write`` and ``flush`` raise :class:`StdoutError` for an ``OSError``."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            try:
                return self._stream.write(text)
            except UnicodeEncodeError:  # a path or value the output's encoding cannot show
                return self._stream.write(_escaped(text, self._stream))
        except OSError as exc:
            raise StdoutError(exc) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise StdoutError(exc) from exc

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _escaped(text: str, stream) -> str:
    r"""``text`` with what ``stream``'s encoding cannot encode written as ``\xfc``, ``\u4e2d``.

    Twenty-eighth review of issue 15: ``simulate toy.toml --out R_ü`` with an ASCII or Latin-1
    standard output (``PYTHONIOENCODING=ascii``, ``LANG=en_US.ISO-8859-1``, ``LC_ALL=C`` with
    ``PYTHONUTF8=0``) wrote its run completely, then ended rc 2 with ``error: 'ascii' codec
    can't encode character '\xfc' …``, naming nothing, where its result line was due. Standard
    error already escapes such characters (Python's ``backslashreplace``); standard output now
    does too, for the characters it cannot encode only.
    """
    encoding = getattr(stream, "encoding", None) or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding, "replace")


@contextlib.contextmanager
def guarded_stdout() -> Iterator[None]:
    """Within the block, a failure to write ``sys.stdout`` raises :class:`StdoutError`.

    The output is flushed at the end of the block, so that a failure of buffered output is
    raised there too rather than by the interpreter at exit.
    """
    previous = sys.stdout
    guarded = _Guarded(previous)
    sys.stdout = guarded
    try:
        yield
        guarded.flush()
    finally:
        if sys.stdout is guarded:
            sys.stdout = previous


def stdout_failed(command: str, exc: StdoutError) -> int:
    """Report ``exc`` (see the module docstring) and return the exit code.

    Standard output is then pointed at the null device, so that the interpreter's own flush of
    what is still buffered at exit does not fail again.
    """
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    if exc.error.errno == errno.EPIPE:
        return EXIT_BROKEN_PIPE
    reason = exc.error.strerror or str(exc.error)
    name = f"fedprivopt {command}" if command else "fedprivopt"
    print(f"{name}: error: cannot write standard output: {reason}", file=sys.stderr)
    return 2


class _Closed:
    """A standard stream whose descriptor was closed: every non-empty write fails (``EBADF``)."""

    encoding = "utf-8"
    errors = "strict"

    def write(self, text: str) -> int:
        if text:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return 0

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))


@contextlib.contextmanager
def closed_streams_filled() -> Iterator[None]:
    """Within the block, closed standard descriptors and streams are filled (module docstring).

    Descriptors 0, 1 and 2 that are closed get the null device for the whole process (a file
    opened later must not take one); ``sys.stdout`` or ``sys.stderr`` that are ``None`` are a
    :class:`_Closed` stream until the block ends.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    previous = sys.stdout, sys.stderr
    if sys.stdout is None:
        sys.stdout = _Closed()
    if sys.stderr is None:
        sys.stderr = _Closed()
    try:
        yield
    finally:
        sys.stdout = previous[0] if isinstance(sys.stdout, _Closed) else sys.stdout
        sys.stderr = previous[1] if isinstance(sys.stderr, _Closed) else sys.stderr


class _Dropping:
    """``stream`` whose failed writes and flushes are dropped (diagnostics with nowhere to go)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def stderr_failures_dropped() -> Iterator[None]:
    """Within the block, a write to ``sys.stderr`` that fails is dropped (see finding 17)."""
    previous = sys.stderr
    dropping = _Dropping(previous)
    sys.stderr = dropping
    try:
        yield
    finally:
        if sys.stderr is dropping:
            sys.stderr = previous
