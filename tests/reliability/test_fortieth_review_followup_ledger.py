"""Issue 15, fortieth review follow-up, ledger and reports: regression tests of its findings.

1. (the fortieth review ledger reviewer's open row) A seeded tree run whose cohort came short in
   a round without a metrics row (a deployment with nodes missing; here ``TreeCohorts.cohort``
   given 3 available users in round 1), restart 3, ``eval-every = 2``, 2 rounds, rounds raised,
   ``simulate --resume``: rc 2, ``checkpoint.pt's tree participation ledger holds 7 users of
   restart period 0, but its rounds 1-2 drew 8 (4 a round): the checkpoint was edited``: a
   genuine run refused (a missing row was taken as a full cohort). Now, where the ledger's line
   of the checkpoint's round records the period's participants (``participants_sha256``, which
   ``check_participants`` compares exactly), a count between the rows' and the rows' plus a full
   cohort a missing row is taken (``audit._check_participants``): rc 0. The participants emptied
   (the ledger's digest no longer matches) or the ledger deleted: still refused.
2. (the ledger reviewer's second open row) The checkpoint's copy of the ledger header (the
   fortieth review's ledger 3) was checked on ``--resume`` only. ``compare toy.toml
   --strategies dp-fedavg --rounds 1`` (small), its cell's ledger deleted and
   ``task-params.seed`` 0 → 1 in its ``config.toml``, then the same ``compare --set
   task-params.seed=1``: rc 2 naming the key only when the cell was resumed, after ``compare``
   had removed its earlier ``report.md``, ``summary.csv`` and plots. And a trial of a tuning
   copied out without its ledger passed ``check_untuned_files`` (``compare-tuned --untuned``)
   as an untuned run. Now ``audit_run_dir`` makes the check for every caller (``compare``'s
   plan, ``compare-tuned --untuned``, ``tune``), and ``RunDirState.recorded_plan`` (the plan
   the checkpoint's copy names) makes ``refuse_trial`` refuse such a copy: rc 2, the report
   kept. The ledger deleted alone is resumed and reported as before.
3. ``load_run`` (``write_report(out, load_runs(R))``) of such a trial without its ledger: ε
   recomputed from its checkpoint, with no word that it is a tuning's trial (the fortieth
   review's reports 2 read the plan from the ledger only). Now the checkpoint's copy of the
   header is read too (``rundata._checkpoint_epsilon``): ``trial_note`` naming
   ``checkpoint.pt's copy of the ledger header``; ``load_tuned`` drops either note.
4. ``write_report(out, runs, title=...)`` stopped (Ctrl-C) while drawing its plots, after its
   ``summary.csv`` and before its ``report.md``, then called again: refused, ``out_dir ...
   holds 'summary.csv', which is not part of a report write_report wrote`` (the fortieth
   review's reports 3 took only a ``report.md`` as the mark of its own report). Now a
   ``summary.csv`` that begins as ``write_summary_csv`` writes it, without a ``report.md``, is
   taken as such a stopped report (``report._stopped_report``) and written over; the user's own
   ``summary.csv`` is still refused.
5. A run of a task by reference (``task = mod:make``, 1 round) whose ledger header lost its
   ``data`` and ``records`` (the form of a version before they were recorded), the module's code
   then edited to other data, rounds raised, ``simulate --resume``: rc 0, the new round on other
   data (nothing compared the data: the header reads as an earlier version's), where the
   checkpoint beside it holds this version's copy of the header (the fortieth review's ledger 3
   checked it only when the ledger was missing). Now a ledger's header is compared with the
   checkpoint's copy (``LedgerChecks.check_header_copy``, from ``audit_run_dir``: ``delta``,
   ``accountant``, ``private``, ``settings``, ``records``, ``data``, ``tuning_plan``): rc 2,
   ``its header's records is not the one checkpoint.pt recorded``. Earlier versions'
   checkpoints (no copy; ``as_earlier_checkpoints``) resume as before; the tests that make an
   earlier version's files from this version's now remove the copy too.
6. ``load_run`` of a trial whose ledger header lost its ``tuning_plan`` (the ledger kept):
   reported as a run of its own, without the trial note. Now the checkpoint's copy of the header
   read beside the ledger (``rundata._note_copied_plan``) gives ``trial_note`` naming it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.privacy import tree
from fedprivopt.simulation import report
from fedprivopt.simulation.checkpoint import LEDGER_HEADER, state_digest
from fedprivopt.simulation.files import LEDGER_FILE
from fedprivopt.simulation.run import simulate
from fedprivopt.simulation.rundata import load_run, trial_note
from fedprivopt.simulation.tune_untuned import check_untuned_files
from tests.simulation.test_run import small_config

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


# -- 1: a tree run whose cohort came short in a round without a metrics row ------------------------
@pytest.fixture(scope="module")
def short_cohort_run(tmp_path_factory) -> Path:
    """A seeded tree run (restart 3, eval-every 2, 2 rounds) whose round 1 drew 3 of 4 users."""
    original = tree.TreeCohorts.cohort

    def cohort(self, round_num, available=None):
        if round_num == 1:  # one user of the cohort unreachable in round 1
            period, _ = tree.tree_position(round_num, self.restart_rounds)
            available = torch.zeros(self.population, dtype=torch.bool)
            available[self.order(period)[:3]] = True
        return original(self, round_num, available)

    config = small_config(
        **{"num-server-rounds": 2, "noise-mechanism": "tree", "tree-restart-rounds": 3,
           "eval-every": 2}
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tree.TreeCohorts, "cohort", cohort)
        return simulate(config, tmp_path_factory.mktemp("short") / "run").out_dir


def test_1_a_tree_run_whose_cohort_came_short_without_a_row_resumes(
    short_cohort_run, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(short_cohort_run, run)
    raise_rounds(run, 3)
    assert main(["simulate", "--resume", str(run), "--quiet"]) == 0, capsys.readouterr().err


def raise_rounds(run: Path, rounds: int) -> None:
    config = run / "config.toml"
    text = config.read_text()
    assert f"num-server-rounds = {rounds - 1}" in text
    config.write_text(
        text.replace(f"num-server-rounds = {rounds - 1}", f"num-server-rounds = {rounds}")
    )


def _cut_participants(run: Path, keep: int) -> None:
    """Keep the first ``keep`` participants of the checkpoint's period; recompute its digest."""
    path = run / "checkpoint.pt"
    state = torch.load(path, weights_only=False)
    cohorts = state["algorithm"]["tree"]["cohorts"]
    assert cohorts["users"].numel() == 7  # rounds 1-2 drew 3 and 4
    cohorts["users"] = cohorts["users"][:keep]
    del state["sha256"]
    state["sha256"] = state_digest(state)
    torch.save(state, path)


@pytest.mark.parametrize("keep", [6, 2])
def test_1_its_participants_cut_or_its_ledger_deleted_are_still_refused(
    short_cohort_run, tmp_path, capsys, keep
):
    run = tmp_path / "run"
    shutil.copytree(short_cohort_run, run)
    raise_rounds(run, 3)
    _cut_participants(run, keep)  # between the row's 4 and 8, and below it
    assert main(["simulate", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"holds {keep} users of restart period 0" in err and "edited" in err, err
    run = tmp_path / "deleted"
    shutil.copytree(short_cohort_run, run)
    raise_rounds(run, 3)
    (run / LEDGER_FILE).unlink()  # nothing records the participants: a full cohort is assumed
    assert main(["simulate", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "holds 7 users of restart period 0" in err and "came short in a round" in err, err


# -- 2: the checkpoint's copy of the ledger header, checked by every caller of audit_run_dir -------
SMALL_SET = ["--set", "population=12", "--set", "clients-per-round=4",
             "--set", "task-params.num-users=12"]  # fmt: skip


def _compare(out: Path, *extra: str) -> list[str]:
    return ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--out", str(out),
            "--quiet", *SMALL_SET, *extra]  # fmt: skip


def test_2_compare_refuses_a_rebuilt_ledgers_edit_before_removing_its_report(tmp_path, capsys):
    out = tmp_path / "C"
    assert main(_compare(out)) == 0, capsys.readouterr().err
    (cell,) = (out / "runs").iterdir()
    (cell / LEDGER_FILE).unlink()
    config = cell / "config.toml"
    text = config.read_text()
    assert text.count("\nseed = 0\n") == 2  # the strategy's and the task's, which is last
    head, _, tail = text.rpartition("\nseed = 0\n")
    config.write_text(f"{head}\nseed = 1\n{tail}")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(_compare(out, "--set", "task-params.seed=1")) == 2
    err = capsys.readouterr().err
    assert "task-params.seed" in err and "checkpoint.pt recorded it" in err, err
    assert len(err.strip().splitlines()) == 1, err
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after == before  # report.md, summary.csv and the plots kept
    # the ledger deleted alone: the cell is resumed and the comparison reported as before
    config.write_text(text)
    assert main(_compare(out)) == 0, capsys.readouterr().err
    assert (cell / LEDGER_FILE).is_file() and (out / "report.md").is_file()


@pytest.fixture(scope="module")
def trial_without_ledger(tmp_path_factory) -> Path:
    """A 1-round "trial" (its ledger names a tuning plan) copied out without its ledger."""
    root = tmp_path_factory.mktemp("trial")
    trial = root / "T2" / "runs" / "trial-001"
    simulate(small_config(**{"num-server-rounds": 1, "seed": 5}), trial, tuning_plan="b" * 64)
    copy = root / "U" / "r"
    shutil.copytree(trial, copy)
    (copy / LEDGER_FILE).unlink()  # a trial of a tuning not given to compare-tuned
    return copy


def test_2_a_trial_without_its_ledger_is_still_no_untuned_run(trial_without_ledger):
    with pytest.raises(ValueError, match=r"checkpoint.pt \(its copy of the ledger header\)"):
        check_untuned_files([SimpleNamespace(path=trial_without_ledger)])


# -- 3: load_run of a trial without its ledger ---------------------------------------------------
def test_3_load_run_notes_a_trial_without_its_ledger(trial_without_ledger):
    run = load_run(trial_without_ledger)
    source = "checkpoint.pt's copy of the ledger header"
    assert trial_note(trial_without_ledger, source) in run.warnings, run.warnings


# -- 4: write_report again after one stopped before its report.md ---------------------------------
def test_4_a_report_stopped_before_its_report_md_is_written_again(
    trial_without_ledger, tmp_path, monkeypatch
):
    runs = [load_run(trial_without_ledger)]
    out = tmp_path / "results"

    def stopped(*_args, **_kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as mp:
        mp.setattr(report, "draw_privacy_utility", stopped)
        with pytest.warns(UserWarning), pytest.raises(KeyboardInterrupt):
            report.write_report(out, runs, title="t")
    assert (out / "summary.csv").is_file() and not (out / "report.md").exists()
    with pytest.warns(UserWarning):
        assert report.write_report(out, runs, title="t") == out / "report.md"
    # the user's own summary.csv alone is still not written over
    own = tmp_path / "own"
    own.mkdir()
    (own / "summary.csv").write_text("run,accuracy\nmine,0.9\n")
    with pytest.warns(UserWarning), pytest.raises(ValueError, match=r"holds 'summary\.csv'"):
        report.write_report(own, runs, title="t")


# -- 5: a ledger's header stripped to an earlier version's, beside a checkpoint's copy ------------
def as_earlier_checkpoints(run: Path) -> None:
    """Remove the copy of the ledger header from ``run``'s checkpoints, as versions before the
    fortieth review wrote them (no ``ledger_header``); for tests that make an earlier version's
    files from this version's."""
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        path = run / name
        if path.is_file():
            state = torch.load(path, weights_only=False)
            state.pop(LEDGER_HEADER, None)
            del state["sha256"]
            state["sha256"] = state_digest(state)
            torch.save(state, path)


MODULE = """
from fedprivopt.models.toy import ToyClassificationTask

def make(num_users=12, seed=0):
    return ToyClassificationTask(num_users=num_users, dim=4, seed={seed})
"""


def test_5_a_header_stripped_of_its_data_is_refused_by_the_checkpoints_copy(
    tmp_path, monkeypatch, capsys
):
    folder = tmp_path / "modules"
    folder.mkdir()
    module = folder / "review40f_ledger.py"
    module.write_text(MODULE.format(seed=3))
    monkeypatch.syspath_prepend(str(folder))
    run = tmp_path / "run"
    args = ["simulate", str(TOY), "--rounds", "1", "--out", str(run), "--quiet", *SMALL_SET,
            "--set", "task=review40f_ledger:make"]  # fmt: skip
    try:
        assert main(args) == 0, capsys.readouterr().err
        genuine = tmp_path / "genuine"
        shutil.copytree(run, genuine)
        path = run / LEDGER_FILE
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        del lines[0]["records"], lines[0]["data"]  # as a version before data was recorded
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        for where in (run, genuine):
            raise_rounds(where, 2)
        assert main(["simulate", "--resume", str(genuine), "--quiet"]) == 0
        module.write_text(MODULE.format(seed=4))  # other data
        sys.modules.pop("review40f_ledger", None)
        capsys.readouterr()
        assert main(["simulate", "--resume", str(run), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "its header's records is not the one checkpoint.pt recorded" in err, err
        as_earlier_checkpoints(run)  # the files of a version before records: resumed as before
        assert main(["simulate", "--resume", str(run), "--quiet"]) == 0
    finally:
        sys.modules.pop("review40f_ledger", None)


# -- 6: load_run of a trial whose ledger header lost its tuning plan ------------------------------
def test_6_load_run_notes_a_trial_whose_header_lost_its_plan(tmp_path):
    trial = tmp_path / "T" / "runs" / "trial-001"
    simulate(small_config(**{"num-server-rounds": 1, "seed": 5}), trial, tuning_plan="c" * 64)
    path = trial / LEDGER_FILE
    lines = path.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    del header["tuning_plan"]
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    run = load_run(trial)
    source = "checkpoint.pt's copy of the ledger header"
    assert trial_note(trial, source) in run.warnings, run.warnings
