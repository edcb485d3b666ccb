"""A chunk of tag-prediction users laid out for :mod:`~fedprivopt.models.tag_prediction_cohort`.

:func:`prepare_chunk` reads a chunk's examples for a round (each user's subset and epoch orders
from its own keyed generator, as :class:`~fedprivopt.clients.LocalTrainer` draws them) and lays
them out as a :class:`TagChunk`: the users' stacked rows (their words, then the bias) and every
example's bag over them. :func:`visit_schedule` orders the chunk's example visits by local step,
the order in which :class:`~fedprivopt.models.tag_prediction_cohort.TagCohortTrainer` trains
them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedprivopt.core.local import LocalConfig, epoch_orders
from fedprivopt.privacy.rng import RngFactory

__all__ = ["TagChunk", "prepare_chunk", "visit_schedule"]


@dataclass
class TagChunk:
    """A chunk of users' data for this round, laid out for training (all int64 unless noted).

    The stacked rows hold user ``i``'s sorted word rows, then its bias row (``V``), at
    ``row_ptr[i] ... row_ptr[i + 1] - 1``: exactly the layout of the batch of updates returned.
    """

    rows: torch.Tensor  # (R,) model row of each stacked row
    row_ptr: torch.Tensor  # (n + 1,) each user's stacked rows
    examples: torch.Tensor  # (n,) examples each user uses this round (k)
    ex_user: torch.Tensor  # (E,) user (position in the chunk) of each example, user-major
    visits: torch.Tensor  # the users' epoch orders, concatenated: positions among its examples
    visit_counts: torch.Tensor  # (n,) epochs x k
    tok_ids: torch.Tensor  # stacked rows of each example's bag: its words, then its bias row
    tok_w: torch.Tensor  # float32 bag weights: 1 / words of the example (OOV included); bias 1
    ex_len: torch.Tensor  # (E,) bag length: in-vocabulary words + 1
    labels: torch.Tensor  # each example's tag ids, concatenated (one each if single-label)
    label_ptr: torch.Tensor  # (E + 1,) each example's labels


def prepare_chunk(
    task,
    vocab_size: int,
    users: list[int],
    round_num: int,
    config: LocalConfig,
    rngs: RngFactory,
    stream: str,
) -> TagChunk:
    """The chunk's data for this round.

    Each user's example subset and epoch orders come from its own keyed generator, drawn as
    :class:`~fedprivopt.clients.LocalTrainer` draws them; the rest is done for the chunk at
    once (one read of the picked examples, one ``unique`` for every user's rows).
    """
    V, n = vocab_size, len(users)
    picks, orders = [], []
    for user, size in zip(users, task.user_sizes(users), strict=True):
        subset, order = epoch_orders(
            size,
            epochs=config.epochs,
            max_examples=config.max_examples,
            generator=rngs.generator(round_num, "shuffle", stream, user),
        )
        picks.append(subset)
        orders.append(torch.cat(order) if order else torch.empty(0, dtype=torch.int64))
    data = task.examples_csr(users, picks)
    examples = torch.tensor([int(p.numel()) for p in picks], dtype=torch.int64)
    n_ex = int(examples.sum())
    ex_user = torch.repeat_interleave(torch.arange(n), examples, output_size=n_ex)
    tok_ex = torch.repeat_interleave(
        torch.arange(n_ex), data.lengths, output_size=int(data.tokens.numel())
    )
    in_vocab = data.tokens < V
    # bag weights as bag_of_words: 1 / (words of the example, OOV included), float32
    word_w = (1.0 / data.lengths.clamp_min(1).to(torch.float32))[tok_ex[in_vocab]]
    tok_ex, tokens = tok_ex[in_vocab], data.tokens[in_vocab]
    tok_user = ex_user[tok_ex]
    # each user's distinct words, user-major and sorted: its stacked rows
    words, inverse = torch.unique(tok_user * V + tokens, return_inverse=True)
    word_user = torch.div(words, V, rounding_mode="floor")
    row_ptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(word_user, minlength=n) + 1, 0, out=row_ptr[1:])
    rows = torch.full((int(row_ptr[-1]),), V, dtype=torch.int64)
    rows[torch.arange(words.numel()) + word_user] = words - word_user * V
    # every example's bag ends with its user's bias row, weight 1: the forward adds the
    # bias, and the backward sums the bias gradient, with the words (no separate pass)
    word_ids = inverse + tok_user  # one bias row per earlier user precedes its rows
    ex_len = torch.bincount(tok_ex, minlength=n_ex) + 1
    bias_pos = torch.cumsum(ex_len, 0) - 1
    tok_ids = torch.empty(int(bias_pos[-1]) + 1 if n_ex else 0, dtype=torch.int64)
    tok_w = torch.empty(tok_ids.numel(), dtype=torch.float32)
    word_pos = torch.arange(word_ids.numel()) + tok_ex  # one bias token per earlier example
    tok_ids[word_pos], tok_w[word_pos] = word_ids, word_w
    tok_ids[bias_pos], tok_w[bias_pos] = row_ptr[1:][ex_user] - 1, 1.0
    if task.single_label:
        label_ptr = torch.arange(n_ex + 1)
    else:
        label_ptr = torch.zeros(n_ex + 1, dtype=torch.int64)
        torch.cumsum(data.label_lengths, 0, out=label_ptr[1:])
    return TagChunk(
        rows=rows,
        row_ptr=row_ptr,
        examples=examples,
        ex_user=ex_user,
        visits=torch.cat(orders) if orders else torch.empty(0, dtype=torch.int64),
        visit_counts=torch.tensor([int(o.numel()) for o in orders], dtype=torch.int64),
        tok_ids=tok_ids,
        tok_w=tok_w,
        ex_len=ex_len,
        labels=data.labels,
        label_ptr=label_ptr,
    )


def visit_schedule(
    chunk: TagChunk, batch_size: int
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
    counts = chunk.visit_counts
    total = int(counts.sum())
    owner = torch.repeat_interleave(torch.arange(counts.numel()), counts, output_size=total)
    k = chunk.examples[owner]
    starts = torch.cumsum(counts, 0) - counts
    j = torch.arange(total) - starts[owner]
    epoch, pos = j // k.clamp_min(1), j % k.clamp_min(1)
    per_epoch = (k + batch_size - 1) // batch_size
    step = epoch * per_epoch + pos // batch_size
    size = torch.clamp(k - (pos // batch_size) * batch_size, max=batch_size)
    ex_offset = torch.cumsum(chunk.examples, 0) - chunk.examples
    visits = chunk.visits + ex_offset[owner]
    order = torch.sort(step, stable=True).indices
    return visits[order], step[order], 1.0 / size[order].to(torch.float64)
