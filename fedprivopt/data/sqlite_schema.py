"""The TFF StackOverflow SQLite schema: its checks, names and limits, and the writer.

Split from :mod:`fedprivopt.data.sqlite`, which reads the file
(:class:`~fedprivopt.data.sqlite.SQLiteSplit`, :func:`~fedprivopt.data.sqlite.read_example_counts`,
...) and re-exports the public names here: the schema check (:func:`check_schema`), the client
index (:data:`INDEX_NAME`, :func:`has_client_index`), the bound on split names
(:data:`MAX_SPLITS`, :func:`too_many_splits`), the binary collation names are told apart by
(:data:`BINARY`), text values checked (:func:`text_values`), and :func:`write_sqlite`, which
writes a file in the schema.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from fedprivopt.core.checks import check_flag
from fedprivopt.data.sqlite_files import refuse_null, remove_companions

__all__ = [
    "BINARY",
    "DISTINCT_SPLITS",
    "INDEX_NAME",
    "MAX_SPLITS",
    "SQLITE_ERRORS",
    "check_schema",
    "has_client_index",
    "text_values",
    "too_many_splits",
    "write_sqlite",
]

INDEX_NAME = "examples_split_client"
MAX_SPLITS = 100
"""Split names one file may hold (TFF's and the synthetic files hold 3: train, heldout, test).
Forty-fourth review of issue 15 (input 4): ``data info`` of a 24 MB file whose
``client_metadata`` named a million splits (a damaged table, or a split column filled with ids)
took 298 s and 1.2 GB and printed a million lines; a task's data identity read them alike."""


def too_many_splits(path: Path) -> ValueError:
    """The error for a file whose ``client_metadata`` names more than :data:`MAX_SPLITS` splits."""
    return ValueError(
        f"{path}: client_metadata names more than {MAX_SPLITS} splits (a StackOverflow file "
        "has 3: train, heldout, test), so the file is damaged"
    )


# sqlite3 raises UnicodeDecodeError when a damaged schema puts invalid UTF-8 in an error message
SQLITE_ERRORS = (sqlite3.DatabaseError, UnicodeDecodeError)
_SCHEMA = {
    "examples": ("split_name", "client_id", "serialized_example_proto"),
    "client_metadata": ("client_id", "split_name", "num_examples"),
}
_CREATE = (
    "CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
    "serialized_example_proto BLOB NOT NULL)",
    "CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, "
    "num_examples INTEGER NOT NULL)",
)


def check_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Raise ``ValueError`` naming ``path`` unless the TFF schema's tables and columns are there."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    missing = sorted(set(_SCHEMA) - tables)
    if missing:
        raise ValueError(
            f"{path}: not a TFF StackOverflow database: missing table(s) {missing} "
            f"(found {sorted(tables)})"
        )
    for table, columns in _SCHEMA.items():
        found = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        lacking = [c for c in columns if c not in found]
        if lacking:
            raise ValueError(
                f"{path}: table {table!r} lacks column(s) {lacking} (found {sorted(found)})"
            )


def has_client_index(conn: sqlite3.Connection) -> bool:
    """Whether ``examples`` has an index usable for ``WHERE split_name=? AND client_id=?``."""
    for row in conn.execute("PRAGMA index_list(examples)").fetchall():
        cols = [r[2] for r in conn.execute(f"PRAGMA index_info({_quote(row[1])})")]
        if cols[:1] == ["client_id"] or cols[:2] == ["split_name", "client_id"]:
            return True
    return False


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def text_values(path: Path, column: str, values: list) -> list[str]:
    """``values`` if they are all text; a damaged record can hold another storage class."""
    for value in values:
        if not isinstance(value, str):
            raise ValueError(f"{path}: {column} holds {value!r}, expected text")
    return values


# follow-up of the forty-first review of issue 15 (outputs 6): names told apart as the reader
# tells them (text equal to text), not by a COLLATE NOCASE or RTRIM of the column
BINARY = " COLLATE BINARY"
DISTINCT_SPLITS = f"SELECT DISTINCT split_name{BINARY} FROM client_metadata"


def write_sqlite(
    path: str | os.PathLike,
    examples: Iterable[tuple[str, str, bytes]],
    metadata: Iterable[tuple[str, str, int]],
    *,
    index: bool = True,
    overwrite: bool = False,
) -> Path:
    """Write a database in the TFF StackOverflow schema, in one transaction.

    Parameters
    ----------
    path : str or os.PathLike
        Output file; written to ``<path>.partial`` first and renamed when complete.
    examples : iterable of (split_name, client_id, serialized_example_proto)
        Rows of ``examples`` (consumed lazily by ``executemany``).
    metadata : iterable of (client_id, split_name, num_examples)
        Rows of ``client_metadata``.
    index : bool, default True
        Create the ``(split_name, client_id)`` index after inserting.
    overwrite : bool, default False
        Replace an existing file; otherwise raise ``FileExistsError``.

    Returns
    -------
    pathlib.Path
        The written file.
    """
    # forty-eighth review of issue 15 (overwrite 3): read by its truth, overwrite="False" replaced
    # a user's file at path (a flag read from an environment variable or a text file)
    overwrite = check_flag("overwrite", overwrite)
    path = Path(path)
    refuse_null("path", path)  # forty-fourth review follow-up (outputs 2): "embedded null byte"
    if path.is_dir() and not path.is_symlink():
        # forty-sixth review of issue 15 (input 6): written whole, then "[Errno 21] Is a directory"
        raise ValueError(
            f"{path}: is a directory, where write_sqlite writes its file (overwrite replaces a "
            "file, never a directory): name the file, not its directory"
        )
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path}: exists (pass overwrite=True to replace it)")
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    remove_companions(partial)
    conn = sqlite3.connect(partial)
    try:
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("PRAGMA synchronous = OFF")
        with conn:
            for statement in _CREATE:
                conn.execute(statement)
            conn.executemany("INSERT INTO examples VALUES (?, ?, ?)", examples)
            conn.executemany("INSERT INTO client_metadata VALUES (?, ?, ?)", metadata)
            if index:
                conn.execute(f"CREATE INDEX {INDEX_NAME} ON examples (split_name, client_id)")
        conn.close()
        remove_companions(path)  # the replaced file's journal would be rolled into this one
        os.replace(partial, path)
    except sqlite3.OperationalError as exc:
        if "full" not in str(exc):
            raise
        # fourteenth review of issue 15: `data synth` on a full disk ended in this traceback
        raise OSError(errno.ENOSPC, f"No space left on device ({exc})", str(partial)) from None
    finally:
        conn.close()
        partial.unlink(missing_ok=True)
    return path
