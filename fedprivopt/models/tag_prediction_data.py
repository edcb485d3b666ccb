"""The data side of the tag-prediction task: reading, encoding and caching users' examples.

:class:`TagTaskData` is the base of :class:`~fedprivopt.models.tag_prediction.StackOverflowTagTask`
that reads the TFF StackOverflow SQLite file: a training user's examples, encoded as in
:mod:`~fedprivopt.models.tag_prediction_encoding`, ragged (:meth:`~TagTaskData.user_csr`, kept in
a least-recently-used cache, and :meth:`~TagTaskData.examples_csr`, what the cohort trainer
reads) or padded from them (:meth:`~TagTaskData.user_data`), optionally from a memory-mapped
token store built once (:mod:`fedprivopt.data.token_cache`), and the pooled evaluation batches.
The task's constructor sets the attributes it reads and ends with ``_open_users``; pickling drops
the open database and the caches (:attr:`~TagTaskData.TRANSIENT`), and the copy reopens the file
lazily.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedprivopt.core.text import shown
from fedprivopt.data.fast_example import text_fields_decoder
from fedprivopt.data.locks import refuse_filesystem_root
from fedprivopt.data.stackoverflow import StackOverflowExample
from fedprivopt.data.synthetic_files import run_files_note
from fedprivopt.data.token_cache import (
    CACHE_DIR,
    EncodedUsers,
    file_key,
    open_or_build,
    stderr_progress,
)
from fedprivopt.models.stackoverflow_datadir import check_dir_text, file_in_the_way
from fedprivopt.models.stackoverflow_files import EVAL_BYTES, STATE_LOCK, StackOverflowFiles
from fedprivopt.models.tag_prediction_encoding import (
    UserCSR,
    encode_examples,
    encode_texts,
    example_tensors,
    long_tensor,
    pad_ragged,
    ragged_take,
)

__all__ = ["EVAL_BATCH", "USER_PAD_BYTES", "TagTaskData"]

EVAL_BATCH = 2048  # examples per evaluation forward pass
EVAL_WORD_BYTES = 24
"""Bytes of memory a word of the evaluation set takes while it is built (lists, padded batch)."""
USER_PAD_BYTES = 1 << 30
"""Bytes of one user's padded ``(x, y)`` at most (:meth:`TagTaskData.user_data`; 1 GiB)."""


class TagTaskData(StackOverflowFiles):
    """Per-user training data and pooled evaluation batches of the tag task (a base class).

    The task sets ``name``, ``words``, ``tags``, ``num_features`` (``V``), ``num_tags`` (``K``),
    ``single_label``, ``token_cache``, ``cache_dir`` and what
    :class:`~fedprivopt.models.stackoverflow_files.StackOverflowFiles` asks for (see
    :class:`~fedprivopt.models.tag_prediction.StackOverflowTagTask`), then calls
    ``_open_users``. Not thread-safe.
    """

    name: str
    client_ids: tuple[str, ...]
    words: tuple[str, ...]
    tags: tuple[str, ...]
    num_features: int
    num_tags: int
    single_label: bool
    max_examples_per_user: int | None
    eval_split: str
    eval_users: int
    cache_users: int
    token_cache: bool
    cache_dir: Path
    #: Also dropped by pickling: the tag index and the token store (reopened lazily).
    TRANSIENT = (*StackOverflowFiles.TRANSIENT, "_tag_index", "_store")
    _tag_index: dict[str, int] | None
    _store: EncodedUsers | None

    def _ensure_files(self) -> None:
        """Check the token store's settings, then the data directory's files (the base's).

        Called by the constructor once ``token_cache`` and ``cache_dir`` are set, before any
        file is read or generated. Thirty-first review of issue 15 (data): a ``cache_dir``
        given without ``token_cache`` was silently unused (``task-params.cache-dir`` says where
        the token store is written, and no store is built without ``token-cache = true``), and
        ``cache_dir = "/"`` wrote the store and its lock file into the root of the file system,
        and a ``cache_dir`` inside another run (a comparison's cell) wrote it there, after which
        ``compare --overwrite`` refused that cell for holding files not its own.
        As every setting that applies only with another one, a ``cache_dir`` other than the
        default ``<data_dir>/.fedprivopt-cache`` is refused without ``token_cache``.
        """
        if not self.token_cache and self.cache_dir != self.data_dir / CACHE_DIR:
            raise ValueError(
                "cache_dir applies only with token_cache = true (it is where the token store "
                f"is written); got cache_dir = {shown(str(self.cache_dir))} without it: set "
                "token_cache = true or leave cache_dir out"
            )
        check_dir_text("cache_dir", self.cache_dir)
        refuse_filesystem_root(self.cache_dir, "cache_dir")
        blocking = file_in_the_way(self.cache_dir) if self.token_cache else None
        if blocking is not None:  # forty-third review of issue 15 (input 2): no key named
            where = "" if blocking == self.cache_dir else f" lies under {str(blocking)!r}, which"
            raise ValueError(
                f"cache_dir {str(self.cache_dir)!r}{where} is a file, not a directory: name a "
                "directory for the token store (it is made if missing)"
            )
        note = run_files_note(self.cache_dir) if self.token_cache else None
        if note is not None:  # as a dataset is not generated into one (synthetic.run_files_note)
            raise ValueError(
                f"cache_dir {shown(str(self.cache_dir))} {note}: it is a fedprivopt run, "
                "comparison or tuning, which holds only its own files; choose a directory "
                "outside it for the token store"
            )
        super()._ensure_files()

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

    def _read_train_user(self, client_id: str) -> tuple[list[list[int]], list]:
        """Encoded training examples of ``client_id``: protobuf's C parser, else the exact one.

        The fast path (:func:`~fedprivopt.data.fast_example.text_fields_decoder`) reads only the
        text the task needs; on any failure the pure-Python reader decodes the user again and
        raises its precise error, so both paths accept exactly the same data.
        """
        decode = text_fields_decoder()
        if decode is not None:
            blobs = self._train_split().serialized_examples(
                client_id, limit=self.max_examples_per_user
            )
            try:
                texts = [decode(b) for b in blobs]
            except Exception:  # malformed for the fast path: the exact reader decides
                texts = None
            if texts is not None:
                word_index, tag_index = self._indexes()
                return encode_texts(texts, word_index, tag_index, single_label=self.single_label)
        split = self._train_split()
        return self._encode(split.client_examples(client_id, limit=self.max_examples_per_user))

    # -------------------------------------------------------------------------- data
    def user_data(self, user_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(x, y)`` of training user ``user_id`` (CPU tensors; do not modify them).

        ``x`` is ``int64`` ``(n, L)`` word ids (vocabulary ``< V``, OOV ``V``, padding
        ``V + 1``), ``y`` ``int64`` ``(n, T)`` padded tag ids (padding ``K``) or, single-label,
        ``(n,)``. ``n`` may be 0. Padded from :meth:`user_csr` on each call; a user whose
        padded tensors would take more than :data:`USER_PAD_BYTES` raises ``ValueError``.
        """
        data = self.user_csr(user_id)
        n = int(data.lengths.numel())
        width = max(1, int(data.lengths.max()) if n else 0)
        tags = (
            0 if data.label_lengths is None else max(1, int(data.label_lengths.max()) if n else 0)
        )
        size = 8 * n * (width + tags)
        if size > USER_PAD_BYTES:
            raise ValueError(
                f"{self.sqlite_path}: training user {shown(self.client_ids[user_id])}: "
                f"{n:,} examples padded to the longest one ({width:,} words) would take "
                f"{size / 2**30:.3g} GiB, more than {USER_PAD_BYTES / 2**30:g} GiB;"
                " the cohort trainer (vectorize = true, the default of the fast engine) reads "
                "users unpadded, or cap max_examples_per_user"
            )
        x = pad_ragged(data.tokens.numpy(), data.lengths.numpy(), self.num_features + 1)
        if data.label_lengths is None:
            return x, data.labels
        return x, pad_ragged(data.labels.numpy(), data.label_lengths.numpy(), self.num_tags)

    def _read_csr(self, user_id: int) -> UserCSR:
        """User ``user_id``'s examples from the SQLite file, encoded, as ragged tensors."""
        words, labels = self._read_train_user(self.client_ids[user_id])
        lengths = long_tensor(np.fromiter(map(len, words), np.int64, len(words)))
        tokens = long_tensor(np.fromiter(itertools.chain.from_iterable(words), np.int64))
        if self.single_label:
            return UserCSR(tokens, lengths, long_tensor(np.asarray(labels, np.int64)), None)
        label_lengths = long_tensor(np.fromiter(map(len, labels), np.int64, len(labels)))
        flat = long_tensor(np.fromiter(itertools.chain.from_iterable(labels), np.int64))
        return UserCSR(tokens, lengths, flat, label_lengths)

    def user_csr(self, user_id: int) -> UserCSR:
        """The examples of ``user_id`` as ragged arrays (what the cohort trainer consumes).

        The same data as :meth:`user_data` without padding: from the token store when
        :attr:`token_cache` is on, else decoded from the file and kept in the user cache.
        Thirty-first review of issue 15 (data): they were cut from :meth:`user_data`'s padded
        tensors, ``n x L`` values for ``n`` examples whose longest has ``L`` words: a user of
        2,000 examples, one of them 400,000 words (an 800 kB example, within
        :data:`~fedprivopt.data.stackoverflow.MAX_EXAMPLE_BYTES`), took 6.4 GB and 49 s.
        """
        user_id = self._check_user(user_id)
        store = self.encoded_users()
        if store is not None:
            tokens, lengths, labels, label_lengths = store.user(user_id)
            return UserCSR(
                long_tensor(tokens),
                long_tensor(lengths),
                long_tensor(labels),
                None if label_lengths is None else long_tensor(label_lengths),
            )
        return self._cached_user(user_id, self._read_csr)  # type: ignore[arg-type, return-value]

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
                long_tensor(tokens),
                long_tensor(lengths),
                long_tensor(labels),
                None if label_lengths is None else long_tensor(label_lengths),
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
        if self._store is not None:
            return self._store
        with STATE_LOCK:  # once, though the cohort trainer's workers ask at once
            if self._store is not None:
                return self._store
            self._train_split()  # opened once, before the encoding workers fork
            self._check_cache_dir()
            try:
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
            except OSError as exc:
                if not self._in_cache_dir(exc):
                    raise
                raise self._cache_dir_refusal("cannot be written", exc) from None
            return self._store

    def _check_cache_dir(self) -> None:
        """Refuse a ``cache_dir`` this process cannot create, naming the parameter.

        Forty-fifth review of issue 15 (input 7): a data directory another user owns (a shared,
        read-only dataset) with ``token_cache = true`` and the default ``cache_dir`` (inside it)
        ended in ``D/.fedprivopt-cache: Permission denied``, naming neither the parameter nor a
        way out. A store built beforehand (readable there) is used as before.
        """
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._cache_dir_refusal("cannot be created", exc) from None

    def _in_cache_dir(self, exc: OSError) -> bool:
        """Whether ``exc`` is a refused write of a file in ``cache_dir`` (its lock, its store).

        Follow-up of the forty-fifth review of issue 15 (outputs 4): a ``cache_dir`` that
        exists but cannot be written (a shared dataset's ``.fedprivopt-cache`` another user made,
        holding no store for these parameters; a read-only mount) passed :meth:`_check_cache_dir`
        and ended in ``cache_dir/<digest>.lock: Permission denied``, naming no parameter.
        """
        refused = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR)
        if exc.errno not in refused or exc.filename is None:
            return False
        return Path(os.fsdecode(exc.filename)).parent == self.cache_dir

    def _cache_dir_refusal(self, what: str, exc: OSError) -> ValueError:
        """The refusal of a ``cache_dir`` that ``what`` (``cannot be created``), naming it."""
        default = self.cache_dir == self.data_dir / CACHE_DIR
        where = " (its default, in data_dir)" if default else ""
        return ValueError(
            f"cache_dir {str(self.cache_dir)!r}{where}: {what} ({exc.strerror}), and token_cache "
            "= true writes its token store there: set cache_dir to a directory you can write"
        )

    def _store_key(self) -> dict:
        """What the token store depends on: the file's identity and the encoding.

        The file must still be the one the task read (thirty-fifth review of issue 15, the data
        reviewer's report: a dataset replaced between building the task and the store's first
        use had the split opened before stored under the new file's key, for later runs on the
        new file to reuse).
        """
        self._check_same_dataset()

        def digest(items: Sequence[str]) -> str:
            return hashlib.sha256("\n".join(items).encode("utf-8", "surrogatepass")).hexdigest()

        return {
            "task": self.name,
            "file": file_key(self.sqlite_path),
            "words": digest(self.words),
            "tags": digest(self.tags),
            "clients": digest(self.client_ids),
            "single_label": self.single_label,
            "max_examples_per_user": self.max_examples_per_user,
        }

    def user_size(self, user_id: int) -> int:
        """Number of training examples of ``user_id`` (reads them if not cached)."""
        return int(self.user_csr(user_id).lengths.numel())

    def eval_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The evaluation examples as batches ``(x, y)`` (built once, then cached).

        The examples of the first :attr:`eval_users` users of :attr:`eval_split` (file order) are
        pooled, ordered by length (stable) and cut into batches of at most 2048, each padded to
        its own longest example. Their words take at most :data:`EVAL_BYTES` together
        (``ValueError`` as they are read): the count of examples checked when the task was
        built assumes posts of the real size, and an example holds up to 1 MiB. Thirty-first
        review of issue 15 (data): 300 test examples of 200,000 words each (a 114 MB file)
        took 1.66 GB and 14.5 s; 2,000 of them about 11 GB.
        """
        if self._eval is None:
            words: list[list[int]] = []
            labels: list = []
            count = 0
            for users, (w, lab) in enumerate(self._iter_eval_users(), 1):
                words.extend(w)
                labels.extend(lab)
                count += sum(map(len, w))
                if count * EVAL_WORD_BYTES > EVAL_BYTES:
                    raise ValueError(
                        f"eval_users={self.eval_users}: the examples of the first {users:,} "
                        f"users of split {self.eval_split!r} in {self.data_dir} hold "
                        f"{count:,} words, about {count * EVAL_WORD_BYTES / 2**30:.3g} GiB to "
                        f"evaluate in memory; at most {EVAL_BYTES / 2**30:g} GiB: lower it or "
                        "max_examples_per_user"
                    )
            true = len(labels) if self.single_label else sum(len(tags) for tags in labels)
            self._check_evaluated(true, f"example with one of the {self.num_tags} tags")
            order = sorted(range(len(words)), key=lambda i: len(words[i]))
            batches = []
            for start in range(0, len(order), EVAL_BATCH):
                part = order[start : start + EVAL_BATCH]
                batches.append(
                    example_tensors(
                        [words[i] for i in part],
                        [labels[i] for i in part],
                        self.num_features,
                        self.num_tags,
                        self.single_label,
                    )
                )
            self._eval = batches
        return self._eval
