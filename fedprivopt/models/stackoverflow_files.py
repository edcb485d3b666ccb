"""What the StackOverflow tasks share: their data directory, synthetic generation and checks.

A task's ``data_dir`` holds ``stackoverflow.sqlite`` and the vocabulary files, real or synthetic.
:class:`StackOverflowFiles` finds them, generates a synthetic dataset there under a directory
lock when asked (several processes may build the task at once; all tasks take the same lock), and
refuses a synthetic dataset generated with other parameters than the task asks for. It also
checks user ids and keeps the tasks' per-user tensors in a least-recently-used cache.
"""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from fedprivopt.data.locks import file_lock
from fedprivopt.data.synthetic import SQLITE_FILE, SYNTHETIC_META_FILE, ensure_synthetic
from fedprivopt.data.vocab import TAG_COUNT_FILE, WORD_COUNT_FILE

__all__ = ["StackOverflowFiles"]

GENERATED_FILES = (SQLITE_FILE, WORD_COUNT_FILE, TAG_COUNT_FILE)


@contextlib.contextmanager
def _directory_lock(root: Path) -> Iterator[None]:
    """Exclusive lock on ``root/.stackoverflow.lock`` (POSIX; a no-op elsewhere).

    Several processes (Ray workers, SuperNodes) may build the task at once; only one of them
    generates the synthetic files, the others wait and then find them current.
    """
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / ".stackoverflow.lock"):
        yield


class StackOverflowFiles:
    """Data-directory handling of a StackOverflow task (a mixin).

    The task sets ``data_dir`` (Path), ``synthetic`` (bool), ``synth_config``
    (:class:`~fedprivopt.data.SyntheticConfig`), ``synth_params`` (the ``synth_*`` values the
    user gave, keyed by config field), ``num_users``, ``cache_users`` and ``_cache`` (an empty
    ``OrderedDict``); :attr:`REQUIRED_FILES` names the files the task reads.
    """

    REQUIRED_FILES: tuple[str, ...] = GENERATED_FILES
    data_dir: Path
    synthetic: bool
    num_users: int
    cache_users: int
    _cache: OrderedDict[int, tuple[torch.Tensor, torch.Tensor]]

    @property
    def sqlite_path(self) -> Path:
        """The ``stackoverflow.sqlite`` file."""
        return self.data_dir / SQLITE_FILE

    @property
    def word_count_path(self) -> Path:
        """The ``stackoverflow.word_count`` file (public statistics)."""
        return self.data_dir / WORD_COUNT_FILE

    def _missing(self, names: tuple[str, ...]) -> list[str]:
        return [n for n in names if not (self.data_dir / n).is_file()]

    def _ensure_files(self) -> None:
        """Generate the synthetic files if asked and none exist; raise if required ones lack."""
        required = self.REQUIRED_FILES
        if self.synthetic and self._missing(required):
            # Under the lock: another process may be writing the files right now.
            with _directory_lock(self.data_dir):
                # not generated meanwhile by another process, and never over existing files
                if len(self._missing(GENERATED_FILES)) == len(GENERATED_FILES):
                    ensure_synthetic(self.data_dir, self.synth_config)
        absent = self._missing(required)
        if absent:
            hint = (
                "some files are present, so no synthetic data is generated over them"
                if len(self._missing(GENERATED_FILES)) < len(GENERATED_FILES)
                else "pass synthetic=True to generate a synthetic dataset"
            )
            raise FileNotFoundError(
                f"{self.data_dir}: missing {', '.join(absent)} (decompress and index the TFF "
                f"download there; {hint})"
            )
        self._check_synthetic_meta()

    def _check_synthetic_meta(self) -> None:
        meta_path = self.data_dir / SYNTHETIC_META_FILE
        if not self.synth_params or not meta_path.is_file():
            return
        try:
            recorded = json.loads(meta_path.read_text(encoding="utf-8"))["config"]
        except (OSError, ValueError, KeyError, TypeError):
            return  # not a sidecar we understand: the files are used as they are
        names = {"num_clients": "synth_clients", "vocab_size": "synth_vocab"}
        names.update(num_tags="synth_tags", seed="synth_seed")
        for key, value in self.synth_params.items():
            if isinstance(recorded, dict) and key in recorded and recorded[key] != value:
                raise ValueError(
                    f"{names[key]}={value}, but {self.data_dir} holds a synthetic dataset "
                    f"generated with {key}={recorded[key]}; use another data_dir (files that "
                    "exist are never overwritten)"
                )

    def _check_user(self, user_id: int) -> int:
        if isinstance(user_id, bool) or not 0 <= int(user_id) < self.num_users:
            raise ValueError(f"user_id must be in [0, {self.num_users}), got {user_id!r}")
        return int(user_id)

    def _cached_user(
        self, user_id: int, read: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``read(user_id)`` (user id checked), kept among the ``cache_users`` most recent."""
        user_id = self._check_user(user_id)
        hit = self._cache.get(user_id)
        if hit is not None:
            self._cache.move_to_end(user_id)
            return hit
        out = read(user_id)
        if self.cache_users:
            self._cache[user_id] = out
            while len(self._cache) > self.cache_users:
                self._cache.popitem(last=False)
        return out
