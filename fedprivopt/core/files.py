"""File-system helpers that the data layer, the runs and the command line share.

- :func:`naming`: an ``OSError`` that names no file (a failed ``read``, ``flush`` or ``close``)
  re-raised naming the path, so the command line reports it as one line;
- :func:`unlink_links`: files that are links removed before they are rewritten in place;
- :func:`on_read_only_fs`: whether a path lies on a file system mounted read-only;
- :func:`read_at_most`: a file's bytes, unless it holds more than a limit (never read whole);
- :func:`check_umask`: refuse a umask under which the files created are not their owner's to
  read and write;
- :func:`real_path`: a path absolute with its links resolved where they can be.

Only the standard library is imported here.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = [
    "check_umask",
    "current_umask",
    "naming",
    "on_read_only_fs",
    "read_at_most",
    "real_path",
    "refuse_url",
    "unlink_links",
    "url_refusal",
    "url_scheme",
]


@contextlib.contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """Give an ``OSError`` raised inside without a file name ``path``'s.

    Fourteenth review of issue 15: a full disk fails in ``flush`` or ``close``, whose errors name
    no file; sixteenth: a file on which ``read`` fails (EIO: a failing disk, or a link to
    ``/proc/self/mem``) ended ``--resume`` and ``data info`` in a traceback naming no file (rc 1).
    """
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None


def unlink_links(directory: str | os.PathLike, names: Iterable[str]) -> None:
    """Remove each of ``names`` in ``directory`` that is a link or a special file.

    A symbolic link, a regular file with other hard links, or a FIFO, socket or device node:
    call it before rewriting those files in place: the link goes, what it pointed to is kept; a
    special file holds no data. A directory is left for the writer to refuse.
    Sixteenth review of issue 15: ``compare-tuned T --out O`` over its own earlier report whose
    ``summary.csv`` was a symbolic link to a user's file wrote the new CSV through the link
    (rc 0, the user's file replaced); ``tune``'s report files, and ``data synth --overwrite``
    over a dataset whose vocabulary was linked from another one, alike. Eighteenth review,
    finding 4: ``data synth --overwrite`` over a dataset whose ``stackoverflow.word_count`` was
    a FIFO hung in ``open`` until killed.
    """
    for name in names:
        path = Path(directory) / name
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        mode = st.st_mode
        linked = stat.S_ISREG(mode) and st.st_nlink > 1
        if linked or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            path.unlink()


def on_read_only_fs(path: str | os.PathLike) -> bool:
    """Whether ``path`` lies on a file system mounted read-only (``False`` if it cannot be told).

    There ``os.access`` fails with EROFS and no file can be created, not even a lock file.
    """
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows)
        return False


def read_at_most(path: str | os.PathLike, limit: int) -> bytes | None:
    """The bytes of ``path``; ``None`` if it holds more than ``limit`` (at most limit + 1 read).

    Eighteenth review of issue 15, finding 7: a preset, a tag-count file or a dataset's marker
    made a sparse 20 GB file (``truncate -s 20G``) was read whole, a ``MemoryError``; callers
    refuse the ``None`` in their own words. ``OSError`` from opening or reading propagates.
    """
    with open(path, "rb") as fh:
        raw = fh.read(limit + 1)
    return None if len(raw) > limit else raw


def current_umask() -> int:
    """The process's file-mode creation mask.

    Read from ``/proc/self/status`` where Linux gives it (no change to the process); elsewhere
    set and set back with :func:`os.umask`.
    """
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_umask(where: str | os.PathLike) -> None:
    """Raise ``ValueError`` if the umask takes any of the owner's permissions away.

    A run reads back and appends to the files it creates (``run.lock``, the ledger, the rows,
    the checkpoints) and creates files in the directories it makes. Thirty-seventh review of
    issue 15 (environment, finding 2): under ``umask 0444`` ``simulate toy.toml --out D`` (``D``
    empty) said ``out directory 'D' is not empty: it holds run.lock but no config.toml … choose
    another --out`` (the lock file it had just created, unreadable to it); under ``umask 0777``
    ``run.lock: Permission denied``, and left ``D`` created with mode ``000``; under ``0222`` a
    run's ledger could not be appended to after its header was written. ``where`` is named in
    the message.
    """
    mask = current_umask()
    if mask & 0o700:
        raise ValueError(
            f"the umask is {mask:04o}, which takes the owner's read, write or search permission "
            f"from the files and directories fedprivopt creates in {os.fspath(where)}, which it "
            "reads back and appends to: set a umask that keeps them (umask 022, or 077 to keep "
            "other users out) and try again"
        )


def real_path(path: str | os.PathLike) -> Path:
    """``path`` absolute, its links resolved where they can be (a loop: as written)."""
    try:
        return Path(path).absolute().resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symbolic-link loop (Python 3.11)
        return Path(os.path.abspath(path))


_URL = re.compile(r"\A([A-Za-z][A-Za-z0-9+.\-]*)://")


def url_scheme(text: str) -> str | None:
    """The scheme of ``text`` when it is written as a URL (``s3://b/x``: ``"s3"``), else ``None``.

    Forty-third review of issue 15 (input 5): ``--set task-params.data-dir=s3://bucket/so`` (an
    object store, as a cloud notebook names it) was taken as the relative directory
    ``./s3:/bucket/so``: a synthetic dataset generated there and trained on, rc 0; ``--out
    s3://bucket/run`` wrote the run into ``./s3:/bucket/run`` and said ``results in
    s3:/bucket/run``. Every path here is one of this machine; ``./s3://x`` names such a directory.
    """
    match = _URL.match(text)
    return match[1] if match else None


def url_refusal(name: str, value: object) -> str | None:
    """Why ``value``, given as the path ``name``, is refused when written as a URL; else ``None``.

    The one wording of :func:`url_scheme`'s refusal: the command line (``argument --out: ...``),
    the tasks' ``data_dir``/``cache_dir``, ``data.generate``, the Python ``simulate``/``resume``
    and the deployment's run config ``out`` say it alike.

    Follow-up of the forty-third review of issue 15 (outputs 4): a URL made a ``pathlib`` path
    (``simulate(config, Path("s3://b/r"))``, ``data.generate(Path("gs://b/d"), config)``, a
    task's ``data_dir=Path(...)``: ``Path`` writes ``s3:/b/r``, one slash) was taken as the
    relative directory ``./s3:/b/r``, rc 0, where the text is refused. A path whose first part
    is a scheme and its colon (``s3:``), with no such directory here, is refused alike.
    """
    from pathlib import PurePath

    from fedprivopt.core.text import shown

    scheme = url_scheme(value) if isinstance(value, str) else None
    if scheme is None and isinstance(value, PurePath) and len(value.parts) > 1:
        first = value.parts[0]
        if _SCHEME_PART.fullmatch(first) and not os.path.lexists(first):
            scheme = first[:-1]
    if scheme is None:
        return None
    return (
        f"{name} {shown(str(value))} is a URL ({scheme}://), not a path: fedprivopt reads and "
        "writes directories of this machine (mount the storage and name its path)"
    )


def refuse_url(name: str, value: object) -> None:
    """Raise ``ValueError`` with :func:`url_refusal`'s line when ``value`` (``name``) is a URL.

    Forty-sixth review of issue 15 (the follow-up's open row, outputs): the readers of data and
    runs (``read_word_counts``, ``open_split``, ``SQLiteSplit``, ``HDF5Split``,
    ``decompress_lzma``, ``load_runs``, ``load_run``) given ``'https://e.org/x'`` said
    ``https:/e.org/x: no such file`` (one slash, a path not typed), and would have read a local
    ``./https:/e.org/x``, where the commands refuse a URL.
    """
    refused = url_refusal(name, value)
    if refused is not None:
        raise ValueError(refused)


#: The first part of a ``pathlib`` path made of a URL: ``Path("s3://b/r").parts[0]`` is ``s3:``.
_SCHEME_PART = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]+:")  # two letters at least: not a drive
