"""The processes a run starts end with it, and Ray leaves the command's signals alone.

Split from :mod:`fedprivopt.simulation.interrupt`, whose exception and handlers these serve.

- :func:`own_processes`: every process the run starts (Ray's GCS, raylet, agents and workers)
  is stopped by PID when the run ends, normally or not, and by a
  :class:`~fedprivopt.simulation.watchdog.Watchdog` when this process is killed (SIGKILL runs no
  handler). Ray kills its direct children with the driver (``PR_SET_PDEATHSIG``), but the
  raylet's dashboard and runtime-env agents outlived it by about a minute: they report the
  raylet's death to the dead GCS, with a 60 s timeout, before exiting. Ray's processes start in a
  process group of their own (:func:`ray_processes_apart`), so a signal to the command's process
  group (a closed terminal, ``kill -TERM -PGID``) reaches this process only, which stops them in
  order.
- :func:`ray_keeps_handlers`: ``ray.init`` replaces the SIGTERM handler in the main thread
  (``sys.exit(15)`` for the driver; the head node's kills Ray's processes and exits 1), so a
  SIGTERM during a Flower simulation raised ``SystemExit`` wherever the main thread was instead
  of setting the stop event. Twenty-sixth review of issue 15: sent 4 s into ``simulate
  stackoverflow-tp-mini.toml --set engine=flower``, it was raised inside ``logging``'s
  ``_releaseLock`` ("Exception ignored"), which left logging's lock held: the next log line of
  any thread waited for ever and the run hung (still running 10 minutes later, no round
  written). Later in a run, Ray's core worker's failure-signal handler (absl's, installed
  over the process's SIGTERM handler when the driver connects) caught a SIGTERM, printed a
  stack dump and aborted the process: rc 134 and Flower's tracebacks of dead actors instead of
  143. Inside the block, Ray's calls to install a SIGTERM handler do nothing and the
  driver's failure-signal handler is off (``RAY_DISABLE_FAILURE_SIGNAL_HANDLER=1``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

from fedprivopt.core.memory import available_memory
from fedprivopt.core.text import shown

__all__ = [
    "RAY_OPEN_FILES",
    "RUN_MARKER_ENV",
    "check_ray_temp_dir",
    "enough_address_space",
    "enough_open_files",
    "own_processes",
    "ray_keeps_handlers",
    "ray_processes_apart",
]

RAY_OPEN_FILES = 256
"""Open files the Ray a run starts needs at least (the limit of this process, which Ray's inherit).

Measured with the toy preset's Flower run on 2 CPUs: the raylet held 58 files and the GCS 52; at
a limit of 40 the GCS did not start, at 48 a worker could not register, at 64 the run ended
normally. 256 leaves room for the workers of more CPUs."""

_RAY_RECOMMENDED_OPEN_FILES = 8192
"""The limit Ray recommends (below it Ray's driver logs a warning): the soft limit is raised to it,
or to the hard limit where that is lower."""

_NO_FAILURE_HANDLER = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"
"""Environment variable that keeps Ray's core worker from installing absl's signal handler."""

RUN_MARKER_ENV = "FEDPRIVOPT_RUN_ID"
"""Environment variable that tags the processes started during a run."""


def _raised_soft_limit(which: int, wanted: int) -> tuple[int, int]:
    """Raise this process's soft limit ``which`` within the hard one; ``(soft, hard)`` after.

    Towards ``wanted`` (``RLIM_INFINITY``: as far as the hard limit goes), as ``ulimit -S``
    may; a limit the system does not allow is left as it is.
    """
    import resource

    soft, hard = resource.getrlimit(which)
    infinite = resource.RLIM_INFINITY
    if soft == infinite:
        return soft, hard
    if hard == infinite:
        target = wanted
    else:
        target = hard if wanted == infinite else min(hard, wanted)
    if target == infinite or target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(which, (target, hard))
            soft = target
    return soft, hard


def enough_open_files(what: str) -> None:
    """Raise this process's soft limit of open files for Ray; refuse a limit Ray cannot run under.

    Thirty-seventh review of issue 15 (cli, finding 2; the environment reviewer's report):
    ``ulimit -n 30; simulate toy.toml --engine flower`` printed 156 lines (Ray's "Timed out
    waiting for … gcs_server_port", Flower's "Simulation Runtime crashed") and ended rc 1. The
    soft limit is now raised towards :data:`_RAY_RECOMMENDED_OPEN_FILES` within the hard limit
    (as ``ulimit -S -n`` may); below :data:`RAY_OPEN_FILES` after that, ``what`` (the setting
    that starts Ray) is refused before anything is written.

    Raises
    ------
    ValueError
        Naming ``what``, the limit (``ulimit -n``) and the open files Ray needs.
    """
    try:
        import resource
    except ImportError:  # not a POSIX system: Ray's own checks apply
        return
    soft, hard = _raised_soft_limit(resource.RLIMIT_NOFILE, _RAY_RECOMMENDED_OPEN_FILES)
    infinite = resource.RLIM_INFINITY
    if soft != infinite and soft < RAY_OPEN_FILES:
        shown_hard = "unlimited" if hard == infinite else str(hard)
        raise ValueError(
            f"{what} starts Ray, which needs at least {RAY_OPEN_FILES} open files, but this "
            f"process may open {soft} (ulimit -n; hard limit {shown_hard}): raise the limit "
            f'(ulimit -n 4096) or use engine = "fast" without fast-actors'
        )


RAY_OBJECT_STORE_SHARE = 0.3
"""The share of the available memory Ray's object store maps by default (Ray's own rule)."""

RAY_ADDRESS_SPACE_MARGIN = 2 * 1024**3
"""Address space Ray's processes need beside the object store (bytes; measured, see below)."""


def enough_address_space(what: str) -> None:
    """Raise the soft address-space limit (``ulimit -v``) for Ray; refuse one Ray hangs under.

    Thirty-seventh review of issue 15 (the cli reviewer's open report): with ``ulimit -v
    7500000`` (KiB) ``simulate toy.toml --engine flower`` hung inside ``ray.init`` and ignored
    SIGTERM for 9 minutes (only SIGKILL ended it); at 6000000 it printed 137 lines ("node timed
    out during startup"), rc 1; at 9000000 it ran. Ray's object store maps
    :data:`RAY_OBJECT_STORE_SHARE` of the available memory (6.3 GB of 20.9 GB on that machine)
    in one process, whose address space the limit bounds. The soft limit is raised to the hard
    one; a limit still below the object store plus :data:`RAY_ADDRESS_SPACE_MARGIN` is refused
    before anything is written (an estimate: the available memory changes while a run starts).

    Raises
    ------
    ValueError
        Naming ``what``, the limit (``ulimit -v``) and the address space Ray needs here.
    """
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    infinite = resource.RLIM_INFINITY
    soft, _ = _raised_soft_limit(resource.RLIMIT_AS, infinite)
    available = available_memory()
    if soft == infinite or available is None:
        return
    needed = int(RAY_OBJECT_STORE_SHARE * available) + RAY_ADDRESS_SPACE_MARGIN
    if soft < needed:
        raise ValueError(
            f"{what} starts Ray, whose object store alone maps "
            f"{RAY_OBJECT_STORE_SHARE:.0%} of the available memory, but this process may use "
            f"{soft // 1024} KiB of address space (ulimit -v): Ray would hang or fail at start "
            f"here; raise the limit to at least {-(-needed // 1024)} KiB (or ulimit -v "
            f'unlimited), or use engine = "fast" without fast-actors'
        )


_RAY_SOCKET = "/ray/session_2026-11-30_00-24-47_263118_{pid}/sockets/plasma_store"
"""The longest socket path Ray's head makes under its temporary directory (same length)."""


def check_ray_temp_dir(what: str) -> None:
    """Refuse a temporary directory whose path leaves Ray's sockets no room (before Ray starts).

    Thirty-seventh review of issue 15 (cli, finding 7): ``TMPDIR`` (Ray takes it on Linux) or
    ``RAY_TMPDIR`` of 90 characters (a job's scratch directory on a cluster) made ``simulate
    --engine flower`` print 152 lines ("validate_socket_filename failed: AF_UNIX path length
    cannot exceed 107 bytes", "Simulation Runtime crashed"), rc 1. The directory is Ray's own
    choice (``ray._common.utils.get_default_system_temp_dir``): ``RAY_TMPDIR`` if set, else
    ``TMPDIR`` on Linux, else ``/tmp``.

    Raises
    ------
    ValueError
        Naming ``what``, the variable and the length a socket's path may have.
    """
    if sys.platform.startswith("linux"):
        limit = 107
    elif sys.platform == "darwin":
        limit = 103
    else:
        return  # no Unix sockets
    for name in ("RAY_TMPDIR", "TMPDIR"):
        if name in os.environ and (name == "RAY_TMPDIR" or limit == 107):
            base = os.environ[name]
            break
    else:
        return  # /tmp
    if not os.path.isabs(os.path.expanduser(base)):
        # thirty-eighth review of issue 15 (follow-up): an empty or relative RAY_TMPDIR
        # (export RAY_TMPDIR=$SCRATCH with SCRATCH unset) broke Ray wherever --out was: rc 1
        # after about 50 s, 130 lines, ./ray left in the working directory
        raise ValueError(
            f"{what} starts Ray, which takes {name} = {shown(base)} for its session files "
            "(logs, sockets) and fails on a path that is empty or relative; set it to an "
            "absolute directory (RAY_TMPDIR=/tmp) or unset it"
        )
    room = limit - len(_RAY_SOCKET.format(pid=os.getpid()))  # bytes left for the directory
    size = len(os.fsencode(os.path.expanduser(base)))  # as Ray expands it
    if size > room:
        raise ValueError(
            f"{what} starts Ray, whose sockets would lie under {name} = {shown(base)}: their "
            f"paths would have {size + limit - room} bytes, more than the {limit} a Unix "
            f"socket's path may have; set RAY_TMPDIR to a directory of at most {room} bytes "
            "(RAY_TMPDIR=/tmp)"
        )


@contextlib.contextmanager
def ray_keeps_handlers() -> Iterator[None]:
    """Within the block, Ray does not replace the SIGTERM handler (see the module docstring).

    Ray installs its handlers through ``ray._private.utils.set_sigterm_handler`` (the driver's
    ``ray.init``, the head node it starts); that function does nothing inside the block, so the
    handler of :func:`signals_stop` or :func:`signals_raise` stays. The failure-signal handler
    of the driver's core worker (absl's: SIGTERM printed as a crash, then abort) is turned off
    for Ray sessions started or joined inside the block, unless the environment sets
    ``RAY_DISABLE_FAILURE_SIGNAL_HANDLER`` itself. Ray's processes are still stopped at the end
    of a run, by :func:`own_processes`.
    """
    try:
        import ray._private.ray_constants as ray_constants
        import ray._private.utils as ray_utils
    except ImportError:  # pragma: no cover - Ray is a dependency
        yield
        return
    original = ray_utils.set_sigterm_handler
    # read when ray is imported (the driver's core worker looks the constant up when it starts;
    # the processes Ray starts read the environment)
    disabled = ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER

    def kept(handler: Any) -> None:
        """Ray's handler is not installed: the one in place stays."""

    ray_utils.set_sigterm_handler = kept
    unset = _NO_FAILURE_HANDLER not in os.environ
    if unset:
        os.environ[_NO_FAILURE_HANDLER] = "1"
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = original
        if unset:
            os.environ.pop(_NO_FAILURE_HANDLER, None)
            ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = disabled


@contextlib.contextmanager
def ray_processes_apart() -> Iterator[None]:
    """Within the block, the processes Ray starts here lead a process group of their own.

    Ray starts its GCS, raylet and the processes the raylet starts (agents, workers) in the
    command's process group, and blocks only SIGINT in them. A SIGHUP of that group (the terminal
    closed) or a SIGTERM of it (``kill -TERM -PGID``) killed them while the command itself only
    began to stop (twenty-ninth review of issue 15): while Ray started, the driver waited 60 s for
    the dead GCS, then Ray aborted it (SIGHUP), or Flower logged 166 lines of ``RaySystemError``
    tracebacks and the command ended with rc 1 (SIGTERM); later in a run Flower logged
    ``ActorUnavailableError`` tracebacks before the one line. In a group of their own they get no
    signal sent to the command's group; this process gets it, and Ray's processes are stopped
    by PID (``ray.shutdown``, :func:`own_processes`, ``PR_SET_PDEATHSIG``, the watchdog).
    """
    try:
        import ray._private.services as services
    except ImportError:  # pragma: no cover - Ray is a dependency
        yield
        return
    original = services.ConsolePopen

    class Apart(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["process_group"] = 0
            super().__init__(*args, **kwargs)

    services.ConsolePopen = Apart
    try:
        yield
    finally:
        services.ConsolePopen = original


def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    try:
        return ray is not None and bool(ray.is_initialized())
    except Exception:
        return False


@contextlib.contextmanager
def own_processes(enabled: bool = True) -> Iterator[str | None]:
    """Stop every process started inside the block when it ends: return, exception or signal.

    The processes are this process's descendants started inside the block (Ray's GCS, raylet,
    agents and workers) and those whose environment holds the tag ``FEDPRIVOPT_RUN_ID=<fresh
    value>``, set for the block. On exit Ray is shut down (if it was started inside the block),
    then a :class:`~fedprivopt.simulation.watchdog.Watchdog` stops what is left by PID (SIGTERM,
    3 s, SIGKILL). If this process is killed, the watchdog does the same on its own. Ray's
    processes lead a process group of their own (:func:`ray_processes_apart`), and Ray keeps the
    signal handlers in place (:func:`ray_keeps_handlers`: before the twenty-ninth review of issue
    15, ``kill PID`` of a run with ``fast-actors`` printed 22 lines of absl's "*** SIGTERM
    received" stack before the one line). Yields the tag (``NAME=value``), or None when disabled
    or not on Linux.
    """
    if not enabled or not sys.platform.startswith("linux"):
        yield None
        return
    from fedprivopt.simulation.watchdog import Watchdog

    marker = f"{RUN_MARKER_ENV}={uuid.uuid4().hex}"
    ray_before = _ray_running()  # a Ray session of the caller's is left alone
    watchdog = Watchdog(marker=marker, tree=True)  # started before the tag: it does not carry it
    previous = os.environ.get(RUN_MARKER_ENV)
    os.environ[RUN_MARKER_ENV] = marker.partition("=")[2]
    try:
        # the fast engine's actors start Ray here too: as for the Flower engine, its SIGTERM
        # handler and the core worker's failure-signal handler stay off (twenty-ninth review)
        with ray_processes_apart(), ray_keeps_handlers():
            yield marker
    finally:
        if previous is None:
            os.environ.pop(RUN_MARKER_ENV, None)
        else:
            os.environ[RUN_MARKER_ENV] = previous
        try:
            if not ray_before and _ray_running():
                import ray

                with contextlib.suppress(Exception):
                    ray.shutdown()
        finally:
            watchdog.close()  # stops what is left of the block's processes, and waits
