"""A run directory: one writer at a time, never over someone else's files.

Two rules, for a user who may edit any file of their own run directory:

* **One writer.** A run (fresh or ``--resume``) holds an exclusive ``flock`` on the directory
  itself for its whole duration (:func:`lock_run_dir`), so deleting or replacing a file cannot
  release it; ``run.lock`` in the directory holds the holder's PID, and a second process is
  refused with a ``ValueError`` naming it.
* **Never overwrite.** A fresh run writes only into a new or empty directory, or over a run of its
  own when asked to (``overwrite``); anything else is refused before a byte is written. A start
  that fails before its first released round removes what it created, and nothing else
  (:class:`NewRunDir`); its privacy ledger tells whether a round was released.

The privacy ledger itself (``privacy_ledger.jsonl``, the truth about what was released):
:mod:`fedprivopt.simulation.ledger`.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from fedprivopt.core.checks import check_flag
from fedprivopt.core.files import check_umask, on_read_only_fs
from fedprivopt.data.locks import LockHeldError, exclusive_lock, probe_lock, unlockable
from fedprivopt.simulation.files import (
    CHECKPOINT,
    CONFIG_FILE,
    LEDGER_FILE,
    LOCK_FILE,
    METRICS_FILE,
    PREVIOUS_CHECKPOINT,
    SUMMARY_FILE,
)
from fedprivopt.simulation.ledger import OLD_LEDGER_SUFFIX, RunLedger

__all__ = [
    "DIRECTORY_LOCKS",
    "NewRunDir",
    "check_claimable",
    "check_held",
    "check_output_held",
    "lock_directory",
    "lock_run_dir",
    "our_lock_file",
    "reading_lock",
    "remove_run_files",
    "removed_if_unused",
    "still_held",
]

RUN_FILES = (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, CHECKPOINT, PREVIOUS_CHECKPOINT, LEDGER_FILE)
_PARTIAL = (CONFIG_FILE + ".tmp", SUMMARY_FILE + ".tmp", METRICS_FILE + ".tmp",
            CHECKPOINT + ".tmp", CHECKPOINT + ".bad", LEDGER_FILE + ".tmp",
            LEDGER_FILE + OLD_LEDGER_SUFFIX + ".tmp")  # fmt: skip
_OURS = frozenset((*RUN_FILES, *_PARTIAL, LOCK_FILE, LEDGER_FILE + OLD_LEDGER_SUFFIX))
EVENTS_PREFIX = "events.out.tfevents."
"""TensorBoard's event files (``tensorboard = true``): part of a run, removed with it."""


def _ours(name: str) -> bool:
    return name in _OURS or (name.startswith(EVENTS_PREFIX) and "/" not in name)


def _is_directory(path: Path) -> bool:
    """Whether ``path`` is a directory itself (not a link to one)."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def our_lock_file(path: Path) -> bool:
    """Whether ``path`` may be a lock file of ours: empty or a PID (a link is judged by its lock).

    Twenty-seventh review of issue 15: a directory holding only a user's ``run.lock`` (their own
    notes, 17 bytes) was taken for the debris of a killed start, and the run emptied the file.
    Also ``deploy local``'s check of its ``OUT/deploy/deploy.lock``.
    """
    try:
        if not path.is_file() or path.is_symlink():
            return True  # a link, FIFO or directory: refused by the lock itself, naming it
        with open(path, "rb") as f:
            text = f.read(33)
    except OSError:
        return False
    return len(text) <= 32 and (not text.strip() or text.strip().isdigit())


def _debris(out: Path, names: list[str]) -> set[str]:
    """The names in ``names`` that a start killed before ``config.toml`` leaves in ``out``.

    ``run.lock`` holding nothing or a PID, and ``config.toml.tmp`` beside such a lock (a start
    takes its lock before it writes ``config.toml``); a file of these names with anything else
    in it is a user's, and the directory is not empty.
    """
    lock = LOCK_FILE in names and our_lock_file(out / LOCK_FILE)
    found = {LOCK_FILE} if lock else set()
    if lock and CONFIG_FILE + ".tmp" in names:
        found.add(CONFIG_FILE + ".tmp")
    return found


# -- one writer -----------------------------------------------------------------------------------

_HELD: dict[str, int] = {}
"""The directories this process holds (absolute path: the locked descriptor), for check_held."""


def still_held(out: str | os.PathLike) -> bool:
    """Whether ``out`` names the directory this process locked as ``out`` (and still holds).

    ``False`` for a directory this process does not hold, and for one moved or replaced since
    it was locked: what is found at the path then belongs to someone else.
    """
    fd = _HELD.get(os.path.abspath(out))
    if fd is None:
        return False
    try:
        return os.path.samestat(os.fstat(fd), os.stat(out))
    except OSError:
        return False


def check_held(out: str | os.PathLike) -> None:
    """Raise ``ValueError`` if ``out``, locked by this process, is no longer the directory locked.

    Called before every round is recorded and before the summary
    (:class:`~fedprivopt.simulation.writer.RunWriter`): a directory moved or replaced while its
    holder runs (``mv DIR DIR.old; cp -r DIR.old DIR``) is a new directory a second process can
    lock, while the holder, which writes by path, would write into it too. Directories this
    process does not hold are not checked.
    """
    if os.path.abspath(out) not in _HELD:
        return
    if not still_held(out):
        raise ValueError(
            f"run directory {str(out)!r} was moved or replaced while this run held it; stopped "
            "before releasing another round (resume the directory that holds this run's files)"
        )


def check_output_held(out: str | os.PathLike, what: str) -> None:
    """:func:`check_held` for ``compare``'s and ``tune``'s directory (``what`` names it).

    Forty-fourth review follow-up of issue 15 (ledger, open for the lead): ``tune … --out TM``
    whose ``TM`` was moved and a new ``TM`` made while it ran wrote its ``summary.json`` and
    report into the new one (rc 0, "no trial released"), its trial left in the moved one;
    ``compare`` made its next cell's whole run in the new directory. Called before each cell or
    trial and before the outputs: ``ValueError``, nothing written there.
    """
    if os.path.abspath(out) in _HELD and not still_held(out):
        raise ValueError(
            f"{what} {str(out)!r} was moved or replaced while this call held it; stopped before "
            "writing into what is there now (run the same command on the directory that now "
            "holds its runs)"
        )


def _detach_hard_link(path: Path) -> None:
    """Remove lock file ``path`` if it is a regular file with other hard links.

    The caller holds its directory's lock, so the name is its own to replace.

    Thirty-first review of issue 15: a run copied with ``cp -al A B`` (as snapshot backups make)
    shares ``run.lock``'s inode with ``A``, whose ``flock`` is the inode's: ``--resume B`` was
    refused as "in use by process N" while ``A`` ran (and ``A`` while ``B`` ran), and each wrote
    its PID into the other's file. A symbolic link or special file is left for
    :func:`~fedprivopt.data.locks.exclusive_lock` to refuse, naming it.
    """
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        path.unlink()


DIRECTORY_LOCKS = ("run.lock", "compare.lock", "tune.lock", "deploy.lock")
"""The PID files of the commands that lock a directory (simulate, compare, tune, deploy local).

:func:`lock_directory` refused by a holder reads each for its PID (the constants live with
their commands, above this module: ``files.LOCK_FILE``, ``cells.COMPARE_LOCK``,
``tune_dir.TUNE_LOCK``, ``deploy.local_checks.DEPLOY_LOCK``; a test keeps them equal)."""


@contextlib.contextmanager
def lock_directory(out: str | os.PathLike, pid_file: str, *, what: str) -> Iterator[Path]:
    """Hold an exclusive lock on directory ``out`` (it must exist) for the ``with`` block.

    The lock is a ``flock`` on the directory itself (a descriptor opened on it), which no file
    operation inside it can take away: a lock on a file alone was bypassed by deleting the file
    while its holder ran (issue 15), as the next process then locked a new file of the same name.
    The holder's PID is kept in ``out/pid_file`` (also ``flock``-ed, see
    :func:`~fedprivopt.data.locks.exclusive_lock`) for the message a second process gets.

    Raises
    ------
    LockHeldError
        (a ``ValueError``) when another process, or another claim in this one, holds the
        directory; the message names ``what`` and the holder's PID when its file still says it.
    """
    out = Path(out)
    check_umask(out)  # before anything is created there (thirty-seventh review, environment 2)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the file lock alone
        with exclusive_lock(out / pid_file, what=what) as path:
            yield path
        return
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        reader = _held_shared(fd)
        os.close(fd)
        probe_lock(out / pid_file, what=what)  # raises naming the holder's PID; writes nothing
        for other in DIRECTORY_LOCKS:
            # forty-third review of issue 15 (lead 3; the processes reviewer's open row):
            # compare and tune started on one new directory at once; the loser said its own
            # lock file "was removed or replaced" where the holder was the other command's
            if other != pid_file:
                probe_lock(out / other, what=what)
        if reader:
            # follow-up of the thirty-eighth review of issue 15 (rundirs 3): a reader through a
            # read-only mount (_viewing_lock) was reported as a lock file removed or replaced
            raise LockHeldError(
                f"{what} is being read by another process through a read-only mount (which "
                "keeps no PID); wait for it to finish or stop it first",
                None,
            ) from None
        raise LockHeldError(
            f"{what} is in use by another process (its lock file {pid_file} was removed or "
            "replaced, so its PID is unknown); wait for it to finish or stop it first",
            None,
        ) from None
    except OSError as exc:  # a file system that keeps no locks (NFS without its lock service)
        os.close(fd)
        raise unlockable(out, exc) from None
    except BaseException:
        os.close(fd)
        raise
    key = os.path.abspath(out)
    try:
        _detach_hard_link(out / pid_file)
        with exclusive_lock(out / pid_file, what=what, share=False) as path:
            _HELD[key] = fd
            check_held(out)  # replaced between the open and the lock: the lock is not out's
            yield path
    finally:
        _HELD.pop(key, None)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _held_shared(fd: int) -> bool:
    """Whether directory ``fd``, refused an exclusive lock, is held by readers only.

    Only :func:`_viewing_lock` takes a shared lock; the one taken here is let go at once.
    """
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def lock_run_dir(out: str | os.PathLike):
    """Context manager holding the exclusive lock of run directory ``out`` (it must exist).

    Raises ``ValueError`` naming the holder's PID when another process (or another open of it in
    this process) holds it (:func:`lock_directory`; the PID is kept in ``run.lock``).
    """
    out = Path(out)
    return lock_directory(out, LOCK_FILE, what=f"run directory {str(out)!r}")


@contextlib.contextmanager
def reading_lock(out: str | os.PathLike) -> Iterator[Path]:
    """:func:`lock_run_dir` for a reader, or no lock on a read-only file system.

    No process can write a run on a file system mounted read-only, and the lock cannot be taken
    there (``run.lock`` is opened for writing). Sixteenth review of issue 15: ``compare-tuned``
    of a tuning on a read-only disk scored every trial as failed and said ``its best trial
    'trial-001' is not the one its runs select (none …); the tuning's files were edited``.
    """
    out = Path(out)
    if on_read_only_fs(out):
        with _viewing_lock(out):
            yield out
        return
    with lock_run_dir(out):
        yield out


@contextlib.contextmanager
def _viewing_lock(out: Path) -> Iterator[None]:
    """A shared ``flock`` on run directory ``out`` on a read-only mount, refused while written.

    Thirty-eighth review of issue 15 (rundirs 4): a read-only view of a directory another mount
    writes (``mount --bind -o ro``, a results volume mounted read-only into a container) was
    read without a lock: ``compare-tuned`` of the view reported a tuning whose best trial
    another process held (``--resume`` of it; rc 2 ``in use by process N`` through the writable
    path), rc 0. ``run.lock`` cannot be opened for writing there, but the directory can be
    locked: the writer's exclusive lock is the same inode's. Where the file system keeps no
    locks, nothing is locked (as before).
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _pid_in(out / LOCK_FILE)
            holder = f"process {pid}" if pid is not None else "another process (PID unknown)"
            raise LockHeldError(
                f"run directory {str(out)!r} is in use by {holder} (lock file {out / LOCK_FILE}, "
                "seen through a read-only mount); wait for it to finish or stop it first",
                pid,
            ) from None
        except OSError:  # no locks on this file system
            pass
        yield
    finally:
        os.close(fd)


def _pid_in(path: Path) -> int | None:
    """The PID lock file ``path`` holds, read without waiting (``None``: none, or not a file).

    Follow-up of the thirty-eighth review of issue 15 (rundirs 5): a running trial's
    ``run.lock`` replaced by a FIFO (``rm run.lock; mkfifo run.lock``) made ``compare-tuned``
    through a read-only mount wait for ever reading it (the writable path refuses it by name).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, 32).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(text) if text.isdigit() else None


# -- never overwrite -------------------------------------------------------------------------------


def _listing(out: Path, allowed: Iterable[str]) -> list[str]:
    return sorted(set(os.listdir(out)) - set(allowed))


def _check_claimable(
    out: Path, *, overwrite: bool, allowed: Iterable[str], resume: str | None = None
) -> None:
    """Raise unless a fresh run may write into ``out`` (see :class:`NewRunDir`).

    Forty-sixth review of issue 15 (flags 2): ``overwrite`` was read by its truth, so the
    Python API's ``simulate(config, out, overwrite="False")`` (a flag read from an environment
    variable or a text file) replaced the finished run in ``out``, its ledger of released
    rounds with it, where ``overwrite=False`` refuses. Only a bool (NumPy's too) is taken.
    """
    check_flag("overwrite", overwrite)
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"out directory {str(out)!r} exists and is not a directory")
    names = _listing(out, allowed)
    debris = _debris(out, names)
    names = [n for n in names if n not in debris]
    if not names:
        return
    # a directory under a run file's name is not one (thirty-eighth review of issue 15,
    # rundirs 3): `summary.json/` holding a user's file made overwrite remove config.toml and
    # metrics.jsonl, then fail on it, leaving half a run
    names = [n + "/" if _ours(n) and _is_directory(out / n) else n for n in names]
    ours = CONFIG_FILE in names and all(_ours(n) for n in names)
    if ours and overwrite:
        _check_recognisable(out, names)
        return
    if ours:
        raise ValueError(
            f"out directory {str(out)!r} already holds a run (use "
            f"{resume or f'--resume {out}'} to continue it, or choose another --out)"
        )
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    foreign = [n for n in names if not _ours(n)]
    why = (
        f"it holds files that are not part of a fedprivopt run ({', '.join(foreign[:5])})"
        if foreign
        else f"it holds {shown} but no {CONFIG_FILE}, so it is not recognisably a run"
    )
    raise ValueError(
        f"out directory {str(out)!r} is not empty: {why}; a run is written only into a new or "
        "empty directory (or over a run of its own with overwrite); choose another --out"
    )


def _check_recognisable(out: Path, names: list[str]) -> None:
    """Refuse to overwrite ``out`` unless it holds a ledger or a ``config.toml`` of ours.

    Forty-eighth review of issue 15 (overwrite 1): file names alone made a directory a run, so
    the Python API's ``simulate(config, out, overwrite=True)`` over another tool's run
    directory (its own ``config.toml``, ``metrics.jsonl`` and ``checkpoint.pt``) removed all
    three and wrote a run there. A run of ours has a privacy ledger (a name no other tool
    writes; a removal of ours stopped midway keeps it, :func:`remove_run_files`) or a
    ``config.toml`` that :func:`~fedprivopt.simulation.config.load_config` reads (a start
    stopped before its ledger); a file that could hang the read (a FIFO) is not read.
    """
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.files import SMALL_FILE_LIMIT, check_config_not_empty, check_regular

    if any((out / name).is_file() for name in (LEDGER_FILE, LEDGER_FILE + OLD_LEDGER_SUFFIX)):
        return
    try:
        check_regular(out / CONFIG_FILE, limit=SMALL_FILE_LIMIT)
        check_config_not_empty(out / CONFIG_FILE)
        load_config(out / CONFIG_FILE)
        return
    except (ValueError, OSError, RecursionError):
        pass
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    raise ValueError(
        f"out directory {str(out)!r} holds {shown} but neither a privacy ledger nor a "
        f"{CONFIG_FILE} that fedprivopt reads, so it is not recognisably a run of ours and "
        "overwrite does not replace it: remove it yourself, or choose another --out"
    )


def check_claimable(
    out: str | Path,
    *,
    overwrite: bool = False,
    allowed: Iterable[str] = (),
    resume: str | None = None,
) -> None:
    """Raise ``ValueError`` unless a fresh run may write into ``out``, as :class:`NewRunDir`.

    For a caller that must refuse before it creates anything (``deploy local`` writes its logs
    and starts processes before its ServerApp claims the directory); the claim itself checks
    again under its lock. ``resume``: the command that continues a run found there, when it
    is not the caller's own ``--resume`` (``deploy local`` has none).
    """
    _check_claimable(Path(out), overwrite=overwrite, allowed=allowed, resume=resume)


@contextlib.contextmanager
def removed_if_unused(out: str | Path, lock: str) -> Iterator[Path]:
    """For a comparison or tuning directory ``out`` the block creates: gone again on failure.

    If ``out`` did not exist and the block fails or is interrupted while ``out`` still holds
    nothing but an empty ``runs/`` and the lock file ``lock``, those are removed and ``out``
    with them. Twenty-third review of issue 15: a ``compare`` or ``tune`` refused after it had
    created its ``--out`` (an unreachable ``ray-address``) left ``compare.lock`` and an empty
    ``runs/``, which ``simulate --out`` then refused as not empty. Anything more (a cell's run,
    a user's file) is kept.
    """
    out = Path(out)
    created = not os.path.lexists(out)
    try:
        yield out
    except BaseException as exc:
        # refused by another's lock: the directory is the holder's, made by it meanwhile
        # (thirty-eighth review of issue 15, rundirs 6: two compare --out C started together
        # both found C new, and the refused one removed the holder's runs/, compare.lock and C)
        if created and not _refused_by_lock(exc):
            with contextlib.suppress(OSError):
                names = set(os.listdir(out))
                runs = out / "runs"
                if names <= {"runs", lock} and (not runs.is_dir() or not os.listdir(runs)):
                    if runs.is_dir():
                        runs.rmdir()
                    (out / lock).unlink(missing_ok=True)
                    out.rmdir()
        raise


def _refused_by_lock(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was raised while handling, a :class:`LockHeldError`.

    Follow-up of the thirty-eighth review of issue 15 (rundirs 2): ``compare`` and ``tune`` turn
    the holder's refusal into a usage error (``raise UsageError(...) from None``), which hid it
    from ``isinstance``: the refused command removed the holder's ``runs/``, lock file and
    directory all the same. The refusal is still the exception's context.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, LockHeldError):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def remove_run_files(out: Path) -> None:
    """Remove a run's files (and partial files, TensorBoard events) from ``out``; keep the rest.

    The ledger and ``config.toml`` go last: a removal interrupted or killed midway leaves a
    recognisable run, which the next overwrite replaces (a resume refuses it: its ledger shows
    released rounds and no checkpoint). Thirty-ninth review of issue 15 (processes 3):
    ``config.toml`` went first, and ``compare --overwrite`` stopped after it left a cell with a
    ledger, checkpoints and metrics but no ``config.toml``, which neither an overwrite nor a
    resume took. Forty-third review of issue 15 (ledger, finding 2): ``privacy_ledger.jsonl.v1``
    (an earlier version's ledger, set aside by a resume that converted it) was kept, so the new
    run's directory held a ledger counting releases of the run it replaced.
    """
    first = (SUMMARY_FILE, CHECKPOINT, PREVIOUS_CHECKPOINT, METRICS_FILE)  # no finished claim
    # forty-third review (ledger 2): an earlier version's ledger set aside when it was converted
    # stayed beside the new run, a record of releases that run never made
    last = (LEDGER_FILE + OLD_LEDGER_SUFFIX, LEDGER_FILE, CONFIG_FILE)
    for name in (*first, *_PARTIAL):
        (out / name).unlink(missing_ok=True)
    for name in os.listdir(out):
        if name.startswith(EVENTS_PREFIX):
            (out / name).unlink(missing_ok=True)
    for name in last:
        (out / name).unlink(missing_ok=True)


def _released_anything(out: Path) -> bool:
    """Whether ``out`` shows a released round (ledger line, metrics row or checkpoint)."""
    if (out / METRICS_FILE).exists() and (out / METRICS_FILE).stat().st_size:
        return True
    if any((out / n).exists() for n in (CHECKPOINT, PREVIOUS_CHECKPOINT, SUMMARY_FILE)):
        return True
    try:
        ledger = RunLedger.read(out)
    except ValueError:
        return True  # unreadable: keep it
    return ledger is not None and bool(ledger.entries)


class NewRunDir:
    """Claim a directory for a fresh run: ``with NewRunDir(out) as path: ...``.

    On entry: ``out`` must not exist, be empty (or hold only what a start killed before writing
    ``config.toml`` leaves: ``run.lock``, ``config.toml.tmp``), or, with ``overwrite``, hold a
    recognisable run of ours (``config.toml`` and only run files; they are removed). Anything
    else raises ``ValueError`` before anything is created. The directory (and missing parents)
    is created and its lock taken and held until exit.

    On exit by an exception, if no round was released (no ledger line, row or checkpoint), what
    this start created is removed (run files, the lock file if it did not exist, the directories
    it created, if empty); a run that released rounds is kept, to be resumed. A directory moved
    away while claimed is left as it is, and so is what its path names then (another's run).

    Parameters
    ----------
    out : path-like
        The run directory.
    overwrite : bool
        Replace a recognisable run of ours.
    allowed : iterable of str
        Names in ``out`` that belong to the caller and are left alone (a deployment's ``deploy``
        log directory).
    """

    def __init__(
        self, out: str | os.PathLike, *, overwrite: bool = False, allowed: Iterable[str] = ()
    ) -> None:
        self.path = Path(out)
        self.overwrite = overwrite
        self.allowed = tuple(allowed)
        self._lock = None
        self._created: list[Path] = []
        self._lock_existed = True

    def __enter__(self) -> Path:
        out = self.path
        _check_claimable(out, overwrite=self.overwrite, allowed=self.allowed)
        check_umask(out)  # before a directory is made: under umask 0777 one was left, mode 000
        probe = out
        while not probe.exists():
            self._created.append(probe)
            probe = probe.parent
        out.mkdir(parents=True, exist_ok=True)
        self._lock_existed = (out / LOCK_FILE).exists()
        self._lock = lock_run_dir(out)
        try:
            self._lock.__enter__()
        except BaseException as exc:
            if isinstance(exc, OSError) and not self._lock_existed:  # created, never locked
                (out / LOCK_FILE).unlink(missing_ok=True)
            if not _refused_by_lock(exc):  # refused: the directories are the holder's now
                self._remove_dirs()  # (follow-up of the thirty-eighth review, rundirs 4)
            raise
        try:
            _check_claimable(out, overwrite=self.overwrite, allowed=self.allowed)  # under lock
        except BaseException:
            # another process claimed it meanwhile (and has finished): its files stay
            self._release()
            self._remove_dirs()
            raise
        if self.overwrite:
            try:
                remove_run_files(out)
            except BaseException:  # the lock is let go (a caller that goes on may claim it)
                self._release()
                raise
        return out

    def __exit__(self, exc_type, exc, tb) -> bool:
        # what the path names now is another's when the claimed directory was moved away
        # (thirty-eighth review of issue 15, rundirs 1): nothing of it is judged or removed
        ours = still_held(self.path)
        if exc_type is not None and ours and not _released_anything(self.path):
            self._discard()
        else:
            self._lock.__exit__(None, None, None)
        return False

    def _discard(self) -> None:
        remove_run_files(self.path)  # all of them were written by this start
        self._release()
        self._remove_dirs()

    def _release(self) -> None:
        if not self._lock_existed:
            (self.path / LOCK_FILE).unlink(missing_ok=True)  # while held (see exclusive_lock)
        self._lock.__exit__(None, None, None)

    def _remove_dirs(self) -> None:
        for path in self._created:  # deepest first
            try:
                path.rmdir()
            except OSError:
                # not empty (someone else's files), gone, or a ``..`` (``--out C/..``, C new:
                # the thirty-second review of issue 15 found C left behind by the refusal):
                # its parents are tried all the same, and rmdir removes only an empty one
                continue
