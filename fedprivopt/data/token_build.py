"""Building a token store: every user encoded (in forked workers) and streamed to its files.

:func:`build_store` writes a store of :mod:`fedprivopt.data.token_cache`'s layout into a
temporary directory and renames it into place; :func:`~fedprivopt.data.token_cache.open_or_build`
calls it under the store's lock. :func:`remove_partial_builds` removes what a killed build left.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from fedprivopt.core.orphans import die_with_parent
from fedprivopt.data.ordered_workers import ENDING_SIGNALS
from fedprivopt.data.token_store import FORMAT_VERSION

__all__ = ["Encoder", "build_store", "remove_partial_builds"]

# encode(user) -> (word-id lists, label lists or single labels), as the task encodes a user
Encoder = Callable[[int], tuple[Sequence[Sequence[int]], Sequence]]


def remove_partial_builds(store: Path) -> None:
    """Remove the partial directories a killed build of ``store`` left (``<name>.tmp-<pid>``).

    Call it holding the store's lock: no other process then builds that store.
    """
    for partial in store.parent.glob(f"{store.name}.tmp-*"):
        shutil.rmtree(partial, ignore_errors=True)


def _int_dtype(bound: int) -> np.dtype:
    return np.dtype(np.int16) if bound < np.iinfo(np.int16).max else np.dtype(np.int32)


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


def build_store(
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
    remove_partial_builds(target)
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
