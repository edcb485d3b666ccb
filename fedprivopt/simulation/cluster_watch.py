"""Watching a joined Ray cluster's head for the whole run.

Ray ends a driver whose head (its GCS) stopped answering: after
``gcs_rpc_server_reconnect_timeout_s`` (60 s) its C++ core logs "Failed to connect to GCS within
60 seconds ... The program will terminate." and exits the process with rc 1. The rounds go on
meanwhile (the shards answer the driver directly), so a run whose head was killed went on for a
minute, then ended with that line and rc 1 (thirty-third review of issue 15, left open; the
run's ledger and checkpoint were kept).

:class:`HeadWatch` checks every :data:`HEAD_CHECK_INTERVAL` seconds that the head's port accepts
a connection. A head that comes back within :data:`HEAD_GRACE` seconds (Ray's GCS fault
tolerance restarts it) changes nothing; otherwise the run ends before Ray ends it, as a kill
would (the ledger, the last checkpoint and the run's lock are safe against a kill), with one
line that says what happened and how to go on, and exit code 2.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable

__all__ = ["HEAD_CHECK_INTERVAL", "HEAD_GRACE", "HeadWatch", "end_run"]

HEAD_CHECK_INTERVAL = 2.0
"""Seconds between two checks that the head accepts a connection (also each check's timeout)."""

HEAD_GRACE = 40.0
"""Seconds a head may stay unreachable before the run ends: Ray's GCS fault tolerance restarts a
head within them; Ray's own limit (``gcs_rpc_server_reconnect_timeout_s``, 60 s, counted from
when the driver noticed) is not reached."""


def end_run(line: str) -> None:
    """End the process at once with ``line`` on stderr and exit code 2 (as a kill would).

    A progress bar shown meanwhile has its line ended and the cursor shown first
    (:func:`~fedprivopt.core.progress.bars_abandoned`).
    """
    from fedprivopt.core.progress import bars_abandoned

    with contextlib.suppress(OSError):
        os.write(2, bars_abandoned() + (line + "\n").encode("utf-8", "backslashreplace"))
    os._exit(2)


class HeadWatch:
    """A daemon thread that ends the run when the head at ``address`` stays unreachable.

    Parameters
    ----------
    address : str
        ``host:port`` of the head's GCS, as the run joined it.
    key : str
        The key that set the address (named by the line).
    interval, grace : float
        :data:`HEAD_CHECK_INTERVAL` and :data:`HEAD_GRACE` (shorter in tests).
    on_lost : callable, optional
        Called with the line once the head has been unreachable for ``grace`` seconds;
        :func:`end_run` by default.
    """

    def __init__(
        self,
        address: str,
        key: str,
        *,
        interval: float = HEAD_CHECK_INTERVAL,
        grace: float = HEAD_GRACE,
        on_lost: Callable[[str], None] = end_run,
    ) -> None:
        host, _, port = address.rpartition(":")
        self.target = (host.strip("[]"), int(port))
        self.address, self.key = address, key
        self.interval, self.grace = interval, grace
        self.on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fedprivopt-head", daemon=True)

    def line(self) -> str:
        """What the run says when it ends for a lost head.

        Forty-fourth review of issue 15 (processes 1): the line advised ``--resume`` only, also
        where the run was a cell of ``compare`` or a trial of ``tune`` (each run joins the
        cluster and is watched alike), neither of which has that flag: ``compare ... --resume``
        ends in ``unrecognized arguments``. It names how those continue too.
        """
        return (
            f"fedprivopt: error: {self.key}: the Ray cluster's head at {self.address} stopped "
            f"answering during the run (not back within {self.grace:g} s); what the run released "
            "is in its ledger and its last checkpoint is kept: resume the run (--resume) once "
            "the cluster is back (a compare or tune: run the same command again, which resumes "
            "its runs)"
        )

    def _answers(self) -> bool:
        try:
            with socket.create_connection(self.target, timeout=self.interval):
                return True
        except OSError:
            return False

    def _watch(self) -> None:
        lost_since = None
        while not self._stop.wait(self.interval):
            if self._answers():
                lost_since = None
                continue
            now = time.monotonic()
            if lost_since is None:
                lost_since = now
            elif now - lost_since >= self.grace and not self._stop.is_set():
                self.on_lost(self.line())
                return

    def __enter__(self) -> HeadWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
