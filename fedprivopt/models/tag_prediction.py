r"""StackOverflow tag prediction: bag of words to tags with logistic regression.

:class:`StackOverflowTagTask` (registered as ``"stackoverflow-tp"``) is the TFF baseline task
[1]_ on the TFF StackOverflow files (real or synthetic, :mod:`fedprivopt.data`): the features of an
example are a bag of words over its ``tokens`` and ``title``, the labels are its tags among the
``K`` most popular, and the model is logistic regression with ``V x K`` weights and ``K`` biases
(5,000,500 parameters at ``V = 10,000``, ``K = 500``).

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
precision@5 but not in recall@5). *Single-label* (AdaDPS' variant [2]_): ``y`` is ``(n,)`` with the
most popular top-``K`` tag of the example (its smallest tag id); examples without a top-``K`` tag
are **dropped** (AdaDPS' script labels them with tag 0 through ``argmax`` of an all-zero vector,
an artefact we do not copy).

Model and loss
--------------
:class:`BagOfWordsLogisticRegression` computes ``logits = features @ weight + bias`` with
``weight`` of shape ``(V, K)`` (row ``j`` = word ``j``; note: the transpose of
``torch.nn.Linear``'s layout) and ``bias`` of shape ``(K,)``; its state dict holds exactly these
two tensors, so the flat layout is ``weight.reshape(-1)`` (word ``j`` at ``[j K, (j + 1) K)``)
followed by ``bias``. The forward pass uses ``embedding_bag`` and never builds the dense
``(n, V)`` input. Initialization: Glorot-uniform weights (Keras' default, as in TFF) from a
generator keyed by the task's seed, zero bias. Loss: mean binary cross-entropy with logits over
all ``n x K`` entries (multi-label, TFF) or cross-entropy (single-label).

Metrics
-------
``"loss"``; ``"recall_at_5"`` and ``"precision_at_5"`` micro-averaged over examples as Keras'
``Recall(top_k=5)``/``Precision(top_k=5)`` in TFF (hits among the 5 top-scored tags over the
number of true tags, respectively over ``5 n``); ``"accuracy"``: the top-scored tag is one of the
true tags (single-label: it is the label).

References
----------
.. [1] TensorFlow Federated, ``tff.simulation.baselines.stackoverflow.create_tag_prediction_task``
   and its ``tag_prediction_preprocessing``.
.. [2] T. Li, M. Zaheer, S. Reddi, V. Smith, "Private adaptive optimization with side
   information", ICML 2022.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from fedprivopt.core.checks import check_bool, check_int
from fedprivopt.data.fast_example import text_fields_decoder
from fedprivopt.data.sqlite import SQLiteSplit
from fedprivopt.data.stackoverflow import StackOverflowExample
from fedprivopt.data.synthetic import (
    SQLITE_FILE,
    SyntheticConfig,
)
from fedprivopt.data.token_cache import EncodedUsers, open_or_build, stderr_progress
from fedprivopt.data.vocab import TAG_COUNT_FILE, WORD_COUNT_FILE, read_tag_counts, read_word_counts
from fedprivopt.models.stackoverflow_files import StackOverflowFiles
from fedprivopt.models.task import model_device
from fedprivopt.privacy.rng import derive_seed

__all__ = [
    "BagOfWordsLogisticRegression",
    "StackOverflowTagTask",
    "UserCSR",
    "bag_of_words",
    "dense_features",
    "encode_examples",
    "multi_hot",
    "tag_metrics",
]

_EVAL_BATCH = 2048  # examples per evaluation forward pass
_TOP_K = 5


# ------------------------------------------------------------------------------ encoding
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


def _tensors(
    words: Sequence[Sequence[int]], labels: Sequence, vocab_size: int, num_tags: int, single: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    x = _pad(words, vocab_size + 1)
    y = torch.tensor(list(labels), dtype=torch.int64) if single else _pad(labels, num_tags)
    return x, y


def _pad_ragged(values: np.ndarray, lengths: np.ndarray, fill: int) -> torch.Tensor:
    """``(n, max(lengths))`` int64: row ``i`` holds its ``lengths[i]`` values, then ``fill``.

    The same tensor :func:`_pad` builds from lists (one row at least one column wide).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    width = max(1, int(lengths.max()) if lengths.size else 0)
    out = np.full((lengths.size, width), fill, dtype=np.int64)
    out[np.arange(width) < lengths[:, None]] = values
    return torch.from_numpy(out)


def _long(values: np.ndarray) -> torch.Tensor:
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


def tag_metrics(scores: torch.Tensor, y: torch.Tensor, *, k: int = _TOP_K) -> dict[str, float]:
    """Summed (not averaged) top-``k`` hit counts of ``scores`` ``(n, K)`` against labels ``y``.

    Parameters
    ----------
    scores : torch.Tensor
        Logits ``(n, K)``.
    y : torch.Tensor
        Single labels ``(n,)`` or padded tag ids ``(n, T)`` (padding ``K``).
    k : int
        Cut-off of recall/precision (``min(k, K)`` is used).

    Returns
    -------
    dict
        ``"hits"`` (true tags among the top ``k``), ``"true"`` (number of true tags), ``"top1"``
        (examples whose top-scored tag is true) and ``"n"``: divide as ``recall = hits / true``,
        ``precision = hits / (k n)``, ``accuracy = top1 / n``.
    """
    n, num_tags = scores.shape
    kk = min(k, num_tags)
    top = scores.topk(kk, dim=1).indices
    if y.dim() == 1:
        truth = F.one_hot(y, num_tags).to(torch.bool)
    else:
        truth = multi_hot(y, num_tags).to(torch.bool)
    hits = truth.gather(1, top)
    return {
        "hits": float(hits.sum()),
        "true": float(truth.sum()),
        "top1": float(hits[:, 0].sum()) if kk else 0.0,
        "n": float(n),
        "k": float(kk),
    }


# --------------------------------------------------------------------------------- model
class BagOfWordsLogisticRegression(torch.nn.Module):
    """Logistic regression on sparse bag-of-words inputs: ``features @ weight + bias``.

    Parameters
    ----------
    vocab_size : int
        ``V``, the number of features.
    num_tags : int
        ``K``, the number of outputs.

    Attributes
    ----------
    weight : torch.nn.Parameter
        ``(V, K)``: row ``j`` holds word ``j``'s scores for every tag.
    bias : torch.nn.Parameter
        ``(K,)``.

    Notes
    -----
    ``forward`` takes the id tensors described in :mod:`fedprivopt.models.tag_prediction` and
    calls ``embedding_bag`` with per-word weights; its gradient w.r.t. ``weight`` is dense (zero
    outside the rows of the batch's words).
    """

    def __init__(self, vocab_size: int, num_tags: int) -> None:
        super().__init__()
        self.vocab_size = int(vocab_size)
        self.num_tags = int(num_tags)
        self.weight = torch.nn.Parameter(torch.zeros(self.vocab_size, self.num_tags))
        self.bias = torch.nn.Parameter(torch.zeros(self.num_tags))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(n, K)`` of the word-id tensor ``x`` ``(n, L)``."""
        ids, weights = bag_of_words(x, self.vocab_size)
        bags = F.embedding_bag(
            ids, self.weight, per_sample_weights=weights.to(self.weight.dtype), mode="sum"
        )
        return bags + self.bias

    def extra_repr(self) -> str:
        """Sizes shown by ``repr``."""
        return f"vocab_size={self.vocab_size}, num_tags={self.num_tags}"


# ---------------------------------------------------------------------------------- task
#: Initial biases of :class:`StackOverflowTagTask` (``init-bias``).
INIT_BIAS = ("zero", "tag-prior")


class StackOverflowTagTask(StackOverflowFiles):
    """StackOverflow tag prediction (bag of words to tags, logistic regression) as a Task.

    Parameters
    ----------
    data_dir : str
        Directory holding ``stackoverflow.sqlite``, ``stackoverflow.word_count`` and
        ``stackoverflow.tag_count`` (the real TFF files, the SQLite decompressed and indexed, or
        synthetic ones).
    synthetic : bool
        If none of the three files is present, generate a synthetic dataset into ``data_dir``
        (:func:`fedprivopt.data.ensure_synthetic` with the ``synth_*`` parameters, under a file
        lock so that concurrent workers generate it once); if false, raise
        ``FileNotFoundError`` instead. Files that are present are used as they are and never
        written (only an empty ``.stackoverflow.lock`` may be created): a partial set raises
        ``FileNotFoundError``, and a synthetic dataset whose recorded configuration
        (``stackoverflow.synthetic.json``) contradicts a ``synth_*`` parameter that was given
        raises ``ValueError``.
    synth_clients, synth_vocab, synth_tags, synth_seed : int or None
        ``num_clients``, ``vocab_size``, ``num_tags`` and ``seed`` of the
        :class:`~fedprivopt.data.SyntheticConfig` used to generate; ``None`` (omitted): the
        config's default.
    vocab_size : int
        ``V``: the top ``V`` words of the word-count file (fewer if the file has fewer; see
        :attr:`num_features`), ``>= 1``.
    num_tags : int
        ``K``: the top ``K`` tags of the tag-count file (fewer if the file has fewer; see
        :attr:`num_tags`), ``>= 1``.
    num_users : int or None
        Use the first ``num_users`` training users in the file's order (client ids sorted);
        ``None`` uses all. Must not exceed the number of training users.
    max_examples_per_user : int or None
        Read at most this many examples per user (the first ones, in file order), training and
        evaluation alike; applied before single-label dropping. ``None``: all.
    eval_split : {"test", "heldout"}
        Split used by :meth:`evaluate`.
    eval_users : int
        :meth:`evaluate` pools the first ``eval_users`` users of ``eval_split`` (fixed, cheap,
        deterministic), ``>= 1``; fewer if the split has fewer.
    single_label : bool
        AdaDPS' single-label softmax variant instead of TFF's multi-label task.
    seed : int
        Seed of the model initialization, ``>= 0``.
    init_bias : {"zero", "tag-prior"}
        The initial bias: zero, or the log tag prior ``log(count_k / Σ count)`` of the
        tag-count file, the bias of :meth:`reference`. The tag-count file is published with the
        dataset like the word counts that choose the vocabulary, so neither costs privacy; with
        ``"tag-prior"`` a private method starts from the bias-only model instead of spending
        its first noised rounds on learning the tag frequencies.
    train_bias : bool
        Train the bias (default). ``False`` keeps it at its initial value: it is then no
        trainable parameter (``requires_grad`` off), so clients never change it, and the server
        drops the noise that the release adds to its coordinates (post-processing; see
        :func:`~fedprivopt.models.task.frozen_mask`). With ``init_bias = "tag-prior"`` the model
        is the public bias-only model plus what the words learn: the noise no longer moves the
        bias, which decides the top-1 tag of every document without strong words
        (``docs/EXPERIMENTS.md``).
    cache_users : int
        Per-user tensors kept in memory (least recently used evicted), ``>= 0``.
    token_cache : bool
        Encode every training user once into a memory-mapped store of word and tag ids
        (:mod:`fedprivopt.data.token_cache`; about 1 ms of Python per user, parallel over the CPU
        cores, then a user is two slices of a file) instead of decoding its protos on every
        read. The store is found again by a digest of the SQLite file's size and modification
        time and of the encoding, so later runs reuse it. Reads then give the same tensors.
    cache_dir : str or None
        Where stores live; ``None``: ``<data_dir>/.fedprivopt-cache``.

    Attributes
    ----------
    num_users : int
        Number of training users (user ``u`` is :attr:`client_ids` ``[u]``).
    num_features : int
        Effective ``V``.
    num_tags : int
        Effective ``K``.
    words, tags : tuple of str
        The vocabulary (id = position) and the tag set (id = popularity rank).

    Notes
    -----
    Construction reads the vocabulary files and the training split's client list only; examples
    are read per user on demand and cached. Pickling (to Ray workers) drops the open database
    and the caches; the copy reopens the file lazily. Not thread-safe.
    """

    name = "stackoverflow-tp"

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike,
        synthetic: bool = True,
        synth_clients: int | None = None,
        synth_vocab: int | None = None,
        synth_tags: int | None = None,
        synth_seed: int | None = None,
        vocab_size: int = 10_000,
        num_tags: int = 500,
        num_users: int | None = None,
        max_examples_per_user: int | None = None,
        eval_split: str = "test",
        eval_users: int = 200,
        single_label: bool = False,
        seed: int = 0,
        init_bias: str = "zero",
        train_bias: bool = True,
        cache_users: int = 2048,
        token_cache: bool = False,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        if not isinstance(data_dir, (str, os.PathLike)) or not str(data_dir):
            raise ValueError(f"data_dir must be a non-empty path, got {data_dir!r}")
        self.data_dir = Path(data_dir)
        self.synthetic = check_bool("synthetic", synthetic)
        given = {
            "num_clients": check_int("synth_clients", synth_clients, 1, none=True),
            "vocab_size": check_int("synth_vocab", synth_vocab, 1, none=True),
            "num_tags": check_int("synth_tags", synth_tags, 1, none=True),
            "seed": check_int("synth_seed", synth_seed, 0, none=True),
        }
        self.synth_params = {k: v for k, v in given.items() if v is not None}
        try:
            self.synth_config = SyntheticConfig(**self.synth_params)
        except ValueError as exc:
            raise ValueError(f"invalid synth_* parameters: {exc}") from None
        requested_v = check_int("vocab_size", vocab_size, 1)
        requested_k = check_int("num_tags", num_tags, 1)
        check_int("num_users", num_users, 1, none=True)
        self.max_examples_per_user = check_int(
            "max_examples_per_user", max_examples_per_user, 1, none=True
        )
        if eval_split not in ("test", "heldout"):
            raise ValueError(f"eval_split must be 'test' or 'heldout', got {eval_split!r}")
        self.eval_split = eval_split
        self.eval_users = check_int("eval_users", eval_users, 1)
        self.single_label = check_bool("single_label", single_label)
        self.seed = check_int("seed", seed, 0)
        if init_bias not in INIT_BIAS:
            raise ValueError(f"init_bias must be one of {', '.join(INIT_BIAS)}, got {init_bias!r}")
        self.init_bias = init_bias
        self.train_bias = check_bool("train_bias", train_bias)
        self.cache_users = check_int("cache_users", cache_users, 0)
        self.token_cache = check_bool("token_cache", token_cache)
        if cache_dir is not None and (
            not isinstance(cache_dir, (str, os.PathLike)) or not str(cache_dir)
        ):
            raise ValueError(f"cache_dir must be a non-empty path or None, got {cache_dir!r}")
        self.cache_dir = (
            Path(cache_dir) if cache_dir is not None else self.data_dir / ".fedprivopt-cache"
        )

        self._ensure_files()
        words = read_word_counts(self.data_dir / WORD_COUNT_FILE).top(requested_v)
        tags = read_tag_counts(self.data_dir / TAG_COUNT_FILE).top(requested_k)
        if len(words) == 0 or len(tags) == 0:
            raise ValueError(f"{self.data_dir}: the word-count or tag-count file is empty")
        self.words: tuple[str, ...] = words.items
        self.tags: tuple[str, ...] = tags.items
        self.tag_counts: tuple[int, ...] = tuple(tags.counts.tolist())
        self.num_features = len(self.words)
        self.num_tags = len(self.tags)
        train = SQLiteSplit(self.data_dir / SQLITE_FILE, "train")
        ids = list(train.client_ids)
        if num_users is not None and num_users > len(ids):
            raise ValueError(
                f"num_users must be <= {len(ids)} (training users in {self.data_dir}), "
                f"got {num_users}"
            )
        self.client_ids: tuple[str, ...] = tuple(ids[:num_users] if num_users else ids)
        self.num_users = len(self.client_ids)
        self._init_runtime()
        self._train = train

    # ------------------------------------------------------------------------- files
    def _init_runtime(self) -> None:
        self._train: SQLiteSplit | None = None
        self._cache: OrderedDict[int, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._eval: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._word_index: dict[str, int] | None = None
        self._tag_index: dict[str, int] | None = None
        self._store: EncodedUsers | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for key in ("_train", "_eval", "_word_index", "_tag_index", "_store"):
            state[key] = None
        state["_cache"] = OrderedDict()
        return state

    def __repr__(self) -> str:
        return (
            f"StackOverflowTagTask(data_dir={str(self.data_dir)!r}, num_users={self.num_users}, "
            f"vocab_size={self.num_features}, num_tags={self.num_tags}, "
            f"single_label={self.single_label}, eval_split={self.eval_split!r}, "
            f"eval_users={self.eval_users})"
        )

    def _indexes(self) -> tuple[dict[str, int], dict[str, int]]:
        if self._word_index is None or self._tag_index is None:
            self._word_index = {w: i for i, w in enumerate(self.words)}
            self._tag_index = {t: i for i, t in enumerate(self.tags)}
        return self._word_index, self._tag_index

    def _encode(self, examples: Sequence[StackOverflowExample]) -> tuple[list[list[int]], list]:
        if self.max_examples_per_user is not None:
            examples = examples[: self.max_examples_per_user]
        word_index, tag_index = self._indexes()
        return encode_examples(examples, word_index, tag_index, single_label=self.single_label)

    def _train_split(self) -> SQLiteSplit:
        """The training split, opened on first use (after unpickling too)."""
        if self._train is None:
            self._train = SQLiteSplit(self.sqlite_path, "train", validate=False)
        return self._train

    def _read_train_user(self, client_id: str) -> tuple[list[list[int]], list]:
        """Encoded training examples of ``client_id``: protobuf's C parser, else the exact one.

        The fast path (:func:`~fedprivopt.data.fast_example.text_fields_decoder`) reads only the
        text the task needs; on any failure the pure-Python reader decodes the user again and
        raises its precise error, so both paths accept exactly the same data.
        """
        decode = text_fields_decoder()
        if decode is not None:
            blobs = self._train_split().serialized_examples(client_id)
            if self.max_examples_per_user is not None:
                blobs = blobs[: self.max_examples_per_user]
            try:
                texts = [decode(b) for b in blobs]
            except Exception:  # malformed for the fast path: the exact reader decides
                texts = None
            if texts is not None:
                word_index, tag_index = self._indexes()
                return encode_texts(texts, word_index, tag_index, single_label=self.single_label)
        return self._encode(self._train_split().client_examples(client_id))

    # -------------------------------------------------------------------------- data
    def user_data(self, user_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(x, y)`` of training user ``user_id`` (CPU tensors; do not modify them).

        ``x`` is ``int64`` ``(n, L)`` word ids (vocabulary ``< V``, OOV ``V``, padding
        ``V + 1``), ``y`` ``int64`` ``(n, T)`` padded tag ids (padding ``K``) or, single-label,
        ``(n,)``. ``n`` may be 0.
        """
        user_id = self._check_user(user_id)
        hit = self._cache.get(user_id)
        if hit is not None:
            self._cache.move_to_end(user_id)
            return hit
        store = self.encoded_users()
        if store is not None:
            tokens, lengths, labels, label_lengths = store.user(user_id)
            x = _pad_ragged(tokens, lengths, self.num_features + 1)
            if self.single_label:
                y = torch.from_numpy(labels.astype(np.int64))
            else:
                y = _pad_ragged(labels, label_lengths, self.num_tags)
            out = (x, y)
        else:
            words, labels = self._read_train_user(self.client_ids[user_id])
            out = _tensors(words, labels, self.num_features, self.num_tags, self.single_label)
        if self.cache_users:
            self._cache[user_id] = out
            while len(self._cache) > self.cache_users:
                self._cache.popitem(last=False)
        return out

    def user_csr(self, user_id: int) -> UserCSR:
        """The examples of ``user_id`` as ragged arrays (what the cohort trainer consumes).

        The same data as :meth:`user_data` without padding: from the token store when
        :attr:`token_cache` is on, else converted from :meth:`user_data`.
        """
        user_id = self._check_user(user_id)
        store = self.encoded_users()
        if store is not None:
            tokens, lengths, labels, label_lengths = store.user(user_id)
            return UserCSR(
                _long(tokens),
                _long(lengths),
                _long(labels),
                None if label_lengths is None else _long(label_lengths),
            )
        x, y = self.user_data(user_id)
        words = x <= self.num_features
        if self.single_label:
            return UserCSR(x[words], words.sum(dim=1), y, None)
        tags = y < self.num_tags
        return UserCSR(x[words], words.sum(dim=1), y[tags], tags.sum(dim=1))

    def user_sizes(self, users: Sequence[int]) -> list[int]:
        """Number of training examples of each of ``users`` (from the token store if on)."""
        store = self.encoded_users()
        if store is not None:
            return store.example_counts([self._check_user(u) for u in users]).tolist()
        return [int(self.user_csr(u).lengths.numel()) for u in users]

    def examples_csr(self, users: Sequence[int], picks: Sequence[torch.Tensor]) -> UserCSR:
        """Examples ``picks[i]`` of user ``users[i]``, for every ``i``, as one ragged batch.

        The examples of :meth:`user_csr` ``(users[i])`` at positions ``picks[i]``, concatenated
        in order: read from the token store in one pass when it is on.
        """
        if len(picks) != len(users):
            raise ValueError("examples_csr needs one tensor of picks per user")
        store = self.encoded_users()
        if store is not None:
            tokens, lengths, labels, label_lengths = store.gather(
                [self._check_user(u) for u in users], [p.numpy() for p in picks]
            )
            return UserCSR(
                _long(tokens),
                _long(lengths),
                _long(labels),
                None if label_lengths is None else _long(label_lengths),
            )
        parts = []
        for user, pick in zip(users, picks, strict=True):
            data = self.user_csr(user)
            tokens, lengths = ragged_take(data.tokens, data.lengths, pick)
            if data.label_lengths is None:
                labels, label_lengths = data.labels[pick], None
            else:
                labels, label_lengths = ragged_take(data.labels, data.label_lengths, pick)
            parts.append((tokens, lengths, labels, label_lengths))
        if not parts:
            empty = torch.empty(0, dtype=torch.int64)
            return UserCSR(empty, empty, empty, None if self.single_label else empty)
        columns = zip(*parts, strict=True)
        return UserCSR(*[None if c[0] is None else torch.cat(list(c)) for c in columns])

    def encoded_users(self) -> EncodedUsers | None:
        """The memory-mapped token store (built on first use); ``None`` without a token cache."""
        if not self.token_cache:
            return None
        if self._store is None:
            self._train_split()  # opened once, before the encoding workers fork
            self._store = open_or_build(
                self.cache_dir,
                self._store_key(),
                self.num_users,
                lambda u: self._read_train_user(self.client_ids[u]),
                multi_label=not self.single_label,
                token_bound=self.num_features + 1,
                label_bound=self.num_tags,
                progress=stderr_progress("encoding users (once)", self.num_users)
                if self.num_users >= 20_000
                else None,
            )
        return self._store

    def _store_key(self) -> dict:
        """What the token store depends on: the file's identity and the encoding."""
        stat = self.sqlite_path.stat()

        def digest(items: Sequence[str]) -> str:
            return hashlib.sha256("\n".join(items).encode("utf-8", "surrogatepass")).hexdigest()

        return {
            "task": self.name,
            "file": {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns},
            "words": digest(self.words),
            "tags": digest(self.tags),
            "clients": digest(self.client_ids),
            "single_label": self.single_label,
            "max_examples_per_user": self.max_examples_per_user,
        }

    def user_size(self, user_id: int) -> int:
        """Number of training examples of ``user_id`` (reads them if not cached)."""
        return int(self.user_data(user_id)[0].shape[0])

    def eval_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The evaluation examples as batches ``(x, y)`` (built once, then cached).

        The examples of the first :attr:`eval_users` users of :attr:`eval_split` (file order) are
        pooled, ordered by length (stable) and cut into batches of at most 2048, each padded to
        its own longest example.
        """
        if self._eval is None:
            split = SQLiteSplit(self.sqlite_path, self.eval_split, validate=False)
            try:
                words: list[list[int]] = []
                labels: list = []
                for cid in list(split.client_ids)[: self.eval_users]:
                    w, lab = self._encode(split.client_examples(cid))
                    words.extend(w)
                    labels.extend(lab)
            finally:
                split.close()
            order = sorted(range(len(words)), key=lambda i: len(words[i]))
            batches = []
            for start in range(0, len(order), _EVAL_BATCH):
                part = order[start : start + _EVAL_BATCH]
                batches.append(
                    _tensors(
                        [words[i] for i in part],
                        [labels[i] for i in part],
                        self.num_features,
                        self.num_tags,
                        self.single_label,
                    )
                )
            self._eval = batches
        return self._eval

    # ------------------------------------------------------------------------- model
    def build_model(self) -> BagOfWordsLogisticRegression:
        """Logistic regression ``(V, K)``: Glorot-uniform weights (task seed), :attr:`init_bias`."""
        model = BagOfWordsLogisticRegression(self.num_features, self.num_tags)
        gen = torch.Generator()
        gen.manual_seed(derive_seed(self.seed, "stackoverflow-tp", "model-init"))
        bound = math.sqrt(6.0 / (self.num_features + self.num_tags))
        with torch.no_grad():
            model.weight.uniform_(-bound, bound, generator=gen)
            if self.init_bias == "tag-prior":
                model.bias.copy_(self.log_tag_prior())
        model.bias.requires_grad_(self.train_bias)
        return model

    @property
    def primary_metric(self) -> str:
        """The metric reports lead with.

        ``"accuracy"`` for one tag per example (the metric of the AdaDPS paper), else
        ``"recall_at_5"`` (TFF's StackOverflow tag prediction).
        """
        return "accuracy" if self.single_label else "recall_at_5"

    @property
    def initialization(self) -> str:
        """How :meth:`build_model` initializes, and what public data it uses (run summaries)."""
        bias = (
            "the log tag prior of the published tag counts (public, like the word counts)"
            if self.init_bias == "tag-prior"
            else "zero"
        )
        frozen = "" if self.train_bias else " (fixed: not trained, its noise dropped)"
        return f"Glorot-uniform weights from the task seed; bias {bias}{frozen}"

    def log_tag_prior(self) -> torch.Tensor:
        """``log(count_k / Σ count)`` over the :attr:`tags` (float32; count 0 counts as 0.5)."""
        # a tag listed with count 0 gets half an occurrence (a finite bias)
        freq = torch.tensor([float(c) for c in self.tag_counts], dtype=torch.float64)
        freq = freq.clamp(min=0.5)
        return torch.log(freq / freq.sum()).float()

    def reference(self) -> tuple[str, dict[str, float]]:
        """The tag prior: a bias-only model from the published tag counts, and its metrics.

        Weights 0 and bias ``log(count_k / Σ count)`` from the ``tag_count`` file (public, like
        the word counts): the model every private method must beat, since learning the tag
        frequencies needs no user data. For the multi-label task the loss of this bias is not
        the best constant's (the file does not give tags per example), so only the ranking
        metrics (accuracy, recall@5, precision@5) are returned.

        Returns
        -------
        tuple of (str, dict)
            ``("tag prior (bias only)", metrics)`` with the keys of :meth:`evaluate`.
        """
        model = BagOfWordsLogisticRegression(self.num_features, self.num_tags)
        with torch.no_grad():
            model.weight.zero_()
            model.bias.copy_(self.log_tag_prior())
        metrics = self.evaluate(model)
        if not self.single_label:
            metrics.pop("loss")
        return "tag prior (bias only)", metrics

    def loss(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean BCE with logits over ``n x K`` (multi-label) or cross-entropy (single-label)."""
        logits = model(x)
        if self.single_label:
            return F.cross_entropy(logits, y)
        return F.binary_cross_entropy_with_logits(logits, multi_hot(y, self.num_tags))

    def _sums(
        self, model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> dict[str, float]:
        device = model_device(model)
        total = {"loss": 0.0, "hits": 0.0, "true": 0.0, "top1": 0.0, "n": 0.0, "k": 0.0}
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for x, y in batches:
                    if x.shape[0] == 0:
                        continue
                    x, y = x.to(device), y.to(device)
                    logits = model(x)
                    if self.single_label:
                        loss = F.cross_entropy(logits, y, reduction="sum")
                    else:
                        target = multi_hot(y, self.num_tags)
                        loss = (
                            F.binary_cross_entropy_with_logits(logits, target, reduction="sum")
                            / self.num_tags
                        )
                    total["loss"] += float(loss.to(torch.float64))
                    for key, value in tag_metrics(logits, y).items():
                        total[key] = value if key == "k" else total[key] + value
        finally:
            model.train(was_training)
        return total

    @staticmethod
    def _metrics(total: dict[str, float]) -> dict[str, float]:
        n = total["n"]
        if n == 0:
            nan = float("nan")
            return {"loss": nan, "accuracy": nan, "recall_at_5": nan, "precision_at_5": nan}
        return {
            "loss": total["loss"] / n,
            "accuracy": total["top1"] / n,
            "recall_at_5": total["hits"] / total["true"] if total["true"] else float("nan"),
            "precision_at_5": total["hits"] / (total["k"] * n),
        }

    def evaluate_data(
        self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> dict[str, float]:
        """Mean ``"loss"``, ``"accuracy"``, ``"recall_at_5"``, ``"precision_at_5"`` on ``(x, y)``.

        NaN for zero examples (and recall for examples without any true tag).
        """
        batches = [
            (x[i : i + _EVAL_BATCH], y[i : i + _EVAL_BATCH])
            for i in range(0, int(x.shape[0]), _EVAL_BATCH)
        ]
        return self._metrics(self._sums(model, batches))

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """The metrics of :meth:`evaluate_data` on the pooled evaluation users."""
        return self._metrics(self._sums(model, self.eval_batches()))

    # ------------------------------------------------------------------ side information
    def side_information(self, **kwargs: object) -> torch.Tensor:
        """AdaDPS' token-frequency preconditioner from this task's ``word_count`` file.

        Keyword arguments go to
        :func:`~fedprivopt.models.side_information.token_frequency_preconditioner`. The counts
        are the published vocabulary statistics, not this run's training data (see that
        function for what counts as non-sensitive).
        """
        from fedprivopt.models.side_information import token_frequency_preconditioner

        counts = read_word_counts(self.word_count_path).top(self.num_features)
        return token_frequency_preconditioner(
            counts, vocab_size=self.num_features, num_tags=self.num_tags, **kwargs
        )

    # ------------------------------------------------------------------ fast engine
    def cohort_trainer(self, *, device=None, chunk_users: int = 256):
        """A :class:`~fedprivopt.models.tag_prediction_cohort.TagCohortTrainer` for this task.

        The fast engine uses it to train a cohort at once on the rows its words touch.
        """
        from fedprivopt.models.tag_prediction_cohort import TagCohortTrainer

        return TagCohortTrainer(self, device=device, chunk_users=chunk_users)
