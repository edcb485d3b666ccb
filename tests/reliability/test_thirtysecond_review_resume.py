"""Issue 15, thirty-second hostile review (resume and the audit of a run directory): tests.

1. A finished 2-round toy run whose last ``metrics.jsonl`` row had ``eval_accuracy`` edited to
   ``"x"``, ``null``, ``[1]``, ``true`` or an integer of 400 digits (or its ``epsilon`` to such
   an integer), then ``simulate --resume R``: ``"x"`` ended rc 2 with ``Unknown format code 'f'
   for object of type 'str'`` (naming nothing) after the new ``summary.json`` was written,
   ``null`` and ``[1]`` in a ``TypeError`` traceback and the 400 digits in an ``OverflowError``
   traceback (rc 1), and ``true`` was reported as ``eval_accuracy = 1.0000`` with rc 0 (a
   report: NaN). ``summary.json``'s ``epsilon`` edited to such an integer was an
   ``OverflowError`` traceback too. A run writes floats there (NaN and infinities as ``json``
   writes them), so ``read_rows`` now refuses a row whose ``epsilon``, ``delta`` or ``eval_*``
   value is not a number that fits a float: rc 2, one line naming the file, line and key,
   before anything is written; an ε integer beyond the floats states ``inf`` (refused against
   the ledger as any ε above it), and ``rundata.as_float`` reads it as an infinity.
2. The last row's ``round`` edited to ``10**20`` (or an integer of 1,500 digits): ``--resume``
   said ``R/privacy_ledger.jsonl ends at round 2, but metrics.jsonl or summary.json show round
   100000000000000000000 was released: the ledger is incomplete (truncated or edited)``,
   blaming the ledger, with the 1,500 digits written out. A run has at most ``MAX_ROUNDS`` =
   10**6 rounds, so such a row was not written by one: ``read_rows`` refuses it naming
   ``metrics.jsonl``, the line and the round (cut), as the thirty-first review did for a
   ledger line's round; ``summary.json``'s ``rounds_completed`` of ``10**20`` likewise (was the
   same message blaming the ledger).
3. A secure run (``secure = true``, ``checkpoint-every = 2``, ``target-epsilon`` = the ε of 3
   rounds) killed after round 3 was released, its checkpoint of round 2: ``--resume`` rightly
   stopped at round 2 (``budget``: round 3 stays charged and its redo would exceed the target),
   ε of the 3 releases. But the run then stayed unfinished for ever (``its ledger records round
   3, its checkpoint round 2``): ``compare`` resumed the cell on every call, ``compare-tuned
   --untuned`` refused it (``it is not finished: ...; --resume it first``, which changed
   nothing) and ``tune`` counted such a trial as failed. A run whose summary says it stopped at
   its budget at the checkpoint's round, where the budget allows no further round, is now
   finished. Killed before its first checkpoint (``checkpoint-every = 3``, the target the ε of
   1 round, killed after round 1), the resume stopped at round 0 (rc 0), after which every
   ``--resume`` and ``compare`` refused the run: ``has no checkpoint, but its metrics, summary
   or privacy ledger show rounds up to 1 were released; restarting from round 0 would reset
   the privacy accountant`` (it would not: the ledger keeps the release charged). Such a run
   (a ledger, a summary stopped at its budget at round 0) is now resumed and finished.
4. ``load_run`` (the reports' reader, documented API) of a run whose budget allowed no round,
   its ``summary.json``'s ``final`` edited to ``"eval_accuracy"``, ``["eval_accuracy"]`` or
   ``5``: ``RunData.has_metric`` or ``final_value`` raised ``TypeError``. A ``final`` that is
   not a mapping is now read as none (reports take final metrics from the rows).
5. ``simulate toy.toml --out C/..`` (C new, the working directory holding files) was refused
   (``out directory 'C/..' is not empty``) but left the empty directory ``C`` it had created:
   removing what a failed start created stopped at the first directory it could not remove
   (``C/..``). Each created directory is now tried, deepest first (``rmdir`` removes only an
   empty one).
6. ``--resume`` of a run whose ``checkpoint.pt`` is corrupt (resumed from
   ``checkpoint.prev.pt``, rc 0) first logged torch's whole 8-line text, which advises
   re-running ``torch.load`` with ``weights_only=False`` (arbitrary code execution). The
   warning is now one line, the reason cut as in the refusal of two unreadable checkpoints,
   naming the checkpoint the run continues from.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.simulation.audit import audit_run_dir
from fedprivopt.simulation.files import (
    CHECKPOINT,
    LEDGER_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    read_rows,
    stated_epsilons,
)
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.simulation.rundata import as_float, load_run
from fedprivopt.simulation.rundir import lock_run_dir
from fedprivopt.simulation.tune_untuned import check_untuned_files
from tests.reliability.test_ledger import _set
from tests.reliability.test_thirtyfirst_review_ledger import _killed_after_round_3
from tests.simulation.test_run import small_config

HUGE = "1" + "0" * 400  # an integer JSON reads and no float holds


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-round toy run (never changed: each test copies it)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    return simulate(small_config(**{"num-server-rounds": 2}), out).out_dir


def _copy(finished: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def _edit_last_row(out: Path, key: str, text: str) -> None:
    rows = read_rows(out / METRICS_FILE)
    rows[-1][key] = "@@"
    lines = "".join(json.dumps(r) + "\n" for r in rows)
    (out / METRICS_FILE).write_text(lines.replace('"@@"', text))


def _refused(out: Path, capsys) -> str:
    summary = (out / SUMMARY_FILE).read_bytes()
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert (out / SUMMARY_FILE).read_bytes() == summary  # nothing written
    return lines[0]


# -- 1: metrics rows and a summary whose numbers are not numbers -----------------------------------
@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("eval_accuracy", '"x"'),  # was: Unknown format code 'f' ..., summary.json rewritten
        ("eval_accuracy", "null"),  # was: TypeError traceback, rc 1
        ("eval_accuracy", "[1]"),
        ("eval_accuracy", "true"),  # was: rc 0, eval_accuracy = 1.0000
        ("eval_accuracy", HUGE),  # was: OverflowError traceback, rc 1
        ("epsilon", HUGE),
        ("eval_loss", '"0.5"'),
    ],
)
def test_1_a_rows_value_that_is_not_a_number_is_refused_naming_it(
    finished, tmp_path, capsys, key, text
):
    out = _copy(finished, tmp_path)
    _edit_last_row(out, key, text)
    line = _refused(out, capsys)
    assert f"{METRICS_FILE}: line 2: {key} must be a number" in line
    assert "Traceback" not in line and len(line) < 400


def test_1_a_summary_epsilon_beyond_the_floats_is_refused_in_one_line(finished, tmp_path, capsys):
    out = _copy(finished, tmp_path)
    summary = json.loads((out / SUMMARY_FILE).read_text())
    summary["epsilon"] = "@@"
    (out / SUMMARY_FILE).write_text(json.dumps(summary).replace('"@@"', HUGE))
    summary_bytes = (out / SUMMARY_FILE).read_bytes()
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 2  # was: OverflowError, rc 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "summary.json reported epsilon inf" in err[0]
    assert (out / SUMMARY_FILE).read_bytes() == summary_bytes


def test_1_an_integer_beyond_the_floats_reads_as_an_infinity():
    assert as_float(int(HUGE)) == math.inf and as_float(-int(HUGE)) == -math.inf
    stated = stated_epsilons([{"round": 1, "epsilon": int(HUGE)}], {"epsilon": -int(HUGE)})
    assert stated == [("metrics.jsonl (round 1)", math.inf), ("summary.json", -math.inf)]


# -- 2: a row's round beyond any run ---------------------------------------------------------------
@pytest.mark.parametrize("text", ["100000000000000000000", "1" + "0" * 1500])
def test_2_a_rows_round_beyond_any_run_is_refused_as_an_edit_of_the_rows(
    finished, tmp_path, capsys, text
):
    out = _copy(finished, tmp_path)
    _edit_last_row(out, "round", text)
    line = _refused(out, capsys)  # was: the ledger "is incomplete (truncated or edited)"
    assert f"{METRICS_FILE}: line 2: round" in line and "beyond the 1,000,000" in line
    assert LEDGER_FILE not in line and len(line) < 400


def test_2_a_summarys_rounds_beyond_any_run_are_refused_as_an_edit_of_the_summary(
    finished, tmp_path, capsys
):
    out = _copy(finished, tmp_path)
    summary = json.loads((out / SUMMARY_FILE).read_text())
    (out / SUMMARY_FILE).write_text(json.dumps({**summary, "rounds_completed": 10**20}))
    line = _refused(out, capsys)
    assert f"{SUMMARY_FILE} is unreadable (rounds_completed 100000000000000000000 is beyond" in line
    assert LEDGER_FILE not in line


# -- 3: a secure run whose budget allows none of its lost rounds -----------------------------------
def test_3_a_secure_run_stopped_by_its_budget_before_its_lost_rounds_is_finished(tmp_path, capsys):
    three = simulate(small_config(**{"num-server-rounds": 3}), tmp_path / "three").epsilon
    config = small_config(**{"secure": True, "checkpoint-every": 2, "target-epsilon": three})
    ref = simulate(config, tmp_path / "ref").out_dir  # stops at round 3, its budget
    killed = tmp_path / "killed"
    _killed_after_round_3(ref, killed)  # round 3 released, the checkpoint of round 2
    outcome = resume(killed)  # redoing round 3 would exceed the target
    assert (outcome.rounds_completed, outcome.stopped_reason) == (2, "budget")
    assert outcome.epsilon == three
    with lock_run_dir(killed):
        state = audit_run_dir(killed)
    assert state.unfinished() is None  # was: 'its ledger records round 3, its checkpoint round 2'
    assert state.last_released == 3 and state.alg.round_num == 2
    check_untuned_files([load_run(killed)])  # compare-tuned --untuned: was "--resume it first"


def test_3_one_killed_before_its_first_checkpoint_is_resumed_again_and_finished(tmp_path, capsys):
    one = simulate(small_config(**{"num-server-rounds": 1}), tmp_path / "one").epsilon
    config = small_config(**{"secure": True, "checkpoint-every": 3, "target-epsilon": one})
    out = simulate(config, tmp_path / "run").out_dir  # stops at round 1, its budget
    (out / CHECKPOINT).unlink()  # as killed after round 1, before its first checkpoint
    (out / SUMMARY_FILE).unlink()
    outcome = resume(out)  # from round 0; redoing round 1 would exceed the target
    assert (outcome.rounds_completed, outcome.stopped_reason, outcome.epsilon) == (0, "budget", one)
    # was refused: "has no checkpoint, but its ... privacy ledger show rounds up to 1 were
    # released; restarting from round 0 would reset the privacy accountant"
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 0
    assert capsys.readouterr().out.startswith("0 rounds (budget), epsilon = ")
    with lock_run_dir(out):
        assert audit_run_dir(out).unfinished() is None


# -- 4: a summary's final block that is not a mapping ----------------------------------------------
@pytest.mark.parametrize("final", ["eval_accuracy", ["eval_accuracy"], 5])
def test_4_a_summarys_final_block_that_is_not_a_mapping_is_none(tmp_path, final):
    out = simulate(small_config(**{"target-epsilon": 1.0}), tmp_path / "run").out_dir  # no round
    summary = json.loads((out / SUMMARY_FILE).read_text())
    (out / SUMMARY_FILE).write_text(json.dumps({**summary, "final": final}))
    run = load_run(out)
    assert not run.has_metric("eval_accuracy")  # was: TypeError
    assert math.isnan(run.final_value("eval_accuracy"))


# -- 5: a refused --out through a new directory's '..' ---------------------------------------------
def test_5_a_refused_out_through_a_new_directorys_parent_leaves_nothing(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(ValueError, match="not empty"):
        simulate(small_config(), tmp_path / "C" / "..")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # was: C left behind


# -- 6: the warning of an unreadable checkpoint resumed from the previous one ----------------------
def test_6_an_unreadable_checkpoint_is_one_warning_line(finished, tmp_path, caplog):
    out = _copy(finished, tmp_path)
    _set(out, "num-server-rounds", "3")
    (out / CHECKPOINT).write_bytes(b"garbage\n")  # a corrupt file: torch's text is 8 lines
    with caplog.at_level(logging.WARNING, logger="fedprivopt.simulation.audit"):
        assert resume(out).rounds_completed == 3
    (message,) = [r.getMessage() for r in caplog.records if r.name.endswith(".audit")]
    assert "\n" not in message and "weights_only` set to `False`" not in message
    assert message.startswith("checkpoint checkpoint.pt is unreadable (")
    assert message.endswith("; continuing from checkpoint.prev.pt")
