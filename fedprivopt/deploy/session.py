"""One running local deployment: its processes' environment, the ``flwr`` CLI, and the waits.

:func:`~fedprivopt.deploy.local.deploy_local` decides what runs (the staged app, its run config,
the order of the steps); this module is how it talks to what it started: a :class:`Deployment`
holds the environment every Flower process gets (a private ``FLWR_HOME`` with the connection
that :func:`write_connection` writes, telemetry and update checks off) and their
:class:`~fedprivopt.deploy.processes.ProcessSet`, runs ``flwr ... --format json``
(:meth:`Deployment.flwr`), and fails as soon as the SuperLink or a SuperNode exits
(:meth:`Deployment.check_alive`). :func:`wait_port`, :func:`wait_nodes` and :func:`follow` wait
for the SuperLink's port, for the SuperNodes to be online and for the run's ``summary.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedprivopt.core.text import epsilon_text
from fedprivopt.deploy.listeners import foreign_listeners
from fedprivopt.deploy.processes import ProcessSet
from fedprivopt.deploy.workdir import FLWR_HOME_NAME
from fedprivopt.models.task import TaskError

__all__ = [
    "CONNECTION",
    "HOST",
    "Deployment",
    "OutMoved",
    "Progress",
    "check_listener",
    "executable",
    "follow",
    "free_ports",
    "moved_to",
    "out_in_place",
    "wait_nodes",
    "wait_port",
    "write_connection",
]

CONNECTION = "fedprivopt-local"
"""The name of the SuperLink connection in the deployment's ``FLWR_HOME/config.toml``."""
HOST = "127.0.0.1"
"""Every process of a local deployment binds this address."""
Progress = Callable[[str], None]


def executable(name: str) -> str:
    """A Flower command from this interpreter's environment (else from PATH)."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found (is flwr installed in this environment?)")
    return found


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together while choosing)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def write_connection(flwr_home: Path, port: int, ca_cert: Path | None) -> None:
    """Write ``flwr_home/config.toml``: the connection :data:`CONNECTION` to the SuperLink."""
    lines = ["[superlink]", f'default = "{CONNECTION}"', "", f"[superlink.{CONNECTION}]"]
    lines.append(f'address = "{HOST}:{port}"')
    if ca_cert is None:
        lines.append("insecure = true")
    else:
        lines.append(f"root-certificates = {json.dumps(str(ca_cert))}")
    flwr_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text("\n".join(lines) + "\n")


def _json_tail(text: str) -> Any:
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in the output")
    return json.loads(text[start:])


_TAIL_BYTES = 64 * 1024  # of a log's end, for its last lines


def _read_from(path: Path, start: int, size: int = -1) -> bytes:
    """``size`` bytes of ``path`` from byte ``start`` (-1: to its end; b'' if unreadable)."""
    try:
        with path.open("rb") as log:
            log.seek(start)
            return log.read(size)
    except OSError:
        return b""


class _NewLines:
    """The whole lines a growing file gets after byte ``start``, each read once.

    Thirty-fourth review of issue 15: the SuperLink's log (kept and appended to across
    deployments) and the run's ``metrics.jsonl`` were read whole several times a second while
    the deployment waited, the log's earlier activations counted too.
    """

    def __init__(self, path: Path, start: int = 0) -> None:
        self.path, self.offset, self.partial = path, start, b""

    def read(self) -> list[bytes]:
        """The lines (without their newline) completed since the last call."""
        size = _log_size(self.path)
        if size <= self.offset:
            return []
        text = self.partial + _read_from(self.path, self.offset, size - self.offset)
        self.offset = size
        text, newline, self.partial = text.rpartition(b"\n")  # a line being written: later
        return text.split(b"\n") if newline else []


def _tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log, read from its last :data:`_TAIL_BYTES` only.

    Thirty-fourth review of issue 15: the whole log was read, and the logs in ``OUT/deploy``
    are kept and appended to across deployments (a 20 GB one was a ``MemoryError``).
    """
    if not path.is_file():
        return "(no log)"
    text = _read_from(path, max(0, _log_size(path) - _TAIL_BYTES)).decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


_TASK_ERROR_LINE = f"{TaskError.__module__}.{TaskError.__name__}: "
_ERROR_SCAN_BYTES = 1 << 20  # of the ServerApp log's end, where its error is


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _task_error(path: Path, start: int) -> TaskError | None:
    """The task's error that ended the ServerApp, from what its log got after ``start``.

    The ServerApp's traceback ends in the line ``fedprivopt.models.task.TaskError: <message>``
    (a task breaking its protocol: :mod:`fedprivopt.models.task_calls`, every node answering so).
    Only this run's part of the log is read: a failed deployment's log is kept and appended to.
    """
    text = _read_from(path, max(start, _log_size(path) - _ERROR_SCAN_BYTES))
    lines = text.decode(errors="replace").splitlines()
    lines = [line for line in lines if line.startswith(_TASK_ERROR_LINE)]
    return TaskError(lines[-1][len(_TASK_ERROR_LINE) :].strip()) if lines else None


_NO_PROXY_KEYS = ("NO_PROXY", "no_proxy", "no_grpc_proxy")


def _no_proxy(env: dict[str, str]) -> dict[str, str]:
    """``NO_PROXY`` (and its spellings) with :data:`HOST` and ``localhost`` added.

    Thirty-fourth review of issue 15: with ``https_proxy`` (or ``http_proxy``, ``ALL_PROXY``)
    set, as behind a proxy, Flower's processes sent their connections to 127.0.0.1 through the
    proxy: ``flwr supernode register`` failed with "Connection to the SuperLink is unavailable.
    Please check your network connection", rc 1 (a real proxy would be handed the deployment's
    traffic). Every process of a local deployment talks to this machine only.
    """
    ours = [HOST, "localhost"]
    out = {}
    for key in _NO_PROXY_KEYS:
        if key in env or key != "no_grpc_proxy":  # gRPC reads no_grpc_proxy first when set
            given = [h.strip() for h in env.get(key, "").split(",") if h.strip()]
            out[key] = ",".join(given + [h for h in ours if h not in given])
    return out


class Deployment:
    """State of one :func:`~fedprivopt.deploy.local.deploy_local` call, kept for the cleanup."""

    def __init__(self, workdir: Path, log_dir: Path, progress: Progress | None) -> None:
        self.workdir = workdir
        self.log_dir = log_dir
        self.progress = progress
        self.flwr_home = workdir / FLWR_HOME_NAME
        self.out_fd: int | None = None
        """A descriptor of ``out`` as the deployment locked it (:func:`out_in_place`)."""
        bin_dir = str(Path(sys.executable).parent)
        env = dict(os.environ)
        env.update(
            PATH=bin_dir + os.pathsep + env.get("PATH", ""),
            FLWR_HOME=str(self.flwr_home),
            FLWR_TELEMETRY_ENABLED=env.get("FLWR_TELEMETRY_ENABLED", "0"),
            FLWR_DISABLE_UPDATE_CHECK=env.get("FLWR_DISABLE_UPDATE_CHECK", "1"),
            FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(_no_proxy(env))
        self.procs = ProcessSet(env, log_dir)

    def say(self, text: str) -> None:
        """Report one step to the caller's ``progress`` callback, if any."""
        if self.progress is not None:
            self.progress(text)

    def flwr(self, *args: str, timeout: float = 120.0) -> Any:
        """Run the ``flwr`` CLI with ``--format json``; returns the parsed JSON."""
        argv = [executable("flwr"), *args, "--format", "json"]
        try:
            done = subprocess.run(
                argv,
                env=self.procs.env,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"`flwr {' '.join(args)}` did not answer within {timeout:g} s"
            ) from None
        try:
            result = _json_tail(done.stdout)
        except ValueError:
            result = {"success": False, "error-message": (done.stdout + done.stderr).strip()}
        if not result.get("success", False):
            message = result.get("error-message", done.stdout + done.stderr)
            raise RuntimeError(f"`flwr {' '.join(args)}` failed: {message}")
        return result

    def log_end(self, log_name: str) -> int:
        """The size of a process's log now: where the part of a process started next begins."""
        return _log_size(self.procs.log_path(log_name))

    def check_alive(self) -> None:
        """Raise if the SuperLink or a SuperNode has exited."""
        dead = self.procs.dead(("superlink", "supernode"))
        if dead:
            role, code, log = dead[0]
            raise RuntimeError(f"{role} exited with code {code}; its log ({log}):\n{_tail(log)}")


def check_listener(dep: Deployment, port: int, what: str) -> None:
    """Raise ``RuntimeError`` if a process not of this deployment listens on ``HOST:port``.

    Fortieth review of issue 15 (processes 2): ``port`` was chosen free (:func:`free_ports`)
    seconds before ``what`` (the SuperLink) bound it, and a connection accepted there proved
    only that something listens; another process's listener would have received this
    deployment's SuperNodes and ``flwr run``. Where the kernel's tables cannot be read
    (:func:`~fedprivopt.deploy.listeners.foreign_listeners` is ``None``) the connection is
    taken as before.
    """
    dep.procs.scan()  # the started processes' children: a listener may be a child's
    ours = {t.pid for t in dep.procs.started} | set(dep.procs.found)
    foreign = foreign_listeners(port, HOST, ours)
    if foreign:
        raise RuntimeError(
            f"another process listens on {HOST}:{port}, the port chosen for {what} (socket "
            f"inode {min(foreign)}, not held by a process of this deployment): its connections "
            "would reach that process; nothing was sent to it, run deploy local again"
        )


def wait_port(dep: Deployment, port: int, deadline: float) -> None:
    """Wait until the SuperLink accepts connections on ``port``, on a listener of its own.

    A listener of another process there is refused (:func:`check_listener`).
    """
    while True:
        dep.check_alive()
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1.0):
            check_listener(dep, port, "this deployment's SuperLink")
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the SuperLink did not open {HOST}:{port} in time")
        time.sleep(0.2)


def wait_nodes(dep: Deployment, nodes: int, deadline: float, log_start: int = 0) -> None:
    """Wait until ``flwr supernode ls`` shows ``nodes`` SuperNodes online.

    The CLI costs a second or two of CPU per call, so it is asked only once the SuperLink's log
    shows that many activations (or after 20 s, should that log line ever change). Only what
    the log got after byte ``log_start`` (this deployment's part: a failed deployment's log is
    kept and appended to) is read, each part once (thirty-fourth review of issue 15: the whole
    log was read every 0.3 s, with an earlier deployment's activations counted).
    """
    first_ask = time.monotonic() + 20.0
    link_log = _NewLines(dep.procs.log_path("superlink"), log_start)
    activated = 0
    while True:
        dep.check_alive()
        activated += sum(b"Activated node_id" in line for line in link_log.read())
        if activated >= nodes or time.monotonic() > first_ask:
            remaining = max(5.0, deadline - time.monotonic())
            listing = dep.flwr("supernode", "ls", CONNECTION, timeout=remaining)
            online = [n for n in listing.get("nodes", []) if n.get("status") == "online"]
            if len(online) >= nodes:
                _check_node_ports(dep)
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(online)} of {nodes} SuperNodes came online in time")
            time.sleep(1.0)
        elif time.monotonic() > deadline:
            raise TimeoutError(f"the {nodes} SuperNodes did not come online in time")
        else:
            time.sleep(0.3)


def _check_node_ports(dep: Deployment) -> None:
    """:func:`check_listener` for each SuperNode's own port, where its ClientApps connect.

    The ports are read from the SuperNodes' command lines (``--port``), chosen free as the
    SuperLink's was; a SuperNode listens there once it is online.
    """
    for i, t in enumerate(t for t in dep.procs.started if t.role == "supernode"):
        argv = t.cmd.split(" ")
        if "--port" in argv[:-1]:
            port = argv[argv.index("--port") + 1]
            if port.isdigit():
                check_listener(dep, int(port), f"SuperNode {i}'s ClientApp API")


class OutMoved(RuntimeError):
    """``out`` no longer names the directory the deployment locked (:func:`out_in_place`).

    Forty-fourth review follow-up of issue 15 (outputs 4): what is at ``out`` then is another
    command's; the command line's advice on how the run continues read it there
    (``fedprivopt simulate --resume PP/D``, the other command's run still running), after the
    line that names where this run is.
    """


def moved_to(held: int) -> Path | None:
    """Where the directory open as ``held`` is now (``/proc/self/fd``), or ``None``."""
    try:
        path = Path(os.readlink(f"/proc/self/fd/{held}"))
        if os.path.samestat(os.fstat(held), os.stat(path)):
            return path
    except OSError:
        pass
    return None


def out_in_place(out: Path, held: int | None) -> None:
    """Raise :class:`OutMoved` (a ``RuntimeError``) if ``out`` no longer names directory ``held``.

    Forty-fourth review of issue 15 (processes 2): ``deploy local --out PP/D`` running, ``mv PP
    PP2`` (a renamed parent), then ``simulate toy.toml --rounds 1 --out PP/D``: the deployment,
    which looks for its run's rows and ``summary.json`` by path, took that run's for its own,
    printed ``1 rounds (rounds), ..., epsilon = 7.551; results in PP/D`` with rc 0 for a
    40-round run it then stopped (its own ledger in ``PP2/D``). ``None`` (no descriptor) checks
    nothing.
    """
    if held is None:
        return
    try:
        if os.path.samestat(os.fstat(held), os.stat(out)):
            return
    except OSError:
        pass
    from fedprivopt.simulation.run_places import quoted_out

    # paths as shell words on one line: a name moved to may hold a line break (follow-up,
    # outputs 8: the line was two, and the advised command not one a shell runs)
    now, said = moved_to(held), quoted_out(out)
    where = "" if now is None else f"; its run is now in {quoted_out(now)}"
    if now is not None and (now / "config.toml").is_file() and not (now / "summary.json").exists():
        where += f" (fedprivopt simulate --resume {quoted_out(now)} continues it)"
    raise OutMoved(
        f"--out {said} was moved or replaced while the deployment ran{where}: what is at "
        f"{said} now is not this deployment's, and was not read as its results"
    )


def _in_place(out: Path, held: int | None, run_id: str) -> None:
    """:func:`out_in_place`, saying where the run is when this deployment's ServerApp made it.

    Forty-fifth review of issue 15 (processes 3): ``out``'s parent renamed after ``flwr run``
    and before the ServerApp claimed ``out`` (its start takes seconds): the ServerApp, given
    ``out``'s path, made it anew (parents included) and wrote this deployment's run there, and
    the line said ``what is at PP/D now is not this deployment's``. Where the moved directory
    holds no run and the ServerApp's log (moved with it) says it writes run ``run_id`` to
    ``out``, the line says so and how that run continues.
    """
    try:
        out_in_place(out, held)
    except OutMoved as moved:
        now = None if held is None else moved_to(held)
        if now is None or (now / "config.toml").exists() or not (out / "config.toml").exists():
            raise
        try:
            with open(now / "deploy" / "serverapp.log", "rb") as log:
                log.seek(max(0, os.fstat(log.fileno()).st_size - (1 << 20)))
                text = log.read().decode("utf-8", "replace")
        except OSError:
            raise moved from None
        if f"[fedprivopt] run {run_id} writes to {out}\n" not in text:
            raise
        from fedprivopt.simulation.run_places import quoted_out

        said = quoted_out(out)
        raise OutMoved(
            f"--out {said} was moved or replaced while the deployment started (its logs are "
            f"now in {quoted_out(now / 'deploy')}); its ServerApp, given the path {said}, "
            f"made that directory anew and wrote the run there: fedprivopt simulate --resume "
            f"{said} continues it"
        ) from None


def follow(dep: Deployment, out: Path, run_id: str, deadline: float) -> None:
    """Wait for ``summary.json``; report rows; fail early if the run ends without one.

    Raises
    ------
    TaskError
        When the run ended on the task's error (thirty-third review of issue 15: the deployment
        ended with rc 1 and the last 40 lines of the ServerApp's log, its traceback, where
        ``simulate`` says the error in one line with rc 2).
    RuntimeError, TimeoutError
        When the run ended otherwise without a summary, or did not end in time.
    """
    server_log = dep.procs.log_path("serverapp")
    start = _log_size(server_log)  # the log of an earlier, failed deployment is kept
    stream = dep.procs.start(
        "flwr-log",
        [executable("flwr"), "log", run_id, CONNECTION, "--stream"],
        "serverapp",
    )
    summary = out / "summary.json"
    metrics = _NewLines(out / "metrics.jsonl")
    held = getattr(dep, "out_fd", None)
    while True:
        _in_place(out, held, run_id)  # its rows and summary are read by path (processes 2)
        for line in metrics.read():
            with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError, ValueError):
                row = json.loads(line)
                # a round without evaluation (eval-every > 1) said "round 1: , epsilon=7.551"
                shown = [f"{k}={row[k]:.4f}" for k in ("eval_loss", "eval_accuracy") if k in row]
                shown.append(f"epsilon={epsilon_text(row['epsilon'])}")
                dep.say(f"round {row['round']}: {', '.join(shown)}")
        if summary.exists():
            _in_place(out, held, run_id)
            return
        if stream.poll() is not None:
            # the log stream ends when the run does: give the summary a moment, then ask
            time.sleep(1.0)
            if summary.exists():
                _in_place(out, held, run_id)
                return
            runs = dep.flwr("ls", CONNECTION, "--run-id", run_id).get("runs", [])
            status = runs[0].get("status") if runs else "unknown"
            details = runs[0].get("status-details") if runs else ""
            if not str(status).startswith("finished"):
                stream = dep.procs.start(
                    "flwr-log",
                    [executable("flwr"), "log", run_id, CONNECTION, "--stream"],
                    "serverapp",
                )
            else:
                failure = _task_error(server_log, start)
                if failure is not None:
                    raise failure
                raise RuntimeError(
                    f"run {run_id} ended ({status}: {details}) without writing {summary}; "
                    f"ServerApp log:\n{_tail(server_log)}"
                )
        dep.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"run {run_id} did not finish within the timeout; ServerApp log:\n"
                f"{_tail(dep.procs.log_path('serverapp'))}"
            )
        time.sleep(0.25)
