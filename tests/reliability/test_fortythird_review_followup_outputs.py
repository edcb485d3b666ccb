"""Issue 15, follow-up of the forty-third hostile review (outputs: today's fixes of signals,
locks, processes, deployment and of the data readers): tests.

1. A run written inside a running deployment's log directory: ``deploy local --out D`` holds
   ``D/deploy`` (``rundir.lock_directory`` with ``deploy.lock`` there) from its start, some 30 s
   before its ServerApp claims ``D``; meanwhile ``simulate toy.toml --rounds 1 --out D/deploy/x``
   (also ``compare``, ``tune``, ``deploy local`` and the Python API's ``simulate``: one check).
   Before: rc 0, a whole run among the deployment's logs (the processes reviewer's open row):
   ``run_places.refuse_inside_held`` looked only for a held ``run.lock``. Now rc 2, one line:
   ``argument --out: D/deploy/x is inside the deployment's log directory D/deploy, which
   process N holds: ...`` (the PID read from ``deploy.lock``). (In-process: the test holds
   ``D/deploy`` as the deployment does; nothing is started.)
2. ``data synth --out D`` beside another user's running ``data synth --out D`` (a group's
   shared data directory) on a machine whose ``/proc`` is mounted ``hidepid=2`` (``invisible``:
   another user's ``/proc/<pid>`` does not exist, as shared login nodes mount it). Before (since
   the forty-third review's processes 1): ``dataset directory D is in use by another process
   (PID unknown)``: ``locks._holds`` took the listed holder, whose ``/proc/<pid>/fdinfo`` is
   missing, for gone, where ``/proc/locks`` names it (and the PID was named before that fix).
   Now ``in use by process N``: a listed process that exists (``kill`` refused: another user's)
   is not asked further, as one whose ``fdinfo`` cannot be read (``locks._another_users``).
   (The holder is a process of this user's; ``hidepid=2`` is stood in for by hiding it in
   ``locks.os``'s view of ``/proc`` and refusing its ``kill``.)
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from fedprivopt.data import locks
from fedprivopt.data.locks import DATA_LOCK, LockHeldError, exclusive_lock
from fedprivopt.simulation.rundir import lock_directory

TOY = os.path.join(os.path.dirname(__file__), "..", "..", "simulations", "toy.toml")


def test_1_a_run_inside_a_running_deployments_log_directory_is_refused(tmp_path, capsys):
    from fedprivopt.cli import main

    log_dir = tmp_path / "D" / "deploy"
    log_dir.mkdir(parents=True)
    out = log_dir / "x"
    with lock_directory(log_dir, "deploy.lock", what="--out D"):
        code = main(["simulate", TOY, "--rounds", "1", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "inside the deployment's log directory" in err and f"process {os.getpid()} " in err
    assert not out.exists()


class _HidePid:
    """``os`` as seen under ``hidepid=2`` where process ``hidden`` is another user's."""

    def __init__(self, hidden: int) -> None:
        self.hidden = hidden

    def __getattr__(self, name):
        return getattr(os, name)

    def listdir(self, path="."):
        if str(path).startswith(f"/proc/{self.hidden}/"):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        names = os.listdir(path)
        return [n for n in names if n != str(self.hidden)] if str(path) == "/proc" else names

    def kill(self, pid, sig):
        if pid == self.hidden:
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))
        return os.kill(pid, sig)


def test_2_another_users_holder_hidden_by_hidepid_is_named(tmp_path, monkeypatch):
    lock = tmp_path / DATA_LOCK
    code = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o644)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, str(os.getpid()).encode())\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", code], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(locks, "os", _HidePid(holder.pid))
        with pytest.raises(LockHeldError) as info:
            with exclusive_lock(lock, what="dataset directory D"):
                pass  # pragma: no cover - refused
        assert info.value.pid == holder.pid, str(info.value)
        assert f"in use by process {holder.pid} " in str(info.value)
    finally:
        holder.kill()
        holder.wait()
