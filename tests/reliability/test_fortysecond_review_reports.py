"""Issue 15, forty-second hostile review (reports: compare, tune, compare-tuned, reports): tests.

1. ``write_report(out, load_runs(A) + load_runs(B))`` (the documented API of reports) of two
   comparisons made with one configuration of a StackOverflow task before and after ``data
   synth --overwrite`` regenerated its ``data-dir`` with another seed (the same sizes, so the
   same task parameters). Before: dp-fedavg on the old data (recall@5 0.6117) set beside
   fedavg on the new (0.7246) as one task's, without a word, where ``--resume``, ``compare``,
   ``tune`` and ``compare-tuned`` refuse a run whose recorded data is not the data there now.
   Now ``report._task_differences`` compares the data each run's privacy ledger header records
   (``Task.data_identity()``) as it compares task settings: a warning "the runs differ in
   their task settings: data (as each run's privacy ledger records it) (...)"; runs on one
   data, or without a record (the toy task), give none.
2. ``write_report(out, [load_tuned(T1), load_tuned(T2)], title=...)`` (what ``load_runs``
   advises for a tuning) of two tunings of dp-fedavg (``tune toy.toml --grid
   server-learning-rate=0.5,1 --mean-trials 1 --rounds 1 --seed 1``, ``--seed 2``). Before:
   one row over both at one tuning's ε 8.279 under "ε is the accountant's value after each
   run's last completed round", no word, where publishing the row costs their composition
   (11.74, as ``compare-tuned T1 T2`` states). Now ``report._tuned_notes`` warns, with the
   default ``epsilon_text``, that a tuned row's ε is its tuning's and, over several tunings,
   what their composition costs (recomputed by ``tune_check.check_tunings`` where the tunings
   can be checked; here fabricated runs, so without a number); ``compare-tuned`` and
   ``compare --tune-grid``, which pass their own ``epsilon_text`` and state it, unchanged.
3. ``simulate --tensorboard`` killed after round 3's row, then ``--resume`` (round 3 redone)
   in a process whose clock is behind the killed one's (resumed on another machine, or after
   the clock was set back; also the same second with a smaller PID or another host name).
   Before: the new event file's name (``events.out.tfevents.<seconds>.<host>.<pid>.<n>``)
   sorted before the killed run's, so TensorBoard, which reads them in that order, applied
   the resume's purge first and then the killed run's events: round 3 showed its stale 13.0
   (the rows say 23.0) and round 4 was gone. Now ``tensorboard._new_event_file`` names the
   file after every event file there (``_newest_seconds`` + 1 when the clock is behind).
4. ``compare P --strategies dp-fedavg,dp-fedavg-adadp,dp-fedadam --rounds 2`` with ``accountant
   = "pld"`` in P's ``[strategies.dp-fedadam]`` (the thirty-seventh review's reports 1 and the
   forty-first's reports 2 combined). Before: only "the rows' epsilons come from different
   accountants", though dp-fedavg (10.28) and dp-fedavg-adadp (13.71), both RDP, were at
   unequal ε (the note on unequal ε was left out whenever the bases differed). Now
   ``rundata_aggregate.unequal_epsilon_notes`` compares the strategies within each basis
   (accountant and neighbouring relation) and is given beside the bases' note; rows whose ε
   differ only by their accountant (dp-fedavg rdp beside dp-fedadam pld) still get no such
   note.
5. ``write_report(out, runs, title=...)`` (the documented API) over its own earlier report,
   stopped by Ctrl-C while it drew its plots (after ``summary.csv`` and
   ``metric_vs_round.png``). Before: the earlier ``report.md`` and ``privacy_utility.png``
   stayed beside the new ``summary.csv``: a report whose text and plot were of other runs
   than its numbers, with nothing to tell them apart. Now ``write_report`` removes the
   earlier report's files (``report.md`` first) before it writes; what a stop leaves is a
   stopped report, which the same call replaces (fortieth review follow-up, ledger 4).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedprivopt.simulation import report as report_module
from fedprivopt.simulation.report import aggregate_runs, write_report
from fedprivopt.simulation.rundata import RunData

_TASK = {"task": "stackoverflow-tp", "task-params": {"data-dir": "/d", "num-users": 40}}


def _run(path: Path, strategy: str, data: dict | None, accuracy: float) -> RunData:
    """A finished 1-round run of ``strategy`` whose ledger header records ``data``."""
    path.mkdir(parents=True)
    header = {"ledger": 2, "kind": "header", "round": 0, "events": 0, "private": True}
    if data is not None:
        header["data"] = data
    (path / "privacy_ledger.jsonl").write_text(json.dumps(header) + "\n", encoding="utf-8")
    private = strategy.startswith("dp-")
    config = {
        "strategy": strategy,
        "noise-multiplier": 0.5 if private else 0.0,
        "sampling": "poisson",
        "accountant": "rdp",
        "delta": 1e-4,
        "seed": 0,
        **_TASK,
    }
    summary = {"strategy": strategy, "noise_multiplier": 0.5 if private else 0.0, "seed": 0,
               "epsilon": 7.55 if private else float("inf"), "delta": 1e-4,
               "rounds_completed": 1, "config": config}  # fmt: skip
    rows = [{"round": r, "eval_accuracy": accuracy, "eval_loss": 0.9} for r in (0, 1)]
    return RunData(summary, rows, path, ledger_epsilon=7.55 if private else None)


def _report(out: Path, runs: list[RunData]) -> tuple[str, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = write_report(out, runs, title="t", metric="eval_accuracy").read_text("utf-8")
    return text, [str(w.message) for w in caught]


def test_1_runs_on_other_data_files_are_noted(tmp_path):
    old = {"sqlite_bytes": 987136, "users_sha256": "83df"}
    new = {"sqlite_bytes": 978944, "users_sha256": "1a2b"}
    runs = [_run(tmp_path / "A" / "dp", "dp-fedavg", old, 0.6117),
            _run(tmp_path / "B" / "base", "fedavg", new, 0.7246)]  # fmt: skip
    text, notes = _report(tmp_path / "out", runs)
    note = [n for n in notes if "data (as each run's privacy ledger records it)" in n]
    assert note and "not over the same data" in note[0], notes
    assert "privacy ledger's data" in note[0]
    assert note[0] in text


def test_1_runs_on_one_data_file_or_without_a_record_are_not_noted(tmp_path):
    same = {"sqlite_bytes": 987136, "users_sha256": "83df"}
    runs = [_run(tmp_path / "A" / "dp", "dp-fedavg", same, 0.6117),
            _run(tmp_path / "B" / "base", "fedavg", dict(same), 0.7246),
            _run(tmp_path / "C" / "toy", "dp-fedadam", None, 0.5)]  # fmt: skip
    text, notes = _report(tmp_path / "out", runs)
    assert not [n for n in notes if "task settings" in n], notes
    assert "task settings" not in text


def test_2_a_row_over_several_tunings_states_their_composition(tmp_path):
    tuned = [_run(tmp_path / f"T{i}" / "runs" / "trial-001", "dp-fedavg", None, 0.5 + i / 10)
             for i in (1, 2)]  # fmt: skip
    tuned = [RunData({**r.summary, "strategy": "dp-fedavg (tuned)"}, r.rows, r.path,
                     ledger_epsilon=8.279) for r in tuned]  # fmt: skip
    text, notes = _report(tmp_path / "out", tuned)
    note = [n for n in notes if n.startswith("dp-fedavg (tuned): its epsilon (8.279)")]
    assert note and "is its tuning's" in note[0], notes
    assert "over 2 tunings" in note[0] and "costs their composition" in note[0]
    assert note[0] in text
    _, notes = _report(tmp_path / "one", tuned[:1])
    assert [n for n in notes if "is its tuning's" in n and "composition" not in n], notes
    _, notes = _report_as(tmp_path / "own", tuned, "ε is the tuning's; ")
    assert not [n for n in notes if "is its tuning's" in n], notes


def _report_as(out: Path, runs: list[RunData], epsilon_text: str) -> tuple[str, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = write_report(out, runs, title="t", metric="eval_accuracy",
                            epsilon_text=epsilon_text).read_text("utf-8")  # fmt: skip
    return text, [str(w.message) for w in caught]


def test_3_a_resume_whose_clock_is_behind_still_purges_the_redone_rounds(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fedprivopt.simulation import tensorboard

    clock = {"now": 1.8e9}
    monkeypatch.setattr(tensorboard, "time", SimpleNamespace(time=lambda: clock["now"]))
    first = tensorboard.TensorBoardLog(tmp_path, first_round=1)
    for r in (1, 2, 3):
        first.add_row({"round": r, "eval_loss": 10.0 + r})
    first.close()
    clock["now"] = 1.7e9  # resumed on a machine whose clock is behind: round 3 redone
    second = tensorboard.TensorBoardLog(tmp_path, first_round=3)
    for r in (3, 4):
        second.add_row({"round": r, "eval_loss": 20.0 + r})
    second.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    assert {e.step: e.value for e in acc.Scalars("eval_loss")} == {1: 11.0, 2: 12.0, 3: 23.0,
                                                                   4: 24.0}  # fmt: skip


def _based(path: Path, strategy: str, accountant: str, epsilon: float) -> RunData:
    config = {"strategy": strategy, "noise-multiplier": 0.5, "sampling": "poisson",
              "accountant": accountant, "delta": 1e-4, "seed": 0}  # fmt: skip
    summary = {"strategy": strategy, "noise_multiplier": 0.5, "seed": 0, "epsilon": epsilon,
               "delta": 1e-4, "rounds_completed": 2, "config": config}  # fmt: skip
    rows = [{"round": r, "eval_accuracy": 0.6, "eval_loss": 0.9} for r in (1, 2)]
    return RunData(summary, rows, path / strategy, ledger_epsilon=epsilon)


def _notes(runs: list[RunData]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        aggregate_runs(runs)
    return [str(w.message) for w in caught]


def test_4_unequal_epsilon_of_one_accountant_is_noted_beside_another_accountant(tmp_path):
    runs = [_based(tmp_path, "dp-fedavg", "rdp", 10.28),
            _based(tmp_path, "dp-fedavg-adadp", "rdp", 13.71),
            _based(tmp_path, "dp-fedadam", "pld", 8.961)]  # fmt: skip
    notes = _notes(runs)
    assert any("different accountants" in n for n in notes), notes
    unequal = [n for n in notes if "unequal epsilon" in n]
    assert len(unequal) == 1 and "dp-fedavg 10.28; dp-fedavg-adadp 13.71" in unequal[0], notes
    # only the accountant differs: the bases' note alone (thirty-seventh review, reports 1)
    notes = _notes([runs[0], runs[2]])
    assert any("different accountants" in n for n in notes), notes
    assert not [n for n in notes if "unequal epsilon" in n], notes


def test_5_a_report_stopped_midway_leaves_no_earlier_report_md(tmp_path, monkeypatch):
    old = [_based(tmp_path / "a", "dp-fedavg", "rdp", 10.28)]
    new = [_based(tmp_path / "b", "dp-fedadam", "rdp", 7.55)]
    _report(tmp_path / "out", old)
    assert "dp-fedavg" in (tmp_path / "out" / "report.md").read_text("utf-8")

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_module, "draw_privacy_utility", stopped)
    with pytest.raises(KeyboardInterrupt):
        _report(tmp_path / "out", new)
    left = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "report.md" not in left and "privacy_utility.png" not in left, left
    assert "dp-fedadam" in (tmp_path / "out" / "summary.csv").read_text("utf-8")
    monkeypatch.undo()
    text, _ = _report(tmp_path / "out", new)  # the same call again: replaced
    assert "dp-fedadam" in text and "dp-fedavg" not in text
