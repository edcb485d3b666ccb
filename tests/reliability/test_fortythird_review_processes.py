"""Issue 15, forty-third hostile review (processes: signals, locks and processes): tests.

1. A lock held on by a child forked while it was held, its locker gone or no longer holding it:
   ``data synth --out D`` (``exclusive_lock`` of ``D/.stackoverflow.lock``) SIGKILLed after
   forking a child that lives on (any fork without ``PR_SET_PDEATHSIG``: a user's trainer or
   data loader of its own), then ``data synth --out D --clients 50``; likewise a run
   directory's ``run.lock`` (``probe_lock``, by which ``simulate --resume`` and every ``--out``
   check name the holder) and ``deploy.lock``. Before: ``dataset directory D is in use by
   process 404`` (measured; 404 the dead locker, 405 the holder): ``/proc/locks`` keeps the
   PID of the process that took the ``flock``, which ``locks.named_holder`` trusted; after PID
   reuse that PID is an unrelated process the user is told to stop. Now a listed PID is named
   only if it still holds the file locked (``/proc/<pid>/fdinfo`` shows the lock through a
   descriptor of the file), else the process that does (``locks._living_holder``): ``in use
   by process 405``. (In-process: the test's own lock handed to a ``sleep`` by ``pass_fds``,
   its own descriptor closed: the listed PID alive and not holding; and a locker that exits.)
2. ``deploy local toy.toml --nodes 1 --rounds 1 --out D`` under a limit on processes (``ulimit
   -u``, a container's or systemd's pids limit: ``fork`` refused with EAGAIN) at the start of
   the watchdog, the SuperLink or ``flwr supernode register`` (the 1st-3rd process started).
   Before: rc 1 and a 20-line ``BlockingIOError: [Errno 11] Resource temporarily unavailable``
   traceback (nothing left running, the work directory removed). Now rc 1 and one line,
   ``fedprivopt deploy local: failed: a process could not be started (Resource temporarily
   unavailable): this user's (or the container's) limit on processes and threads is reached
   (ulimit -u, a pids limit); ...`` (``core.orphans.fork_refused``: EAGAIN raised where
   ``subprocess`` starts the child). (In-process: ``subprocess.Popen._execute_child``, where
   the real ``fork_exec`` raises it, made to raise it; no process starts.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from fedprivopt.data.locks import DATA_LOCK, LockHeldError, exclusive_lock, probe_lock


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_1_a_lock_handed_to_a_child_names_the_child(tmp_path):
    import fcntl

    lock = tmp_path / DATA_LOCK
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # as exclusive_lock writes its PID
    child = subprocess.Popen(["sleep", "60"], pass_fds=(fd,))
    try:
        os.close(fd)  # this process (listed by /proc/locks) no longer holds it: the child does
        for claim in (
            lambda: exclusive_lock(lock, what="dataset directory D").__enter__(),
            lambda: probe_lock(lock, what="run directory R"),
        ):
            with pytest.raises(LockHeldError) as info:
                claim()
            assert info.value.pid == child.pid, str(info.value)
            assert f"process {child.pid} " in str(info.value)
    finally:
        _stop(child)


def test_1_a_lock_kept_by_the_child_of_a_dead_locker_names_the_child(tmp_path):
    lock = tmp_path / DATA_LOCK
    code = (
        "import fcntl, os, subprocess, sys\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o644)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, str(os.getpid()).encode())\n"
        "p = subprocess.Popen(['sleep', '60'], pass_fds=(fd,), stdout=subprocess.DEVNULL,\n"
        "                     stderr=subprocess.DEVNULL)\n"
        "print(os.getpid(), p.pid, flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True
    )
    locker, holder = (int(x) for x in out.stdout.split())
    try:
        with pytest.raises(LockHeldError) as info:
            with exclusive_lock(lock, what="dataset directory D"):
                pass  # pragma: no cover - refused
        assert info.value.pid == holder and f"process {locker} " not in str(info.value)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder, signal.SIGKILL)


def test_2_deploy_local_refused_a_process_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    import errno
    import tempfile

    from fedprivopt.cli import main

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    for name, value in (("FLWR_TELEMETRY_ENABLED", "0"), ("FLWR_DISABLE_UPDATE_CHECK", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))

    def _execute_child(self, *args, **kwargs):  # fork_exec refused at a pids limit
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", _execute_child)
    out = tmp_path / "D"
    toy = os.path.join(os.path.dirname(__file__), "..", "..", "simulations", "toy.toml")
    code = main(["deploy", "local", toy, "--nodes", "1", "--rounds", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err and "BlockingIOError" not in err, err
    failed = [line for line in err.splitlines() if "error" in line or "failed" in line]
    assert len(failed) == 1 and "a process could not be started" in failed[0], err
    assert "limit on processes" in failed[0]
    assert not list(temp.glob("fedprivopt-deploy-*"))  # its key material gone
