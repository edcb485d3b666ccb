"""Reading a built token store: :class:`EncodedUsers` (memory-mapped, checked as it is read).

The layout of the files is described in :mod:`fedprivopt.data.token_cache`, which finds, builds
(:mod:`fedprivopt.data.token_build`) and removes stores. A store whose files disagree with its
``meta.json``, or whose offsets or ids are out of range where a user is read, raises
``ValueError`` naming it as damaged.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedprivopt.core.files import read_at_most
from fedprivopt.core.local import check_user_id
from fedprivopt.core.text import shown

__all__ = ["FORMAT_VERSION", "META_LIMIT", "EncodedUsers"]

FORMAT_VERSION = 2
_ARRAYS = ("users", "token_ptr", "tokens", "labels")
META_LIMIT = 1 << 20
"""Bytes of a store's ``meta.json`` at most (it holds a few hundred); a larger one is damaged."""


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
        A store written by :func:`~fedprivopt.data.token_cache.open_or_build`.

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
        except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
            # EOFError: numpy's for an empty .npy (thirty-seventh review of issue 15, data: a
            # crash or a full disk while a store was copied left tokens.npy of 0 bytes, and
            # simulate ended in "EOFError: No data left in file"; now rebuilt as damaged)
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
