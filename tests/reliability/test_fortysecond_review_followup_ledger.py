"""Issue 15, forty-second hostile review follow-up (ledger, resume, run files, reports): tests.

The fixes of the day (the forty-second review's ledger 1-4 and reports 1-5) looked at again for
bypasses, regressions and twin paths that differ.

1. ``write_report(out, runs, title=...)`` over its own earlier report, stopped (Ctrl-C) between
   two of the removals the reports 5 fix added, after ``report.md`` and ``summary.csv`` went
   and before the plots did. Before: the plots alone were left, and the same call was then
   refused ("holds 'metric_vs_round.png', which is not part of a report write_report wrote"),
   where reports 5 promises that a stop leaves a stopped report that the same call replaces.
   Now the earlier report is removed ``report.md`` first and ``summary.csv`` last
   (``report.write_report``): a stop at any point leaves a stopped report or none.
2. ``write_report(out, [load_tuned(T1), load_tuned(T2)], title=...)`` with the two tunings at
   σ 0.5 and 1 (two rows of one tuning each), and ``[load_tuned(T1), load_tuned(T1)]`` (one
   tuning given twice). Before (the reports 2 fix): one note a strategy, "the row is over 2
   tunings ... costs their composition" at the larger row's ε (8.279 for the σ 1 row whose ε
   is 2.616), and one tuning given twice counted as two tunings (its trial averaged as two
   seeds, the tuned rows being exempt from the note on repeated seeds). Now one note a row
   (strategy and σ) with its own ε, over its distinct tunings (``report._tuned_notes``), and a
   tuning given twice is named as such.
3. Ledger 3's variant: the privacy ledger rewritten as one JSON array of its lines without a
   final line feed (``json.dump(lines, f)``, what a script converting it to JSON writes), then
   ``simulate --resume R`` with more rounds. Before: a single line without a line feed, read
   as a header cut short, that is as no ledger: rebuilt from the checkpoint and the rows, rc 0
   (a secure run killed after round 5's line with its checkpoint of round 4: epsilon 18.81
   where 20.28 was spent, round 5's first release lost). Now a last line without a line feed
   that is a whole JSON value but not an object is refused as lines joined
   (``files.read_lines``): rc 2, one line naming the file, nothing written.
4. Ledger 4's twin: ``compare`` of a cell to resume whose ledger is an earlier version's (it is
   converted, copied aside through ``privacy_ledger.jsonl.v1.tmp``) with a directory at that
   name. ``run.resume`` refuses it (ledger 4), but compare's plan checked only
   ``privacy_ledger.jsonl.v1``. Before: compare removed ``summary.csv`` and ``report.md``,
   then failed at the cell's turn (rc 2). Now ``files.check_replaced`` refuses the ``.tmp`` of
   every name it is given too, so the plan refuses it: rc 2, the report kept.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import warnings
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.simulation import report as report_module
from fedprivopt.simulation.files import LEDGER_FILE
from fedprivopt.simulation.report import write_report
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.simulation.rundata import RunData
from tests.reliability.test_fortieth_review_followup_ledger import raise_rounds
from tests.reliability.test_misuse_cli import TOY
from tests.simulation.test_run import small_config


@pytest.fixture(autouse=True)
def _no_drawing(monkeypatch):
    """The plots as small files: what is tested is which files a report leaves, and its notes."""

    def draw(_what, path, _ref):
        Path(path).write_bytes(b"a plot")

    monkeypatch.setattr(report_module, "draw_metric_vs_round", draw)
    monkeypatch.setattr(report_module, "draw_privacy_utility", draw)


def _run(path: Path, strategy: str, sigma: float, epsilon: float, accuracy: float) -> RunData:
    """A finished 1-round private run of ``strategy`` at ``sigma`` (files: its ledger header)."""
    path.mkdir(parents=True)
    header = {"ledger": 2, "kind": "header", "round": 0, "events": 0, "private": True}
    (path / "privacy_ledger.jsonl").write_text(json.dumps(header) + "\n", encoding="utf-8")
    config = {"strategy": strategy.removesuffix(" (tuned)"), "noise-multiplier": sigma,
              "sampling": "poisson", "accountant": "rdp", "delta": 1e-4, "seed": 0,
              "task": "toy"}  # fmt: skip
    summary = {"strategy": strategy, "noise_multiplier": sigma, "seed": 0, "epsilon": epsilon,
               "delta": 1e-4, "rounds_completed": 1, "config": config}  # fmt: skip
    rows = [{"round": r, "eval_accuracy": accuracy, "eval_loss": 0.9} for r in (0, 1)]
    return RunData(summary, rows, path, ledger_epsilon=epsilon)


def _report(out: Path, runs: list[RunData]) -> tuple[str, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = write_report(out, runs, title="t", metric="eval_accuracy").read_text("utf-8")
    return text, [str(w.message) for w in caught]


@pytest.mark.parametrize("stop_after", [1, 2, 3])
def test_1_a_report_stopped_between_its_removals_is_replaced_by_the_same_call(
    tmp_path, monkeypatch, stop_after
):
    old = [_run(tmp_path / "a", "dp-fedavg", 0.5, 10.28, 0.6)]
    new = [_run(tmp_path / "b", "dp-fedadam", 0.5, 7.55, 0.5)]
    out = tmp_path / "out"
    _report(out, old)
    unlink = pathlib.Path.unlink
    removed: list[str] = []

    def stopping(self, *args, **kwargs):
        unlink(self, *args, **kwargs)
        if self.parent == out:
            removed.append(self.name)
            if len(removed) == stop_after:
                raise KeyboardInterrupt

    monkeypatch.setattr(pathlib.Path, "unlink", stopping)
    with pytest.raises(KeyboardInterrupt):
        _report(out, new)
    monkeypatch.setattr(pathlib.Path, "unlink", unlink)
    assert removed[0] == "report.md", removed
    text, _ = _report(out, new)  # the same call again: replaced, not refused
    assert "dp-fedadam" in text and "dp-fedavg" not in text


def _tuned(tuning: Path, sigma: float, epsilon: float) -> RunData:
    return _run(tuning / "runs" / "trial-001", "dp-fedavg (tuned)", sigma, epsilon, 0.5)


def test_2_a_tuned_note_is_a_rows_over_its_distinct_tunings(tmp_path):
    low, high = _tuned(tmp_path / "T1", 0.5, 8.279), _tuned(tmp_path / "T2", 1.0, 2.616)
    text, notes = _report(tmp_path / "rows", [low, high])
    tuned = [n for n in notes if "is its tuning's" in n]
    assert len(tuned) == 2, notes
    assert tuned[0].startswith("dp-fedavg (tuned), σ=0.5: its epsilon (8.279)"), tuned
    assert tuned[1].startswith("dp-fedavg (tuned), σ=1: its epsilon (2.616)"), tuned
    assert not [n for n in tuned if "composition" in n], tuned
    assert tuned[1] in text
    _, notes = _report(tmp_path / "twice", [low, low])
    tuned = [n for n in notes if "is its tuning's" in n]
    assert len(tuned) == 1 and "given more than once (2 runs of 1 tunings)" in tuned[0], notes
    assert "over 2 tunings" not in tuned[0]
    other = _tuned(tmp_path / "T3", 0.5, 8.279)
    _, notes = _report(tmp_path / "two", [low, other])  # as before: a row over two tunings
    tuned = [n for n in notes if "is its tuning's" in n]
    assert tuned[0].startswith("dp-fedavg (tuned): its epsilon (8.279)"), tuned
    assert "over 2 tunings" in tuned[0] and "more than once" not in tuned[0], tuned


def test_3_a_ledger_rewritten_as_one_json_array_is_refused_not_rebuilt(tmp_path, capsys):
    run = simulate(small_config(**{"num-server-rounds": 2}), tmp_path / "run").out_dir
    path = run / LEDGER_FILE
    lines = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    path.write_text(json.dumps(lines), encoding="utf-8")  # no final line feed
    before = path.read_bytes()
    raise_rounds(run, 3)
    with pytest.raises(ValueError, match=r"jsonl: line 1 has no line feed but is a whole JSON"):
        resume(run)
    assert main(["simulate", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and LEDGER_FILE in err
    assert path.read_bytes() == before and not (run / (LEDGER_FILE + ".v1")).exists()
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    assert resume(run).rounds_completed == 3  # its lines back: resumed as before


def test_4_compare_refuses_when_planned_a_directory_where_an_old_ledger_is_copied(tmp_path):
    out = tmp_path / "C"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--out", str(out), "--rounds", "2",
            "--quiet", "--set", "population=12", "--set", "clients-per-round=4", "--set",
            "task-params.num-users=12", "--set", "secure=true"]  # fmt: skip
    assert main(argv) == 0
    (cell,) = (out / "runs").iterdir()
    (cell / "summary.json").unlink()  # as if stopped after round 1, with an older ledger
    for name in (LEDGER_FILE, "metrics.jsonl"):
        lines = [json.loads(x) for x in (cell / name).read_text("utf-8").splitlines()]
        kept = [x for x in lines if x.get("round", 0) <= 1]
        if name == LEDGER_FILE:  # an earlier version's: counts only
            kept = [{"round": 0, "events": 0}] + [
                {"round": x["round"], "events": x["events"]} for x in kept[1:]
            ]
        (cell / name).write_text("".join(json.dumps(x) + "\n" for x in kept), encoding="utf-8")
    shutil.copyfile(cell / "checkpoint.prev.pt", cell / "checkpoint.pt")
    (cell / (LEDGER_FILE + ".v1.tmp")).mkdir()
    report = (out / "report.md").read_bytes()
    assert main(argv) == 2
    assert (out / "report.md").read_bytes() == report and (out / "summary.csv").exists()
    assert not (cell / (LEDGER_FILE + ".v1")).exists()
