"""Thirty-third review of issue 15, area "reach": Ray shards, clusters, TensorBoard, progress.

Each test failed before its fix (checked against the code before it) and passes after.

1. ``simulate toy.toml --set fast-actors=2 --rounds 2000``, one ``ray::_Shard`` process killed
   with SIGKILL after 30 s (as the kernel's out-of-memory killer or Ray's memory monitor does):
   rc 1 and a 40-line ``ray.exceptions.ActorDiedError`` traceback. Now rc 2 and one line,
   ``fast-actors: shard 2 of 2 ended before it returned its users' updates of round 400
   (ActorDiedError: ...); killed, or out of memory ...? Nothing of the round was released, and
   resuming the run continues from its last checkpoint`` (the run then resumed to 2,000 rounds,
   rc 0). ``fast.shard_result``.
2. A task of one's own whose ``user_data`` raises ``TaskError("user 3's examples are
   damaged")``, ``--set fast-actors=2 --set vectorize=false``: rc 2 with a line of about 1,600
   characters, Ray's text of the remote traceback with terminal colour escapes
   (``\\x1b[36mray::_Shard.train()\\x1b[39m (pid=…) … File "…/fast.py", line 270 …``); in
   process the same run says ``error: user 3's examples are damaged``. Now the shard's error is
   raised as its cause, as in process.
3. Toy ``dim = num-classes = 1000`` (4 MB an update), 600 clients a round, ``fast-actors = 2``,
   ``cohort-chunk = 25``: every chunk of a round was asked of the shards at once, so the object
   store and the driver held the whole cohort's updates: peak RSS 3.2 GB and 2.4 GB of shared
   memory (in process: 0.43 GB; ``cohort-chunk`` bounded nothing). Now at most
   ``IN_FLIGHT * fast-actors`` chunks are asked ahead of the one consumed: 1.18 GB and 0.39 GB,
   the checkpoint and the ledger identical to the bit.
4. ``fast-actors`` up to 256 (and the Flower engine's ``ray-cpus / client-cpus`` client actors,
   up to 256) in a private Ray instance, whatever the memory: each is a process holding torch
   and the task (262 MB a shard, 220-275 MB a Flower client actor, measured for the toy task),
   so ``fast-actors = 200`` on this 2-CPU machine of 23.5 GiB set out to start about 52 GB of
   processes. Now rc 2 before anything is written, ``fast-actors must be an integer in [0, 94]
   on this machine: …`` (``client-cpus must be at least 0.02128 …``), the bound of ``compare
   --jobs`` (``core.memory.processes_that_fit``).
5. ``ray-address = "auto"`` (or ``RAY_ADDRESS=auto``) on a shared machine where ``ray start``
   recorded no cluster: Ray's own ``auto`` falls back to any GCS process ``ps`` lists, and
   ``canonicalize_bootstrap_address("auto")`` gave ``192.0.2.2:38583``, a Flower run's private
   instance of another session (beside a private instance of this one at ``:44477``); the run
   would have placed its shards there, to die with that run. ``docs/SCALING.md`` promises "the
   cluster this machine is a node of (``ray start`` wrote its address here)". Now ``auto`` is
   the address ``ray start`` recorded (``cluster.resolve_auto``), checked as any address; with
   none, rc 2 before anything is written: ``ray-address: auto finds no Ray cluster this machine
   is a node of …``.
6. ``simulate … --set fast-actors=2`` on a CUDA machine (``device = "auto"``, so the shards
   are told ``cuda``): the shards of the private Ray instance asked for no GPU, and Ray hides
   every GPU from an actor that asks for none (``CUDA_VISIBLE_DEVICES=""``; shown here with a
   private instance declaring one GPU: an actor of ``num_cpus=1`` saw ``''``, one of
   ``num_gpus=0.5`` saw ``'0'``), so a shard trained on a device it could not see (not run: no
   GPU on this machine). Now the shards share the machine's GPUs, ``1 / ceil(fast-actors /
   GPUs)`` each (``fast.gpu_share``), as the cluster's shards get a GPU each.
7. ``simulate toy.toml --set fast-actors=1 --set ray-address=127.0.0.1:P``, P a raylet's node
   manager port (a gRPC server, so the twenty-first review's HTTP/2 check passed it; also
   any gRPC service, e.g. a Flower SuperLink): 22 s and 20 lines of Ray's ``gcs_client.cc:205:
   Failed to get cluster ID from GCS server: RpcError: RPC error:  rpc_code: 12`` before the
   one line. Now ``check_reachable`` asks the GCS's ``GetClusterId`` (grpcio, 5 s):
   ``UNIMPLEMENTED`` is rc 2 at once, ``ray-address: 127.0.0.1:P answers gRPC but has no Ray
   GCS service …`` (a real head answers: ``tests/simulation/test_cluster.py``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import pytest
import ray
import torch
from ray.exceptions import ActorDiedError, OutOfMemoryError, RayTaskError

from fedprivopt.cli import main
from fedprivopt.models.task import TaskError
from fedprivopt.simulation import cluster, cluster_config, fast
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.engines import check_flower_resources
from fedprivopt.simulation.fast import make_cohort_train
from fedprivopt.strategies.core import TrainRequest

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"


class _Ref:
    """A stand-in for a Ray object reference: what a fake shard was asked."""

    def __init__(self, log: list, users: list[int]) -> None:
        self.users = users
        log.append(self)


class _Shard:
    def __init__(self, log: list) -> None:
        self.train = self
        self.log = log

    def remote(self, users, *args):
        return _Ref(self.log, list(users))


@pytest.fixture
def fake_shards(monkeypatch):
    """``make_cohort_train(actors=2)`` with shards that answer at once, and Ray's calls faked.

    Returns ``(train, asked, got, answer)``: ``asked`` lists every reference made, ``got`` the
    count of references made but not yet read at each ``ray.get``; ``answer[0]`` is what
    ``ray.get`` does with a reference.
    """
    asked: list[_Ref] = []
    got: list[int] = []
    read: set[int] = set()

    def entries(ref: _Ref):
        return [(u, torch.zeros(2)) for u in ref.users], {}

    answer = [entries]

    def get(ref, timeout=None):
        got.append(len(asked) - len(read))
        read.add(id(ref))
        return answer[0](ref)

    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "put", lambda value: value)
    monkeypatch.setattr(ray, "kill", lambda actor: None)
    shards = [_Shard(asked), _Shard(asked)]
    monkeypatch.setattr(fast, "_ray_actors", lambda *a, **k: (shards, False, None))
    train = make_cohort_train(
        None, device="cpu", chunk_users=5, actors=2, task_name="toy", task_params={}
    )
    return train, asked, got, answer


def _request(users: int) -> TrainRequest:
    return TrainRequest(
        round_num=4, users=list(range(users)), params=torch.zeros(2), preconditioner=None,
        settings=None,
    )  # fmt: skip


def fast_actors_ahead() -> int:
    """Chunks asked of each shard ahead (``fast.IN_FLIGHT``; 2, also where the code had none)."""
    return getattr(fast, "IN_FLIGHT", 2)


def _raising(exc: BaseException):
    def get(ref):
        raise exc

    return get


@pytest.mark.parametrize(
    "exc",
    [ActorDiedError(), OutOfMemoryError("Task was killed due to the node running low on memory.")],
)
def test_1_a_shard_that_died_is_one_value_error_naming_fast_actors(fake_shards, exc):
    train, _, _, answer = fake_shards
    answer[0] = _raising(exc)
    updates = train(_request(12))
    with pytest.raises(ValueError) as info:
        list(updates.items())
    text = str(info.value)
    assert "\n" not in text and text.startswith("fast-actors: shard 1 of 2 ended")
    assert "round 4" in text and type(exc).__name__ in text and "Nothing of the round" in text


def test_2_a_task_error_on_a_shard_is_raised_as_in_process(fake_shards):
    train, _, _, answer = fake_shards
    remote = (
        '\x1b[36mray::_Shard.train()\x1b[39m (pid=1, ip=192.0.2.2)\n  File "fast.py", line 270,'
        " in train\nfedprivopt.models.task.TaskError: user 3's examples are damaged"
    )
    cause = TaskError("user 3's examples are damaged")
    answer[0] = _raising(RayTaskError("train", remote, cause).as_instanceof_cause())
    with pytest.raises(TaskError) as info:
        list(train(_request(12)).items())
    assert str(info.value) == "user 3's examples are damaged"


def test_3_a_round_asks_a_bounded_window_of_chunks_ahead(fake_shards):
    train, asked, got, _ = fake_shards
    pairs = list(train(_request(100)).items())  # chunks of cohort-chunk = 5 users: 20
    assert [u for u, _ in pairs] == list(range(100))
    assert len(asked) == 20 and [r.users for r in asked] == [
        list(range(s, s + 5)) for s in range(0, 100, 5)
    ]
    assert max(got) <= 2 * fast_actors_ahead()  # before: all 20 asked before the first read


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"fast-actors": 5}, "fast-actors must be an integer in \\[0, 4\\] on this machine"),
        ({"engine": "flower", "client-cpus": 0.1, "ray-cpus": 1}, "client-cpus must be at least"),
    ],
)
def test_4_private_ray_workers_are_bounded_by_memory(monkeypatch, overrides, key):
    # 1 GiB: 4 workers
    monkeypatch.setattr(cluster_config, "physical_memory", lambda: 2**30, raising=False)
    config = load_config(TOY, overrides)
    with pytest.raises(ValueError, match=key):
        check_flower_resources(config)  # what simulate, resume and compare check first
    fitting = {**overrides, "fast-actors": 4} if "fast-actors" in overrides else {
        **overrides, "client-cpus": 0.25}  # fmt: skip
    check_flower_resources(load_config(TOY, fitting))


def test_4_simulate_refuses_in_one_line_and_writes_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cluster_config, "physical_memory", lambda: 2**30, raising=False)
    out = tmp_path / "run"
    rc = main(["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(out),
               "--set", "fast-actors=5"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "fast-actors must be an integer in [0, 4]" in err[0]
    assert "1.0 GiB of memory" in err[0] and not out.exists()


@pytest.fixture
def recorded(monkeypatch):
    """Set what ``ray start`` recorded on this machine (``None``: nothing)."""
    import ray._private.utils as ray_utils

    def record(address: str | None) -> None:
        monkeypatch.setattr(ray_utils, "read_ray_address", lambda temp_dir=None: address)

    return record


def test_5_auto_with_no_cluster_recorded_is_refused_not_any_local_instance(recorded):
    recorded(None)  # Ray's own auto then takes any GCS that ps lists: another run's Ray
    with pytest.raises(ValueError, match="ray-address: auto finds no Ray cluster this machine"):
        cluster.check_reachable("auto", "ray-address")


def test_5_auto_is_the_address_ray_start_recorded(recorded):
    recorded("127.0.0.1:1")  # a head that has gone: nothing answers there
    with pytest.raises(ValueError, match=r"ray-address = auto \(127.0.0.1:1, recorded by"):
        cluster.check_reachable("auto", "ray-address")
    recorded("not an address")
    with pytest.raises(ValueError, match=r"ray-address \(auto, read from .*got 'not an"):
        cluster.check_reachable("auto", "ray-address")


def test_5_simulate_with_auto_and_no_cluster_is_one_line(recorded, tmp_path, capsys):
    recorded(None)
    out = tmp_path / "run"
    rc = main(["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(out),
               "--set", "fast-actors=1", "--set", "ray-address=auto"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "auto finds no Ray cluster" in err[0]
    assert not out.exists()


@pytest.mark.parametrize(
    ("count", "gpus", "share"), [(2, 1, 0.5), (3, 2, 0.5), (4, 4, 1.0), (5, 2, 1 / 3), (2, 0, 0)]
)
def test_6_shards_of_a_private_instance_share_its_gpus(count, gpus, share):
    assert fast.gpu_share(count, gpus) == pytest.approx(share)


class _Actor:
    """What ``ray.remote`` makes of the shard class here: records each actor's options."""

    made: ClassVar[list[dict]] = []

    def __init__(self, **options) -> None:
        self.options_ = options

    def __call__(self, cls):  # ray.remote(num_cpus=1)(cls)
        return _Actor(**self.options_)

    def options(self, **options):
        return _Actor(**{**self.options_, **options})

    def remote(self, *args):
        _Actor.made.append(self.options_)
        return self


def test_6_a_private_instance_gives_cuda_shards_their_gpu_share(monkeypatch):
    # a machine with one GPU as Ray sees it: Ray hides it from an actor that asks for none
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0, "GPU": 1.0})
    monkeypatch.setattr(ray, "remote", lambda **options: _Actor(**options))
    _Actor.made = []
    kwargs = {"device": "cuda", "vectorize": False, "chunk_users": 4, "secure": False}
    shards, started, placement = fast._ray_actors(2, "toy", {}, kwargs)
    assert len(shards) == 2 and not started and placement is None
    assert [m.get("num_gpus") for m in _Actor.made] == [0.5, 0.5]  # before: none asked
    _Actor.made = []
    fast._ray_actors(2, "toy", {}, {**kwargs, "device": "cpu"})
    assert [m.get("num_gpus", 0) for m in _Actor.made] == [0, 0]


def test_7_a_grpc_port_without_a_gcs_is_refused_at_once():
    import grpc

    server = grpc.server(ThreadPoolExecutor(1))  # serves nothing, as a raylet's port for this
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(ValueError, match="answers gRPC but has no Ray GCS service"):
            cluster.check_reachable(f"127.0.0.1:{port}", "ray-address")
    finally:
        server.stop(None)
