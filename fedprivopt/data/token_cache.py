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
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from fedprivopt.core.checks import check_int
from fedprivopt.core.files import read_at_most
from fedprivopt.data.locks import file_lock, refuse_filesystem_root
from fedprivopt.data.token_build import Encoder, build_store, remove_partial_builds
from fedprivopt.data.token_store import META_LIMIT, EncodedUsers

# EncodedUsers is defined in token_store; this module is its documented public path (and where
# open_or_build looks it up).
__all__ = [
    "CACHE_DIR",
    "EncodedUsers",
    "cache_key_digest",
    "file_key",
    "open_or_build",
    "remove_stores",
    "stderr_progress",
]

#: Where a data directory's stores live by default (``<data-dir>/.fedprivopt-cache``).
CACHE_DIR = ".fedprivopt-cache"


def cache_key_digest(key: dict) -> str:
    """The directory name of the store built for ``key`` (a digest of its canonical JSON)."""
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:_DIGEST_CHARS]


_DIGEST_CHARS = 20
"""Hex characters of a store's directory name (:func:`cache_key_digest`)."""


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
        build_store(
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
                remove_partial_builds(store)
                lock.unlink(missing_ok=True)
        except LockHeldError:
            continue
        removed += 1
    _remove_dead_partials(root)
    return removed


def _remove_dead_partials(root: Path) -> None:
    """Remove the partial builds (``<digest>.tmp-<pid>``) under ``root`` that no process makes.

    Forty-seventh review of issue 15 (processes 1): a build killed (SIGKILL, the out-of-memory
    killer) before its store existed left its part, and only a later build of the same key
    removed it (:func:`~fedprivopt.data.token_build.remove_partial_builds`); a replaced file's
    key is never built again, so ``data synth --overwrite`` kept the part (and its lock file)
    for ever. A part whose key's lock is free is dead: no build holds it. One being built is
    left alone. This cleanup never fails the command: a part whose lock cannot be taken (held,
    or a file system that keeps no locks) stays.
    """
    from fedprivopt.data.locks import exclusive_lock

    digests = {p.name.split(".tmp-", 1)[0] for p in root.glob("*.tmp-*")}
    for digest in sorted(d for d in digests if _is_digest(d)):
        store = root / digest
        if store.is_dir() or store.is_symlink():
            continue  # a store of another file, kept; its next build removes the part
        lock = root / f"{digest}.lock"
        try:
            with exclusive_lock(lock, what=f"token store {store}"):
                remove_partial_builds(store)
                lock.unlink(missing_ok=True)
        except (OSError, ValueError):  # held (LockHeldError), or not lockable here
            continue


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
