"""Linux ``/proc`` helpers for tests that check which processes a run leaves behind.

A process is recorded as ``{pid: start time}`` (field 22 of ``/proc/PID/stat``), so that a PID
reused by another process is never mistaken for the one recorded.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or ``None``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def alive(processes: dict[int, str]) -> dict[int, str]:
    """Those of ``processes`` still running (same PID and start time, not a zombie)."""
    left = {}
    for pid, start in processes.items():
        stat = proc_stat(pid)
        if stat is not None and stat[19] == start and stat[0] != "Z":
            left[pid] = start
    return left


def kill_all(processes: dict[int, str]) -> None:
    """SIGKILL each process of ``processes`` that is still the one recorded."""
    for pid in alive(processes):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cmdline(pid: int) -> str:
    """The command line of ``pid`` (``?`` for one that is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def process_tree(marker: str) -> dict[int, str]:
    """The processes whose command line holds ``marker``, and all their descendants.

    ``{pid: start time}``, for :func:`stop_processes`; e.g. the local SuperLink that ``flwr
    run`` starts detached (its ``--database`` and ``--log-file`` lie in ``FLWR_HOME``) and what
    it started.
    """
    parents: dict[int, int] = {}
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = proc_stat(int(entry.name))
        if stat is None:
            continue
        parents[int(entry.name)] = int(stat[1])
        if marker in cmdline(int(entry.name)):
            found[int(entry.name)] = stat[19]
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                stat = proc_stat(pid)
                if stat is not None:
                    found[pid] = stat[19]
                    grew = True
    return found


def stop_processes(processes: dict[int, str], *, grace: float = 20.0) -> None:
    """SIGTERM each of ``processes`` still running, wait up to ``grace`` seconds, then SIGKILL."""
    for pid in alive(processes):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while alive(processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    kill_all(processes)
