"""Issue 15, follow-up of the thirty-eighth hostile review (rundirs: today's fixes).

1. ``cd R; RAY_TMPDIR= simulate toy.toml --engine flower --rounds 1 --out .`` (``RAY_TMPDIR``
   set but empty, as ``export RAY_TMPDIR=$SCRATCH`` leaves it where ``SCRATCH`` is unset): the
   thirty-eighth review's ``cli_runs.refuse_ray_temp_inside`` took an empty variable as unset
   and looked at ``TMPDIR`` (unset: passed), while Ray takes a variable that is set, even to
   ``''``, and made its session directory ``./ray`` in the working directory, the run's: rc 1
   after 49 s (Ray's node timed out, two tracebacks) and ``R/ray`` (80 kB) left among the run's
   files. Now the check takes the variable Ray takes (set, even empty; empty is the working
   directory): rc 2 before anything is written, one line naming ``--out`` and ``RAY_TMPDIR =
   ''``. (``RAY_TMPDIR=''`` beside ``TMPDIR=R``, which Ray does not read then, is no longer
   refused for ``TMPDIR``.)
2. Two ``compare toy.toml --strategies fedavg --rounds 1 --out C`` started together, ``C`` new
   (also ``tune``; the order forced in-process, as the thirty-eighth review's rundirs 6 forced
   it): that review's fix kept ``removed_if_unused`` from removing anything on a
   ``LockHeldError``, but ``compare`` and ``tune`` turn the holder's refusal into a
   ``UsageError`` (``from None``) inside that block, so from the command line the refused one
   still removed the holder's ``runs/``, its ``compare.lock`` (``tune.lock``) and ``C`` under
   the running comparison (rc 2; only the function was tested). Now a refusal that is, or was
   raised while handling, a ``LockHeldError`` removes nothing (``rundir._refused_by_lock``).
3. ``compare-tuned T`` read through a read-only mount (the thirty-eighth review's rundirs 4: a
   shared ``flock`` on each trial's directory) while ``simulate --resume T/runs/trial-001`` (or
   a tune rerun) came through the writable path: refused (right), but the message said ``its
   lock file run.lock was removed or replaced, so its PID is unknown``: nothing was removed,
   and a user told so looks for an intruder. Now ``lock_directory`` tells readers holding the
   directory shared (``rundir._held_shared``): ``is being read by another process through a
   read-only mount (which keeps no PID)``; ``run.lock`` untouched.
4. The twin of 2 in ``simulate``: two ``simulate toy.toml --out new/R`` started together, ``new``
   missing (forced in-process: the first has made and locked ``R`` and not yet written
   ``run.lock``): the refused ``NewRunDir`` removed the directories it had found missing, ``R``
   (empty yet) and ``new``, from under the holder, whose start then failed. Now a start refused
   by a lock removes no directory (``NewRunDir.__enter__``, ``rundir._refused_by_lock``).
5. While a trial's ``--resume`` held it, its ``run.lock`` replaced by a FIFO (``rm run.lock;
   mkfifo run.lock``, rundirs 2's case with another kind of file), then ``compare-tuned T``
   through a read-only bind mount: rundirs 4's ``_viewing_lock``, refused, read the holder's PID
   with ``read_bytes`` and waited on the FIFO for ever (``timeout 15``: rc 124; through the
   writable path the FIFO is refused by name). Now the PID is read without waiting, from a
   regular file only (``rundir._pid_in``): rc 2, ``in use by another process (PID unknown)``.
   (The test guards itself with ``SIGALRM``: before, it fails instead of hanging.)
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from fedprivopt.cli_args import UsageError
from fedprivopt.cli_runs import refuse_ray_temp_inside

TOY = Path(__file__).parents[2] / "simulations" / "toy.toml"


def _flower_config():
    from fedprivopt.simulation.config import load_config

    return load_config(TOY, {"engine": "flower", "num-server-rounds": 1})


# -- finding 1: an empty RAY_TMPDIR is the working directory, as Ray takes it --------------------


def test_1_empty_ray_tmpdir_is_the_working_directory(tmp_path, monkeypatch):
    out = tmp_path / "R"
    out.mkdir()
    config = _flower_config()
    monkeypatch.chdir(out)
    monkeypatch.setenv("RAY_TMPDIR", "")
    monkeypatch.delenv("TMPDIR", raising=False)
    with pytest.raises(UsageError, match=r"holds RAY_TMPDIR = '' \(empty: the working directory"):
        refuse_ray_temp_inside(config, ".", "--out")  # passed: Ray then wrote R/ray
    with pytest.raises(UsageError, match="RAY_TMPDIR"):
        refuse_ray_temp_inside(config, str(tmp_path), "--out")  # cwd inside --out
    assert not any(out.iterdir())
    # Ray reads RAY_TMPDIR then, not TMPDIR: a TMPDIR inside --out is not what Ray uses
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(out))
    refuse_ray_temp_inside(config, str(out), "--out")
    monkeypatch.delenv("RAY_TMPDIR")
    with pytest.raises(UsageError, match="holds TMPDIR"):
        refuse_ray_temp_inside(config, str(out), "--out")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "r"))  # a prefix of R's name, not a parent
    refuse_ray_temp_inside(config, str(tmp_path / "run"), "--out")


# -- finding 2: a compare or tune refused by the holder's lock leaves the holder's new directory --


def test_2_a_refused_compare_or_tune_leaves_the_holders_new_directory(tmp_path, monkeypatch):
    import fedprivopt.simulation.cells as cells
    import fedprivopt.simulation.rundir as rundir
    from fedprivopt.cli import main

    lock_directory = rundir.lock_directory
    for command, lock in (("compare", "compare.lock"), ("tune", "tune.lock")):
        out = tmp_path / command
        holder = contextlib.ExitStack()

        def first_takes_it(path, pid_file, *, what, lock=lock, holder=holder):
            # the first command, started together with this one (both found the directory new),
            # takes the lock just before this one asks for it
            if pid_file == lock:
                holder.enter_context(lock_directory(path, pid_file, what="the first"))
                # the holder's runs/ (made once it holds the directory since the forty-third
                # review, lead 3; the refused one makes none)
                (Path(path) / "runs").mkdir(exist_ok=True)
            return lock_directory(path, pid_file, what=what)

        monkeypatch.setattr(rundir, "lock_directory", first_takes_it)  # tune's
        monkeypatch.setattr(cells, "lock_directory", first_takes_it)  # compare's
        argv = [command, str(TOY), "--rounds", "1", "--out", str(out), "--quiet"]
        if command == "compare":
            argv += ["--strategies", "fedavg"]
        else:
            argv += ["--grid", "server-learning-rate=0.5,1", "--mean-trials", "1"]
        with holder:
            assert main(argv) == 2
            # before: the refused one removed runs/, the holder's lock file and the directory
            assert (out / "runs").is_dir(), command
            assert (out / lock).is_file(), command
        monkeypatch.undo()


# -- finding 3: a writer refused by a reader through a read-only mount is told so ----------------


def test_3_a_writer_refused_by_a_read_only_reader_is_told_so(tmp_path, monkeypatch):
    import fedprivopt.simulation.rundir as rundir
    from fedprivopt.data.locks import LockHeldError

    run = tmp_path / "trial-001"
    run.mkdir()
    (run / "run.lock").write_text("")  # as a finished run leaves it
    with monkeypatch.context() as patch:
        patch.setattr(rundir, "on_read_only_fs", lambda path: True)  # the read-only view
        reader = rundir.reading_lock(run)
        reader.__enter__()
    try:
        # before: 'its lock file run.lock was removed or replaced, so its PID is unknown'
        with pytest.raises(
            LockHeldError, match="being read by another process through a read-only"
        ):
            with rundir.lock_run_dir(run):  # simulate --resume through the writable path
                pass
    finally:
        reader.__exit__(None, None, None)
    with rundir.lock_run_dir(run):  # the reader gone: taken
        pass
    assert (run / "run.lock").read_text() == ""


# -- finding 4: a simulate refused by another's lock leaves the holder's new directory ----------


def test_4_a_refused_simulate_leaves_the_holders_new_directory(tmp_path, monkeypatch):
    import fcntl
    import os

    import fedprivopt.simulation.rundir as rundir
    from fedprivopt.data.locks import LockHeldError

    out = tmp_path / "new" / "R"  # both starts found it (and its parent) missing
    taken = []
    lock_run_dir = rundir.lock_run_dir

    def first_takes_it(path):
        # the first start has made R and locked it, and has not yet written run.lock
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        taken.append(fd)
        return lock_run_dir(path)

    monkeypatch.setattr(rundir, "lock_run_dir", first_takes_it)
    try:
        with pytest.raises(LockHeldError, match="in use by another process"):
            with rundir.NewRunDir(out):
                pass
        # before: the refused start removed R (empty yet) and new/ from under the holder
        assert out.is_dir()
        assert os.path.samestat(os.fstat(taken[0]), os.stat(out))
    finally:
        for fd in taken:
            os.close(fd)


# -- finding 5: a read-only view waits for no FIFO put in place of the holder's run.lock --------


def test_5_a_read_only_view_reads_no_fifo_lock_file(tmp_path, monkeypatch):
    import os
    import signal

    import fedprivopt.simulation.rundir as rundir
    from fedprivopt.data.locks import LockHeldError

    run = tmp_path / "trial-001"
    run.mkdir()
    with rundir.lock_run_dir(run):  # the writer, through the writable path
        (run / "run.lock").unlink()
        os.mkfifo(run / "run.lock")  # no writer: opening it for reading would wait for ever
        monkeypatch.setattr(rundir, "on_read_only_fs", lambda path: True)  # the read-only view

        def waited(signum, frame):
            raise RuntimeError("reading_lock waited on the FIFO")  # not an OSError

        previous = signal.signal(signal.SIGALRM, waited)  # a guard: the test fails, not hangs
        signal.alarm(20)
        try:
            with pytest.raises(LockHeldError, match=r"in use by another process \(PID unknown\)"):
                with rundir.reading_lock(run):  # before: blocked in read_bytes
                    pass
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
