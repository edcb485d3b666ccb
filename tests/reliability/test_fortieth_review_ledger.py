"""Issue 15, fortieth hostile review, the ledger: regression tests of its findings.

1. A genuine seeded tree run written by a version of 24-25 November 2026 (d307e8f to 6cd99d8^:
   lines with ``params_sha256``, none with ``participants_sha256``, a header without
   ``records``; made at 6cd99d8^, toy, restart 3, 2 rounds, then the rounds raised),
   ``simulate --resume``: rc 2, ``line 3: a tree round's line without participants_sha256 …;
   the privacy ledger was edited: refusing to resume`` (the thirty-ninth review follow-up's
   open row): a genuine run called edited, with no word of what its owner can do. The
   refusal stays (a secure run's participants cannot be replayed, so accepting such lines
   reopens the thirty-eighth review's finding 3), but where nothing in the ledger marks a later
   version (no participants on any line, no ``partial`` line, no header ``records`` or
   ``data.task_source``) the line says that such a version may have written it, that its ε
   stands and what to do (``LedgerChecks._participants_unrecorded``). An edit that leaves such
   a mark is still called an edit only. The ledger here is the current one with ``records``
   and every ``participants_sha256`` removed: line for line the file 6cd99d8^ writes for this
   run (measured: the same header, events and model digests).
2. An ADADP run of a task by reference (``task = "mod:make"``) written at 0166fb2^ (29 Nov:
   its header without ``data`` or ``records``, each round on one line of two events, no
   ``partial`` lines), resumed once by this version (rc 0, ε 16.29; it appends ``partial``
   lines), then its rounds raised and ``simulate --resume`` again: rc 2, ``line 1: its header
   lacks data, but line 4 is a partial line, which only versions that record data write; the
   privacy ledger was edited``: a genuine run refused as edited by the lines this version
   wrote itself. Now a ``partial`` line is no mark of the header's version when a two-part
   round before it was released whole (``LedgerChecks._whole_two_part_round_before``): rc 0,
   ε 20.35 at 5 rounds as a run of this version. The header's ``data`` and ``records`` deleted
   from a run of this version (``partial`` lines from its first round) is still refused. The
   ledger here is a run of this version rewritten to 0166fb2^'s form (measured: the same lines
   but for the digests of its data-less header).
3. A seeded tree run (restart 3, 2 rounds: its period half done) whose ``privacy_ledger.jsonl``
   was deleted and whose ``task-params.seed`` was edited 0 → 1 in ``config.toml``, rounds
   raised, ``simulate --resume``: rc 0, a note that the ledger was rebuilt from
   ``checkpoint.pt``, and round 3 of the restart period ran on other data at its users'
   indices (accuracy 0.59 → 0.51; the tree's once-a-period bound is by index), where the same
   edit beside the ledger is refused: the rebuilt header was made from the edited
   ``config.toml``, and nothing else recorded the task parameters. Now every checkpoint holds
   a copy of the ledger header (``ledger_header``), and a ledger rebuilt from it is checked as
   a ledger's is (``RunLedger.check_recorded``, from ``_resume_locked`` before anything is
   written): rc 2, one line naming ``task-params.seed`` and the checkpoint. The ledger deleted
   alone still resumes; earlier versions' checkpoints hold no copy and are not checked.
4. A trial of ``tune toy.toml --strategy dp-fedavg --grid server-learning-rate=0.5,1
   --mean-trials 1 --rounds 1 --seed 3`` whose ledger (and summary) was lost, resumed with
   ``simulate --resume`` (rc 0, the ledger rebuilt from its checkpoint), then the same ``tune``:
   rc 2, ``its header names no tuning plan: not a trial that tune ran under this plan``: the
   rebuilt header named no plan, and the genuine trial was refused as foreign. Now the rebuilt
   header names the plan the checkpoint's copy of the header names
   (``RunLedger.check_recorded``'s value, passed to ``convert``): rc 0, the trial reused.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.simulation.files import LEDGER_FILE
from fedprivopt.simulation.run import simulate
from tests.reliability.test_fortieth_review_followup_ledger import (
    as_earlier_checkpoints,
    raise_rounds,
)
from tests.reliability.test_ledger import kept_files
from tests.simulation.test_run import small_config

OLD_VERSION = "or written by a version of 24-25 November 2026"
TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


@pytest.fixture(scope="module")
def tree_run(tmp_path_factory) -> Path:
    """A finished seeded tree run (restart 3, 2 rounds: its period half done)."""
    config = small_config(
        **{"num-server-rounds": 2, "noise-mechanism": "tree", "tree-restart-rounds": 3}
    )
    return simulate(config, tmp_path_factory.mktemp("tree") / "run").out_dir


def _rewrite(run: Path, edit) -> Path:
    path = run / LEDGER_FILE
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    edit(lines)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    as_earlier_checkpoints(run)  # fortieth review follow-up (ledger 5): no copy of the header
    config = run / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 2", "num-server-rounds = 3"))
    return path


def _resume_refused(run: Path, capsys) -> str:
    files = kept_files(run)
    capsys.readouterr()
    rc = main(["simulate", "--resume", str(run), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert kept_files(run) == files
    return err


def _as_24_november(lines) -> None:
    lines[0].pop("records")
    for line in lines[1:]:
        line.pop("participants_sha256")


# -- 1: a tree ledger of a version that recorded no participants --------------------------------
def test_1_a_tree_ledger_of_24_november_is_refused_saying_what_it_may_be(
    tree_run, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(tree_run, run)
    path = _rewrite(run, _as_24_november)
    err = _resume_refused(run, capsys)
    assert f"{path}: line 3: a tree round's line without participants_sha256" in err, err
    assert OLD_VERSION in err and "start a new run in another directory" in err, err
    assert "summary.json" in err, err


def test_1_an_edit_that_leaves_a_later_mark_is_called_an_edit(tree_run, tmp_path, capsys):

    def records(lines):  # the header states what it records: written by a later version
        lines[2].pop("participants_sha256")

    def another_line(lines):  # line 2 keeps its participants
        lines[0].pop("records")
        lines[2].pop("participants_sha256")

    def task_source(lines):  # recorded only after the participants were
        _as_24_november(lines)
        lines[0]["data"] = {"task_source": {"module": "m", "sha256": "0" * 64}}

    for edit in (records, another_line, task_source):
        run = tmp_path / edit.__name__
        shutil.copytree(tree_run, run)
        _rewrite(run, edit)
        err = _resume_refused(run, capsys)
        assert "line 3: a tree round's line without participants_sha256" in err, err
        assert OLD_VERSION not in err, err


# -- 2: an ADADP run of a version before partial lines, resumed twice ---------------------------
MODULE = """
    from fedprivopt.models.toy import ToyClassificationTask

    def make(num_users=40, seed=0):
        return ToyClassificationTask(num_users=num_users, dim=4, seed=3)
"""


@pytest.fixture
def adadp_by_reference(tmp_path, monkeypatch):
    """A 2-round ADADP run of ``review40_ledger:make``."""
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "review40_ledger.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(folder))
    run = tmp_path / "run"
    args = ["simulate", str(TOY), "--rounds", "2", "--out", str(run), "--quiet"]
    try:
        assert main([*args, "--set", "strategy=dp-fedavg-adadp",
                     "--set", "task=review40_ledger:make"]) == 0  # fmt: skip
        yield run
    finally:
        sys.modules.pop("review40_ledger", None)


def _before_partial_lines(lines) -> None:
    """Rewrite a ledger to the form versions before partial lines (and data) wrote it."""
    del lines[0]["records"], lines[0]["data"]
    merged = [lines[0]]
    for line in lines[1:]:
        if line["kind"] == "round" and merged[-1]["kind"] == "partial":
            line["released"][0]["count"] += merged.pop()["released"][0]["count"]
        merged.append(line)
    lines[:] = merged


def test_2_an_adadp_run_of_a_version_before_partial_lines_resumes_twice(adadp_by_reference, capsys):
    run = adadp_by_reference
    _rewrite(run, _before_partial_lines)  # and num-server-rounds 2 -> 3
    lines = (run / LEDGER_FILE).read_text().splitlines()
    assert [json.loads(x)["kind"] for x in lines] == ["header", "round", "round"]
    assert main(["simulate", "--resume", str(run), "--quiet"]) == 0
    assert '"kind": "partial"' in (run / LEDGER_FILE).read_text()  # this version's lines
    for rounds in (4, 5):
        raise_rounds(run, rounds)
        capsys.readouterr()
        assert main(["simulate", "--resume", str(run), "--quiet"]) == 0, capsys.readouterr().err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rounds_completed"] == 5 and round(summary["epsilon"], 2) == 20.35


def test_2_the_header_of_a_run_with_partial_lines_from_its_start_still_refused(
    adadp_by_reference, capsys
):
    run = adadp_by_reference

    def headless(lines):
        del lines[0]["records"], lines[0]["data"]

    _rewrite(run, headless)
    err = _resume_refused(run, capsys)
    assert "line 1: its header lacks data, but line 2 is a partial line" in err, err


# -- 3: a deleted ledger and edited task parameters ----------------------------------------------
def _without_ledger(tree_run: Path, run: Path, seed: int) -> None:
    shutil.copytree(tree_run, run)
    (run / LEDGER_FILE).unlink()
    config = run / "config.toml"
    head, task = config.read_text().split("[task-params]")
    assert "\nseed = 0\n" in task
    head = head.replace("num-server-rounds = 2", "num-server-rounds = 3")
    config.write_text(head + "[task-params]" + task.replace("seed = 0", f"seed = {seed}"))


def test_3_a_deleted_ledger_does_not_let_task_parameters_change(tree_run, tmp_path, capsys):
    run = tmp_path / "edited"
    _without_ledger(tree_run, run, seed=1)
    err = _resume_refused(run, capsys)
    assert "task-params.seed = 1, but the run's privacy ledger records task-params.seed = 0" in err
    assert "the ledger header as checkpoint.pt recorded it" in err, err
    assert not (run / LEDGER_FILE).exists()

    kept = tmp_path / "kept"  # the ledger lost alone: rebuilt, resumed as before
    _without_ledger(tree_run, kept, seed=0)
    assert main(["simulate", "--resume", str(kept), "--quiet"]) == 0, capsys.readouterr().err
    assert json.loads((kept / "summary.json").read_text())["rounds_completed"] == 3


# -- 4: a trial's lost ledger rebuilt by simulate --resume --------------------------------------
def test_4_a_trial_rebuilt_by_simulate_resume_is_still_its_plans(tmp_path, capsys):
    tune = ["tune", str(TOY), "--strategy", "dp-fedavg", "--grid", "server-learning-rate=0.5,1",
            "--mean-trials", "1", "--rounds", "1", "--seed", "3", "--out", str(tmp_path / "T"),
            "--quiet"]  # fmt: skip
    assert main(tune) == 0, capsys.readouterr().err
    (trial,) = sorted((tmp_path / "T" / "runs").iterdir())
    (trial / LEDGER_FILE).unlink()
    (trial / "summary.json").unlink()
    assert main(["simulate", "--resume", str(trial), "--quiet"]) == 0, capsys.readouterr().err
    assert '"tuning_plan"' in (trial / LEDGER_FILE).read_text().splitlines()[0]
    capsys.readouterr()
    assert main(tune) == 0, capsys.readouterr().err
