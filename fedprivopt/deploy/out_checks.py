"""Where ``deploy local`` may write: the checks of its ``--out`` before anything starts.

Shared by the command line (:mod:`fedprivopt.deploy.cli`) and the Python API
(:func:`~fedprivopt.deploy.local.deploy_local`), which sits below the command line: before the
thirty-ninth review of issue 15 (processes 2) only the command line made them, and the
API's own call of :func:`check_out_claimable` from ``deploy.local`` imported the command line
module (a layer above it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# the checks of an out inside a run moved to the simulation layer, which simulate() calls too
# (refuse_inside_writing too: forty-sixth review follow-up, outputs 1)
from fedprivopt.simulation.run_places import (
    check_not_held,
    quoted_out,
    refuse_inside_a_run,
    refuse_inside_held,
    refuse_inside_writing,
)

__all__ = [
    "MAX_RECORD_BYTES",
    "check_log_dir",
    "check_not_held",
    "check_out_claimable",
    "check_temp_outside",
    "quoted_out",
    "refuse_inside_a_run",
    "refuse_inside_held",
    "refuse_inside_writing",
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
    refuse_inside_writing(Path(out))
    check_log_dir(Path(out) / DEPLOY_LOGS)
    check_task_dirs_outside(config, str(out))  # the SuperNodes would write their data there
    check_temp_outside(str(out))


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
