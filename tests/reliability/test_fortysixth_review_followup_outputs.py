"""Follow-up of the forty-sixth review of issue 15: outputs (input and processes fixes).

1. ``simulation.run.simulate(load_config('simulations/toy.toml'), 'C/x')`` (the Python API)
   while ``compare ... --out C`` runs (``tune --out T`` alike; the processes reviewer's open
   row, the forty-fifth review's lead 3 through the API). Before: a whole run written into
   ``C/x`` among the comparison's files, where ``simulate --out C/x`` refuses it (rc 2, naming
   the PID). Now: ``simulate`` makes the command line's check
   (``run_places.refuse_inside_writing``, moved there from ``deploy.out_checks``, which
   re-exports it): ``LockHeldError`` naming ``out_dir`` and the holder's PID, nothing written;
   a comparison's own cells (in its process, or in its ``--jobs`` workers) pass as before.
2. ``fedprivopt.data.generate(D, SyntheticConfig(num_clients=100), overwrite=True)`` (the
   Python API; ``ensure_synthetic`` alike) while ``data synth --out D`` holds
   ``D/.stackoverflow.lock`` (the processes reviewer's open row). Before: no lock taken; both
   wrote ``stackoverflow.sqlite.partial``: ``data synth`` ended rc 2 (``... .partial -> ...: No
   such file or directory``) and the call's 100-user dataset replaced the command's. Now:
   ``data.synthetic.generate`` holds the directory's lock unless this thread holds it
   (``data.locks.holds_lock``: ``data synth`` and a task lock before they call, no deadlock, no
   second lock file): ``LockHeldError`` naming ``out_dir`` and the holder's PID, nothing
   written; a lock file it made is removed again (no new file left in ``D``).
3. ``simulate --resume C/runs/CELL`` (its ``num-server-rounds`` raised; ``resume`` of the
   Python API alike) while ``compare --out C`` runs (a trial while ``tune --out T`` runs;
   finding 1's twin for ``--resume``). Before: rc 0, a round released into the cell; measured
   with a real comparison of 40 rounds: the comparison ran its other cell, then stopped rc 2
   (``its run directory changed while this comparison ran``), no report. Now: ``resume``
   refuses it first (``run_places.refuse_inside_writing`` with ``--resume``): one line naming
   the holder's PID, ``wait for it to finish``, nothing written; a comparison's or tuning's own
   resumes pass (its process, its ``--jobs`` workers).
4. ``fedprivopt.data.generate('C/x', SyntheticConfig(...))`` (also ``C`` itself, or a
   directory in one of its runs) where ``C`` is a comparison (its ``compare.lock``), a run or a
   tuning, running or finished. Before: the dataset written there, rc 0, where ``data synth
   --out`` and a task's generation refuse it (fourteenth and sixteenth reviews). Now: ``ValueError``
   naming ``out_dir`` and what it holds, before anything is written
   (``data.synthetic.generate`` through ``run_files_note``, as ``data synth``).
5. ``fedprivopt.data.generate('/', ...)`` (or a link to ``/``, or ``/tmp/../..``), as root.
   Before: nothing refused it: the dataset's four files and the lock would be written into the
   root of the file system, which ``data synth --out /`` and a task's ``data_dir`` refuse since
   the thirty-first review (the test stops such a call before it writes). Now: ``ValueError:
   out_dir '/' is the root of the file system ...`` first (``data.locks.refuse_filesystem_root``).
6. ``fedprivopt.data.generate(D, config, overwrite=True)`` of a dataset whose tasks built token
   stores (``D/.fedprivopt-cache``). Before: the replaced file's stores were kept (their key
   holds its size and time: never used again; tens of MB to GBs each), where ``data synth
   --overwrite`` removes them since the twenty-second review. Now: a call alone removes them
   too (``token_cache.remove_stores`` with the replaced file's key; another file's stores kept;
   under ``data synth``'s lock the command removes and counts them as before).
7. ``data synth --out D --overwrite`` (``generate(D, config, overwrite=True)``) of a synthetic
   dataset where ``D/stackoverflow.sqlite.partial`` (the SQLite file's working copy) is a
   directory (input 5's case for the fifth file it writes). Before: the marker rewritten as
   ``complete: false``, then ``Is a directory``: every task then refused ``D`` as an
   interrupted generation. Now: refused first (``is a directory, where the dataset's
   stackoverflow.sqlite.partial is written``), the dataset and its marker untouched.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedprivopt.cli import main

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"

_HOLDER = """
import fcntl, os, sys, time
d = sys.argv[1]
fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
f = open(os.path.join(d, sys.argv[2]), "w")
fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
f.write(str(os.getpid())); f.flush()
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("lock, inside", [("compare.lock", "x"), ("tune.lock", "runs/t")])
def test_1_the_python_api_refuses_a_run_inside_a_running_comparison(tmp_path, capsys, lock, inside):
    from fedprivopt.data.locks import LockHeldError
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import simulate

    out = tmp_path / "C"
    (out / "runs").mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(out), lock], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        config = load_config(TOY, {"num-server-rounds": 1})
        with pytest.raises(LockHeldError, match=rf"argument out_dir: .* process {holder.pid} is"):
            simulate(config, out / inside)
        # the command line's message as before
        code = main(["simulate", str(TOY), "--rounds", "1", "--out", str(out / inside)])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"argument --out: {out / inside} is inside the " in err
    assert f"process {holder.pid} is writing: choose a directory outside it" in err, err
    assert sorted(p.name for p in out.iterdir()) == sorted([lock, "runs"])
    assert list((out / "runs").iterdir()) == []


_DATA_HOLDER = """
import fcntl, os, sys, time
f = open(os.path.join(sys.argv[1], ".stackoverflow.lock"), "w")
fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
f.write(str(os.getpid())); f.flush()
print("held", flush=True)
time.sleep(120)
"""


def test_2_generate_is_refused_while_another_process_writes_the_directory(tmp_path):
    from fedprivopt.data import SyntheticConfig, generate
    from fedprivopt.data.locks import LockHeldError

    data = tmp_path / "D"
    data.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", _DATA_HOLDER, str(data)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockHeldError, match=rf"out_dir: dataset directory .* {holder.pid}"):
            generate(data, SyntheticConfig(num_clients=3), overwrite=True, workers=1)
    finally:
        holder.kill()
        holder.wait()
    assert [p.name for p in data.iterdir()] == [".stackoverflow.lock"]


@pytest.mark.parametrize("how", ["alone", "exclusive_lock", "file_lock"])
def test_2_generate_under_its_caller_s_lock_or_alone(tmp_path, how):
    import contextlib

    from fedprivopt.data import SyntheticConfig, generate
    from fedprivopt.data.locks import DATA_LOCK, exclusive_lock, file_lock
    from fedprivopt.data.synthetic_files import is_synthetic_dir

    data = tmp_path / "D"
    data.mkdir()
    lock = {"alone": contextlib.nullcontext(), "exclusive_lock": exclusive_lock(data / DATA_LOCK),
            "file_lock": file_lock(data / DATA_LOCK)}[how]  # fmt: skip
    with lock:  # as data synth (exclusive_lock) and a task (file_lock) hold it when they call
        generate(data, SyntheticConfig(num_clients=3), workers=1)
    assert is_synthetic_dir(data)
    if how == "alone":  # the lock file it made is removed: no new file in the directory
        assert not (data / DATA_LOCK).exists()
    else:  # the caller's, released and emptied by it
        assert (data / DATA_LOCK).read_bytes() == b""


@pytest.mark.parametrize("lock", ["compare.lock", "tune.lock"])
def test_3_a_resume_inside_a_running_comparison_is_refused(tmp_path, capsys, lock):
    from fedprivopt.data.locks import LockHeldError
    from fedprivopt.simulation.run import resume

    out = tmp_path / "C"
    cell = out / "runs" / "cell"
    assert main(["simulate", str(TOY), "--rounds", "1", "--out", str(cell), "--quiet"]) == 0
    config = cell / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 1", "num-server-rounds = 2"))
    before = sorted((p.name, p.stat().st_size) for p in cell.iterdir())
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(out), lock], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockHeldError, match=rf"argument --resume: .* process {holder.pid} is"):
            resume(cell)
        capsys.readouterr()
        code = main(["simulate", "--resume", str(cell), "--quiet"])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "wait for it to finish" in err, err
    assert sorted((p.name, p.stat().st_size) for p in cell.iterdir()) == before


@pytest.mark.parametrize("inside", ["", "x", "runs/r/d"])
def test_4_generate_refuses_a_run_or_comparison(tmp_path, inside):
    from fedprivopt.data import SyntheticConfig, generate

    out = tmp_path / "C"
    (out / "runs" / "r").mkdir(parents=True)
    (out / "compare.lock").write_text("")
    (out / "runs" / "r" / "privacy_ledger.jsonl").write_text("")
    before = sorted(str(p) for p in out.rglob("*"))
    with pytest.raises(ValueError, match=r"not a data directory; write the dataset into another"):
        generate(out / inside, SyntheticConfig(num_clients=3), workers=1)
    assert sorted(str(p) for p in out.rglob("*")) == before


def test_5_generate_refuses_the_root_of_the_file_system(tmp_path, monkeypatch):
    from fedprivopt.data import SyntheticConfig, generate, synthetic

    def reached(*args, **kwargs):  # before the fix: stop here, before anything is written
        raise RuntimeError("generate went on to write into the root")

    monkeypatch.setattr(synthetic, "check_free_disk", reached)
    link = tmp_path / "data"
    link.symlink_to("/")
    up = tmp_path.joinpath(*[".."] * len(tmp_path.parts))  # "/tmp/../..", built from its depth
    for root in ("/", link, up):
        with pytest.raises(ValueError, match=r"out_dir .* is the root of the file system"):
            generate(root, SyntheticConfig(num_clients=3), workers=1)


def test_6_generate_overwrite_removes_the_replaced_file_s_token_stores(tmp_path):
    import json

    from fedprivopt.data import SyntheticConfig, generate
    from fedprivopt.data.token_cache import CACHE_DIR, file_key

    data = tmp_path / "D"
    generate(data, SyntheticConfig(num_clients=3), workers=1)
    stores = {}
    for name, key in (("0" * 20, file_key(data / "stackoverflow.sqlite")), ("1" * 20, {"x": 1})):
        stores[name] = data / CACHE_DIR / name
        stores[name].mkdir(parents=True)
        (stores[name] / "meta.json").write_text(json.dumps({"key": {"file": key}}))
    generate(data, SyntheticConfig(num_clients=4), overwrite=True, workers=1)
    assert not stores["0" * 20].exists()  # the replaced file's store, as data synth removes it
    assert stores["1" * 20].exists()  # another file's (a cache directory several share)


def test_7_a_directory_where_the_sqlite_working_copy_is_written_is_refused_first(tmp_path):
    from fedprivopt.data import SyntheticConfig, generate

    data = tmp_path / "D"
    generate(data, SyntheticConfig(num_clients=3), workers=1)
    (data / "stackoverflow.sqlite.partial").mkdir()
    before = {p.name: p.read_bytes() for p in data.iterdir() if p.is_file()}
    with pytest.raises(FileExistsError, match=r"stackoverflow\.sqlite\.partial: is a directory"):
        generate(data, SyntheticConfig(num_clients=4), overwrite=True, workers=1)
    assert {p.name: p.read_bytes() for p in data.iterdir() if p.is_file()} == before
