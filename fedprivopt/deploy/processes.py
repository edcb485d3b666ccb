"""Start and stop the processes of a local deployment, by PID, also on errors and Ctrl-C.

Flower's processes start their own children: the SuperLink starts a SuperExec (in a new
session) that starts the ServerApp; every SuperNode starts a SuperExec that starts one ClientApp
process per message. :class:`ProcessSet` therefore

- starts each process in its own session (so a terminal's Ctrl-C reaches only us, and we stop
  them in order), with its output in a log file and, on Linux, ``PR_SET_PDEATHSIG`` so that a
  killed parent takes its direct children along. The signal is SIGKILL: with SIGTERM the
  SuperLink (uvicorn) began a graceful shutdown that waits, without a limit, for open HTTP
  requests to close, and a deployment whose parent and watchdog were both killed left its
  SuperLink and SuperExec running for over 20 s on a loaded 2-core machine (CI). With no parent
  left there is nothing a graceful shutdown could hand over; Flower's own children follow
  through their ``--parent-pid`` monitors;
- tags every process with a per-deployment environment variable, which Flower's children
  inherit, and on Linux finds them in ``/proc`` (descendants by parent id and by tag), recording
  ``(pid, start time)`` so a recycled PID is never signalled;
- stops everything it started or found: SIGTERM to each process group, a grace period, SIGTERM
  to what is left, then SIGKILL, and waits until every recorded PID is gone.

A killed parent (SIGKILL) runs none of this: :class:`~fedprivopt.simulation.watchdog.Watchdog` then
stops the processes of the deployment (by its tag and as the parent's descendants).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from fedprivopt.core.orphans import die_with_parent
from fedprivopt.simulation.watchdog import has_marker as _has_marker
from fedprivopt.simulation.watchdog import pid_alive
from fedprivopt.simulation.watchdog import proc_stat as _proc_stat

__all__ = ["MARKER_ENV", "ProcessSet", "pid_alive"]

MARKER_ENV = "FEDPRIVOPT_DEPLOY_ID"
_PROC = Path("/proc")


def _cmdline(pid: int) -> str:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)


@dataclass
class _Tracked:
    role: str
    pid: int
    starttime: int | None
    cmd: str
    popen: subprocess.Popen | None = None
    log: IO[bytes] | None = field(default=None, repr=False)
    log_name: str = ""


class ProcessSet:
    """The processes of one deployment.

    Parameters
    ----------
    env : Mapping[str, str]
        Environment of every process (the deployment tag is added).
    log_dir : Path
        Where each process's output goes (``<name>.log``).
    """

    def __init__(self, env: Mapping[str, str], log_dir: Path) -> None:
        self.token = uuid.uuid4().hex
        self.env = {**env, MARKER_ENV: self.token}
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.started: list[_Tracked] = []
        self.found: dict[int, _Tracked] = {}
        self._stopped = False

    @property
    def marker(self) -> str:
        """``NAME=value``: the tag in the environment of every process of this deployment."""
        return f"{MARKER_ENV}={self.token}"

    # -- starting --------------------------------------------------------------------------------

    def start(self, role: str, argv: Sequence[str], log_name: str) -> subprocess.Popen:
        """Start ``argv`` in its own session with output to ``<log_dir>/<log_name>.log``."""
        if self._stopped:
            raise RuntimeError("this ProcessSet has been stopped")
        log = _open_own(self.log_dir / f"{log_name}.log")
        try:
            popen = subprocess.Popen(
                list(argv),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=(
                    functools.partial(die_with_parent, os.getpid())
                    if sys.platform.startswith("linux")
                    else None
                ),
            )
        except BaseException:
            log.close()
            raise
        stat = _proc_stat(popen.pid)
        self.started.append(
            _Tracked(
                role, popen.pid, stat[2] if stat else None, " ".join(argv), popen, log, log_name
            )
        )
        return popen

    def log_path(self, log_name: str) -> Path:
        """Path of a process's log file."""
        return self.log_dir / f"{log_name}.log"

    def dead(self, roles: Sequence[str] | None = None) -> list[tuple[str, int | None, Path]]:
        """``(role, returncode, log path)`` of started processes (of ``roles``) that exited."""
        return [
            (t.role, t.popen.poll(), self.log_path(t.log_name))
            for t in self.started
            if t.popen is not None
            and (roles is None or t.role in roles)
            and t.popen.poll() is not None
        ]

    # -- finding children ------------------------------------------------------------------------

    def scan(self) -> None:
        """Record every live process of this deployment (descendants and tagged processes)."""
        if not _PROC.is_dir():
            return
        marker = f"{MARKER_ENV}={self.token}".encode()
        parents: dict[int, int] = {}
        stats: dict[int, tuple[str, int, int]] = {}
        for entry in _PROC.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            stat = _proc_stat(pid)
            if stat is None:
                continue
            stats[pid] = stat
            parents[pid] = stat[1]
        ours = {t.pid for t in self.started}
        known = ours | set(self.found)
        changed = True
        while changed:  # descendants of what we started or found
            changed = False
            for pid, ppid in parents.items():
                if ppid in known and pid not in known:
                    known.add(pid)
                    changed = True
        for pid in stats:
            if pid not in known and pid != os.getpid() and _has_marker(pid, marker):
                known.add(pid)
        for pid in known - ours:
            if pid in self.found or pid not in stats or stats[pid][0] == "Z":
                continue
            self.found[pid] = _Tracked(_role_of(_cmdline(pid)), pid, stats[pid][2], _cmdline(pid))

    def write_records(self, path: Path) -> None:
        """Write :meth:`records` as JSON into ``path``, a new file (see :func:`_open_own`)."""
        text = json.dumps(self.records(), indent=2).encode()
        path = Path(path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a hard link's other names keep their record
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | _NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(text)

    def records(self) -> list[dict[str, object]]:
        """Every process started or found: role, pid and command line."""
        return [
            {"role": t.role, "pid": t.pid, "started_by": "fedprivopt", "cmd": t.cmd}
            for t in self.started
        ] + [
            {"role": t.role, "pid": t.pid, "started_by": "flower", "cmd": t.cmd}
            for t in self.found.values()
        ]

    # -- stopping --------------------------------------------------------------------------------

    def _same(self, t: _Tracked) -> bool:
        """Whether ``t.pid`` still is the process we recorded (not a recycled PID)."""
        if t.popen is not None:
            return t.popen.poll() is None
        stat = _proc_stat(t.pid)
        if stat is None:
            return pid_alive(t.pid) and t.starttime is None
        return stat[0] != "Z" and (t.starttime is None or stat[2] == t.starttime)

    def _signal(self, t: _Tracked, sig: int, *, group: bool) -> None:
        if not self._same(t):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group and t.popen is not None:
                os.killpg(t.pid, sig)  # its session's group: the process and its children
            else:
                os.kill(t.pid, sig)

    def _wait(self, tracked: Sequence[_Tracked], deadline: float) -> list[_Tracked]:
        left = list(tracked)
        while left and time.monotonic() < deadline:
            left = [t for t in left if self._same(t)]
            if left:
                time.sleep(0.1)
        return [t for t in left if self._same(t)]

    def stop(self, *, order: Sequence[str] = (), grace: float = 10.0) -> None:
        """Stop every process (roles in ``order`` first), then wait until all are gone.

        ``order`` may name roles of processes Flower started (found by :meth:`scan`, e.g.
        ``flwr-serverapp``): they are stopped in their turn too, each by its PID. Thirty-first
        review of issue 15: the ServerApp, in a session of its own under the SuperLink's
        SuperExec, was stopped last and released rounds while the SuperNodes shut down.
        """
        if self._stopped:
            return
        self._stopped = True
        try:
            self.scan()
            found = list(self.found.values())
            roles = [r for r in order if any(t.role == r for t in [*self.started, *found])]
            roles += sorted({t.role for t in self.started} - set(roles))
            deadline = time.monotonic() + grace
            for role in roles:  # a role's processes together, roles in order
                batch = [t for t in self.started if t.role == role]
                for t in batch:
                    self._signal(t, signal.SIGTERM, group=True)
                theirs = [t for t in found if t.role == role] if role in order else []
                for t in theirs:
                    self._signal(t, signal.SIGTERM, group=False)
                self._wait(batch + theirs, min(deadline, time.monotonic() + grace / 2))
            self.scan()
            everything = [*self.started, *self.found.values()]
            # Flower's children exit on their own once their parent is gone (they poll for it)
            left = self._wait(everything, min(deadline, time.monotonic() + 3.0))
            for t in left:
                self._signal(t, signal.SIGTERM, group=False)
            left = self._wait(left, time.monotonic() + 3.0)
            for t in left:
                self._signal(t, signal.SIGKILL, group=t.popen is not None)
                self._signal(t, signal.SIGKILL, group=False)
            self._wait(left, time.monotonic() + 5.0)
            for t in self.started:
                if t.popen is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        t.popen.wait(timeout=5.0)
            # found processes are reaped by their parent or by init; wait until they are gone
            gone_by = time.monotonic() + 5.0
            while time.monotonic() < gone_by and any(self._matches(t) for t in self.found.values()):
                time.sleep(0.1)
        finally:
            for t in self.started:
                if t.log is not None:
                    t.log.close()

    @staticmethod
    def _matches(t: _Tracked) -> bool:
        stat = _proc_stat(t.pid)
        return stat is not None and (t.starttime is None or stat[2] == t.starttime)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _open_own(path: Path) -> IO[bytes]:
    """Open log ``path`` for appending, as a file of this directory's own.

    Fortieth review of issue 15 (processes 4): an ``--out`` whose ``deploy/`` holds an earlier
    deployment's logs, copied with ``cp -al OUT OUT2`` (as snapshot backups make): the next
    deployment into either appended its logs to the shared files and wrote its
    ``processes.json`` into the other's too (each opened by name, in place). A log with other
    hard links is replaced by a copy of itself first (the caller holds ``deploy.lock``, so the
    name is its own to replace); a symbolic link is refused (``O_NOFOLLOW``: ``ELOOP``).
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | _NOFOLLOW
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        with open(os.open(path, os.O_RDONLY | os.O_CLOEXEC | _NOFOLLOW), "rb") as old:
            path.unlink()
            fd = os.open(path, flags | os.O_EXCL, 0o644)
            try:
                with os.fdopen(os.dup(fd), "wb") as new:
                    shutil.copyfileobj(old, new)
            except BaseException:
                os.close(fd)
                raise
        return os.fdopen(fd, "ab")
    return os.fdopen(os.open(path, flags, 0o644), "ab")


def _role_of(cmd: str) -> str:
    for name in ("flwr-serverapp", "flwr-clientapp", "flower-superexec", "flwr"):
        if name in cmd:
            return name
    return "other"
