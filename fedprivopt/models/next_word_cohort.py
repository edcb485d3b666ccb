r"""Train a cohort of next-word-prediction users at once: stacked weights, batched matmuls.

The fast engine's vectorized client side for :class:`~fedprivopt.models.next_word.
StackOverflowNextWordTask`. It computes, for every user, the update of
:class:`~fedprivopt.clients.LocalTrainer` (same shuffles and example caps from the same keyed
generators, same minibatches in the same order, preconditioned local SGD, whole-update clipping,
the noise share of distributed-noise mode), up to float rounding:

* **stacked**: a chunk's ``U`` users each hold a copy of the flat model, one row of a ``(U, N)``
  matrix; every parameter is a strided ``(U, ...)`` view of it;
* **batched**: local step ``t`` of every user still training is one call of
  :func:`~fedprivopt.models.next_word_cohort_step.sgd_step`: the embedding-LSTM-projection-output
  model (:class:`~fedprivopt.models.next_word_model.NextWordLSTM`) written with batched matmuls
  over the users and a hand-written backward pass over a minibatch packed by time step (no
  autograd graph, no gradient buffer, almost no work on padding);
* **on the CPU, user by user**: stacking does not raise a user's arithmetic intensity (each has
  its own weights) and spills the caches, so there each user runs alone through the same step,
  ``cpu_workers`` users at a time on Python threads (``stacked`` selects the stack anywhere);
* **prefix-active**: users are ordered by their number of local steps, longest first, so the
  users still training at step ``t`` are always a leading slice of the stack (finished users cost
  nothing, and no copy is made to drop them).

Users' minibatches are padded to the largest of the step: padded targets weigh 0, and since
padding only follows a sentence and the LSTM is causal, no real target's loss changes.
Each user's loss is its own minibatch mean over its non-pad targets (the task's loss), and users'
weights are disjoint, so the gradient of the sum is every user's own gradient.

Tested against :class:`~fedprivopt.clients.LocalTrainer` in ``tests/models/
test_next_word_cohort.py``; measured in ``benchmarks/next_word.py`` (``make bench``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from fedprivopt.core.checks import check_bool
from fedprivopt.core.local import LocalConfig, epoch_orders
from fedprivopt.models.cohort import CohortTrainer
from fedprivopt.models.next_word_cohort_step import sgd_step
from fedprivopt.models.next_word_tokens import PAD
from fedprivopt.privacy.clip import clip_l2, l2_norm
from fedprivopt.privacy.noise import add_gaussian_noise
from fedprivopt.privacy.rng import RngFactory

__all__ = ["DenseUpdates", "NextWordCohortTrainer", "model_flops"]

#: Bytes of logits (float32) one step may hold: bounds the users trained together.
LOGIT_BYTES = 256 << 20


def model_flops(tokens: int, vocab_size: int, embedding_dim: int, hidden_size: int) -> float:
    """Matmul FLOPs of forward and backward passes over ``tokens`` targets (3x the forward).

    Per token the forward multiplies by the LSTM's input and recurrent weights, the projection
    and the output layer: ``2 (4h (e + h) + h e + e W)`` with ``W = V + 4``; the backward pass
    computes the gradients of the inputs and of the weights of each, twice that.
    """
    e, h, w = embedding_dim, hidden_size, vocab_size + 4
    return 3.0 * 2.0 * (4 * h * (e + h) + h * e + e * w) * tokens


@dataclass
class DenseUpdates:
    """The clipped (noised) dense updates of a chunk of users, one row each.

    Attributes
    ----------
    users : tuple of int
        The users, in the requested order.
    deltas : torch.Tensor
        ``(len(users), N)`` float32 CPU updates.
    norms : tuple of float
        Each user's update norm before clipping (``inf`` if it diverged).
    """

    users: tuple[int, ...]
    deltas: torch.Tensor
    norms: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.users)

    def split(self) -> list[tuple[int, torch.Tensor]]:
        """``(user, update)`` of every user, each update with its own copy of its row.

        (A view would pickle, e.g. to the driver from a Ray actor, with the whole matrix.)
        """
        return [(u, self.deltas[i].clone()) for i, u in enumerate(self.users)]

    def clone(self) -> DenseUpdates:
        """A copy that owns its tensors."""
        return DenseUpdates(self.users, self.deltas.clone(), self.norms)


@dataclass
class _User:
    """One user's examples for this round and its minibatches, in order."""

    x: torch.Tensor  # (k, seq_len) inputs of the picked examples
    y: torch.Tensor  # (k, seq_len) targets
    batches: list[torch.Tensor]  # positions into x of each local step's minibatch


class NextWordCohortTrainer(CohortTrainer):
    """Vectorized local training of many next-word-prediction users (see the module docstring).

    Parameters
    ----------
    task : StackOverflowNextWordTask
        The task (its ``num_tokens``, ``embedding_dim``, ``hidden_size``, ``seq_len`` and
        ``user_data``).
    device : str or torch.device, optional
        Where to train (``cuda`` if available by default). Updates are returned on the CPU.
    chunk_users : int
        At most this many users are trained together, ``>= 1``; fewer if a step's logits of that
        many users would exceed :data:`LOGIT_BYTES`.
    cpu_threads : int or None
        torch intra-op threads while the local steps run on the CPU, ``>= 1`` (restored
        afterwards); ``None`` leaves torch's setting alone. Default 1: on a busy 2-core machine
        each of the many small parallel regions of a step waits for a descheduled thread
        (measured: 4 users of 64 examples at the full model, 11 GFLOP/s with 1 thread, 2.3 with
        2; ``benchmarks/NOTES.md`` entry 9). For more cores, shard over Ray actors
        (``fast-actors``).
    cpu_workers : int or None
        On the CPU, users are trained one at a time (the same step, on one user's weights, kept
        in cache: measured 49 GFLOP/s against 40 for 4 users stacked, one thread) by this many
        Python threads at once, ``>= 1``; ``None``: torch's thread count when :meth:`train` is
        called (85 GFLOP/s with 2 workers on 2 idle cores, against 68 for one user on 2 torch
        threads).
    stacked : bool or None
        Train the whole chunk as one stack (each step batched over its users); ``None``: on a
        GPU only (where the batch is what fills the device). Tests set it on the CPU.

    Attributes
    ----------
    noise_shares : bool
        True: :meth:`train_batches` adds distributed-noise shares (``config.noise_std > 0``).
    """

    noise_shares = True

    def __init__(
        self,
        task,
        *,
        device: str | torch.device | None = None,
        chunk_users: int = 256,
        cpu_threads: int | None = 1,
        cpu_workers: int | None = None,
        stacked: bool | None = None,
    ):
        super().__init__(
            task, device=device, chunk_users=chunk_users, cpu_threads=cpu_threads,
            cpu_workers=cpu_workers,
        )  # fmt: skip
        self.W = int(task.num_tokens)
        self.e = int(task.embedding_dim)
        self.h = int(task.hidden_size)
        # a bool or None (twenty-fifth review of issue 15: "no" was true)
        stacked = check_bool("stacked", stacked) if stacked is not None else None
        self.stacked = self.device.type != "cpu" if stacked is None else stacked
        W, e, h = self.W, self.e, self.h
        shapes = [
            ("emb", (W, e)), ("w_ih", (4 * h, e)), ("w_hh", (4 * h, h)), ("b_ih", (4 * h,)),
            ("b_hh", (4 * h,)), ("w_p", (e, h)), ("b_p", (e,)), ("w_o", (W, e)), ("b_o", (W,)),
        ]  # fmt: skip
        self._layout: dict[str, tuple[int, int, tuple[int, ...]]] = {}
        start = 0
        for name, shape in shapes:
            size = math.prod(shape)
            self._layout[name] = (start, start + size, shape)
            start += size
        self.length = start

    def __repr__(self) -> str:
        return (
            f"NextWordCohortTrainer(W={self.W}, e={self.e}, h={self.h}, device={self.device}, "
            f"chunk_users={self.chunk_users})"
        )

    def _views(self, stack: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each parameter of the ``(U, N)`` stack as a ``(U, *shape)`` view."""
        return {
            name: stack[:, a:b].view(stack.shape[0], *shape)
            for name, (a, b, shape) in self._layout.items()
        }

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
    ) -> Iterator[DenseUpdates]:
        """Yield the clipped (noised) updates of ``users``, a chunk at a time."""
        w0, precond, users, round_num = self.checked_call(
            global_flat, users, round_num=round_num, config=config, rngs=rngs,
            preconditioner=preconditioner, stream=stream,
        )  # fmt: skip
        per_user = self.task.seq_len * config.batch_size * self.W * w0.element_size()
        size = max(1, min(self.chunk_users, LOGIT_BYTES // max(per_user, 1)))
        for start in range(0, len(users), size):
            chunk = users[start : start + size]
            yield self._train_chunk(w0, precond, chunk, round_num, config, rngs, stream)

    # ----------------------------------------------------------------------------- chunks
    def _prepare(
        self, user: int, round_num: int, config: LocalConfig, rngs: RngFactory, stream: str
    ) -> _User:
        """``user``'s examples and minibatches, drawn as LocalTrainer draws them."""
        x, y = self.task.user_data(user)
        subset, orders = epoch_orders(
            int(x.shape[0]),
            epochs=config.epochs,
            max_examples=config.max_examples,
            generator=rngs.generator(round_num, "shuffle", stream, user),
        )
        k, b = int(subset.numel()), config.batch_size
        batches = [order[s : s + b] for order in orders for s in range(0, k, b)]
        return _User(x[subset], y[subset], batches)

    def _train_chunk(
        self,
        w0: torch.Tensor,
        precond: torch.Tensor | None,
        users: list[int],
        round_num: int,
        config: LocalConfig,
        rngs: RngFactory,
        stream: str,
    ) -> DenseUpdates:
        data = [self._prepare(u, round_num, config, rngs, stream) for u in users]
        # longest first: the users still training at any step are a leading slice
        order = sorted(range(len(users)), key=lambda i: -len(data[i].batches))
        data = [data[i] for i in order]
        n = len(users)
        stack = w0.expand(n, -1).clone()
        pc = None if precond is None else self._views(precond[None])

        def train(k: int, slot: int) -> None:
            self._train_slots(stack, data, k, k + 1, pc, config)

        if self.stacked:  # the whole chunk at once: the batch a GPU needs
            with self._step_threads():
                self._train_slots(stack, data, 0, n, pc, config)
        elif self.workers() == 1 or n == 1:
            with self._step_threads():
                for k in range(n):
                    train(k, 0)
        else:  # one user at a time per worker, longest first (torch ops release the GIL)
            # run_chunks: each worker with one torch thread (with a thread's default count, the
            # updates depended on the machine's cores), stopped at its next step by Ctrl-C (a
            # pool's join waited for every running user; twenty-second review of issue 15)
            for _ in self.run_chunks(range(n), train, ahead=n):
                pass
        stack.sub_(w0)
        deltas = torch.empty(n, self.length, dtype=torch.float32)
        norms = [0.0] * n
        for slot, i in enumerate(order):
            deltas[i], norms[i] = self._finish(
                stack[slot], users[i], round_num, config, rngs, stream
            )
        return DenseUpdates(tuple(users), deltas, tuple(norms))

    def _train_slots(
        self,
        stack: torch.Tensor,
        data: list[_User],
        a: int,
        b: int,
        pc: dict[str, torch.Tensor] | None,
        config: LocalConfig,
    ) -> None:
        """Every local step of the users in rows ``a ... b - 1`` of ``stack`` (longest first)."""
        params, data = self._views(stack[a:b]), data[a:b]
        for t in range(len(data[0].batches)):
            self.check_stopped()
            active = sum(1 for d in data if len(d.batches) > t)
            x, y, sizes = self._step_batch(data[:active], t)
            p = {k: v[:active] for k, v in params.items()}
            sgd_step(p, pc, x, y, sizes, config.learning_rate)

    def _finish(
        self,
        delta: torch.Tensor,
        user: int,
        round_num: int,
        config: LocalConfig,
        rngs: RngFactory,
        stream: str,
    ) -> tuple[torch.Tensor, float]:
        """Clip (and noise) one user's update as LocalTrainer does; return it and its norm.

        The update is made float32 (what :class:`DenseUpdates` holds) before it is checked and
        clipped. Forty-second review of issue 15 (mechanisms 1): a float64 ``global_flat``
        trained a float64 stack, clipped it in float64 and cast the clipped update to float32
        afterwards, whose rounding left updates above ``C`` at every clip norm tried (up to
        1 + 2.2e-8 times it), and an entry beyond float32 infinite beside a finite norm.
        """
        delta = delta.to(dtype=torch.float32)
        if bool(torch.isfinite(delta).all()):
            if config.clip_norm is None:
                vector, norm = delta, l2_norm(delta)
            else:
                clipped = clip_l2(delta, config.clip_norm)
                vector, norm = clipped.vector, clipped.norm
        else:
            vector, norm = torch.zeros_like(delta), math.inf
        if config.noise_std > 0:
            gen = rngs.generator(round_num, "client-noise", stream, user, device=self.device)
            vector = add_gaussian_noise(vector, config.noise_std, generator=gen)
        return vector.to(device="cpu", dtype=torch.float32), float(norm)

    def _step_batch(
        self, data: list[_User], t: int
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Step ``t``'s minibatches of the active users, packed by time step.

        Each user's minibatch is ordered by length (non-pad targets), longest first (the order
        of a minibatch's examples does not change its mean loss), so at time ``j`` the examples
        still running are a leading slice of each; ``sizes[j]`` is the longest such slice over
        the users. Returns ``(a, P)`` ids ``x`` and targets ``y``, time step ``j`` at columns
        ``sum(sizes[:j]) ...`` (``P = sum(sizes)``; columns past a user's examples hold pad),
        and ``sizes``.
        """
        rows = max(int(d.batches[t].numel()) for d in data)
        seq = int(data[0].x.shape[1])
        x = torch.full((len(data), rows, seq), PAD, dtype=torch.int64)
        y = torch.full_like(x, PAD)
        lengths = torch.zeros(len(data), rows, dtype=torch.int64)
        for i, d in enumerate(data):
            pos = d.batches[t]
            yi = d.y[pos]
            # length: one past the last non-pad target (padding only follows a sentence)
            last = torch.where(yi != PAD, torch.arange(1, seq + 1), 0).amax(dim=1)
            order = torch.sort(last, descending=True, stable=True).indices
            x[i, : pos.numel()], y[i, : pos.numel()] = d.x[pos][order], yi[order]
            lengths[i, : pos.numel()] = last[order]
        width = max(1, int(lengths.max()))
        sizes = [max(1, int((lengths > j).sum(dim=1).max())) for j in range(width)]
        x = torch.cat([x[:, : sizes[j], j] for j in range(width)], dim=1)
        y = torch.cat([y[:, : sizes[j], j] for j in range(width)], dim=1)
        return x.to(self.device), y.to(self.device), sizes
