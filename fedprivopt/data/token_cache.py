"""A compact, memory-mapped store of encoded users (word ids and tag ids), built once.

Decoding a user's ``tf.train.Example`` protos and mapping every word to its vocabulary id costs
about 1 ms of Python per user (``benchmarks/NOTES.md``); a round of 1,000 users pays it on every
round. :class:`EncodedUsers` pays it once per dataset and task encoding: every user's examples
are stored as ragged integer arrays (CSR) in ``.npy`` files that are memory-mapped, so a user is
two slices of the files and a process holds only the pages it touches.

Layout (``E`` examples, ``T`` word ids, ``L`` tag ids; user ``u`` has the examples
``users[u]:users[u + 1]``, example ``e`` the words ``tokens[token_ptr[e]:token_ptr[e + 1]]``)::

    users.npy      int64 (U + 1,)  example offsets per user
    token_ptr.npy  int64 (E + 1,)  word offsets per example
    tokens.npy     int16/int32 (T,) word ids, out-of-vocabulary words included (as the task encodes)
    label_ptr.npy  int64 (E + 1,)  tag offsets per example (multi-label stores only)
    labels.npy     int16/int32     tag ids (multi-label) or one label per example (single-label)
    meta.json      the format version, the key the store was built for, and the sizes

A store is identified by a *key*: a JSON-able description of the source file and of the
encoding (vocabulary, tags, label mode, example cap); its directory name is a digest of the key,
so a changed file or encoding gets a store of its own. Building writes into a temporary directory
and renames it into place (atomic), under an exclusive lock when several processes may build the
same store; a store whose files disagree with its ``meta.json`` is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from fedprivopt.core.checks import check_int
from fedprivopt.core.files import read_at_most
from fedprivopt.core.local import check_user_id
from fedprivopt.core.orphans import die_with_parent
from fedprivopt.core.text import shown
from fedprivopt.data.locks import file_lock, refuse_filesystem_root
from fedprivopt.data.ordered_workers import ENDING_SIGNALS

__all__ = [
    "CACHE_DIR",
    "EncodedUsers",
    "cache_key_digest",
    "file_key",
    "open_or_build",
    "remove_stores",
    "stderr_progress",
]

FORMAT_VERSION = 2

#: Where a data directory's stores live by default (``<data-dir>/.fedprivopt-cache``).
CACHE_DIR = ".fedprivopt-cache"
_ARRAYS = ("users", "token_ptr", "tokens", "labels")

# encode(user) -> (word-id lists, label lists or single labels), as the task encodes a user
Encoder = Callable[[int], tuple[Sequence[Sequence[int]], Sequence]]


def cache_key_digest(key: dict) -> str:
    """The directory name of the store built for ``key`` (a digest of its canonical JSON)."""
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:_DIGEST_CHARS]


_DIGEST_CHARS = 20
META_LIMIT = 1 << 20
"""Bytes of a store's ``meta.json`` at most (it holds a few hundred); a larger one is damaged."""
"""Hex characters of a store's directory name (:func:`cache_key_digest`)."""


def _remove_partial_builds(store: Path) -> None:
    """Remove the partial directories a killed build of ``store`` left (``<name>.tmp-<pid>``).

    Call it holding the store's lock: no other process then builds that store.
    """
    for partial in store.parent.glob(f"{store.name}.tmp-*"):
        shutil.rmtree(partial, ignore_errors=True)


def _int_dtype(bound: int) -> np.dtype:
    return np.dtype(np.int16) if bound < np.iinfo(np.int16).max else np.dtype(np.int32)


def _check_regular(path: Path) -> None:
    """Raise ``ValueError`` if ``path`` exists and is not a regular file (a FIFO, a device)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return  # a missing array is named by its reader
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path.name} is not a regular file")


class EncodedUsers:
    """Read access to a built store (memory-mapped; cheap to open, safe to pickle).

    Parameters
    ----------
    directory : str or os.PathLike
        A store written by :func:`open_or_build`.

    Raises
    ------
    ValueError
        If the files are missing, truncated or disagree with ``meta.json``.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        try:
            # only regular files are read: a FIFO hung the run in read (eighteenth review of
            # issue 15, finding 6); a store that holds one is damaged, and rebuilt
            for name in ("meta.json", *(f"{a}.npy" for a in (*_ARRAYS, "label_ptr"))):
                _check_regular(self.directory / name)
            # at most META_LIMIT bytes (twenty-ninth review of issue 15: a sparse 3 GB
            # meta.json took 6.6 GB and 109 s before the store was rebuilt; 20 GB: killed)
            raw = read_at_most(self.directory / "meta.json", META_LIMIT)
            if raw is None:
                raise ValueError(f"meta.json holds more than {META_LIMIT:,} bytes")
            self.meta = json.loads(raw.decode("utf-8"))
            arrays = {
                name: np.load(self.directory / f"{name}.npy", mmap_mode="r", allow_pickle=False)
                for name in (*_ARRAYS, "label_ptr")
                if name != "label_ptr" or self.meta["multi_label"]
            }
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{self.directory}: unreadable encoded-user store: {exc}") from exc
        self.multi_label = bool(self.meta["multi_label"])
        self._users = arrays["users"]
        self._token_ptr = arrays["token_ptr"]
        self._tokens = arrays["tokens"]
        self._labels = arrays["labels"]
        self._label_ptr = arrays.get("label_ptr")
        try:
            self._check()
        except (KeyError, TypeError) as exc:  # a size missing, null or a list (twenty-ninth
            # review of issue 15: "num_users": null was a TypeError traceback, rc 1)
            raise ValueError(f"{self.directory}: damaged encoded-user store: {exc!r}") from exc

    def _check(self) -> None:
        m = self.meta
        problems = []
        if m.get("version") != FORMAT_VERSION:
            problems.append(f"format version {m.get('version')!r} != {FORMAT_VERSION}")
        n_users, n_ex = int(m["num_users"]), int(m["num_examples"])
        shapes = {
            "users": (n_users + 1,),
            "token_ptr": (n_ex + 1,),
            "tokens": (int(m["num_tokens"]),),
            "labels": (int(m["num_labels"]),) if self.multi_label else (n_ex,),
        }
        if self.multi_label:
            shapes["label_ptr"] = (n_ex + 1,)
        for name, shape in shapes.items():
            array = getattr(self, f"_{name}")
            if array.shape != shape:
                problems.append(f"{name}.npy has shape {array.shape}, expected {shape}")
        if not problems:
            ends = {
                "users": (self._users, n_ex),
                "token_ptr": (self._token_ptr, int(m["num_tokens"])),
            }
            if self.multi_label:
                ends["label_ptr"] = (self._label_ptr, int(m["num_labels"]))
            for name, (ptr, end) in ends.items():
                if int(ptr[0]) != 0 or int(ptr[-1]) != end:
                    problems.append(f"{name}.npy does not span [0, {end}]")
        if problems:
            raise ValueError(f"{self.directory}: damaged encoded-user store: {'; '.join(problems)}")

    @property
    def num_users(self) -> int:
        """Number of users stored."""
        return int(self.meta["num_users"])

    def user(self, user: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """The stored examples of ``user`` (read-only views into the files).

        Returns
        -------
        tokens : numpy.ndarray
            The word ids of all its examples, concatenated (stored dtype).
        lengths : numpy.ndarray
            int64 ``(n,)``: words per example.
        labels : numpy.ndarray
            Tag ids of all its examples concatenated (multi-label) or ``(n,)`` single labels.
        label_lengths : numpy.ndarray or None
            int64 ``(n,)`` tags per example (multi-label), else ``None``.
        """
        user = check_user_id(user, self.num_users)
        e0, e1 = int(self._users[user]), int(self._users[user + 1])
        ptr = np.asarray(self._token_ptr[e0 : e1 + 1])
        lengths = np.diff(ptr)
        tokens = self._tokens[int(ptr[0]) : int(ptr[-1])] if ptr.size else self._tokens[:0]
        if self.multi_label:
            lptr = np.asarray(self._label_ptr[e0 : e1 + 1])
            label_lengths = np.diff(lptr)
            labels = self._labels[int(lptr[0]) : int(lptr[-1])] if lptr.size else self._labels[:0]
        else:
            label_lengths, labels = None, self._labels[e0:e1]
        self._check_user(user, e1 - e0, lengths, tokens, labels, label_lengths)
        return tokens, lengths, labels, label_lengths

    def example_counts(self, users: Sequence[int]) -> np.ndarray:
        """int64: the number of stored examples of each of ``users``."""
        users = self._users_array(users)
        counts = np.asarray(self._users[users + 1], dtype=np.int64) - self._users[users]
        if (counts < 0).any():
            self._damaged(int(users[np.argmax(counts < 0)]), "its offsets are not ordered")
        return counts

    def gather(
        self, users: Sequence[int], picks: Sequence[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Examples ``picks[i]`` of user ``users[i]``, for every ``i``, concatenated in order.

        What :meth:`user` returns for one user, for many at once and only for the picked
        examples (positions among each user's examples), with the same checks on what is read.

        Returns
        -------
        tokens, lengths, labels, label_lengths : numpy.ndarray
            As :meth:`user`, over the picked examples (``label_lengths`` ``None`` unless
            multi-label).
        """
        users = self._users_array(users)
        counts = self.example_counts(users)
        sizes = np.array([len(p) for p in picks], dtype=np.int64)
        if sizes.size != users.size:
            raise ValueError("gather needs one array of picks per user")
        picks = np.concatenate([_integer_ids("picks", p) for p in picks]) if sizes.size else (
            np.empty(0, dtype=np.int64)
        )  # fmt: skip
        owner = np.repeat(np.arange(users.size), sizes)
        if picks.size and ((picks < 0).any() or (picks >= counts[owner]).any()):
            raise ValueError("gather: a pick is outside its user's examples")
        examples = np.asarray(self._users[users], dtype=np.int64)[owner] + picks
        tokens, lengths = self._ragged(self._token_ptr, self._tokens, examples, users, owner)
        if self.multi_label:
            labels, label_lengths = self._ragged(
                self._label_ptr, self._labels, examples, users, owner
            )
        else:
            labels, label_lengths = np.asarray(self._labels[examples]), None
        for name, ids, bound in (
            ("word", tokens, self.meta["token_bound"]),
            ("label", labels, self.meta["label_bound"]),
        ):
            bad = (ids < 0) | (ids >= bound)
            if bad.any():
                self._damaged(-1, f"a {name} id is outside [0, {bound})")
        return tokens, lengths, labels, label_lengths

    def _users_array(self, users: Sequence[int]) -> np.ndarray:
        return _integer_ids("users", users, self.num_users)

    def _ragged(
        self, ptr: np.ndarray, values: np.ndarray, examples: np.ndarray, users, owner
    ) -> tuple[np.ndarray, np.ndarray]:
        """``values`` of ``examples`` (CSR ``ptr``) concatenated, and their lengths."""
        starts = np.asarray(ptr[examples], dtype=np.int64)
        lengths = np.asarray(ptr[examples + 1], dtype=np.int64) - starts
        if (lengths < 0).any():
            self._damaged(int(users[owner[np.argmax(lengths < 0)]]), "its offsets are not ordered")
        total = int(lengths.sum())
        index = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        index += np.arange(total, dtype=np.int64)
        return np.asarray(values[index]), lengths

    def _damaged(self, user: int, problem: str) -> None:
        where = f"user {user}: " if user >= 0 else ""
        raise ValueError(
            f"{self.directory}: damaged encoded-user store: {where}{problem} "
            "(delete the directory to rebuild it)"
        )

    def _check_user(self, user, examples, lengths, tokens, labels, label_lengths) -> None:
        """Cheap structural checks of one user's slices (offsets ordered, ids in range)."""
        problem = None
        if examples < 0 or lengths.size != examples or (lengths < 0).any():
            problem = "its offsets are not ordered"
        elif label_lengths is not None and (label_lengths < 0).any():
            problem = "its label offsets are not ordered"
        elif labels.size != (examples if label_lengths is None else int(label_lengths.sum())):
            problem = "it has the wrong number of labels"
        else:
            for name, ids, bound in (
                ("word", tokens, self.meta["token_bound"]),
                ("label", labels, self.meta["label_bound"]),
            ):
                if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= bound):
                    problem = f"a {name} id is outside [0, {bound})"
        if problem is not None:
            raise ValueError(
                f"{self.directory}: damaged encoded-user store: user {user}: {problem} "
                "(delete the directory to rebuild it)"
            )

    def __getstate__(self) -> dict:
        return {"directory": self.directory}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["directory"])


# ----------------------------------------------------------------------------------- building
# (encode, multi_label, token dtype, label dtype) of the build in progress: set in the parent
# before forking workers
_WORKER: tuple[Encoder, bool, np.dtype, np.dtype] | None = None


def _encode_range(bounds: tuple[int, int]) -> dict[str, np.ndarray]:
    """Encode users ``[start, stop)`` into concatenated arrays (runs in a worker or inline)."""
    if _WORKER is None:
        raise RuntimeError("no encoded-user build in progress")
    encode, multi_label, token_dtype, label_dtype = _WORKER
    users, lengths, tokens, labels, label_lengths = [], [], [], [], []
    for u in range(*bounds):
        words, labs = encode(u)
        if len(labs) != len(words):
            raise ValueError(f"user {u}: {len(words)} examples but {len(labs)} labels")
        users.append(len(words))
        lengths.extend(len(w) for w in words)
        for w in words:
            tokens.extend(w)
        if multi_label:
            label_lengths.extend(len(t) for t in labs)
            for t in labs:
                labels.extend(t)
        else:
            labels.extend(labs)
    return {
        "users": np.asarray(users, dtype=np.int64),
        "lengths": np.asarray(lengths, dtype=np.int32),
        "tokens": np.asarray(tokens, dtype=token_dtype),
        "labels": np.asarray(labels, dtype=label_dtype),
        "label_lengths": np.asarray(label_lengths, dtype=np.int32),
    }


def _pieces(num_users: int, workers: int) -> Iterator[dict[str, np.ndarray]]:
    """Encoded pieces of all users in order (``workers`` forked processes when > 1)."""
    step = max(1, min(2048, -(-num_users // max(1, 4 * workers))))
    ranges = [(s, min(s + step, num_users)) for s in range(0, num_users, step)]
    if workers <= 1 or len(ranges) <= 1 or sys.platform != "linux":
        yield from map(_encode_range, ranges)
        return
    # the ending signals stay blocked from the fork until each worker has set their actions
    # (see _worker_signals); the parent unblocks them as soon as the workers exist
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, ENDING_SIGNALS)
    try:
        pool = multiprocessing.get_context("fork").Pool(
            workers, initializer=_worker_signals, initargs=(os.getpid(),)
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    with pool:
        yield from pool.imap(_encode_range, ranges)


def _worker_signals(parent: int) -> None:
    """Pool initializer: SIGTERM ends a worker again, SIGINT and SIGHUP are left to the parent.

    A forked worker inherits the parent's Python signal handlers. One that does not end the
    process (Flower's graceful-exit handler stays installed after an in-process simulation)
    made the pool's ``terminate()`` wait forever for a worker blocked on the task queue. The
    worker dies with its parent ``parent`` (:func:`~fedprivopt.core.orphans.die_with_parent`).
    Twenty-eighth review of issue 15: SIGHUP (a closed terminal signals the process group)
    during a first token-store build ran the parent's handler in every worker, each printing
    an ``Interrupted`` traceback (28 lines) before the command's one line.
    """
    die_with_parent(parent)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, ENDING_SIGNALS)


def _ptr(lengths: list[np.ndarray]) -> np.ndarray:
    out = np.zeros(sum(int(x.size) for x in lengths) + 1, dtype=np.int64)
    if out.size > 1:
        np.cumsum(np.concatenate(lengths), dtype=np.int64, out=out[1:])
    return out


def _save(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as handle:
        np.save(handle, array, allow_pickle=False)
        handle.flush()
        os.fsync(handle.fileno())


def _save_streamed(path: Path, raw: Path, dtype: np.dtype, count: int) -> None:
    """Write ``raw`` (``count`` values of ``dtype``, appended piece by piece) as a ``.npy``."""
    with open(path, "wb") as handle, open(raw, "rb") as source:
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False}
        np.lib.format.write_array_header_1_0(handle, {**header, "shape": (count,)})
        shutil.copyfileobj(source, handle, 16 * 1024 * 1024)
        handle.flush()
        os.fsync(handle.fileno())
    raw.unlink()


def _build(
    target: Path,
    key: dict,
    num_users: int,
    encode: Encoder,
    *,
    multi_label: bool,
    token_bound: int,
    label_bound: int,
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> None:
    """Encode every user and write the store; the ids stream to disk (memory: the lengths)."""
    global _WORKER
    dtypes = {
        "tokens": _int_dtype(token_bound),
        "labels": _int_dtype(label_bound) if multi_label else np.dtype(np.int32),
    }
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    # under the store's lock (open_or_build) no other process builds this store: a partial
    # directory of this key is what a killed build left (twenty-second review of issue 15,
    # finding 3: each SIGKILL of a first run's build left its part, 42 MB of 80,000 users at
    # 20%, for ever, next to the store the next run built)
    _remove_partial_builds(target)
    tmp.mkdir(parents=True)
    lengths: dict[str, list[np.ndarray]] = {"users": [], "lengths": [], "label_lengths": []}
    counts = dict.fromkeys(dtypes, 0)
    _WORKER = (encode, multi_label, dtypes["tokens"], dtypes["labels"])
    try:
        with open(tmp / "tokens.raw", "wb") as tok, open(tmp / "labels.raw", "wb") as lab:
            done = 0
            for piece in _pieces(num_users, workers):
                for name in lengths:
                    lengths[name].append(piece[name])
                for name, handle in (("tokens", tok), ("labels", lab)):
                    handle.write(piece[name].tobytes())
                    counts[name] += int(piece[name].size)
                done += int(piece["users"].size)
                if progress is not None:
                    progress(done, num_users)
        _WORKER = None
        for name, dtype in dtypes.items():
            _save_streamed(tmp / f"{name}.npy", tmp / f"{name}.raw", dtype, counts[name])
        token_ptr = _ptr(lengths["lengths"])
        _save(tmp / "users.npy", _ptr(lengths["users"]))
        _save(tmp / "token_ptr.npy", token_ptr)
        if multi_label:
            _save(tmp / "label_ptr.npy", _ptr(lengths["label_lengths"]))
        meta = {
            "version": FORMAT_VERSION,
            "key": key,
            "multi_label": multi_label,
            "num_users": num_users,
            "num_examples": int(token_ptr.size - 1),
            "num_tokens": counts["tokens"],
            "num_labels": counts["labels"],
            "token_bound": int(token_bound),
            "label_bound": int(label_bound),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)  # a damaged store of the same key
        os.replace(tmp, target)
    finally:
        _WORKER = None
        shutil.rmtree(tmp, ignore_errors=True)


def _integer_ids(name: str, values: object, bound: int | None = None) -> np.ndarray:
    """``values`` as a flat int64 array of integers (in ``[0, bound)`` when given).

    Twenty-fifth review of issue 15, finding 15: ``EncodedUsers.example_counts([1.5])`` and
    ``gather``'s picks went through ``np.asarray(..., dtype=int64)`` (1.5 read user 1, a pick
    of 0.7 example 0) and ``user(1.5)`` raised numpy's ``IndexError`` (now
    :func:`~fedprivopt.core.local.check_user_id`).
    """
    array = np.asarray(values).reshape(-1)
    if array.size and (array.dtype == np.bool_ or array.dtype.kind not in "iu"):
        raise ValueError(f"{name} must be integers, got {shown(values)}")
    array = array.astype(np.int64, copy=False)
    if bound is not None and array.size and (array.min() < 0 or array.max() >= bound):
        raise ValueError(f"{name} must be in [0, {bound}), got {shown(values)}")
    return array


def open_or_build(
    root: str | os.PathLike,
    key: dict,
    num_users: int,
    encode: Encoder,
    *,
    multi_label: bool,
    token_bound: int,
    label_bound: int,
    workers: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> EncodedUsers:
    """Open the store of ``key`` under ``root``, building it first if absent or damaged.

    Parameters
    ----------
    root : str or os.PathLike
        Directory of stores (created if needed); not the root of the file system
        (``ValueError``).
    key : dict
        JSON-able description of the source and the encoding; stores are found by its digest.
    num_users : int
        Users ``0 .. num_users - 1`` are encoded with ``encode``.
    encode : callable
        ``encode(user) -> (words, labels)``: word-id lists per example, and tag-id lists per
        example (multi-label) or one label per example. Errors propagate (nothing is written).
    multi_label : bool
        Whether ``labels`` are lists.
    token_bound, label_bound : int
        Exclusive upper bounds of the ids (chooses int16 or int32 storage).
    workers : int
        Encoding processes (forked, Linux): ``0`` = all CPU cores, ``1`` = in this process.
    progress : callable, optional
        ``progress(done, total)`` after each encoded piece.
    """
    num_users = check_int("num_users", num_users, 0)
    refuse_filesystem_root(root, "a token store's root")  # thirty-first review of issue 15
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    target = root / cache_key_digest(key)
    workers = int(workers) or (os.cpu_count() or 1)
    # a store is renamed into place whole, so a valid one is read without the lock (thirty-first
    # review of issue 15, data: a store built beforehand on a read-only share, as
    # docs/SCALING.md advises, was refused: "<digest>.lock: Read-only file system")
    store = _current(target, key)
    if store is not None:
        return store
    with file_lock(root / f"{target.name}.lock"):
        store = _current(target, key)  # another process may have built it meanwhile
        if store is not None:
            return store
        _build(
            target, key, num_users, encode, multi_label=multi_label, token_bound=token_bound,
            label_bound=label_bound, workers=workers, progress=progress,
        )  # fmt: skip
        return EncodedUsers(target)


def _current(target: Path, key: dict) -> EncodedUsers | None:
    """The store at ``target`` if it is valid and built for ``key``, else ``None``."""
    if not target.is_dir():
        return None
    try:
        store = EncodedUsers(target)
    except ValueError:
        return None  # damaged: rebuilt under the lock
    return store if store.meta.get("key") == json.loads(json.dumps(key)) else None


def remove_stores(root: str | os.PathLike, file: dict | None = None) -> int:
    """Remove every store under ``root`` that no process is building; return how many.

    For the stores of files that were replaced (``fedprivopt data synth --overwrite`` of their
    data directory): a store's key holds its file's size and modification time, so it is never
    used again, and each kept tens of MB to GBs for ever (twenty-second review of issue 15). A
    store is removed under its key's lock, taken without waiting: one being built is left alone.
    A process still reading a removed store keeps its memory-mapped files until it closes them.
    With ``file`` (the replaced file's ``{"size": ..., "mtime_ns": ...}``, as a key holds it),
    only the stores built from that file are removed: thirty-first review of issue 15 (data),
    a ``.fedprivopt-cache`` linked to a directory that several datasets share lost the other
    datasets' stores too (``removed 2 token store(s) of the replaced files``).
    """
    from fedprivopt.data.locks import LockHeldError, exclusive_lock

    root = Path(root)
    if not root.is_dir():
        return 0
    removed = 0
    for meta in sorted(root.glob("*/meta.json")):
        store = meta.parent
        if store.is_symlink() or not _is_digest(store.name):
            continue
        if file is not None and _store_file(meta) != file:
            continue  # another file's store (a cache directory several datasets share)
        lock = root / f"{store.name}.lock"
        try:
            with exclusive_lock(lock, what=f"token store {store}"):
                shutil.rmtree(store, ignore_errors=True)
                _remove_partial_builds(store)
                lock.unlink(missing_ok=True)
        except LockHeldError:
            continue
        removed += 1
    return removed


def file_key(path: str | os.PathLike) -> dict:
    """The part of a store's key that names its source file: its size and modification time."""
    stat = Path(path).stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _store_file(meta: Path) -> object:
    """The ``"file"`` of the key in the store's ``meta.json`` (``None`` if unreadable)."""
    try:
        raw = read_at_most(meta, META_LIMIT) if meta.is_file() else None
        key = json.loads(raw.decode("utf-8"))["key"] if raw is not None else None
        return key.get("file") if isinstance(key, dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _is_digest(name: str) -> bool:
    return len(name) == _DIGEST_CHARS and all(c in "0123456789abcdef" for c in name)


def stderr_progress(label: str, total: int) -> Callable[[int, int], None]:
    """A ``progress(done, total)`` callback: a rich bar on a terminal, else a line per 10 %."""
    if sys.stderr.isatty():
        from fedprivopt.core.progress import stderr_bar

        bar, task = stderr_bar(label, total)

        def update(done: int, _total: int) -> None:
            bar.update(task, completed=done)
            if done >= _total:
                bar.stop()

        return update
    shown = [-1]

    def line(done: int, _total: int) -> None:
        tenth = (10 * done) // max(_total, 1)
        if tenth != shown[0]:
            shown[0] = tenth
            print(f"{label}: {done:,}/{_total:,} users", file=sys.stderr, flush=True)

    return line
