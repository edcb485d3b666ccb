r"""Train a whole cohort of tag-prediction users at once, on the rows their words touch.

The fast engine's vectorized client side for :class:`~fedprivopt.models.tag_prediction.
StackOverflowTagTask`. It computes, for every user, the same clipped update as
:class:`~fedprivopt.clients.LocalTrainer` (same shuffles from the same keyed generators, same
minibatches, preconditioned local SGD, whole-update clipping), up to float rounding, but

* **row-sparse**: viewed as a ``(V + 1, K)`` matrix, the flat model's row ``j < V`` holds word
  ``j``'s weights and row ``V`` the bias. A user's local SGD only changes the rows of the words it
  wrote and the bias (unless the task's ``train_bias`` is off: that row then gets no gradient), so
  each user trains its update on just those rows (its model is the global rows plus that update),
  and the updates of a chunk are returned as one
  :class:`~fedprivopt.privacy.sparse.RowSparseBatch` (each user clipped on its rows: every other
  entry is exactly zero);
* **vectorized**: the users of a chunk are prepared at once and stacked into one matrix of rows
  (:mod:`~fedprivopt.models.tag_prediction_chunk`); local step ``t`` of every user still training
  is one slice of a stream of bags laid out in step order: ``embedding_bag`` forwards over the
  global rows and the stacked updates, the gradient of the logits in closed form, and the rows'
  gradients as one more ``embedding_bag`` over it. Each user's loss is its own minibatch mean,
  and users' rows are disjoint, so each row receives exactly its user's gradient.

Costs per round are proportional to the cohort's words (tokens x K), not to ``users x V x K``.

Noise shares (distributed-noise mode) are dense, so that mode is not handled here: the engine
trains users one at a time with :class:`~fedprivopt.clients.LocalTrainer` then.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

from fedprivopt.core.local import LocalConfig
from fedprivopt.models.cohort import CohortTrainer
from fedprivopt.models.tag_prediction_chunk import TagChunk, prepare_chunk, visit_schedule
from fedprivopt.models.tag_prediction_encoding import ragged_index
from fedprivopt.privacy.clip import MIN_CLIP_NORM, clip_factor, clip_l2, norm_error_bound
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.privacy.sparse import (
    RowSparseBatch,
    segment_norms_checked,
    segment_scale,
)

__all__ = ["CHUNK_VISITS", "TagCohortTrainer"]

#: Bytes of row gradients computed and applied at a time (``benchmarks/NOTES.md``, entry 12).
PIECE_BYTES = 16 << 20

#: Example visits (``epochs x examples`` summed over its users) a chunk trains at most; a user
#: with more trains alone. A chunk lays out every visit's words at once, 0.7-1.1 kB a visit
#: (synthetic examples, measured), so 2**18 visits take about 0.2-0.3 GB. Thirty-second review of
#: issue 15 (models, finding 4): chunks were cut by users only, so memory grew with ``chunk x
#: epochs x examples``: ``local-epochs = 1000`` on the tag mini preset's 100 users took 1.72 GB
#: (0.37 GB one user at a time), 10,000 epochs about ten times that. The presets' chunks hold at
#: most 65,536 visits (256 users of ``max-examples = 256``, one epoch): they are cut as before.
CHUNK_VISITS = 2**18

#: The logistic of a step is computed over a buffer padded to a multiple of this (:func:`_sigmoid`).
SIMD_SPAN = 64


def _sigmoid(logits: torch.Tensor) -> torch.Tensor:
    """``logits.sigmoid()``, each entry the same whatever its position in ``logits``.

    torch's CPU kernel computes the vector body of a tensor with SIMD and its last
    ``numel % 32`` entries (AVX-512; 16 with AVX2) with scalar code whose results differ in the
    last bit, so an entry's logistic depended on how many visits of other users preceded it in
    its step: on where the chunk was cut (``cohort-chunk``, ``fast-actors``). Thirty-sixth review
    of issue 15 (engines, finding 1): ``simulate stackoverflow-tp-mini.toml --set
    max-examples=0 --set local-epochs=2 --set clients-per-round=40 --rounds 2`` with
    ``cohort-chunk = 1`` (or ``fast-actors = 2`` and ``cohort-chunk = 7``) gave another model and
    ledger digest than the default, so a seeded run resumed with either changed was refused as
    if its redone round had been tampered with. Computed over a buffer padded to a multiple of
    :data:`SIMD_SPAN` (zeros), every entry takes the SIMD path.
    """
    n = logits.numel()
    buf = torch.zeros(n + (-n) % SIMD_SPAN, dtype=logits.dtype, device=logits.device)
    buf[:n].copy_(logits.reshape(-1))
    return buf.sigmoid_()[:n].view(logits.shape)


class TagCohortTrainer(CohortTrainer):
    """Vectorized, row-sparse local training of many tag-prediction users.

    Parameters
    ----------
    task : StackOverflowTagTask
        The task (its ``num_features`` ``V``, ``num_tags`` ``K``, ``single_label`` and
        ``user_data``).
    device : str or torch.device, optional
        Where to train (``cuda`` if available by default). Updates are returned on the CPU.
    chunk_users : int
        Users trained together; bounds memory (the stacked rows of a chunk).
    cpu_threads : int or None
        torch intra-op threads while a chunk's data is prepared and its local steps run on the
        CPU, ``>= 1`` (with one worker the caller's setting is restored around the chunk's
        zeroing and clipping; with several, each worker runs everything with one thread);
        ``None`` leaves torch's setting alone. Default 1: the steps are many small
        gather/scatter operations that gain nothing from a second thread on an idle machine,
        and every parallel region waits for a descheduled thread when another process is busy
        (measured on 2 cores: ``index_add_`` of 300 rows 0.04 ms with 1 thread, 72 ms with 2
        while another process ran; ``benchmarks/NOTES.md``). The cores are used by
        ``cpu_workers`` instead; beyond one machine, shard the cohort over Ray actors
        (``fast-actors``).
    cpu_workers : int or None
        Chunks trained at once on the CPU, each in its own thread with one intra-op thread (see
        :class:`~fedprivopt.models.cohort.CohortTrainer`; ``None``: torch's thread count). The
        cohort is cut into at least :data:`~fedprivopt.models.cohort.CPU_CHUNKS` chunks on the
        CPU, whatever the number, so the updates are the same to the bit with any.
    """

    def __init__(
        self,
        task,
        *,
        device: str | torch.device | None = None,
        chunk_users: int = 256,
        cpu_threads: int | None = 1,
        cpu_workers: int | None = None,
    ):
        super().__init__(
            task, device=device, chunk_users=chunk_users, cpu_threads=cpu_threads,
            cpu_workers=cpu_workers,
        )  # fmt: skip
        self.vocab_size = int(task.num_features)
        self.num_tags = int(task.num_tags)
        self.length = (self.vocab_size + 1) * self.num_tags
        # a bias that does not train (``train_bias = False``) keeps its row of every update at 0
        self.train_bias = task.train_bias
        self._workspace_buffers: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------------------ public
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
    ) -> Iterator[RowSparseBatch]:
        """Yield the clipped updates of ``users``, a chunk at a time, as row-sparse batches.

        A batch's values live in this trainer's workspace: they are valid until the iterator is
        advanced (the next chunk trains in the same memory). Keep one longer with
        :meth:`~fedprivopt.privacy.sparse.RowSparseBatch.clone`.
        """
        model, precond, users, round_num = self.checked_call(
            global_flat, users, round_num=round_num, config=config, rngs=rngs,
            preconditioner=preconditioner, stream=stream,
        )  # fmt: skip
        if config.noise_std > 0:
            raise ValueError("TagCohortTrainer adds no noise shares: noise_std must be 0")
        model = model.view(self.vocab_size + 1, self.num_tags)
        if precond is not None:
            precond = precond.view(self.vocab_size + 1, self.num_tags)

        def train(chunk: list[int], slot: int) -> RowSparseBatch:
            return self._train_chunk(model, precond, chunk, round_num, config, rngs, stream, slot)

        # the token store is opened (built, the first time) in this thread, before the workers
        # start: a signal then interrupts a build of minutes at once (twenty-second review of
        # issue 15, finding 2: Ctrl-C waited for the build to end in a worker)
        encoded_users = getattr(self.task, "encoded_users", None)
        if encoded_users is not None:
            encoded_users()
        parallel = len(users) >= self.min_parallel_users
        chunks = self._within_visits(self.chunks(users), config)
        yield from self.run_chunks(chunks, train, parallel=parallel)

    def _within_visits(self, chunks: list[list[int]], config: LocalConfig) -> list[list[int]]:
        """``chunks`` cut further, in order, so that none holds more than :data:`CHUNK_VISITS`.

        A user's visits are ``epochs x min(examples, max_examples)``, as
        :func:`~fedprivopt.core.local.epoch_orders` draws them.
        """
        out: list[list[int]] = []
        for chunk in chunks:
            current: list[int] = []
            visits = 0
            for user, size in zip(chunk, self.task.user_sizes(chunk), strict=True):
                k = size if config.max_examples is None else min(size, config.max_examples)
                if current and visits + config.epochs * k > CHUNK_VISITS:
                    out.append(current)
                    current, visits = [], 0
                current.append(user)
                visits += config.epochs * k
            out.append(current)
        return out

    # ----------------------------------------------------------------------------- chunks
    def _train_chunk(
        self,
        model: torch.Tensor,
        precond: torch.Tensor | None,
        users: list[int],
        round_num: int,
        config: LocalConfig,
        rngs: RngFactory,
        stream: str,
        slot: int = 0,
    ) -> RowSparseBatch:
        dev = self.device
        with self._step_threads():
            chunk = prepare_chunk(
                self.task, self.vocab_size, users, round_num, config, rngs, stream
            )
        self.check_stopped()
        rows_dev = chunk.rows.to(dev)
        # each user's update, trained directly: the model it reads is the global rows + these
        delta = self._workspace(f"delta{slot}", int(rows_dev.numel()), model).zero_()
        p_st = precond[rows_dev] if precond is not None else None
        if chunk.ex_len.numel():
            with self._step_threads():
                self._steps(model, delta, rows_dev, p_st, chunk, config)
        norms = self._clip(delta, chunk.row_ptr, config)
        return RowSparseBatch(
            tuple(users), chunk.rows, delta.cpu(), chunk.row_ptr, self.length, tuple(norms)
        )

    def _steps(
        self,
        model: torch.Tensor,
        delta: torch.Tensor,
        rows: torch.Tensor,
        p_st: torch.Tensor | None,
        chunk: TagChunk,
        config: LocalConfig,
    ) -> None:
        """Every local step of every user of a chunk, in place on the stacked updates ``delta``.

        User ``i``'s model is the global ``model`` plus its rows of ``delta`` (stacked row ``j``
        is model row ``rows[j]``). The chunk's word visits are laid out once in step order (a
        "stream" of tokens); step ``t`` is a slice of it. Forward: an ``embedding_bag`` over the
        global rows plus one over the stacked updates (so no private copy of the rows is ever
        gathered, or subtracted at the end). Backward:
        the gradient of a word row is the bag-weighted sum of the logit gradients of the visits
        that read it, which is itself an ``embedding_bag`` over the logit gradients once the
        step's tokens are grouped by row (one sort by ``(step, row)``). The stream is laid out
        for a window of whole steps of at most :data:`CHUNK_VISITS` visits at a time
        (:meth:`_window`).
        """
        visits, steps_of, scale_of = visit_schedule(chunk, config.batch_size)
        # whole steps, at most CHUNK_VISITS visits at a time (one step at least): a user whose
        # epochs x examples exceed it alone is laid out a window at a time (finding 4); each
        # step computes as it did in one window, to the bit
        ends = torch.cumsum(torch.bincount(steps_of), 0).tolist()
        start = 0
        while start < len(ends):
            first = 0 if start == 0 else ends[start - 1]
            stop = start + 1
            while stop < len(ends) and ends[stop] - first <= CHUNK_VISITS:
                stop += 1
            window = slice(first, ends[stop - 1])
            self._window(
                model, delta, rows, p_st, chunk, config,
                visits[window], steps_of[window] - start, scale_of[window],
            )  # fmt: skip
            start = stop

    def _window(
        self,
        model: torch.Tensor,
        delta: torch.Tensor,
        rows: torch.Tensor,
        p_st: torch.Tensor | None,
        chunk: TagChunk,
        config: LocalConfig,
        visits: torch.Tensor,
        steps_of: torch.Tensor,
        scale_of: torch.Tensor,
    ) -> None:
        """The local steps of :meth:`_steps` whose visits (``steps_of`` from 0) are given."""
        K, dev, dtype = self.num_tags, self.device, delta.dtype
        n_rows = int(delta.shape[0])
        visits, steps_of = visits.to(dev), steps_of.to(dev)
        # the step's -lr goes into each visit's scale (in float64, then cast), so the gradient
        # rows are added to the updates as they are: ``index_add_`` with an ``alpha`` took 1.5x
        # as long (benchmarks/NOTES.md, entry 18)
        scale_of = scale_of * -config.learning_rate
        if not self.task.single_label:  # mean binary cross-entropy over the K tags
            scale_of = scale_of / K
        scale_of = scale_of.to(device=dev, dtype=dtype)[:, None]
        bounds = [0, *torch.cumsum(torch.bincount(steps_of), 0).tolist()]

        # the token stream: visit v's bag at stream positions vstart[v] ... (step t: a slice)
        s_rows, s_w, s_visit, vstart = self._stream(
            visits, chunk.ex_len.to(dev), chunk.tok_ids.to(dev),
            chunk.tok_w.to(device=dev, dtype=dtype),
        )  # fmt: skip
        g_rows = rows[s_rows]  # the same bags over the global model's rows
        # the labels in the same order: visit v's tags at lstart[v] ...
        s_tags, _, s_lvisit, lstart = self._stream(
            visits, (chunk.label_ptr[1:] - chunk.label_ptr[:-1]).to(dev), chunk.labels.to(dev)
        )
        # the same tokens grouped by (step, row): group g is row touched_all[g] of one step,
        # its tokens at sorted positions g_start[g] ... g_end[g] (a stable sort: ties in order)
        key, order = torch.sort(steps_of[s_visit] * n_rows + s_rows, stable=True)
        groups, g_count = torch.unique_consecutive(key, return_counts=True)
        g_end = torch.cumsum(g_count, 0)
        g_start = g_end - g_count
        touched_all = groups % n_rows
        g_bounds = [0, *torch.searchsorted(
            groups // n_rows, torch.arange(len(bounds) - 1, device=dev), right=True
        ).tolist()]  # fmt: skip
        o_visit, o_w = s_visit[order], s_w[order]
        t_bounds = [*vstart[bounds[:-1]].tolist(), int(s_rows.numel())]
        l_bounds = [*lstart[bounds[:-1]].tolist(), int(s_tags.numel())]
        piece = max(1, PIECE_BYTES // (K * delta.element_size()))
        # a frozen bias: its stacked rows get no gradient, so they stay at the global bias
        keep = None if self.train_bias else (rows != self.vocab_size).to(dtype)[:, None]

        for t in range(len(bounds) - 1):
            self.check_stopped()  # a worker whose round was stopped ends here
            v0, v1, t0, t1 = bounds[t], bounds[t + 1], t_bounds[t], t_bounds[t + 1]
            offsets, weights = vstart[v0:v1] - t0, s_w[t0:t1]
            logits = F.embedding_bag(
                g_rows[t0:t1], model, offsets, per_sample_weights=weights, mode="sum"
            )
            logits += F.embedding_bag(
                s_rows[t0:t1], delta, offsets, per_sample_weights=weights, mode="sum"
            )
            # d loss / d logits of each user's minibatch-mean loss, in closed form (softmax or
            # sigmoid minus the labels, over the minibatch size): the losses are never needed
            if self.task.single_label:
                grad = torch.softmax(logits, dim=1)
            else:
                grad = _sigmoid(logits)
            l0, l1 = l_bounds[t], l_bounds[t + 1]
            grad[s_lvisit[l0:l1] - v0, s_tags[l0:l1]] -= 1.0
            grad.mul_(scale_of[v0:v1])
            # each touched row (words and biases): the sum over its visits of bag weight x
            # logit gradient, in pieces of at most `piece` rows (PIECE_BYTES: below glibc's mmap
            # threshold, so their memory is reused instead of paged in anew at every step)
            for a in range(g_bounds[t], g_bounds[t + 1], piece):
                b = min(a + piece, g_bounds[t + 1])
                s0, s1 = int(g_start[a]), int(g_end[b - 1])
                grad_w = F.embedding_bag(
                    o_visit[s0:s1] - v0, grad, g_start[a:b] - s0,
                    per_sample_weights=o_w[s0:s1], mode="sum",
                )  # fmt: skip
                touched = touched_all[a:b]
                if p_st is not None:
                    grad_w /= p_st[touched]
                if keep is not None:
                    grad_w *= keep[touched]
                delta.index_add_(0, touched, grad_w)

    @staticmethod
    def _stream(
        visits: torch.Tensor,
        lengths: torch.Tensor,
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """The ragged rows ``visits`` of CSR ``(values, lengths)`` laid end to end.

        Returns the values (and ``weights``) in that order, the visit of each, and where each
        visit starts.
        """
        where, vlen, vstart = ragged_index(lengths, visits)
        owner = torch.repeat_interleave(
            torch.arange(visits.numel(), device=values.device), vlen, output_size=where.numel()
        )
        return values[where], None if weights is None else weights[where], owner, vstart

    def _workspace(self, name: str, rows: int, like: torch.Tensor) -> torch.Tensor:
        """A ``(rows, width of like)`` tensor in reused memory (a view of a workspace).

        Large fresh tensors cost more in page faults than in filling them (measured: gathering
        55,000 rows of 500 floats into a new tensor 134 ms, into a reused one 29 ms).
        """
        width, dtype, device = int(like.shape[1]), like.dtype, like.device
        buf = self._workspace_buffers.get(name)
        if (
            buf is None
            or buf.shape[0] < rows
            or (buf.shape[1], buf.dtype, buf.device) != (width, dtype, device)
        ):
            buf = torch.empty(max(rows, 1) * 5 // 4 + 1, width, dtype=dtype, device=device)
            self._workspace_buffers[name] = buf
        return buf[:rows]

    def _clip(self, delta: torch.Tensor, ptr: torch.Tensor, config: LocalConfig) -> list[float]:
        """Clip each user's rows of ``delta`` in place, as ``clip_l2`` clips a lone update.

        A user whose update is not finite gets the zero update (as
        :class:`~fedprivopt.clients.LocalTrainer` sends). Returns each user's norm before
        clipping (``inf`` for a diverged one), as ``LocalTrainer`` reports it.
        """
        factors, before = [], []
        tiny = torch.finfo(delta.dtype).tiny
        # forty-second review of issue 15 (mechanisms 3): a float16 or bfloat16 product with
        # clip_factor's factor rounds each entry by up to 2**-11 (2**-8) relative, more near the
        # subnormals: updates of norm 1.0016 C (float16, C 1e-5) and 1.12 C (bfloat16, C 1e-39);
        # such a dtype's users are clipped by clip_l2, exact at any size, as the aggregator does.
        # Follow-up (privacy 1): the factor's 4-ulp margin covers the norm's measurement error
        # (norm_error_bound) in float32 alone; float64 users came back scaled to 1 + 1e-13 C
        exact = delta.dtype != torch.float32
        # forty-eighth review of issue 15 (clipping 2): below MIN_CLIP_NORM (the Python API's
        # LocalConfig) the scaled entries are subnormal, whose absolute rounding the factor's
        # margin does not cover: users of norm 1.75 C at C = 3e-45 (1.03 C at 1e-44) where
        # clip_l2 gives at most C; such a C takes clip_l2, as clip_l2's own fast path does
        exact = exact or (config.clip_norm is not None and config.clip_norm < MIN_CLIP_NORM)
        width = int(delta[0].numel()) if delta.shape[0] else 0
        for i, norm in enumerate(segment_norms_checked(delta, ptr)):
            before.append(math.inf if norm is None else norm)
            if norm is None:  # diverged (NaN/Inf)
                delta[int(ptr[i]) : int(ptr[i + 1])] = 0.0
                factors.append(1.0)
            elif config.clip_norm is None:
                factors.append(1.0)
            else:
                factor = clip_factor(norm, config.clip_norm, delta.dtype)
                # forty-second review, follow-up (privacy 1): a norm within its measurement
                # error of C read at most C (factor 1), and an update exactly above C by 1e-16
                # came back unclipped (float32 too); clip_l2 decides such a boundary exactly
                numel = (int(ptr[i + 1]) - int(ptr[i])) * width
                near = factor == 1.0 and norm * (1.0 + norm_error_bound(numel)) > config.clip_norm
                if factor < tiny or (exact and factor != 1.0) or near:
                    # forty-first review of issue 15 (mechanisms 1): a factor below the dtype's
                    # normal range (an update norm above C / 1.2e-38 in float32, e.g. C 1e-25 at
                    # local-learning-rate 1e21) lost the relative precision its margin needs, or
                    # rounded to 0: updates of norm up to 1.89 C, or 0 where LocalTrainer's
                    # clip_l2 gives norm C. Such a user is clipped by clip_l2, exact at any size
                    segment = delta[int(ptr[i]) : int(ptr[i + 1])]
                    segment.copy_(clip_l2(segment, config.clip_norm).vector)
                    factor = 1.0
                factors.append(factor)
        if any(f != 1.0 for f in factors):
            delta.mul_(segment_scale(factors, ptr[1:] - ptr[:-1], delta))
        return before

    def __repr__(self) -> str:
        return (
            f"TagCohortTrainer(V={self.vocab_size}, K={self.num_tags}, device={self.device}, "
            f"chunk_users={self.chunk_users})"
        )
