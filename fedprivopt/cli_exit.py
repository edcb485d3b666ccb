"""The ``fedprivopt`` program's end: a signal after the command finished, and the exit itself.

Twenty-eighth review of issue 15: a Ctrl-C that arrived right after a command printed its result
(``fedprivopt epsilon …`` at a terminal, 0.01-0.2 s after the line) killed the process by
SIGINT with no line on stderr (the shell's 130): Python resets the signal handlers after the
``atexit`` callbacks, and tearing down torch's and the accountants' modules takes that long. In
the window before, the same Ctrl-C ended the process silently with rc 0.

Now a command's process ends after the ``atexit`` callbacks without Python's module teardown,
whether it finished or was interrupted (:func:`end_program`; an interrupted one already did,
:func:`~fedprivopt.simulation.interrupt.end_interrupted`), and an ending signal received after
the command finished (:func:`after_finish`) ends it at once with the usual one line of an
interrupted command, saying that its output is complete, and exit code ``128 + signal`` (130
for Ctrl-C): a shell script interrupted there stops as it would had the signal come earlier.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

__all__ = ["after_finish", "end_program", "exit_code", "finished_line"]

_ENDED: dict[str, int] = {}
"""``code``: the exit code of the command that finished, once it has (see :func:`after_finish`)."""


def finished_line(command: str | None) -> str:
    """The one line of a command interrupted after it had finished."""
    name = f"fedprivopt {command}" if command else "fedprivopt"
    return f"{name}: interrupted as it exited, after it had finished (its output is complete)"


def exit_code(exc: SystemExit) -> int | None:
    """The exit code of argparse's ``SystemExit`` (``--help``, a usage error), else ``None``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int) and not isinstance(exc.code, bool):
        return exc.code
    return None


def after_finish(command: str | None, code: int) -> None:
    """The command ended with ``code``: an ending signal from now on prints one line and exits.

    The exit code is then ``128 + signal``. A command that was interrupted (``code`` 128 or
    more) has printed its own line: a signal then ends it at once with ``code``, silently, as
    :func:`~fedprivopt.simulation.interrupt.finished` arranges. Only in the main thread.
    """
    _ENDED["code"] = int(code)
    if code >= 128 or threading.current_thread() is not threading.main_thread():
        return
    line = (finished_line(command) + "\n").encode("utf-8", "backslashreplace")

    def handler(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            os.write(2, line)
        os._exit(128 + signum)

    from fedprivopt.simulation.interrupt import ENDING_SIGNALS

    for sig in ENDING_SIGNALS:
        if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
            continue  # nohup: kept ignored, as while the command ran (interrupt.py)
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, handler)


def end_program() -> None:
    """An ``atexit`` callback, run last: the process ends now with the command's exit code.

    An interrupted command ends as :func:`~fedprivopt.simulation.interrupt.end_interrupted`
    ends it; one that finished ends the same way, after its standard streams are flushed
    (module docstring). A process whose command raised (a bug's traceback) exits as Python
    does.
    """
    from fedprivopt.simulation.interrupt import end_interrupted

    end_interrupted()
    code = _ENDED.get("code")
    if code is None:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
