r"""StackOverflow next-word prediction: an embedding-LSTM-projection language model.

:class:`StackOverflowNextWordTask` (registered as ``"stackoverflow-nwp"``) is the TFF baseline
task [1]_ used by the adaptive federated optimization papers [2]_ on the TFF StackOverflow files
(real or synthetic, :mod:`fedprivopt.data`): predict every next word of an example's ``tokens``
(one sentence) from the words before it.

This module holds the task: its parameters, per-user data, loss and evaluation. The token ids
(``pad = 0``, the words ``1..V``, ``oov``, ``bos``, ``eos``) and the encoding of a sentence into
inputs and next-word targets of length ``seq_len`` are in
:mod:`~fedprivopt.models.next_word_tokens`; the model (:class:`NextWordLSTM`, TFF's
``create_recurrent_model`` with Keras' initialization), its parameter count and its hit counts
are in :mod:`~fedprivopt.models.next_word_model`. Per user at most ``max_examples_per_user``
examples are read (the first ones in file order; TFF's ``max_elements_per_user``, 1,000 in its
experiments).

Loss and metrics
----------------
Loss: cross-entropy over the non-pad targets, averaged over those tokens (a batch's mean is per
token, not per example). TFF masks padding through the embedding's ``mask_zero``; we mask the
targets explicitly, as its accuracy metrics do. Since padding only follows the sentence and the
LSTM is causal, a batch is cut after its last non-pad target before the forward pass, which
changes no unmasked logit. Metrics, token-weighted over all evaluated targets (sums over
examples, then one division, like TFF's Keras metrics):

* ``"loss"``: mean cross-entropy per non-pad target;
* ``"accuracy"``: top-1 accuracy over targets that are not pad, oov or eos (TFF's
  ``accuracy_without_out_of_vocab_or_end_of_sentence``, the number papers report);
* ``"accuracy_no_oov"``: over targets that are not pad or oov (TFF's
  ``accuracy_without_out_of_vocab``);
* ``"accuracy_with_oov"``: over every non-pad target (TFF's ``accuracy``).

The prediction is the arg-max over all ``V + 4`` logits, so predicting oov or eos for a word
counts as wrong.

References
----------
.. [1] TensorFlow Federated, ``tff.simulation.baselines.stackoverflow.create_word_prediction_task``,
   its ``word_prediction_preprocessing`` and ``word_prediction_models``.
.. [2] S. Reddi, Z. Charles, M. Zaheer, Z. Garrett, K. Rush, J. Konečný, S. Kumar, H. B. McMahan,
   "Adaptive federated optimization", ICLR 2021.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from fedprivopt.core.checks import check_int
from fedprivopt.data.stackoverflow import StackOverflowExample
from fedprivopt.data.synthetic_files import SQLITE_FILE
from fedprivopt.data.vocab import WORD_COUNT_FILE, read_word_counts
from fedprivopt.models.next_word_model import NextWordLSTM, next_word_counts, parameter_count
from fedprivopt.models.next_word_tokens import PAD, encode_sentences, special_tokens

# Shared with the tag task: both may build from the same directory and take the same lock.
from fedprivopt.models.stackoverflow_files import (
    MAX_USERS,
    StackOverflowFiles,
    check_model_parameters,
    check_vocab_size,
)
from fedprivopt.models.task import evaluating
from fedprivopt.privacy.rng import derive_seed

__all__ = ["MAX_SEQ_LEN", "StackOverflowNextWordTask"]

MAX_SEQ_LEN = 1024
"""Largest ``seq_len``: every example is padded to it (``int64`` inputs and targets).

TFF's task uses 20; a user of 1,000 examples at 1,024 holds 16 MiB of tensors."""

_EVAL_LOGITS = 1 << 24  # logits per evaluation forward pass (64 MiB of float32)
_EVAL_MAX_BATCH = 1024


def _trim(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut the columns after the last non-pad target (no unmasked logit changes: causal model)."""
    if y.numel() == 0:
        return x, y
    cols = torch.nonzero((y != PAD).any(dim=0))
    width = int(cols.max()) + 1 if cols.numel() else 1
    return x[:, :width], y[:, :width]


# ---------------------------------------------------------------------------------- task
class StackOverflowNextWordTask(StackOverflowFiles):
    """StackOverflow next-word prediction (embedding, LSTM, projection, logits) as a Task.

    Parameters
    ----------
    data_dir : str
        Directory holding ``stackoverflow.sqlite`` and ``stackoverflow.word_count`` (the real
        TFF files, the SQLite decompressed and indexed, or synthetic ones).
    synthetic : bool
        If none of the files the synthetic generator writes (``stackoverflow.sqlite``,
        ``stackoverflow.word_count``, ``stackoverflow.tag_count``) is present, generate a
        synthetic dataset into ``data_dir`` (:func:`fedprivopt.data.ensure_synthetic` with the
        ``synth_*`` parameters, under the same file lock as the tag task, so that concurrent
        workers generate it once); if false, raise ``FileNotFoundError`` instead. Files that are
        present are used as they are and never written: a missing required file raises
        ``FileNotFoundError``, and a synthetic dataset whose recorded configuration
        (``stackoverflow.synthetic.json``) contradicts a ``synth_*`` parameter that was given
        raises ``ValueError``.
    synth_clients, synth_vocab, synth_tags, synth_seed : int or None
        ``num_clients``, ``vocab_size``, ``num_tags`` and ``seed`` of the
        :class:`~fedprivopt.data.SyntheticConfig` used to generate; ``None``: the default.
    synth_user_sizes : str or None
        The examples-per-user shape of the generator
        (:data:`~fedprivopt.data.synthetic.USER_SIZES`): ``"small"`` (the default, a tenth of
        the real size) or ``"real"`` (the real splits' published sizes).
    vocab_size : int
        ``V``: the top ``V`` words of the word-count file (fewer if the file has fewer; see
        :attr:`vocab_size`), in ``[1, 10**7]`` (a word-count file holds at most
        :data:`~fedprivopt.data.vocab.MAX_WORDS`). The model scores ``V + 4`` tokens.
    seq_len : int
        Sequence length of inputs and targets (TFF: 20), in ``[1, MAX_SEQ_LEN]`` (1024: every
        example is padded to it, 16 bytes a position).
    num_users : int or None
        Use the first ``num_users`` training users in the file's order (client ids sorted);
        ``None`` uses all. Must not exceed the number of training users (nor 10**8).
    max_examples_per_user : int or None
        Read at most this many examples per user (the first ones, in file order), training and
        evaluation alike (TFF's ``max_elements_per_user``), in ``[1, 10**8]``; ``None``: all.
    eval_split : {"test", "heldout"}
        Split used by :meth:`evaluate`.
    eval_users : int
        :meth:`evaluate` pools the first ``eval_users`` users of ``eval_split`` (fixed, cheap,
        deterministic), in ``[1, 10**8]``; fewer if the split has fewer.
    embedding_dim : int
        ``e``, embedding and projection width (TFF: 96), ``>= 1``.
    hidden_size : int
        ``h``, LSTM width (TFF: 670), ``>= 1``. With ``embedding_dim`` and the effective
        ``vocab_size`` the model may have at most :data:`MAX_MODEL_PARAMETERS` = 2**26
        parameters (:func:`parameter_count`), checked before anything is allocated.
    seed : int
        Seed of the model initialization, ``>= 0``.
    cache_users : int
        Per-user tensors kept in memory (least recently used evicted), in ``[0, 10**8]``;
        at most :data:`~fedprivopt.models.stackoverflow_files.CACHE_BYTES` (1 GiB) of them.

    Attributes
    ----------
    num_users : int
        Number of training users (user ``u`` is :attr:`client_ids` ``[u]``).
    vocab_size : int
        Effective ``V``.
    num_tokens : int
        ``V + 4``, the model's input and output size.
    specials : SpecialTokens
        ``pad = 0``, ``oov = V + 1``, ``bos = V + 2``, ``eos = V + 3``.
    words : tuple of str
        The vocabulary: word ``words[i]`` has id ``i + 1``.

    Notes
    -----
    Construction reads the word-count file and the training split's client list only; examples
    are read per user on demand and cached. Pickling (to Ray workers) drops the open database
    and the caches; the copy reopens the file lazily. Not thread-safe.
    """

    REQUIRED_FILES = (SQLITE_FILE, WORD_COUNT_FILE)  # the tag counts are not needed

    name = "stackoverflow-nwp"

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike,
        synthetic: bool = True,
        synth_clients: int | None = None,
        synth_vocab: int | None = None,
        synth_tags: int | None = None,
        synth_seed: int | None = None,
        synth_user_sizes: str | None = None,
        vocab_size: int = 10_000,
        seq_len: int = 20,
        num_users: int | None = None,
        max_examples_per_user: int | None = 1000,
        eval_split: str = "test",
        eval_users: int = 200,
        embedding_dim: int = 96,
        hidden_size: int = 670,
        seed: int = 0,
        cache_users: int = 2048,
    ) -> None:
        self._set_data_dir(
            data_dir,
            synthetic=synthetic,
            synth_clients=synth_clients,
            synth_vocab=synth_vocab,
            synth_tags=synth_tags,
            synth_seed=synth_seed,
            synth_user_sizes=synth_user_sizes,
        )
        requested_v = check_vocab_size(vocab_size)
        self.seq_len = check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
        self._set_selection(
            num_users=num_users,
            max_examples_per_user=max_examples_per_user,
            eval_split=eval_split,
            eval_users=eval_users,
        )
        self.embedding_dim = check_int("embedding_dim", embedding_dim, 1)
        self.hidden_size = check_int("hidden_size", hidden_size, 1)
        self.seed = check_int("seed", seed, 0)
        self.cache_users = check_int("cache_users", cache_users, 0, MAX_USERS)
        self._check_model_size(1)  # the LSTM alone, before any file is read or generated

        self._ensure_files()
        words = read_word_counts(self.data_dir / WORD_COUNT_FILE, limit=requested_v)
        if len(words) == 0:
            raise ValueError(f"{self.data_dir}: the word-count file is empty")
        self.words: tuple[str, ...] = words.items
        self.vocab_size = len(self.words)
        self._check_model_size(self.vocab_size)
        self.num_tokens = self.vocab_size + 4
        self.specials = special_tokens(self.vocab_size)
        self._open_users(num_users)

    def _eval_example_bytes(self) -> int:
        """Inputs and targets, 16 bytes a position, joined and sorted; measured 1-1.5 kB (20)."""
        return 64 * self.seq_len

    def _check_model_size(self, vocab_size: int) -> None:
        """Refuse a model above :data:`MAX_MODEL_PARAMETERS` for ``vocab_size`` words."""
        count = parameter_count(vocab_size, self.embedding_dim, self.hidden_size)
        sizes = f"hidden_size={self.hidden_size}, embedding_dim={self.embedding_dim}"
        words = "with any vocabulary" if vocab_size == 1 else f"vocab_size={vocab_size}"
        check_model_parameters(count, f"{sizes} ({words})")

    def __repr__(self) -> str:
        return (
            f"StackOverflowNextWordTask(data_dir={str(self.data_dir)!r}, "
            f"num_users={self.num_users}, vocab_size={self.vocab_size}, seq_len={self.seq_len}, "
            f"embedding_dim={self.embedding_dim}, hidden_size={self.hidden_size}, "
            f"eval_split={self.eval_split!r}, eval_users={self.eval_users})"
        )

    def _encode(self, examples: Sequence[StackOverflowExample]) -> tuple[torch.Tensor, ...]:
        if self.max_examples_per_user is not None:
            examples = examples[: self.max_examples_per_user]
        if self._word_index is None:
            self._word_index = {w: i + 1 for i, w in enumerate(self.words)}
        return encode_sentences(
            [ex.tokens for ex in examples], self._word_index, seq_len=self.seq_len
        )

    # -------------------------------------------------------------------------- data
    def user_data(self, user_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(x, y)`` of training user ``user_id`` (CPU tensors; do not modify them).

        Both are ``int64`` ``(n, seq_len)``: inputs and next-word targets (ids as in
        :func:`special_tokens`, padded with ``0``). ``n`` may be 0.
        """
        return self._cached_user(user_id, self._read_user)

    def _read_user(self, user_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        split, limit = self._train_split(), self.max_examples_per_user
        x, y = self._encode(split.client_examples(self.client_ids[user_id], limit=limit))
        return x, y

    def user_size(self, user_id: int) -> int:
        """Number of training examples (sentences) of ``user_id`` (reads them if not cached)."""
        return int(self.user_data(user_id)[0].shape[0])

    def _eval_batch_size(self) -> int:
        return max(1, min(_EVAL_MAX_BATCH, _EVAL_LOGITS // (self.seq_len * self.num_tokens)))

    def eval_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The evaluation examples as batches ``(x, y)`` (built once, then cached).

        The examples of the first :attr:`eval_users` users of :attr:`eval_split` (file order) are
        pooled, ordered by length (stable) and cut into batches of at most
        ``min(1024, 2**24 / (seq_len (V + 4)))`` examples, each cut after its longest target.
        """
        if self._eval is None:
            parts = self._encoded_eval_users()
            x = torch.cat([p[0] for p in parts]) if parts else torch.zeros(0, self.seq_len)
            y = torch.cat([p[1] for p in parts]) if parts else torch.zeros(0, self.seq_len)
            sp = self.specials
            counted = (y != PAD) & (y != sp.oov) & (y != sp.eos)  # what "accuracy" counts
            self._check_evaluated(int(counted.sum()), "word in the vocabulary to predict")
            order = torch.argsort((y != PAD).sum(dim=1), stable=True)
            x, y = x[order].long(), y[order].long()
            size = self._eval_batch_size()
            self._eval = [
                _trim(x[i : i + size], y[i : i + size]) for i in range(0, int(x.shape[0]), size)
            ]
        return self._eval

    # ------------------------------------------------------------------------- model
    def build_model(self) -> NextWordLSTM:
        """The LSTM language model, Keras-style initialization from the task's seed."""
        gen = torch.Generator()
        gen.manual_seed(derive_seed(self.seed, "stackoverflow-nwp", "model-init"))
        return NextWordLSTM(self.num_tokens, self.embedding_dim, self.hidden_size, generator=gen)

    def parameter_count(self) -> int:
        """Parameters of :meth:`build_model`'s model (:func:`parameter_count`)."""
        return parameter_count(self.vocab_size, self.embedding_dim, self.hidden_size)

    def cohort_trainer(self, *, device=None, chunk_users: int = 256):
        """A :class:`~fedprivopt.models.next_word_cohort.NextWordCohortTrainer` for this task.

        The fast engine uses it (``vectorize = true``) to train a cohort's users together.
        """
        from fedprivopt.models.next_word_cohort import NextWordCohortTrainer

        return NextWordCohortTrainer(self, device=device, chunk_users=chunk_users)

    def loss(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy averaged over the non-pad targets of the batch."""
        x, y = _trim(x, y)
        logits = model(x)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=PAD)

    def _sums(
        self, model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> dict[str, float]:
        total = {"loss": 0.0}
        with evaluating(model) as device:
            for x, y in batches:
                if x.shape[0] == 0:
                    continue
                x, y = _trim(x.to(device), y.to(device))
                logits = model(x)
                loss = F.cross_entropy(
                    logits.flatten(0, 1), y.flatten(), ignore_index=PAD, reduction="sum"
                )
                total["loss"] += float(loss.to(torch.float64))
                counts = next_word_counts(logits, y, vocab_size=self.vocab_size)
                for key, value in counts.items():
                    total[key] = total.get(key, 0.0) + value
        return total

    @staticmethod
    def _metrics(total: dict[str, float]) -> dict[str, float]:
        def ratio(num: str, den: str) -> float:
            d = total.get(den, 0.0)
            return total.get(num, 0.0) / d if d else math.nan

        return {
            "loss": ratio("loss", "tokens"),
            "accuracy": ratio("correct_no_oov_eos", "tokens_no_oov_eos"),
            "accuracy_no_oov": ratio("correct_no_oov", "tokens_no_oov"),
            "accuracy_with_oov": ratio("correct", "tokens"),
        }

    def evaluate_data(
        self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> dict[str, float]:
        """Token-weighted metrics on ``(x, y)``, batched like :meth:`eval_batches`.

        ``"loss"``, ``"accuracy"``, ``"accuracy_no_oov"`` and ``"accuracy_with_oov"`` as in the
        module docstring; NaN where there is no target to count.
        """
        size = self._eval_batch_size()
        batches = [(x[i : i + size], y[i : i + size]) for i in range(0, int(x.shape[0]), size)]
        return self._metrics(self._sums(model, batches))

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """The metrics of :meth:`evaluate_data` on the pooled evaluation users."""
        return self._metrics(self._sums(model, self.eval_batches()))
