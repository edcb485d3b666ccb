"""Issue 15, fortieth hostile review (processes: locks, signals, deployment): tests.

1. A dataset directory copied with ``cp -al dA dB`` (as snapshot backups make), whose
   ``.stackoverflow.lock`` then shares one inode with ``dA``'s, while a process holds ``dA``'s
   lock (``data synth --out dA``, or a task generating there). Before: ``data synth --out dB
   --overwrite`` was refused, ``dataset directory dB is in use by process N`` (N the process
   working on ``dA``), and a task on ``dB`` waited for it (a ``flock`` is its inode's). Now a
   lock file hard-linked from another directory is detached from its name under an exclusive
   ``flock`` on its directory, which every holder of a lock file there shares while it holds
   it (``data.locks._DirectoryShare``, in ``exclusive_lock`` and ``file_lock``): ``dB`` gets a
   lock of its own, ``dA``'s file is untouched, and a second claim of ``dB`` (or of a directory
   whose held lock file was linked elsewhere) is refused as before.
2. ``deploy local`` picks its SuperLink's port with ``session.free_ports`` (bound, then closed)
   and the SuperLink binds it seconds later; a process listening there first (127.0.0.1, in the
   test this process's own socket). Before: ``session.wait_port`` returned on the first
   accepted connection, taking that process for the SuperLink (the SuperNodes and ``flwr run``
   would have gone to it). Now the listening sockets on the port (``/proc/self/net/tcp``,
   ``tcp6``) must be held by a process of the deployment (``/proc/<pid>/fd``):
   ``session.check_listener`` raises ``RuntimeError`` ("another process listens on
   127.0.0.1:P, the port chosen for this deployment's SuperLink ..."), also for a SuperNode's
   ClientApp port once the nodes are online (``session._check_node_ports``, in ``wait_nodes``;
   ``deploy.listeners.foreign_listeners``); without
   ``/proc`` the connection is taken as before. No Flower process is started: the SuperLink is
   a ``sleep`` that listens nowhere, stopped by its PID.
3. ``cp -al OUT OUT2`` while ``deploy local --out OUT`` runs (``OUT2/deploy/deploy.lock`` then
   OUT's inode), then ``deploy local --out OUT2`` (or ``deploy_local(out=OUT2)``). Before:
   ``local_checks.check_not_deploying`` probed the lock file's ``flock`` and refused OUT2 as
   "in use by process N, a deployment into it", N the deployment into OUT, which the user was
   told to stop. Now it probes the ``flock`` the deployment holds on ``OUT/deploy`` itself
   (``rundir.lock_directory``), which a copy does not share, and no link to another OUT's
   ``deploy`` (``ln -s``) is followed to its holder; OUT is refused naming the PID.
4. An ``--out`` whose ``deploy/`` holds an earlier (failed) deployment's logs and
   ``processes.json``, copied with ``cp -al OUT OUT2`` (a snapshot backup), then ``deploy local
   --out OUT`` (or into OUT2). Before: each process's log was opened by name for appending and
   ``processes.json`` written in place, so the new deployment's lines and records went into
   the copy's files too (its ``processes.json`` replaced). Now a hard-linked log is replaced by
   a copy of itself before it is appended to (``processes._open_own``) and the record is a new
   file (``ProcessSet.write_records``): the copy is untouched. The process is ``echo``.
5. A user's file hard-linked in place of a dataset's lock file (``ln notes.txt
   D/.stackoverflow.lock``; or ``cp -al dA dB`` with no holder), then ``data synth --out D``
   (also ``token_cache.remove_stores``, the same ``exclusive_lock``). Before: the file was
   locked, emptied and given the PID, then emptied again: ``notes.txt`` lost (0 bytes), and
   ``dB``'s claim wrote into ``dA``'s lock file. Now a lock file with other names is detached
   under its directory's exclusive lock (``_DirectoryShare.detach``, also when this process
   holds it) and never written (``exclusive_lock``: ``own``).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from fedprivopt.data.locks import DATA_LOCK, LockHeldError, exclusive_lock, file_lock


def _linked_copy(tmp_path: Path) -> tuple[Path, Path]:
    """``dA`` with its lock file, and ``dB`` holding a hard link of it (``cp -al dA dB``)."""
    a, b = tmp_path / "dA", tmp_path / "dB"
    a.mkdir()
    b.mkdir()
    (a / DATA_LOCK).write_text("")
    os.link(a / DATA_LOCK, b / DATA_LOCK)
    return a, b


def test_hard_linked_data_lock_is_not_another_directorys(tmp_path):
    """Finding 1: ``dB``'s claim is not refused because ``dA``'s holder holds the inode."""
    a, b = _linked_copy(tmp_path)
    with exclusive_lock(a / DATA_LOCK, what=f"dataset directory {a}"):
        with exclusive_lock(b / DATA_LOCK, what=f"dataset directory {b}"):
            assert (b / DATA_LOCK).stat().st_ino != (a / DATA_LOCK).stat().st_ino
            assert (a / DATA_LOCK).read_text() == f"{os.getpid()}\n"  # dA's: its holder's
            with pytest.raises(LockHeldError, match="dB is in use by process"):
                with exclusive_lock(b / DATA_LOCK, what=f"dataset directory {b}"):
                    pass  # pragma: no cover
        with pytest.raises(LockHeldError, match="dA is in use by process"):
            with exclusive_lock(a / DATA_LOCK, what=f"dataset directory {a}"):
                pass  # pragma: no cover


def test_held_lock_linked_elsewhere_still_refuses_its_own_directory(tmp_path):
    """Finding 1: a held lock file hard-linked into another directory while held (``cp -al dB
    dC``) is never detached from the holder's own directory (the holder shares that directory's
    lock); ``dC`` gets its own."""
    b, c = tmp_path / "dB", tmp_path / "dC"
    b.mkdir()
    c.mkdir()
    with exclusive_lock(b / DATA_LOCK, what=f"dataset directory {b}"):
        os.link(b / DATA_LOCK, c / DATA_LOCK)
        with pytest.raises(LockHeldError, match="dB is in use by process"):
            with exclusive_lock(b / DATA_LOCK, what=f"dataset directory {b}"):
                pass  # pragma: no cover
        assert (b / DATA_LOCK).stat().st_nlink == 2  # nothing detached
        with exclusive_lock(c / DATA_LOCK, what=f"dataset directory {c}"):
            assert (b / DATA_LOCK).stat().st_nlink == 1
        assert (b / DATA_LOCK).read_text() == f"{os.getpid()}\n"  # still the holder's


def test_task_waiting_on_hard_linked_data_lock_takes_its_own(tmp_path):
    """Finding 1: ``file_lock`` (a task generating its files) on ``dB`` does not wait for the
    process holding ``dA``'s lock."""
    a, b = _linked_copy(tmp_path)
    entered = threading.Event()

    def task() -> None:
        with file_lock(b / DATA_LOCK):
            entered.set()

    with exclusive_lock(a / DATA_LOCK, what=f"dataset directory {a}"):
        thread = threading.Thread(target=task, daemon=True)
        thread.start()
        got = entered.wait(10)
    thread.join(10)  # released above: a waiting task gets in now
    assert got, "the task on dB waited for the holder of dA's lock"
    assert (a / DATA_LOCK).stat().st_nlink == 1 and (b / DATA_LOCK).stat().st_nlink == 1


def _listener() -> socket.socket:
    """A listening socket on a free port of 127.0.0.1."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_wait_port_refuses_a_listener_not_of_the_deployment(tmp_path):
    """Finding 2: another process's listener on the SuperLink's port is not the SuperLink."""
    from fedprivopt.deploy.session import Deployment, wait_port

    dep = Deployment(tmp_path / "work", tmp_path / "logs", None)
    foreign = _listener()
    port = foreign.getsockname()[1]
    try:
        dep.procs.start("superlink", ["sleep", "30"], "superlink")  # listens nowhere
        with pytest.raises(RuntimeError, match=f"another process listens on 127.0.0.1:{port}, "):
            wait_port(dep, port, time.monotonic() + 5.0)
    finally:
        foreign.close()
        dep.procs.stop(grace=2.0)  # the sleep, by its PID
    assert dep.procs.dead() and not any(t.popen.poll() is None for t in dep.procs.started)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_supernode_port_held_by_another_process_is_refused(tmp_path):
    """Finding 2: the same for a SuperNode's own port (its ClientApps connect there), checked
    once the nodes are online; the port is read from its command line."""
    from fedprivopt.deploy.processes import _Tracked
    from fedprivopt.deploy.session import Deployment, _check_node_ports

    dep = Deployment(tmp_path / "work", tmp_path / "logs", None)
    foreign = _listener()
    port = foreign.getsockname()[1]
    try:
        cmd = f"flower-supernode --superlink 127.0.0.1:1 --host 127.0.0.1 --port {port}"
        dep.procs.started.append(_Tracked("supernode", 2**22 + 1, None, cmd))  # no such PID
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{port}, the port chosen for Super"):
            _check_node_ports(dep)
    finally:
        dep.procs.started.clear()
        foreign.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_wait_port_takes_the_deployments_own_listener(tmp_path):
    """Finding 2: a listener a process of the deployment holds is taken (here this process,
    recorded as one the deployment found)."""
    from fedprivopt.deploy.processes import _Tracked
    from fedprivopt.deploy.session import Deployment, check_listener, wait_port

    dep = Deployment(tmp_path / "work", tmp_path / "logs", None)
    own = _listener()
    port = own.getsockname()[1]
    try:
        dep.procs.found[os.getpid()] = _Tracked("other", os.getpid(), None, "this test")
        wait_port(dep, port, time.monotonic() + 5.0)
        check_listener(dep, port, "SuperNode 0's ClientApp API")
    finally:
        dep.procs.found.clear()  # never stopped: it is this process
        own.close()


def test_copy_of_a_deploying_out_is_not_in_use(tmp_path):
    """Finding 3: ``cp -al OUT OUT2`` while a deployment into OUT runs: OUT2's ``deploy.lock``
    is OUT's inode, but OUT2 is not being deployed into; OUT still is."""
    import subprocess

    from fedprivopt.deploy.local_checks import DEPLOY_LOCK, LOG_DIR, check_not_deploying
    from fedprivopt.simulation.rundir import lock_directory

    out, copy = tmp_path / "OUT", tmp_path / "OUT2"
    (out / LOG_DIR).mkdir(parents=True)
    with lock_directory(out / LOG_DIR, DEPLOY_LOCK, what=f"--out {out}"):  # as deploy_local
        subprocess.run(["cp", "-al", str(out), str(copy)], check=True)
        assert (copy / LOG_DIR / DEPLOY_LOCK).stat().st_nlink == 2
        check_not_deploying(copy)  # before: "is in use by process <this one>"
        linked = tmp_path / "OUT3"
        linked.mkdir()
        (linked / LOG_DIR).symlink_to(out / LOG_DIR)  # refused by the claim, not as in use
        check_not_deploying(linked)
        with pytest.raises(ValueError, match=f"is in use by process {os.getpid()}, a deploy"):
            check_not_deploying(out)
    check_not_deploying(out)


def test_hard_linked_deploy_logs_of_a_copy_are_not_written(tmp_path):
    """Finding 4: the logs and ``processes.json`` of ``cp -al OUT OUT2`` stay OUT2's."""
    import subprocess

    from fedprivopt.deploy.processes import ProcessSet

    logs, copy = tmp_path / "OUT" / "deploy", tmp_path / "OUT2"
    logs.mkdir(parents=True)
    (logs / "superlink.log").write_text("earlier deployment\n")
    (logs / "processes.json").write_text('[{"role": "superlink", "pid": 1, "started_by": "x"}]')
    subprocess.run(["cp", "-al", str(logs.parent), str(copy)], check=True)
    before = {p.name: p.read_bytes() for p in (copy / "deploy").iterdir()}
    procs = ProcessSet({"PATH": os.environ.get("PATH", "")}, logs)
    try:
        procs.start("superlink", ["echo", "new deployment"], "superlink").wait(30)
    finally:
        procs.stop(grace=2.0)
    assert {p.name: p.read_bytes() for p in (copy / "deploy").iterdir()} == before
    assert (logs / "superlink.log").read_text() == "earlier deployment\nnew deployment\n"
    procs.write_records(logs / "processes.json")
    assert {p.name: p.read_bytes() for p in (copy / "deploy").iterdir()} == before
    assert '"started_by": "fedprivopt"' in (logs / "processes.json").read_text()


def test_user_file_linked_as_lock_file_is_not_emptied(tmp_path):
    """Finding 5: ``exclusive_lock`` neither empties nor writes a file with other names."""
    d = tmp_path / "D"
    d.mkdir()
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    os.link(notes, d / DATA_LOCK)
    with exclusive_lock(d / DATA_LOCK, what=f"dataset directory {d}"):
        assert notes.read_text() == "my notes\n"
        assert (d / DATA_LOCK).read_text() == f"{os.getpid()}\n"  # a lock file of its own
    assert notes.read_text() == "my notes\n" and notes.stat().st_nlink == 1
    a, b = _linked_copy(tmp_path)
    with exclusive_lock(b / DATA_LOCK, what=f"dataset directory {b}"):
        assert (a / DATA_LOCK).read_text() == ""  # dA's file is not given dB's PID
