"""Where ``deploy local`` may write: the checks of its ``--out`` before anything starts.

Shared by the command line (:mod:`fedprivopt.deploy.cli`) and the Python API
(:func:`~fedprivopt.deploy.local.deploy_local`), which sits below the command line: before the
thirty-ninth review of issue 15 (processes 2) only the command line made them, and the
API's own call of :func:`check_out_claimable` from ``deploy.local`` imported the command line
module (a layer above it).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_RECORD_BYTES",
    "check_log_dir",
    "check_not_held",
    "check_out_claimable",
    "check_temp_outside",
    "quoted_out",
    "refuse_inside_a_run",
    "refuse_inside_held",
]

MAX_RECORD_BYTES = 16 * 2**20
"""The largest ``deploy/processes.json`` taken for an earlier deployment's (64 nodes' is ~50 kB)."""

_OUR_LOGS = re.compile(
    r"(processes\.json|superlink\.log|serverapp\.log|supernode-\d+\.log|deploy\.lock)"
)


def check_log_dir(logs: Path) -> None:
    """Refuse a ``deploy/`` in ``--out`` that holds anything but an earlier deployment's logs.

    Fourteenth review of issue 15: the claim of ``--out`` lets its ``deploy/`` through (a
    deployment that failed leaves its logs there), so an ``--out`` holding only a user's own
    ``deploy/`` (scripts, a ``processes.json``) was written into, and its ``processes.json``
    replaced by the deployment's.
    """
    from fedprivopt.simulation.rundir import our_lock_file

    if not (logs.exists() or logs.is_symlink()):
        return
    if logs.is_symlink() or not logs.is_dir():
        raise ValueError(f"argument --out: {logs} is not a directory of deploy local's logs")
    # sixteenth review of issue 15: a superlink.log that is a symbolic link (to a user's file)
    # was taken for an earlier log and appended to through the link; only regular files are
    # an earlier deployment's
    foreign = sorted(
        p.name
        for p in logs.iterdir()
        if not _OUR_LOGS.fullmatch(p.name)
        or p.is_symlink()
        or not p.is_file()
        or (p.suffix == ".lock" and not our_lock_file(p))
    )
    record = logs / "processes.json"
    if not foreign and record.exists():
        from fedprivopt.core.files import read_at_most

        try:  # thirty-fourth review of issue 15: a 20 GB one was read whole, a MemoryError
            raw = read_at_most(record, MAX_RECORD_BYTES) if record.is_file() else None
            items = None if raw is None else json.loads(raw.decode("utf-8"))
        except (OSError, ValueError):
            items = None
        ours = isinstance(items, list) and all(  # ProcessTable.records(): ours and Flower's
            isinstance(i, dict) and {"role", "pid", "started_by"} <= set(i) for i in items
        )
        if not ours:
            foreign = ["processes.json"]
    if foreign:
        raise ValueError(
            f"argument --out: {logs} holds {', '.join(foreign[:5])}, which deploy local did not "
            "write (it writes its logs and processes.json there); choose another --out"
        )


def check_out_claimable(out: str | Path, config: Any) -> None:
    """Refuse an ``out`` the deployment of ``config`` may not write into (``ValueError``).

    A new or empty directory, one holding only an earlier deployment's ``deploy/`` logs, or a
    finished start's debris (:func:`~fedprivopt.simulation.rundir.check_claimable`); no task
    directory and no temporary directory inside it. The ServerApp claims ``out`` only after the
    deployment has written its logs and ``processes.json`` there and started every process.
    Thirty-ninth review of issue 15 (processes 2): the command line checked these, the Python
    API :func:`~fedprivopt.deploy.local.deploy_local` did not (documented to validate
    everything first): into a directory of a user's files it wrote ``deploy/`` and started the
    SuperLink and SuperNodes, and a user's own ``deploy/processes.json`` was replaced.
    """
    from fedprivopt.deploy.server_app import DEPLOY_LOGS
    from fedprivopt.simulation.run import check_task_dirs_outside
    from fedprivopt.simulation.rundir import check_claimable

    # fourteenth review of issue 15: the refusal advised "--resume DIR", which deploy local
    # does not accept (rc 2, "unrecognized arguments"); simulate continues such a run
    check_claimable(out, allowed=(DEPLOY_LOGS,), resume=f"fedprivopt simulate --resume {out}")
    check_not_held(Path(out))
    refuse_inside_a_run(Path(out))
    check_log_dir(Path(out) / DEPLOY_LOGS)
    check_task_dirs_outside(config, str(out))  # the SuperNodes would write their data there
    check_temp_outside(str(out))


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
    """
    from fedprivopt.data.locks import LockHeldError
    from fedprivopt.simulation.files import LOCK_FILE

    for place in _ancestors(out):
        if not os.path.lexists(place / LOCK_FILE):
            continue
        try:
            _refuse_held(place, f"run directory {quoted_out(place)}")
        except LockHeldError as exc:
            holder = f"process {exc.pid}" if exc.pid is not None else "another process"
            raise LockHeldError(
                f"argument {flag}: {quoted_out(out)} is inside the run directory "
                f"{quoted_out(place)}, which {holder} holds: a run's directory holds its own "
                "files only; choose a directory outside it",
                exc.pid,
            ) from None


_RUN_MARKERS = ("privacy_ledger.jsonl", "run.lock", "config.toml")


def _ancestors(out: Path) -> list[Path]:
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
    which ``compare --overwrite`` refuses ``A``'s cell. Through a link too (:func:`_ancestors`).
    """
    for place in _ancestors(out):
        found = [name for name in _RUN_MARKERS if os.path.lexists(place / name)]
        if "privacy_ledger.jsonl" in found or {"run.lock", "config.toml"} <= set(found):
            raise ValueError(
                f"argument {flag}: {quoted_out(out)} is inside the run directory "
                f"{quoted_out(place)} (it holds {', '.join(found)}): a run's directory holds its "
                "own files only; choose a directory outside it"
            )


def _refuse_held(directory: Path, what: str) -> None:
    """``LockHeldError`` (naming the holder's PID) if another process holds ``directory``."""
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
            probe_lock(directory / LOCK_FILE, what=what)  # raises naming the holder's PID
            raise LockHeldError(
                f"{what} is in use by another process; wait for it to finish or stop it first",
                None,
            ) from None
        except OSError:
            return  # a file system without locks: the run's own lock says so
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def check_temp_outside(out: str) -> None:
    """Refuse a temporary directory that is ``out`` or inside it (``ValueError`` naming it).

    The deployment's working directory (CA, keys, Flower's home with the staged app) is made
    in Python's temporary directory (``TMPDIR``, ``TEMP`` or ``TMP``). Thirty-eighth review of
    issue 15 (rundirs): ``TMPDIR=D deploy local … --out D`` started SuperLink and SuperNodes,
    whose ServerApp then refused ``D`` for holding ``fedprivopt-deploy-*``: rc 1 after about
    3.5 minutes, 34 lines and a traceback.
    """
    import tempfile

    from fedprivopt.core.files import real_path

    temp = real_path(tempfile.gettempdir())
    if temp == real_path(out) or temp.is_relative_to(real_path(out)):
        raise ValueError(
            f"argument --out: {quoted_out(Path(out))} holds the temporary directory "
            f"{quoted_out(temp)} (TMPDIR), where the deployment makes its working directory (keys, "
            "certificates, Flower's home): a run's directory holds its own files only; set "
            "TMPDIR to a directory outside it"
        )


def quoted_out(out: Path) -> str:
    """``out`` as a shell word on one line (a newline in a name shown escaped)."""
    import shlex

    return shlex.quote(str(out)).replace("\n", "\\n")
