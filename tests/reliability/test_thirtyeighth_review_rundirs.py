"""Issue 15, thirty-eighth hostile review (rundirs: one writer, nothing overwritten, ``--out``).

1. ``simulate toy.toml --out R`` stopped (``kill -STOP``) before its first round, ``mv R
   R.old``, then a second ``simulate toy.toml --out R`` (a new ``R``) stopped before its first
   round, then the first one continued: it stopped (right: ``run directory 'R' was moved or
   replaced while this run held it``), and on its way out removed what it took for its own
   unreleased start at the path ``R``: the second run's ``config.toml``, ledger and
   ``run.lock``, and ``R`` itself; the second run then failed (``R: No such file or
   directory``). ``NewRunDir`` now judges and removes nothing when its path no longer names
   the directory it locked (``rundir.still_held``): the second run finishes (rc 0, ε 12.17),
   ``R.old`` keeps the first start's files.
2. While ``simulate --out R`` runs, its ``run.lock`` replaced by a hard link to a user's file
   (``rm R/run.lock; ln notes.txt R/run.lock``), then ``simulate --resume R``: refused (right:
   the directory itself is locked), but the refusal took the lock of the file it found, wrote
   its PID into it and emptied it on release: ``notes.txt`` was left empty. The refusal now only
   probes the file (``data.locks.probe_lock``: opened read-only, never created or written) and
   says the holder's lock file was removed or replaced; ``notes.txt`` is unchanged.
3. ``compare toy.toml --strategies fedavg --rounds 2 --out C --overwrite`` over C's 1-round
   cell whose ``summary.json`` is a directory holding a user's ``thesis.tex`` (also
   ``NewRunDir(cell, overwrite=True)``): the cell counted as a run of ours by its file names,
   the overwrite removed ``config.toml`` and ``metrics.jsonl``, then failed on the directory
   (rc 2, ``summary.json: Is a directory``), leaving half a run that ``--resume`` refused (``has
   no config.toml``). A directory under a run file's name is not one: refused before anything
   is removed (``rundir._check_claimable``: ``holds files that are not part of a fedprivopt
   run (summary.json/)``), the run and ``thesis.tex`` kept.
4. ``compare-tuned T`` of a finished tuning seen through a read-only mount (``mount --bind``
   then ``mount -o remount,bind,ro``: a results volume mounted read-only into another
   container) while a process held the best trial's directory through the writable path (a
   ``--resume`` of it): rc 0, the report written from a run being written (through the
   writable path: rc 2, ``in use by process N``). ``reading_lock`` took no lock on a read-only
   file system, where ``run.lock`` cannot be opened for writing. It now takes a shared
   ``flock`` on the directory itself (``rundir._viewing_lock``), which the writer's exclusive
   one, on the same inode, refuses: rc 2 naming the holder's PID. (The test stands in for the
   mount by patching ``on_read_only_fs``.)
5. ``TMPDIR=R simulate toy.toml --engine flower --rounds 1 --out R`` (also ``--set
   fast-actors=1``, ``compare``/``tune`` with ``--out R``, ``RAY_TMPDIR=R/x``, ``--resume R``):
   rc 0, and Ray's session directory ``R/ray`` (276 kB of logs and sockets) was left among the
   run's files, after which ``R`` held files that are not a run's (``simulate --out R`` and a
   cell's ``--overwrite`` refused it). Now rc 2 before anything is written, one line:
   ``argument --out: 'R' holds TMPDIR = '…', where Ray, which this run starts, writes its
   session files …; set TMPDIR to a directory outside it``
   (``cli_runs.refuse_ray_temp_inside``, from ``build_checked_run`` and ``--resume``).
6. Two ``compare toy.toml … --out C`` started together, C new: both found C new
   (``removed_if_unused``); the first made ``C/runs`` and took ``compare.lock``; the second was
   refused by that lock (right) and, on its way out, took C for its own unused start: it
   removed ``C/runs``, the holder's ``compare.lock`` and C itself, under the running
   comparison (forced here in that order; ``tune`` alike). A start refused by another's lock
   now removes nothing: the directory is the holder's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fedprivopt.cli_args import UsageError
from fedprivopt.cli_runs import build_checked_run
from fedprivopt.data.locks import LockHeldError
from fedprivopt.simulation import rundir
from fedprivopt.simulation.rundir import (
    NewRunDir,
    check_held,
    lock_directory,
    lock_run_dir,
    reading_lock,
    removed_if_unused,
)

# -- finding 1: a claimed directory moved away; the failing start removes nothing at its path --


_SETTINGS = {
    "strategy": "dp-fedavg", "population": 40, "clients-per-round": 10.0,
    "noise-multiplier": 0.5, "clip-norm": 1.0, "sampling": "poisson", "noise-mode": "server",
    "min-shares": 0, "min-shares-quantile": 0.01, "delta": 0.0001, "accountant": "rdp",
    "seed": 0, "secure": False, "server-learning-rate": 1.0, "local-learning-rate": 0.5,
    "local-epochs": 1, "batch-size": 16, "max-examples": 0, "ema-decay": 0.0,
    "server-momentum": 0.0, "task": "toy", "task-params": {"num-users": 40, "seed": 0},
    "side-information.kind": "auto",
}  # fmt: skip
_HEADER = {"ledger": 2, "kind": "header", "round": 0, "events": 0, "accountant": "rdp",
           "pld_discretization": 0.0001, "prv_eps_error": 0.01, "delta": 0.0001,
           "private": True, "settings": _SETTINGS}  # fmt: skip
"""The ledger header ``simulate toy.toml`` writes before its first round."""


def test_1_a_moved_claim_leaves_what_its_path_names_now(tmp_path):
    run = tmp_path / "R"
    theirs = {"config.toml": "strategy = \"dp-fedavg\"\n", "run.lock": "4242\n",
              "privacy_ledger.jsonl": json.dumps(_HEADER) + "\n"}  # fmt: skip
    with pytest.raises(RuntimeError, match="stopped"):
        with NewRunDir(run) as out:
            (out / "config.toml").write_text("ours\n")
            check_held(out)
            os.rename(run, tmp_path / "R.old")  # mv R R.old while the start runs
            run.mkdir()  # another start claims a new R
            for name, text in theirs.items():
                (run / name).write_text(text)
            with pytest.raises(ValueError, match="was moved or replaced"):
                check_held(out)
            raise RuntimeError("stopped: moved")  # as check_held stops the first run
    assert {p.name: p.read_text() for p in run.iterdir()} == theirs  # all removed before
    assert (tmp_path / "R.old" / "config.toml").read_text() == "ours\n"


# -- finding 2: a refused second writer writes nothing into the lock file it finds -------------


def test_2_a_refused_writer_leaves_a_linked_lock_file_alone(tmp_path):
    run, notes = tmp_path / "R", tmp_path / "notes.txt"
    run.mkdir()
    notes.write_text("my notes\n")
    with lock_run_dir(run):  # the running holder
        (run / "run.lock").unlink()
        os.link(notes, run / "run.lock")
        with pytest.raises(LockHeldError, match="so its PID is unknown"):
            with lock_run_dir(run):  # a second claim: the directory's own lock is held
                pass
        assert notes.read_text() == "my notes\n"  # emptied before
    assert notes.read_text() == "my notes\n"


# -- finding 3: a directory under a run file's name is not a run's file ----------------------


def test_3_overwrite_refuses_a_directory_named_as_a_run_file(tmp_path):
    run = tmp_path / "cell"
    run.mkdir()
    kept = {"config.toml": "strategy = \"fedavg\"\n", "metrics.jsonl": '{"round": 1}\n',
            "privacy_ledger.jsonl": json.dumps(_HEADER) + "\n"}  # fmt: skip
    for name, text in kept.items():
        (run / name).write_text(text)
    (run / "summary.json").mkdir()
    (run / "summary.json" / "thesis.tex").write_text("chapter 1\n")
    with pytest.raises(ValueError, match=r"not part of a fedprivopt run \(summary\.json/\)"):
        with NewRunDir(run, overwrite=True):
            pass  # IsADirectoryError before, config.toml and metrics.jsonl removed
    assert {n: (run / n).read_text() for n in kept} == kept
    assert (run / "summary.json" / "thesis.tex").read_text() == "chapter 1\n"


# -- finding 4: a reader on a read-only view of a run is refused while the run is written -----


def test_4_a_read_only_view_is_not_read_while_written(tmp_path, monkeypatch):
    run = tmp_path / "trial-001"
    run.mkdir()
    monkeypatch.setattr(rundir, "on_read_only_fs", lambda path: True)  # the read-only view
    with lock_run_dir(run):  # the writer, through the writable path
        with pytest.raises(LockHeldError, match=f"in use by process {os.getpid()}"):
            with reading_lock(run):  # yielded before: read while written
                pass
    with reading_lock(run) as path:  # no writer: read
        assert path == run


# -- finding 5: Ray's temporary directory inside --out ----------------------------------------


@pytest.mark.parametrize("name", ["TMPDIR", "RAY_TMPDIR"])
def test_5_ray_temp_dir_inside_out_is_refused(tmp_path, monkeypatch, name):
    from fedprivopt.simulation.config import load_config

    out = tmp_path / "R"
    out.mkdir()
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setenv(name, str(out / "tmp"))
    config = load_config(
        Path(__file__).parents[2] / "simulations" / "toy.toml",
        {"engine": "flower", "num-server-rounds": 1},
    )
    with pytest.raises(UsageError, match=f"holds {name} = .*set {name} to a directory outside"):
        build_checked_run(config, out=str(out))  # returned: Ray then wrote R/tmp/ray
    assert not any(out.iterdir())
    monkeypatch.setenv(name, str(tmp_path / "elsewhere"))
    build_checked_run(config, out=str(out))


# -- finding 6: a start refused by another's lock leaves that holder's directory alone ---------


def test_6_a_refused_compare_leaves_the_holders_new_directory(tmp_path):
    out = tmp_path / "C"
    with pytest.raises(LockHeldError, match="in use by process"):
        with removed_if_unused(out, "compare.lock"):  # the second compare: C is new
            (out / "runs").mkdir(parents=True)  # the first compare, meanwhile
            with lock_directory(out, "compare.lock", what="comparison"):  # ... holds C
                (out / "runs").mkdir(parents=True, exist_ok=True)  # the second goes on
                with lock_directory(out, "compare.lock", what="comparison"):  # refused
                    pass
    assert (out / "runs").is_dir()  # C, runs/ and the holder's compare.lock removed before
