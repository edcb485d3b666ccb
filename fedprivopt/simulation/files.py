"""The files of a run directory, and how each is written and read back.

A run directory holds

- ``config.toml`` (:data:`CONFIG_FILE`): the resolved configuration (what ``--resume`` reads back);
- ``metrics.jsonl`` (:data:`METRICS_FILE`): one JSON object per evaluated round;
- ``summary.json`` (:data:`SUMMARY_FILE`): the run's outcome;
- ``checkpoint.pt`` and ``checkpoint.prev.pt`` (:data:`CHECKPOINT`, :data:`PREVIOUS_CHECKPOINT`):
  the server state after the last checkpointed round and the one before;
- ``privacy_ledger.jsonl`` (:data:`LEDGER_FILE`): what every released round released;
- ``run.lock`` (:data:`LOCK_FILE`): held by the one process writing the directory.

Every write is durable before the caller goes on: :func:`write_synced` (write, flush, fsync),
:func:`atomic_write` (a temporary file, fsync, rename, fsync of the directory) and
:func:`fsync_dir`. :func:`read_rows` tolerates the one thing a killed append leaves, an incomplete
last line. :func:`to_toml` writes the flat-with-tables mappings of presets.

The durable writes and the TOML text are in :mod:`fedprivopt.simulation.files_write` (re-exported
here); this module keeps the file names, the checks of what may be read, and the JSON lines.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedprivopt.core.checks import as_float
from fedprivopt.core.files import naming
from fedprivopt.core.text import shown
from fedprivopt.simulation.files_write import (  # re-exported
    atomic_write,
    fsync_dir,
    temporary,
    to_toml,
    toml_value,
    utf8,
    write_synced,
)
from fedprivopt.strategies.config import MAX_ROUNDS

__all__ = [
    "CHECKPOINT",
    "CONFIG_FILE",
    "LEDGER_FILE",
    "LOCK_FILE",
    "METRICS_FILE",
    "PREVIOUS_CHECKPOINT",
    "SUMMARY_FILE",
    "atomic_write",
    "check_appended_not_linked",
    "check_config_not_empty",
    "check_regular",
    "check_replaced",
    "check_run_files",
    "detach_appended",
    "fsync_dir",
    "json_line",
    "parse_json",
    "read_lines",
    "read_rows",
    "stated_epsilons",
    "temporary",
    "to_toml",
    "toml_value",
    "utf8",
    "write_synced",
]

CONFIG_FILE = "config.toml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT = "checkpoint.pt"
PREVIOUS_CHECKPOINT = "checkpoint.prev.pt"
LEDGER_FILE = "privacy_ledger.jsonl"
LOCK_FILE = "run.lock"


SMALL_FILE_LIMIT = 64 << 20
"""The most bytes ``config.toml`` or ``summary.json`` may hold (read whole into memory)."""

LINE_LIMIT = 1 << 20
"""The most bytes one line of ``metrics.jsonl`` or ``privacy_ledger.jsonl`` may hold.

A row is about 0.5-2 KB (the Flower engine's and ADADP's the longest). Twelfth review of issue
15: a file whose damage holds no newline (a 3 GB hole of zero bytes) was read whole, then
decoded and split, and ended in a ``MemoryError`` traceback.
"""

LINES_LIMIT = 2_000_064
"""The most lines ``metrics.jsonl`` or ``privacy_ledger.jsonl`` may hold.

A run releases at most ``strategies.config.MAX_ROUNDS`` = 10**6 rounds: one metrics row and one
ledger line each (a resume rewrites the rows after its checkpoint away; a redone round may add
a ledger line), so twice that and a header leave room. Sixteenth review of issue 15: 5 million
lines ``{"round": 1}`` appended to ``metrics.jsonl`` (65 MB) made ``--resume`` hold 3.3 GB
(about 650 bytes a short row), and a larger file grew until killed.
"""


# -- what may be read ------------------------------------------------------------------------------


def check_regular(path: Path, *, limit: int | None = None) -> bool:
    """Whether ``path`` exists; raise if it is there but may not be read as a run's file.

    A FIFO would block the reader forever and a device (a link to ``/dev/zero``) would be read
    until memory runs out (issue 15, ninth review): both are refused before anything opens
    them. A directory passes (its reader fails with ``IsADirectoryError``), as does a missing
    path or a dangling link (``False``).

    Raises
    ------
    ValueError
        Naming ``path``: not a regular file, or more than ``limit`` bytes.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        return True
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(
            f"{path}: not a regular file (a FIFO, device or socket); a run's files are regular "
            "files: remove or replace it"
        )
    if limit is not None and st.st_size > limit:
        raise ValueError(f"{path}: {st.st_size} bytes, more than the {limit} a run writes there")
    return True


def check_run_files(out: Path) -> None:
    """:func:`check_regular` for every file of run directory ``out`` that exists.

    ``config.toml`` and ``summary.json`` may hold at most :data:`SMALL_FILE_LIMIT` bytes.
    """
    out = Path(out)
    for name in (CONFIG_FILE, SUMMARY_FILE):
        check_regular(out / name, limit=SMALL_FILE_LIMIT)
    for name in (METRICS_FILE, LEDGER_FILE, CHECKPOINT, PREVIOUS_CHECKPOINT):
        check_regular(out / name)


def check_replaced(out: Path, extra: tuple[str, ...] = ()) -> None:
    """Refuse a directory where a resume of ``out`` writes a file by replacing it.

    ``extra``: more names of ``out`` a resume replaces (``privacy_ledger.jsonl.v1``, where the
    run module sets an earlier version's ledger aside when it converts it).

    Forty-first review of issue 15 (ledger, finding 1): ``mkdir R/checkpoint.pt.tmp`` (or
    ``checkpoint.prev.pt``, ``summary.json.tmp``), then ``simulate --resume R`` with more
    rounds: the next round was released, then saving its checkpoint failed (``Is a
    directory``, rc 2), and a secure run's next resume released it again with new noise.
    Follow-up (ledger 2): ``checkpoint.pt.bad``, where an unreadable newest checkpoint is set
    aside: ``summary.json`` was removed, then ``Is a directory`` (``privacy_ledger.jsonl.v1``
    alike, when an earlier version's ledger is converted: follow-up ledger 3). Each extra name's
    ``.tmp`` too, through which it is written: forty-second review follow-up (ledger 4),
    ``compare``'s plan passed a directory at ``privacy_ledger.jsonl.v1.tmp`` (``run.resume``
    refused it only at the cell's turn, after the report was removed). A checkpoint or one of
    these files marked immutable or append-only is refused alike (:func:`_pinned`).
    """
    names = (PREVIOUS_CHECKPOINT, CHECKPOINT + ".tmp", SUMMARY_FILE + ".tmp",
             METRICS_FILE + ".tmp", LEDGER_FILE + ".tmp", CHECKPOINT + ".bad", *extra,
             *(name + ".tmp" for name in extra))  # fmt: skip
    for name in names:
        path = Path(out) / name
        if path.is_dir() and not path.is_symlink():
            raise ValueError(
                f"{str(path)!r} is a directory, where a resume writes a file of the run (it "
                "would fail after releasing a round): remove or rename it"
            )
    # forty-seventh review follow-up (ledger 2): metrics.jsonl or summary.json (the summary was
    # removed, then the rows' rewrite failed) and the directory (append-only: no rename in it)
    for name in ("", CHECKPOINT, METRICS_FILE, SUMMARY_FILE, *names):
        path = Path(out) / name
        pinned = _pinned(path)
        if pinned is not None:
            what = "directory" if name == "" else "file"
            raise ValueError(
                f"{path}: the {what} is {pinned} (chattr +{pinned[0]}), so it cannot be replaced "
                "or removed, which a resume does to it after releasing a round (the round would "
                f"be released again when resumed); lift it (chattr -{pinned[0]} {path}) and try "
                "again"
            )


#: ``FS_IOC_GETFLAGS``, Linux's ioctl reading a file's attributes (``lsattr``), and two of them.
_GETFLAGS = (2 << 30) | (struct.calcsize("l") << 16) | (ord("f") << 8) | 1
_PINNED = {0x10: "immutable", 0x20: "append-only"}  # FS_IMMUTABLE_FL, FS_APPEND_FL


def _pinned(path: Path) -> str | None:
    """``"immutable"`` or ``"append-only"`` for a regular file or directory so marked (Linux).

    ``None`` for anything else, or where the attributes cannot be read.

    Forty-seventh review of issue 15 (ledger, finding 2): a secure run whose
    ``checkpoint.prev.pt`` was made immutable (``chattr +i``, to keep it from being removed),
    ``simulate --resume R`` with one more round: round 4 was released (its ledger line and row),
    then saving its checkpoint failed (``checkpoint.pt -> checkpoint.prev.pt: Operation not
    permitted``, rc 2), and the next resume released round 4 again with new noise (epsilon 15.03
    where 13.70), as the forty-first review's directory at ``checkpoint.pt.tmp`` did.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        mode = os.lstat(path).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # missing, or unreadable (its reader names it)
        return None
    try:
        import fcntl

        flags = struct.unpack("i", fcntl.ioctl(fd, _GETFLAGS, bytes(8))[:4])[0]
    except OSError:  # a file system without these attributes
        return None
    finally:
        os.close(fd)
    return next((what for bit, what in _PINNED.items() if flags & bit), None)


def check_appended_not_linked(out: Path) -> None:
    """Refuse a run whose ``privacy_ledger.jsonl`` or ``metrics.jsonl`` is a symbolic link.

    A resume appends to both, which through a link changes the linked file. Sixteenth review
    of issue 15: run ``B`` made as a linked copy of run ``A`` (``cp -rs A B``), then
    ``simulate --resume B`` with more rounds, appended ``B``'s rounds to ``A``'s ledger (rc 0):
    ``A`` then showed rounds it never released, and its own resume was refused. Reading
    through a link (a report, a reused cell) stays allowed.
    """
    for name in (LEDGER_FILE, METRICS_FILE):
        path = Path(out) / name
        if path.is_symlink():
            raise ValueError(
                f"{path} is a symbolic link (to {os.readlink(path)!r}): a resume appends to it, "
                "which would change the linked file; put a copy of the file in place of the "
                "link to continue this run"
            )


def detach_appended(out: Path) -> None:
    """Give ``privacy_ledger.jsonl`` and ``metrics.jsonl`` of ``out`` their own copies.

    A file with other hard links (``cp -al A B``, a snapshot backup) is copied and the copy
    renamed over it, so that the appends of a resume change this run's file alone. Sixteenth
    review of issue 15: ``simulate --resume B`` of such a copy appended ``B``'s rounds to
    ``A``'s ledger too (rc 0), after which ``A`` showed rounds it never released and its own
    resume was refused.
    """
    import shutil

    for name in (LEDGER_FILE, METRICS_FILE):
        path = Path(out) / name
        try:
            links = path.stat().st_nlink
        except FileNotFoundError:
            continue
        if links > 1:
            tmp = temporary(path)
            shutil.copyfile(path, tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            fsync_dir(path.parent)


def check_config_not_empty(path: Path) -> None:
    """Refuse a run's ``config.toml`` that is empty, blank or only comments (``ValueError``).

    fedprivopt writes the file whole (:func:`atomic_write`), so such a file was emptied by hand.
    TOML reads it as no settings, and every key would then take its default: ``--resume``
    refused it naming the first privacy-relevant default that differs from the ledger (issue
    15, twelfth review, minor), not the file. Call it before the run directory is locked, so
    that nothing there is touched. A file that does not exist is left to the caller.
    """
    if not path.is_file():
        return
    text = path.read_bytes()
    if not text.strip():
        what = "" if not text else " (only whitespace)"
    elif all(not line.strip() or line.lstrip().startswith(b"#") for line in text.splitlines()):
        what = " (only comments)"
    else:
        return
    raise ValueError(
        f"{path}: the file is empty{what}; a run's {path.name} holds its resolved configuration, "
        "which fedprivopt writes whole, so it was emptied outside fedprivopt: restore it (its "
        "summary.json's config holds the same keys) and try again"
    )


# -- JSON lines ------------------------------------------------------------------------------------


def json_line(row: Mapping[str, Any]) -> str:
    """One line of a ``.jsonl`` file (non-finite floats as Python's ``json`` writes them)."""
    return json.dumps(row, allow_nan=True) + "\n"


def parse_json(text: str | bytes) -> Any:
    """``json.loads(text)``; its every failure is a ``ValueError`` (the caller names the file).

    Twelfth review of issue 15: a run file nested 100,000 deep raised ``RecursionError`` (a
    traceback, rc 1), and an integer of more than 4,300 digits Python's ``ValueError`` about
    ``sys.set_int_max_str_digits``, which no reader named the file for. Truncated text still
    raises ``json.JSONDecodeError`` (a ``ValueError``), which :func:`read_rows` tells apart.
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to read (not written by fedprivopt)") from None


def read_lines(path: Path) -> tuple[list[str], int | None]:
    """The lines of a run's ``.jsonl`` file, and the byte offset of a torn last line.

    The offset is ``None`` unless the last line has no newline (a killed append).

    Read a line at a time, each at most :data:`LINE_LIMIT` bytes (decoded as UTF-8, invalid
    bytes replaced). A missing file has no lines.

    Raises
    ------
    ValueError
        Naming the file and line, for a line longer than :data:`LINE_LIMIT` bytes.
    """
    if not check_regular(path):
        return [], None
    lines: list[str] = []
    offset, torn_at = 0, None
    with open(path, "rb") as fh, naming(path):
        while chunk := fh.readline(LINE_LIMIT + 1):
            if len(chunk) > LINE_LIMIT:
                raise ValueError(
                    f"{path}: line {len(lines) + 1} is longer than {LINE_LIMIT} bytes, which "
                    "no line fedprivopt writes is (the file is damaged): restore or remove it"
                )
            if len(lines) == LINES_LIMIT:
                raise ValueError(
                    f"{path}: holds more than {LINES_LIMIT:,} lines, more than a run of at most "
                    "10**6 rounds writes (one a round): the file is damaged or was extended "
                    "outside fedprivopt; restore or remove it"
                )
            torn_at = None if chunk.endswith(b"\n") else offset
            offset += len(chunk)
            lines.append(chunk.decode("utf-8", errors="replace").removesuffix("\n"))
    if torn_at is not None:
        _refuse_joined_lines(path, len(lines), lines[-1])
    return lines, torn_at


def _refuse_joined_lines(path: Path, lineno: int, line: str) -> None:
    r"""Refuse a last line without a newline that is not the prefix of one line.

    A killed append leaves a prefix of one JSON line, which holds no ``\r`` (``json`` writes
    none) and never a whole JSON value followed by more. Forty-second review of issue 15
    (ledger, findings 1-3): a file whose line endings were converted to CR alone
    (``unix2mac``, an old editor), or whose lines were joined with spaces or tabs, was one torn
    line: a privacy ledger so changed was read as none and rebuilt from the checkpoint (a
    secure run killed after round 5's line with its checkpoint of round 4 resumed, rc 0,
    epsilon 16.29 where 17.36 was spent), and ``metrics.jsonl`` lost every row on the resume.
    Follow-up (ledger 3): a ledger rewritten as one JSON array of its lines without a final
    line feed (``json.dump(lines, f)``) was read as no ledger alike and rebuilt (epsilon 18.81
    where 20.28 was spent); a line fedprivopt writes is an object, so a whole other value is
    no prefix of one either.
    """
    if "\r" in line.rstrip("\r"):
        raise ValueError(
            f"{path}: line {lineno} has no line feed but holds carriage returns: its line "
            "endings were converted to CR alone, which fedprivopt never writes (it is no append "
            "cut short); convert them back to line feeds or restore the file"
        )
    _refuse_beside_object(path, lineno, line)
    text = line.strip()
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError):
        return  # a prefix of one line (or garbage, which its reader refuses or drops)
    if end < len(text):
        raise ValueError(
            f"{path}: line {lineno} has no line feed but holds a JSON value followed by more "
            "text: lines were joined (their line feeds removed), which fedprivopt never writes "
            "(it is no append cut short); put the line feeds back or restore the file"
        )
    if not isinstance(value, dict):  # follow-up (ledger 3): the lines as one JSON array
        raise ValueError(
            f"{path}: line {lineno} has no line feed but is a whole JSON value that is no "
            f"object ({_JSON_KINDS.get(type(value), 'a number')}): lines were put into one "
            "value, which fedprivopt never writes (it is no append cut short); write them back "
            "one object a line or restore the file"
        )


def _refuse_beside_object(path: Path, lineno: int, line: str) -> None:
    r"""Refuse a last line without a newline that is a whole object beside what JSON refuses.

    A line that is a whole JSON object lacks only its newline and is read as the line it is
    (a ledger's release is charged: thirty-first review); a killed append leaves a prefix of
    one line. Python's ``strip`` (which the checks above use) also takes away characters that
    JSON does not allow around a value: a form feed, vertical tab, the separators ``\x1c``-
    ``\x1f``, NEL, a no-break space, U+2028, a byte order mark. Forty-fifth review of issue 15
    (ledger, finding 1): the last line of a secure run's ledger killed after round 5's line
    (checkpoint of round 4), ending in such a character instead of its line feed, was neither
    refused nor read as a whole object: it was dropped as an append cut short, and ``--resume``
    charged round 5 once for its two releases (rc 0, epsilon 29.24 where 32.45 was spent).
    """
    try:
        json.loads(line)
        return  # read as the whole line it is (a ledger's release is charged)
    except (ValueError, RecursionError):
        pass
    core = line.strip().strip("\ufeff").strip()
    try:
        value, end = json.JSONDecoder().raw_decode(core)
    except (ValueError, RecursionError):
        return  # a prefix of one line (or garbage, which its reader refuses or drops)
    if end == len(core) and isinstance(value, dict):
        extra = sorted({c for c in line if c not in core and c not in " \t\r"} or {"?"})
        raise ValueError(
            f"{path}: line {lineno} has no line feed but is a whole JSON object beside "
            f"characters that JSON does not allow there ({', '.join(map(ascii, extra[:4]))}), "
            "which fedprivopt never writes (it is no append cut short, which leaves a prefix "
            "of one line): remove them or restore the file"
        )


_JSON_KINDS = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def read_rows(path: Path, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl`` (``[]`` if it does not exist).

    A final line without a newline that does not parse is the trace of a write killed midway:
    it is dropped (and, with ``skipped``, noted there). Blank lines are ignored.

    Raises
    ------
    ValueError
        Naming the file and line, for any other line that is not a JSON object with an int
        ``round`` of at most ``MAX_ROUNDS``, or whose ``epsilon``, ``delta`` or ``eval_*``
        value is not a number.
    """
    lines, torn_at = read_lines(path)
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = parse_json(line)
        except json.JSONDecodeError as exc:
            if torn_at is not None and lineno == len(lines):  # a killed append: no "\n"
                if skipped is not None:
                    skipped.append(f"{path}: skipped truncated final line {lineno}")
                continue
            raise ValueError(f"{path}: line {lineno} is not valid JSON ({exc})") from None
        except ValueError as exc:  # nested too deeply, or an integer too long to read
            raise ValueError(f"{path}: line {lineno} cannot be read ({exc})") from None
        if not isinstance(row, dict) or type(row.get("round")) is not int:
            raise ValueError(f"{path}: line {lineno} is not an object with an int 'round'")
        if row["round"] > MAX_ROUNDS:  # thirty-second review of issue 15 (resume, finding 2)
            raise ValueError(
                f"{path}: line {lineno}: round {shown(row['round'])} is beyond the "
                f"{MAX_ROUNDS:,} a run may have (not written by fedprivopt: the file was edited)"
            )
        _check_numbers(row, f"{path}: line {lineno}")
        rows.append(row)
    return rows


def _check_numbers(row: Mapping[str, Any], where: str) -> None:
    """Raise unless the row's ``epsilon``, ``delta`` and ``eval_*`` values are numbers.

    What a run writes there is a float (NaN and infinities as ``json`` writes them). Thirty-
    second review of issue 15 (resume, finding 1): a row whose ``eval_accuracy`` was edited to
    ``"x"``, ``null``, ``[1]`` or an integer of 400 digits (``epsilon`` too) ended ``simulate
    --resume`` in a traceback (rc 1) or in ``Unknown format code 'f' for object of type 'str'``
    (rc 2) after its new ``summary.json`` was written, and ``true`` was reported as accuracy
    1.0000 (a report: NaN).
    """
    for key, value in row.items():
        if key not in ("epsilon", "delta") and not key.startswith("eval_"):
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (isinstance(value, int) and math.isinf(as_float(value))):
            raise ValueError(
                f"{where}: {key} must be a number that fits a float, got {shown(value)} "
                "(not written by fedprivopt: the file was edited)"
            )


def stated_epsilons(
    rows: list[dict[str, Any]], summary: Mapping[str, Any] | None
) -> list[tuple[str, float]]:
    """``(where, ε)``: the largest ε the metrics ``rows`` state and the one ``summary`` states.

    Numbers only, NaN left out and ``inf`` kept (a private ledger composes to it only at σ 0).
    ``where`` names the file (and the round of the row). An integer too large for a float
    states ``inf`` (thirty-second review of issue 15, resume finding 1: ``summary.json``'s
    ``epsilon`` edited to an integer of 400 digits was an ``OverflowError`` traceback of
    ``--resume``, rc 1).
    """

    def value(x: object) -> float:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return math.nan
        return as_float(x)  # an int beyond the floats: inf of its sign

    out = []
    stating = [(value(r.get("epsilon")), r["round"]) for r in rows]
    stating = [(v, k) for v, k in stating if not math.isnan(v)]
    if stating:
        top, at = max(stating, key=lambda pair: pair[0])
        out.append((f"{METRICS_FILE} (round {at})", top))
    if summary is not None and not math.isnan(value(summary.get("epsilon"))):
        out.append((SUMMARY_FILE, value(summary["epsilon"])))
    return out
