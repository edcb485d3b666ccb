"""The cells of a ``compare`` grid, run several at a time in worker processes (``--jobs``).

Each cell is a full run of the fast engine, and a run of a small model uses one core at most
(the cohort trainer steps on one thread, ``benchmarks/NOTES.md`` entry 9), so a grid of such runs
on a machine with ``J`` cores finishes up to ``J`` times sooner when ``J`` cells run at once.
:func:`run_plans` runs them in ``J`` worker processes, each with one intra-op thread:

- **The same runs.** A worker runs the cell's plan exactly as ``compare`` does in process
  (:func:`~fedprivopt.simulation.cells.run_cell`: run, resume or rerun; a reused cell needs no
  worker), from the cell's resolved configuration; each worker builds a task once per distinct
  task configuration. Every run is seeded by its configuration alone, so what it releases does
  not depend on which worker runs it or what runs beside it.
- **Started processes** are ``spawn``-ed (a fresh interpreter: the parent's OpenMP threads and
  locks are not copied into a forked child), ignore Ctrl-C (the parent decides), and get SIGTERM
  when the parent dies (Linux ``PR_SET_PDEATHSIG``), which stops their run as Ctrl-C would.
- **Stopping.** On Ctrl-C, SIGTERM or a failed cell the parent cancels the cells not started and
  sends SIGTERM to every worker: a run stops after its current round with what it released kept
  (:class:`~fedprivopt.simulation.interrupt.Interrupted`), so the same command continues it.
  The parent waits for them before it reports the interruption or the failure.
- **Only the fast engine in process.** The Flower engine and ``fast-actors`` start a Ray
  instance per run; several at once would compete for the same cores and ports, so
  :func:`check_parallel` refuses such a grid with ``jobs > 1``.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedprivopt.core.logs import log_warnings_to_stderr
from fedprivopt.core.memory import PROCESS_MEMORY, physical_memory, processes_that_fit
from fedprivopt.core.orphans import die_with_parent
from fedprivopt.simulation.cells import REUSE, Cell, CellPlan, run_cell, task_key
from fedprivopt.simulation.interrupt import ENDING_SIGNALS

__all__ = ["JOB_MEMORY", "MAX_JOBS", "check_jobs", "check_parallel", "physical_memory", "run_plans"]

MAX_JOBS = 256
"""Upper bound of ``--jobs``: worker processes, each holding its own copy of its tasks."""

STOP_WAIT = 60.0
"""Seconds the parent waits for stopped workers to end before it kills them."""

POLL = 0.5
"""Seconds between checks that every worker is alive (:func:`_check_workers`)."""

_TASKS: dict[tuple[str, str], Any] = {}  # a worker's tasks, by task and parameters


JOB_MEMORY = PROCESS_MEMORY
"""Memory a ``--jobs`` worker holds at least: a process with torch and its own tasks (220 MB
measured for the toy task; StackOverflow tasks hold more)."""


def check_jobs(jobs: int) -> None:
    """Refuse more ``--jobs`` than this machine's memory holds workers, before anything runs.

    Fourteenth review of issue 15: ``--jobs`` up to 256 was accepted on a machine of 23 GB and
    2 CPUs, where 256 workers of a 256-cell grid ask for about 56 GB (220 MB each, measured on
    the toy task). The bound is the physical memory over :data:`JOB_MEMORY` (and at most
    :data:`MAX_JOBS`).
    """
    memory = physical_memory()
    most = processes_that_fit(MAX_JOBS, memory, JOB_MEMORY)
    if jobs > most:
        raise ValueError(
            f"argument --jobs: must be an integer in [1, {most}] on this machine: each job is a "
            f"process holding its own tasks, at least {JOB_MEMORY // 2**20} MiB, and it has "
            f"{memory / 2**30:.1f} GiB of memory (jobs beyond its {os.cpu_count()} CPUs add "
            f"memory, not speed), got {jobs}"
        )


def check_parallel(plans: Sequence[CellPlan], jobs: int) -> None:
    """Refuse ``jobs > 1`` for cells that do not run in process on the fast engine.

    Raises
    ------
    ValueError
        Naming ``--jobs`` and the first such cell.
    """
    if jobs <= 1:
        return
    for plan in plans:
        config = plan.cell.config
        if plan.action == REUSE:
            continue
        if config.engine != "fast" or config.fast_actors or config.ray_address not in ("", "local"):
            raise ValueError(
                f"argument --jobs: {jobs} runs cells in parallel on the fast engine in process; "
                f"cell {plan.cell.label} uses "
                + (f"the {config.engine} engine" if config.engine != "fast" else "Ray actors")
                + ", which spread one run over the cores already: use --jobs 1"
            )


def run_plans(
    plans: Sequence[CellPlan], jobs: int, announce: Callable[[int, CellPlan], None]
) -> None:
    """Carry out ``plans`` with at most ``jobs`` running at once, in order of submission.

    ``announce(i, plan)`` is called (1-based ``i``) when cell ``i`` is started or, if reused,
    passed over. The first exception of a worker is raised here once every worker has stopped;
    so is ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM / SIGHUP through the command line's
    handlers).
    """
    work = [(i, plan) for i, plan in enumerate(plans, 1)]
    todo = [(i, plan) for i, plan in work if plan.action != REUSE]
    if not todo:
        for i, plan in work:
            announce(i, plan)
        return
    context = multiprocessing.get_context("spawn")
    _start_resource_tracker()
    running: dict[cf.Future, CellPlan] = {}
    queue = iter(work)
    pool = None
    try:
        with _signals_blocked():  # the pool's workers start shielded
            pool = cf.ProcessPoolExecutor(
                min(jobs, len(todo)),
                mp_context=context,
                initializer=_start_worker,
                initargs=(os.getpid(),),
            )
            _fill(pool, queue, running, jobs, announce)
        while running:
            done, _ = cf.wait(running, timeout=POLL, return_when=cf.FIRST_COMPLETED)
            if not done:
                _check_workers(pool, running)
                continue
            for future in done:
                plan = running.pop(future)
                try:
                    stopped = future.result()
                except cf.process.BrokenProcessPool:
                    raise ValueError(
                        f"cell {plan.cell.label}: its worker process ended without a result "
                        "(killed, or out of memory); the same command continues the comparison"
                    ) from None
                if stopped is not None:  # a worker stopped by a signal
                    raise KeyboardInterrupt
            with _signals_blocked():
                _fill(pool, queue, running, jobs, announce)
    except BaseException:
        if pool is not None:
            _stop(pool, running)
        raise
    pool.shutdown(wait=True)


def _check_workers(pool: cf.ProcessPoolExecutor, running: dict) -> None:
    """Raise when a worker of ``pool`` has ended while cells run (killed, out of memory).

    Fifteenth review of issue 15: the pool (CPython 3.11) watches only the workers that existed
    when it last began to wait, and it begins before a newly submitted cell's worker is spawned;
    so when that worker was killed (SIGKILL, the kernel's out-of-memory killer) nothing noticed,
    and the other workers ran their cells to the end (a 4,000-round cell: 2,000 more rounds
    released after the kill, about 45 s) before ``compare`` reported the failure.
    """
    processes = getattr(pool, "_processes", None) or {}
    dead = [p for p in list(processes.values()) if p.exitcode is not None]
    if dead:
        cells = ", ".join(sorted(plan.cell.label for plan in running.values()))
        raise ValueError(
            f"a worker process (PID {dead[0].pid}) ended without a result (killed, or out of "
            f"memory, exit {dead[0].exitcode}) while cells {cells} ran; the same command "
            "continues the comparison"
        )


def _fill(pool, queue, running: dict, jobs: int, announce) -> None:
    """Submit the next cells until ``jobs`` run (reused cells are only announced)."""
    while len(running) < jobs:
        item = next(queue, None)
        if item is None:
            return
        i, plan = item
        announce(i, plan)
        if plan.action == REUSE:
            continue
        cell = plan.cell
        future = pool.submit(
            _run, cell.label, cell.config, str(plan.run_dir), plan.action, plan.why
        )
        running[future] = plan


def _stop(pool: cf.ProcessPoolExecutor, running: dict) -> None:
    """Cancel what has not started, stop the running cells (SIGTERM), end the workers.

    A worker turns SIGTERM into :class:`~fedprivopt.simulation.interrupt.Interrupted` inside a
    run (its files kept) and returns; the pool's shutdown then ends every worker. One still
    alive after :data:`STOP_WAIT` seconds is killed.
    """
    for future in running:
        future.cancel()
    processes = multiprocessing.active_children()  # the pool's workers: compare starts no other
    with _ignoring_signals():
        for process in processes:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                process.terminate()
        cf.wait(running, timeout=STOP_WAIT)
        pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + STOP_WAIT
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker, if it is not running, shielded from SIGHUP.

    The tracker (one process the pool's queues register their semaphores with) ignores
    SIGINT and SIGTERM but not SIGHUP: a closed terminal (SIGHUP to the process group) killed
    it, and the stopping pool printed Python's "process died unexpectedly, relaunching"
    warning and one ``KeyError: '/mp-...'`` traceback of the relaunched tracker per semaphore
    (twenty-eighth review of issue 15). It starts with the ending signals blocked
    (:func:`_signals_blocked`) and unblocks only SIGINT and SIGTERM, so SIGHUP stays blocked in
    it. Until the twenty-ninth review SIGHUP was ignored in this process while the tracker
    started, and a closed terminal then went unnoticed: the command ran on.
    """
    from multiprocessing import resource_tracker

    with _signals_blocked():
        resource_tracker.ensure_running()


@contextlib.contextmanager
def _signals_blocked():
    """Hold the ending signals back while processes may be started (main thread).

    A started process inherits the blocked set: a worker gets them only once
    :func:`_start_worker` has set SIGINT and SIGHUP to be ignored (the parent's to handle)
    and unblocked them. Blocking them in the main thread does not hold them back from this
    process: the kernel gives them to another thread (OpenBLAS's, the pool's), and Python runs
    the handler in the main thread at once. So the handlers only note them here, and the first
    one noted is raised again when the block ends, with the previous handlers back. Twenty-ninth
    review of issue 15: a signal to ``compare --jobs 2``'s process group raised ``Interrupted``
    inside the pool's start of a worker, between its spawn and the write of its start-up data;
    the worker, given nothing, printed ``EOFError: Ran out of input`` after the command's line
    (2 of 51 tries under heavy load; every time when the signal is sent at that point).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, ENDING_SIGNALS)
    handlers = {}
    try:
        for sig in ENDING_SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                handlers[sig] = signal.signal(sig, lambda signum, frame: noted.append(signum))
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # what is pending is noted
        _restore(handlers)
    if noted:
        signal.raise_signal(noted[0])


def _restore(handlers: dict) -> None:
    """Put ``handlers`` back, every one, even when a restored one raises meanwhile.

    ``signal.signal`` first runs the handlers of signals that have arrived: one put back
    already (``Interrupted`` for a signal that came as they were put back) must not leave the
    others unrestored. Its exception is raised once all are back.
    """
    raised: BaseException | None = None
    for sig, handler in handlers.items():
        while True:
            try:
                signal.signal(sig, handler)
                break
            except BaseException as exc:  # re-raised below
                raised = raised or exc
    if raised is not None:
        raise raised


@contextlib.contextmanager
def _ignoring_signals():
    """A second Ctrl-C while the workers stop must not leave them running."""
    kinds = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    try:
        previous = [signal.signal(kind, signal.SIG_IGN) for kind in kinds]
    except ValueError:  # not the main thread: nothing to change
        yield
        return
    try:
        yield
    finally:
        for kind, handler in zip(kinds, previous, strict=True):
            signal.signal(kind, handler)


# -- in the worker ---------------------------------------------------------------------------


def _start_worker(parent: int) -> None:
    """Set up a worker: one intra-op thread, and the command line's logging.

    ``parent`` is the PID of the process that started the pool (see
    :func:`~fedprivopt.core.orphans.die_with_parent`).

    Ctrl-C and SIGHUP (a closed terminal signals the whole process group) are the parent's to
    handle (ignored here; each worker ran the parent's handler and printed its own line before
    the twenty-eighth review of issue 15); the parent stops the workers with SIGTERM, and a
    worker gets SIGTERM when the parent dies (Linux). The signals the parent held back while
    starting the worker (:func:`_signals_blocked`) are let through once these are set.
    """
    from fedprivopt.simulation import interrupt

    # the parent prints the command's line: a worker's second SIGTERM (the group's, then the
    # parent's stop) ends it at once without "interrupted twice; ended at once"
    interrupt.reported()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, ENDING_SIGNALS)
    die_with_parent(parent, signal.SIGTERM)  # a run turns SIGTERM into Interrupted
    import logging
    import warnings

    import torch

    torch.set_num_threads(1)
    # as the command line does (fedprivopt.cli): dp-accounting's notes on orders it drops
    logging.getLogger("absl").setLevel(logging.ERROR)
    log_warnings_to_stderr()
    warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")


def _run(label: str, config, run_dir: str, action: str, why: str) -> str | None:
    """Run one cell's plan; ``"interrupted"`` when a signal stopped it, else ``None``."""
    from fedprivopt.models import build_task
    from fedprivopt.simulation.interrupt import signals_raise

    # SIGTERM from the parent: Interrupted, the run's files kept; SIGHUP stays ignored
    with signals_raise((signal.SIGTERM,)):
        try:
            key = task_key(config)
            if key not in _TASKS:
                _TASKS[key] = build_task(config.task, **config.task_params)  # as build_run
            run_cell(CellPlan(Cell(label, config, _TASKS[key]), Path(run_dir), action, why))
        except KeyboardInterrupt:
            return "interrupted"
        except ValueError as exc:  # a subclass may not survive pickling: its message does
            raise ValueError(str(exc)) from None
    return None
