"""Linux ``/proc`` helpers for tests that check which processes a run leaves behind.

A process is recorded as ``{pid: start time}`` (field 22 of ``/proc/PID/stat``), so that a PID
reused by another process is never mistaken for the one recorded.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def default_sigint() -> None:
    """``preexec_fn`` of a child a test will interrupt: SIGINT at its default action.

    A test runner started as a non-interactive shell's background job (``make test &``) inherits
    SIGINT ignored, and Python keeps an ignored SIGINT ignored, so the child never saw the Ctrl-C
    the test sent: three signal tests failed that way in a backgrounded fresh-clone
    ``make test`` (the run finished with 0, or deployments outlived the test's timeout).
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


def flwr_run_env(home: Path, bin_dir: Path) -> tuple[dict[str, str], str]:
    """The environment of a ``flwr run`` on Flower's default local SuperLink, and its marker.

    A private ``FLWR_HOME`` (``home``), free ports for the SuperLink's HTTP and control APIs,
    Flower's default runtime install (offline: ``[tool.uv] exclude-dependencies``), ``bin_dir``
    first on ``PATH`` as an activated environment has it, and a Ray of its own: without it,
    ``ray.init()`` joins a cluster that ``ray start`` left on the machine. The marker is in the
    SuperLink's ``--log-file`` and ``--database``, for :func:`process_tree`.
    """
    from fedprivopt.deploy.session import free_ports

    http_port, control_port = free_ports(2)
    env = dict(os.environ)
    env.pop("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", None)  # Flower's default: install
    env.update(
        FLWR_HOME=str(home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
        FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        OMP_NUM_THREADS="1",
        RAY_ADDRESS="local",
    )
    return env, str(home / "local-superlink")


# what the commands import (fedprivopt.cli imports them lazily): each child finds them loaded
PRELOADED = ["torch", "numpy", "scipy", "dp_accounting", "fedprivopt.cli", "fedprivopt.privacy",
             "fedprivopt.models", "fedprivopt.data", "fedprivopt.simulation.run",
             "fedprivopt.deploy.cli", "tests.procs"]  # fmt: skip


def _program_in_fork(
    argv: list[str], env: dict[str, str], cwd: str, out: str, err: str, address_space: int | None
) -> None:
    """In the forked child: the ``fedprivopt`` program (:func:`fedprivopt.cli.console`, what
    ``python -m fedprivopt.cli`` runs) on ``argv``, with ``env``, from ``cwd``, its standard
    output and error (the file descriptors, not only Python's streams) in the files ``out`` and
    ``err``; its address space limited to ``address_space`` bytes (``RLIMIT_AS``) if given."""
    import sys
    import warnings

    if address_space is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(file, fd)
        os.close(file)
    if env.get("PYTHONWARNINGS") == "ignore":
        warnings.simplefilter("ignore")
    sys.argv = ["fedprivopt", *argv]
    from fedprivopt.cli import console

    console()


def run_program_forked(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    timeout: float,
    address_space: int | None = None,
) -> tuple[int | None, str, str]:
    """``fedprivopt ARGV`` in a child process forked from a server that has imported the program
    and what it imports (multiprocessing's forkserver, :data:`PRELOADED`): a process of its own,
    as ``python -m fedprivopt.cli`` starts, without an interpreter's start-up and imports
    (seconds each). For commands whose message and exit code are the point, not their threads
    (torch is loaded before the program's settings for it). Exit code (``None``: still running
    after ``timeout`` s, then killed by its PID), stdout and stderr. ``address_space``: the
    child's ``RLIMIT_AS`` in bytes (the preloaded modules count toward it, as in a fresh
    interpreter that imports them)."""
    import multiprocessing
    import tempfile

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)
    with tempfile.TemporaryDirectory(prefix="fedprivopt-child-") as files:
        out, err = Path(files, "stdout"), Path(files, "stderr")
        child = context.Process(
            target=_program_in_fork,
            args=(list(argv), dict(env), str(cwd), str(out), str(err), address_space),
        )
        child.start()
        try:
            child.join(timeout)
            code = child.exitcode
        finally:
            if child.exitcode is None:
                child.kill()  # by its PID, also when the test fails
                child.join()
        return code, out.read_text(errors="replace"), err.read_text(errors="replace")
