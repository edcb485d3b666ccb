"""The file-level side of the SQLite reader (:mod:`~fedprivopt.data.sqlite`).

- :func:`check_sqlite_file` and :func:`declared_size`: a complete SQLite database by its header;
- :func:`unreadable`: SQLite's error on reading a file, with the cause its text hides (a hot
  journal, write-ahead-log mode in a directory the reader cannot write, a WITHOUT ROWID table);
- :func:`check_row_owner`: a row SQLite matched to a client is that client's;
- :func:`hot_journal_refusal`: a dataset that cannot be told while a hot journal is beside it;
- :func:`remove_companions`: the files SQLite keeps beside a database that is replaced;
- :func:`first_warning`: a warning about a file said once per process;
- :func:`refuse_null`: a file or directory name given with a null character.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from fedprivopt.core.files import naming, refuse_url
from fedprivopt.core.text import shown

__all__ = [
    "check_row_owner",
    "check_sqlite_file",
    "declared_size",
    "first_warning",
    "hot_journal_refusal",
    "refuse_null",
    "remove_companions",
    "unreadable",
    "wal_header",
]

_HEADER = b"SQLite format 3\x00"


def refuse_null(name: str, path: str | os.PathLike, what: str = "file") -> None:
    r"""Raise ``ValueError`` naming parameter ``name`` if ``path`` holds a null character.

    Forty-fourth review follow-up of issue 15 (outputs 2): ``write_sqlite("w\x00.sqlite", ...)``
    and ``decompress_lzma(f, cache_dir="c\x00")`` ended in the operating system's ``embedded
    null byte``, naming no parameter (input 3 fixed :func:`~fedprivopt.data.synthetic.generate`
    only).
    """
    text = os.fspath(path)
    if ("\x00" if isinstance(text, str) else b"\x00") in text:
        raise ValueError(f"{name} holds a null character: {shown(text)}; a {what} name has none")


def check_sqlite_file(path: str | os.PathLike) -> Path:
    """Check that ``path`` exists and holds a complete SQLite database; return it as a Path.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If it is not a regular file (a directory, a FIFO), not an SQLite file, or is shorter
        than its header says (truncated), or a file
        SQLite opens beside it (``-journal``, ``-wal``, ``-shm``) is not a regular file.
    """
    refuse_url("path", path)  # forty-sixth review of issue 15 (follow-up outputs, open)
    path = Path(path)
    if not path.is_file():
        if path.exists():  # forty-fourth review of issue 15 (input 2): "no such file" of a FIFO
            raise ValueError(
                f"{path}: not a regular file (a directory, FIFO, device or socket); an SQLite "
                "database is a regular file"
            )
        raise FileNotFoundError(f"{path}: no such file")
    _check_companions(path)
    size = path.stat().st_size
    with naming(path), path.open("rb") as f:  # EIO (/proc/self/mem): sixteenth review, rc 1
        header = f.read(100)
    declared = declared_size(header, path)
    if declared is not None and size < declared:
        raise ValueError(
            f"{path}: truncated SQLite database: header says {declared} bytes, file has {size}"
        )
    return path


def _check_companions(path: Path) -> None:
    """Refuse a ``-journal``, ``-wal`` or ``-shm`` beside ``path`` that is not a regular file.

    Thirty-ninth review of issue 15 (input 3): ``data info D`` (also a task reading ``D``)
    where ``D/stackoverflow.sqlite-journal`` is a FIFO blocked for ever in SQLite's ``open`` of
    it, which retries after a signal: Ctrl-C and SIGTERM did not end it, only SIGKILL; a
    ``-shm`` FIFO was ``disk I/O error``. A link to ``/dev/zero`` is a device, refused alike.
    """
    for end in ("-journal", "-wal", "-shm"):
        companion = path.with_name(path.name + end)
        if os.path.lexists(companion) and not companion.is_file():
            raise ValueError(
                f"{companion}: beside {path.name}, and not a regular file (a FIFO, directory, "
                "device, socket or broken link), which SQLite opens as the database's "
                f"{end[1:]} file (a FIFO blocks for ever): remove it"
            )


def declared_size(header: bytes, path: str | os.PathLike) -> int | None:
    """The database size an SQLite file's first 100 bytes declare (``None``: not recorded).

    Raises ``ValueError`` naming ``path`` when they are not an SQLite header.
    """
    if len(header) < 100 or not header.startswith(_HEADER):
        raise ValueError(f"{path}: not an SQLite database (bad or missing header)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # the count is valid when written by the SQLite version that last changed the file
    return page_size * pages if header[24:28] == header[92:96] and pages > 0 else None


def unreadable(path: Path, exc: Exception) -> ValueError:
    """The error for SQLite's ``exc`` on reading ``path``, with the cause SQLite's text hides.

    Thirty-eighth review of issue 15 (input 2): a database beside a hot journal (a write that
    was interrupted) was refused as ``attempt to write a readonly database``, and one in
    write-ahead-log mode in a directory the reader cannot write as ``unable to open database
    file``: lines that blame the reader for what is the file's state.
    """
    hint = ""
    journal, wal = _hot_journal(path), path.with_name(path.name + "-wal")
    if journal is not None:
        hint = (
            f"; {journal.name} beside it is a hot journal (a write to the database was "
            "interrupted), which SQLite must roll back before anything is read, and a reader "
            "opens the file read-only: open it once with write access (e.g. sqlite3 "
            f"{path.name} 'PRAGMA quick_check'), which rolls the write back"
        )
    elif (wal.is_file() or wal_header(path)) and not os.access(path.parent, os.W_OK):
        # follow-up: a database left in WAL mode and closed cleanly has no -wal file, and was
        # refused as 'attempt to write a readonly database' with no hint (its header says WAL);
        # a checkpoint (the advice before) leaves the file in WAL mode: journal_mode=DELETE
        where = f"{wal.name} beside it" if wal.is_file() else "its header says so"
        hint = (
            f"; it is in write-ahead-log mode ({where}), which SQLite reads only "
            f"where it can create {path.name}-shm, and {path.parent} is not writable: "
            f"take it out of that mode once with write access (sqlite3 {path.name} "
            "'PRAGMA journal_mode=DELETE') or copy its files to a writable directory"
        )
    elif "no such column: rowid" in str(exc):
        hint = (
            " (table 'examples' is a WITHOUT ROWID table, and a client's examples are read in "
            "rowid order, the order of TFF's file: copy them into a table with rowids)"
        )
    return ValueError(f"{path}: unreadable SQLite database: {exc}{hint}")


def _hot_journal(path: Path) -> Path | None:
    """The hot journal beside database ``path`` (a ``-journal`` file that is not empty), or None."""
    journal = path.with_name(path.name + "-journal")
    return journal if journal.is_file() and journal.stat().st_size > 0 else None


def check_row_owner(path: Path, found: tuple, split: str, client_id: str) -> None:
    """Refuse an ``examples`` row that SQLite matched to ``(split, client_id)`` but is another's.

    Forty-first review of issue 15 (input 2): a file whose ``examples.client_id`` column is
    declared ``COLLATE NOCASE`` (or ``RTRIM``, or with a numeric type, which stores ``'01'``
    and ``'1'`` as the integer 1) and whose ``client_metadata`` lists ``u1`` and ``U1`` (with
    counts that add both) was read with every row of either for both: one person's examples
    trained as two users, each sampled and charged as one (the HDF5 twin: fortieth review,
    input 3). A row's split and client id must be exactly the text asked for.
    """
    if tuple(found) != (split, client_id):  # text equal to text: an integer 1 is not '1'
        raise ValueError(
            f"{path}: reading client {shown(client_id)} of split {split!r} found a row of "
            f"client {_as_stored(found[1], client_id)} of split {_as_stored(found[0], split)}: "
            "table 'examples' "
            "makes different client ids equal (a COLLATE or a numeric type on its columns), "
            "so one user's examples would be read for another; rebuild the table with TEXT "
            "columns and the default collation"
        )


_KINDS = {int: "an integer", float: "a real number", bytes: "a blob"}


def _as_stored(value: object, asked: str) -> str:
    """A value of a row for :func:`check_row_owner`'s message: a number said to be one.

    Follow-up of the forty-first review of issue 15 (outputs 2): a column declared ``INTEGER``
    stores ``'1'`` as the integer 1, which the message wrote as text: ``reading client '1' ...
    found a row of client '1'``, a line that contradicts itself.
    """
    if isinstance(value, str):
        return shown(value)
    kind = _KINDS.get(type(value), f"a {type(value).__name__}")
    return f"{shown(value)}, stored as {kind}, not the text {shown(asked)},"


def hot_journal_refusal(path: Path, what: str) -> str | None:
    """The refusal of reading which dataset ``path`` is while a hot journal is beside it.

    ``what``: the dataset it would be checked to be. ``None`` when no journal, or an empty one,
    is beside ``path``. Forty-first review of issue 15 (input 4, ``data synth --overwrite``) and
    its follow-up (outputs 5, a task's ``synth_*`` parameters over such a dataset, which said
    ``... is not the file its stackoverflow.synthetic.json describes ...: use another data_dir,
    or remove the marker``, a cause that is not the one found). The command given rolls the
    write back, the path quoted for a shell.
    """
    journal = _hot_journal(path)
    if journal is None or not path.is_file():
        return None
    return (
        f"{path} has a hot journal beside it ({journal.name}: a write to it was interrupted), "
        f"so whether it is {what} cannot be read: roll the write back once (sqlite3 "
        f"{shlex.quote(str(path))} 'PRAGMA quick_check') and run again"
    )


def remove_companions(path: Path) -> None:
    """Remove the ``-journal``, ``-wal`` and ``-shm`` files beside ``path`` (a file replaced).

    Call it before a new database is renamed to ``path``: those files belong to the database
    replaced (or to one removed), and SQLite pairs them with whatever file has the name.
    Forty-first review of issue 15 (input 3): ``D/stackoverflow.sqlite`` beside a hot journal
    (a write to it interrupted), the file removed, then ``data synth --out D --overwrite``
    (also a task's generation, ``decompress_lzma``): the new database was written beside the
    old one's journal, every read refused as a hot journal, and the advice of that refusal
    (open it once with write access, which rolls the write back) wrote the old file's pages into
    the new one: ``database disk image is malformed``. A directory of such a name is left (the
    reader refuses it).
    """
    for end in ("-journal", "-wal", "-shm"):
        other = path.with_name(path.name + end)
        if other.is_symlink() or (other.exists() and not other.is_dir()):
            other.unlink()


_WARNED: set[str] = set()  # the files this process warned about (no index)


def first_warning(path: Path) -> bool:
    """Whether this process has not yet warned about ``path`` (and will now)."""
    key = str(path.resolve())
    if key in _WARNED:
        return False
    _WARNED.add(key)
    return True


def wal_header(path: Path) -> bool:
    """Whether ``path``'s header marks a database in write-ahead-log mode (bytes 18-19: 2, 2)."""
    try:
        with open(path, "rb") as f:
            return f.read(20)[18:20] == b"\x02\x02"
    except OSError:
        return False
