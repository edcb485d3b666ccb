"""Reader and writer for the legacy TFF StackOverflow HDF5 files (needs ``h5py``).

Before the SQLite file, TFF published ``stackoverflow_train.h5``, ``stackoverflow_held_out.h5``
and ``stackoverflow_test.h5``, one split per file, laid out as::

    /examples/<client_id>/<feature>

with one 1-D dataset per feature of :data:`~fedprivopt.data.stackoverflow.FEATURES`, all of the
client's length: byte strings (variable or fixed length) for the text features, integers for
``score``. :class:`HDF5Split` keeps the file open read-only and reads a client's datasets when
asked.

Damaged files: HDF5 (2.0.0) loops forever, allocates gigabytes or crashes on some damaged
variable-length string data, in C where no signal handler reaches it. Before h5py reads a
variable-length string dataset, its heap references and the heap collections they point to are
checked against the file's bytes (:class:`_HeapChecker`), or, for layouts whose references are
not in one place, the dataset is read once in a forked child with a timeout; a damaged file
raises ``ValueError`` naming it (``docs/RELIABILITY.md``, section 1).

References
----------
.. [1] TensorFlow Federated, ``tff.simulation.datasets.HDF5ClientData``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedprivopt.core.text import shown
from fedprivopt.data.stackoverflow import FEATURES, ClientSplit, StackOverflowExample

__all__ = ["HDF5_FILES", "HDF5Split", "is_hdf5_file", "open_hdf5", "write_hdf5"]

#: File name of each split in the legacy release.
HDF5_FILES = {
    "train": "stackoverflow_train.h5",
    "heldout": "stackoverflow_held_out.h5",
    "test": "stackoverflow_test.h5",
}


#: The signature an HDF5 file starts with (its superblock; at 0 unless it has a user block).
_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def is_hdf5_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a legacy split by name (``.h5``/``.hdf5``, any case) or by content.

    Thirty-fifth review of issue 15 (data): ``data info STACKOVERFLOW_TRAIN.H5`` and a second
    download ``stackoverflow_train.h5.1`` (as wget names it) were read as SQLite files (``not
    an SQLite database (bad or missing header)``), and ``open_split`` refused the second
    (``unrecognized format``). A file that cannot be read is no HDF5 file here: its reader
    names the error.
    """
    p = Path(path)
    if p.name.lower().endswith((".h5", ".hdf5")):
        return True
    try:
        with open(p, "rb") as handle:
            return handle.read(len(_SIGNATURE)) == _SIGNATURE
    except OSError:
        return False


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("reading StackOverflow HDF5 files needs h5py: pip install h5py") from exc
    return h5py


#: File-format bounds of :func:`write_hdf5`: the oldest layout (readable by every HDF5 1.8+),
#: fixed so that a newer library does not change the bytes written.
_LIBVER = ("earliest", "v110")


def _untimed(create: Any) -> dict[str, bool]:
    """``track_times=False`` if ``create`` accepts it (older h5py cannot untime groups)."""
    try:
        accepts = "track_times" in inspect.signature(create).parameters
    except (TypeError, ValueError):  # pragma: no cover - a C function without a signature
        accepts = False
    return {"track_times": False} if accepts else {}


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


class _DamagedHDF5(ValueError):
    """A damaged file found by this module's own checks (its message already names the file)."""


#: Largest ratio of a dataset's values (in bytes) to the file size that a valid file can have:
#: deflate, HDF5's standard compression, cannot compress by more than about 1032:1.
_MAX_EXPANSION = 1032

#: Virtual datasets a feature may be mapped through (one mapping another's values).
_VIRTUAL_DEPTH = 8

#: Bytes of one chunk that any file may use (h5py's own chunks are at most about 1 MiB).
_CHUNK_FLOOR = 1 << 24

#: Seconds a forked child may take to read a variable-length dataset whose heap references
#: cannot be checked from the file bytes (compact or chunked layouts).
PROBE_TIMEOUT_S = 10.0


class _HeapChecker:
    """Check variable-length heap references from the file's bytes before HDF5 follows them.

    A variable-length string is stored as a reference (length, collection address, object
    index) to an object in a *global heap collection* (``GCOL``). HDF5 2.0 parses a collection
    in a loop that never advances when an object header reads index 0 with size 0 (two flipped
    bytes, or a zeroed run, hang it at full CPU), and it allocates a string's claimed length
    (up to 4 GiB) before comparing it with the object. This class repeats HDF5's parse with
    the missing bounds and compares every reference with its object, so a damaged file raises
    ``ValueError`` instead. Collections are parsed once per file and cached.

    Parameters
    ----------
    path : pathlib.Path
        The file, named in errors.
    h5file : h5py.File
        Its open handle (for the address and length sizes and the base address).

    References
    ----------
    .. [1] The HDF Group, *HDF5 File Format Specification Version 3.0*, section III.E
       "Global Heap" and section IV.A.2.d "Datatype message" (variable-length data).
    """

    def __init__(self, path: Path, h5file: Any) -> None:
        plist = h5file.id.get_create_plist()
        self.path = path
        self.addr_size, self.len_size = plist.get_sizes()
        self.base = plist.get_userblock()
        self.file_size = path.stat().st_size
        self._objects: dict[int, np.ndarray] = {}
        self._virtual: list[str] = []  # the virtual sources being checked, outermost first
        self._f = open(path, "rb")  # closed by close(), with the h5py handle

    def close(self) -> None:
        """Close the checker's own handle on the file."""
        self._f.close()

    def check(self, dataset: Any, what: str) -> None:
        """Raise ``ValueError`` if reading ``dataset`` could hang, exhaust memory or invent data."""
        if dataset.is_virtual:
            self._check_sources(dataset, what)
        n = int(dataset.size)
        if n * dataset.dtype.itemsize > _MAX_EXPANSION * self.file_size:
            raise _DamagedHDF5(
                f"{self.path}: {what} claims {n} values of {dataset.dtype.itemsize} bytes, "
                f"more than a {self.file_size}-byte file can hold (damaged HDF5 file?)"
            )
        # thirty-eighth review of issue 15 (input 3): HDF5 reads a filtered chunk whole, so a
        # 1-value 'score' in chunks of 10**8 values (scale-offset and gzip: a 26 kB file) took
        # 836 MB and 6 s, and chunks reach 4 GiB; a chunk is held to the bound of the values
        self._check_chunks(dataset, what, self.file_size)
        if dataset.external:
            self._check_external(dataset, what)
        tid = dataset.id.get_type()
        h5t = _h5py().h5t
        if isinstance(tid, h5t.TypeVlenID):
            # not text; and a damaged string type (a flipped bit in its datatype message)
            # reads as a sequence whose conversion crashes HDF5
            raise _DamagedHDF5(
                f"{self.path}: {what} holds variable-length sequences, expected strings or "
                "integers (damaged HDF5 file?)"
            )
        if n == 0 or not (isinstance(tid, h5t.TypeStringID) and tid.is_variable_str()):
            return
        offset = dataset.id.get_offset()  # the file offset of contiguous data, else None
        if offset is None or self.addr_size not in (2, 4, 8):
            _probe_in_child(dataset, f"{self.path}: {what}")
            return
        ref = np.dtype([("length", "<u4"), ("addr", f"<u{self.addr_size}"), ("index", "<u4")])
        self._f.seek(offset)
        raw = self._f.read(n * ref.itemsize)
        if len(raw) < n * ref.itemsize:
            raise _DamagedHDF5(f"{self.path}: {what}: string references run past the end")
        refs = np.frombuffer(raw, dtype=ref)
        refs = refs[refs["length"] > 0]  # empty or null strings: HDF5 reads no heap object
        addrs = refs["addr"]
        one = len(addrs) == 0 or bool((addrs == addrs[0]).all())
        for addr in addrs[:1].tolist() if one else np.unique(addrs).tolist():
            sizes = self._collection(addr, what)
            these = refs if one else refs[addrs == addr]
            index = np.minimum(these["index"], len(sizes) - 1)
            bad = (these["index"] >= len(sizes)) | (sizes[index] != these["length"])
            if bad.any():
                length, index = these["length"][bad][0], these["index"][bad][0]
                size = sizes[index] if index < len(sizes) and sizes[index] >= 0 else "no"
                raise _DamagedHDF5(
                    f"{self.path}: {what}: a string of length {length} refers to heap "
                    f"object {index} at {addr} of {size} bytes (damaged HDF5 file?)"
                )

    def _check_external(self, dataset: Any, what: str) -> None:
        """Refuse external storage shorter than the values read from it.

        Follow-up of the thirty-eighth review of issue 15: HDF5 reads zeros where an external
        raw data file ends early, so a score of two values kept in an 8-byte file read as
        ``[7, 0]``, silently (a missing file is an error of HDF5's own). HDF5 opens a relative
        name from the working directory unless ``HDF5_EXTFILE_PREFIX`` says otherwise.
        """
        if os.environ.get("HDF5_EXTFILE_PREFIX"):
            return
        left = dataset.nbytes
        for name, offset, size in dataset.external:
            if left <= 0:
                break
            file = Path(os.fsdecode(name))
            take = min(left, size)
            left -= take
            with contextlib.suppress(OSError):  # missing or unreadable: HDF5 says so itself
                have = file.stat().st_size - offset
                if have < take:
                    raise _DamagedHDF5(
                        f"{self.path}: {what} is stored in the external file "
                        f"{shown(os.fsdecode(name))}, which holds {max(have, 0):,} of the "
                        f"{take:,} bytes read from offset {offset:,}, so HDF5 would read zeros "
                        "in place of its data (damaged or incomplete copy?)"
                    )

    def _check_chunks(self, dataset: Any, what: str, file_size: int) -> None:
        """Refuse chunks of ``dataset`` (in a file of ``file_size`` bytes) beyond its bound."""
        chunk = int(np.prod(dataset.chunks or (0,))) * dataset.dtype.itemsize
        if chunk > max(_MAX_EXPANSION * file_size, _CHUNK_FLOOR, dataset.nbytes):
            raise _DamagedHDF5(
                f"{self.path}: {what} is stored in chunks of {chunk:,} bytes (shape "
                f"{dataset.chunks}), which reading one value allocates: more than a "
                f"{file_size}-byte file can hold (damaged HDF5 file?)"
            )

    def _check_sources(self, dataset: Any, what: str, base: Path | None = None) -> None:
        """Refuse a virtual dataset whose source HDF5 would replace by fill values.

        Thirty-eighth review of issue 15 (input 4): HDF5 reads the fill value where a virtual
        dataset's source file is missing, so a legacy split whose ``score`` (or text) mapped a
        file that had not been copied along read as every score 0 (every text empty), silently.
        Its follow-up: a source file that is there without the source dataset (or with fewer
        values than mapped) read the same way; an absolute source name that is gone but whose
        file lies beside this one (both moved together) is found by HDF5, and read; a source
        that is itself virtual is checked the same way (``base``: the file whose directory its
        relative names start from), to :data:`_VIRTUAL_DEPTH` levels.
        """
        base = base or self.path
        if len(self._virtual) >= _VIRTUAL_DEPTH:
            raise _DamagedHDF5(
                f"{self.path}: {what} is a virtual dataset mapped through more than "
                f"{_VIRTUAL_DEPTH} virtual datasets ({' -> '.join(self._virtual)}; a cycle?)"
            )
        for source in dataset.virtual_sources():
            name = source.file_name
            if "%" in name or os.environ.get("HDF5_VDS_PREFIX"):
                continue  # a name pattern; a prefix of the user's: HDF5 finds them
            held = self._source_dataset(dataset, source, what, base)
            via = f" (through {' -> '.join(self._virtual)})" if self._virtual else ""
            if held is None:
                raise _DamagedHDF5(
                    f"{self.path}: {what} is a virtual dataset whose source file "
                    f"{shown(name)}{via} does not exist, so HDF5 would read fill values in place "
                    "of its data (put "
                    "the file back beside it, or write the data into the file)"
                )
            if isinstance(held, str):
                raise _DamagedHDF5(
                    f"{self.path}: {what} is a virtual dataset whose source {held}{via}, so HDF5 "
                    "would read fill values in place of its data (damaged or incomplete copy?)"
                )

    def _source_dataset(
        self, dataset: Any, source: Any, what: str, base: Path
    ) -> str | bool | None:
        """Look up a virtual source as HDF5 does: ``None`` no file, a str what is wrong.

        HDF5 tries an absolute name, then the name (an absolute one's last part) beside the
        virtual dataset's file, then in the working directory; a file it cannot open is
        passed over. Returns ``True`` when the source holds the values mapped.
        """
        h5py = _h5py()
        name, dset = source.file_name, source.dset_name
        if name == ".":
            files = [dataset.file]
        else:
            rel = Path(name).name if Path(name).is_absolute() else name
            tries = [Path(name)] if Path(name).is_absolute() else []
            tries += [base.parent / rel, Path(rel)]
            files = [p for p in tries if p.is_file()]
        for candidate in files:
            try:
                h5 = candidate if name == "." else h5py.File(candidate, "r")
            except (OSError, ValueError):
                continue
            try:
                shown_file = shown(base.name if name == "." else name)
                obj = h5.get(dset)
                if not isinstance(obj, h5py.Dataset):
                    return f"file {shown_file} has no dataset {shown(dset)}"
                # follow-up: a source's filtered chunk is decoded whole as a feature's is
                # (one score mapped from chunks of 10**8 values: 831 MB); held to the bound
                size = (base if name == "." else candidate).stat().st_size
                self._check_chunks(obj, f"{what} (source {shown(dset)} in {shown_file})", size)
                if obj.is_virtual:  # follow-up: a source mapping a missing file read as 0s
                    self._virtual.append(f"{shown_file}:{dset}")
                    try:
                        self._check_sources(obj, what, base if name == "." else candidate)
                    finally:
                        self._virtual.pop()
                space = source.src_space
                if space.get_select_type() == h5py.h5s.SEL_ALL:  # as many values as mapped
                    short = obj.size < source.vspace.get_select_npoints()
                else:
                    ends = space.get_select_bounds()[1]
                    short = len(ends) != obj.ndim or any(
                        e >= n for e, n in zip(ends, obj.shape, strict=True)
                    )
                if short:
                    return (
                        f"dataset {shown(dset)} in {shown_file} holds {obj.size} values "
                        f"(shape {obj.shape}), fewer than it is mapped to read"
                    )
                return True
            finally:
                if name != ".":
                    h5.close()
        return f"file {shown(name)} is not an HDF5 file HDF5 can open" if files else None

    def _collection(self, addr: int, what: str) -> np.ndarray:
        """Parse the collection at ``addr`` like HDF5 does, with bounds: sizes by index.

        Returns an ``int64`` array whose entry ``i`` is the size of object ``i`` (-1: none).
        """
        if addr in self._objects:
            return self._objects[addr]
        bad = f"{self.path}: {what}: damaged global heap collection at {addr}"
        header = 8 + self.len_size
        start = self.base + addr
        self._f.seek(start)
        head = self._f.read(header)
        if len(head) < header or head[:4] != b"GCOL" or head[4] != 1:
            raise _DamagedHDF5(f"{bad} (no 'GCOL' version 1 signature)")
        size = int.from_bytes(head[8:], "little")
        if not header <= size <= self.file_size - start:
            raise _DamagedHDF5(f"{bad} (claims {size} bytes)")
        chunk = head + self._f.read(size - header)
        obj_header = 8 + self.len_size
        objects: dict[int, int] = {}
        p = header
        while p < size:
            if p + obj_header > size:  # too small for an object header: free space
                break
            index = int.from_bytes(chunk[p : p + 2], "little")
            obj_size = int.from_bytes(chunk[p + 8 : p + obj_header], "little")
            # HDF5's step: a free-space object (index 0) spans its size, header included;
            # an object its header plus its size rounded up to 8 bytes
            step = obj_size if index == 0 else obj_header + -(-obj_size // 8) * 8
            if step == 0 or p + step > size:  # 0: HDF5 would loop on this header forever
                raise _DamagedHDF5(f"{bad} (object {index} of {obj_size} bytes at {p})")
            if index > 0:
                objects[index] = obj_size
            p += step
        sizes = np.full(max(objects, default=0) + 1, -1, dtype=np.int64)
        sizes[list(objects)] = list(objects.values())
        self._objects[addr] = sizes
        return sizes


def _probe_in_child(dataset: Any, what: str, timeout: float | None = None) -> None:
    """Read ``dataset`` once in a forked child; raise ``ValueError`` if it hangs or crashes.

    For variable-length data whose references :class:`_HeapChecker` cannot read from the file
    (compact or chunked layouts). Costs a fork and a second read of the dataset; the child is
    killed by its PID after ``timeout`` (default :data:`PROBE_TIMEOUT_S`) seconds. Errors the
    child meets are left to the in-process read that follows. Without ``os.fork`` (Windows)
    it does nothing.
    """
    if not hasattr(os, "fork"):  # pragma: no cover - platform dependent
        return
    timeout = PROBE_TIMEOUT_S if timeout is None else timeout
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            dataset[()]
        finally:
            os._exit(0)
    deadline = time.monotonic() + timeout
    status = 0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise _DamagedHDF5(
                f"{what}: reading it took more than {timeout} s (damaged HDF5 file?)"
            )
        time.sleep(0.002)
    if os.WIFSIGNALED(status):
        raise _DamagedHDF5(
            f"{what}: reading it killed the process with signal {os.WTERMSIG(status)} "
            "(damaged HDF5 file?)"
        )


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
        self._heaps: _HeapChecker | None = None
        self._pid = -1
        group = self._examples()
        with self._reading("the client list"):
            self._client_ids = sorted(group.keys())

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """Turn the errors h5py raises on a damaged file into a ``ValueError`` naming it."""
        try:
            yield
        except _DamagedHDF5:
            raise
        except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{self.path}: cannot read {what} (damaged HDF5 file?): {exc}"
            ) from exc

    def _examples(self) -> Any:
        h5py = _h5py()
        if self._file is None or self._pid != os.getpid():
            try:
                file = h5py.File(self.path, "r")
            except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{self.path}: not a readable HDF5 file: {exc}") from exc
            try:
                with self._reading("the file's sizes"):
                    heaps = _HeapChecker(self.path, file)
            except ValueError:
                file.close()
                raise
            self._file, self._heaps, self._pid = file, heaps, os.getpid()
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
            raise KeyError(f"client {shown(client_id)} is not in split {self.split!r}")
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
            datasets = {name: group[name] for name in FEATURES if name in found}
            # the lengths are compared before anything is read (twenty-ninth review of issue 15:
            # a 1-example client whose 'score' claimed 10**9 zeros, gzip-compressed in an 8 MB
            # file, took 7.9 GB and 94 s to be refused as "unequal lengths")
            sizes = {name: getattr(d, "size", None) for name, d in datasets.items()}
        for name in FEATURES:
            if name not in datasets:
                raise ValueError(
                    f"{self.path}: client {client_id!r} lacks feature {name!r} (found {found})"
                )
        for name, size in sizes.items():
            if size is None:  # a group (or a link) where a feature's dataset belongs
                raise ValueError(f"{self.path}: client {client_id!r}: {name!r} is not a dataset")
        self._check_lengths(client_id, sizes)
        with self._reading(f"client {client_id!r}"):
            for name, dataset in datasets.items():
                if isinstance(dataset, _h5py().Dataset):
                    self._heaps.check(dataset, f"client {client_id!r}: {name!r}")
                columns[name] = np.asarray(dataset[()]).reshape(-1)
        self._check_lengths(client_id, {name: len(col) for name, col in columns.items()})
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
        score = columns["score"]
        if score.dtype.kind == "u" and score.size and int(score.max()) >= 2**63:
            # thirty-first review of issue 15 (data): a uint64 score of 2**64 - 1 was read as
            # -1 (astype(int64) wraps); a tf.Example score is an int64
            raise ValueError(
                f"{self.path}: client {client_id!r}: a 'score' does not fit in int64 "
                f"({score.dtype})"
            )
        scores = score.astype(np.int64).tolist()
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

    def _check_lengths(self, client_id: str, lengths: Mapping[str, int]) -> None:
        """Refuse features of unequal lengths."""
        if len(set(lengths.values())) != 1:
            raise ValueError(
                f"{self.path}: client {client_id!r} has features of unequal lengths {lengths}"
            )

    def close(self) -> None:
        """Close this process's file handle (it reopens on next use)."""
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
            self._heaps.close()
        self._file = None
        self._heaps = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_file"] = None
        state["_heaps"] = None
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
        Replace an existing file (once the new one is complete); otherwise raise
        ``FileExistsError``.

    Returns
    -------
    pathlib.Path
        The written file.

    Raises
    ------
    ValueError
        If a client id cannot name an HDF5 group (empty, ``'.'``, or holding ``'/'`` or NUL),
        before anything is written.
    """
    h5py = _h5py()
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path}: exists (pass overwrite=True to replace it)")
    for client_id in clients:
        # thirty-fifth review of issue 15 (data): "u/1" was written as a group "u" holding a
        # group "1" (read back as a client "u" without features), "a\0b" as "a", and "" or "."
        # failed half-way with h5py's message, the file given to overwrite already emptied
        if not isinstance(client_id, str) or client_id in ("", ".") or set(client_id) & {"/", "\0"}:
            raise ValueError(
                f"client id {shown(client_id)} cannot name an HDF5 group: a client id is a "
                "non-empty string other than '.' without '/' or NUL"
            )
    vlen = h5py.special_dtype(vlen=bytes)
    untimed = _untimed(h5py.Group.create_group)
    partial = path.with_name(path.name + ".partial")  # renamed over path once complete
    try:
        with h5py.File(partial, "w", libver=_LIBVER, **_untimed(h5py.File)) as f:
            root = f.create_group("examples", **untimed)
            for client_id, examples in clients.items():
                group = root.create_group(client_id, **untimed)
                for name in FEATURES:
                    values = [getattr(e, name) for e in examples]
                    if name == "score":
                        data = np.asarray(values, dtype=np.int64)
                        group.create_dataset(name, data=data, track_times=False)
                    else:
                        data = np.array([v.encode("utf-8") for v in values], dtype=object)
                        group.create_dataset(name, data=data, dtype=vlen, track_times=False)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path
