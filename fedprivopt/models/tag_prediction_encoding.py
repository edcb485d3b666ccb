r"""How tag-prediction examples are stored: word-id and tag-id tensors, padded or ragged.

The encoding of :class:`~fedprivopt.models.tag_prediction.StackOverflowTagTask`'s examples and the
dense views of it: :func:`encode_examples` turns examples into word-id and tag-id lists,
:func:`example_tensors` pads them into the tensors below, :class:`UserCSR` and
:func:`ragged_index`/:func:`ragged_take` hold and slice the same data without padding (what the
token store and the cohort trainer use), and :func:`bag_of_words`, :func:`dense_features` and
:func:`multi_hot` read the tensors as features and labels.

Features (TFF's convention)
---------------------------
TFF joins ``tokens`` and ``title`` with a space, splits on whitespace, maps every word to its
rank among the top ``V`` words of ``stackoverflow.word_count`` or to one out-of-vocabulary (OOV)
bucket, averages the ``V + 1``-dimensional one-hot vectors and drops the OOV coordinate. So the
feature of word ``j`` is ``(occurrences of j) / (number of words, OOV included)``: OOV words
contribute nothing but do count in the denominator. We reproduce this exactly.

They are stored **sparsely**: ``x`` is an ``int64`` tensor ``(n, L)`` of word ids, one per word
of the example in order, with ``0 <= id < V`` for vocabulary words, ``id = V`` for
out-of-vocabulary words and ``id = V + 1`` for padding (``L`` is the longest example of the
tensor). :func:`bag_of_words` turns it into ``(ids, weights)`` for
``torch.nn.functional.embedding_bag`` and :func:`dense_features` into the dense ``(n, V)``
matrix (tests and small references only). Rows of ``x`` are independent, so ``x[subset]``
indexing (as :class:`~fedprivopt.clients.LocalTrainer` does) keeps the meaning. The weight rows
a batch can change are ``unique(x[x < V])``: the gradient of every other row is exactly zero
(what a row-sparse engine relies on).

Labels
------
*Multi-label* (TFF, the default): ``y`` is an ``int64`` tensor ``(n, T)`` of the example's tag ids
among the top ``K`` (``0 <= id < K``, tag id = popularity rank), padded with ``K``;
:func:`multi_hot` gives the ``(n, K)`` 0/1 matrix. Examples without any top-``K`` tag are kept with
an all-zero label row, as TFF does (they teach the model to score every tag low, and count in
precision@5 but not in recall@5). *Single-label* (AdaDPS' variant [1]_): ``y`` is ``(n,)`` with the
most popular top-``K`` tag of the example (its smallest tag id); examples without a top-``K`` tag
are **dropped** (AdaDPS' script labels them with tag 0 through ``argmax`` of an all-zero vector,
an artefact we do not copy).

References
----------
.. [1] T. Li, M. Zaheer, S. Reddi, V. Smith, "Private adaptive optimization with side
   information", ICML 2022.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from fedprivopt.data.stackoverflow import StackOverflowExample

__all__ = [
    "UserCSR",
    "bag_of_words",
    "dense_features",
    "encode_examples",
    "encode_texts",
    "example_tensors",
    "long_tensor",
    "multi_hot",
    "pad_ragged",
    "ragged_index",
    "ragged_take",
]


def encode_examples(
    examples: Sequence[StackOverflowExample],
    word_index: dict[str, int],
    tag_index: dict[str, int],
    *,
    single_label: bool,
) -> tuple[list[list[int]], list[list[int]] | list[int]]:
    """Encode examples as word-id lists and tag-id lists (or single labels).

    Parameters
    ----------
    examples : sequence of StackOverflowExample
        The examples, in order.
    word_index : dict of str to int
        Word to id in ``[0, V)``; any other word gets the OOV id ``V = len(word_index)``.
    tag_index : dict of str to int
        Tag to id in ``[0, K)`` (popularity rank); other tags are ignored.
    single_label : bool
        Return one label per example (its smallest tag id) and drop examples without one.

    Returns
    -------
    words : list of list of int
        Word ids of ``tokens + " " + title`` split on whitespace, OOV words as ``V``.
    labels : list of list of int, or list of int
        Sorted distinct tag ids per example, or the single labels.
    """
    texts = [(ex.tokens, ex.title, ex.tags) for ex in examples]
    return encode_texts(texts, word_index, tag_index, single_label=single_label)


def encode_texts(
    texts: Sequence[tuple[str, str, str]],
    word_index: dict[str, int],
    tag_index: dict[str, int],
    *,
    single_label: bool,
) -> tuple[list[list[int]], list[list[int]] | list[int]]:
    """:func:`encode_examples` on ``(tokens, title, tags)`` triples."""
    oov = len(word_index)
    lookup = word_index.get
    words: list[list[int]] = []
    labels: list = []
    for tokens, title, tag_text in texts:
        tags = sorted({tag_index[t] for t in tag_text.split("|") if t in tag_index})
        if single_label:
            if not tags:
                continue
            labels.append(tags[0])
        else:
            labels.append(tags)
        words.append([lookup(w, oov) for w in (tokens + " " + title).split()])
    return words, labels


def _pad(rows: Sequence[Sequence[int]], fill: int, *, min_width: int = 1) -> torch.Tensor:
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    width = max(min_width, int(lengths.max()) if len(rows) else 0)
    out = np.full((len(rows), width), fill, dtype=np.int64)
    if lengths.sum():
        values = np.fromiter(itertools.chain.from_iterable(rows), np.int64, int(lengths.sum()))
        out[np.arange(width) < lengths[:, None]] = values  # row-major: each row's prefix
    return torch.from_numpy(out)


def example_tensors(
    words: Sequence[Sequence[int]], labels: Sequence, vocab_size: int, num_tags: int, single: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The padded ``(x, y)`` of encoded examples (:func:`encode_examples`' output).

    ``x`` pads the word ids with ``vocab_size + 1``; ``y`` is the single labels ``(n,)`` when
    ``single``, else the tag ids padded with ``num_tags``.
    """
    x = _pad(words, vocab_size + 1)
    y = torch.tensor(list(labels), dtype=torch.int64) if single else _pad(labels, num_tags)
    return x, y


def pad_ragged(values: np.ndarray, lengths: np.ndarray, fill: int) -> torch.Tensor:
    """``(n, max(lengths))`` int64: row ``i`` holds its ``lengths[i]`` values, then ``fill``.

    The same tensor :func:`_pad` builds from lists (one row at least one column wide).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    width = max(1, int(lengths.max()) if lengths.size else 0)
    out = np.full((lengths.size, width), fill, dtype=np.int64)
    out[np.arange(width) < lengths[:, None]] = values
    return torch.from_numpy(out)


def long_tensor(values: np.ndarray) -> torch.Tensor:
    """``values`` as an int64 tensor (no copy when they are int64 already)."""
    return torch.from_numpy(np.asarray(values, dtype=np.int64))


def ragged_index(
    lengths: torch.Tensor, take: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the ragged rows ``take`` of a CSR array with row ``lengths`` are, laid end to end.

    Returns the positions of their values in the CSR values (concatenated in ``take``'s order),
    their lengths, and where each starts in that concatenation.
    """
    starts = torch.cumsum(lengths, 0) - lengths
    lens = lengths[take]
    out_starts = torch.cumsum(lens, 0) - lens
    total = int(lens.sum())
    index = torch.repeat_interleave(starts[take] - out_starts, lens, output_size=total)
    return index.add_(torch.arange(total, device=lengths.device)), lens, out_starts


def ragged_take(
    values: torch.Tensor, lengths: torch.Tensor, take: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ragged rows ``take`` of CSR ``(values, lengths)``, concatenated, and their lengths."""
    index, lens, _ = ragged_index(lengths, take)
    return values[index], lens


class UserCSR(NamedTuple):
    """One user's examples as ragged int64 tensors (see :meth:`StackOverflowTagTask.user_csr`).

    ``tokens``: word ids of all examples concatenated (OOV as ``V``); ``lengths``: words per
    example (OOV included); ``labels``: tag ids of all examples concatenated (multi-label) or
    one label per example; ``label_lengths``: tags per example (multi-label) or ``None``.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    labels: torch.Tensor
    label_lengths: torch.Tensor | None


def bag_of_words(x: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(ids, weights)`` such that the features are ``sum_l weights[i, l] e_{ids[i, l]}``.

    Parameters
    ----------
    x : torch.Tensor
        ``int64`` word ids ``(n, L)``: ``< V`` vocabulary, ``V`` OOV, ``V + 1`` padding.
    vocab_size : int
        ``V``.

    Returns
    -------
    ids : torch.Tensor
        ``x`` with every non-vocabulary entry replaced by ``0`` (valid rows to index).
    weights : torch.Tensor
        ``float32`` ``(n, L)``: ``1 / (number of words of the example, OOV included)`` at
        vocabulary words, ``0`` elsewhere (so OOV and padding contribute nothing).
    """
    in_vocab = x < vocab_size
    words = (x <= vocab_size).sum(dim=1, keepdim=True).clamp_min(1)
    weights = in_vocab.to(torch.float32) / words.to(torch.float32)
    return x.masked_fill(~in_vocab, 0), weights


def dense_features(x: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The dense ``(n, V)`` float32 bag-of-words matrix of ``x`` (small sizes only)."""
    ids, weights = bag_of_words(x, vocab_size)
    out = torch.zeros(x.shape[0], vocab_size, dtype=torch.float32, device=x.device)
    return out.scatter_add_(1, ids, weights)


def multi_hot(y: torch.Tensor, num_tags: int) -> torch.Tensor:
    """The ``(n, K)`` float32 0/1 matrix of padded tag ids ``y`` ``(n, T)`` (padding ``K``)."""
    out = torch.zeros(y.shape[0], num_tags + 1, dtype=torch.float32, device=y.device)
    out.scatter_(1, y, 1.0)
    return out[:, :num_tags]
