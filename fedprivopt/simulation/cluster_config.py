"""Which Ray a run uses: the ``ray-address`` key, ``RAY_ADDRESS``, and the checks made before a run.

Both engines start a private Ray instance on this machine unless told to join a cluster:

- ``ray-address = "host:port"`` (the head's GCS address, as ``ray start --head`` prints it) or
  ``"auto"`` (the cluster this machine is a node of) joins that cluster;
- ``ray-address = "local"`` always starts a private instance;
- unset (``""``, the default): the environment variable ``RAY_ADDRESS`` when it is set (as
  ``ray`` itself reads it), else a private instance.

Only runs that use Ray look at either (the ``flower`` engine, or ``fast-actors > 0``). Ray
Client addresses (``ray://``) are refused: the driver must run on a node of the cluster. What
joining does at the start of a run (the nodes, the data directory, the shards):
:mod:`fedprivopt.simulation.cluster`. This module imports no Ray: the configuration uses it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from fedprivopt.core.memory import PROCESS_MEMORY, physical_memory, processes_that_fit
from fedprivopt.core.text import shown

__all__ = [
    "ENV_ADDRESS",
    "LOCAL",
    "check_address",
    "check_cluster_config",
    "check_private_workers",
    "cluster_address",
    "uses_ray",
]

ENV_ADDRESS = "RAY_ADDRESS"
"""The environment variable read when ``ray-address`` is unset."""

LOCAL = "local"
"""The ``ray-address`` that starts a private Ray instance on this machine."""

_HOST = r"([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
_ADDRESS = re.compile(rf"(auto|local|{_HOST}:(?P<port>[0-9]{{1,5}}))\Z")


def _resolvable(host: str) -> bool:
    """Whether ``host`` (a bracketed IPv6 address or a name) has labels of 1 to 63 characters.

    The resolver's IDNA encoding refuses an empty label (``head..lan``) or one over 63
    characters, and a name over 253: twenty-third review of issue 15, where such an address
    passed this check and ended in ``encoding with 'idna' codec failed``, naming no key.
    """
    if host.startswith("["):
        return True
    return len(host) <= 253 and all(1 <= len(label) <= 63 for label in host.split("."))


def check_address(value: object, key: str = "ray-address") -> str:
    """Return ``value`` if it is a valid ``ray-address`` (``""`` means unset), else raise.

    Parameters
    ----------
    value : object
        ``""``, ``"local"``, ``"auto"`` or ``host:port`` with a port in [1, 65535] and a host
        name whose dot-separated labels have 1 to 63 characters (253 in all).
    key : str
        What the error names (``RAY_ADDRESS`` when the value comes from the environment).

    Raises
    ------
    ValueError
        Naming ``key``, for anything else (a ``ray://`` Ray Client address included).
    """
    if isinstance(value, str) and value == "":
        return value
    match = _ADDRESS.match(value) if isinstance(value, str) else None
    port = match and match.group("port")
    if (
        match is None
        or (port is not None and not 1 <= int(port) <= 65535)
        or (port is not None and not _resolvable(value.rpartition(":")[0]))
    ):
        client = isinstance(value, str) and value.startswith("ray://")
        why = " (Ray Client is not supported: run on a node of the cluster)" if client else ""
        raise ValueError(
            f'{key} must be "local", "auto" or host:port (the head node\'s address, as '
            f"`ray start --head` prints it; port in [1, 65535]){why}, got {shown(value)}"
        )
    return value


def uses_ray(config: Any) -> bool:
    """Whether a run of ``config`` uses Ray: the ``flower`` engine, or ``fast-actors > 0``."""
    return config.engine == "flower" or config.fast_actors > 0


def cluster_address(config: Any) -> tuple[str, str] | None:
    """The cluster a run of ``config`` joins, as ``(address, key that set it)``, or ``None``.

    ``None`` when the run starts a private Ray instance (or uses no Ray). The key is
    ``ray-address``, or ``RAY_ADDRESS`` when the environment variable set it.

    Raises
    ------
    ValueError
        If ``RAY_ADDRESS`` is used and is not a valid address (naming it).
    """
    if not uses_ray(config):
        return None
    address, key = config.ray_address, "ray-address"
    if not address:
        key = f"{ENV_ADDRESS} (the environment variable, read as ray-address is unset)"
        address = check_address(os.environ.get(ENV_ADDRESS, "").strip(), key)
    if not address or address == LOCAL:
        return None
    return address, key


def check_cluster_config(config: Any) -> tuple[str, str] | None:
    """The checks of a run that joins a cluster that need no cluster; its address or ``None``.

    Made before anything is written (also for a run in a private Ray instance:
    :func:`check_private_workers`): ``ray-cpus`` must be 0 (the nodes declare their CPUs when
    they start) and ``task-params.data-dir``, if the task has one, an absolute path (every node
    resolves it on its own, from its own working directory).

    Raises
    ------
    ValueError
        Naming the key.
    """
    joined = cluster_address(config)
    if joined is None:
        check_private_workers(config)
        return None
    address, key = joined
    if config.ray_cpus:
        raise ValueError(
            f"ray-cpus must be 0 when joining the Ray cluster at {address} (from {key}): each "
            f"node declares its CPUs at `ray start --num-cpus`, got {config.ray_cpus}"
        )
    data_dir = config.task_params.get("data_dir")
    if isinstance(data_dir, (str, os.PathLike)) and not Path(data_dir).is_absolute():
        raise ValueError(
            f"task-params.data-dir must be an absolute path when joining the Ray cluster at "
            f"{address} (every node reads it at the same path), got {str(data_dir)!r}"
        )
    return joined


def check_private_workers(config: Any) -> None:
    """Refuse more Ray worker processes than this machine's memory holds, before Ray starts.

    A private Ray instance starts ``fast-actors`` shards (fast engine), or ``ray-cpus /
    client-cpus`` client actors (Flower engine), on this machine, each a process holding torch
    and its own copy of the task (262 and 220-275 MB measured for the toy task): at most
    :func:`~fedprivopt.core.memory.processes_that_fit` of them. Thirty-third review of issue 15:
    both were bounded by 256 only, so ``fast-actors = 200`` on a 2-CPU machine of 23.5 GiB
    set out to start about 52 GB of processes (Ray's memory monitor then kills workers, the
    kernel's out-of-memory killer other programs). A joined cluster's nodes hold their own.

    Raises
    ------
    ValueError
        Naming ``fast-actors`` or ``client-cpus`` and the bound on this machine.
    """
    from fedprivopt.simulation.config import MAX_FAST_ACTORS  # imports this module

    memory = physical_memory()
    machine = os.cpu_count() or 1
    if config.engine == "fast":
        count, cpus = config.fast_actors, machine
    elif config.engine == "flower" and 0 < config.client_cpus and config.ray_cpus <= machine:
        cpus = config.ray_cpus or machine
        count = int(cpus / config.client_cpus)
        if count > MAX_FAST_ACTORS:
            return  # engines.check_flower_resources names the range of client-cpus
    else:
        return
    most = processes_that_fit(count, memory)
    if count <= most:
        return
    why = (
        f"this machine's {memory / 2**30:.1f} GiB of memory holds at most {most} Ray worker "
        f"processes, each holding torch and its own copy of the task (at least "
        f"{PROCESS_MEMORY // 2**20} MiB)"
    )
    if config.engine == "fast":
        raise ValueError(
            f"fast-actors must be an integer in [0, {most}] on this machine: {why}; shards "
            f"beyond its {cpus} CPUs add memory, not speed; got {count}"
        )
    raise ValueError(
        f"client-cpus must be at least {cpus / most:.4g} on this machine: Ray starts "
        f"{cpus} CPUs / client-cpus = {count} client actors, and {why}; got "
        f"{config.client_cpus:g}"
    )
