"""SIGKILL of ``fedprivopt deploy local``: no key material and no process is left behind.

Issue 15, point 7: a killed deployment left its ``fedprivopt-deploy-*`` directory (the CA, the
SuperLink's key, the SuperNodes' keys) in the temporary directory. Now its watchdog removes it
within a second or two; if the watchdog is killed as well, the next deployment removes it.

Each deployment runs with a private ``TMPDIR``, which every process it starts inherits, so the
test finds them all in ``/proc`` and kills what is left by PID, also when it fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedprivopt.deploy.local import REPO_ROOT
from tests.procs import alive, cmdline, default_sigint, kill_all, proc_stat

BIN = Path(sys.executable).parent
pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc"),
    pytest.mark.skipif(
        not (BIN / "flower-superlink").exists() or not (BIN / "flower-supernode").exists(),
        reason="Flower's deployment commands are not installed next to this interpreter",
    ),
]


def tagged(name: str, value: str) -> dict[int, str]:
    """Live processes started with ``name=value`` in their environment: ``{pid: start time}``."""
    tag = f"{name}={value}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        stat = proc_stat(int(entry.name))
        if tag in environ and stat is not None and stat[0] != "Z":
            found[int(entry.name)] = stat[19]
    return found


def wait_until(predicate, timeout: float, what) -> float:
    """Seconds until ``predicate()`` holds; fails after ``timeout`` (``what()`` says why)."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"after {timeout:g} s: {what()}")
        time.sleep(0.05)
    return time.monotonic() - started


class Deployment:
    """``fedprivopt deploy local`` (TLS, node keys, one node) with a private TMPDIR."""

    def __init__(self, tmp_path: Path, name: str) -> None:
        self.tmpdir = tmp_path / "tmp"
        self.tmpdir.mkdir(exist_ok=True)
        self.err = tmp_path / f"{name}.err"
        env = {
            **os.environ,
            "TMPDIR": str(self.tmpdir),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "OMP_NUM_THREADS": "1",
        }
        args = [sys.executable, "-m", "fedprivopt.cli", "deploy", "local", "--nodes", "1"]
        self.out = tmp_path / name
        args += ["--out", str(self.out), "--rounds", "200", "--timeout", "300"]
        settings = {"population": 6, "task-params.num-users": 6, "clients-per-round": 3}
        for key, value in settings.items():
            args += ["--set", f"{key}={value}"]
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
                cwd=REPO_ROOT,
                start_new_session=True,
                preexec_fn=default_sigint,
            )
        self.seen: dict[int, str] = {}

    def workdirs(self) -> list[Path]:
        return sorted(self.tmpdir.glob("fedprivopt-deploy-*"))

    def processes(self) -> dict[int, str]:
        """Every live process of the deployment (all inherit its TMPDIR), recorded."""
        found = tagged("TMPDIR", str(self.tmpdir))
        self.seen.update(found)
        return found

    def wait_for_nodes(self, timeout: float = 180, earlier: Path | None = None) -> Path:
        """Wait until the SuperNode runs with its key; returns the (new) working directory."""

        def mine() -> list[Path]:
            # the public key: the private one leaves the disk once the node is online
            keyed = [d for d in self.workdirs() if (d / "node-keys" / "node-0.pub").exists()]
            return [d for d in keyed if d != earlier]

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}: {self.err.read_text()}")
            self.processes()
            return bool(mine()) and "started 1 SuperNodes" in self.err.read_text()

        wait_until(ready, timeout, lambda: self.err.read_text()[-2000:])
        return mine()[0]

    def left(self) -> str:
        """What is still running, with the end of the SuperLink's log (for a failure message)."""
        running = [cmdline(p) for p in alive(self.seen)]
        log = self.out / "deploy" / "superlink.log"
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else "(no SuperLink log)"
        return f"processes left: {running}\nend of {log.name}:\n{tail}"

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.processes()
        kill_all(self.seen)


def test_sigkill_of_deploy_local_leaves_no_keys_and_no_process(tmp_path):
    dep = Deployment(tmp_path, "killed")
    try:
        workdir = dep.wait_for_nodes()
        assert (workdir / "tls" / "ca.pem").exists()  # server.key goes once the node is online
        assert any("flower-supernode" in cmdline(p) for p in dep.processes())
        dep.proc.kill()  # SIGKILL: no handler runs in the parent
        dep.proc.wait(timeout=30)
        seconds = wait_until(
            lambda: not workdir.exists(), 15, lambda: f"{workdir} is still there (keys left)"
        )
        wait_until(
            lambda: not alive(dep.seen),
            15,
            lambda: f"processes left: {[cmdline(p) for p in alive(dep.seen)]}",
        )
    finally:
        dep.cleanup()
    assert seconds < 15
    assert dep.workdirs() == []


def test_the_next_deployment_removes_what_a_killed_one_left(tmp_path):
    """Parent and watchdog both SIGKILLed: the kernel takes the SuperLink and SuperNodes along at
    once; Flower's own children (SuperExecs, the ServerApp) follow through their ``--parent-pid``
    monitors in seconds, and the next deployment stops, by PID, whatever is still running and
    removes the directory with the keys.

    Before: the SuperLink got SIGTERM from the kernel, and uvicorn's graceful shutdown, which
    waits without a limit for open HTTP requests, kept it and its SuperExec running past 20 s
    on a loaded 2-core machine (CI); nothing stopped them.
    """
    first = Deployment(tmp_path, "first")
    try:
        old = first.wait_for_nodes()
        running = first.processes()
        direct = [p for p in running if int((proc_stat(p) or ["", "0"])[1]) == first.proc.pid]
        assert any("flower-superlink" in cmdline(p) for p in direct), [cmdline(p) for p in direct]
        # kill the watchdog first (if there is one), then the deployment: none of our code runs
        watchdogs = [p for p in running if "--watchdog" in cmdline(p)]
        for pid in watchdogs:
            os.kill(pid, signal.SIGKILL)
        first.proc.kill()
        first.proc.wait(timeout=30)
        mine = {p: running[p] for p in direct if p not in watchdogs}
        wait_until(lambda: not alive(mine), 5, first.left)  # PR_SET_PDEATHSIG: SIGKILL
        assert old.exists() and (old / "tls" / "ca.pem").exists()  # left behind

        second = Deployment(tmp_path, "second")
        try:
            second.wait_for_nodes(earlier=old)
            assert not old.exists(), "the stale working directory (with its keys) is still there"
            assert not alive(first.seen), first.left()
            second.proc.send_signal(signal.SIGINT)
            code = second.proc.wait(timeout=60)
            wait_until(
                lambda: not alive(second.seen),
                15,
                lambda: f"processes left: {[cmdline(p) for p in alive(second.seen)]}",
            )
        finally:
            second.cleanup()
    finally:
        first.cleanup()
    assert code == 130, second.err.read_text()[-2000:]
    assert second.workdirs() == []


# -- the watchdog and the stale-directory sweep, without Flower ------------------------------------

_ORPHAN = (
    "import subprocess, sys\n"
    "quiet = {'stdout': subprocess.DEVNULL, 'stderr': subprocess.DEVNULL}\n"
    "p = subprocess.Popen(['sleep', '120'], start_new_session=True, **quiet)\n"
    "print(p.pid)\n"
)
_PARENT = """
import os, subprocess, sys, time
from fedprivopt.simulation.watchdog import Watchdog

def spawn():
    return subprocess.Popen(["sleep", "120"], start_new_session=True, stdout=subprocess.DEVNULL).pid

def orphan(env):  # started by a child that exits: no longer our descendant
    out = subprocess.run([sys.executable, "-c", ORPHAN], env=env, capture_output=True, text=True)
    return int(out.stdout)

before = spawn()  # older than the watchdog: not ours to stop
time.sleep(0.05)  # start times count clock ticks (10 ms)
dog = Watchdog(marker="FEDPRIVOPT_TEST_TAG=on", paths=[sys.argv[1]], tree=True)
time.sleep(0.05)
child = spawn()
tagged = orphan({**os.environ, "FEDPRIVOPT_TEST_TAG": "on"})
time.sleep(1.0)  # the watchdog records the new child (every 0.5 s)
print(dog.pid, before, child, tagged, flush=True)
if sys.argv[2] == "close":
    dog.close()
    print("closed", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("end", ["sigkill", "close"])
def test_the_watchdog_stops_new_children_and_tagged_processes_and_removes_paths(tmp_path, end):
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "node.key").write_text("secret")
    script = f"ORPHAN = {_ORPHAN!r}\n{_PARENT}"
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(keys), end],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        start_new_session=True,
    )
    pids: dict[int, str] = {}
    try:
        line = proc.stdout.readline()
        dog, before, child, tagged_pid = (int(x) for x in line.split())
        for pid in (dog, before, child, tagged_pid):
            stat = proc_stat(pid)
            if stat is not None:
                pids[pid] = stat[19]
        if end == "sigkill":
            proc.kill()
        else:
            assert proc.stdout.readline().strip() == "closed"
        wait_until(
            lambda: not keys.exists() and not alive({p: pids[p] for p in (dog, child, tagged_pid)}),
            15,
            lambda: f"left: {keys.exists()=}, {describe_pids(alive(pids))}",
        )
        # a child older than the watchdog, and not tagged, is left alone
        assert set(alive(pids)) == {before}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        kill_all(pids)


def describe_pids(processes: dict[int, str]) -> list[str]:
    return [f"{pid}: {cmdline(pid)}" for pid in processes]


def test_stale_working_directories_are_removed_only_when_their_owner_is_gone(tmp_path):
    from fedprivopt.deploy.workdir import _pid_namespace, remove_stale_workdirs
    from fedprivopt.simulation.watchdog import start_time

    def workdir(name: str, owner: dict | None) -> Path:
        path = tmp_path / f"fedprivopt-deploy-{name}"
        path.mkdir()
        (path / "server.key").write_text("secret")
        if owner is not None:
            (path / "owner.json").write_text(json.dumps(owner))
        return path

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    namespace = _pid_namespace()
    me = {"pid": os.getpid(), "start": start_time(os.getpid()), "pidns": namespace}
    dead = workdir("dead", {"pid": int(done.stdout), "start": 1, "pidns": namespace})
    recycled = workdir("recycled", {**me, "start": me["start"] - 1})  # our PID, another start
    live = workdir("live", me)
    other_ns = workdir("other-namespace", {**me, "pid": int(done.stdout), "pidns": "pid:[1]"})
    unknown = workdir("no-owner", None)
    (tmp_path / "fedprivopt-deploy-link").symlink_to(dead)
    (tmp_path / "fedprivopt-deploy-file").write_text("not a directory")

    assert remove_stale_workdirs(tmp_path) == [dead, recycled]
    assert not dead.exists() and not recycled.exists()
    assert live.exists() and other_ns.exists() and unknown.exists()
    assert (tmp_path / "fedprivopt-deploy-link").is_symlink()


def test_the_sweep_stops_what_still_runs_in_a_stale_working_directory(tmp_path):
    """A stale directory's processes (its ``FLWR_HOME`` in their environment) are stopped by PID,
    also one that ignores SIGTERM (as uvicorn's graceful shutdown may, waiting on open requests);
    a live deployment's processes are left alone. Before, only the directory was removed."""
    from fedprivopt.deploy.workdir import FLWR_HOME_NAME, _pid_namespace, remove_stale_workdirs
    from fedprivopt.simulation.watchdog import start_time

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    namespace = _pid_namespace()
    owners = {
        "dead": {"pid": int(done.stdout), "start": 1, "pidns": namespace},
        "live": {"pid": os.getpid(), "start": start_time(os.getpid()), "pidns": namespace},
    }
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ignored', flush=True); time.sleep(120)"
    )
    procs, pids = {}, {}
    try:
        for name, owner in owners.items():
            path = tmp_path / f"fedprivopt-deploy-{name}"
            (path / FLWR_HOME_NAME).mkdir(parents=True)
            (path / "owner.json").write_text(json.dumps(owner))
            env = {**os.environ, "FLWR_HOME": str(path / FLWR_HOME_NAME)}
            procs[name] = subprocess.Popen(
                [sys.executable, "-c", stubborn], env=env, stdout=subprocess.PIPE, text=True
            )
            pids[procs[name].pid] = proc_stat(procs[name].pid)[19]
        for proc in procs.values():  # SIGTERM is ignored from here on (no fixed sleep)
            assert proc.stdout.readline() == "ignored\n"
        assert remove_stale_workdirs(tmp_path) == [tmp_path / "fedprivopt-deploy-dead"]
        assert procs["dead"].wait(timeout=10) == -signal.SIGKILL
        assert procs["live"].poll() is None
        assert (tmp_path / "fedprivopt-deploy-live").exists()
    finally:
        kill_all(pids)
        for proc in procs.values():
            proc.wait(timeout=30)


def test_a_started_process_dies_with_its_killed_parent_even_if_it_ignores_sigterm(tmp_path):
    """``ProcessSet.start`` asks the kernel for SIGKILL when the parent dies (``PR_SET_PDEATHSIG``).
    Before it asked for SIGTERM, which a process in a graceful shutdown (uvicorn waiting on open
    requests) may sit on indefinitely."""
    ready = tmp_path / "ignored"
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(ready)!r}, 'w').close(); time.sleep(120)"
    )
    parent = (
        "import os, sys, time\n"
        "from fedprivopt.deploy.processes import ProcessSet\n"
        f"procs = ProcessSet({{}}, {str(tmp_path)!r})\n"
        f"child = procs.start('stubborn', [sys.executable, '-c', {stubborn!r}], 'stubborn')\n"
        f"while not os.path.exists({str(ready)!r}):\n"  # SIGTERM is ignored from here on
        "    time.sleep(0.01)\n"
        "print(child.pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)  # fmt: skip
    pids: dict[int, str] = {}
    try:
        child = int(proc.stdout.readline())
        pids[child] = proc_stat(child)[19]
        proc.kill()
        proc.wait(timeout=30)
        wait_until(lambda: not alive(pids), 5, lambda: f"left: {describe_pids(alive(pids))}")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        kill_all(pids)
