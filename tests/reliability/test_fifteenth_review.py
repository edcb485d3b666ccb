"""Issue 15, fifteenth hostile review: variants of the ten case classes not tried before.

Finding 1 (an ε smaller than what was spent, API): ``composed_tuning_epsilon(…, count=2.5)``
charged 2.5 tunings as 2 (``int()``: ε 19.50 instead of at least that of 3 runs' worth), took
``True`` and ``"3"`` as counts, and a NaN count ended in ``cannot convert float NaN to integer``
naming no parameter. Now a ``ValueError`` naming ``count``.

Finding 2 (an RDP smaller than what was spent, API): ``ledger_rdp(ledger, (0.5,))`` returned an
RDP curve of ``-inf``; orders of NaN, inf, 1 or below were silently turned into ``inf``. Now
``event_rdp`` (and so ``ledger_rdp``, ``finite_orders``, ``tuning_epsilon``) refuses orders that
are not finite numbers > 1, naming ``orders``.

Finding 3 (a failing cell under ``compare --jobs``): SIGKILL of the second worker (as the
kernel's out-of-memory killer does) went unnoticed: CPython 3.11's pool watches only the workers
it had when it began to wait, and a newly submitted cell's worker is spawned after it is woken.
The other worker ran its cell to the end (2,000 more rounds of a 4,000-round cell, about 45 s)
before ``compare`` reported the failure. ``run_plans`` now checks its workers every 0.5 s.

Finding 4 (a user's file overwritten): a lock file that is a symbolic link
(``D/.stackoverflow.lock`` for ``data synth``, a run's ``run.lock`` for ``--resume``; also
``compare.lock``, ``tune.lock``) was opened through the link: the linked file got the PID and
was emptied on release (rc 0).
Now refused (``O_NOFOLLOW``), one line naming the lock file, the linked file unchanged.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedprivopt.privacy.accounting import SubsampledGaussianEvent
from fedprivopt.privacy.rdp_curves import event_rdp
from fedprivopt.privacy.tuning import (
    TrialCount,
    composed_tuning_epsilon,
    finite_orders,
    ledger_rdp,
    tuning_epsilon,
)
from tests.reliability.test_signals import Cli, wait_for, wait_gone

TOY = str(Path(__file__).resolve().parents[2] / "simulations" / "toy.toml")

EVENT = SubsampledGaussianEvent(1.0, "poisson", 0.1)
LEDGER = [(EVENT, 10)]
TRIALS = TrialCount("poisson", 5)


@pytest.mark.parametrize("count", [2.5, True, "3", math.nan, 0, -1, None])
def test_composed_tuning_epsilon_refuses_a_count_that_is_not_a_positive_integer(count):
    with pytest.raises(ValueError, match=r"count must be an integer >= 1"):
        composed_tuning_epsilon(LEDGER, 1e-5, TRIALS, count)


def test_composed_tuning_epsilon_still_composes_integer_counts():
    one = composed_tuning_epsilon(LEDGER, 1e-5, TRIALS, 1)
    assert one == pytest.approx(tuning_epsilon(LEDGER, 1e-5, TRIALS))
    assert (
        composed_tuning_epsilon(LEDGER, 1e-5, TRIALS, 3)
        > composed_tuning_epsilon(LEDGER, 1e-5, TRIALS, 2)
        > one
    )


@pytest.mark.parametrize("orders", [(0.5,), (1.0,), (-3.0,), (math.nan,), (math.inf,), (2.0, 0.9)])
def test_rdp_orders_must_be_finite_and_above_one(orders):
    for call in (
        lambda: ledger_rdp(LEDGER, orders),
        lambda: event_rdp(EVENT, orders),
        lambda: finite_orders([LEDGER], orders),
        lambda: tuning_epsilon(LEDGER, 1e-5, TRIALS, orders),
    ):
        with pytest.raises(ValueError, match=r"orders must be finite numbers > 1"):
            call()


@pytest.mark.parametrize("orders", [(2, "x"), (True, 2.0)])
def test_rdp_orders_must_be_numbers(orders):
    with pytest.raises(ValueError, match=r"orders must be real numbers > 1"):
        ledger_rdp(LEDGER, orders)


def test_valid_orders_still_give_the_same_curve():
    curve = ledger_rdp(LEDGER, (2.0, 8.0, 32.0))
    assert (curve > 0).all() and math.isfinite(curve.sum())
    assert tuning_epsilon(LEDGER, 1e-5, TRIALS, (2.0, 8.0, 32.0)) >= tuning_epsilon(
        LEDGER, 1e-5, TRIALS
    )


def _workers(pid: int) -> list[int]:
    """The ``compare`` process's spawned workers, oldest first (by start time)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and b"spawn_main" in cmd:
            found.append((int(fields[19]), int(entry.name)))
    return [p for _, p in sorted(found)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_a_killed_worker_stops_the_comparison_at_once(tmp_path):
    """Finding 3: ``compare --jobs 2`` whose second worker is SIGKILLed (as the kernel's
    out-of-memory killer does) went on running the other cell to its end (about 45 s and 2,000
    rounds of a 4,000-round cell) before it reported the failure; now within a second or two,
    with the other worker stopped by SIGTERM."""
    out = tmp_path / "C"
    argv = ["compare", TOY, "--strategies", "dp-fedavg", "--noise-multipliers", "0.5,1",
            "--rounds", "100000", "--set", "checkpoint-every=1000000", "--out", str(out),
            "--jobs", "2"]  # fmt: skip
    run = Cli(argv, tmp_path, "compare")
    runs = out / "runs"
    try:
        wait_for(lambda: len(list(runs.glob("*/metrics.jsonl"))) >= 2, 240, "two runs", run.proc)
        wait_for(lambda: len(_workers(run.proc.pid)) >= 2, 60, "two workers", run.proc)
        run.remember()
        os.kill(_workers(run.proc.pid)[-1], signal.SIGKILL)
        started = time.monotonic()
        try:
            code = run.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError("still running 30 s after a worker was killed") from None
        seconds = time.monotonic() - started
        wait_gone(run.seen, 15)  # the other worker too
    finally:
        run.cleanup()
    err = run.stderr()
    assert code == 2 and seconds < 20, (code, seconds, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    assert "ended without a result" in err.strip().splitlines()[-1], err[-3000:]
    assert not list(runs.glob("*/summary.json")), "a cell ran to its end after the kill"


def test_a_lock_file_that_is_a_symbolic_link_is_refused_and_its_target_kept(tmp_path):
    """Finding 4: ``exclusive_lock`` opened a lock file through a symbolic link, wrote its PID
    into the linked file and emptied it on release (``data synth --out D`` with
    ``D/.stackoverflow.lock -> notes.txt``: rc 0, notes.txt empty)."""
    from fedprivopt.data.locks import exclusive_lock

    notes = tmp_path / "notes.txt"
    notes.write_text("precious notes\n")
    link = tmp_path / "x.lock"
    link.symlink_to(notes)
    with pytest.raises(ValueError, match=r"x\.lock is a symbolic link"):
        with exclusive_lock(link):
            pass
    dangling = tmp_path / "y.lock"
    dangling.symlink_to(tmp_path / "absent")
    with pytest.raises(ValueError, match=r"y\.lock is a symbolic link"):
        with exclusive_lock(dangling):
            pass
    assert notes.read_text() == "precious notes\n"
    assert not (tmp_path / "absent").exists()


def test_data_synth_and_resume_refuse_a_linked_lock_file_in_one_line(tmp_path):
    from tests.reliability.test_fuzz_cli import run_cli

    notes = tmp_path / "notes.txt"
    notes.write_text("precious notes\n")
    data = tmp_path / "D"
    data.mkdir()
    (data / ".stackoverflow.lock").symlink_to(notes)
    code, _, err = run_cli(["data", "synth", "--out", str(data), "--clients", "5"])
    assert code == 2, err
    assert err.strip().count("\n") == 0 and ".stackoverflow.lock is a symbolic link" in err, err
    assert notes.read_text() == "precious notes\n"
    assert not (data / "stackoverflow.sqlite").exists()

    run = tmp_path / "R"
    code, _, err = run_cli(["simulate", TOY, "--rounds", "1", "--out", str(run), "--quiet"])
    assert code == 0, err
    (run / "run.lock").unlink()
    (run / "run.lock").symlink_to(notes)
    code, _, err = run_cli(["simulate", "--resume", str(run)])
    assert code == 2, err
    assert err.strip().count("\n") == 0 and "run.lock is a symbolic link" in err, err
    assert notes.read_text() == "precious notes\n"


def test_the_waiting_lock_refuses_a_link_too(tmp_path):
    """Finding 4, the waiting lock a task takes to generate its files (``file_lock``): through a
    dangling link it created the link's target (an empty file anywhere the link pointed)."""
    from fedprivopt.data.locks import file_lock

    link = tmp_path / ".stackoverflow.lock"
    link.symlink_to(tmp_path / "target")
    with pytest.raises(ValueError, match=r"\.stackoverflow\.lock is a symbolic link"):
        with file_lock(link):
            pass
    assert not (tmp_path / "target").exists()
    with file_lock(tmp_path / "plain.lock"):  # control: a plain lock file still locks
        pass
    assert (tmp_path / "plain.lock").is_file()
