"""Both engines join an existing Ray cluster: three nodes simulated on this machine.

``ray.cluster_utils.Cluster`` starts a head (two CPUs) and two more nodes (one CPU each), each a
raylet of its own with a custom resource and one declared GPU, sharing this machine's file
system. The fast engine's three shards must land on three nodes (the head has room for two: a
packed placement would put two there) and give the in-process model bit for bit: every user's
update is computed from the same inputs and keys, the tag model's per-user work does not depend
on the thread count (two on the head's shard, one elsewhere and in process; measured equal), and
the driver consumes the updates in user order whatever the chunking. The Flower engine joins the
same cluster (through ``RAY_ADDRESS``). The cluster is shut down when the module ends, failed or
not; the runs themselves only disconnect from it."""

import logging
import time

import pytest
import torch

from fedprivopt.simulation import cluster as cluster_module
from fedprivopt.simulation import cluster_shards
from fedprivopt.simulation.run import simulate
from tests.simulation.test_fast import so_config

NODES = 3


@pytest.fixture(scope="module")
def so_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("so-cluster")


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # pragma: no cover - a leftover session would be used instead
        ray.shutdown()
    store = 80 * 2**20  # bytes of object store per node (Ray's minimum is 75 MiB)
    cluster = Cluster()
    try:
        for i in range(NODES):
            cluster.add_node(
                num_cpus=2 if i == 0 else 1,  # room for two shards on the head: spread, not packed
                num_gpus=1,  # declared only: Ray counts GPUs, the shards here train on the CPU
                resources={f"node{i}": 1},
                object_store_memory=store,
                include_dashboard=False,
            )
        cluster.wait_for_nodes()
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def _config(so_dir, **extra):
    base = {"ray-cpus": 0, "num-server-rounds": 2, "cohort-chunk": 2, "device": "cpu"}
    return so_config(so_dir, **{**base, **extra})


@pytest.fixture(scope="module")
def local(so_dir, tmp_path_factory):
    """The in-process run (no Ray) that both engines must reproduce."""
    return simulate(_config(so_dir), tmp_path_factory.mktemp("local") / "run")


def _node_ids(ray_cluster) -> set[str]:
    return {node.node_id for node in ray_cluster.list_all_nodes()}


def test_fast_engine_shards_run_on_every_node_and_give_the_in_process_model(
    tmp_path, so_dir, local, ray_cluster, caplog, monkeypatch
):
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    stats = []
    real_place = cluster_shards.place_shards

    def place(cluster, count, device):
        placement = real_place(cluster, count, device)
        stats.append(placement)
        return placement

    monkeypatch.setattr(cluster_shards, "place_shards", place)
    caplog.set_level(logging.INFO, logger="fedprivopt.simulation")
    joined = _config(so_dir, **{"fast-actors": NODES, "ray-address": ray_cluster.address})
    sharded = simulate(joined, tmp_path / "sharded")
    assert torch.equal(sharded.params, local.params)
    assert sharded.epsilon == local.epsilon
    assert [r["accepted"] for r in sharded.rows] == [r["accepted"] for r in local.rows]
    # every shard on its own node, each having trained chunks (read from the shard actors)
    # one shard per node, though the head has room for two (a packed placement would use it)
    assert len(stats) == 1 and sorted(stats[0].threads) == [1, 1, 2]
    assert stats[0].device == "cpu"
    record = [r for r in caplog.records if "chunks per node" in r.getMessage()]
    assert len(record) == 1
    per_node = record[0].args[2]
    assert len(per_node) == NODES and all(c >= 1 for c in per_node.values())
    assert {n[:8] for n in _node_ids(ray_cluster)} == set(per_node)
    assert any(
        f"joined the Ray cluster at {ray_cluster.address}: 3 nodes" in r.getMessage()
        for r in caplog.records
    )
    # the run disconnected and left the cluster running
    assert not ray.is_initialized()
    assert all(node.remaining_processes_alive() for node in ray_cluster.list_all_nodes())


def test_flower_engine_joins_the_cluster_through_ray_address(
    tmp_path, so_dir, local, ray_cluster, caplog, monkeypatch
):
    import ray

    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    caplog.set_level(logging.INFO, logger="fedprivopt.simulation")
    flower = simulate(_config(so_dir, engine="flower"), tmp_path / "flower")
    assert flower.rounds_completed == 2
    # the Flower engine's model equals the fast engine's to float rounding (tests/simulation/
    # test_fast.py: the same tolerance on a private Ray instance)
    torch.testing.assert_close(flower.params, local.params, rtol=0, atol=1e-5)
    assert flower.epsilon == local.epsilon
    assert any(
        f"joined the Ray cluster at {ray_cluster.address}" in r.getMessage() for r in caplog.records
    )
    assert not ray.is_initialized()
    assert all(node.remaining_processes_alive() for node in ray_cluster.list_all_nodes())


def test_a_node_that_sees_other_data_is_refused_before_any_round(
    tmp_path, so_dir, ray_cluster, monkeypatch
):
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    real = cluster_module.data_fingerprint

    def this_machine(path):  # the driver's view differs; the nodes run the real function
        seen = real(path)
        return None if seen is None else {**seen, "sha256": "0" * 64}

    monkeypatch.setattr(cluster_module, "data_fingerprint", this_machine)
    joined = _config(so_dir, **{"fast-actors": 2, "ray-address": ray_cluster.address})
    with pytest.raises(ValueError, match=r"task-params\.data-dir: the node .* sees other data"):
        simulate(joined, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    assert not ray.is_initialized()


def _gpus_this_torch_cannot_use(cluster) -> None:
    """Thirty-fourth review of issue 15: nodes that declare GPUs their torch cannot use.

    The nodes here declare one GPU each beside this CPU build of torch. Before, ``device =
    auto`` (or ``cuda``) told the shards ``cuda`` and each round ended in torch's traceback,
    rc 1. Now each GPU bundle is checked where it is (``cluster.gpu_problem``): ``auto`` trains
    on the CPUs and says why, ``cuda`` is refused naming the device, the node and the way out.
    """
    if torch.cuda.is_available():  # pragma: no cover - on a CUDA machine they are usable
        return
    placement = cluster_shards.place_shards(cluster, 2, "auto")
    try:
        assert placement.device == "cpu"
        assert all(o["num_gpus"] == 0 for o in placement.options)
    finally:
        placement.remove()
    with pytest.raises(ValueError, match=r"device = cuda: the node .* declares GPUs to Ray but"):
        cluster_shards.place_shards(cluster, 2, "cuda")


def _wait_resources_free(ray, seconds: float = 60.0) -> None:
    """Wait until every CPU and GPU of the cluster is free again (killed actors, a removed group).

    ``ray.kill`` and ``remove_placement_group`` free their resources asynchronously; a ``SPREAD``
    placement made meanwhile may put two shards on one node (a fresh clone's ``make test`` saw
    2 nodes for 3 shards once, this session).
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        total, free = ray.cluster_resources(), ray.available_resources()
        if all(free.get(k, 0) >= total.get(k, 0) for k in ("CPU", "GPU")):
            return
        time.sleep(0.2)


def test_shards_get_a_gpu_each_where_the_nodes_have_them(so_dir, ray_cluster, monkeypatch):
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    joined = _config(so_dir, **{"fast-actors": NODES, "ray-address": ray_cluster.address})

    @ray.remote(num_cpus=1)
    class Where:
        def where(self):
            return ray.get_runtime_context().get_node_id(), ray.get_gpu_ids()

    with cluster_module.join_cluster(joined) as cluster:
        assert cluster.gpus == NODES
        _gpus_this_torch_cannot_use(cluster)
        # from here the declared GPUs count as usable where the shards land
        monkeypatch.setattr(cluster_shards, "_gpu_problems", lambda *args: {})
        for device, gpus in (("auto", 1), ("cpu", 0)):
            _wait_resources_free(ray)  # else the SPREAD may find a node still busy
            placement = cluster_shards.place_shards(cluster, NODES, device)
            try:
                assert placement.device == ("cuda" if gpus else "cpu")
                actors = [Where.options(**o).remote() for o in placement.options]
                seen = ray.get([a.where.remote() for a in actors], timeout=120)
                assert len({node for node, _ in seen}) == NODES  # one shard on each node
                assert all(len(ids) == gpus for _, ids in seen)
                for actor in actors:
                    ray.kill(actor)
            finally:
                placement.remove()
        # more shards than GPUs: "auto" trains on CPUs, and then the CPUs are too few
        with pytest.raises(ValueError, match="fast-actors must be at most the free CPUs"):
            cluster_shards.place_shards(cluster, NODES + 2, "auto")
        with pytest.raises(ValueError, match="device = cuda gives each of fast-actors = 4"):
            cluster_shards.place_shards(cluster, NODES + 1, "cuda")
    assert not ray.is_initialized()
