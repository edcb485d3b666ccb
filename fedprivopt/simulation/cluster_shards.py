"""Where the fast engine's shards run in a joined Ray cluster, and whether their GPUs work there.

:func:`place_shards` spreads the fast engine's ``fast-actors`` shards over the nodes of a
:class:`~fedprivopt.simulation.cluster.Cluster` (a placement group, one shard a node where the
nodes allow: ``STRICT_SPREAD``, else ``SPREAD``; one CPU per shard, and one GPU per shard when
the device asks for it; a GPU that torch on its node cannot use is found before any shard
starts, see :func:`gpu_problem`) and gives each shard its actor's options and torch threads
(:class:`ShardPlacement`). Joining the cluster and its start checks:
:mod:`fedprivopt.simulation.cluster`; ``docs/SCALING.md`` is the user's guide.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

from fedprivopt.simulation.cluster import START_TIMEOUT, Cluster

__all__ = ["ShardPlacement", "gpu_problem", "place_shards"]

_log = logging.getLogger(__name__)


@dataclass
class ShardPlacement:
    """Where each shard of the fast engine runs (:func:`place_shards`).

    Attributes
    ----------
    options : list of dict
        Per shard: the ``.options()`` of its actor (scheduling strategy, GPUs).
    threads : list of int
        Per shard: torch threads (its node's CPUs over the shards on that node).
    device : str
        The shards' training device, ``"cuda"`` (one GPU each) or ``"cpu"``.
    group : object
        The placement group (removed by :meth:`remove`).
    """

    options: list[dict[str, Any]]
    threads: list[int]
    device: str
    group: Any

    def remove(self) -> None:
        """Release the placement group's resources."""
        from ray.util import remove_placement_group

        with contextlib.suppress(Exception):
            remove_placement_group(self.group)


def gpu_problem() -> str | None:
    """Why torch in this process cannot train on a GPU, or ``None`` when it can.

    Run in each GPU bundle of the shards' placement (a task holding the bundle's GPU, so Ray
    makes it visible). A node can declare GPUs its torch cannot use (``ray start --num-gpus=1``
    beside a CPU build of torch, or without a driver): thirty-fourth review of issue 15, the
    shards there were told ``cuda`` and every round ended in a traceback, rc 1.
    """
    import torch

    if torch.cuda.is_available():
        return None
    if not torch.backends.cuda.is_built():
        return f"its torch {torch.__version__} is built without CUDA"
    return "torch.cuda.is_available() is false there (no driver or no device)"


def _gpu_problems(group: Any, nodes: dict[int, str], count: int) -> dict[str, str]:
    """:func:`gpu_problem` in each of the ``count`` GPU bundles of ``group``, by node."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    probe = ray.remote(num_cpus=0, num_gpus=1, max_retries=0)(gpu_problem)
    refs = {
        nodes[i]: probe.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=i
            )
        ).remote()
        for i in range(count)
    }
    answers = {node: ray.get(ref, timeout=START_TIMEOUT) for node, ref in refs.items()}
    return {node: why for node, why in answers.items() if why is not None}


STRICT_TIMEOUT = 10.0
"""Seconds to wait for a ``STRICT_SPREAD`` placement (one shard a node) before ``SPREAD``."""


def _placed(bundle: dict[str, float], count: int, cluster: Cluster, gpu: bool) -> Any:
    """A ready placement group of ``count`` bundles, one a node where the nodes allow, or None.

    ``SPREAD`` alone is Ray's best effort: with a node of two CPUs it put two of three shards
    there now and then (a fresh clone's test saw 2 nodes for 3 shards, twice in two sessions),
    so one node's cores trained two shards while another's stayed idle. ``STRICT_SPREAD`` (each
    bundle on its own node) is tried first when the cluster has as many nodes with room for a
    bundle; a node busy with other work leaves it unplaced, and after :data:`STRICT_TIMEOUT`
    seconds ``SPREAD`` places the shards as it can.
    """
    import ray
    from ray.util.placement_group import placement_group

    roomy = [
        n
        for n in cluster.nodes.values()
        if n.get("cpus", 0) >= 1 and (n.get("gpus", 0) >= 1 or not gpu)
    ]
    tries = [("STRICT_SPREAD", STRICT_TIMEOUT)] if 1 < count <= len(roomy) else []
    for strategy, seconds in [*tries, ("SPREAD", START_TIMEOUT)]:
        group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
        try:
            ray.get(group.ready(), timeout=seconds)
            return group
        except Exception:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(group)
    return None


def place_shards(cluster: Cluster, count: int, device: str) -> ShardPlacement:
    """Reserve one CPU (and a GPU, see below) for each of ``count`` shards, spread over nodes.

    The shards get a GPU each when ``device`` is ``cuda[:i]``, or ``auto`` and the cluster has
    at least ``count`` GPUs; otherwise they train on CPUs. Each GPU is checked where it is
    (:func:`gpu_problem`): with ``auto``, a GPU torch cannot use there makes the shards train on
    CPUs; with ``cuda`` it is refused.

    Raises
    ------
    ValueError
        Naming ``fast-actors`` (or ``device``) when the cluster has fewer free CPUs (GPUs) than
        shards, a node's torch cannot use the GPU it declares (``device``), or the placement is
        not ready within :data:`START_TIMEOUT` seconds.
    """
    import ray
    from ray.util.placement_group import placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    free = ray.available_resources()
    where = f"the Ray cluster at {cluster.address}"
    gpu = device.startswith("cuda") or (device == "auto" and cluster.gpus >= count)
    if gpu and free.get("GPU", 0) < count:
        raise ValueError(
            f"device = {device} gives each of fast-actors = {count} shards a GPU, but {where} "
            f"has {free.get('GPU', 0):g} free GPUs (device = cpu trains the shards on CPUs)"
        )
    if free.get("CPU", 0) < count:
        raise ValueError(
            f"fast-actors must be at most the free CPUs of {where} ({free.get('CPU', 0):g}, "
            f"one per shard), got {count}"
        )
    bundle = {"CPU": 1.0, **({"GPU": 1.0} if gpu else {})}
    group = _placed(bundle, count, cluster, gpu)
    if group is None:
        raise ValueError(
            f"fast-actors: {where} could not place {count} shards ({bundle} each) within "
            f"{START_TIMEOUT:g} s"
        )
    nodes = placement_group_table(group)["bundles_to_node_id"]
    problems = _gpu_problems(group, nodes, count) if gpu else {}
    if problems:
        with contextlib.suppress(Exception):
            ray.util.remove_placement_group(group)
        node, why = next(iter(problems.items()))
        name = f"{cluster.nodes.get(node, {}).get('ip', '?')} ({node[:8]})"
        if device == "auto":
            _log.warning("the node %s declares GPUs but %s: the shards train on CPUs", name, why)
            return place_shards(cluster, count, "cpu")
        raise ValueError(
            f"device = {device}: the node {name} declares GPUs to Ray but {why}; declare none "
            "there (ray start --num-gpus=0) or set device = cpu"
        )
    per_node = Counter(nodes.values())
    threads = []
    for i in range(count):
        node = nodes[i]
        cpus = cluster.nodes.get(node, {}).get("cpus", 1)
        threads.append(max(1, int(cpus // per_node[node])))
    options = [
        {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=i
            ),
            "num_gpus": 1 if gpu else 0,
        }
        for i in range(count)
    ]
    return ShardPlacement(options, threads, "cuda" if gpu else "cpu", group)
