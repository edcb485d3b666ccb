"""A watchdog that cleans up after a process however it ends, SIGKILL included; process helpers.

A killed process (SIGKILL) runs no cleanup. :class:`Watchdog` does it from outside: a small
process in its own session that waits on a pipe only its parent writes to. When the parent is
gone, however it ended, the pipe closes and the watchdog stops, each by PID and start time (a
recycled PID is never signalled):

- the parent's descendants started after the watchdog (recorded while the parent ran, so those
  orphaned by its death are still known; ``tree=True``);
- every process whose environment carries the parent's tag (``NAME=value``, :func:`stop_marked`);

and removes the directories it was given. This module is also the watchdog's program
(``python -I -S watchdog.py --watchdog``), so it imports only the standard library. The
process helpers read ``/proc`` (Linux); elsewhere they find nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "Watchdog",
    "descendants",
    "has_marker",
    "marked_processes",
    "pid_alive",
    "proc_stat",
    "same_process",
    "start_time",
    "stop_marked",
    "stop_processes",
]

_PROC = Path("/proc")


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, starttime)`` of ``pid`` from ``/proc``, or None."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    rest = text[text.rfind(")") + 2 :].split()
    try:
        return rest[0], int(rest[1]), int(rest[19])
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a zombie has exited; it awaits reaping)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = proc_stat(pid)
    return stat is None or stat[0] != "Z"


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` (clock ticks after boot, from ``/proc``), or None."""
    stat = proc_stat(pid)
    return None if stat is None else stat[2]


def same_process(pid: int, started: int | None) -> bool:
    """Whether ``pid`` is alive and is the process that started at ``started`` (not a reuse)."""
    stat = proc_stat(pid)
    if stat is None:
        return started is None and pid_alive(pid)
    return stat[0] != "Z" and (started is None or stat[2] == started)


def _all_stats() -> dict[int, tuple[str, int, int]]:
    stats = {}
    if _PROC.is_dir():
        for entry in _PROC.iterdir():
            if entry.name.isdigit():
                stat = proc_stat(int(entry.name))
                if stat is not None:
                    stats[int(entry.name)] = stat
    return stats


def descendants(pid: int, *, since: int | None = None) -> dict[int, int]:
    """Live descendants of ``pid`` (by parent id, from ``/proc``): ``{pid: start time}``.

    With ``since`` (a start time, in clock ticks), only processes started later, and only below
    such processes: an older child's subtree (a Ray session that existed before) is left out.
    """
    stats = _all_stats()
    children: dict[int, list[int]] = {}
    for child, (_, ppid, _) in stats.items():
        children.setdefault(ppid, []).append(child)
    found: dict[int, int] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        state, _, started = stats[child]
        if child in found or (since is not None and started <= since):
            continue
        if state != "Z":
            found[child] = started
        todo.extend(children.get(child, []))
    return found


def marked_processes(marker: str) -> dict[int, int]:
    """Live processes whose environment holds ``marker`` (``NAME=value``): ``{pid: start}``.

    The environment is the one a process was started with (``/proc/<pid>/environ``), so a
    process that set the variable later is not included, nor one that overwrote that memory
    (``setproctitle`` may: Ray's agents); this process never is.
    """
    tag = marker.encode()
    return {
        pid: stat[2]
        for pid, stat in _all_stats().items()
        if pid != os.getpid() and stat[0] != "Z" and has_marker(pid, tag)
    }


def stop_processes(processes: Mapping[int, int | None], *, grace: float = 3.0) -> list[int]:
    """Stop ``{pid: start time}`` by PID: SIGTERM, up to ``grace`` seconds, then SIGKILL.

    A PID whose start time differs (a recycled PID) is never signalled. Returns the PIDs still
    running after the SIGKILL (normally none).
    """
    left = {p: s for p, s in processes.items() if same_process(p, s)}
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if not left:
            break
        for pid, started in left.items():
            if same_process(pid, started):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = {p: s for p, s in left.items() if same_process(p, s)}
    return sorted(left)


def stop_marked(marker: str, *, grace: float = 3.0, passes: int = 3) -> list[int]:
    """Stop every process carrying ``marker`` (:func:`stop_processes`).

    The scan is repeated (``passes`` times at most) in case a dying process started another.
    Returns the PIDs still running at the end (normally none).
    """
    left: list[int] = []
    for _ in range(passes):
        found = marked_processes(marker)
        if not found:
            break
        left = stop_processes(found, grace=grace)
    return left


def has_marker(pid: int, marker: bytes) -> bool:
    """Whether ``marker`` (``NAME=value``) is in the environment ``pid`` was started with."""
    try:
        return marker in (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


# -- the watchdog ----------------------------------------------------------------------------------


class Watchdog:
    """Stops this process's children and removes directories once it is gone, SIGKILL included.

    Parameters
    ----------
    marker : str, optional
        ``NAME=value``: every process whose environment holds it is stopped (:func:`stop_marked`).
        The watchdog itself does not carry it.
    paths : sequence of Path
        Directories removed.
    tree : bool
        Also stop this process's descendants started after the watchdog (at least one clock
        tick, 10 ms, later), recorded every ``interval`` seconds while this process runs so that
        those orphaned by its death are still known by PID and start time.
    interval : float
        Seconds between two records of the descendants.

    Notes
    -----
    The watchdog runs in its own session (a signal to this process group does not reach it),
    ignores SIGINT, SIGHUP and SIGTERM (``pkill -f fedprivopt`` names it too) and reads a pipe
    whose write end only this process holds (file descriptors are not inherited across
    ``exec``). End of file on that pipe means this process has ended or called
    :meth:`close`; the watchdog then stops what it watches (SIGTERM, 3 s, SIGKILL, each by PID)
    and removes ``paths``. A child forked without ``exec`` keeps the pipe open, and so delays the
    cleanup until it exits too. Processes are found in ``/proc`` (Linux); elsewhere only
    ``paths`` are removed.
    """

    def __init__(
        self,
        *,
        marker: str | None = None,
        paths: Sequence[str | Path] = (),
        tree: bool = False,
        interval: float = 0.5,
    ) -> None:
        env = dict(os.environ)
        if marker is not None:
            name, _, value = marker.partition("=")
            if env.get(name) == value:
                del env[name]
        self._popen: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, "-I", "-S", str(Path(__file__).resolve()), "--watchdog"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd="/",
            start_new_session=True,
        )
        self.since = start_time(self._popen.pid)
        """Start time of the watchdog: processes started since are this run's."""
        order = {
            "parent": os.getpid(),
            "parent_start": start_time(os.getpid()),
            "since": self.since if tree else None,
            "interval": float(interval),
            "marker": marker,
            "paths": [str(Path(p).resolve()) for p in paths],
        }
        self._popen.stdin.write(json.dumps(order).encode() + b"\n")  # type: ignore[union-attr]
        self._popen.stdin.flush()  # type: ignore[union-attr]

    @property
    def pid(self) -> int | None:
        """PID of the watchdog process (None once closed)."""
        return None if self._popen is None else self._popen.pid

    def close(self, timeout: float = 30.0) -> None:
        """Clean up now (as if this process had ended) and wait until the watchdog is done."""
        popen, self._popen = self._popen, None
        if popen is None:
            return
        with contextlib.suppress(OSError):
            popen.stdin.close()  # type: ignore[union-attr]
        try:
            popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _watchdog_main() -> int:  # pragma: no cover - runs as its own process
    """The watchdog's program.

    Record the parent's new descendants until end of file on stdin, then stop them and the
    tagged processes, and remove the paths.
    """
    import select

    # SIGTERM too (thirty-eighth review of issue 15, signals 3): ``pkill -f fedprivopt`` matches
    # this program's command line; it died at once while its parent stopped, and what the
    # parent's own stop left (Ray's agents and workers, 60 s) had no one to stop it. It ends
    # anyway once its parent is gone; SIGKILL still ends it at once
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    fd = sys.stdin.fileno()
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            return 2
        data += chunk
    order = json.loads(data)
    parent, since = int(order["parent"]), order.get("since")
    seen: dict[int, int] = {}

    def record() -> None:
        if since is not None and same_process(parent, order.get("parent_start")):
            seen.update(descendants(parent, since=int(since)))
            seen.pop(os.getpid(), None)

    while True:
        record()
        ready, _, _ = select.select([fd], [], [], order["interval"] if since is not None else None)
        if ready and not os.read(fd, 4096):
            break  # end of file: the parent has ended, or closed the pipe
    record()  # the parent closed the pipe and still runs: its latest children too
    if seen:
        stop_processes(seen)
    if order.get("marker"):
        stop_marked(order["marker"])
    for path in order.get("paths", []):
        shutil.rmtree(path, ignore_errors=True)
    return 0


if __name__ == "__main__" and sys.argv[1:] == ["--watchdog"]:  # pragma: no cover
    sys.exit(_watchdog_main())
