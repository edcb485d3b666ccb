"""One writer per run directory, and a directory that holds anything is never overwritten.

The lock tests start real processes; each is stopped by its PID in a ``finally`` (also when the
test fails).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.simulation import engines
from fedprivopt.simulation.files import (
    CHECKPOINT,
    LEDGER_FILE,
    LOCK_FILE,
    PREVIOUS_CHECKPOINT,
    read_rows,
)
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.simulation.rundir import lock_run_dir
from fedprivopt.simulation.writer import RunWriter
from tests.reliability.test_fuzz_cli import run_cli
from tests.simulation.test_run import PRESET, SMALL, small_config

SETS = [f"--set={k}={v}" for k, v in SMALL.items()]
SETS_1 = [f"--set={k}={v}" for k, v in {**SMALL, "num-server-rounds": 1}.items()]  # one round


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fedprivopt.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


# -- one writer per run directory -----------------------------------------------------------------


def test_a_second_resume_of_a_running_directory_is_refused_naming_the_holder(tmp_path):
    """Two ``--resume`` processes on one directory used to both run: duplicate metrics rows, a
    crash on ``checkpoint.pt.tmp`` and a ledger counting 10 where 13 releases happened."""
    out = simulate(small_config(**{"num-server-rounds": 2}), tmp_path / "run").out_dir
    text = (out / "config.toml").read_text()
    text = text.replace("num-server-rounds = 2", "num-server-rounds = 100000")
    (out / "config.toml").write_text(text.replace("checkpoint-every = 1", "checkpoint-every = 50"))
    first = _cli("simulate", "--resume", str(out), "--quiet")
    second = None
    try:
        deadline = time.monotonic() + 120
        while first.poll() is None and time.monotonic() < deadline:
            if len(read_rows(out / "metrics.jsonl")) >= 4:
                break  # the first process holds the directory and is running rounds
            time.sleep(0.01)
        assert first.poll() is None, first.communicate()
        second = _cli("simulate", "--resume", str(out), "--quiet")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert str(first.pid) in err and "in use" in err, err
        assert first.poll() is None  # the first one was not disturbed
        # a fresh start over the held directory, in this process (the holder is the other one)
        code, _, err = run_cli(["simulate", str(PRESET), "--out", str(out), "--quiet", *SETS])
        assert code == 2 and len(err.strip().splitlines()) == 1, err
    finally:
        _stop(first)
        if second is not None:
            _stop(second)
    rounds = [r["round"] for r in read_rows(out / "metrics.jsonl")]
    assert rounds == sorted(set(rounds))  # no duplicated rows
    with lock_run_dir(out):  # the holder was killed: the kernel released its lock
        pass


def test_the_lock_is_held_for_the_whole_run_and_released_after(tmp_path, monkeypatch):
    out = tmp_path / "run"
    seen = []

    def probe(row):
        # during the run, in this same process, a second claim of the directory is refused
        with pytest.raises(ValueError, match=rf"in use by process {os.getpid()}"):
            with lock_run_dir(out):
                pass
        seen.append(row["round"])

    original = RunWriter.on_round

    def on_round(self, result, eval_metrics):
        self.progress = probe
        original(self, result, eval_metrics)

    monkeypatch.setattr(RunWriter, "on_round", on_round)
    simulate(small_config(**{"num-server-rounds": 2}), out)
    assert seen == [1, 2]
    with lock_run_dir(out):  # released when the run ended
        assert (out / LOCK_FILE).read_text().strip() == str(os.getpid())


def _holding(lock: str, path: Path) -> subprocess.Popen:
    """A process holding ``fedprivopt.simulation.<lock>(path)`` until it is stopped.

    ``lock`` is ``"module.function"`` (``"rundir.lock_run_dir"``); returns once it holds it.
    """
    module, name = lock.rsplit(".", 1)
    code = (
        f"import time\nfrom fedprivopt.simulation.{module} import {name}\n"
        f"with {name}({str(path)!r}):\n    print('locked', flush=True)\n    time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked", proc.communicate()
    return proc


def test_resume_refuses_at_once_while_another_process_holds_the_lock(tmp_path):
    out = simulate(small_config(**{"num-server-rounds": 2}), tmp_path / "run").out_dir
    holder = _holding("rundir.lock_run_dir", out)
    try:
        with pytest.raises(ValueError, match=rf"in use by process {holder.pid}"):
            resume(out)
    finally:
        _stop(holder)
    assert resume(out).rounds_completed == 2  # the holder is gone: the lock is free


def test_deleting_the_lock_file_does_not_let_a_second_writer_in(tmp_path, capsys):
    """Found by a fourth review: the lock was a ``flock`` on ``run.lock``; with the holder
    suspended, ``rm run.lock`` let a second ``--resume`` lock a new file and run, and both
    released rounds. The lock is now on the directory itself; the same for ``compare.lock``."""
    from fedprivopt.simulation.cells import COMPARE_LOCK, lock_compare_dir

    out = simulate(small_config(**{"num-server-rounds": 2}), tmp_path / "run").out_dir
    before = _snapshot(out)
    holder = _holding("rundir.lock_run_dir", out)
    try:
        (out / LOCK_FILE).unlink()
        with pytest.raises(ValueError, match="in use by another process"):
            resume(out)
        assert main(["simulate", "--resume", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "in use" in err, err
        (out / LOCK_FILE).write_text(f"{holder.pid}\n")  # a file put back is not the lock either
        with pytest.raises(ValueError, match="in use"):
            resume(out)
    finally:
        _stop(holder)
    after = _snapshot(out)
    after.pop(LOCK_FILE, None)
    before.pop(LOCK_FILE, None)
    assert after == before  # the refused resumes wrote nothing
    assert resume(out).rounds_completed == 2  # the holder is gone: the lock is free
    cmp = tmp_path / "cmp"
    cmp.mkdir()
    holder = _holding("cells.lock_compare_dir", cmp)
    try:
        (cmp / COMPARE_LOCK).unlink()
        with pytest.raises(ValueError, match="in use by another process"):
            with lock_compare_dir(cmp):
                pass
    finally:
        _stop(holder)
    with lock_compare_dir(cmp):
        pass


# -- a directory that holds anything is never overwritten ------------------------------------------


def test_an_unrelated_users_files_are_not_overwritten(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"my": "numbers"}\n')
    before = _snapshot(out)
    with pytest.raises(ValueError, match=r"metrics\.jsonl"):
        simulate(small_config(), out)
    assert main(["simulate", str(PRESET), "--out", str(out), "--quiet", *SETS]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(out) in err
    assert _snapshot(out) == before and sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]


def test_an_earlier_run_without_config_toml_is_not_overwritten(tmp_path):
    out = simulate(small_config(**{"num-server-rounds": 3}), tmp_path / "run").out_dir
    (out / "config.toml").unlink()
    before = _snapshot(out)
    for name in ("metrics.jsonl", "summary.json", LEDGER_FILE, CHECKPOINT, PREVIOUS_CHECKPOINT):
        assert name in before
    with pytest.raises(ValueError, match="not empty"):
        simulate(small_config(), out)
    with pytest.raises(ValueError, match="not empty"):
        simulate(small_config(), out, overwrite=True)  # not recognisably a run: never
    assert _snapshot(out) == before


def test_overwrite_replaces_only_a_recognisable_run(tmp_path):
    out = simulate(small_config(**{"num-server-rounds": 3}), tmp_path / "run").out_dir
    with pytest.raises(ValueError, match="already holds a run"):
        simulate(small_config(), out)
    outcome = simulate(small_config(**{"num-server-rounds": 2}), out, overwrite=True)
    assert outcome.rounds_completed == 2
    assert [r["round"] for r in read_rows(out / "metrics.jsonl")] == [1, 2]
    (out / "notes.txt").write_text("mine\n")  # a file that is not part of a run
    with pytest.raises(ValueError, match=r"notes\.txt"):
        simulate(small_config(), out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine\n"


def test_the_debris_of_a_start_killed_before_config_toml_does_not_block_a_new_start(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text("12345\n")  # a dead process's lock file
    (out / "config.toml.tmp").write_text("strategy = ")  # a torn atomic write
    assert simulate(small_config(**{"num-server-rounds": 1}), out).rounds_completed == 1


# -- a failed start leaves no half-made run --------------------------------------------------------


class _DataError(ValueError):
    pass


def _failing_engine(*args, **kwargs):
    raise _DataError("data: stackoverflow.sqlite: client 'u7' has a damaged example")


@pytest.mark.parametrize("existed", [False, True], ids=["new-dir", "existing-empty-dir"])
def test_a_start_that_fails_before_any_round_leaves_no_half_made_run(
    tmp_path, monkeypatch, existed
):
    out = tmp_path / "a" / "b" / "run"
    if existed:
        out.mkdir(parents=True)
    monkeypatch.setattr(engines, "make_cohort_train", _failing_engine)
    with pytest.raises(_DataError):
        simulate(small_config(), out)
    if existed:
        assert out.is_dir() and list(out.iterdir()) == []  # what existed is kept, as it was
    else:
        assert not (tmp_path / "a").exists()  # every directory this start created is gone
    monkeypatch.undo()
    assert simulate(small_config(**{"num-server-rounds": 1}), out).rounds_completed == 1


def test_a_run_that_fails_after_released_rounds_keeps_them(tmp_path, monkeypatch):
    out = tmp_path / "run"
    original = RunWriter.on_round

    def on_round(self, result, eval_metrics):
        original(self, result, eval_metrics)
        if result.round_num == 2:
            raise _DataError("data: a damaged example in round 3's cohort")

    monkeypatch.setattr(RunWriter, "on_round", on_round)
    with pytest.raises(_DataError):
        simulate(small_config(), out)
    monkeypatch.undo()
    lines = [x for x in read_rows(out / LEDGER_FILE) if x["kind"] == "round"]
    assert [x["round"] for x in lines] == [1, 2]  # released: kept, and resumable
    assert resume(out).rounds_completed == 6


@pytest.mark.parametrize("kind", ["notes", "report", "single run"])
def test_compare_never_writes_into_a_directory_that_is_not_a_comparison(tmp_path, capsys, kind):
    """Found when variants of case 6 were tried: compare replaced a user's report.md."""
    out = tmp_path / "mine"
    if kind == "single run":
        simulate(small_config(**{"num-server-rounds": 2}), out)
    else:
        out.mkdir()
        name = "notes.txt" if kind == "notes" else "report.md"
        (out / name).write_text("my own words\n")
        (out / "summary.csv").write_text("mine,1\n")
    before = _snapshot(out)
    argv = ["compare", str(PRESET), "--strategies", "dp-fedavg", "--quiet"]
    for extra in ([], ["--overwrite"]):
        assert main([*argv, "--out", str(out), *SETS_1, *extra]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "which compare did not write" in err, err
    assert _snapshot(out) == before


def test_compare_continues_in_its_own_directory(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", str(PRESET), "--strategies", "dp-fedavg", "--quiet"]
    assert main([*argv, "--out", str(out), *SETS_1]) == 0
    assert main([*argv, "--out", str(out), *SETS_1]) == 0
    assert "1 of 1 runs from an earlier call" in capsys.readouterr().out


def test_a_run_stops_when_its_directory_is_replaced_under_it(tmp_path, monkeypatch):
    """A variant of the deleted lock file: the whole directory moved aside and a copy put in
    its place is a new directory another process can lock, and the holder, which writes by
    path, would write into the copy too; the holder now stops before the next round."""
    import shutil

    out = tmp_path / "run"
    original = RunWriter.on_round

    def on_round(self, result, eval_metrics):
        original(self, result, eval_metrics)
        if result.round_num == 2:
            out.rename(tmp_path / "moved")
            shutil.copytree(tmp_path / "moved", out)

    monkeypatch.setattr(RunWriter, "on_round", on_round)
    with pytest.raises(ValueError, match="was moved or replaced while this run held it"):
        simulate(small_config(), out)
    lines = [x for x in read_rows(out / LEDGER_FILE) if x["kind"] == "round"]
    assert [x["round"] for x in lines] == [1, 2]  # nothing released into the copy
    monkeypatch.undo()
    with lock_run_dir(out):  # released
        pass
