"""The fast engine's client side: a cohort's updates, trained in process (or on Ray actors).

:func:`make_cohort_train` returns the ``train`` callable that
:func:`~fedprivopt.strategies.core.drive_round` calls with each :class:`~fedprivopt.strategies.
core.TrainRequest`. It answers with :class:`StreamedUpdates`: the users' updates are produced in
user order *while the aggregator consumes them*, so a round never holds more than one chunk of
updates (a dense 5,000,500-parameter update is 20 MB; 1,000 of them would be 20 GB).

Three trainers produce the updates (:mod:`fedprivopt.simulation.fast_trainer`), all computing
the same clipped updates from the same keyed generators (so the same model, up to float
rounding, as the Flower engine):

``vectorized`` (default when the task has one)
    The task's cohort trainer (``task.cohort_trainer``), e.g. the row-sparse
    :class:`~fedprivopt.models.tag_prediction_cohort.TagCohortTrainer`: a chunk of users is
    trained at once and its updates reach the aggregator as one
    :class:`~fedprivopt.privacy.sparse.RowSparseBatch` (checked and re-clipped user by user);
    or :class:`~fedprivopt.models.next_word_cohort.NextWordCohortTrainer`, whose dense updates
    reach it as ``(user, update)`` pairs (it adds distributed-noise shares too: ``noise_shares``).
``sequential``
    :class:`~fedprivopt.clients.LocalTrainer`, one user at a time (any task; distributed-noise
    mode, whose noise shares are dense).
``ray``
    Either of the above inside ``fast-actors`` Ray actors, each holding its own copy of the task;
    the cohort is cut into chunks that the actors train in parallel and the driver consumes in
    user order. In a Ray cluster the run joined (``ray-address``) the actors are spread over its
    nodes, a GPU each where the device asks for one (:mod:`fedprivopt.simulation.cluster`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fedprivopt.privacy.sparse import RowSparseBatch
from fedprivopt.simulation.fast_trainer import UserTrainer  # also public here (DESIGN.md)
from fedprivopt.strategies.core import TrainRequest

__all__ = [
    "IN_FLIGHT",
    "StreamedUpdates",
    "UserTrainer",
    "gpu_share",
    "make_cohort_train",
    "shard_result",
]

_log = logging.getLogger(__name__)

_ESCAPES = re.compile(r"\x1b\[[0-9;]*m")
"""Terminal colour escapes, which Ray writes into the text of a remote error."""

MAX_ERROR_CHARS = 300
"""Characters of a shard's error shown in the one line that ends the run."""

IN_FLIGHT = 2
"""Chunks asked of each ``fast-actors`` shard ahead of the one the aggregator consumes.

Thirty-third review of issue 15: every chunk of a round was asked at once, so the object store
and the driver held the whole cohort's updates: toy ``dim = num-classes = 1000`` (4 MB an
update), 600 clients a round, ``fast-actors = 2``, ``cohort-chunk = 25``: 3.2 GB peak RSS and
2.4 GB of Ray's shared memory, against 0.43 GB in process (``cohort-chunk`` bounded nothing);
now 1.2 GB and 0.4 GB, the model and the ledger the same to the bit. At most ``IN_FLIGHT *
fast-actors`` chunks of at most ``cohort-chunk`` users are asked ahead of the one consumed.
"""


class StreamedUpdates:
    """The updates of one request, trained on demand in increasing user order.

    A read-once mapping for :meth:`~fedprivopt.strategies.ServerAlgorithm.aggregate`:
    ``items()`` trains and yields ``(user, update)`` pairs one chunk at a time. With adaptive
    clipping :attr:`clip_bits` fills with each trained user's clip report as it is trained.
    """

    sorted_by_user = True

    def __init__(
        self,
        users: list[int],
        produce: Callable[[list[int]], Iterator[tuple[int, Any]]],
        *,
        clip_bits: dict[int, float] | None = None,
    ):
        self.users = sorted(int(u) for u in users)
        self._produce = produce
        self._consumed = False
        self.clip_bits: dict[int, float] = {} if clip_bits is None else clip_bits

    def __len__(self) -> int:
        return len(self.users)

    def __iter__(self) -> Iterator[int]:
        return iter(self.users)

    def keys(self) -> list[int]:
        """The requested users, sorted."""
        return list(self.users)

    def items(self) -> Iterator[tuple[int, Any]]:
        """Train and yield ``(user, update)`` in user order (once)."""
        entries = self.entries()

        def pairs() -> Iterator[tuple[int, Any]]:
            for entry in entries:
                if isinstance(entry, RowSparseBatch):
                    yield from entry.split()
                else:
                    yield entry

        return pairs()

    def entries(self) -> Iterator[tuple[int, Any] | RowSparseBatch]:
        """Train and yield ``(user, update)`` pairs or batches of users, in user order (once).

        What :meth:`~fedprivopt.privacy.NoisyMeanAggregator.aggregate` consumes. A batch is
        valid until the next entry is requested (its trainer reuses the memory).
        """
        if self._consumed:
            raise RuntimeError("StreamedUpdates can be read once")
        self._consumed = True
        return self._produce(self.users)


def shard_result(ref: Any, shard: int, shards: int, round_num: int) -> Any:
    """What shard ``shard`` (0-based, of ``shards``) returned for ``ref``, a chunk of a round.

    An error of the task on the shard is raised as it would be in process (the cause Ray
    wrapped, e.g. a :class:`~fedprivopt.models.task.TaskError`: one line, not Ray's text of
    the remote traceback). A shard that died (killed, out of memory, its node lost) is a
    ``ValueError`` naming ``fast-actors``: nothing of the round was released, the run resumes.
    Thirty-third review of issue 15: a shard killed by SIGKILL (as the kernel's out-of-memory
    killer does) ended the run in a 40-line ``ActorDiedError`` traceback (rc 1), and a task's
    ``TaskError`` on a shard in one line of 1,600 characters with terminal escapes.

    A shard that could not build the task (Ray's ``actor_init_failed``) is a ``ValueError``
    naming the error it raised. Thirty-fourth review of issue 15: a shard whose ``build_task``
    raised (a task's module missing on a cluster's node, the installed package changed during a
    long run: ``ImportError: cannot import name …``, a ``MemoryError``) was reported with
    Ray's terminal colour escapes (``ESC[36mray::_Shard.__init__()ESC[39m (pid=…``), cut
    before the error, as "killed, or out of memory?".
    """
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(cause, Exception):
            if not isinstance(cause, ray.exceptions.RayError):
                raise cause from None  # the task's own error, as in process
            exc = cause
        lines = _ESCAPES.sub("", str(exc)).strip().splitlines() or [""]
        if getattr(exc, "actor_init_failed", False):
            # Ray's text of the shard's creation error ends with the error itself
            error = lines[-1].strip()
            error = error if len(error) <= MAX_ERROR_CHARS else error[: MAX_ERROR_CHARS - 1] + "…"
            raise ValueError(
                f"fast-actors: shard {shard + 1} of {shards} could not build the task "
                f"({error}), which this process built: its process "
                "or node differs (a module or package of another version or missing there, "
                "too little memory); nothing of round "
                f"{round_num} was released, and resuming the run continues from its last "
                "checkpoint"
            ) from None
        first = lines[0]
        raise ValueError(
            f"fast-actors: shard {shard + 1} of {shards} ended before it returned its users' "
            f"updates of round {round_num} ({type(exc).__name__}: {first}); killed, or out of "
            "memory (each shard holds its own copy of the task)? Nothing of the round was "
            "released, and resuming the run continues from its last checkpoint"
        ) from None


def gpu_share(count: int, gpus: float) -> float:
    """The GPUs each of ``count`` shards of a private Ray instance with ``gpus`` GPUs asks for.

    ``1 / ceil(count / gpus)``: every shard a GPU, or a fraction of one (Ray packs fractions of
    one GPU on one GPU), ``0`` without GPUs (the shards train on CPUs). Thirty-third review of
    issue 15: the shards asked for none, and Ray hides every GPU from an actor that asks for
    none (``CUDA_VISIBLE_DEVICES=""``, Ray's ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO`` default),
    while ``device = "auto"`` on a CUDA machine told them to train on ``cuda``: a shard saw no
    GPU (shown on this CPU machine with a private instance declaring one GPU: an actor of
    ``num_cpus=1`` got ``CUDA_VISIBLE_DEVICES=''``, one of ``num_gpus=0.5`` got ``'0'``).
    """
    whole = int(gpus)
    return 0.0 if whole < 1 or count < 1 else 1.0 / math.ceil(count / whole)


def _ray_actors(
    count: int,
    task_name: str,
    task_params: dict,
    trainer_kwargs: dict,
    cluster=None,
    ray_cpus: int = 0,
) -> tuple[list, bool, Any]:
    """``count`` shard actors, whether Ray was started here, and their placement.

    In a joined cluster (``cluster``, :class:`~fedprivopt.simulation.cluster.Cluster`) the
    shards are spread over its nodes (:func:`~fedprivopt.simulation.cluster_shards.place_shards`);
    otherwise a private Ray instance with ``ray_cpus`` CPUs (``0``: ``count``, one per shard) is
    started unless this process has one (then the caller shuts it down), and each shard trains
    with ``ray_cpus // count`` torch threads (``0``: this machine's CPUs over ``count``).
    Thirty-fourth review of issue 15: ``ray-cpus`` was ignored here, so ``fast-actors = 2``
    with ``ray-cpus = 1`` gave Ray 2 CPUs and ``fast-actors = 2`` with ``ray-cpus = 2`` on 16
    cores 8 torch threads a shard (:class:`~fedprivopt.simulation.config.RunConfig` refuses
    fewer ``ray-cpus`` than shards).
    """
    import ray

    placement = None
    cuda = trainer_kwargs["device"].startswith("cuda")
    started = cluster is None and not ray.is_initialized()
    if started:
        with warnings.catch_warnings():  # a tip about Ray's future defaults, on every init
            warnings.filterwarnings("ignore", "Tip: In future versions", FutureWarning)
            ray.init(
                address="local",  # never a cluster that RAY_ADDRESS names: ray-address joins one
                num_cpus=max(count, ray_cpus, 1),
                num_gpus=torch.cuda.device_count() if cuda else 0,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
    share = 0.0
    if cluster is not None:
        from fedprivopt.simulation.cluster_shards import place_shards

        placement = place_shards(cluster, count, trainer_kwargs["device"])
        trainer_kwargs = {**trainer_kwargs, "device": placement.device}
    elif cuda:
        share = gpu_share(count, ray.cluster_resources().get("GPU", 0))
        trainer_kwargs = {**trainer_kwargs, "device": "cuda" if share else "cpu"}

    @ray.remote(num_cpus=1)
    class _Shard:
        def __init__(self, threads: int) -> None:
            from fedprivopt.core.memory import keep_freed_memory
            from fedprivopt.models import build_task

            keep_freed_memory()  # as the in-process engine (core/memory.py)
            torch.set_num_threads(threads)
            self.trainer = UserTrainer(build_task(task_name, **task_params), **trainer_kwargs)
            self.chunks = 0

        def train(self, *args: Any) -> list[tuple[int, Any]]:
            self.chunks += 1
            return self.trainer.train_list(*args)

        def stats(self) -> tuple[str, int]:
            """The node id of this shard and the chunks it trained."""
            return ray.get_runtime_context().get_node_id(), self.chunks

    if placement is None:
        threads = max(1, (ray_cpus or os.cpu_count() or 1) // count)
        shards = [_Shard.options(num_gpus=share).remote(threads) for _ in range(count)]
    else:
        shards = [
            _Shard.options(**options).remote(threads)
            for options, threads in zip(placement.options, placement.threads, strict=True)
        ]
    return shards, started, placement


def make_cohort_train(
    task,
    *,
    device: str,
    vectorize: bool = True,
    chunk_users: int = 256,
    secure: bool = False,
    actors: int = 0,
    task_name: str | None = None,
    task_params: dict | None = None,
    cluster=None,
    ray_cpus: int = 0,
) -> Callable[[TrainRequest], StreamedUpdates]:
    """The fast engine's ``train`` callable for :func:`~fedprivopt.strategies.core.drive_round`.

    Parameters
    ----------
    task : Task
        The task (used in process; actors rebuild it from ``task_name`` and ``task_params``).
    device, vectorize, chunk_users, secure
        See :class:`UserTrainer`.
    actors : int
        Ray actors to shard over (``0``: in process).
    task_name, task_params : optional
        How actors build the task (required when ``actors > 0``).
    cluster : Cluster, optional
        The Ray cluster the run joined (:func:`~fedprivopt.simulation.cluster.join_cluster`):
        the actors are spread over its nodes, with a GPU each where ``device`` asks for one.
        When the run ends, the callable's ``close()`` logs the chunks each node trained and
        keeps them in its ``shard_stats`` (node id, chunks).
    ray_cpus : int
        CPUs of the private Ray instance the actors start, at least ``actors`` (``0``: one per
        actor); also split into the actors' torch threads (``ray-cpus``).
    """
    kwargs = {
        "device": device,
        "vectorize": vectorize,
        "chunk_users": chunk_users,
        "secure": secure,
    }
    if actors <= 0:
        local = UserTrainer(task, **kwargs)

        def train(request: TrainRequest) -> StreamedUpdates:
            bits: dict[int, float] = {}

            def produce(users: list[int]) -> Iterator[tuple[int, Any]]:
                return local.train(
                    users,
                    request.round_num,
                    request.params,
                    request.preconditioner,
                    request.settings,
                    request.stream,
                    bits,
                )

            return StreamedUpdates(request.users, produce, clip_bits=bits)

        return train

    if task_name is None or task_params is None:
        raise ValueError("task_name and task_params are required when actors > 0")
    import ray

    shards, started, placement = _ray_actors(
        actors, task_name, dict(task_params), kwargs, cluster, ray_cpus
    )

    def train_ray(request: TrainRequest) -> StreamedUpdates:
        bits: dict[int, float] = {}

        def produce(users: list[int]) -> Iterator[tuple[int, Any]]:
            params = ray.put(request.params)
            precond = None if request.preconditioner is None else ray.put(request.preconditioner)
            step = max(1, min(chunk_users, -(-len(users) // len(shards))))
            starts = range(0, len(users), step)

            def submit(i: int) -> Any:
                return shards[i % len(shards)].train.remote(
                    users[starts[i] : starts[i] + step],
                    request.round_num,
                    params,
                    precond,
                    request.settings,
                    request.stream,
                )

            window = IN_FLIGHT * len(shards)
            pending = deque(submit(i) for i in range(min(window, len(starts))))
            for i in range(len(starts)):
                entries, reported = shard_result(
                    pending.popleft(), i % len(shards), len(shards), request.round_num
                )
                if i + window < len(starts):
                    pending.append(submit(i + window))
                bits.update(reported)
                yield from entries

        return StreamedUpdates(request.users, produce, clip_bits=bits)

    def close() -> None:
        if cluster is not None:
            with contextlib.suppress(Exception):  # a record: a dead shard must not fail the run
                train_ray.shard_stats = ray.get([s.stats.remote() for s in shards], timeout=60)
                chunks = Counter()
                for node, count in train_ray.shard_stats:
                    chunks[node[:8]] += count
                _log.info(
                    "fast-actors: %d shards on %d nodes of the cluster, chunks per node: %s",
                    len(shards),
                    len(chunks),
                    dict(chunks),
                )
        for shard in shards:
            ray.kill(shard)
        if placement is not None:
            placement.remove()
        if started:  # leave no Ray behind (a later Flower simulation starts its own)
            ray.shutdown()

    train_ray.close = close  # type: ignore[attr-defined]
    train_ray.shard_stats = []  # type: ignore[attr-defined]
    return train_ray
