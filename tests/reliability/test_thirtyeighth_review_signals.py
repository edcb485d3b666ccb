"""Issue 15, thirty-eighth hostile review (signals: Ctrl-C, kills, processes, deployment): tests.

1. ``simulate toy.toml --engine flower`` on a terminal (its progress bar shown), Ctrl-C twice
   0.5 s apart: the first only sets the stop event, and the bar stays on the screen while
   Flower and Ray stop (2-3 s); the second ends the process at once (``interrupt.end_now``,
   ``os._exit``). The terminal was left with its cursor hidden (rich hides it while a bar is
   shown and shows it again only when the bar stops, which an ended process never does), and
   the one line ``fedprivopt: interrupted twice; ended at once`` was written at the end of the
   bar's line (``round 3/300 ━━━ eval_accuracy=0.6600 epsilon=12.17 0:09:40fedprivopt: ...``).
   The same for ``fast-actors``, ``tune``'s and a tuned comparison's bars, and for a run whose
   Ray head was lost (``cluster_watch.end_run``). Now a process that ends at once while a bar
   is shown on a terminal first ends the bar's line and shows the cursor again
   (``core.progress.bars_abandoned``, called by ``end_now`` and ``end_run``).
2. ``deploy local toy.toml --nodes 2`` (TLS and node authentication, the defaults), then
   ``pkill -9 -f fedprivopt`` (or the out-of-memory killer, a job scheduler's kill of the whole
   job): the watchdog's command line (``python -I -S .../fedprivopt/simulation/watchdog.py``)
   matches the pattern too, so both died at once and the SuperLink's TLS key and every
   SuperNode's authentication key stayed in ``<tmp>/fedprivopt-deploy-*`` until the next
   ``deploy local`` (they were on disk for the whole deployment, up to ``--timeout``'s 30 days).
   Every process that holds a private key has read it once its SuperNodes are online; the keys
   are then removed from disk (``deploy.local.forget_private_keys``): only the certificates stay
   while the rounds run. Checked on a real deployment: rounds ran to the end with the keys gone.
3. ``simulate toy.toml --engine flower --rounds 60`` after its first checkpoint, then SIGTERM at
   once to every process whose command line names the installation (``pkill -f fedprivopt``
   where the clone is called so: the command, its watchdog, Ray's GCS, raylet and dashboard):
   143 with the one line after 10 s, but Ray's dashboard and runtime-env agents and both
   ClientApp actors still ran 10 s later (gone within 60 s): the watchdog, which stops what the
   run's own stop leaves, had died at once of the SIGTERM. The watchdog now ignores SIGTERM as
   it ignores SIGINT and SIGHUP (it ends once its parent has; SIGKILL still ends it).
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux (a pty)")

HIDE, SHOW = b"\x1b[?25l", b"\x1b[?25h"


def _in_pty(code: str, timeout: float = 30.0) -> tuple[int, bytes]:
    """Run ``code`` with a pseudo-terminal as its standard streams: ``(exit code, output)``."""
    import pty

    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=child,
        stdout=child,
        stderr=child,
        env={**os.environ, "TERM": "xterm", "COLUMNS": "100"},
        start_new_session=True,
    )
    os.close(child)
    out = b""
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # the child closed its end
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=5), out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)


def _plain(out: bytes) -> bytes:
    """``out`` without its terminal control sequences."""
    return re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", out)


# -- finding 1: a second Ctrl-C while a progress bar is shown ---------------------------------


_TWICE = """
    import os, signal, time
    from fedprivopt.core.progress import stderr_bar
    from fedprivopt.simulation import interrupt

    interrupt.handle_until_exit()
    interrupt.begin("fedprivopt: interrupted twice; ended at once")
    bar, task = stderr_bar("round", 300, field="shown", completed=2)
    bar.update(task, completed=3, shown="epsilon=12.17")
    time.sleep(0.3)  # drawn
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)
    except KeyboardInterrupt:  # the first: the run stops, its bar still shown (Flower, Ray)
        os.kill(os.getpid(), signal.SIGINT)  # the second: ended at once
        time.sleep(10)
"""


def test_1_second_ctrl_c_with_a_bar_shown_restores_the_terminal():
    code, out = _in_pty(_TWICE)
    assert code == 130
    assert HIDE in out  # the bar hid the cursor
    assert out.rfind(SHOW) > out.rfind(HIDE), "the cursor was left hidden"
    lines = _plain(out).replace(b"\r", b"").split(b"\n")
    assert b"fedprivopt: interrupted twice; ended at once" in lines  # on a line of its own
    assert any(b"/300" in line for line in lines)  # the bar stays on the screen


def test_1_head_lost_with_a_bar_shown_restores_the_terminal():
    code, out = _in_pty(
        """
        import time
        from fedprivopt.core.progress import stderr_bar
        from fedprivopt.simulation.cluster_watch import end_run

        bar, task = stderr_bar("round", 300, completed=3)
        time.sleep(0.3)
        end_run("fedprivopt: error: ray-address: the Ray cluster's head stopped answering")
        """
    )
    assert code == 2
    assert out.rfind(SHOW) > out.rfind(HIDE), "the cursor was left hidden"
    lines = _plain(out).replace(b"\r", b"").split(b"\n")
    assert any(line.startswith(b"fedprivopt: error: ray-address") for line in lines)


def test_1_no_bar_no_control_sequence():
    code, out = _in_pty(
        """
        from fedprivopt.simulation import interrupt
        interrupt.end_now(2)
        """
    )
    assert code == 130
    assert _plain(out).replace(b"\r", b"") == b"fedprivopt: interrupted twice; ended at once\n"
    assert SHOW not in out


# -- finding 2: the private keys leave the disk once the SuperNodes are online -----------------


class _Procs:
    def start(self, role, argv, log_name):
        return None


class _Deployment:
    """What ``deploy.local._run`` uses of a deployment, with no process started."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.flwr_home = workdir / "flwr-home"
        self.procs = _Procs()

    def say(self, text):
        pass

    def log_end(self, name):
        return 0

    def flwr(self, *args, timeout=120.0):
        return {"success": True, "run-id": 7}


class _Online(Exception):
    """Raised where the rounds would begin: the files the deployment keeps then."""


def test_2_private_keys_removed_once_the_nodes_are_online(tmp_path, monkeypatch):
    import fedprivopt.deploy.local as local

    workdir = tmp_path / "w"
    workdir.mkdir()
    monkeypatch.setattr(local, "stage_app", lambda src, dst: Path(dst))
    monkeypatch.setattr(local, "wait_port", lambda dep, port, deadline: None)
    monkeypatch.setattr(local, "wait_nodes", lambda dep, n, deadline, log_start=0: None)
    seen = {}

    def follow(dep, out, run_id, deadline):
        seen["left"] = sorted(p.name for p in workdir.rglob("*") if p.is_file())
        raise _Online

    monkeypatch.setattr(local, "follow", follow)
    with pytest.raises(_Online):
        local._run(_Deployment(workdir), 2, True, True, tmp_path, {}, tmp_path / "out",
                   time.monotonic() + 60)  # fmt: skip
    left = seen["left"]
    assert "ca.pem" in left and "server.pem" in left and "node-0.pub" in left
    assert "server.key" not in left, left  # there for the whole deployment
    assert "node-0" not in left and "node-1" not in left, left


# -- finding 3: the watchdog outlives a SIGTERM meant for the run ------------------------------


def test_3_watchdog_survives_sigterm_and_still_stops_the_run_s_processes():
    import signal

    from fedprivopt.simulation.watchdog import Watchdog, pid_alive

    watchdog = Watchdog(tree=True, interval=0.05)
    child = None
    try:
        time.sleep(0.05)  # a clock tick after the watchdog: the child is the run's
        child = subprocess.Popen(["sleep", "60"])
        time.sleep(0.5)  # recorded as a descendant
        os.kill(watchdog.pid, signal.SIGTERM)  # pkill -f fedprivopt: its command line matches
        time.sleep(0.3)
        assert pid_alive(watchdog.pid), "the watchdog died of SIGTERM"
        watchdog.close()  # the run ends: the watchdog stops what is left
        assert child.wait(timeout=10) is not None
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        if watchdog.pid is not None and pid_alive(watchdog.pid):
            os.kill(watchdog.pid, signal.SIGKILL)
        watchdog.close()
