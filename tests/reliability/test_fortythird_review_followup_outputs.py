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
   ``locks.os``'s view of ``/proc`` and refusing its ``kill``.) And where the listed PID is
   another user's (hidden, or its ``fdinfo`` unreadable: a dead locker's PID reused, the case
   of processes 1) while a process of this user's holds the lock (the locker's child), that
   process is named, no longer the listed one: the processes that can be asked are asked first.
3. A process refused at a limit on processes (``ulimit -u``, a pids limit: EAGAIN) where the
   forty-third review's processes 2 and lead 1 fixes (``core.orphans.fork_refused``) did not
   look: ``data synth --out D --clients 3000 --workers 2`` (its workers forked by
   ``multiprocessing``: ``os.fork`` in ``popen_fork``'s ``_launch``), and ``deploy local`` on
   Python 3.13 or later, whose ``subprocess`` starts most children (the ``flwr`` calls) with
   ``os.posix_spawn`` in ``Popen._posix_spawn``, its EAGAIN naming the program. Before: rc 1
   and a ``BlockingIOError: [Errno 11] Resource temporarily unavailable`` traceback (26 lines
   for data synth, measured; ``fork_refused`` knew only ``_execute_child`` and an error naming
   no file). Now rc 1 and the one line ``... a process could not be started (Resource
   temporarily unavailable): this user's (or the container's) limit on processes ...``
   (``orphans._STARTS``). (In-process: ``os.fork`` made a C call that raises EAGAIN, as the
   kernel's refusal does; ``_execute_child`` made to call a ``_posix_spawn`` that raises what
   ``os.posix_spawn`` raises; no process starts.)
4. A URL made a ``pathlib`` path in the Python API: ``data.generate(Path("s3://bucket/d"),
   config)``, ``simulate(config, Path("gs://bucket/run"))``, ``resume(Path("file:///tmp/x"))``
   (``Path`` writes ``s3:/bucket/d``, one slash; the text is refused since the forty-third
   review's input 5 and lead 2). Before: the dataset written into ``./s3:/bucket/d`` (four
   files, measured), the run into ``./gs:/bucket/run``. Now ``ValueError: out_dir
   's3:/bucket/d' is a URL (s3://), not a path: ...`` before anything is written
   (``core.files.url_refusal``: a path whose first part is a scheme and its colon, of two
   letters at least, with no such directory here); a directory really named ``s3:`` is taken.
5. ``data synth --out D --clients 50`` (also ``--out D/deploy``) while ``deploy local --out D``
   runs, before its ServerApp claims ``D`` (the processes reviewer's open row, its first half).
   Before: rc 0, the dataset written into ``D``; the deployment then failed after 63 s, rc 1,
   with the ServerApp's 31-line traceback (``out directory D is not empty``). Now rc 2, one
   line: ``argument --out: D holds deploy/deploy.lock (a deployment into it runs): it is a
   fedprivopt run, ...`` (``synthetic_files.run_files_around``, ``_deploying``: the log
   directory's ``flock`` probed, as ``deploy local`` probes it); once the deployment ended its
   leftover ``deploy/`` no longer refuses. (In-process: the test holds ``D/deploy``.)
"""

from __future__ import annotations

import errno
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedprivopt.data import lock_holders
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
        monkeypatch.setattr(lock_holders, "os", _HidePid(holder.pid))
        with pytest.raises(LockHeldError) as info:
            with exclusive_lock(lock, what="dataset directory D"):
                pass  # pragma: no cover - refused
        assert info.value.pid == holder.pid, str(info.value)
        assert f"in use by process {holder.pid} " in str(info.value)
    finally:
        holder.kill()
        holder.wait()


def test_2_a_holder_here_is_named_before_a_listed_process_that_cannot_be_asked(
    tmp_path, monkeypatch
):
    import fcntl

    lock = tmp_path / DATA_LOCK
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # /proc/locks lists this process
    child = subprocess.Popen(["sleep", "60"], pass_fds=(fd,))
    try:
        os.close(fd)  # the child holds it; this process, listed, is made another user's
        monkeypatch.setattr(lock_holders, "os", _HidePid(os.getpid()))
        with pytest.raises(LockHeldError) as info:
            with exclusive_lock(lock, what="dataset directory D"):
                pass  # pragma: no cover - refused
        assert info.value.pid == child.pid, str(info.value)
    finally:
        child.kill()
        child.wait()


def _one_failed_line(err: str) -> str:
    assert "Traceback" not in err and "BlockingIOError" not in err, err
    failed = [line for line in err.splitlines() if "error" in line or "failed" in line]
    assert len(failed) == 1, err
    assert "a process could not be started" in failed[0] and "limit on processes" in failed[0]
    return failed[0]


def test_3_data_synth_whose_workers_cannot_be_forked_says_so_in_one_line(
    tmp_path, monkeypatch, capsys
):
    from fedprivopt.cli import main

    r, w = os.pipe()
    try:
        os.set_blocking(r, False)
        # a C call raising EAGAIN without a file, as os.fork at a pids limit
        monkeypatch.setattr(os, "fork", functools.partial(os.read, r, 1))
        out = tmp_path / "D"
        code = main(["data", "synth", "--out", str(out), "--clients", "3000", "--workers", "2"])
    finally:
        os.close(r)
        os.close(w)
    err = capsys.readouterr().err
    assert code == 1, err
    assert _one_failed_line(err).startswith("fedprivopt data synth: error: ")


def test_3_deploy_local_refused_a_posix_spawn_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    import tempfile

    from fedprivopt.cli import main

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    for name, value in (("FLWR_TELEMETRY_ENABLED", "0"), ("FLWR_DISABLE_UPDATE_CHECK", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))

    def _posix_spawn(self, args, executable, *rest, **kwargs):  # os.posix_spawn's refusal
        raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN), executable)

    def _execute_child(self, args, executable, *rest, **kwargs):  # as Python >= 3.13 does
        self._posix_spawn(args, executable or args[0])

    monkeypatch.setattr(subprocess.Popen, "_posix_spawn", _posix_spawn)
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _execute_child)
    out = tmp_path / "D"
    code = main(["deploy", "local", TOY, "--nodes", "1", "--rounds", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert _one_failed_line(err).startswith("fedprivopt deploy local: failed: ")
    assert not list(temp.glob("fedprivopt-deploy-*"))  # its key material gone


@pytest.mark.parametrize("url", ["s3://bucket/d", "gs://bucket/run", "file:///tmp/x"])
def test_4_a_url_made_a_pathlib_path_is_refused(tmp_path, monkeypatch, url):
    from fedprivopt.data import SyntheticConfig, generate
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import resume, simulate

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^out_dir '.*' is a URL \(\w+://\), not a path"):
        generate(Path(url), SyntheticConfig(num_clients=5))
    config = load_config(TOY, {"num-server-rounds": 1})
    with pytest.raises(ValueError, match=r"^out_dir '.*' is a URL \("):
        simulate(config, Path(url))
    with pytest.raises(ValueError, match=r"^out_dir '.*' is a URL \("):
        resume(Path(url))
    assert not any(tmp_path.iterdir())  # nothing written where the URL would have pointed


def test_4_a_directory_named_like_a_scheme_is_still_a_path(tmp_path, monkeypatch):
    from fedprivopt.core.files import url_refusal

    monkeypatch.chdir(tmp_path)
    assert url_refusal("out_dir", Path("C:/x")) is None  # a drive letter is no scheme
    (tmp_path / "s3:").mkdir()
    assert url_refusal("out_dir", Path("s3://bucket/d")) is None  # ./s3: exists: a directory


def test_5_data_synth_into_a_running_deployments_directory_is_refused(tmp_path, capsys):
    from fedprivopt.cli import main
    from fedprivopt.data.synthetic_files import run_files_note

    out = tmp_path / "D"
    log_dir = out / "deploy"
    log_dir.mkdir(parents=True)
    with lock_directory(log_dir, "deploy.lock", what="--out D"):
        for where in (out, log_dir):
            code = main(["data", "synth", "--out", str(where), "--clients", "50"])
            err = capsys.readouterr().err
            assert code == 2, err
            assert len(err.strip().splitlines()) == 1, err
            # D/deploy: refused by the --out check as inside the deployment's directory D
            # (follow-up of the forty-fifth review, outputs 1; deliberate)
            said = "deploy/deploy.lock (a deployment into it runs)"
            assert (said if where == out else "is inside the deployment's directory") in err, err
    assert sorted(p.name for p in out.iterdir()) == ["deploy"]  # nothing written
    assert run_files_note(out) is None  # its leftover log directory, held no more
