"""Where a run may be written: never inside another run's directory.

A run's directory holds its own files only. These checks refuse an ``out`` strictly inside a run
directory (known by its ledger, or by ``run.lock`` beside ``config.toml``) or inside a directory
another process holds as a run, through links too. They serve ``deploy local`` and its Python API
(``deploy.out_checks`` re-exports them), the command line's ``--out`` check, and
:func:`~fedprivopt.simulation.run.simulate` (forty-second review of issue 15, lead 3: the Python
API wrote a whole run among a finished run's files, which the command line refuses), and
:func:`refuse_inside_writing`: inside a comparison, tuning or deployment being written.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "ancestors",
    "check_not_held",
    "quoted_out",
    "refuse_inside_a_run",
    "refuse_inside_held",
    "refuse_inside_writing",
]


def check_not_held(out: Path) -> None:
    """Refuse an ``out`` that another run holds, or inside one (``LockHeldError`` naming its PID).

    Forty-first review of issue 15 (processes 1): :func:`check_out_claimable` lets a finished
    start's debris through (``run.lock`` alone), but did not ask whether the directory was still
    held: while ``simulate --out D`` (or the Python API's ``simulate``) held ``D`` with only
    ``run.lock`` written, ``deploy local --out D`` passed every check, wrote ``D/deploy/`` into
    the other run's directory and started the SuperLink and SuperNodes. ``compare``, ``tune`` and
    ``data synth`` refuse such a directory. The lock of a run directory is a ``flock`` on the
    directory itself (:func:`~fedprivopt.simulation.rundir.lock_directory`); it is probed here
    without writing anything. An ``out`` inside a directory that holds ``run.lock`` and is held
    is refused too (follow-up of that review, outputs 7).
    """
    _refuse_held(out, f"argument --out: run directory {quoted_out(out)}")
    refuse_inside_held(out)


def refuse_inside_held(out: Path, flag: str = "--out") -> None:
    """Refuse an ``out`` inside a directory that holds ``run.lock`` and another process holds.

    Follow-up of the forty-first review of issue 15 (outputs 7): a directory inside such a run
    (``deploy local --out D/sub`` while ``D`` held only ``run.lock``) passed, as the
    inside-a-run check knows a run by its ledger or by ``run.lock`` beside ``config.toml``;
    ``D/sub/deploy`` was written into the run (``simulate --out D/sub`` alike, the outputs
    follow-up's open row: the command line's ``--out`` check calls this too).

    Follow-up of the forty-third review of issue 15 (outputs 1): a running deployment's log
    directory (``deploy local --out D`` holds ``D/deploy`` with ``deploy.lock`` there) was not
    looked at: ``simulate toy.toml --out D/deploy/x`` wrote a whole run among the deployment's
    logs, rc 0. It is refused as a run directory is, naming the deployment's PID.

    Follow-up of the forty-fifth review of issue 15 (outputs 1; the processes reviewer's open
    row): while ``deploy local --out D`` started (``D`` holds only its held ``deploy/``; the
    ServerApp claims ``D`` some 30 s later), ``simulate``, ``compare``, ``tune`` and
    ``compare-tuned --out D/x`` (and the Python API's ``simulate``) wrote into ``D``, rc 0, and
    the deployment's ServerApp then refused ``D`` as not empty after every process had started.
    An ancestor whose ``deploy/`` another process holds (``deploy/deploy.lock``) is refused
    too, as ``deploy.out_checks.refuse_inside_writing`` refuses it for ``deploy local``.
    """
    from fedprivopt.data.locks import LockHeldError
    from fedprivopt.simulation.files import LOCK_FILE

    for place in ancestors(out):
        for held, lock, what in (
            (place, LOCK_FILE, "run directory"),
            (place, _DEPLOY_LOCK, "deployment's log directory"),
            (place / _DEPLOY_LOGS, _DEPLOY_LOCK, "deployment's directory"),
        ):
            if not os.path.lexists(held / lock):
                continue
            try:
                _refuse_held(held, f"{what} {quoted_out(place)}", lock)
            except LockHeldError as exc:
                holder = f"process {exc.pid}" if exc.pid is not None else "another process"
                raise LockHeldError(
                    f"argument {flag}: {quoted_out(out)} is inside the {what} "
                    f"{quoted_out(place)}, which {holder} holds: a run's directory holds its own "
                    "files only; choose a directory outside it",
                    exc.pid,
                ) from None


#: The lock file a deployment holds in its log directory ``OUT/deploy`` (the name of
#: ``deploy.local_checks.DEPLOY_LOCK``, which this layer does not import).
_DEPLOY_LOCK = "deploy.lock"

#: A deployment's log directory in its ``OUT`` (the name of ``deploy.server_app.DEPLOY_LOGS``).
_DEPLOY_LOGS = "deploy"


_RUN_MARKERS = ("privacy_ledger.jsonl", "run.lock", "config.toml")


def ancestors(out: Path) -> list[Path]:
    """The directories above ``out``: as written (made absolute) and as its links resolve.

    Forty-second review of issue 15 (processes 2): only the first were looked at, so an ``out``
    reached through a symbolic link into a run (``ln -s D/plots L``, ``--out L/sub``) was not
    inside it.
    """
    found = list(Path(os.path.abspath(out)).parents)
    try:
        real = Path(out).resolve().parents
    except (OSError, RuntimeError):  # a link loop: named by the claim
        return found
    return found + [place for place in real if place not in found]


def refuse_inside_a_run(out: Path, flag: str = "--out") -> None:
    """Refuse an ``out`` strictly inside a run directory (``ValueError`` naming both).

    A run is known by its ledger, or by ``run.lock`` beside ``config.toml`` (as the command
    line's ``--out`` check knows it, sixteenth review of issue 15). Forty-second review of issue
    15 (processes 2): the Python API :func:`~fedprivopt.deploy.local.deploy_local` (documented
    to validate everything first) took ``out=A/plots/sub`` with ``A`` a finished run, which
    ``deploy local`` refuses: the ServerApp would have written a run among ``A``'s files, after
    which ``compare --overwrite`` refuses ``A``'s cell. Through a link too (:func:`ancestors`).
    """
    for place in ancestors(out):
        found = [name for name in _RUN_MARKERS if os.path.lexists(place / name)]
        if "privacy_ledger.jsonl" in found or {"run.lock", "config.toml"} <= set(found):
            raise ValueError(
                f"argument {flag}: {quoted_out(out)} is inside the run directory "
                f"{quoted_out(place)} (it holds {', '.join(found)}): a run's directory holds its "
                "own files only; choose a directory outside it"
            )


#: The lock files of the commands that write into their ``--out`` while they run, relative to
#: it: compare and tune (many runs) hold the directory itself, a deployment its log directory
#: ``deploy/`` (its run is claimed there by the ServerApp only some 30 s after the start).
_WRITERS = (
    ("compare.lock", "comparison"),
    ("tune.lock", "tuning"),
    ("deploy/deploy.lock", "deployment's directory"),
)


def refuse_inside_writing(
    out: Path,
    flag: str = "--out",
    *,
    own_ok: bool = False,
    advice: str = "choose a directory outside it",
) -> None:
    """Refuse an ``out`` inside a comparison, tuning or deployment another process is writing.

    Forty-fourth review of issue 15 (processes, open for the lead): ``deploy local --out C/x``
    or ``--out C/runs/x`` while ``compare … --out C`` ran (``tune`` alike) passed every check
    and started the SuperLink and SuperNodes, whose run would land among the cells the
    comparison was making. ``compare`` and ``tune`` hold their directory locked (a ``flock``
    on the directory, :func:`~fedprivopt.simulation.rundir.lock_directory`) beside their lock
    file; an ancestor, as written or as its links resolve, with such a file that another
    process holds is refused (``LockHeldError``, a ``ValueError``) naming its PID when its lock
    file says it. A finished comparison's directory is not held and stays as before.

    Forty-fifth review of issue 15 (processes 1): ``deploy local --out D/x`` (or
    ``deploy_local(out="D/x")``) while ``deploy local --out D`` started (``D`` then holds only
    its held ``deploy/``; the ServerApp claims ``D`` some 30 s later) passed every check: the
    second deployment's ``D/x/deploy`` made ``D`` "not empty" to the first's ServerApp, which
    then failed after its SuperLink and SuperNodes had started. Such an ancestor, whose
    ``deploy/`` another process holds (``deploy/deploy.lock``), is refused alike.

    Forty-fifth review of issue 15 (lead 3, the outputs follow-up's open row): ``simulate --out
    C/runs/CELL`` while ``compare --out C`` ran (``--out T/runs/trial-003`` while ``tune --out
    T`` ran) wrote a run where the comparison's cell or the tuning's trial was to be: the
    comparison stopped with rc 2 after two cells, the tuning ended rc 0 with that trial
    "failed" and the foreign run in its place. The command line's ``--out`` check of every
    command calls this too (``flag`` names the argument) with ``own_ok``: a lock this process
    holds is then not refused (``compare --tune-grid`` checks each cell's tuning ``--out``
    under its own lock).

    Follow-up of the forty-sixth review of issue 15 (outputs 1; the processes reviewer's open
    row): the Python API :func:`~fedprivopt.simulation.run.simulate` did not make this check:
    ``simulate(config, "C/x")`` while ``compare --out C`` ran wrote a whole run among the
    comparison's files. It moved here from ``deploy.out_checks`` (which re-exports it) and
    ``simulate`` calls it with ``own_ok``, under which a lock held by the process that started
    this one as a ``multiprocessing`` worker is its own too (``compare --jobs``' cells).
    :func:`~fedprivopt.simulation.run.resume` calls it too (outputs 3: ``simulate --resume
    C/runs/CELL`` while ``compare --out C`` ran released rounds into the cell, and the comparison
    stopped with rc 2 at its end), with ``advice`` for its refusal.
    """
    from fedprivopt.data.locks import LockHeldError, directory_held, probe_lock

    out = Path(out).absolute()  # named so in the refusal
    for place in ancestors(out):
        for lock, what in _WRITERS:
            if not (place / lock).is_file() or not directory_held((place / lock).parent):
                continue
            pid = None
            try:
                probe_lock(place / lock, what=f"{what} {quoted_out(place)}")
            except LockHeldError as exc:
                pid = exc.pid
            if own_ok and pid in _own_pids():  # this process's comparison (its tunings' --out)
                continue
            holder = f"process {pid}" if pid is not None else "another process"
            raise LockHeldError(
                f"argument {flag}: {quoted_out(out)} is inside the {what} {quoted_out(place)}, "
                f"which {holder} is writing: {advice}",
                pid,
            )


def _own_pids() -> set[int]:
    """The PIDs whose locks are this process's own: its own, its parent's for a worker."""
    import multiprocessing

    own = {os.getpid()}
    if multiprocessing.parent_process() is not None:  # compare --jobs: the cells' workers
        own.add(os.getppid())
    return own


def _refuse_held(directory: Path, what: str, lock: str = "") -> None:
    """``LockHeldError`` (naming the holder's PID) if another process holds ``directory``.

    The PID is read from the lock file ``lock`` there (default ``run.lock``).
    """
    import fcntl

    from fedprivopt.data.locks import LockHeldError, probe_lock
    from fedprivopt.simulation.files import LOCK_FILE

    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(directory, flags)
    except OSError:
        return  # new (or unreadable: the claim that follows names it)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            probe_lock(directory / (lock or LOCK_FILE), what=what)  # names the holder's PID
            raise LockHeldError(
                f"{what} is in use by another process; wait for it to finish or stop it first",
                None,
            ) from None
        except OSError:
            return  # a file system without locks: the run's own lock says so
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def quoted_out(out: Path) -> str:
    """``out`` as a shell word on one line (a newline in a name shown escaped)."""
    import shlex

    return shlex.quote(str(out)).replace("\n", "\\n")
