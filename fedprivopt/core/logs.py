"""The command line's logging: warnings to standard error, once, whatever a library does.

absl's logging functions (dp-accounting's notes on RDP orders it drops) call
``logging.basicConfig()`` when the root logger has no handler. From the first such note on,
that handler printed every Flower record a second time (``INFO:flwr:round 1: …`` under Flower's
own line), Flower's shutdown ``DEBUG`` lines at the end of a run, and this package's warnings in
another format than before the note. :func:`log_warnings_to_stderr` gives the root logger the
handler Python would use anyway (warnings and errors, the message alone, to the current standard
error), so absl finds one and configures nothing.

:func:`hide_engine_notices` drops three notices addressed to whoever wrote the Flower engine,
not to its user, who can act on none: Flower's deprecation of ``run_simulation`` (the
engine's call), Ray's tip about ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO`` (the engine asks
for no GPU on purpose), and each actor's "Manually terminating ClientAppActor" at the end of a
run (the engine ends them). Each printed on every Flower run, ``--quiet`` ones too.
"""

from __future__ import annotations

import logging
import sys
import warnings

__all__ = ["hide_engine_notices", "log_warnings_to_stderr", "quiet_flower"]

#: The first argument of the Flower record :func:`hide_engine_notices` drops.
RUN_SIMULATION_DEPRECATED = "The `run_simulation` function is deprecated"
#: The record each of the Flower engine's Ray actors logs when Flower ends it at the end of a run
#: (``VirtualClientEngineActor.terminate``); Ray forwarded it to the command's stderr as
#: ``(ClientAppActor pid=N) WARNING : Manually terminating ClientAppActor``, on ``--quiet`` runs
#: too. The actors load the client app, whose :func:`~fedprivopt.clients.client_app.
#: make_client_app` calls :func:`hide_engine_notices`.
ACTOR_EXIT = "Manually terminating %s"
#: The start of the Ray ``FutureWarning`` :func:`hide_engine_notices` ignores.
RAY_ACCELERATOR_TIP = "Tip: In future versions of Ray, Ray will no longer override accelerator"


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


class _EngineNotices(logging.Filter):
    """Drop the engine's notices: ``run_simulation`` deprecated, and :data:`ACTOR_EXIT`.

    Flower logs the first for the engine's own call; each simulated client's Ray actor logs the
    second when the engine ends it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == ACTOR_EXIT:
            return False
        first = record.args[0] if isinstance(record.args, tuple) and record.args else None
        return not (isinstance(first, str) and first.startswith(RUN_SIMULATION_DEPRECATED))


def hide_engine_notices() -> None:
    """Drop the two notices the Flower engine's own calls cause (module docstring).

    The ``flwr`` logger gets the filter once, before or after Flower is imported (a logger is
    the same object either way); other Flower warnings and errors still print.
    """
    flower = logging.getLogger("flwr")
    if not any(isinstance(f, _EngineNotices) for f in flower.filters):
        flower.addFilter(_EngineNotices())
    warnings.filterwarnings("ignore", message=RAY_ACCELERATOR_TIP, category=FutureWarning)


def log_warnings_to_stderr() -> None:
    """Install :class:`_Stderr` on the root logger unless a handler is there already.

    Also :func:`hide_engine_notices`: every command and worker process calls this first.
    """
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(_Stderr())
    hide_engine_notices()


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
