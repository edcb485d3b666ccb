"""Joining an existing Ray cluster: the start checks, the nodes, where the fast engine's shards go.

:func:`join_cluster` connects this process (the driver) to the cluster that
:func:`~fedprivopt.simulation.cluster_config.cluster_address` names and, before any round:

- refuses an address where nothing answers within :data:`CONNECT_TIMEOUT` seconds, or whose
  port does not answer as a head's GCS (gRPC) within :data:`HANDSHAKE_TIMEOUT` (``ray.init``
  itself retries for minutes), naming the key;
- runs :func:`node_report` on every node with CPUs (a task pinned to the node): the node's
  fedprivopt, torch and Python versions, and the fingerprint of the data directory
  (:func:`data_fingerprint`) as that node sees it. A node that cannot import fedprivopt, runs
  other versions, or sees no or another data directory is refused naming ``ray-address`` or
  ``task-params.data-dir``;
- watches the head for the whole run (:class:`~fedprivopt.simulation.cluster_watch.HeadWatch`):
  one that stops answering ends the run in one line, rc 2, before Ray would end it;
- when the run ends, only disconnects (``ray.shutdown`` in a driver that joined a cluster leaves
  the cluster running).

Where the fast engine's ``fast-actors`` shards go on the nodes:
:mod:`fedprivopt.simulation.cluster_shards`. ``docs/SCALING.md`` is the user's guide.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import socket
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedprivopt.simulation import ray_processes
from fedprivopt.simulation.cluster_config import check_address, check_cluster_config
from fedprivopt.simulation.cluster_watch import HeadWatch

__all__ = [
    "CONNECT_TIMEOUT",
    "Cluster",
    "check_reachable",
    "check_reports",
    "data_fingerprint",
    "join_cluster",
    "node_report",
    "resolve_auto",
]

_log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
"""Seconds to wait for the head node's port to accept a connection."""

START_TIMEOUT = 300.0
"""Seconds to wait for the nodes' start checks and for the shards' placement."""

FINGERPRINT_BYTES = 1 << 20
"""Bytes of each data file that :func:`data_fingerprint` hashes (with its size)."""


def data_fingerprint(path: str | os.PathLike) -> dict[str, Any] | None:
    """What a node sees at ``path``: ``None`` if it is not a directory, else a fingerprint.

    The fingerprint covers the directory's regular files whose names do not start with a dot
    (caches and locks do): their names, their sizes and a SHA-256 of each file's first
    :data:`FINGERPRINT_BYTES` bytes. Each file is opened before its size is read, so a network
    file system revalidates what it cached (NFS's close-to-open consistency).

    Returns
    -------
    dict or None
        ``{"files": count, "bytes": total size, "sha256": hex digest}``.
    """
    root = Path(path)
    if not root.is_dir():
        return None
    digest = hashlib.sha256()
    files = total = 0
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or not entry.is_file():
            continue
        with open(entry, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(FINGERPRINT_BYTES)
        digest.update(f"{entry.name}\0{size}\0".encode())
        digest.update(hashlib.sha256(head).digest())
        files, total = files + 1, total + size
    return {"files": files, "bytes": total, "sha256": digest.hexdigest()}


def node_report(data_dir: str | None) -> dict[str, Any]:
    """What one node runs and sees (the task :func:`join_cluster` runs on every node)."""
    import torch

    from fedprivopt import __version__

    python = ".".join(platform.python_version_tuple()[:2])
    return {
        "host": socket.gethostname(),
        "versions": f"fedprivopt {__version__}, torch {torch.__version__}, Python {python}",
        "data": None if data_dir is None else data_fingerprint(data_dir),
    }


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def check_reports(
    local: dict[str, Any], reports: dict[str, dict[str, Any]], data_dir: str | None, key: str
) -> None:
    """Refuse nodes whose :func:`node_report` differs from this machine's.

    Parameters
    ----------
    local : dict
        This machine's report.
    reports : dict
        Each node's report by a name of the node (its address and id).
    data_dir : str or None
        The task's data directory, if it has one.
    key : str
        The key that set the address (named by version errors).

    Raises
    ------
    ValueError
        Naming ``key`` (other versions) or ``task-params.data-dir`` (no or other data).
    """
    guide = "(docs/SCALING.md)"
    for node, report in reports.items():
        if report["versions"] != local["versions"]:
            raise ValueError(
                f"{key}: the node {node} runs {report['versions']}, this machine "
                f"{local['versions']}: install the same versions on every node {guide}"
            )
        if data_dir is None:
            continue
        theirs, ours = report["data"], local["data"]
        if theirs is None:
            raise ValueError(
                f"task-params.data-dir: the node {node} sees no directory {data_dir}; every "
                f"node must read the data directory at the same path (e.g. on NFS) {guide}"
            )
        if theirs != ours:
            raise ValueError(
                f"task-params.data-dir: the node {node} sees other data at {data_dir} "
                f"({theirs['files']} files, {_size(theirs['bytes'])}) than this machine "
                f"({ours['files']} files, {_size(ours['bytes'])}); every node must read the "
                f"same data directory {guide}"
            )


@dataclass
class Cluster:
    """The Ray cluster a run joined.

    Attributes
    ----------
    address : str
        Its address.
    key : str
        The key that named it (``ray-address`` or ``RAY_ADDRESS``).
    nodes : dict
        The alive nodes with CPUs: node id to ``{"ip", "cpus", "gpus"}``.
    """

    address: str
    key: str
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def cpus(self) -> float:
        """The CPUs of all nodes."""
        return sum(n["cpus"] for n in self.nodes.values())

    @property
    def gpus(self) -> float:
        """The GPUs of all nodes."""
        return sum(n["gpus"] for n in self.nodes.values())


def check_reachable(address: str, key: str) -> None:
    """Refuse a ``host:port`` where no Ray head answers (``ray.init`` would hang for minutes).

    The port must accept a connection within :data:`CONNECT_TIMEOUT` seconds and answer as a
    gRPC server (a head's GCS) within :data:`HANDSHAKE_TIMEOUT` (:func:`_speaks_grpc`), one
    that serves a GCS (:func:`_lacks_gcs`). A port that accepts but never answers, or answers
    as something else (the dashboard's HTTP on 8265, a web server), made ``ray.init`` retry
    for about ten minutes without a word (twenty-first review of issue 15). ``auto`` is the
    address ``ray start`` recorded here (:func:`resolve_auto`).
    """
    if address == "auto":
        address = resolve_auto(address, key)
        key = f"{key} = auto ({address}, recorded by `ray start`)"
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection(
            (host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT
        ) as conn:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return  # the GCS speaks TLS first: no plain HTTP/2 answer to expect
            grpc = _speaks_grpc(conn)
    except OSError as exc:
        raise ValueError(
            f"{key}: no Ray cluster answers at {address} ({exc.strerror or exc}); start its "
            f"head with `ray start --head` (docs/SCALING.md)"
        ) from None
    if not grpc:
        raise ValueError(
            f"{key}: {address} accepts connections but does not answer as a Ray head's GCS "
            f"(gRPC) within {HANDSHAKE_TIMEOUT:g} s: give the head's GCS port (`ray start "
            "--head --port`, 6379 by default), not the dashboard's or another service's "
            "(docs/SCALING.md)"
        )
    if _lacks_gcs(host.strip("[]"), int(port)):
        raise ValueError(
            f"{key}: {address} answers gRPC but has no Ray GCS service (a raylet's or another "
            "port of a Ray node, or another gRPC service such as a Flower SuperLink): give the "
            "head's GCS port (`ray start --head --port`, 6379 by default) (docs/SCALING.md)"
        )


_GCS_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
"""A method every Ray GCS serves (what ``ray.init`` asks first); an empty request is valid."""


def _lacks_gcs(host: str, port: int) -> bool:
    """Whether the gRPC server at ``host:port`` says it serves no Ray GCS (``UNIMPLEMENTED``).

    Thirty-third review of issue 15: a raylet's port (a gRPC server, so it passed
    :func:`_speaks_grpc`) given as ``ray-address`` ended after 22 s in 20 lines of Ray's
    ``Failed to get cluster ID from GCS server: RpcError: ... rpc_code: 12`` before the one line.
    Any other answer (a GCS's, a timeout, an authentication error) is left to ``ray.init``.
    """
    import grpc

    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    channel = grpc.insecure_channel(target)
    try:
        call = channel.unary_unary(
            _GCS_METHOD, request_serializer=bytes, response_deserializer=bytes
        )
        call(b"", timeout=HANDSHAKE_TIMEOUT)
    except grpc.RpcError as exc:
        return exc.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        channel.close()
    return False


def resolve_auto(address: str, key: str) -> str:
    """``address``; for ``auto`` the head's address that ``ray start`` recorded on this machine.

    Ray's own ``auto`` falls back to any GCS process ``ps`` lists on this machine when ``ray
    start`` recorded none: another run's private Ray instance (a ``fast-actors`` or Flower run,
    a ``compare`` cell), possibly another user's. Thirty-third review of issue 15: on a shared
    machine with no cluster, ``ray-address = "auto"`` resolved to a Flower run's private
    instance of another session; the run's shards would have been placed in it and died with
    it. ``docs/SCALING.md`` promises "the cluster this machine is a node of".

    Raises
    ------
    ValueError
        Naming ``key``: ``ray start`` recorded no address here, or one that is no address.
    """
    if address != "auto":
        return address
    from ray._private.utils import get_ray_address_file, read_ray_address

    where = get_ray_address_file(None)
    try:
        found = read_ray_address()
    except (OSError, UnicodeDecodeError):
        found = None
    if not found:
        raise ValueError(
            f"{key}: auto finds no Ray cluster this machine is a node of (`ray start` records "
            f"its head's address in {where}, and there is none): start one with `ray start "
            "--head` (or join one with `ray start --address HEAD:PORT`), or give the head's "
            "host:port (docs/SCALING.md)"
        )
    try:
        return check_address(found, f"{key} (auto, read from {where})")
    except ValueError as exc:
        raise ValueError(str(exc)) from None


HANDSHAKE_TIMEOUT = 5.0
"""Seconds to wait for the head's GCS to answer the HTTP/2 preface (it answers in ms)."""

_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(3) + b"\x04" + bytes(5)


def _speaks_grpc(conn: socket.socket) -> bool:
    """Whether the server of ``conn`` answers an HTTP/2 preface with a SETTINGS frame.

    A gRPC server (a Ray head's GCS) does at once: the first 9 bytes are a frame header of
    type 4 (SETTINGS) on stream 0. A silent server, or an HTTP/1 one (``HTTP/1.1 400 ...``),
    does not. Reads at most 9 bytes, for at most :data:`HANDSHAKE_TIMEOUT` seconds.
    """
    conn.settimeout(HANDSHAKE_TIMEOUT)
    try:
        conn.sendall(_H2_PREFACE)
        header = b""
        while len(header) < 9:
            chunk = conn.recv(9 - len(header))
            if not chunk:
                return False
            header += chunk
    except OSError:  # a timeout, or a reset
        return False
    return header[3] == 4 and header[5:9] == bytes(4)


def _probe(cluster: Cluster, data_dir: str | None) -> None:
    """Run :func:`node_report` on every node and compare with this machine's."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0, max_retries=0)(node_report)
    refs = {
        f"{info['ip']} ({node[:8]})": remote.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
        ).remote(data_dir)
        for node, info in cluster.nodes.items()
    }
    reports = {}
    for name, ref in refs.items():
        try:
            reports[name] = ray.get(ref, timeout=START_TIMEOUT)
        except Exception as exc:  # an import error there, a timeout, a node that died
            first = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
            raise ValueError(
                f"{cluster.key}: the node {name} could not run fedprivopt's start check "
                f"(is the same fedprivopt installed in the Python that runs `ray start` "
                f"there?): {first[0]}"
            ) from None
    check_reports(node_report(data_dir), reports, data_dir, cluster.key)


@contextlib.contextmanager
def join_cluster(config: Any) -> Iterator[Cluster | None]:
    """Connect to the cluster of ``config``'s run, check its nodes, disconnect at the end.

    Yields ``None`` (and does nothing) when the run starts a private Ray instance. A Ray
    session this process already has is used as it is and left connected.

    Raises
    ------
    ValueError
        Naming the key: nothing answers at the address, no node has CPUs, or a node fails
        the start check (:func:`check_reports`).
    """
    joined = check_cluster_config(config)
    if joined is None:
        yield None
        return
    address, key = joined
    import ray

    connected = ray.is_initialized()
    if not connected:
        check_reachable(address, key)
        address = resolve_auto(address, key)  # never Ray's fallback to any local instance
        try:
            # the command's SIGTERM handler stays (ray_processes.ray_keeps_handlers)
            with warnings.catch_warnings(), ray_processes.ray_keeps_handlers():
                # a tip about Ray's future defaults, on every init
                warnings.filterwarnings("ignore", "Tip: In future versions", FutureWarning)
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError) as exc:
            raise ValueError(f"{key}: cannot join the Ray cluster at {address}: {exc}") from None
    try:
        cluster = Cluster(address, key)
        for node in ray.nodes():
            res = node.get("Resources") or {}
            if node.get("Alive") and res.get("CPU", 0) > 0:
                cluster.nodes[node["NodeID"]] = {
                    "ip": node.get("NodeManagerAddress", "?"),
                    "cpus": res["CPU"],
                    "gpus": res.get("GPU", 0),
                }
        if not cluster.nodes:
            raise ValueError(f"{key}: the Ray cluster at {address} has no node with CPUs")
        data_dir = config.task_params.get("data_dir")
        _probe(cluster, None if data_dir is None else str(data_dir))
        _log.info(
            "joined the Ray cluster at %s: %d nodes, %g CPUs, %g GPUs",
            address,
            len(cluster.nodes),
            cluster.cpus,
            cluster.gpus,
        )
        # a head that stops answering ends the run in one line, before Ray ends it with rc 1
        with HeadWatch(address, key) if not connected else contextlib.nullcontext():
            try:
                yield cluster
            finally:
                if not connected:
                    ray.shutdown()  # a driver that joined only disconnects: the cluster stays
    finally:
        if not connected and ray.is_initialized():
            ray.shutdown()  # the start checks failed
