"""The checks of a local deployment's arguments, made before anything is written or started.

``--nodes``, ``--timeout``, ``--out`` (the placeholder of Flower's run id, a deployment already
running into it: :data:`DEPLOY_LOCK`), the deployment key ``min-nodes`` and the types of
:func:`~fedprivopt.deploy.local.deploy_local`'s arguments. The command line
(:mod:`fedprivopt.deploy.cli`) makes the same checks before it parses a preset.
"""

from __future__ import annotations

import numbers
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedprivopt.core.checks import check_bool, check_int
from fedprivopt.core.files import url_refusal
from fedprivopt.core.memory import physical_memory, processes_that_fit
from fedprivopt.core.text import shown
from fedprivopt.data.locks import directory_held
from fedprivopt.deploy import MAX_LOCAL_NODES, MAX_TIMEOUT
from fedprivopt.deploy.runconfig import RUN_ID, check_run_out

__all__ = [
    "DEPLOY_LOCK",
    "LOG_DIR",
    "NODE_MEMORY",
    "USER_MEMORY",
    "check_arguments",
    "check_min_nodes",
    "check_nodes",
    "check_not_deploying",
    "check_out",
    "check_timeout",
    "in_use",
]

LOG_DIR = "deploy"
"""The directory of a deployment's logs, ``processes.json`` and lock inside ``out``."""

NODE_MEMORY = 512 * 2**20
"""Memory one SuperNode of a local deployment holds at least: the node, its SuperExec and its
ClientApp with torch and the task (423 MB proportional set size a node measured for the toy task,
2 and 6 nodes; StackOverflow tasks hold more)."""

USER_MEMORY = 512
"""Bytes of the ServerApp's memory a user of a deployment takes at least: the user query maps
every user to its node (a set and a dict of them, and each node's list): 2.25 GB proportional
set size for 10**7 toy users against 0.29 GB for 40, about 196 bytes a user, so 512 leaves the
nodes and the rest of the machine their share."""


def check_out(out: str | os.PathLike) -> None:
    """Refuse an ``out`` that the deployment would not write as given.

    Thirty-fourth review of issue 15: ``deploy local --out 'runs/x-{run_id}'`` (the app's
    default ``out`` has the placeholder, docs/DEPLOYMENT.md) made the ServerApp write the run into
    ``runs/x-<Flower's run id>`` while the deployment waited for ``runs/x-{run_id}/summary.json``:
    rc 1, ``failed: run N ended (finished:completed) without writing ...`` and 40 lines of log,
    for a run that had finished elsewhere.

    Raises
    ------
    ValueError
        If ``out`` is empty or holds the placeholder :data:`~fedprivopt.deploy.runconfig.RUN_ID`.
    """
    if not str(out):
        raise ValueError("--out must be a directory path")
    refused = url_refusal("argument --out:", out)  # a Path too: its text has one slash (s3:/b)
    if refused is not None:  # forty-third review of issue 15 (lead 7; outputs 4's twin)
        raise ValueError(refused)
    # thirty-seventh review of issue 15: what the ServerApp would refuse after the start; a
    # ~user of no user included (follow-up of the forty-second review, outputs 1: pathlib's
    # "Could not determine home directory." out of deploy_local(out="~nosuchuser/x"))
    try:
        check_run_out(os.fspath(out))
    except ValueError as exc:
        raise ValueError(f"argument --{exc}") from None
    if RUN_ID in str(out):
        raise ValueError(
            f"argument --out: deploy local writes the run into --out as given and looks for "
            f"it there; {RUN_ID} (the ServerApp's placeholder for Flower's run id) is not "
            f"allowed in it, got {shown(str(out))}"
        )


DEPLOY_LOCK = "deploy.lock"
"""The lock file in ``OUT/deploy`` that a running deployment holds, with its PID."""


def in_use(out: str | os.PathLike, pid: int | None, lock: Path) -> ValueError:
    """The refusal of ``out`` while process ``pid`` (``None``: unknown) deploys into it."""
    holder = f"process {pid}" if pid is not None else "another process (PID unknown)"
    return ValueError(
        f"argument --out: {shown(str(out))} is in use by {holder}, a deployment into it "
        f"(lock file {lock}); wait for it to finish or stop it first"
    )


def check_not_deploying(out: str | os.PathLike) -> None:
    """Refuse ``out`` while a deployment into it runs; holds no lock and writes nothing.

    The deployment holds ``OUT/deploy`` and ``deploy.lock`` there (:data:`DEPLOY_LOCK`, its PID)
    until every process it started is stopped; this asks before ``out``'s other checks, which
    would call the run it is writing one to resume.

    Raises
    ------
    ValueError
        Naming ``--out`` and the holder's PID.
    """
    log_dir = Path(out).expanduser() / LOG_DIR
    lock = log_dir / DEPLOY_LOCK
    # Fortieth review of issue 15 (processes 3): the lock file's flock is its inode's, and an
    # OUT copied with `cp -al OUT OUT2` while a deployment into OUT ran was refused as "in use
    # by process N", N the deployment into OUT (which the user was told to stop). A deployment
    # holds its log directory itself (rundir.lock_directory), which a copy does not share; a
    # link to another OUT's (ln -s ../OUT/deploy OUT2/deploy) is not followed to its holder.
    # none, a link or not a directory: refused naming it by the claim (data.locks.directory_held)
    if directory_held(log_dir):
        raise in_use(out, _pid_in(lock), lock)


def _pid_in(lock: Path) -> int | None:
    """The PID a deployment wrote into its lock file (``None``: none, or not a regular file)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        text = os.pread(fd, 32, 0).strip() if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        text = b""
    finally:
        os.close(fd)
    from fedprivopt.data.locks import named_holder

    # forty-second review of issue 15 (processes 4): another PID namespace's PID is not named
    return named_holder(lock, int(text) if text.isdigit() else None)


def check_min_nodes(overrides: Mapping[str, Any], nodes: int) -> int:
    """The deployment key ``min-nodes`` of ``overrides`` (default ``nodes``), checked.

    Twenty-fifth review of issue 15, finding 1: it was converted with ``int()`` unchecked, so
    1.5 and ``true`` ran, ``inf`` and a list were tracebacks, 0, -3 and 1e300 failed in the
    ServerApp after every process had started, and more than ``nodes`` waited for nodes that
    never come until ``--timeout``.

    Raises
    ------
    ValueError
        Unless it is an integer in ``[1, nodes]``.
    """
    value = overrides.get("min-nodes", nodes)
    return check_int("--set min-nodes", value, 1, nodes, high_name="--nodes")


def check_nodes(nodes: object, population: int | None = None) -> int:
    """``--nodes`` checked: in ``[1, MAX_LOCAL_NODES]``, the memory's bound and ``population``.

    At most the nodes this machine's memory holds (its physical memory over :data:`NODE_MEMORY`).

    Thirty-fifth review of issue 15: the command line checked both,
    :func:`~fedprivopt.deploy.local.deploy_local` only ``>= 1``, so
    ``deploy_local(nodes=100000)`` started SuperNodes until ``Too many open files`` (the seventh
    review's F8, in the Python API). Forty-eighth review of issue 15 (memory 1): ``--nodes 64``
    was taken on a machine of 23 GiB, where a node holds 423 MB (toy task) and 64 about 28 GB;
    and a population of 10**8 (the ServerApp's user query: about 20 GB, 2.25 GB measured for
    10**7), now at most the memory over :data:`USER_MEMORY`.

    Raises
    ------
    ValueError
        Naming ``--nodes`` and its range.
    """
    nodes = check_int("--nodes", nodes, 1, MAX_LOCAL_NODES)
    memory = physical_memory()
    most = processes_that_fit(MAX_LOCAL_NODES, memory, NODE_MEMORY)
    if nodes > most:  # forty-eighth review of issue 15 (memory 1): 64 nodes on 23 GiB
        raise ValueError(
            f"--nodes must be an integer in [1, {most}] on this machine: each node is a "
            f"SuperNode with its ClientApp, at least {NODE_MEMORY // 2**20} MiB, and it has "
            f"{memory / 2**30:.1f} GiB of memory, got {nodes}"
        )
    users = memory // USER_MEMORY
    if population is not None and 0 < users < population:  # forty-eighth review (memory 6)
        raise ValueError(
            f"population must be at most {users:,} for a local deployment on this machine (its "
            f"ServerApp maps every user to its node, at least {USER_MEMORY} bytes a user, in "
            f"{memory / 2**30:.1f} GiB of memory), got {population:,}; the fast engine of "
            "simulate runs any population"
        )
    if population is not None and nodes > population:
        raise ValueError(
            f"--nodes must be at most the population ({population} users: a node without users "
            f"would only wait), got {nodes}"
        )
    return nodes


def check_timeout(timeout: object, shown_as: object = None) -> float:
    """``timeout`` (``--timeout``, seconds) checked: a number in ``(0, MAX_TIMEOUT]``.

    Thirty-fifth review of issue 15: :func:`~fedprivopt.deploy.local.deploy_local` took any
    number in ``(0, inf)`` and ``True``, where the command line takes at most 30 days:
    ``deploy_local(timeout=1e12)`` wrote ``OUT/deploy`` and ended in ``OverflowError: date value
    out of range`` (the TLS certificates' validity), ``timeout=True`` ran as 1 s and timed out.
    ``shown_as``: the value as the user gave it (the command line's text).

    Raises
    ------
    ValueError
        Naming ``--timeout`` and its range.
    """
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, numbers.Real)
        or not 0 < timeout <= MAX_TIMEOUT
    ):
        given = timeout if shown_as is None else shown_as
        raise ValueError(
            f"--timeout must be a number of seconds in (0, {MAX_TIMEOUT:g}], got {shown(given)}"
        )
    return float(timeout)


def check_arguments(
    tls: object,
    node_auth: object,
    config_path: object,
    overrides: object,
    out: object,
    app_dir: object,
    progress: object,
) -> None:
    """Refuse an argument of :func:`~fedprivopt.deploy.local.deploy_local` of another type.

    Thirty-fifth review of issue 15: ``deploy_local(..., out=None)``, ``config_path=123``,
    ``overrides=[("seed", 1)]`` ended in ``TypeError``/``AttributeError`` naming nothing;
    ``progress=5`` started the deployment and failed at its first line of progress;
    ``tls="false"`` deployed with TLS (any non-empty string is true).
    """
    check_bool("tls", tls)
    if node_auth is not None:
        check_bool("node_auth", node_auth)
    for name, path, optional in (
        ("out", out, False),
        ("config_path", config_path, True),
        ("app_dir", app_dir, True),
    ):
        if not (optional and path is None) and not isinstance(path, (str, os.PathLike)):
            raise ValueError(f"{name} must be a path, got {shown(path)}")
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ValueError(
            f"overrides must be a mapping of --set keys to values, got {shown(overrides)}"
        )
    if progress is not None and not callable(progress):
        raise ValueError(f"progress must be callable or None, got {shown(progress)}")
