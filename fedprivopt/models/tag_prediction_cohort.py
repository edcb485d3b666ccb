r"""Train a whole cohort of tag-prediction users at once, on the rows their words touch.

The fast engine's vectorized client side for :class:`~fedprivopt.models.tag_prediction.
StackOverflowTagTask`. It computes, for every user, the same clipped update as
:class:`~fedprivopt.clients.LocalTrainer` (same shuffles from the same keyed generators, same
minibatches, preconditioned local SGD, whole-update clipping), up to float rounding, but

* **row-sparse**: viewed as a ``(V + 1, K)`` matrix, the flat model's row ``j < V`` holds word
  ``j``'s weights and row ``V`` the bias. A user's local SGD only changes the rows of the words it
  wrote and the bias, so each user trains a copy of just those rows and its update is returned as
  a :class:`~fedprivopt.privacy.RowSparse` (clipped on those rows: every other entry is exactly
  zero);
* **vectorized**: the users of a chunk are stacked into one matrix of rows; local step ``t`` of
  every user still training is one ``embedding_bag`` forward and backward over the union of their
  ``t``-th minibatches. Each user's loss is its own minibatch mean, and users' rows are disjoint,
  so each row receives exactly its user's gradient.

Costs per round are proportional to the cohort's words (tokens x K), not to ``users x V x K``.

Noise shares (distributed-noise mode) are dense, so that mode is not handled here: the engine
trains users one at a time with :class:`~fedprivopt.clients.LocalTrainer` then.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedprivopt.clients.trainer import LocalConfig, epoch_orders
from fedprivopt.privacy.clip import clip_l2
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.privacy.sparse import RowSparse

__all__ = ["TagCohortTrainer"]


@dataclass
class _User:
    user: int
    rows: torch.Tensor  # sorted word rows the user's examples touch (int64, CPU)
    visits: torch.Tensor  # the epochs' orders, concatenated: positions among its examples
    examples: int  # k, examples used this round
    tokens: torch.Tensor  # its examples' in-vocabulary word ids, concatenated (int64)
    weights: torch.Tensor  # their bag weights: 1 / words of the example, OOV included (float32)
    lengths: torch.Tensor  # in-vocabulary words per example (int64, k)
    labels: torch.Tensor  # (k,) single labels or (k, K) multi-hot float32


def _ragged_take(
    values: torch.Tensor, lengths: torch.Tensor, take: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ragged rows ``take`` of ``(values, lengths)``, concatenated, and their lengths."""
    starts = torch.cumsum(lengths, 0) - lengths
    lens = lengths[take]
    total = int(lens.sum())
    index = torch.repeat_interleave(starts[take] - (torch.cumsum(lens, 0) - lens), lens,
                                    output_size=total)  # fmt: skip
    return values[index + torch.arange(total)], lens


class TagCohortTrainer:
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
        torch intra-op threads while a cohort is trained on the CPU, ``>= 1`` (restored when
        :meth:`train`'s iterator ends); ``None`` leaves torch's setting alone. Default 1: the
        steps are many small gather/scatter operations that gain nothing from a second thread
        on an idle machine, and every parallel region waits for a descheduled thread when
        another process is busy (measured on 2 cores: ``index_add_`` of 300 rows 0.04 ms with
        1 thread, 72 ms with 2 while another process ran; ``benchmarks/NOTES.md``). For more
        cores, shard the cohort over Ray actors (``fast-actors``).
    """

    def __init__(
        self,
        task,
        *,
        device: str | torch.device | None = None,
        chunk_users: int = 256,
        cpu_threads: int | None = 1,
    ):
        if int(chunk_users) < 1:
            raise ValueError(f"chunk_users must be an integer >= 1, got {chunk_users!r}")
        if cpu_threads is not None and (isinstance(cpu_threads, bool) or int(cpu_threads) < 1):
            raise ValueError(f"cpu_threads must be an integer >= 1 or None, got {cpu_threads!r}")
        self.cpu_threads = None if cpu_threads is None else int(cpu_threads)
        self.task = task
        self.vocab_size = int(task.num_features)
        self.num_tags = int(task.num_tags)
        self.length = (self.vocab_size + 1) * self.num_tags
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.chunk_users = int(chunk_users)
        self._workspace: dict[str, torch.Tensor] = {}

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
    ) -> Iterator[tuple[int, RowSparse]]:
        """Yield ``(user, clipped row-sparse update)`` for ``users``, in their order.

        Arguments mean what they mean for :meth:`~fedprivopt.clients.LocalTrainer.train`;
        ``config.noise_std`` must be 0 (no dense noise shares here).
        """
        if config.noise_std > 0:
            raise ValueError("TagCohortTrainer adds no noise shares: noise_std must be 0")
        if global_flat.dim() != 1 or global_flat.numel() != self.length:
            raise ValueError(
                f"global_flat must be a flat vector of {self.length} entries, got shape "
                f"{tuple(global_flat.shape)}"
            )
        dtype = global_flat.dtype
        model = global_flat.detach().to(self.device).view(self.vocab_size + 1, self.num_tags)
        precond = None
        if preconditioner is not None:
            if preconditioner.shape != global_flat.shape:
                raise ValueError("preconditioner must have the layout of global_flat")
            precond = preconditioner.detach().to(device=self.device, dtype=dtype)
            if not bool(torch.all(torch.isfinite(precond) & (precond > 0))):
                raise ValueError("preconditioner must be finite and > 0 everywhere")
            precond = precond.view(self.vocab_size + 1, self.num_tags)
        users = [int(u) for u in users]
        threads = torch.get_num_threads()
        if self.cpu_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(self.cpu_threads)
        try:
            for start in range(0, len(users), self.chunk_users):
                chunk = users[start : start + self.chunk_users]
                yield from self._train_chunk(model, precond, chunk, round_num, config, rngs, stream)
        finally:
            torch.set_num_threads(threads)

    # ----------------------------------------------------------------------------- chunks
    def _prepare(
        self, user: int, round_num: int, config: LocalConfig, rngs: RngFactory, stream: str
    ) -> _User:
        V, K = self.vocab_size, self.num_tags
        data = self.task.user_csr(user)
        subset, orders = epoch_orders(
            int(data.lengths.numel()),
            epochs=config.epochs,
            max_examples=config.max_examples,
            generator=rngs.generator(round_num, "shuffle", stream, user),
        )
        k = int(subset.numel())
        tokens, lengths = _ragged_take(data.tokens, data.lengths, subset)
        owner = torch.repeat_interleave(torch.arange(k), lengths, output_size=int(tokens.numel()))
        in_vocab = tokens < V
        # bag weights as bag_of_words: 1 / (words of the example, OOV included), float32
        weights = (1.0 / lengths.clamp_min(1).to(torch.float32))[owner[in_vocab]]
        if self.task.single_label:
            labels = data.labels[subset]
        else:
            tags, tag_lengths = _ragged_take(data.labels, data.label_lengths, subset)
            labels = torch.zeros(k, K, dtype=torch.float32)
            labels[torch.repeat_interleave(torch.arange(k), tag_lengths), tags] = 1.0
        tokens = tokens[in_vocab]
        return _User(
            user=user,
            rows=torch.unique(tokens),
            visits=torch.cat(orders) if orders else torch.empty(0, dtype=torch.int64),
            examples=k,
            tokens=tokens,
            weights=weights,
            lengths=torch.bincount(owner[in_vocab], minlength=k),
            labels=labels,
        )

    def _train_chunk(
        self,
        model: torch.Tensor,
        precond: torch.Tensor | None,
        users: list[int],
        round_num: int,
        config: LocalConfig,
        rngs: RngFactory,
        stream: str,
    ) -> Iterator[tuple[int, RowSparse]]:
        V, K, dev = self.vocab_size, self.num_tags, self.device
        infos = [self._prepare(u, round_num, config, rngs, stream) for u in users]

        # stacked rows: user i's words at row_offset[i] + position in its sorted rows
        row_offset = [0]
        for info in infos:
            row_offset.append(row_offset[-1] + int(info.rows.numel()))
        rows_dev = torch.cat([i.rows for i in infos]).to(dev)
        weights_st = self._gather("rows", model, rows_dev)
        start_w = self._gather("start", model, rows_dev)
        bias_st = model[V].expand(len(users), K).clone()
        start_b = model[V].clone()
        if precond is not None:
            p_rows, p_bias = precond[rows_dev], precond[V]

        # every example of the chunk as a bag of its in-vocabulary words (CSR: out-of-vocabulary
        # words weigh 0 and are left out, so no padding is ever processed): stacked row ids,
        # bag weights 1 / (words of the example, OOV included), per-example labels and owner
        ex_offset = [0]
        tok_parts, w_parts, len_parts, y_parts = [], [], [], []
        for i, info in enumerate(infos):
            ex_offset.append(ex_offset[-1] + info.examples)
            if info.examples == 0:
                continue
            tok_parts.append(torch.searchsorted(info.rows, info.tokens) + row_offset[i])
            w_parts.append(info.weights)
            len_parts.append(info.lengths)
            y_parts.append(info.labels)
        if not y_parts:
            yield from self._emit(infos, weights_st, start_w, bias_st, start_b, row_offset, config)
            return
        tok_ids = torch.cat(tok_parts).to(dev)
        tok_w = torch.cat(w_parts).to(device=dev, dtype=model.dtype)
        ex_len = torch.cat(len_parts).to(dev)
        ex_ptr = torch.cumsum(ex_len, 0) - ex_len
        y_all = torch.cat(y_parts).to(dev)
        owner_all = torch.repeat_interleave(
            torch.arange(len(users)), torch.tensor(ex_offset[1:]) - torch.tensor(ex_offset[:-1])
        ).to(dev)

        visits, steps_of, scale_of = self._schedule(infos, ex_offset, config.batch_size)
        bounds = torch.cumsum(torch.bincount(steps_of), 0).tolist()
        visits, owners_all = visits.to(dev), owner_all[visits.to(dev)]
        scale_of = scale_of.to(device=dev, dtype=model.dtype)
        lr = config.learning_rate
        for t, stop in enumerate(bounds):
            begin = bounds[t - 1] if t else 0
            batch, scale = visits[begin:stop], scale_of[begin:stop]
            act, owner_pos = torch.unique_consecutive(owners_all[begin:stop], return_inverse=True)
            lens = ex_len[batch]
            offsets = torch.cumsum(lens, 0) - lens
            total = int(lens.sum())
            where = torch.repeat_interleave(ex_ptr[batch] - offsets, lens, output_size=total)
            where += torch.arange(total, device=dev)
            touched, inverse = torch.unique(tok_ids[where], return_inverse=True)
            w_leaf = self._gather("leaf", weights_st, touched).requires_grad_(True)
            if total:
                bags = F.embedding_bag(
                    inverse, w_leaf, offsets, per_sample_weights=tok_w[where], mode="sum"
                )
                logits = bags.detach() + bias_st[act][owner_pos]
            else:  # no vocabulary word in this step's minibatches: only the biases learn
                logits = bias_st[act][owner_pos]
            # d loss / d logits of each user's minibatch-mean loss, in closed form: the loss
            # values themselves are never needed, only their gradients
            if self.task.single_label:
                grad = torch.softmax(logits, dim=1)
                grad[torch.arange(grad.shape[0], device=dev), y_all[batch]] -= 1.0
                grad.mul_(scale[:, None])
            else:  # mean binary cross-entropy over the K tags
                grad = torch.sigmoid(logits).sub_(y_all[batch]).mul_((scale / K)[:, None])
            grad_b = torch.zeros(act.numel(), K, dtype=model.dtype, device=dev)
            grad_b.index_add_(0, owner_pos, grad)
            with torch.no_grad():
                if precond is not None:
                    grad_b /= p_bias
                bias_st.index_add_(0, act, grad_b, alpha=-lr)
            if total:  # embedding_bag's own backward: each word row += its weight x gradient
                (grad_w,) = torch.autograd.grad(bags, [w_leaf], grad_outputs=grad)
                with torch.no_grad():
                    if precond is not None:
                        grad_w = grad_w / p_rows[touched]
                    # the gathered rows are a private copy: step them, then scatter back
                    weights_st.index_copy_(0, touched, w_leaf.detach().sub_(grad_w, alpha=lr))
        yield from self._emit(infos, weights_st, start_w, bias_st, start_b, row_offset, config)

    def _gather(self, name: str, source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``source[index]`` written into a reused workspace (a view of it).

        Large fresh tensors cost more in page faults than in copying (measured: gathering 55,000
        rows of 500 floats into a new tensor 134 ms, into a reused one 29 ms).
        """
        n, width = int(index.numel()), int(source.shape[1])
        buf = self._workspace.get(name)
        if buf is None or buf.shape[0] < n or buf.shape[1] != width or buf.device != source.device:
            buf = torch.empty(
                max(n, 1) * 5 // 4 + 1, width, dtype=source.dtype, device=source.device
            )
            self._workspace[name] = buf
        return torch.index_select(source, 0, index, out=buf[:n])

    @staticmethod
    def _schedule(
        infos: list[_User], ex_offset: list[int], batch_size: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every example visit of the chunk, ordered by local step, then user, then position.

        User ``i``'s visit ``j`` (of its ``epochs x k`` visits) is in epoch ``j // k`` at position
        ``p = j % k``, so in its local step ``(j // k) * ceil(k / b) + p // b``, a minibatch of
        ``min(b, k - (p // b) b)`` examples whose mean loss weighs each example by the inverse.

        Returns
        -------
        visits : torch.Tensor
            Example indices into the chunk's stacked examples, sorted by step (stable).
        steps : torch.Tensor
            The step of each visit (sorted).
        scale : torch.Tensor
            ``1 / minibatch size`` of each visit.
        """
        counts = torch.tensor([int(i.visits.numel()) for i in infos])
        owner = torch.repeat_interleave(torch.arange(len(infos)), counts)
        k = torch.tensor([i.examples for i in infos])[owner]
        starts = torch.cumsum(counts, 0) - counts
        j = torch.arange(int(counts.sum())) - starts[owner]
        epoch, pos = j // k.clamp_min(1), j % k.clamp_min(1)
        per_epoch = (k + batch_size - 1) // batch_size
        step = epoch * per_epoch + pos // batch_size
        size = torch.clamp(k - (pos // batch_size) * batch_size, max=batch_size)
        visits = torch.cat([i.visits for i in infos]) + torch.tensor(ex_offset[:-1])[owner]
        order = torch.sort(step, stable=True).indices
        return visits[order], step[order], 1.0 / size[order].to(torch.float64)

    def _emit(
        self,
        infos: list[_User],
        weights_st: torch.Tensor,
        start_w: torch.Tensor,
        bias_st: torch.Tensor,
        start_b: torch.Tensor,
        row_offset: list[int],
        config: LocalConfig,
    ) -> Iterator[tuple[int, RowSparse]]:
        V = self.vocab_size
        delta_w = weights_st.sub_(start_w).cpu()  # in place: the chunk's workspace is done
        delta_b = (bias_st - start_b).cpu()
        bias_row = torch.tensor([V], dtype=torch.int64)
        for i, info in enumerate(infos):
            values = torch.cat([delta_w[row_offset[i] : row_offset[i + 1]], delta_b[i : i + 1]])
            flat = values.reshape(-1)
            if config.clip_norm is not None:
                try:  # one pass: the norm is finite exactly when the update is
                    flat = clip_l2(flat, config.clip_norm).vector
                except ValueError:  # diverged (NaN/Inf): the zero update, as LocalTrainer's
                    flat = torch.zeros_like(flat)
            elif not bool(torch.isfinite(flat).all()):
                flat = torch.zeros_like(flat)
            rows = torch.cat([info.rows, bias_row])
            yield info.user, RowSparse(rows, flat.view(-1, self.num_tags), self.length)

    def __repr__(self) -> str:
        return (
            f"TagCohortTrainer(V={self.vocab_size}, K={self.num_tags}, device={self.device}, "
            f"chunk_users={self.chunk_users})"
        )
