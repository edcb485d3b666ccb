"""The private working directory of a local deployment, and removing those of killed ones.

A deployment keeps its CA, the SuperLink's key, the SuperNodes' keys, Flower's home and the
staged app in ``<tmp>/fedprivopt-deploy-*`` (mode 0700) and removes it when it ends; the private
keys leave it as soon as the SuperNodes are online
(:func:`~fedprivopt.deploy.local.forget_private_keys`). If it is
killed (SIGKILL), its watchdog (:class:`~fedprivopt.simulation.watchdog.Watchdog`) removes it; if
the watchdog is killed too, the next deployment removes it: the directory names its owner
(``owner.json``: PID, start time and PID namespace), and one whose owner no longer runs is stale.
The next deployment also stops, by PID, the processes still running with the stale directory's
``FLWR_HOME`` in their environment (every Flower process of the deployment inherits it): the
kernel kills the SuperLink and the SuperNodes with their parent, but Flower's own children
(SuperExecs, the ServerApp) leave only through their ``--parent-pid`` monitors, in seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

from fedprivopt.simulation.watchdog import same_process, start_time, stop_marked

__all__ = ["FLWR_HOME_NAME", "WORKDIR_PREFIX", "make_workdir", "remove_stale_workdirs"]

WORKDIR_PREFIX = "fedprivopt-deploy-"
"""Prefix of a deployment's working directory in the temporary directory."""
FLWR_HOME_NAME = "flwr-home"
"""The deployment's ``FLWR_HOME``, inside its working directory."""
_OWNER = "owner.json"


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _owner_alive(path: Path) -> bool | None:
    """Whether the process that made the working directory ``path`` runs (None: unknown)."""
    try:
        owner = json.loads((path / _OWNER).read_text())
        pid, started, namespace = int(owner["pid"]), owner["start"], str(owner["pidns"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if namespace != _pid_namespace():
        return None  # another PID namespace (a container sharing /tmp): its PIDs are not ours
    return same_process(pid, None if started is None else int(started))


def remove_stale_workdirs(parent: str | Path | None = None) -> list[Path]:
    """Remove the working directories of deployments whose process is gone; returns them.

    A deployment killed with SIGKILL cannot remove its directory (its watchdog normally does).
    Only directories named ``fedprivopt-deploy-*``, owned by this user, not symbolic links, and
    with an ``owner.json`` naming a process (PID and start time, in this PID namespace) that no
    longer runs are removed; anything else is left alone. The processes still running with the
    directory's ``FLWR_HOME`` are stopped first (SIGTERM, a second, then SIGKILL): their owner is
    gone, so there is nothing a graceful shutdown could hand over.
    """
    parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    removed = []
    try:
        candidates = sorted(parent.glob(WORKDIR_PREFIX + "*"))
    except OSError:
        return removed
    for path in candidates:
        try:
            info = path.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        if _owner_alive(path) is False:
            stop_marked(f"FLWR_HOME={path / FLWR_HOME_NAME}", grace=1.0)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def make_workdir() -> Path:
    """A new private working directory (mode 0700) that names its owner process.

    Stale directories of killed deployments are removed first (:func:`remove_stale_workdirs`).
    """
    remove_stale_workdirs()
    workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
    owner = {"pid": os.getpid(), "start": start_time(os.getpid()), "pidns": _pid_namespace()}
    (workdir / _OWNER).write_text(json.dumps(owner) + "\n")
    return workdir
