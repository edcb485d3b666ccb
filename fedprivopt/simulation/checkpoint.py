"""Checkpoints of a run directory: written atomically, read back only when intact.

:func:`save_checkpoint` keeps the previous checkpoint beside the new one; :func:`load_checkpoint`
returns the newest one whose structure and SHA-256 digest (:func:`state_digest`) check out.
"""

from __future__ import annotations

import errno
import hashlib
import io
import logging
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fedprivopt.core.text import shown
from fedprivopt.models.task_calls import out_of_memory
from fedprivopt.simulation.divergence import checked_round
from fedprivopt.simulation.files import (
    CHECKPOINT,
    METRICS_FILE,
    PREVIOUS_CHECKPOINT,
    SUMMARY_FILE,
    check_regular,
    fsync_dir,
    json_line,
    temporary,
    write_synced,
)
from fedprivopt.simulation.ledger_lines import params_sha256

__all__ = [
    "RowsDigest",
    "check_checkpoint",
    "check_rows_digest",
    "checkpoints_beside",
    "finish_save",
    "load_checkpoint",
    "newest_checkpoint",
    "rows_problem",
    "save_checkpoint",
    "state_digest",
]

#: The key of a checkpoint and of ``summary.json`` holding the :class:`RowsDigest` of the metrics
#: rows written before it (absent in the files of earlier versions).
ROWS_DIGEST = "rows_sha256"
#: The key of a checkpoint holding a copy of the run's ledger header (absent in the checkpoints of
#: earlier versions): what a ledger rebuilt from the checkpoint is checked against (fortieth review
#: of issue 15, ledger 3).
LEDGER_HEADER = "ledger_header"


def save_checkpoint(
    out: Path,
    algorithm_state: dict[str, Any],
    rows: int,
    diverged: int | None = None,
    rows_sha256: str | None = None,
    ledger_header: dict[str, Any] | None = None,
) -> None:
    """Atomically replace the checkpoint of ``out``, keeping the previous one.

    Order (each step fsynced): (1) the new checkpoint, with a SHA-256 digest of its content, is
    written to a temporary file; (2) the current checkpoint becomes the previous one and the
    temporary file the current one (two renames). At every instant a complete checkpoint exists,
    and a torn or bit-flipped one is recognised by :func:`load_checkpoint`. ``rows`` is the number
    of metrics rows written so far; ``diverged``, the first round whose model or evaluation was
    not finite (:mod:`~fedprivopt.simulation.divergence`), is stored only when there is one, so
    that a resumed run's summary names the same round as an uninterrupted run's.
    ``rows_sha256``: the :class:`RowsDigest` of those rows, checked by
    :func:`check_rows_digest`. ``ledger_header``: a copy of the run's ledger header (its
    settings, task parameters and data identity), which a ledger rebuilt from this checkpoint
    is checked against (:meth:`~fedprivopt.simulation.ledger.RunLedger.check_recorded`).
    """
    ckpt = out / CHECKPOINT
    state: dict[str, Any] = {"algorithm": algorithm_state, "rows": rows}
    if diverged is not None:
        state["diverged"] = diverged
    if rows_sha256 is not None:
        state[ROWS_DIGEST] = rows_sha256
    if ledger_header is not None:
        state[LEDGER_HEADER] = dict(ledger_header)
    state["sha256"] = state_digest(state)
    buf = io.BytesIO()
    torch.save(state, buf)
    tmp = temporary(ckpt)
    write_synced(tmp, buf.getvalue())
    if ckpt.exists():
        _rotate(ckpt, out / PREVIOUS_CHECKPOINT)
    os.replace(tmp, ckpt)
    fsync_dir(out)


def finish_save(out: Path, entries: Sequence[Any]) -> bool:
    """Finish a save of ``out`` stopped after its ``checkpoint.pt.tmp`` was written.

    Called under the run's lock before a resume reads its checkpoints. A ``checkpoint.pt.tmp``
    that is a regular file, passes :func:`check_checkpoint`, is of a later round than the newest
    readable checkpoint, and holds the model of the last release of its round that the ledger
    ``entries`` record (its ``params_sha256``) is put in ``checkpoint.pt``'s place as
    :func:`save_checkpoint` would have (the readable ``checkpoint.pt`` rotated, an unreadable one
    set aside as ``checkpoint.pt.bad``); returns whether it was. Anything else is left for
    :func:`~fedprivopt.simulation.files.temporary` to remove, as before.

    Forty-seventh review of issue 15 (ledger 3, open; follow-up ledger 1): a secure run stopped
    between the two renames of round 3's save (a kill, a power loss) or at a failed first rename
    (``EIO``), then ``simulate --resume R``: the complete checkpoint of round 3 was ignored and
    removed, and the run went on from round 2, releasing round 3 again with new noise.

    Raises
    ------
    ValueError
        When this process may not read the file (:data:`NOT_ITS_CONTENT`): its content may be
        the round's checkpoint.
    """
    tmp = out / (CHECKPOINT + ".tmp")
    try:
        if not stat.S_ISREG(os.lstat(tmp).st_mode):  # a link or a FIFO: never read
            return False
    except FileNotFoundError:
        return False
    why = (
        "; it may hold the checkpoint of a round whose save was stopped (without it the round "
        "would be released again): "
    )
    state, _ = _read_checked(tmp, why)
    if state is None:  # torn: the save was stopped while writing it
        return False
    done = state["algorithm"]["round"]
    current, name = newest_checkpoint(out, {})
    have = 0 if current is None else current["algorithm"]["round"]
    if not (type(done) is int and type(have) is int and have < done):  # not a later round
        return False
    ends = [e for e in entries if e.round == done and e.kind == "round"]
    if not ends or ends[-1].params_sha256 != params_sha256(state["algorithm"]["params"]):
        return False  # not the release the ledger records last for its round
    ckpt = out / CHECKPOINT
    if name == CHECKPOINT:
        _rotate(ckpt, out / PREVIOUS_CHECKPOINT)
    elif os.path.lexists(ckpt):  # unreadable: set aside, as a resume does
        os.replace(ckpt, out / (CHECKPOINT + ".bad"))
    os.replace(tmp, ckpt)
    fsync_dir(out)
    logging.getLogger(__name__).warning(
        "finished the save of round %d's checkpoint stopped at %s", done, tmp
    )
    return True


def checkpoints_beside(out: Path, name: str | None) -> dict[str, int]:
    """The rounds of the intact checkpoints of ``out`` other than ``name`` (the one restored).

    ``checkpoint.pt``, ``checkpoint.prev.pt`` and a regular ``checkpoint.pt.tmp`` that pass
    :func:`check_checkpoint`; one that is torn, or that this process may not read, is left out
    (it says nothing of what was released).

    Forty-eighth review of issue 15 (ledger 2): a secure run's files of an older copy (a backup
    taken after its first round, holding ``checkpoint.pt`` alone) put back over the run after
    it had released 3 rounds (``cp -a B/. R/``, or ``rsync`` without ``--delete``) left the
    newer ``checkpoint.prev.pt`` of round 2 beside them; ``--resume`` read only
    ``checkpoint.pt``, released rounds 2 and 3 again with new noise and overwrote the newer
    checkpoint, charging 4 rounds (epsilon 13.71) for 6 releases (16.29).
    """
    rounds: dict[str, int] = {}
    for other in (CHECKPOINT, PREVIOUS_CHECKPOINT, CHECKPOINT + ".tmp"):
        path = out / other
        try:
            # a checkpoint may be a link (to another disk); the temporary file never is
            regular = stat.S_ISREG(
                (path.lstat() if other.endswith(".tmp") else path.stat()).st_mode
            )
            if other == name or not regular:
                continue
            state, _ = _read_checked(path, "")
        except (OSError, ValueError):  # not there, or not readable by this process
            continue
        done = None if state is None else state["algorithm"]["round"]
        if type(done) is int:
            rounds[other] = done
    return rounds


def _rotate(ckpt: Path, previous: Path) -> None:
    """Make the current checkpoint ``ckpt`` the previous one (``previous``).

    A ``ckpt`` that is a symbolic link to ``previous`` is removed, not renamed: ``previous``
    already holds that checkpoint. Forty-sixth review of issue 15 (ledger, finding 2): a run
    whose ``checkpoint.pt`` was made a link to ``checkpoint.prev.pt`` (``ln -s
    checkpoint.prev.pt checkpoint.pt``, to go on from the previous checkpoint), resumed: the
    rename put the link in the previous checkpoint's place, a link to itself, and the file
    was lost; ``load_run`` then raised ``OSError: Too many levels of symbolic links`` (a
    traceback) and every later ``--resume`` was refused.
    """
    try:
        linked = ckpt.is_symlink() and os.path.samefile(ckpt, previous)
    except OSError:  # no previous checkpoint (or none that can be followed)
        linked = False
    if linked:
        ckpt.unlink()
    else:
        os.replace(ckpt, previous)


def state_digest(state: dict[str, Any]) -> str:
    """SHA-256 over a canonical walk of a checkpoint (its ``sha256`` entry excluded).

    Tensors contribute dtype, shape and raw bytes; dicts their sorted keys; other leaves their
    ``repr`` (exact for floats). ``torch.load`` does not check the zip CRCs, so a flipped bit in a
    tensor would otherwise load silently.
    """
    h = hashlib.sha256()

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(x, dict):
            h.update(f"D{len(x)}".encode())
            for key in sorted(x, key=repr):
                h.update(repr(key).encode())
                walk(x[key])
        elif isinstance(x, (list, tuple)):
            h.update(f"L{len(x)}".encode())
            for item in x:
                walk(item)
        else:
            h.update(f"S{x!r}".encode())

    walk({k: v for k, v in state.items() if k != "sha256"})
    return h.hexdigest()


def check_checkpoint(state: Any) -> None:
    """Raise ``ValueError`` unless ``state`` has a checkpoint's structure and matches its digest."""
    if not isinstance(state, dict) or not isinstance(state.get("algorithm"), dict):
        raise ValueError("not a fedprivopt checkpoint (no 'algorithm' state)")
    missing = {"round", "params", "accountant", "config"} - set(state["algorithm"])
    if missing:
        raise ValueError(f"algorithm state lacks {sorted(missing)}")
    rows = state.get("rows", 0)  # absent in a checkpoint of an earlier version
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        # twenty-seventh review of issue 15: "4", NaN, None or -1 (digest recomputed) skipped
        # the check of the rows kept as "an earlier version" (a stale final row was reported)
        raise ValueError(f"rows must be an integer >= 0, got {shown(rows)}")
    if "diverged" in state:
        rounds = state["algorithm"]["round"]
        if checked_round(state["diverged"], rounds if isinstance(rounds, int) else None) is None:
            got = shown(state["diverged"])
            raise ValueError(f"diverged must be a round in [1, {shown(rounds)}], got {got}")
    if ROWS_DIGEST in state and not _is_hex_digest(state[ROWS_DIGEST]):
        got = shown(state[ROWS_DIGEST])
        raise ValueError(f"{ROWS_DIGEST} must be a SHA-256 hex digest, got {got}")
    if LEDGER_HEADER in state and not isinstance(state[LEDGER_HEADER], dict):
        got = shown(state[LEDGER_HEADER])
        raise ValueError(f"{LEDGER_HEADER} must be a mapping (a ledger header), got {got}")
    if "sha256" in state and state["sha256"] != state_digest(state):
        raise ValueError("content does not match its SHA-256 digest")


def _is_hex_digest(value: object) -> bool:
    """Whether ``value`` is a SHA-256 digest as ``hexdigest()`` writes it."""
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


class RowsDigest:
    """SHA-256 of a run's metrics rows (each as :func:`json_line` writes it), kept as they grow.

    A row's ``seconds`` (its timing) is left out: the rows of two runs of one configuration
    and seed bind alike, as their results are alike.

    Thirty-ninth review of issue 15 (reports, open; outputs follow-up 1): ``compare toy.toml
    --strategies dp-fedavg --seeds 2 --rounds 2``, then seed 0's ``metrics.jsonl`` copied over
    seed 1's, then the same ``compare``: both cells reused, rc 0, seed 0's results reported as
    two seeds (``0.6133 ± 0.0``; the true pair ``0.6117 ± 0.0024``). A checkpoint kept only the
    rows' count; now it and ``summary.json`` keep their digest (:func:`check_rows_digest`).
    """

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._count = 0

    def of(self, rows: Sequence[Mapping[str, Any]]) -> str:
        """The digest of ``rows``, the rows given before plus any appended since."""
        if len(rows) < self._count:  # not grown from the rows hashed: start again
            self.__init__()
        for row in rows[self._count :]:
            results = {k: v for k, v in row.items() if k != "seconds"}  # not the timing
            self._hash.update(json_line(results).encode("utf-8"))
        self._count = len(rows)
        return self._hash.hexdigest()


def check_rows_digest(
    out: Path,
    rows: Sequence[Mapping[str, Any]],
    state: Mapping[str, Any] | None,
    name: str | None,
    summary: Mapping[str, Any] | None = None,
) -> None:
    """Refuse metrics rows that are not the ones the checkpoint or the summary was written after.

    See :func:`rows_problem`, whose text the error gives (a report notes it instead).

    Raises
    ------
    ValueError
        Naming ``metrics.jsonl`` and the file whose digest it does not match.
    """
    problem = rows_problem(out, rows, state, name, summary)
    if problem is not None:
        raise ValueError(
            f"{problem}; restore {METRICS_FILE} or start a new run in another directory"
        )


def rows_problem(
    out: Path,
    rows: Sequence[Mapping[str, Any]],
    state: Mapping[str, Any] | None,
    name: str | None,
    summary: Mapping[str, Any] | None = None,
) -> str | None:
    """Why ``rows`` are not those the checkpoint or the summary was written after (else ``None``).

    ``rows`` are taken one a round in round order (the last of a round written twice).
    ``state``: checkpoint ``name`` of ``out``; its first ``rows`` rows must have its digest (a
    file holding fewer, as a crash may leave, is the count check's matter). ``summary``: its
    digest is of every row. Files of earlier versions hold no digest and are not checked.
    """
    # one row a round in round order, a round written twice keeping its last row, as a resume
    # rewrites them and reports read them (twenty-seventh review: reordered or repeated rows)
    rows = list({row["round"]: row for row in sorted(rows, key=lambda r: r["round"])}.values())
    checks = []
    if state is not None and _is_hex_digest(state.get(ROWS_DIGEST)):
        count = state.get("rows")
        if isinstance(count, int) and not isinstance(count, bool) and len(rows) >= count:
            checks.append((name, rows[:count], state[ROWS_DIGEST], f"its first {count} rows"))
    if summary is not None and ROWS_DIGEST in summary:
        if not _is_hex_digest(summary[ROWS_DIGEST]):
            got = shown(summary[ROWS_DIGEST])
            return (f"{out / SUMMARY_FILE}: {ROWS_DIGEST} must be a SHA-256 hex digest, got "
                    f"{got} (the file was edited)")  # fmt: skip
        checks.append((SUMMARY_FILE, rows, summary[ROWS_DIGEST], f"its {len(rows)} rows"))
    for written, kept, digest, which in checks:
        if RowsDigest().of(kept) != digest:
            return (
                f"{out / METRICS_FILE}: {which} are not the rows {written} was written after "
                "(their SHA-256 differs): the file was replaced or edited, and another run's or "
                "edited results would be reported as this run's"
            )
    return None


def load_checkpoint(out: Path) -> dict[str, Any] | None:
    """The newest readable checkpoint of ``out`` (falls back to the previous one).

    A checkpoint is unreadable when ``torch.load`` fails (torn, truncated), when it is not a
    checkpoint's structure, or when its content does not match the SHA-256 digest stored in it
    (a bit flip; checkpoints written before digests existed are accepted without one). Returns
    ``None`` when no checkpoint is readable; :func:`~fedprivopt.simulation.run.resume` decides
    whether that is an error.
    """
    return newest_checkpoint(out)[0]


def newest_checkpoint(
    out: Path, problems: dict[str, str] | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """:func:`load_checkpoint` and the name of the file it read.

    Each checkpoint file that exists but is unreadable is logged as a warning, or, with
    ``problems``, recorded there (file name: reason) for the caller to report.

    Raises
    ------
    ValueError
        Naming the file, when this process may not read it (:data:`NOT_ITS_CONTENT`): its
        content may be intact, so the previous checkpoint is not used in its place. Also for a
        checkpoint that is a FIFO, device or socket (``files.check_regular``), which is never
        opened: forty-fourth review of issue 15 (ledger, finding 1), ``compare-tuned T`` of a
        tuning one of whose trials' ``checkpoint.pt`` was a FIFO blocked for ever in
        ``torch.load`` (the trial's ledger checked against the checkpoint's accountant), where
        ``--resume``, ``compare`` and reports refuse it.
    MemoryError
        When loading it needs more memory than the process may take. Torch's CPU allocator
        says so with a ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory"), raised
        as it is (``task_calls.out_of_memory``): forty-seventh review of issue 15 (ledger,
        finding 1), a secure run's intact ``checkpoint.pt`` whose load met that error (memory
        another process held a moment) was taken for a torn one and set aside as
        ``checkpoint.pt.bad``; ``--resume`` went on from ``checkpoint.prev.pt`` and released
        round 3 again with new noise (rc 0, epsilon 15.03 where the intact checkpoint resumes
        at 13.70).

    A checkpoint that is a symbolic link to nothing (its target removed or not mounted) or a
    link loop is refused alike (:func:`_refuse_dangling`): forty-sixth review of issue 15.
    """
    for name in (CHECKPOINT, PREVIOUS_CHECKPOINT):
        path = out / name
        if not path.exists():
            _refuse_dangling(path)
            continue
        check_regular(path)  # a FIFO would block the reader for ever (forty-fourth review)
        why = (
            ", which says nothing of its content: the previous checkpoint was not used in its "
            "place (a secure run would redo released rounds with new noise); "
        )
        state, torn = _read_checked(path, why)
        if state is not None:
            return state, name
        _unreadable(path, name, torn, problems)  # a torn or corrupt file: try the previous one
    return None, None


def _read_checked(path: Path, why: str) -> tuple[dict | None, Exception | None]:
    """``path`` loaded and checked (:func:`check_checkpoint`), or ``(None, error)`` when torn.

    Raises ``ValueError`` (its line ends ``why`` and the remedy) when this process may not read
    the file (:data:`NOT_ITS_CONTENT`), which says nothing of its content; running out of memory
    (``MemoryError``, torch's allocator's ``RuntimeError``) is raised as it is.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        check_checkpoint(state)
        return state, None
    except OSError as exc:
        if _not_its_content(exc):
            remedy = _REMEDY.get(exc.errno, _STORAGE)
            raise ValueError(
                f"{path}: cannot be read ({exc.strerror}){why}{remedy} and try again"
            ) from None
        return None, exc
    except MemoryError:  # not the file's fault either (ulimit -v)
        raise
    except Exception as exc:  # a torn or corrupt file
        if out_of_memory(exc):  # torch's allocator: a RuntimeError (forty-seventh review)
            raise
        return None, exc


#: errnos of a checkpoint this process may not read, however intact it is: its permissions, and
#: the limits of open files and memory. Thirty-seventh review of issue 15 (environment, finding
#: 1): a secure run's ``checkpoint.pt`` that its user could not read (``chmod 000``, a directory
#: restored by another account) was taken for a damaged one: ``--resume`` went on from
#: ``checkpoint.prev.pt`` and released round 2 again with new noise, rc 0, ε 15.03 where the
#: intact checkpoint resumes at 13.70. Forty-sixth review (ledger, finding 3): a read that fails
#: in the storage (``EIO``: a failing disk, a file server that did not answer; ``ESTALE`` and
#: ``ETIMEDOUT`` of a network file system) was taken for a damaged file alike, and round 3 was
#: released again (25.92 where 22.40); another read may succeed (the other run files' readers
#: refuse such a read, naming the file).
NOT_ITS_CONTENT = frozenset({errno.EACCES, errno.EPERM, errno.EMFILE, errno.ENFILE, errno.ENOMEM,
                             errno.EIO, errno.ESTALE, errno.ETIMEDOUT})  # fmt: skip
_STORAGE = "check the disk or file server it is on (or copy it back from a backup)"
_REMEDY = {
    errno.EIO: _STORAGE,
    errno.ESTALE: _STORAGE,
    errno.ETIMEDOUT: _STORAGE,
    errno.EACCES: "give this user read access to it",
    errno.EPERM: "give this user read access to it",
    errno.EMFILE: "raise the limit of open files (ulimit -n)",
    errno.ENFILE: "close other programs' files (the system's limit of open files)",
    errno.ENOMEM: "free memory or raise the limit of memory (ulimit -v)",
}


def _not_its_content(exc: OSError) -> bool:
    """Whether reading a checkpoint failed for a reason that says nothing of its content.

    :data:`NOT_ITS_CONTENT`, and every other errno but ``ENOENT`` (the file removed meanwhile):
    a torn or corrupt checkpoint makes ``torch.load`` raise ``RuntimeError``, ``EOFError`` or
    an unpickling error, never an ``OSError`` with an errno. Forty-eighth review of issue 15
    (ledger 1): a read failing with an errno outside that set (``ENOTCONN`` of a FUSE mount
    such as sshfs or s3fs whose daemon stopped, ``ECONNRESET`` or ``EHOSTDOWN`` of an SMB
    share, ``EREMOTEIO``, ``EKEYEXPIRED`` of a Kerberos ticket, ``ENOKEY``, ``ENXIO`` and
    ``ENODEV`` of a removed disk, ``EINVAL``) was taken for a torn file: a secure run's
    ``--resume`` set its intact ``checkpoint.pt`` aside and released round 3 again with new
    noise (rc 0, epsilon 15.03 where the intact checkpoint resumes at 13.70).
    """
    return exc.errno in NOT_ITS_CONTENT or (exc.errno is not None and exc.errno != errno.ENOENT)


def _refuse_dangling(path: Path) -> None:
    """Refuse checkpoint ``path`` that is a symbolic link which cannot be followed.

    Forty-sixth review of issue 15 (ledger, finding 1): a secure run's ``checkpoint.pt`` moved
    to another disk and linked back (``ln -s /mnt/big/R/checkpoint.pt R/checkpoint.pt``), that
    disk then not mounted, ``simulate --resume R`` with one more round: the link was taken for
    no checkpoint at all, without a word, and the run went on from ``checkpoint.prev.pt``,
    releasing round 3 again with new noise (rc 0, epsilon 25.92 where the intact checkpoint
    resumes at 22.40). A link says nothing of its target's content, as an unreadable file
    does not (:data:`NOT_ITS_CONTENT`).

    Forty-sixth review follow-up (ledger 3): the advice to remove the link and continue from
    the previous checkpoint was given also where there is none (a run of one checkpoint, or
    ``checkpoint.prev.pt`` itself the link beside a torn ``checkpoint.pt``), and following it
    ended in the refusal of a run that released rounds and has no readable checkpoint.

    Raises
    ------
    ValueError
        Naming ``path`` and the link's target.
    """
    if not os.path.islink(path):
        return
    try:
        target = os.readlink(path)
    except OSError:  # removed meanwhile
        return
    what = (
        f"{path}: a symbolic link to {target!r} that cannot be followed (its target does not "
        "exist, or the links loop), which says nothing of the checkpoint's content"
    )
    if path.name == CHECKPOINT and (path.parent / PREVIOUS_CHECKPOINT).exists():
        raise ValueError(
            f"{what}: the previous checkpoint was not used in its place (a secure run would "
            "redo released rounds with new noise); put its target back (mount its disk) and try "
            "again, or remove the link to continue from the previous checkpoint"
        )
    raise ValueError(
        f"{what}, and the run has no other readable checkpoint to continue from; put its target "
        "back (mount its disk) and try again"
    )


def _unreadable(path: Path, name: str, exc: Exception, problems: dict[str, str] | None) -> None:
    """Log ``path``'s failure as a warning, or record it in ``problems``."""
    if problems is None:
        logging.getLogger(__name__).warning("checkpoint %s is unreadable (%s)", path, exc)
    else:
        problems[name] = str(exc)
