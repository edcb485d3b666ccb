"""A whole Flower deployment on this machine: one SuperLink, N SuperNodes, one run.

:func:`deploy_local` is what ``fedprivopt deploy local`` runs. Everything binds 127.0.0.1 on ports
chosen at run time, lives in a private working directory (TLS material, Flower's home with the
connection, a staged copy of the app) and is stopped by PID when the run ends, fails, times out or
is interrupted. If this process is killed (SIGKILL), its watchdog stops them and removes the
directory (:mod:`fedprivopt.simulation.watchdog`); should the watchdog be killed too, the next
deployment removes a directory whose owner is gone (:mod:`fedprivopt.deploy.workdir`). The run's
results land in ``out`` exactly as for ``fedprivopt simulate``
(``config.toml``, ``metrics.jsonl``, ``checkpoint.pt``, ``summary.json``), plus ``out/deploy/``:
the logs of the SuperLink, of every SuperNode and of the ServerApp, and ``processes.json``
(every process started or seen, with its PID).

Steps: write the CA and the SuperLink's certificate (:mod:`fedprivopt.deploy.tls`); start
``flower-superlink`` (TLS or ``--insecure``, ``--disable-runtime-dependency-installation``);
register one key per SuperNode (``flwr supernode register``; node authentication needs TLS);
start ``flower-supernode`` × N with ``--node-config "partition-id=i num-partitions=N"``; wait
until ``flwr supernode ls`` shows them online; ``flwr run <app> <connection> --run-config
<file>``; follow the run with ``flwr log --stream`` (it ends when the run ends) until
``summary.json`` appears; stop everything. How it talks to what it started (the processes'
environment, the ``flwr`` CLI, the waits) is :mod:`fedprivopt.deploy.session`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import shutil
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedprivopt.core.text import epsilon_text
from fedprivopt.data.locks import LockHeldError
from fedprivopt.deploy.local_checks import (
    DEPLOY_LOCK,
    LOG_DIR,
    check_arguments,
    check_min_nodes,
    check_nodes,
    check_not_deploying,
    check_out,
    check_timeout,
    in_use,
)
from fedprivopt.deploy.runconfig import (
    DEPLOY_KEYS,
    app_config_defaults,
    refuse_double_settings,
    refuse_simulation_only,
    run_config_from_flower,
    to_flower_overrides,
)
from fedprivopt.deploy.session import (
    CONNECTION,
    HOST,
    Deployment,
    OutMoved,
    Progress,
    executable,
    follow,
    free_ports,
    moved_to,
    out_in_place,
    wait_nodes,
    wait_port,
    write_connection,
)
from fedprivopt.deploy.tls import make_node_key, make_tls_files
from fedprivopt.deploy.workdir import make_workdir
from fedprivopt.simulation.config import RunConfig
from fedprivopt.simulation.files import to_toml
from fedprivopt.simulation.interrupt import signals_raise
from fedprivopt.simulation.rundir import lock_directory
from fedprivopt.simulation.watchdog import Watchdog

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# check_* are defined in local_checks; this module is their documented public path.
__all__ = [
    "CONNECTION",
    "REPO_ROOT",
    "STOP_ORDER",
    "check_app",
    "check_min_nodes",
    "check_nodes",
    "check_not_deploying",
    "check_out",
    "check_timeout",
    "deploy_local",
    "forget_private_keys",
    "stage_app",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The Flower app this package belongs to (the repository root, with ``pyproject.toml``)."""

STOP_ORDER = ("flwr-serverapp", "flwr-log", "supernode", "superlink")
"""The order in which a deployment's processes are stopped, however it ends: the ServerApp
first, so no round is released after Ctrl-C while the SuperNodes shut down (thirty-first review
of issue 15: it was stopped last, and released rounds 2-5 of 5 in the 11 s the others took)."""


# -- the app ---------------------------------------------------------------------------------------


def _prune(rel_dir: str, name: str, ignore) -> bool:
    if name in (".git", ".venv", ".flwr", "__pycache__"):  # never in a FAB, possibly huge
        return True
    return ignore is not None and ignore.match_file(f"{rel_dir}{name}/")


def stage_app(src: str | Path, dst: str | Path) -> Path:
    """Copy the files of the Flower app ``src`` that its FAB would contain into ``dst``.

    ``flwr run <dir>`` walks the whole directory, virtual environment included, before it
    filters; on a repository with a ``.venv`` that costs seconds to tens of seconds. The staged
    copy holds exactly the FAB's files (Flower's own filters decide: ``.gitignore``, its built-in
    patterns and ``fab-include``), so the FAB built from it is the same.
    """
    src, dst = Path(src).resolve(), Path(dst)
    try:
        from flwr.cli.build import get_filtered_fab_paths
        from flwr.cli.utils import build_pathspec, filter_paths_for_publish, load_gitignore_patterns
    except ImportError:  # pragma: no cover - Flower moved its internals: use the app as it is
        return src
    gitignore = src / ".gitignore"
    files: dict[str, Path] = {}
    with warnings.catch_warnings():  # pathspec deprecates the pattern style Flower uses
        warnings.simplefilter("ignore", DeprecationWarning)
        ignore = None
        if gitignore.is_file():
            ignore = build_pathspec(tuple(load_gitignore_patterns(gitignore.read_bytes())))
        for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
            rel = Path(dirpath).relative_to(src).as_posix()
            rel = "" if rel == "." else f"{rel}/"
            dirnames[:] = [d for d in dirnames if not _prune(rel, d, ignore)]
            for name in filenames:
                path = Path(dirpath) / name
                if not path.is_symlink():
                    files[f"{rel}{name}"] = path
        config = tomllib.loads((src / "pyproject.toml").read_text())
        files = filter_paths_for_publish(files)
        keep = ["pyproject.toml", *get_filtered_fab_paths(files, config)]
    for rel in keep:
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(files.get(rel, src / rel), target)
    return dst


def _write_run_config(path: Path, overrides: Mapping[str, Any]) -> Path:
    for value in overrides.values():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"run config values must be finite, got {value!r}")
    path.write_text(to_toml(overrides), encoding="utf-8")
    return path


# -- the entry point -------------------------------------------------------------------------------


def check_app(app_dir: Path) -> Path:
    """``app_dir`` if it is a Flower app (it holds ``pyproject.toml``), else ``ValueError``.

    Thirty-fifth review of issue 15: with fedprivopt installed from a wheel (``pip install
    /path/to/fedprivopt``, as docs/SCALING.md installs it on a cluster), the app directory is
    ``site-packages`` and ``deploy local`` said ``cannot read the Flower app config
    '.../site-packages/pyproject.toml': [Errno 2] No such file or directory``, a path the user
    never gave, without saying that a deployment needs a source tree.
    """
    if (Path(app_dir) / "pyproject.toml").is_file():
        return Path(app_dir)
    if Path(app_dir) == REPO_ROOT:
        raise ValueError(
            "deploy local runs the Flower app of a fedprivopt source tree (the pyproject.toml "
            f"beside the package), and this fedprivopt, in {str(REPO_ROOT)!r}, is installed "
            "without one (from a wheel): install it from a clone with pip install -e (make "
            "venv) and run deploy local from there"
        )
    raise ValueError(f"{str(app_dir)!r} is not a Flower app (no pyproject.toml)")


def resolve_deployment(
    config_path: str | None, overrides: Mapping[str, Any], app_dir: Path
) -> tuple[RunConfig, dict[str, Any], dict[str, Any]]:
    """The run's config, the app's declared keys, and the deployment keys from ``overrides``."""
    from fedprivopt.simulation.config import load_config

    app_keys = app_config_defaults(check_app(app_dir))
    overrides = dict(overrides)
    if "out" in overrides:
        raise ValueError("set the results directory with --out, not --set out=...")
    deploy = {k: overrides.pop(k) for k in ("min-nodes",) if k in overrides}
    refuse_simulation_only(overrides)  # before load_config: ray-address's advice is the fast's
    if config_path is not None:
        config = load_config(config_path, overrides)
    else:
        refuse_double_settings(overrides)
        flower = {k: v for k, v in app_keys.items() if k not in ("out",)}
        if any(k.startswith("task-params.") for k in overrides) or "task" in overrides:
            flower.pop("task-params-json", None)
        if "task" in overrides and overrides["task"] != app_keys.get("task"):
            for key in [k for k in flower if k.startswith("task-params.")]:
                del flower[key]  # another task: the toy task's parameters do not apply
        flower.update(overrides)
        flower.update(deploy)
        config, _ = run_config_from_flower(flower)
    return config, app_keys, deploy


def deploy_local(
    *,
    nodes: int,
    tls: bool = True,
    config_path: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    out: str,
    timeout: float = 900.0,
    node_auth: bool | None = None,
    app_dir: str | Path | None = None,
    progress: Progress | None = None,
) -> Path:
    """Run one fedprivopt run on a local SuperLink with ``nodes`` SuperNodes; returns ``out``.

    Parameters
    ----------
    nodes : int
        Number of SuperNodes, in ``[1, MAX_LOCAL_NODES]`` (64) and at most the population.
        Node ``i`` hosts users ``range(i, N, nodes)``.
    tls : bool
        Encrypt every connection (a private CA and a certificate for 127.0.0.1 are made for the
        run); ``False`` runs everything with ``--insecure``.
    config_path : str, optional
        A preset (``simulations/*.toml``); without one the app's run config in
        ``pyproject.toml`` is the base.
    overrides : Mapping, optional
        ``--set`` values (kebab-case keys, ``task-params.<key>``); also the deployment key
        ``min-nodes``, an integer in ``[1, nodes]`` (default: ``nodes``).
    out : str
        Results directory (must not hold a run already).
    timeout : float
        Seconds for the whole deployment, start to stop.
    node_auth : bool, optional
        Authenticate SuperNodes with per-node keys (default: on with TLS; needs TLS).
    app_dir : str or Path, optional
        The Flower app to run (default: this repository).
    progress : callable, optional
        Receives one line per step and per evaluated round.

    Raises
    ------
    ValueError
        Bad input, naming the flag (``--nodes``, ``--timeout``, ``--out``, ``--set``...).
    RuntimeError, TimeoutError
        The deployment or the run failed; the message has the relevant log's tail. Every
        process is stopped before the exception propagates. ``RuntimeError`` too when ``out``
        was moved or replaced while the deployment ran (``session.out_in_place``).
    """
    nodes = check_nodes(nodes)
    timeout = check_timeout(timeout)
    check_arguments(tls, node_auth, config_path, overrides, out, app_dir, progress)
    if node_auth is None:
        node_auth = bool(tls)
    if node_auth and not tls:
        raise ValueError("--node-auth needs TLS (drop --insecure)")
    check_out(out)
    check_not_deploying(out)
    app = check_app(Path(app_dir).resolve() if app_dir is not None else REPO_ROOT)
    min_nodes = check_min_nodes(overrides or {}, nodes)
    config, app_keys, _ = resolve_deployment(config_path, overrides or {}, app)
    check_nodes(nodes, config.strategy.population)
    from fedprivopt.simulation.run import build_run

    build_run(config)  # the task and the population, checked before anything starts
    from fedprivopt.deploy.out_checks import check_out_claimable

    check_out_claimable(Path(out).expanduser(), config)  # as the command line (processes 2)
    out_dir = Path(out).expanduser().resolve()
    if (out_dir / "config.toml").exists():
        raise ValueError(f"--out directory {str(out_dir)!r} already holds a run; choose another")
    extra = {"out": str(out_dir), "min-nodes": min_nodes}
    flower_overrides = to_flower_overrides(config, app_keys=app_keys, extra=extra)
    unknown = sorted(set(flower_overrides) - set(app_keys) - set(DEPLOY_KEYS))
    if unknown:  # pragma: no cover - to_flower_overrides already checks
        raise ValueError(f"--set keys not in the app config: {', '.join(unknown)}")

    deadline = time.monotonic() + float(timeout)
    log_dir = out_dir / LOG_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(exist_ok=True)
    # one deployment into out at a time, held until every process is stopped (thirty-fourth
    # review of issue 15: a second one started its own SuperLink and SuperNodes, wrote into the
    # first's logs, and ended rc 1 advising to resume the run the first was still writing)
    held = contextlib.ExitStack()
    try:
        held.enter_context(lock_directory(log_dir, DEPLOY_LOCK, what=f"--out {out_dir}"))
    except LockHeldError as exc:  # started just after the check above
        raise in_use(out, exc.pid, log_dir / DEPLOY_LOCK) from None
    with held:
        # the directory locked: where the run's rows and summary are read (processes 2)
        out_fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        held.callback(os.close, out_fd)
        workdir = make_workdir()
        try:
            dep = Deployment(workdir, log_dir, progress)
            dep.out_fd = out_fd
            # if this process is killed, the watchdog stops the deployment's processes (they carry
            # its tag, or are our descendants) and removes the working directory with its keys
            watchdog = Watchdog(marker=dep.procs.marker, paths=[workdir], tree=True)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        atexit.register(dep.procs.stop)
        try:
            with signals_raise():  # SIGTERM/SIGHUP unwind like Ctrl-C, so cleanup runs
                _run(dep, nodes, tls, node_auth, app, flower_overrides, out_dir, deadline)
        except KeyboardInterrupt as exc:
            # forty-fourth review follow-up of issue 15 (outputs 5): the command line's line
            # reads out by path; a moved out's is another's (its finished run named as this one)
            try:
                out_in_place(out_dir, out_fd)
            except OutMoved as moved:
                exc.out_moved = str(moved)  # type: ignore[attr-defined]
            raise
        except OSError as exc:
            # forty-fifth review of issue 15 (processes 2): out's parent renamed while the
            # processes started (their logs are read by path): 'argument --out: .../deploy/
            # superlink.log: No such file or directory', rc 2, as if --out were bad input
            if isinstance(exc, TimeoutError):
                raise
            out_in_place(out_dir, out_fd)
            raise
        finally:
            dep.say("stopping the SuperNodes and the SuperLink")
            try:
                dep.procs.stop(order=STOP_ORDER)
                atexit.unregister(dep.procs.stop)
                here = moved_to(out_fd)  # the logs go with a moved out (processes 2)
                records = log_dir if here is None else here / LOG_DIR
                with contextlib.suppress(OSError):  # not through a link (fortieth review)
                    dep.procs.write_records(records / "processes.json")
                shutil.rmtree(workdir, ignore_errors=True)
            finally:
                watchdog.close()
        # forty-fourth review follow-up of issue 15 (outputs 1): out moved or replaced while
        # the processes stopped (seconds, after the summary was checked): the caller reads the
        # summary at out_dir, another run's
        out_in_place(out_dir, out_fd)
    return out_dir


def forget_private_keys(files: Any, keys: list[Any]) -> list[Path]:
    """Remove the deployment's private keys from disk once every process holding one has read it.

    The SuperLink loads its TLS key when it starts (before its port opens), each SuperNode its
    TLS key and its authentication key before it is online; nothing reads them later (the
    SuperExecs, the ServerApp and the ClientApps connect with the CA's certificate only). Kept
    on disk for the whole deployment, they stayed behind when the deployment and its watchdog
    were killed together (thirty-eighth review of issue 15, signals 2: ``pkill -9 -f
    fedprivopt``, whose pattern the watchdog's command line matches too, left ``server.key`` and
    every node's key in ``<tmp>/fedprivopt-deploy-*`` until the next ``deploy local``). Only the
    certificates are left there now. Returns the paths removed.
    """
    paths = [] if files is None else [Path(files.server_key)]
    paths += [Path(key.private_key) for key in keys]
    removed = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed


def _tls_days(deadline: float) -> int:
    """Days the deployment's certificates are valid: to ``deadline`` (monotonic) and a day more.

    Thirty-fourth review of issue 15: they were valid 2 days whatever ``--timeout`` (up to 30
    days) allowed, so a longer deployment's TLS handshakes would fail midway on an expired
    certificate (the SuperNodes' connections to the SuperLink, the ClientApps' to their node).
    """
    return max(2, math.ceil((deadline - time.monotonic()) / 86400.0) + 1)


def _run(
    dep: Deployment,
    nodes: int,
    tls: bool,
    node_auth: bool,
    app: Path,
    flower_overrides: Mapping[str, Any],
    out: Path,
    deadline: float,
) -> None:
    workdir = dep.workdir
    staged = stage_app(app, workdir / "app" / "fedprivopt")
    run_config = _write_run_config(workdir / "run-config.toml", flower_overrides)
    files = make_tls_files(workdir / "tls", days=_tls_days(deadline)) if tls else None
    link_port, *node_ports = free_ports(1 + nodes)
    write_connection(dep.flwr_home, link_port, files.ca_cert if files else None)

    link = [executable("flower-superlink"), "--host", HOST, "--port", str(link_port)]
    link += ["--disable-runtime-dependency-installation"]
    if files is None:
        link += ["--insecure"]
    else:
        link += ["--ssl-ca-certfile", str(files.ca_cert), "--ssl-certfile", str(files.server_cert)]
        link += ["--ssl-keyfile", str(files.server_key)]
    if node_auth:
        link += ["--enable-supernode-auth"]
    dep.say(f"starting the SuperLink on {HOST}:{link_port} ({'TLS' if tls else 'insecure'})")
    link_log = dep.log_end("superlink")  # a failed deployment's log is kept and appended to
    dep.procs.start("superlink", link, "superlink")
    wait_port(dep, link_port, deadline)

    keys = []
    if node_auth:
        for i in range(nodes):
            key = make_node_key(workdir / "node-keys", f"node-{i}")
            dep.flwr("supernode", "register", str(key.public_key), CONNECTION)
            keys.append(key)
    for i, port in enumerate(node_ports):
        argv = [executable("flower-supernode"), "--superlink", f"{HOST}:{link_port}"]
        argv += ["--host", HOST, "--port", str(port)]
        argv += ["--node-config", f"partition-id={i} num-partitions={nodes}"]
        if files is None:
            argv += ["--insecure"]
        else:
            argv += ["--root-certificates", str(files.ca_cert)]
            # the node's own Runtime API (its ClientApp processes connect to it) uses TLS too
            argv += [
                "--ssl-certfile",
                str(files.server_cert),
                "--ssl-keyfile",
                str(files.server_key),
            ]
            argv += ["--ssl-ca-certfile", str(files.ca_cert)]
        if keys:
            argv += ["--auth-supernode-private-key", str(keys[i].private_key)]
        dep.procs.start("supernode", argv, f"supernode-{i}")
    dep.say(f"started {nodes} SuperNodes; waiting until they are online")
    wait_nodes(dep, nodes, deadline, log_start=link_log)
    forget_private_keys(files, keys)

    # forty-fifth review of issue 15 (processes 3): out moved or replaced while the nodes came
    # online: the ServerApp, given out's path, would make and write the run at the new place,
    # which follow() then takes for another's; nothing is submitted then
    out_in_place(out, getattr(dep, "out_fd", None))
    dep.say("submitting the run (flwr run)")
    started = dep.flwr("run", str(staged), CONNECTION, "--run-config", str(run_config))
    run_id = str(started["run-id"])
    dep.say(f"run {run_id} started; results in {out}")
    follow(dep, out, run_id, deadline)
    # the summary is written last; let the ServerApp finish and its log stream close: the
    # stream (flwr log --stream) ends once Flower has the run finished and has sent its whole
    # log. Asked of flwr ls before, every second: each call a start of the CLI, 1-3.5 s of CPU
    # on a busy 2-core machine (forty-seventh review of issue 15, suite time)
    streams = [t.popen for t in dep.procs.started if t.role == "flwr-log" and t.popen is not None]
    end = min(deadline, time.monotonic() + 15.0)
    while any(p.poll() is None for p in streams) and time.monotonic() < end:
        time.sleep(0.1)
    summary = json.loads((out / "summary.json").read_text())
    out_in_place(out, getattr(dep, "out_fd", None))  # the summary read is this run's
    dep.say(
        f"finished: {summary['rounds_completed']} rounds ({summary['stopped_reason']}), "
        f"epsilon={epsilon_text(summary['epsilon'])} at delta={summary['delta']:g}"
    )
