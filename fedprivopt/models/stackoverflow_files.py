"""What the StackOverflow tasks share: their parameters, users, caches and evaluation users.

:class:`StackOverflowFiles` extends the handling of the task's data directory
(:class:`~fedprivopt.models.stackoverflow_datadir.StackOverflowDataDir`: ``stackoverflow.sqlite``
and the vocabulary files, real or synthetic, found or generated, and checked). It also checks
the constructor parameters the tasks share, opens the training split and picks its users,
checks user ids, keeps the tasks' per-user tensors in a least-recently-used cache, reads the
evaluation users and drops the open file and the caches when pickled.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedprivopt.core.checks import check_int
from fedprivopt.core.local import check_user_id
from fedprivopt.data.sqlite import SQLiteSplit, read_example_counts
from fedprivopt.data.synthetic_files import SQLITE_FILE
from fedprivopt.data.vocab import MAX_WORDS
from fedprivopt.models.stackoverflow_datadir import StackOverflowDataDir
from fedprivopt.privacy.sampling import MAX_POPULATION

__all__ = [
    "CACHE_BYTES",
    "EVAL_BYTES",
    "MAX_EXAMPLES_PER_USER",
    "MAX_MODEL_PARAMETERS",
    "MAX_TAGS",
    "MAX_USERS",
    "StackOverflowFiles",
    "check_model_parameters",
    "check_vocab_size",
]

#: Guards a task's lazily built state (the user cache, the training split, the token store)
#: when the cohort trainer's workers read users from threads (``CohortTrainer.run_chunks``).
#: Twenty-second review of issue 15: two workers opened the token store at once (the second
#: waited for the first's lock and said on stderr that it waited for "another process"), and a
#: user found in the cache could be evicted by the other worker before ``move_to_end``
#: (``KeyError``). One lock for the process: tasks are pickled for Ray, a lock is not.
STATE_LOCK = threading.RLock()

MAX_MODEL_PARAMETERS = 2**26
"""Largest model of a StackOverflow task: 256 MiB a float32 copy, and a run holds a few dozen
copies (the cohort's updates, the optimizer's moments, checkpoints). The real tasks' models have
4,053,428 (next-word, TFF's shape) and 5,000,500 (tag prediction) parameters."""

MAX_USERS = MAX_POPULATION
"""Largest ``num_users``, ``eval_users`` and ``cache_users`` (10**8, the population's bound).

Twenty-ninth review of issue 15: 10**20 was accepted and silently capped at the file's users
while the run's ``config.toml`` and ledger recorded 10**20."""

MAX_EXAMPLES_PER_USER = 10**8
"""Largest ``max_examples_per_user``: the real training split holds about 1.4 * 10**8 examples
of 342,477 users in all, so no user reaches it."""

MAX_TAGS = MAX_MODEL_PARAMETERS // 2
"""Largest ``num_tags`` (2**25): the tag model's ``(V + 1) K`` parameters are at most
:data:`MAX_MODEL_PARAMETERS` with ``V >= 1``. ``vocab_size`` is at most
:data:`~fedprivopt.data.vocab.MAX_WORDS` (10**7), the words a word-count file may hold."""


CACHE_BYTES = 1 << 30
"""Bytes of per-user tensors a task keeps (besides at most ``cache_users`` users): 1 GiB.

Twenty-ninth review of issue 15: the cache was bounded by its count alone; next-word users of
the real sizes at ``seq_len = 1024`` hold about 6 MB each, so 300 of them took 1.8 GB and the
default 2,048 about 12 GB. The least recently used users are evicted past either bound (the
newest is always kept)."""


EVAL_BYTES = 2 << 30
"""Bytes of memory a task's evaluation set may take (2 GiB: about 2 million examples)."""

IDENTITY_BYTES = 1 << 20
"""Bytes of ``stackoverflow.sqlite`` (its first MiB, with its size) that identify the file a task
read: its header, schema and first users' examples (as ``simulation.cluster``'s fingerprint, so
an equal copy on another node is the same dataset)."""


def _sqlite_identity(path: Path) -> tuple[int, str]:
    """``(size, SHA-256 of the first IDENTITY_BYTES)`` of the SQLite file ``path``."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        head = handle.read(IDENTITY_BYTES)
    return size, hashlib.sha256(head).hexdigest()


def _file_state(path: Path) -> tuple[int, int, int, int]:
    """``(device, inode, size, mtime in ns)`` of ``path``: what a copy over it changes."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _nbytes(tensors: tuple[Any, ...]) -> int:
    return sum(int(getattr(t, "nbytes", 0)) for t in tensors)


def check_vocab_size(value: object) -> int:
    """``vocab_size`` in ``[1, MAX_WORDS]`` (a task keeps the file's top ``vocab_size`` words)."""
    return check_int("vocab_size", value, 1, MAX_WORDS)


def check_model_parameters(count: int, sizes: str) -> None:
    """Refuse a model of more than :data:`MAX_MODEL_PARAMETERS` parameters, before it is built.

    Parameters
    ----------
    count : int
        The model's parameters.
    sizes : str
        The task parameters that give ``count``, as ``name=value`` text beginning with the one
        to name (the CLI turns a leading argument name into its ``task-params`` key).

    Raises
    ------
    ValueError
        Naming ``sizes``, ``count`` and the limit.
    """
    if count > MAX_MODEL_PARAMETERS:
        raise ValueError(
            f"{sizes} give a model of {count:,} parameters; at most {MAX_MODEL_PARAMETERS:,} "
            f"(2**26: {MAX_MODEL_PARAMETERS * 4 // 2**20} MiB a float32 copy, and a run holds a "
            "few dozen copies)"
        )


class StackOverflowFiles(StackOverflowDataDir):
    """What a StackOverflow task shares with the other, over its data directory (a mixin).

    The task's constructor calls :meth:`_set_data_dir` and :meth:`_set_selection` (which set
    ``data_dir``, ``synthetic``, ``synth_params``, ``synth_config``, ``max_examples_per_user``,
    ``eval_split`` and ``eval_users``), sets ``cache_users``, calls :meth:`_ensure_files`, reads
    its vocabulary and ends with :meth:`_open_users`. :attr:`REQUIRED_FILES` names the files the
    task reads, :attr:`TRANSIENT` the attributes that pickling drops; the task defines
    ``_encode`` (a user's examples to what :meth:`_encoded_eval_users` lists).
    """

    #: Attributes set to ``None`` by :meth:`_init_runtime` and dropped by pickling (the open
    #: training split, the evaluation batches, the vocabulary index); rebuilt lazily.
    TRANSIENT: tuple[str, ...] = ("_train", "_eval", "_word_index")
    max_examples_per_user: int | None
    eval_split: str
    eval_users: int
    client_ids: tuple[str, ...]
    num_users: int
    cache_users: int
    _cache: OrderedDict[int, tuple[torch.Tensor, torch.Tensor]]
    _cache_bytes: int
    _train: SQLiteSplit | None
    _eval: list[tuple[torch.Tensor, torch.Tensor]] | None
    _word_index: dict[str, int] | None

    # ------------------------------------------------------------ shared parameters
    def _set_selection(
        self,
        *,
        num_users: int | None,
        max_examples_per_user: int | None,
        eval_split: str,
        eval_users: int,
    ) -> None:
        """Check ``num_users`` (used by :meth:`_open_users`) and set the other three."""
        # bounded before a file is read or generated (twenty-ninth review of issue 15: 10**20
        # accepted, then silently capped by the files while the run recorded 10**20)
        check_int("num_users", num_users, 1, MAX_USERS, none=True)
        self.max_examples_per_user = check_int(
            "max_examples_per_user", max_examples_per_user, 1, MAX_EXAMPLES_PER_USER, none=True
        )
        if eval_split not in ("test", "heldout"):
            raise ValueError(f"eval_split must be 'test' or 'heldout', got {eval_split!r}")
        self.eval_split = eval_split
        self.eval_users = check_int("eval_users", eval_users, 1, MAX_USERS)

    def _open_users(self, num_users: int | None) -> None:
        """Open the training split and keep its first ``num_users`` users (all for ``None``)."""
        train = SQLiteSplit(self.data_dir / SQLITE_FILE, "train")
        self._sqlite_id = _sqlite_identity(train.path)  # what every later open must find
        self._sqlite_stat = _file_state(train.path)  # what every later read must find
        ids = list(train.client_ids)
        if num_users is not None and num_users > len(ids):
            raise ValueError(
                f"num_users must be <= {len(ids)} (training users in {self.data_dir}), "
                f"got {num_users}"
            )
        self.client_ids = tuple(ids[:num_users] if num_users else ids)
        self.num_users = len(self.client_ids)
        self._init_runtime()
        self._train = train
        self._check_evaluation_size()

    def _check_same_dataset(self) -> None:
        """Refuse a ``stackoverflow.sqlite`` other than the one :meth:`_open_users` read.

        Called where the file is opened again: the evaluation users, the training split after
        unpickling (a Ray actor's, a shard's copy), the data identity. Thirty-fifth review of
        issue 15 (data): ``data synth --out D --overwrite`` (or a copy over the file) while a
        run read ``D`` made its evaluation set, built at the first evaluation, and its workers'
        copies, which reopen the file, read the new dataset's users under the old one's client
        ids and vocabulary, silently, while the ledger recorded the old one.
        """
        recorded = getattr(self, "_sqlite_id", None)
        if recorded is None:
            return
        try:
            now = _sqlite_identity(self.sqlite_path)
        except OSError:
            return  # the reader that follows names it
        if now != recorded:
            sizes = f"{now[0]:,} bytes where it read {recorded[0]:,}"
            raise ValueError(
                f"{self.sqlite_path}: the dataset changed while the task used it (replaced or "
                f"rewritten: {sizes if now[0] != recorded[0] else 'its first MiB differs'}); a "
                "run reads one dataset, so it stops here: start it again on the dataset as it "
                "is now, and do not regenerate (data synth --overwrite) or replace a dataset "
                "that a run reads"
            )

    def _eval_example_bytes(self) -> int:
        """Memory of one example while the evaluation set is built (tag task: 0.6 kB measured)."""
        return 1024

    def _check_evaluation_size(self) -> None:
        """Refuse evaluation users whose examples would take more than :data:`EVAL_BYTES`.

        Counted from ``client_metadata`` (capped at ``max_examples_per_user``) before any is
        read. Twenty-ninth review of issue 15: the evaluation set is built in memory, about
        1 kB an example (next-word, ``seq_len = 20``) or 0.6 kB (tag), so ``eval_users`` of
        the real test split's 204,088 users (16.6 million examples) would take 10-17 GB.
        """
        if not self.sqlite_path.is_file():
            return
        try:  # the training split has warned of a missing index already
            split = SQLiteSplit(
                self.sqlite_path, self.eval_split, validate=False, warn_unindexed=False
            )
        except ValueError:
            return  # no such split: the first evaluation says so
        try:
            counts = [split.num_examples(c) for c in list(split.client_ids)[: self.eval_users]]
        finally:
            split.close()
        cap = self.max_examples_per_user
        sizes = np.minimum(np.asarray(counts, dtype=np.float64), cap if cap else np.inf)
        used = np.cumsum(sizes * self._eval_example_bytes())
        if used.size and used[-1] > EVAL_BYTES:
            fit = int(np.searchsorted(used, EVAL_BYTES, side="right"))
            raise ValueError(
                f"eval_users={self.eval_users}: the first {len(counts):,} users of split "
                f"{self.eval_split!r} hold {int(sizes.sum()):,} examples to evaluate, about "
                f"{used[-1] / 2**30:,.1f} GiB in memory; at most {EVAL_BYTES / 2**30:g} GiB: "
                f"lower it (the first {fit:,} users fit) or max_examples_per_user"
            )

    # ------------------------------------------------------------------ runtime state
    def _init_runtime(self) -> None:
        for key in self.TRANSIENT:
            setattr(self, key, None)
        self._cache = OrderedDict()
        self._cache_bytes = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in self.TRANSIENT:
            state[key] = None
        state["_cache"] = OrderedDict()
        state["_cache_bytes"] = 0
        return state

    def data_identity(self) -> dict[str, Any]:
        """What identifies the data a run reads (recorded in its ledger, checked on resume).

        The SQLite file's size, a SHA-256 of the selected training users' ids and of every
        split's per-client example counts (``client_metadata``, read in about a second for the
        full file), and a SHA-256 of each count file the task reads. Another dataset put at the
        same ``data_dir`` (a different download, a synthetic one of another seed) differs in at
        least one of them; no example is read.
        """
        self._check_same_dataset()  # the identity of the file the task read, not another's
        clients = hashlib.sha256()
        clients.update("\n".join(self.client_ids).encode("utf-8", "surrogatepass"))
        for split, counts in sorted(read_example_counts(self.sqlite_path).items()):
            clients.update(f"\n{split}:".encode())
            clients.update(counts.astype("<i8").tobytes())
        identity: dict[str, Any] = {
            "sqlite_bytes": self.sqlite_path.stat().st_size,
            "users_sha256": clients.hexdigest(),
        }
        for name in self.REQUIRED_FILES:
            if name != SQLITE_FILE:  # streamed: a word-count file may hold 10**7 words
                with (self.data_dir / name).open("rb") as f:
                    identity[f"{name}_sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
        return identity

    def _check_user(self, user_id: int) -> int:
        return check_user_id(user_id, self.num_users)

    def _train_split(self) -> SQLiteSplit:
        """The training split, opened on first use (after unpickling too)."""
        with STATE_LOCK:
            if self._train is None:
                self._check_same_dataset()
                self._train = SQLiteSplit(self.sqlite_path, "train", validate=False)
            else:
                self._check_file_unchanged()
            return self._train

    def _check_file_unchanged(self) -> None:
        """:meth:`_check_same_dataset` when the file's inode, size or time changed since last look.

        Forty-second review of issue 15 (input 1): ``cp other.sqlite D/stackoverflow.sqlite``
        (a copy writes into the same file) while a run read ``D``: the open training split went
        on reading the other file's pages under the old client ids, ``database disk image is
        malformed`` (rc 2, a damaged file where it was a replaced one), or the other dataset's
        users silently where the pages fit, until the next evaluation reopened it. A ``stat``
        before each read of a user (cheap); the full check only when it changed.
        """
        try:
            now = _file_state(self.sqlite_path)
        except OSError:
            return  # the reader that follows names it
        if now != getattr(self, "_sqlite_stat", None):
            self._check_same_dataset()
            self._sqlite_stat = now

    def _encoded_eval_users(self) -> list[Any]:
        """``_encode`` of each of the first :attr:`eval_users` users of :attr:`eval_split`."""
        return list(self._iter_eval_users())

    def _iter_eval_users(self) -> Iterator[Any]:
        """:meth:`_encoded_eval_users` one user at a time (a caller may stop early)."""
        self._check_same_dataset()
        split = SQLiteSplit(self.sqlite_path, self.eval_split, validate=False)
        try:
            for cid in list(split.client_ids)[: self.eval_users]:
                yield self._encode(split.client_examples(cid, limit=self.max_examples_per_user))
        finally:
            split.close()

    def _check_evaluated(self, counted: int, what: str) -> None:
        """Refuse an evaluation set in which the task's metrics count nothing.

        Twenty-ninth review of issue 15: evaluation users without examples (a damaged or
        hand-built file) made every metric NaN, which the run reported as a diverged model
        ("lower the learning rates").
        """
        if counted == 0:
            raise ValueError(
                f"eval_users={self.eval_users}: the first {self.eval_users} users of split "
                f"{self.eval_split!r} in {self.data_dir} hold no {what}, so every evaluation "
                "would be NaN; raise it or choose another eval_split"
            )

    def private_evaluation_users(self) -> tuple[int, int]:
        """``(private, evaluated)``: evaluation users among the training users, and their number.

        The evaluation users are the first :attr:`eval_users` users of :attr:`eval_split`,
        compared with the training users (:attr:`client_ids`) by client id. ``test`` holds later
        posts of the training users (mostly private), ``heldout`` other users (none private).
        """
        self._check_same_dataset()
        split = SQLiteSplit(self.sqlite_path, self.eval_split, validate=False)
        try:
            ids = list(split.client_ids)[: self.eval_users]
        finally:
            split.close()
        population = set(self.client_ids)
        return sum(cid in population for cid in ids), len(ids)

    def _cached_user(
        self, user_id: int, read: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``read(user_id)`` (user id checked), kept among the ``cache_users`` most recent."""
        user_id = self._check_user(user_id)
        with STATE_LOCK:  # the cohort trainer's workers read users at once
            hit = self._cache.get(user_id)
            if hit is not None:
                self._cache.move_to_end(user_id)
                return hit
        out = read(user_id)  # outside the lock: workers read different users in parallel
        if self.cache_users:
            with STATE_LOCK:
                old = self._cache.pop(user_id, None)  # another worker read it meanwhile
                self._cache_bytes -= 0 if old is None else _nbytes(old)
                self._cache[user_id] = out
                self._cache_bytes += _nbytes(out)
                while len(self._cache) > 1 and (
                    len(self._cache) > self.cache_users or self._cache_bytes > CACHE_BYTES
                ):
                    self._cache_bytes -= _nbytes(self._cache.popitem(last=False)[1])
        return out
