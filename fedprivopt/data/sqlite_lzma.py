"""TFF's compressed download, ``stackoverflow.sqlite.lzma``, as a cached ``.sqlite`` file.

:func:`decompress_lzma` streams the download into ``stackoverflow.sqlite`` next to it (or in a
cache directory) once, in bounded memory, and indexes the cache it writes (see
:func:`~fedprivopt.data.sqlite.create_client_index`); :func:`open_sqlite` opens one split of a
``.sqlite`` file, decompressing a ``.lzma``/``.xz`` one first. Reading the database itself is
:mod:`fedprivopt.data.sqlite`.
"""

from __future__ import annotations

import contextlib
import lzma
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from fedprivopt.core.checks import check_flag
from fedprivopt.core.files import refuse_url
from fedprivopt.data.sqlite import (
    SQLiteSplit,
    check_sqlite_file,
    create_client_index,
    declared_size,
)
from fedprivopt.data.sqlite_files import refuse_null, remove_companions

__all__ = ["decompress_lzma", "open_sqlite"]

_MAX_OUT = 16 << 20  # bytes of decompressed output per step


def decompress_lzma(
    path: str | os.PathLike,
    *,
    cache_dir: str | os.PathLike | None = None,
    chunk_size: int = 1 << 20,
    overwrite: bool = False,
    index: bool = True,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Stream-decompress ``stackoverflow.sqlite.lzma`` to a cached ``stackoverflow.sqlite``.

    Decompression is chunked (memory stays at a few MB whatever the size), writes to a
    ``.partial`` file and renames it when complete, so an interrupted run leaves no cache.

    Parameters
    ----------
    path : str or os.PathLike
        The compressed file (``.lzma`` or ``.xz``; both container formats are accepted).
    cache_dir : str or os.PathLike, optional
        Where to write the result; by default next to ``path``.
    chunk_size : int, default 1 MiB
        Bytes read per step; must be positive.
    overwrite : bool, default False
        Decompress again even if the cached file exists. Without it an existing file is
        returned only if it is this download's decompression (it keeps the download's
        modification time, as ``xz -dk`` does); another file there raises
        ``FileExistsError``.
    index : bool, default True
        Create the ``(split_name, client_id)`` index on the cache (our own file) when missing.
    progress : callable, optional
        Called with the number of compressed bytes read so far after each chunk.

    Returns
    -------
    pathlib.Path
        The decompressed file (the suffix ``.lzma``/``.xz`` removed).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    FileExistsError
        If the output exists and is not the decompression of ``path`` (without ``overwrite``).
    ValueError
        If ``path`` is not a regular file (a FIFO, a directory), if the output is a directory,
        if the stream is corrupt or truncated, or does not hold an SQLite database.
    """
    # forty-eighth review of issue 15 (overwrite 3): read by its truth, overwrite="False" replaced
    # the file at the output (a flag read from an environment variable or a text file)
    overwrite = check_flag("overwrite", overwrite)
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive number of bytes, got {chunk_size}")
    refuse_url("path", path)  # forty-sixth review of issue 15 (follow-up outputs, open)
    path = Path(path)
    if not path.is_file():
        if path.exists():  # forty-fourth review of issue 15 (input 2): "no such file" of a FIFO
            raise ValueError(
                f"{path}: not a regular file (a directory, FIFO, device or socket); a "
                "compressed download is a regular file"
            )
        raise FileNotFoundError(f"{path}: no such file")
    name = path.name
    for suffix in (".lzma", ".xz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    else:
        name += ".decompressed"
    if cache_dir is not None and not os.fspath(cache_dir):
        # forty-eighth review of issue 15 (overwrite 4): "" decompressed into the working directory
        raise ValueError("cache_dir must be a non-empty path or None, got ''")
    if cache_dir is not None:  # forty-fourth review follow-up (outputs 2): "embedded null byte"
        refuse_null("cache_dir", cache_dir, "directory")
    out_dir = Path(cache_dir) if cache_dir is not None else path.parent
    out = out_dir / name
    if out.is_dir() and not out.is_symlink():
        # forty-sixth review of issue 15 (input 4): a directory there (a mkdir slip) was "exists
        # and is not the decompression of ... (its modification time is not the download's
        # ...) pass overwrite=True to replace it", and with overwrite=True the whole download
        # was decompressed, then "[Errno 21] Is a directory: '...partial' -> '...'"
        raise ValueError(
            f"{out}: is a directory, where decompress_lzma writes the decompressed database "
            "(overwrite replaces a file, never a directory): move it, or choose another cache_dir"
        )
    if (out.exists() or out.is_symlink()) and not overwrite:
        if _decompressed_from(out, path):
            return out
        cause = (
            f"a symbolic link to nothing ({os.readlink(out)})"
            if not out.exists()
            else "its modification time is not the download's, which decompress_lzma and xz "
            "-dk give it"
        )
        raise FileExistsError(
            f"{out}: exists and is not the decompression of {path} ({cause}): another "
            "dataset, an older download's, or one an earlier fedprivopt wrote; name it to read "
            "it as it is, pass overwrite=True to replace it, or choose another cache_dir"
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        # forty-fourth review follow-up of issue 15 (outputs 7): a file or FIFO given as
        # cache_dir (or above it) was "[Errno 17] File exists: 'c'", naming no parameter
        where = (out_dir, *out_dir.parents)
        blocker = next((p for p in where if p.exists() and not p.is_dir()), out_dir)
        raise ValueError(
            f"cache_dir {str(out_dir)!r} is not a directory: {str(blocker)!r} is a file (a "
            "regular file, FIFO, device or socket)"
        ) from None
    partial = out.with_name(out.name + ".partial")
    remove_companions(partial)  # a killed indexing's journal would be rolled into the new file
    try:
        done = 0
        with path.open("rb") as src, partial.open("wb") as dst:
            streams = _Streams(path, _BoundedOutput(dst))
            while chunk := src.read(chunk_size):
                done += len(chunk)
                streams.feed(chunk)
                if progress is not None:
                    progress(done)
            streams.finish(done)
        check_sqlite_file(partial)
        if index:
            create_client_index(partial)
        # the download's modification time, as xz -dk does: what shows the file is its
        # decompression when it is asked for again (see _decompressed_from)
        source = path.stat()
        with contextlib.suppress(OSError):  # refused by the file system: then named as not ours
            os.utime(partial, ns=(source.st_atime_ns, source.st_mtime_ns))
        remove_companions(out)  # the replaced file's, as write_sqlite does
        os.replace(partial, out)
    except lzma.LZMAError as exc:
        raise ValueError(f"{path}: corrupt LZMA/XZ stream: {exc}") from exc
    except _StreamError:
        raise
    except ValueError as exc:
        raise ValueError(f"{path}: decompressed content is unusable: {exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
    return out


_COARSE_NS = 2 * 10**9
"""A file system that keeps whole seconds (ext3) or two (FAT) may move a time by this much."""


def _decompressed_from(out: Path, path: Path) -> bool:
    """Whether ``out`` is the decompression of ``path``: a regular file with its modification time.

    The same time to the nanosecond, or to the 2 s a file system that keeps whole seconds may
    round it to (``out``'s time is then whole seconds). Thirty-fifth review of issue 15 (data):
    an existing ``out`` was returned whatever it held, so
    ``decompress_lzma(D/"stackoverflow.sqlite.lzma")`` (and ``open_split`` of the ``.lzma``) in
    a directory that already held a synthetic ``stackoverflow.sqlite`` returned the synthetic
    file as the download's (wrong data silently used), as it did an older download's after a
    new one replaced it, or another download's in a shared ``cache_dir``.
    """
    try:
        made, source = out.stat(), path.stat()
    except OSError:
        return False
    if not stat.S_ISREG(made.st_mode):
        return False
    if made.st_mtime_ns == source.st_mtime_ns:
        return True
    coarse = made.st_mtime_ns % 10**9 == 0
    return coarse and abs(made.st_mtime_ns - source.st_mtime_ns) < _COARSE_NS


_XZ_MAGIC = b"\xfd7zXZ\x00"


class _StreamError(ValueError):
    """The compressed file itself is damaged (not what it decompresses to)."""


class _Streams:
    """The streams of a compressed file, decompressed one after another into ``output``.

    An ``.xz`` file may hold several streams, each followed by stream padding (null bytes, a
    multiple of four), and ``xz -d`` writes their decompressions one after another; anything
    else after a stream (or anything but padding after an ``.lzma`` stream) is refused, as
    ``xz -d`` refuses it. Fortieth review of issue 15 (input 1): only the first stream was
    read, so ``cat a.xz b.xz`` of a database cut in two was refused as a truncated database,
    and a stream followed by other bytes (a damaged tail, another file appended) was read as
    if the file ended there.
    """

    def __init__(self, path: Path, output: _BoundedOutput) -> None:
        self.path = path
        self.output = output
        self.decomp: lzma.LZMADecompressor | None = lzma.LZMADecompressor(format=lzma.FORMAT_AUTO)
        self.head = b""  # the file's first bytes, until the format is known
        self.padding = 0  # null bytes after the last stream that ended
        self.start = b""  # the first bytes of the stream that follows it

    def feed(self, data: bytes) -> None:
        """Decompress ``data``, the next bytes of the file."""
        if len(self.head) < len(_XZ_MAGIC):
            self.head += data[: len(_XZ_MAGIC) - len(self.head)]
        while data:
            if self.decomp is None:  # between streams: padding, then another .xz stream
                if not self.start:
                    rest = data.lstrip(b"\x00")
                    self.padding += len(data) - len(rest)
                    data = rest
                    if not data:
                        return
                need = len(_XZ_MAGIC) - len(self.start)
                self.start, data = self.start + data[:need], data[need:]
                if (
                    self.head != _XZ_MAGIC
                    or self.padding % 4
                    or not _XZ_MAGIC.startswith(self.start)
                ):
                    raise self._trailing()
                if len(self.start) < len(_XZ_MAGIC):
                    return  # the rest of the next stream's magic is in the next chunk
                data, self.start, self.padding = self.start + data, b"", 0
                self.decomp = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
            decomp = self.decomp
            # Bounded output per call: memory stays O(chunk_size) even for runs of zeros.
            self.output.write(decomp.decompress(data, max_length=_MAX_OUT))
            while not decomp.eof and not decomp.needs_input:
                self.output.write(decomp.decompress(b"", max_length=_MAX_OUT))
            data = b""
            if decomp.eof:
                self.decomp, data = None, decomp.unused_data

    def finish(self, done: int) -> None:
        """Refuse a file that ended inside a stream or its padding (``done``: its bytes)."""
        if self.decomp is not None or self.start:
            raise _StreamError(f"{self.path}: truncated LZMA stream (ended after {done} bytes)")
        if self.padding % 4:
            raise self._trailing()

    def _trailing(self) -> _StreamError:
        return _StreamError(
            f"{self.path}: data after the end of the compressed stream, which xz -d refuses "
            "too (the file is damaged, or another file was appended to it)"
        )


class _BoundedOutput:
    """The decompressed stream's file, refused as soon as it cannot be an SQLite database.

    Twenty-ninth review of issue 15: 360 kB of ``xz`` (2 GB of zeros) wrote 2 GB in 37 s before
    the header was read (a few MB of such a stream fill any disk). Its first 100 bytes must be
    an SQLite header, and it may not grow past the size that header declares.
    """

    def __init__(self, dst: BinaryIO) -> None:
        self.dst = dst
        self.head = b""
        self.written = 0
        self.limit: int | None = None

    def write(self, data: bytes) -> None:
        if len(self.head) < 100:
            self.head += data[: 100 - len(self.head)]
            if len(self.head) == 100:
                self.limit = declared_size(self.head, "its first 100 bytes")
        self.written += len(data)
        if self.limit is not None and self.written > self.limit:
            raise ValueError(
                f"it decompresses to more than the {self.limit:,} bytes its SQLite header declares"
            )
        self.dst.write(data)


def open_sqlite(
    path: str | os.PathLike,
    split: str = "train",
    *,
    cache_dir: str | os.PathLike | None = None,
    **kwargs: object,
) -> SQLiteSplit:
    """Open one split of a ``.sqlite`` file, decompressing a ``.lzma``/``.xz`` one first.

    Extra keyword arguments go to :class:`SQLiteSplit`; ``cache_dir`` to
    :func:`decompress_lzma`.
    """
    p = Path(path)
    if p.suffix in (".lzma", ".xz"):
        p = decompress_lzma(p, cache_dir=cache_dir)
    return SQLiteSplit(p, split, **kwargs)  # type: ignore[arg-type]
