"""Issue 15, thirty-eighth hostile review (reports: what ``compare``, ``tune`` and reports say).

1. A secure ``compare`` cell stopped after round 3's ledger line and before its checkpoint of
   round 3 (``compare toy.toml --strategies dp-fedavg --rounds 5 --set checkpoint-every=2 --set
   secure=true``, the process killed there; its newest checkpoint is of round 2), then the same
   command: rc 0, the cell resumed and its ε charged for the redone round, but stderr said
   ``1 privacy events of rounds released after round 2 stay accounted (epsilon includes them);
   a round redone from round 3 on is a new release`` twice (with ``--quiet``, and with
   ``--jobs 2``): once when the cell was planned (its files checked as ``--resume`` checks them)
   and once when it was resumed, where ``simulate --resume`` says it once. ``compare-tuned``
   said it of an unfinished trial, which it redoes nothing of. The checks hold the note back
   (``cell_plans.quiet_resume_notes``); the resume says it, once.
2. ``tune`` of a task by reference (or on a StackOverflow data directory), then the task's
   module edited (or another dataset put at the same ``data-dir``), then ``compare-tuned T``:
   rc 2, rightly, but the line said ``T/summary.json: its best trial 'trial-001' is not the one
   its runs select (none, by the tuning's metric and rule); the tuning's files were edited``:
   every trial failed its checks (the task's code, or data, changed) and counted as a lost
   trial, and the user was sent looking for edits of files nobody touched. The released
   trial's own checks come first now: ``T/runs/trial-001: ... the task's code changed since
   the run started ...`` (``task-params.data-dir holds other data than the run was started
   on ...``), as ``--resume`` and ``compare`` say it.
3. ``compare toy.toml --strategies dp-fedavg --tune-grid server-learning-rate=0.5,1
   --mean-trials 1 --seeds 2 --rounds 5 --set checkpoint-every=2 --set secure=true``, the first
   tuning's trial killed after round 3's ledger line (its checkpoint of round 2), then the same
   command: the resumed secure trial is charged its redone round (6 events: one run 18.81,
   the tuning 25.05; the other tuning 17.27 and 22.48). ``summary.csv``'s row said
   ``epsilon`` 25.05 (the costliest tuning's) beside ``epsilon_single_run`` 17.27, the last
   tuning's, under what the row's runs spent. It is the costliest tuning's one run now (18.81),
   as ``epsilon`` is.
4. ``tune toy.toml ...``: ``summary.json``, ``report.md`` (and ``compare-tuned``'s notes) said
   ``Selection: covered. None of the task's 0 evaluation users is in the private population
   (checked by client id)``: the toy task's test set belongs to no user (its
   ``private_evaluation_users()`` is ``(0, 0)``), so no id was checked, and "0 evaluation users"
   read as if the selection had evaluated nothing. Now: ``Selection: covered. The task's
   evaluation data belongs to no user ...`` (``tune_notes.selection_note``).
"""

from __future__ import annotations

import csv
from pathlib import Path

from fedprivopt.cli import main
from fedprivopt.simulation.ledger import RunLedger

PRESET = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = ["--set", "population=12", "--set", "clients-per-round=4", "--set",
         "task-params.num-users=12"]  # fmt: skip
CELL = "dp-fedavg__sigma0.5__seed0"


class _Killed(BaseException):
    """Stands for a SIGKILL: nothing of the run is finished or written after it."""


def _killed_after_round(monkeypatch, stop: int) -> None:
    """Make every run stop right after its ledger records round ``stop``."""
    record = RunLedger.record

    def recorded_then_killed(self, round_num, *args, **kwargs):
        out = record(self, round_num, *args, **kwargs)
        if round_num == stop:
            raise _Killed
        return out

    monkeypatch.setattr(RunLedger, "record", recorded_then_killed)


# -- finding 1: the note on rounds redone after a resume is said once --------------------------


def test_1_a_resumed_secure_cell_notes_its_redone_rounds_once(tmp_path, monkeypatch, caplog):
    out = tmp_path / "cmp"
    argv = ["compare", str(PRESET), "--strategies", "dp-fedavg", "--rounds", "3", "--set",
            "checkpoint-every=2", "--set", "secure=true", "--out", str(out), "--quiet",
            *SMALL]  # fmt: skip
    with monkeypatch.context() as patch:
        _killed_after_round(patch, 3)
        try:
            main(argv)
        except _Killed:
            pass
    cell = out / "runs" / CELL
    assert RunLedger.read(cell).last_round == 3 and not (cell / "summary.json").exists()
    caplog.clear()
    assert main(argv) == 0
    notes = [r.getMessage() for r in caplog.records if "stay accounted" in r.getMessage()]
    assert len(notes) == 1, notes  # twice: planned, then resumed
    assert sum(count for _, count in RunLedger.read(cell).total()) == 4  # round 3 charged twice


# -- finding 2: compare-tuned names what changed under a tuning, not "files were edited" --------

TASK_MODULE = """
from fedprivopt.models.toy import ToyClassificationTask

SEED = 1


class R38Task(ToyClassificationTask):
    def __init__(self, **kw):
        kw["seed"] = SEED
        super().__init__(**kw)
"""


def test_2_compare_tuned_names_the_changed_task_not_edited_files(tmp_path, monkeypatch, capsys):
    import sys

    module = tmp_path / "r38_reports_task.py"
    module.write_text(TASK_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "r38_reports_task", raising=False)
    tuning = tmp_path / "t"
    argv = ["tune", str(PRESET), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "1",
            "--rounds", "1", "--seed", "1", "--out", str(tuning), "--quiet",
            "--set", 'task="r38_reports_task:R38Task"', *SMALL]  # fmt: skip
    assert main(argv) == 0
    module.write_text(TASK_MODULE.replace("SEED = 1", "SEED = 2"))
    capsys.readouterr()
    assert main(["compare-tuned", str(tuning), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "the task's code changed since the run started" in err, err  # "files were edited"
    assert "trial-001" in err and "were edited" not in err, err


# -- finding 3: a tuned row's epsilon_single_run is its costliest tuning's ----------------------


def test_3_a_tuned_rows_single_run_epsilon_is_its_costliest_tunings(tmp_path, monkeypatch):
    import json

    out = tmp_path / "cmp"
    argv = ["compare", str(PRESET), "--strategies", "dp-fedavg", "--tune-grid",
            "server-learning-rate=0.5,1", "--mean-trials", "1", "--seeds", "2", "--rounds", "3",
            "--set", "checkpoint-every=2", "--set", "secure=true", "--out", str(out), "--quiet",
            *SMALL]  # fmt: skip
    with monkeypatch.context() as patch:
        _killed_after_round(patch, 3)  # the first tuning's trial
        try:
            main(argv)
        except _Killed:
            pass
    assert main(argv) == 0
    single = {c.name: json.loads((c / "summary.json").read_text())["epsilon_single_run"]
              for c in (out / "tune").iterdir()}  # fmt: skip
    assert single["dp-fedavg__sigma0.5__seed0"] > single["dp-fedavg__sigma0.5__seed1"]  # redone
    with open(out / "summary.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert float(row["epsilon_single_run"]) == max(single.values())  # was the last tuning's


# -- finding 4: the selection note of a task whose evaluation data belongs to no user ----------


def test_4_the_selection_note_of_a_task_evaluated_on_no_user():
    from fedprivopt.simulation.tune_notes import selection_note

    note = selection_note({"private": 0, "evaluated": 0})  # the toy task's
    assert note.startswith("Selection: covered.") and "0 evaluation users" not in note
    assert "belongs to no user" in note and "checked by client id" not in note
    note = selection_note({"private": 0, "evaluated": 100})  # a task that checked 100 ids
    assert "None of the task's 100 evaluation users" in note and "checked by client id" in note
