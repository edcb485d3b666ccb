"""Reader and writer for the legacy TFF StackOverflow HDF5 files (needs ``h5py``).

Before the SQLite file, TFF published ``stackoverflow_train.h5``, ``stackoverflow_held_out.h5``
and ``stackoverflow_test.h5``, one split per file, laid out as::

    /examples/<client_id>/<feature>

with one 1-D dataset per feature of :data:`~fedprivopt.data.stackoverflow.FEATURES`, all of the
client's length: byte strings (variable or fixed length) for the text features, integers for
``score``. :class:`HDF5Split` keeps the file open read-only and reads a client's datasets when
asked.

References
----------
.. [1] TensorFlow Federated, ``tff.simulation.datasets.HDF5ClientData``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedprivopt.data.stackoverflow import FEATURES, ClientSplit, StackOverflowExample

__all__ = ["HDF5_FILES", "HDF5Split", "open_hdf5", "write_hdf5"]

#: File name of each split in the legacy release.
HDF5_FILES = {
    "train": "stackoverflow_train.h5",
    "heldout": "stackoverflow_held_out.h5",
    "test": "stackoverflow_test.h5",
}


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("reading StackOverflow HDF5 files needs h5py: pip install h5py") from exc
    return h5py


def _split_from_name(path: Path) -> str:
    for split, name in HDF5_FILES.items():
        if path.name == name:
            return split
    return path.stem


def _text(value: object) -> str:
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8")
    if isinstance(value, str):
        return value
    raise ValueError(f"holds a {type(value).__name__}, expected a string")


class HDF5Split(ClientSplit):
    """Lazy per-client access to one legacy StackOverflow HDF5 file.

    Parameters
    ----------
    path : str or os.PathLike
        A ``stackoverflow_<split>.h5`` file.
    split : str, optional
        Split name; by default inferred from the file name (``held_out`` reads as
        ``'heldout'``).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If it is not an HDF5 file or has no ``/examples`` group; later, when a client's data
        cannot be read (a damaged file: h5py's errors become ``ValueError`` naming the file).
    """

    def __init__(self, path: str | os.PathLike, split: str | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such file")
        self.split = split if split is not None else _split_from_name(self.path)
        self._file: Any = None
        self._pid = -1
        group = self._examples()
        with self._reading("the client list"):
            self._client_ids = sorted(group.keys())

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """Turn the errors h5py raises on a damaged file into a ``ValueError`` naming it."""
        try:
            yield
        except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{self.path}: cannot read {what} (damaged HDF5 file?): {exc}"
            ) from exc

    def _examples(self) -> Any:
        h5py = _h5py()
        if self._file is None or self._pid != os.getpid():
            try:
                self._file = h5py.File(self.path, "r")
            except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{self.path}: not a readable HDF5 file: {exc}") from exc
            self._pid = os.getpid()
        with self._reading("'/examples'"):
            group = self._file.get("examples")
            is_group = isinstance(group, h5py.Group)
        if not is_group:
            raise ValueError(f"{self.path}: no '/examples' group; not a StackOverflow HDF5 file")
        return group

    def _client(self, client_id: str) -> Any:
        examples = self._examples()
        with self._reading(f"client {client_id!r}"):
            group = examples.get(client_id)
            is_group = isinstance(group, _h5py().Group)
        if group is None and client_id in self._client_ids:
            raise ValueError(f"{self.path}: client {client_id!r} is listed but cannot be opened")
        if group is None:
            raise KeyError(f"client {client_id!r} is not in split {self.split!r}")
        if not is_group:
            raise ValueError(f"{self.path}: /examples/{client_id} is not a group of features")
        return group

    @property
    def client_ids(self) -> Sequence[str]:
        """Client ids of the split, sorted."""
        return self._client_ids

    def num_examples(self, client_id: str) -> int:
        """Return the number of examples of ``client_id`` (its ``tokens`` length)."""
        group = self._client(client_id)
        with self._reading(f"client {client_id!r}"):
            tokens = group.get("tokens")
            size = getattr(tokens, "size", None)  # a Dataset's; a scalar one holds one value
        if size is None:
            raise ValueError(f"{self.path}: client {client_id!r} has no 'tokens' dataset")
        return int(size)

    def client_examples(self, client_id: str) -> list[StackOverflowExample]:
        """Return the decoded examples of ``client_id``, in file order."""
        group = self._client(client_id)
        columns: dict[str, np.ndarray] = {}
        with self._reading(f"client {client_id!r}"):
            found = sorted(group.keys())
            for name in FEATURES:
                if name in found:
                    columns[name] = np.asarray(group[name][()]).reshape(-1)
        for name in FEATURES:
            if name not in columns:
                raise ValueError(
                    f"{self.path}: client {client_id!r} lacks feature {name!r} (found {found})"
                )
        lengths = {name: len(col) for name, col in columns.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(
                f"{self.path}: client {client_id!r} has features of unequal lengths {lengths}"
            )
        if columns["score"].dtype.kind not in "iu":
            raise ValueError(
                f"{self.path}: client {client_id!r}: 'score' has dtype "
                f"{columns['score'].dtype}, expected integers"
            )
        text: dict[str, list[str]] = {}
        for name in FEATURES:
            if name == "score":
                continue
            if columns[name].dtype.kind not in "SUO":
                raise ValueError(
                    f"{self.path}: client {client_id!r}: {name!r} has dtype "
                    f"{columns[name].dtype}, expected strings"
                )
            try:
                text[name] = [_text(v) for v in columns[name]]
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{self.path}: client {client_id!r}: invalid UTF-8: {exc}"
                ) from exc
            except ValueError as exc:
                raise ValueError(f"{self.path}: client {client_id!r}: {name!r} {exc}") from None
        scores = columns["score"].astype(np.int64).tolist()
        return [
            StackOverflowExample(
                tokens=text["tokens"][i],
                title=text["title"][i],
                tags=text["tags"][i],
                creation_date=text["creation_date"][i],
                score=scores[i],
                type=text["type"][i],
            )
            for i in range(len(scores))
        ]

    def close(self) -> None:
        """Close this process's file handle (it reopens on next use)."""
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_file"] = None
        state["_pid"] = -1
        return state


def open_hdf5(path: str | os.PathLike, split: str = "train") -> HDF5Split:
    """Open a legacy HDF5 split: a ``.h5`` file, or a directory holding the release files."""
    p = Path(path)
    if p.is_dir():
        if split not in HDF5_FILES:
            raise ValueError(f"split must be one of {sorted(HDF5_FILES)}, got {split!r}")
        p = p / HDF5_FILES[split]
    return HDF5Split(p, split)


def write_hdf5(
    path: str | os.PathLike,
    clients: Mapping[str, Sequence[StackOverflowExample]],
    *,
    overwrite: bool = False,
) -> Path:
    """Write clients' examples in the legacy layout (variable-length byte strings, int64 score).

    Parameters
    ----------
    path : str or os.PathLike
        Output ``.h5`` file.
    clients : mapping of client id to a sequence of StackOverflowExample
        The split's data.
    overwrite : bool, default False
        Replace an existing file; otherwise raise ``FileExistsError``.

    Returns
    -------
    pathlib.Path
        The written file.
    """
    h5py = _h5py()
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path}: exists (pass overwrite=True to replace it)")
    vlen = h5py.special_dtype(vlen=bytes)
    with h5py.File(path, "w") as f:
        root = f.create_group("examples")
        for client_id, examples in clients.items():
            group = root.create_group(client_id)
            for name in FEATURES:
                values = [getattr(e, name) for e in examples]
                if name == "score":
                    group.create_dataset(name, data=np.asarray(values, dtype=np.int64))
                else:
                    data = np.array([v.encode("utf-8") for v in values], dtype=object)
                    group.create_dataset(name, data=data, dtype=vlen)
    return path
