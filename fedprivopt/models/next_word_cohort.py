r"""Train a cohort of next-word-prediction users at once: stacked weights, batched matmuls.

The fast engine's vectorized client side for :class:`~fedprivopt.models.next_word.
StackOverflowNextWordTask`. It computes, for every user, the update of
:class:`~fedprivopt.clients.LocalTrainer` (same shuffles and example caps from the same keyed
generators, same minibatches in the same order, preconditioned local SGD, whole-update clipping,
the noise share of distributed-noise mode), up to float rounding:

* **stacked**: a chunk's ``U`` users each hold a copy of the flat model, one row of a ``(U, N)``
  matrix; every parameter is a strided ``(U, ...)`` view of it;
* **batched**: local step ``t`` of every user still training is one pass of the
  embedding-LSTM-projection-output model (:class:`~fedprivopt.models.next_word_model.
  NextWordLSTM`) written with batched matmuls (``torch.baddbmm``) over the users, and one
  hand-written backward pass (the LSTM's cell by cell, its weight gradients as one matmul over all
  time steps), so that no autograd graph is built and no per-time-step weight gradient is ever
  summed;
* **prefix-active**: users are ordered by their number of local steps, longest first, so the
  users still training at step ``t`` are always a leading slice of the stack (finished users cost
  nothing, and no copy is made to drop them).

A minibatch is padded to the longest of the step (rows and time steps): padded targets weigh 0,
and since padding only follows a sentence and the LSTM is causal, no real target's loss changes.
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

from fedprivopt.core.local import LocalConfig, epoch_orders
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
        """``(user, update)`` of every user (rows of :attr:`deltas`, disjoint memory)."""
        return [(u, self.deltas[i]) for i, u in enumerate(self.users)]

    def clone(self) -> DenseUpdates:
        """A copy that owns its tensors."""
        return DenseUpdates(self.users, self.deltas.clone(), self.norms)


@dataclass
class _User:
    """One user's examples for this round and its minibatches, in order."""

    x: torch.Tensor  # (k, seq_len) inputs of the picked examples
    y: torch.Tensor  # (k, seq_len) targets
    batches: list[torch.Tensor]  # positions into x of each local step's minibatch


class NextWordCohortTrainer:
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

    Attributes
    ----------
    noise_shares : bool
        True: :meth:`train_batches` adds distributed-noise shares (``config.noise_std > 0``).
    """

    noise_shares = True

    def __init__(self, task, *, device: str | torch.device | None = None, chunk_users: int = 256):
        if isinstance(chunk_users, bool) or int(chunk_users) < 1:
            raise ValueError(f"chunk_users must be an integer >= 1, got {chunk_users!r}")
        self.task = task
        self.W = int(task.num_tokens)
        self.e = int(task.embedding_dim)
        self.h = int(task.hidden_size)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.chunk_users = int(chunk_users)
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
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield ``(user, clipped update)`` for ``users``, in their order.

        Arguments mean what they mean for :meth:`~fedprivopt.clients.LocalTrainer.train`.
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
    ) -> Iterator[DenseUpdates]:
        """Yield the clipped (noised) updates of ``users``, a chunk at a time."""
        if global_flat.dim() != 1 or global_flat.numel() != self.length:
            raise ValueError(
                f"global_flat must be a flat vector of {self.length} entries, got shape "
                f"{tuple(global_flat.shape)}"
            )
        w0 = global_flat.detach().to(self.device)
        precond = None
        if preconditioner is not None:
            if preconditioner.shape != global_flat.shape:
                raise ValueError("preconditioner must have the layout of global_flat")
            precond = preconditioner.detach().to(device=self.device, dtype=w0.dtype)
            if not bool(torch.all(torch.isfinite(precond) & (precond > 0))):
                raise ValueError("preconditioner must be finite and > 0 everywhere")
        users = [int(u) for u in users]
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
        grad = torch.empty_like(stack)
        params, grads = self._views(stack), self._views(grad)
        steps = len(data[0].batches) if data else 0
        for t in range(steps):
            active = sum(1 for d in data if len(d.batches) > t)
            x, y = self._step_batch([d for d in data[:active]], t)
            p = {k: v[:active] for k, v in params.items()}
            g = {k: v[:active] for k, v in grads.items()}
            self._gradients(p, g, x, y)
            if precond is not None:
                grad[:active].div_(precond)
            stack[:active].sub_(grad[:active], alpha=config.learning_rate)
        stack.sub_(w0)
        deltas = torch.empty(n, self.length, dtype=torch.float32)
        norms = [0.0] * n
        for slot, i in enumerate(order):
            deltas[i], norms[i] = self._finish(
                stack[slot], users[i], round_num, config, rngs, stream
            )
        return DenseUpdates(tuple(users), deltas, tuple(norms))

    def _finish(
        self,
        delta: torch.Tensor,
        user: int,
        round_num: int,
        config: LocalConfig,
        rngs: RngFactory,
        stream: str,
    ) -> tuple[torch.Tensor, float]:
        """Clip (and noise) one user's update as LocalTrainer does; return it and its norm."""
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

    def _step_batch(self, data: list[_User], t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``t``'s minibatches of the active users, padded: ids ``(a, T, B)``, time-major.

        ``T`` is the last column holding a non-pad target of any of them, ``B`` the largest
        minibatch.
        """
        rows = max(int(d.batches[t].numel()) for d in data)
        seq = int(data[0].x.shape[1])
        x = torch.full((len(data), rows, seq), PAD, dtype=torch.int64)
        y = torch.full_like(x, PAD)
        for i, d in enumerate(data):
            pos = d.batches[t]
            x[i, : pos.numel()] = d.x[pos]
            y[i, : pos.numel()] = d.y[pos]
        cols = torch.nonzero((y != PAD).flatten(0, 1).any(dim=0))
        width = int(cols.max()) + 1 if cols.numel() else 1
        x = x[:, :, :width].transpose(1, 2).contiguous().to(self.device)
        y = y[:, :, :width].transpose(1, 2).contiguous().to(self.device)
        return x, y

    # --------------------------------------------------------------------- forward/backward
    def _gradients(
        self,
        p: dict[str, torch.Tensor],
        g: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> None:
        """Write into ``g`` the gradient of every active user's mean minibatch loss.

        ``p`` and ``g`` hold ``(a, *shape)`` views of the parameters and of their gradients; ``x``
        and ``y`` are ``(a, T, B)`` ids. The forward pass keeps the gate activations and cell
        states; the backward pass is the LSTM's, written out (PyTorch's gate order: input,
        forget, cell, output).
        """
        a, T, B = x.shape
        h = self.h
        dtype = p["emb"].dtype
        users = torch.arange(a, device=x.device)[:, None, None]
        # -------- forward
        xe = p["emb"][users, x].reshape(a, T * B, self.e)  # (a, TB, e)
        bias = (p["b_ih"] + p["b_hh"])[:, None, :]
        acts = torch.baddbmm(bias, xe, p["w_ih"].transpose(1, 2))  # (a, TB, 4h) pre-activations
        w_hh_t = p["w_hh"].transpose(1, 2)
        hs = torch.zeros(a, (T + 1) * B, h, dtype=dtype, device=x.device)  # h_0 = 0, then h_t
        cs = torch.zeros(a, (T + 1) * B, h, dtype=dtype, device=x.device)
        tcs = torch.empty(a, T * B, h, dtype=dtype, device=x.device)
        for t in range(T):
            cur = slice(t * B, (t + 1) * B)
            nxt = slice((t + 1) * B, (t + 2) * B)
            gates = acts[:, cur]
            gates.baddbmm_(hs[:, cur], w_hh_t)
            gates[..., : 2 * h].sigmoid_()
            gates[..., 2 * h : 3 * h].tanh_()
            gates[..., 3 * h :].sigmoid_()
            i, f, c_in, o = gates.split(h, dim=2)
            c = torch.addcmul(f * cs[:, cur], i, c_in, out=cs[:, nxt])
            tc = torch.tanh(c, out=tcs[:, cur])
            torch.mul(o, tc, out=hs[:, nxt])
        out_h = hs[:, B:]
        proj = torch.baddbmm(p["b_p"][:, None, :], out_h, p["w_p"].transpose(1, 2))  # (a, TB, e)
        logits = torch.baddbmm(p["b_o"][:, None, :], proj, p["w_o"].transpose(1, 2))
        # -------- d (sum over users of each one's mean loss) / d logits: softmax - one-hot
        target = y.reshape(a, T * B)
        valid = target != PAD
        count = valid.sum(dim=1, keepdim=True).clamp_min(1).to(dtype)
        weight = valid.to(dtype) / count  # (a, TB)
        dlogits = logits.softmax(dim=2)
        del logits
        dlogits.scatter_add_(2, target[..., None], -torch.ones_like(weight)[..., None])
        dlogits.mul_(weight[..., None])
        # -------- output and projection layers
        g["w_o"].copy_(torch.bmm(dlogits.transpose(1, 2), proj))
        g["b_o"].copy_(dlogits.sum(dim=1))
        dproj = torch.bmm(dlogits, p["w_o"])  # (a, TB, e)
        del dlogits
        g["w_p"].copy_(torch.bmm(dproj.transpose(1, 2), out_h))
        g["b_p"].copy_(dproj.sum(dim=1))
        dh_all = torch.bmm(dproj, p["w_p"])  # (a, TB, h): d loss / d h_t from the outputs
        # -------- LSTM, backwards through time
        dgates = torch.empty_like(acts)
        dh = torch.zeros(a, B, h, dtype=dtype, device=x.device)
        dc = torch.zeros_like(dh)
        w_hh = p["w_hh"]
        for t in reversed(range(T)):
            cur = slice(t * B, (t + 1) * B)
            i, f, c_in, o = acts[:, cur].split(h, dim=2)
            di, df, dc_in, do = dgates[:, cur].split(h, dim=2)
            tc = tcs[:, cur]
            dh += dh_all[:, cur]
            torch.mul(dh, tc, out=do)
            dc.addcmul_(dh * o, 1.0 - tc * tc)
            torch.mul(dc, c_in, out=di)
            torch.mul(dc, i, out=dc_in)
            torch.mul(dc, cs[:, cur], out=df)
            dc.mul_(f)
            # through the activations: sigmoid' = s (1 - s), tanh' = 1 - t^2
            di.mul_(i * (1.0 - i))
            df.mul_(f * (1.0 - f))
            dc_in.mul_(1.0 - c_in * c_in)
            do.mul_(o * (1.0 - o))
            torch.bmm(dgates[:, cur], w_hh, out=dh)
        dgates_t = dgates.transpose(1, 2)
        g["w_hh"].copy_(torch.bmm(dgates_t, hs[:, : T * B]))
        g["w_ih"].copy_(torch.bmm(dgates_t, xe))
        g["b_ih"].copy_(dgates.sum(dim=1))
        g["b_hh"].copy_(g["b_ih"])
        dxe = torch.bmm(dgates, p["w_ih"])  # (a, TB, e)
        g["emb"].zero_()
        g["emb"].index_put_((users.reshape(a, 1).expand(a, T * B), x.reshape(a, T * B)), dxe,
                            accumulate=True)  # fmt: skip
