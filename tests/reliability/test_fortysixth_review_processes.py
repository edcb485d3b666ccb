"""Issue 15, forty-sixth hostile review (processes: signals, locks and processes): tests.

1. ``fedprivopt deploy local simulations/toy.toml --nodes 1 --insecure --rounds 3 --out D``,
   SIGTERM to its process group as it printed ``run N started`` (it then starts ``flwr log``:
   a fork with a ``preexec_fn``, around which the interpreter runs ``logging``'s fork hooks).
   Before: the signal's handler ran inside ``logging._releaseLock``, called from C, so the
   ``Interrupted`` it raised was only printed (``Exception ignored in: <function
   _releaseLock>``, a 6-line traceback) and lost: the deployment ran its 3 rounds to the end,
   rc 0, and logging's lock stayed held (another thread's log line would wait for ever, the
   twenty-sixth review's hang). Any fork made under ``signals_raise`` alike (Ray's processes,
   a forked probe). Now ``simulation.interrupt._raise`` holds a first signal that comes inside
   such a hook back until the hook has returned (``_in_fork_hook``, ``_defer``, ``_replay``),
   then raises it where the fork was made: rc 143, the one line, every process stopped.
   Tested in a fresh interpreter (its signal handlers, profile function and logging state are
   its own) with the handler called from logging's after-fork hook, as the kernel's signal
   reaches it.
2. Processes 1's loss where no fork is made: a first signal whose handler runs inside a
   finalizer (a ``__del__``, as each ``subprocess.Popen`` of ``deploy local``'s ``flwr`` calls
   runs when it is dropped; a ``weakref.finalize`` callback; an ``atexit`` callback), which
   the interpreter also calls from C. Before: ``Exception ignored in: <function ...__del__>``
   and the command went on as if no signal had come (measured in a fresh interpreter under
   ``signals_raise``: the loop after it ran to its end). Now an ``Interrupted`` the
   interpreter could only print is sent again (``interrupt._unraisable``, installed with the
   first raise) and raised in the code that follows; a second signal still ends the process
   at once.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

_FORK_HOOK = textwrap.dedent(
    """
    import logging, signal, subprocess, sys, threading, time
    from fedprivopt.simulation.interrupt import Interrupted, signals_raise

    said = []
    with signals_raise():
        handler = signal.getsignal(signal.SIGTERM)

        def profile(frame, event, arg):
            # the first Python code after a fork: logging's hook, where a pending signal runs
            if (
                event == "call"
                and frame.f_globals.get("__name__") == "logging"
                and frame.f_code.co_name in ("_releaseLock", "_afterFork")
            ):
                sys.setprofile(None)
                handler(signal.SIGTERM, frame)

        try:
            sys.setprofile(profile)
            subprocess.Popen(["true"], preexec_fn=lambda: None).wait()
            sys.setprofile(None)
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                time.sleep(0.01)
            said.append("not interrupted")
        except Interrupted as exc:
            said.append(f"interrupted {exc.signum}")
    thread = threading.Thread(target=lambda: logging.getLogger("t").error("logged"), daemon=True)
    thread.start()
    thread.join(2.0)
    said.append("logging free" if not thread.is_alive() else "logging lock held")
    print(" / ".join(said), flush=True)
    """
)


def test_1_a_signal_during_a_fork_is_raised_once_the_fork_hook_returns() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FORK_HOOK], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "interrupted 15 / logging free"
    assert "Exception ignored" not in done.stderr


_FINALIZER = textwrap.dedent(
    """
    import signal, sys, time
    from fedprivopt.simulation.interrupt import Interrupted, signals_raise

    said = []
    with signals_raise():
        handler = signal.getsignal(signal.SIGTERM)

        class Dropped:
            def __del__(self):
                handler(signal.SIGTERM, sys._getframe())  # as the kernel's signal reaches it

        try:
            Dropped()
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                time.sleep(0.01)
            said.append("not interrupted")
        except Interrupted as exc:
            said.append(f"interrupted {exc.signum}")
    print(" / ".join(said), flush=True)
    """
)


def test_2_a_signal_in_a_finalizer_is_raised_in_the_code_that_follows() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FINALIZER], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "interrupted 15"
    assert "Exception ignored" not in done.stderr
