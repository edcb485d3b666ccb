"""What the vectorized cohort trainers of the tasks share.

:class:`CohortTrainer` holds the settings every cohort trainer takes (task, device, users per
chunk, torch threads for the local steps), checks the global model and the preconditioner a round
passes in, and gives :meth:`~CohortTrainer.train` (one update at a time) on top of a subclass's
:meth:`~CohortTrainer.train_batches` (a chunk of users at a time). The trainers:
:class:`~fedprivopt.models.tag_prediction_cohort.TagCohortTrainer` and
:class:`~fedprivopt.models.next_word_cohort.NextWordCohortTrainer`.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

import torch

from fedprivopt.core.checks import check_int
from fedprivopt.core.devices import check_device
from fedprivopt.core.local import LocalConfig, check_train_call
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.privacy.sparse import dense_problem

__all__ = ["CPU_CHUNKS", "MAX_THREADS", "MIN_PARALLEL_USERS", "ChunkStopped", "CohortTrainer"]

T = TypeVar("T")

#: Chunks a cohort is cut into at least on the CPU, whatever the number of workers: with 2
#: workers, 4 balanced the 2-core round best (users of real size, 100 a round: 0.19-0.20 s
#: against 0.21-0.22 s with 2 chunks and 0.20-0.21 s with 8; ``benchmarks/NOTES.md``, entry 18).
CPU_CHUNKS = 4

#: Workspaces ("slots") per worker: with one, a worker that finished its chunk before the one
#: ahead of it idled until both were consumed (40 ms of a 166 ms round, measured; NOTES 18).
SLOTS_PER_WORKER = 2

#: Users a round needs before its chunks train in threads. Light users (about 37 examples), 2
#: cores, medians of rounds 2-12 of three runs each: 20 users 0.046-0.049 s with two workers
#: against 0.040-0.042 s with one, 50 users 0.055-0.058 against 0.050-0.054 s; 100 users
#: 0.069-0.073 against 0.076-0.081 s; users of real size, 100: 0.15-0.17 against 0.27 s
#: (``benchmarks/NOTES.md``, entry 18).
MIN_PARALLEL_USERS = 64

#: Upper bound of ``cpu_threads`` and ``cpu_workers``: each is a thread (an OpenMP thread of
#: torch, or a Python worker with its workspaces). Twenty-fifth review of issue 15, finding 4:
#: ``cpu_threads=10**5`` started 100,000 OpenMP threads at the first local step (a
#: ``SystemError`` under a 8 GiB address-space limit) and ``10**9`` ended in libgomp's
#: ``std::bad_alloc``; 1,024 is the bound of ``data synth --workers``.
MAX_THREADS = 1024

#: The stop event of the chunks a worker thread trains (set when their caller stops asking).
_WORKER = threading.local()


class ChunkStopped(Exception):
    """A worker's chunk given up because its caller stopped (an error or a signal)."""


class CohortTrainer:
    """Base of the cohort trainers: settings, input checks, thread scope and :meth:`train`.

    Parameters
    ----------
    task
        The task whose users are trained.
    device : str or torch.device, optional
        Where to train (``cuda`` if available by default). Updates are returned on the CPU.
    chunk_users : int
        At most this many users are trained together, ``>= 1``.
    cpu_threads : int or None
        torch intra-op threads while the local steps run on the CPU, in ``[1, MAX_THREADS]``
        (restored afterwards); ``None`` leaves torch's setting alone.
    cpu_workers : int or None
        Python threads that train at once on the CPU, each with one intra-op thread, in
        ``[1, MAX_THREADS]``; ``None``: torch's thread count when a round is trained (1 in a
        Ray shard given one CPU). On 2 idle cores two workers kept both cores busy where one
        chunk stepped with one thread could not, and unlike a 2-thread OpenMP region neither
        waits for the other when a core is taken (``benchmarks/NOTES.md``, entries 16 and 18).
        The updates are the same to the bit for any number.

    Subclasses set :attr:`length` (entries of the flat model) and define :meth:`train_batches`.

    Attributes
    ----------
    noise_shares : bool
        True where :meth:`train_batches` adds distributed-noise shares itself
        (``config.noise_std > 0``); otherwise the fast engine trains one user at a time in that
        mode.
    """

    length: int
    noise_shares = False
    #: users a round needs before its chunks train in threads (:data:`MIN_PARALLEL_USERS`)
    min_parallel_users = MIN_PARALLEL_USERS

    def __init__(
        self,
        task,
        *,
        device: str | torch.device | None = None,
        chunk_users: int = 256,
        cpu_threads: int | None = 1,
        cpu_workers: int | None = None,
    ):
        # integers only (twenty-second review of issue 15, 4: 1.5 and "2" were truncated or
        # parsed, NaN and inf raised int()'s errors naming no parameter)
        self.chunk_users = check_int("chunk_users", chunk_users, 1)
        self.cpu_threads = check_int("cpu_threads", cpu_threads, 1, MAX_THREADS, none=True)
        self.cpu_workers = check_int("cpu_workers", cpu_workers, 1, MAX_THREADS, none=True)
        self.task = task
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        # forty-sixth review of issue 15 (mechanisms 2): as LocalTrainer checks it; "CPU" ended
        # in torch's RuntimeError, and "meta" made a trainer whose batches have no data
        self.device = check_device(device)

    def train(
        self,
        global_flat: torch.Tensor,
        users: Sequence[int],
        *,
        round_num: int,
        config: LocalConfig,
        rngs: RngFactory,
        preconditioner: torch.Tensor | None = None,
        stream: str = "train",
    ) -> Iterator[tuple[int, object]]:
        """Yield ``(user, clipped update)`` for ``users``, in their order.

        Arguments mean what they mean for :meth:`~fedprivopt.clients.LocalTrainer.train`. Each
        update owns its tensors; :meth:`train_batches` gives the same updates a chunk at a time.
        """
        for batch in self.train_batches(
            global_flat, users, round_num=round_num, config=config, rngs=rngs,
            preconditioner=preconditioner, stream=stream,
        ):  # fmt: skip
            yield from batch.split()

    def train_batches(
        self,
        global_flat: torch.Tensor,
        users: Sequence[int],
        *,
        round_num: int,
        config: LocalConfig,
        rngs: RngFactory,
        preconditioner: torch.Tensor | None = None,
        stream: str = "train",
    ) -> Iterator:
        """Yield the clipped updates of ``users``, a chunk at a time (each with ``split()``)."""
        raise NotImplementedError

    def checked_inputs(
        self, global_flat: torch.Tensor, preconditioner: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The global model and the preconditioner on :attr:`device`, after checking them.

        Raises
        ------
        ValueError
            If ``global_flat`` is not a flat vector of :attr:`length` entries, or the
            preconditioner has another shape or is not finite and > 0 everywhere.
        """
        if not isinstance(global_flat, torch.Tensor) or not global_flat.is_floating_point():
            raise ValueError(
                "global_flat must be a floating-point tensor, got "
                f"{getattr(global_flat, 'dtype', type(global_flat).__name__)}"
            )
        # forty-sixth review of issue 15 (mechanisms 2): a meta or sparse model (preconditioner)
        # ended in torch's NotImplementedError or RuntimeError, where LocalTrainer names it
        problem = dense_problem(global_flat)
        if problem is not None:
            raise ValueError(f"global_flat must be a dense tensor with values: {problem}")
        if global_flat.dim() != 1 or global_flat.numel() != self.length:
            raise ValueError(
                f"global_flat must be a flat vector of {self.length} entries, got shape "
                f"{tuple(global_flat.shape)}"
            )
        model = global_flat.detach().to(self.device)
        if preconditioner is None:
            return model, None
        if not isinstance(preconditioner, torch.Tensor):  # an AttributeError before
            raise ValueError(
                f"preconditioner must be a tensor or None, got {type(preconditioner).__name__}"
            )
        problem = dense_problem(preconditioner)
        if problem is not None:
            raise ValueError(f"preconditioner must be a dense tensor with values: {problem}")
        if preconditioner.shape != global_flat.shape:
            raise ValueError("preconditioner must have the layout of global_flat")
        precond = preconditioner.detach().to(device=self.device, dtype=model.dtype)
        if not bool(torch.all(torch.isfinite(precond) & (precond > 0))):
            raise ValueError("preconditioner must be finite and > 0 everywhere")
        return model, precond

    def checked_call(
        self,
        global_flat: torch.Tensor,
        users: Sequence[int],
        *,
        round_num: int,
        config: LocalConfig,
        rngs: RngFactory,
        preconditioner: torch.Tensor | None,
        stream: str,
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[int], int]:
        """:meth:`checked_inputs` and the other arguments of :meth:`train_batches`, checked.

        Returns the model, the preconditioner, the users and the round (as ints). Twenty-fifth
        review of issue 15: the trainers took a user id of 1.5, ``True`` or ``"3"`` (as users 1,
        1 and 3), a round of 1.5 and a stream of ``None`` or ``""``, and an int64 model, a
        ``config`` or ``rngs`` of another type failed inside with ``RuntimeError`` or
        ``AttributeError``.

        Raises
        ------
        ValueError
            Naming the argument (:func:`~fedprivopt.core.local.check_train_call`).
        """
        users, round_num = check_train_call(
            users, round_num=round_num, config=config, rngs=rngs, stream=stream
        )
        model, precond = self.checked_inputs(global_flat, preconditioner)
        return model, precond, users, round_num

    def chunks(self, users: Sequence[int]) -> list[list[int]]:
        """``users`` cut into consecutive chunks for :meth:`run_chunks`.

        At most :attr:`chunk_users` each and, on the CPU, at least :data:`CPU_CHUNKS` of about
        equal size (as many as there are users, if fewer), so that the workers
        (``cpu_workers``) can share a round. The cut does not depend on the number of workers:
        where a user's rows sit in its chunk can change its update in the last bits (seen with
        15 tags; not with 455), so the same cut gives the same updates to the bit with any.
        """
        users = [int(u) for u in users]
        size = self.chunk_users
        if self.device.type == "cpu":
            size = min(size, max(1, math.ceil(len(users) / CPU_CHUNKS)))
        return [users[a : a + size] for a in range(0, len(users), size)]

    def workers(self) -> int:
        """Threads that train at once now: ``cpu_workers``, or torch's thread count (CPU)."""
        if self.device.type != "cpu":
            return 1
        return max(1, torch.get_num_threads() if self.cpu_workers is None else self.cpu_workers)

    def run_chunks(
        self,
        chunks: Sequence[T],
        train: Callable[[T, int], object],
        *,
        parallel: bool = True,
        ahead: int | None = None,
    ) -> Iterator[object]:
        """Yield ``train(chunk, slot)`` for every chunk, in order, :meth:`workers` at once.

        ``slot`` names the memory a chunk may train in: there are :data:`SLOTS_PER_WORKER` per
        worker, so a worker whose chunk is done can start the next while the caller still
        waits for an earlier one; chunk ``i + slots`` reuses chunk ``i``'s slot and starts only
        after chunk ``i``'s result has been consumed (the caller asked for the next one), so a
        result stays valid until then, as with one worker. Each worker thread runs torch with
        one intra-op thread, and so does the caller's thread while results are pending (its
        own parallel regions would wait for the workers' cores); its thread count is restored
        afterwards. ``parallel = False``: one chunk at a time in the caller's thread (where the
        threads would cost more than they give; the results are the same). ``ahead``: the
        number of slots (chunks queued or training before the caller consumes the first), by
        default :data:`SLOTS_PER_WORKER` per worker; a caller whose results need no workspace
        of their own (the next-word trainer writes into one stack) queues every chunk at once,
        so a long chunk never holds up the workers.
        """
        workers = min(self.workers(), len(chunks)) if parallel else 1
        if workers <= 1:
            for chunk in chunks:
                yield train(chunk, 0)
            return
        threads = torch.get_num_threads()
        slots = min(len(chunks), SLOTS_PER_WORKER * workers if ahead is None else max(1, ahead))
        stop = threading.Event()

        def work(chunk: T, slot: int) -> object:
            _WORKER.stop = stop
            if stop.is_set():
                raise ChunkStopped
            torch.set_num_threads(1)  # this thread's own OpenMP setting
            return train(chunk, slot)

        pool = ThreadPoolExecutor(workers, thread_name_prefix="fedprivopt-chunk")
        pending: deque[Future] = deque()
        try:
            torch.set_num_threads(1)
            for i in range(slots):
                pending.append(pool.submit(work, chunks[i], i))
            following = slots
            while pending:
                result = pending.popleft().result()
                yield result
                if following < len(chunks):
                    pending.append(pool.submit(work, chunks[following], following % slots))
                    following += 1
        finally:
            # twenty-second review of issue 15, finding 2: Ctrl-C waited here for the running
            # chunks to end (8 s for long local training); they now stop at their next step
            stop.set()
            for future in pending:
                future.cancel()
            pool.shutdown(wait=True)
            torch.set_num_threads(threads)

    @staticmethod
    def check_stopped() -> None:
        """Raise :class:`ChunkStopped` in a worker of :meth:`run_chunks` whose caller stopped.

        Trainers call it between local steps, so that an error or a signal in the caller ends a
        round within a step rather than after every running chunk (a no-op elsewhere).
        """
        stop = getattr(_WORKER, "stop", None)
        if stop is not None and stop.is_set():
            raise ChunkStopped

    @contextmanager
    def _step_threads(self) -> Iterator[None]:
        """Run the block with :attr:`cpu_threads` intra-op threads (on the CPU), then restore."""
        threads = torch.get_num_threads()
        if self.cpu_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(self.cpu_threads)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
