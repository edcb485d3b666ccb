"""A signal in the caller while a cohort trains, as Ctrl-C would send one (tests' helper)."""

from __future__ import annotations

import gc
import signal
import time
from collections.abc import Iterator

import pytest


class Alarm(Exception):
    """Raised by the test's SIGALRM handler in the caller's thread."""


def seconds_to_stop(batches: Iterator, after: float = 0.3) -> float:
    """Seconds from a signal ``after`` s into consuming ``batches`` until they are closed.

    The handler raises :class:`Alarm` in the caller (as ``KeyboardInterrupt`` would); the time
    counts the trainer's stopping of its workers (``CohortTrainer.run_chunks``).

    The collector is off while the signal may arrive: a handler that runs inside a collection's
    callback (Hypothesis registers one) has its exception printed and dropped by Python, so the
    loop would never see the signal (CI of stop 42: "DID NOT RAISE Alarm").
    """
    fired: list[float] = []

    def alarm(signum, frame):
        fired.append(time.perf_counter())
        raise Alarm

    previous = signal.signal(signal.SIGALRM, alarm)
    collecting = gc.isenabled()
    gc.disable()
    try:
        signal.setitimer(signal.ITIMER_REAL, after)
        with pytest.raises(Alarm):
            for _ in batches:
                pass
        batches.close()
        return time.perf_counter() - fired[0]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if collecting:
            gc.enable()
