"""Rows of the synthetic StackOverflow files, one chunk of users at a time, in parallel.

:func:`draw_rows` turns one chunk's draws (:func:`~fedprivopt.data.synthetic_model.draw_chunk`)
into ``examples`` rows (serialized ``tf.train.Example`` protos), ``client_metadata`` rows and the
per-word and per-tag counts of distinct training users; :func:`chunk_rows` yields them for every
chunk in order, computed by worker processes. Each chunk has its own seed, so the output does not
depend on the number of workers. :mod:`fedprivopt.data.synthetic` writes the files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from fedprivopt.core.orphans import die_with_parent
from fedprivopt.data.ordered_workers import in_order
from fedprivopt.data.synthetic_model import (
    TRAIN,
    ChunkDraws,
    WordTagModel,
    build_model,
    draw_chunk,
)
from fedprivopt.data.tfexample_encode import bytes_entry, feature_entry, wrap_feature_entries

if TYPE_CHECKING:
    from fedprivopt.data.synthetic_config import SyntheticConfig

__all__ = ["CHUNK_USERS", "SPLITS", "chunk_rows", "default_workers", "draw_rows"]

CHUNK_USERS = 2048  # part of the output's definition: changing it changes the files
SPLITS = ("train", "heldout", "test")


def _serialize(draws: ChunkDraws, model: WordTagModel) -> Iterator[tuple[str, str, bytes]]:
    """Yield ``examples`` rows of a chunk by split, then client (chronological within)."""
    dates = np.datetime_as_string(draws.times.astype("datetime64[s]"), unit="s").tolist()
    post_blob = []  # a post's shared features, serialized once
    for i, (tag_row, n) in enumerate(zip(draws.tags.tolist(), draws.ntags.tolist(), strict=True)):
        tag_str = "|".join(model.tag_names[j] for j in tag_row[:n])
        post_blob.append(
            bytes_entry("creation_date", (dates[i].replace("T", " ") + " UTC").encode())
            + feature_entry("score", int(draws.score[i]))
            + bytes_entry("tags", tag_str.encode())
            + bytes_entry("title", draws.titles[i].encode())
        )
    types = [bytes_entry("type", s) for s in (b"answer", b"question")]
    ids = _client_ids(draws.users)
    order = np.lexsort((np.arange(len(draws.ex_user)), draws.ex_user, draws.ex_split))
    ex_post, ex_user = draws.ex_post.tolist(), draws.ex_user.tolist()
    ex_split, question = draws.ex_split.tolist(), draws.is_question.tolist()
    for e in order.tolist():
        p = ex_post[e]
        entries = (
            post_blob[p] + bytes_entry("tokens", draws.tokens[e].encode()) + types[question[p]]
        )
        yield SPLITS[ex_split[e]], ids[ex_user[e]], wrap_feature_entries(entries)


def _client_ids(users: np.ndarray) -> list[str]:
    return [f"{u:08d}" for u in users.tolist()]


def _metadata(draws: ChunkDraws) -> list[tuple[str, str, int]]:
    """``client_metadata`` rows of a chunk."""
    nu = len(draws.users)
    counts = np.bincount(draws.ex_split * nu + draws.ex_user, minlength=3 * nu).reshape(3, nu)
    ids = _client_ids(draws.users)
    return [
        (ids[u], SPLITS[s], int(counts[s, u]))
        for s in range(3)
        for u in np.flatnonzero(counts[s]).tolist()
    ]


def _train_user_counts(draws: ChunkDraws, config: SyntheticConfig) -> tuple[np.ndarray, np.ndarray]:
    """Distinct training users per word (in ``tokens``) and per tag."""
    v, t = config.vocab_size, config.num_tags
    tok_user = np.repeat(draws.ex_user, draws.ex_len)
    tok_train = np.repeat(draws.ex_split == TRAIN, draws.ex_len)
    pairs = np.unique(tok_user[tok_train] * v + draws.tok_words[tok_train])
    word_users = np.bincount(pairs % v, minlength=v)
    posts = np.flatnonzero(draws.post_split == TRAIN)
    tags = draws.tags[posts]
    pairs = np.unique((draws.post_user[posts][:, None] * t + tags)[tags >= 0])
    return word_users, np.bincount(pairs % t, minlength=t)


def draw_rows(
    config: SyntheticConfig, model: WordTagModel, index: int, seed: np.random.SeedSequence
) -> tuple[list[tuple[str, str, bytes]], list[tuple[str, str, int]], np.ndarray, np.ndarray]:
    """Rows, ``client_metadata`` rows and training-user counts of chunk ``index``."""
    users = np.arange(index * CHUNK_USERS, min((index + 1) * CHUNK_USERS, config.num_clients))
    draws = draw_chunk(config, model, users, np.random.default_rng(seed))
    return list(_serialize(draws, model)), _metadata(draws), *_train_user_counts(draws, config)


_WORKER: dict[str, object] = {}


def _worker_init(config: SyntheticConfig, model_seed: np.random.SeedSequence, parent: int) -> None:
    die_with_parent(parent)  # a killed data synth left its workers blocked for ever
    # each worker rebuilds the (deterministic) word/tag model instead of receiving it pickled
    _WORKER["config"] = config
    _WORKER["model"] = build_model(config, np.random.default_rng(model_seed))


def _worker_chunk(index: int, seed: np.random.SeedSequence):
    return draw_rows(_WORKER["config"], _WORKER["model"], index, seed)  # type: ignore[arg-type]


def chunk_rows(
    config: SyntheticConfig,
    model: WordTagModel,
    model_seed: np.random.SeedSequence,
    chunk_seeds: list[np.random.SeedSequence],
    workers: int,
) -> Iterator[
    tuple[list[tuple[str, str, bytes]], list[tuple[str, str, int]], np.ndarray, np.ndarray]
]:
    """Yield :func:`draw_rows` of every chunk in order, computed by ``workers`` processes.

    At most ``workers + 1`` chunks are in flight, so memory stays bounded; the output does not
    depend on ``workers`` (each chunk has its own seed and they are consumed in order). The
    workers are :mod:`fedprivopt.data.ordered_workers`' (killed at once when the caller is
    interrupted).
    """
    import multiprocessing

    # a daemonic process (a multiprocessing.Pool worker, e.g. a sweep's) may not have children
    if workers <= 1 or len(chunk_seeds) <= 1 or multiprocessing.current_process().daemon:
        for i, seed in enumerate(chunk_seeds):
            yield draw_rows(config, model, i, seed)
        return
    jobs = list(enumerate(chunk_seeds))
    yield from in_order(
        _worker_chunk, jobs, workers, _worker_init, (config, model_seed, os.getpid())
    )


def default_workers() -> int:
    """Worker processes :func:`generate` uses by default: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
