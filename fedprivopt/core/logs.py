"""The command line's logging: warnings to standard error, once, whatever a library does.

absl's logging functions (dp-accounting's notes on RDP orders it drops) call
``logging.basicConfig()`` when the root logger has no handler. From the first such note on,
that handler printed every Flower record a second time (``INFO:flwr:round 1: …`` under Flower's
own line), Flower's shutdown ``DEBUG`` lines at the end of a run, and this package's warnings in
another format than before the note. :func:`log_warnings_to_stderr` gives the root logger the
handler Python would use anyway (warnings and errors, the message alone, to the current standard
error), so absl finds one and configures nothing.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["log_warnings_to_stderr", "quiet_flower"]


class _Stderr(logging.Handler):
    """Python's last-resort handler: ``WARNING`` and above, the message, to ``sys.stderr``.

    The stream is looked up at each record (a redirected ``sys.stderr`` is followed); Flower's
    records are left to Flower's own handler.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith("flwr") and super().filter(record)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # as logging.StreamHandler: a log line never raises
            self.handleError(record)


def log_warnings_to_stderr() -> None:
    """Install :class:`_Stderr` on the root logger unless a handler is there already."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(_Stderr())


def quiet_flower() -> None:
    """Turn Flower's log records below ``WARNING`` off (a run's progress is this package's).

    Importing Flower's logger module sets the ``flwr`` logger to ``DEBUG``, so it is imported
    first. Thirty-seventh review of issue 15: the level was set before a Flower run imported
    Flower, which undid it: ``simulate --engine flower --quiet`` printed the strategy's summary
    and ``round 1: epsilon=7.551 cohort=9`` for every round, where ``--quiet`` means no
    per-round progress.
    """
    import flwr.common.logger  # noqa: F401  (its import sets the level this overrides)

    logging.getLogger("flwr").setLevel(logging.WARNING)
