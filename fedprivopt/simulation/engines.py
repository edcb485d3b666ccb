"""The two engines: both drive the rounds of one :class:`~fedprivopt.strategies.ServerAlgorithm`.

- :func:`run_fast`: in process, every cohort trained by
  :func:`~fedprivopt.simulation.fast.make_cohort_train` (vectorized, or one
  :class:`~fedprivopt.clients.LocalTrainer` per user; optionally on Ray actors);
- :func:`run_flower`: Flower's simulation engine (Ray), the ServerApp running :func:`serve_flower`,
  which the deployment ServerApp runs too.

Each returns why the run stopped (``"rounds"``, ``"budget"``, ...); every round reaches the
:class:`~fedprivopt.simulation.writer.RunWriter`.
"""

from __future__ import annotations

import os
import threading
import time

import torch

from fedprivopt.core.memory import keep_freed_memory, physical_memory
from fedprivopt.models.task import Task, model_spec
from fedprivopt.simulation import interrupt, ray_processes
from fedprivopt.simulation.cluster import Cluster, join_cluster
from fedprivopt.simulation.cluster_config import check_cluster_config
from fedprivopt.simulation.config import MAX_FAST_ACTORS, RunConfig
from fedprivopt.simulation.fast import make_cohort_train
from fedprivopt.simulation.writer import RunWriter
from fedprivopt.strategies.core import ServerAlgorithm, drive_round

__all__ = [
    "FLOWER_NODE_MEMORY",
    "SERVER_STOP_WAIT",
    "check_device",
    "check_flower_cluster",
    "check_flower_nodes",
    "check_flower_resources",
    "run_fast",
    "run_flower",
    "serve_flower",
]


def _device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


SMALL_MODEL = 200_000  # parameters below which one CPU thread beats several (op overhead)


def run_fast(config: RunConfig, task: Task, alg: ServerAlgorithm, writer: RunWriter) -> str:
    """Run the rounds in process (the ``fast`` engine); returns why the run stopped.

    With ``fast-actors`` in a Ray cluster (``ray-address``) the shards are spread over its nodes
    (:func:`~fedprivopt.simulation.cluster.join_cluster` checks them first).
    """
    left = _nothing_left(config, alg)
    if left is not None:
        return left  # no round left: no shard is started for none (see run_flower)
    with join_cluster(config) as cluster:
        return _run_fast(config, task, alg, writer, cluster)


def _nothing_left(config: RunConfig, alg: ServerAlgorithm) -> str | None:
    """Why the run stops before its next round (``"rounds"``, ``"budget"``), else ``None``.

    What the rounds' loops would return at once (:func:`_run_fast`, ``DPStrategy.start``), said
    before an engine starts anything. Forty-second review of issue 15 (processes 3): by
    ``num-server-rounds``; its follow-up (outputs 3): by the budget, where a target epsilon below
    one round's (``--set target-epsilon=0.01``, or a run stopped after its last allowed round)
    started Flower and Ray, 36.6 s, to release nothing.
    """
    if alg.round_num >= config.strategy.num_server_rounds:
        return "rounds"
    return None if alg.budget_allows_next_round() else "budget"


def _run_fast(
    config: RunConfig, task: Task, alg: ServerAlgorithm, writer: RunWriter, cluster: Cluster | None
) -> str:
    train = make_cohort_train(
        task,
        # in a cluster the shards' nodes decide what "auto" means (place_shards), not this one
        device=_device(config.device) if cluster is None else config.device,
        vectorize=config.vectorize,
        chunk_users=config.cohort_chunk,
        secure=config.strategy.secure,
        actors=config.fast_actors,
        task_name=config.task,
        task_params=config.task_params,
        cluster=cluster,
        ray_cpus=config.ray_cpus,
    )
    keep_freed_memory()  # the next round reuses this one's memory (core/memory.py)
    threads = torch.get_num_threads()
    if alg.params.numel() < SMALL_MODEL:
        # measured on 2 cores: 5.7 ms per toy user with 1 thread, 45 ms with 2 (contention)
        torch.set_num_threads(1)
    try:
        for r in range(alg.round_num + 1, config.strategy.num_server_rounds + 1):
            if not alg.budget_allows_next_round():
                return "budget"
            result = drive_round(alg, r, train)
            metrics = writer.evaluate(alg.output_params()) if writer.wants_eval(r) else None
            writer.on_round(result, metrics)
        return "rounds"
    finally:
        torch.set_num_threads(threads)
        close = getattr(train, "close", None)
        if close is not None:
            close()


def serve_flower(
    grid,
    config: RunConfig,
    task: Task,
    alg: ServerAlgorithm,
    writer: RunWriter,
    *,
    min_nodes: int = 1,
    stop_at_task_error: bool = False,
) -> str:
    """Run the rounds of ``alg`` through a Flower ``grid`` (inside a ServerApp's main).

    Used by the simulation engine and by the deployment ServerApp. Central evaluation follows
    ``eval-every``; every round reaches ``writer``. Returns why the run stopped.
    ``stop_at_task_error``: see :class:`~fedprivopt.strategies.flower.DPStrategy` (the
    simulation engine's nodes all run the same task on the same data).
    """
    from flwr.app import MetricRecord

    from fedprivopt.strategies.flower import DPStrategy, flat_to_arrays

    spec = model_spec(task)

    def evaluate_fn(server_round: int, arrays) -> MetricRecord | None:
        # ``arrays`` is the released iterate, alg.params; with ema-decay the average is evaluated
        if server_round == 0 or not writer.wants_eval(server_round):
            return None
        return MetricRecord(writer.evaluate(alg.output_params()))

    strategy = DPStrategy(
        alg,
        spec,
        min_nodes=min_nodes,
        on_round=writer.on_round,
        stop_at_task_error=stop_at_task_error,
    )
    writer.last_time = time.perf_counter()
    strategy.start(
        grid,
        flat_to_arrays(alg.params, spec),
        num_rounds=config.strategy.num_server_rounds,
        timeout=float(config.round_timeout),
        evaluate_fn=evaluate_fn,
    )
    return alg.stopped_reason or "rounds"


def _ray_cpus(config: RunConfig) -> int:
    """The CPUs the Flower engine gives Ray: ``ray-cpus``, or every CPU of this machine."""
    return config.ray_cpus or (os.cpu_count() or 1)


def check_flower_resources(config: RunConfig) -> None:
    """Refuse a ``device`` this machine lacks, and client resources no Ray actor could get.

    ``device = "cuda[:i]"`` needs torch to see a CUDA device ``i`` (any engine; otherwise a
    traceback from torch's lazy CUDA init, sixth review of issue 15). Each simulated client of the
    ``flower`` engine is a Ray actor asking for ``client-cpus`` CPUs and ``client-gpus`` GPUs; Ray
    has :func:`_ray_cpus` CPUs and the GPUs torch sees. A request above that leaves the actor pool
    empty, and Flower then failed after 10-17 s with a traceback ("ActorPool is empty", issue
    15). Checked before anything is written or Ray starts.

    A run that joins a Ray cluster (``ray-address``) trains on the cluster's nodes, not here:
    only :func:`~fedprivopt.simulation.cluster_config.check_cluster_config` is made here, and the
    resources are checked against the nodes when the run joins
    (:func:`~fedprivopt.simulation.cluster.join_cluster`, :func:`check_flower_cluster`).

    Raises
    ------
    ValueError
        Naming ``population`` (:func:`check_flower_nodes`, also with ``ray-address``),
        ``device``, ``ray-cpus`` (also with ``fast-actors``), ``client-cpus`` or
        ``client-gpus`` and its valid range on this machine; the engine, or ``fast-actors``,
        where this process may open too few files for Ray
        (:func:`~fedprivopt.simulation.ray_processes.enough_open_files`, which first raises
        the soft limit within the hard one).
    """
    check_flower_nodes(config)
    if check_cluster_config(config) is not None:
        return
    check_device(config)
    machine = os.cpu_count() or 1
    if config.engine != "flower" and not config.fast_actors:
        return  # in process: no Ray
    starts_ray = 'engine = "flower"' if config.engine == "flower" else "fast-actors"
    ray_processes.enough_open_files(starts_ray)
    ray_processes.enough_address_space(starts_ray)
    ray_processes.check_ray_temp_dir(starts_ray)
    if config.ray_cpus > machine:  # Ray would start a pool sized for CPUs that are not there
        zero = (
            "one CPU a shard"
            if config.engine == "fast"
            else f"all of this machine's {machine} CPUs"
        )
        raise ValueError(
            f"ray-cpus must be an integer in [0, {machine}] (0: {zero}), got {config.ray_cpus}"
        )
    if config.engine != "flower":
        return
    cpus = _ray_cpus(config)
    low = cpus / MAX_FAST_ACTORS  # Flower starts cpus / client-cpus actors, each with the task
    if not low <= config.client_cpus <= cpus:
        given = f"ray-cpus = {cpus}" if config.ray_cpus else f"this machine's {cpus} CPUs"
        raise ValueError(
            f"client-cpus must be a number in [{low:g}, {cpus}] (Ray is given {given}; at "
            f"most {MAX_FAST_ACTORS} clients at once), got {config.client_cpus:g}"
        )
    gpus = torch.cuda.device_count() if config.client_gpus > 0 else 0
    if config.client_gpus > gpus:
        raise ValueError(
            f"client-gpus must be a number in [0, {gpus}] (the GPUs torch finds on this "
            f"machine), got {config.client_gpus:g}: no client could start"
        )


FLOWER_NODE_MEMORY = 8 * 2**10
"""Bytes of this process's memory one simulated SuperNode of the ``flower`` engine takes.

Flower's simulation keeps every node's state, context and messages in the driver (also with
``ray-address``); measured: 1.35 GB for 200,000 nodes (toy task) during the user query, about
5 kB a node above the process's start."""


def check_flower_nodes(config: RunConfig) -> None:
    """Refuse a ``flower`` run whose simulated SuperNodes (one per user) exceed this machine.

    Thirty-third review of issue 15: ``population`` (up to 10**8) was not bounded on the Flower
    engine, which starts one SuperNode per user: 200,000 users held 1.35 GB and had not
    finished the user query after 4 minutes, 10**7 would take about 50 GB (the fast engine runs
    them in 0.44 GB).

    Raises
    ------
    ValueError
        Naming ``population`` and the most this machine's memory holds.
    """
    if config.engine != "flower":
        return
    memory = physical_memory()
    most = memory // FLOWER_NODE_MEMORY
    if 0 < most < config.strategy.population:
        raise ValueError(
            f"population must be at most {most} on the flower engine (one simulated SuperNode "
            f"per user, about {FLOWER_NODE_MEMORY // 2**10} kB each in this process: this "
            f"machine's {memory / 2**30:.1f} GiB of memory), got {config.strategy.population}; "
            f"the fast engine runs any population"
        )


def check_device(config: RunConfig) -> None:
    """Refuse a ``device = "cuda[:i]"`` that torch does not find on this machine.

    Every engine trains here (without ``ray-address``), and so do the SuperNodes of
    ``fedprivopt deploy local`` (thirty-third review of issue 15: ``deploy local --set
    device='"cuda"'`` on a machine without CUDA started, every ClientApp failed the user query
    with torch's "Torch not compiled with CUDA enabled", and after 120 s the run released two
    noise-only rounds, every user on no node, rc 0, where ``simulate`` refuses it).

    Raises
    ------
    ValueError
        Naming ``device`` and the devices of this machine.
    """
    if not config.device.startswith("cuda"):
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(config.device.partition(":")[2] or 0)
    if count == 0:
        raise ValueError(
            f"device must be auto or cpu on this machine (torch finds no CUDA device), "
            f"got {config.device!r}"
        )
    if index >= count:
        raise ValueError(
            f"device must be auto, cpu or cuda[:i] with i < {count} (the CUDA devices torch "
            f"finds on this machine), got {config.device!r}"
        )


def check_flower_cluster(config: RunConfig, cluster: Cluster) -> None:
    """Refuse client resources that no node of ``cluster`` has (Flower's pool would be empty).

    Flower sizes its actor pool node by node: ``floor(node CPUs / client-cpus)`` actors on each
    node, bounded by ``node GPUs / client-gpus`` when ``client-gpus > 0``.

    Raises
    ------
    ValueError
        Naming ``client-cpus`` or ``client-gpus`` and what the largest node has.
    """
    cpus = max(n["cpus"] for n in cluster.nodes.values())
    where = f"one node of the Ray cluster at {cluster.address}"
    if not 0 < config.client_cpus <= cpus:
        raise ValueError(
            f"client-cpus must be a number in (0, {cpus:g}] (the most CPUs of {where}), got "
            f"{config.client_cpus:g}"
        )
    if config.client_gpus > 0:
        fits = [n for n in cluster.nodes.values() if n["cpus"] >= config.client_cpus]
        gpus = max(n["gpus"] for n in fits)
        if config.client_gpus > gpus:
            raise ValueError(
                f"client-gpus must be a number in [0, {gpus:g}] (the most GPUs of {where} "
                f"with client-cpus = {config.client_cpus:g}), got {config.client_gpus:g}"
            )


def run_flower(config: RunConfig, task: Task, alg: ServerAlgorithm, writer: RunWriter) -> str:
    """Run the rounds through Flower's simulation engine (Ray).

    Flower runs the ServerApp in a thread of its own that is not a daemon. If the engine ends
    early (Ctrl-C, an error), that thread is stopped through :func:`interrupt.stoppable_grid`
    at its next call (after the round it is recording) and waited for, so the process can exit.
    A first signal does only that (:func:`interrupt.signals_stop`): the ServerApp returns and
    Flower stops its engine and Ray in its own order; then the run raises
    :class:`interrupt.Interrupted`.

    With ``ray-address`` the run joins that cluster first (:func:`~fedprivopt.simulation.
    cluster.join_cluster`); Flower then finds Ray initialized and uses it (Flower 1.41's
    ``RayBackend.init_ray`` calls ``ray.init(**init_args)`` only when Ray is not initialized,
    and its ``terminate`` calls ``ray.shutdown()``, which in a driver that joined a cluster only
    disconnects). Otherwise Flower starts a private instance (``address = "local"``, so a
    ``RAY_ADDRESS`` is not joined by accident).
    """
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp

    check_flower_resources(config)
    left = _nothing_left(config, alg)
    if left is not None:
        # Forty-second review of issue 15 (processes 3): a run stopped after its last round
        # and before its summary (a signal then; compare's cell 2 by SIGHUP) started Flower and
        # Ray on --resume for no round: 37-41 s, and once Ray's shutdown met a worker still
        # starting, whose 6 lines (`Fatal Python error: Aborted`) reached a --quiet rerun. As
        # the fast engine, nothing is left to run (nor by the budget: its follow-up, outputs 3).
        return left
    app = ServerApp()
    done: list[str] = []
    stop = threading.Event()
    server: list[threading.Thread] = []

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        server.append(threading.current_thread())
        try:
            stoppable = interrupt.stoppable_grid(grid, stop)
            # one user's task error ends the run, as on the fast engine (thirty-third review of
            # issue 15: the run went on without that user)
            done.append(serve_flower(stoppable, config, task, alg, writer, stop_at_task_error=True))
        except interrupt.Stopped:
            pass  # the engine was stopped: the main thread reports why

    with join_cluster(config) as cluster:
        if cluster is None:
            init = {"address": "local", "num_cpus": _ray_cpus(config)}
        else:
            check_flower_cluster(config, cluster)
            init = {"address": cluster.address}
        _simulate(config, task, app, init, stop, server)
    if not done:
        raise RuntimeError("the Flower simulation ended without finishing the run (see its log)")
    return done[0]


def _simulate(config: RunConfig, task: Task, app, init: dict, stop, server: list) -> None:
    """Flower's ``run_simulation`` of ``app``; a signal stops it (then raises Interrupted)."""
    from flwr.simulation import run_simulation

    from fedprivopt.clients.client_app import make_client_app

    backend = {
        "client_resources": {"num_cpus": config.client_cpus, "num_gpus": config.client_gpus},
        "init_args": init,
    }
    # ray.init would replace the SIGTERM handler of signals_stop (twenty-sixth review of issue
    # 15: a SIGTERM then raised SystemExit inside logging and the run hung)
    with interrupt.signals_stop(stop) as received, ray_processes.ray_keeps_handlers():
        try:
            run_simulation(
                server_app=app,
                client_app=make_client_app(
                    task=config.task, task_params=config.task_params, device=config.device
                ),
                num_supernodes=task.num_users,
                backend_config=backend,
            )
        finally:
            stop.set()
            for thread in server:
                thread.join(timeout=SERVER_STOP_WAIT)
    if received:
        raise interrupt.Interrupted(received[0])


SERVER_STOP_WAIT = 60.0
"""Seconds an interrupted Flower run waits for its ServerApp thread to finish its step."""
