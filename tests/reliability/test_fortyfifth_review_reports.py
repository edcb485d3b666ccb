"""Issue 15, forty-fifth hostile review (reports: compare, tune and their reports): tests.

1. Text of the user's own in ``report.md``: ``tune 'my<newline>## Notes.toml' --grid
   server-learning-rate=0.5,1 --mean-trials 1 --rounds 1 --seed 1`` (a preset whose file name
   holds a line break, the thirty-fifth review's outputs 7 through ``tune``), and ``compare``
   or ``tune`` of a task by reference whose ``primary_metric`` is named with a line break and a
   heading (``acc<newline>## Privacy parameters``), a backtick, or ``a](http://x)``. Before:
   the tuning's title was ``# fedprivopt tune: dp-fedavg on my`` followed by a heading
   ``## Notes.toml`` of its own; compare's ``Task metric: `eval_acc`` ended its line and the
   metric's second line became a heading; a backtick ended the code span early; the plot's
   image became ``![eval_a](http://x) by round](metric_vs_round.png)``, an image of another
   address. Now ``tune_report._markdown`` writes its title, selected metric and notes on one
   line (``report_format.one_line``), and ``report_markdown.markdown`` the metric in a code
   span that holds its backticks (``report_format.code_span``) and the image's text with its
   brackets escaped (``report_format.alt_text``); plain names are written as before.
2. Runs of an earlier call left in a comparison's ``OUT``: ``compare toy.toml --strategies
   dp-fedavg,fedavg --rounds 1 --out C``, then ``compare toy.toml --strategies dp-fedavg
   --rounds 1 --out C`` (also other noise multipliers or fewer seeds; ``compare --tune-grid``
   with fewer seeds, its tunings in ``C/tune``). Before: rc 0 and not a word; the fedavg run
   stayed in ``C/runs``, where ``tensorboard --logdir C`` (which compare's help offers for a
   grid) shows it beside this call's runs as one of them. Now ``cells.leftover_note`` names
   them (``C/runs also holds 1 runs of an earlier call that this call's grid does not include
   (fedavg__sigma0__seed0): this report leaves them out, but tensorboard --logdir C shows them
   ...``) on standard error and under the report's Warnings (``write_report(issues=...)``);
   the runs are kept (they are the user's results).
3. A trial's directory removed after it ran, then the same ``tune``: ``tune toy.toml --grid
   server-learning-rate=0.5,1 --mean-trials 2 --rounds 1 --seed 3 --set secure=true`` (one
   trial, finished, score 0.49), ``rm -rf OUT/runs/trial-001``, the same command (also
   ``compare --tune-grid``'s cells). Before: rc 0, trial-001 run again with new noise (0.47)
   and the tuning still at epsilon 9.459 for one trial, where two runs of it were made and
   either could be released (a trial retried until it scores well: the best of more than K);
   the rerun replaced the summary by which ``compare-tuned`` refuses such a tuning (forty-third
   review follow-up, ledger 2). Now ``tune_dir.check_vanished_trials`` (from ``tune`` and the
   planning of ``compare --tune-grid``, before the summary is removed) refuses, rc 2, one line:
   ``OUT/runs/trial-001: it is missing, but the trial ran (summary.json's 'trial-001' states 1
   rounds completed): run again, it would be a second run of one trial ...``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.models.toy import ToyClassificationTask

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"

# -- finding 1: a preset's file name and a task's metric name in report.md ---------------------


class Heading(ToyClassificationTask):
    """The toy task, its accuracy reported under a name with a line break and a heading."""

    METRIC = "acc\n## Privacy parameters\n\n- noise: none"
    primary_metric = METRIC

    def evaluate(self, model):
        metrics = super().evaluate(model)
        return {"loss": metrics["loss"], self.METRIC: metrics["accuracy"]}


def _headings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#")]


def test_1_a_tunings_title_of_a_preset_named_with_a_line_break(tmp_path, capsys):
    preset = tmp_path / "my\n## Notes.toml"
    preset.write_text(TOY.read_text())
    out = tmp_path / "t"
    code = main(["tune", str(preset), "--grid", "server-learning-rate=0.5,1", "--mean-trials",
                 "1", "--rounds", "1", "--seed", "1", "--quiet", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    heads = _headings((out / "report.md").read_text())
    assert "## Notes.toml" not in heads, heads  # before: a heading of the file name's own
    assert heads[0].endswith("my\\n## Notes.toml"), heads


def test_1_a_metric_named_with_a_heading_stays_in_its_line(tmp_path, capsys):
    out = tmp_path / "c"
    code = main(["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--quiet",
                 "--out", str(out), "--set", f'task="{__name__}:Heading"'])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    text = (out / "report.md").read_text()
    heads = _headings(text)
    assert heads.count("## Privacy parameters") == 1, heads  # before: 2, one of the metric's
    assert "- noise: none" not in text.splitlines()
    assert "Task metric: `eval_acc\\n## Privacy parameters\\n\\n- noise: none`." in text


def test_1_code_span_and_alt_text_hold_their_text():
    from fedprivopt.simulation.report_format import alt_text, code_span

    assert code_span("eval_accuracy") == "`eval_accuracy`"  # as before
    assert code_span("a`b") == "`` a`b ``"
    assert code_span("a``b`") == "``` a``b` ```"
    assert alt_text("eval_a](http://x)") == "eval_a\\](http://x)"
    assert alt_text("x\ny") == "x\\\\ny"


@pytest.mark.parametrize("name", ["acc`x`", "a](http://x)"])
def test_1_a_metric_with_a_backtick_or_a_bracket(tmp_path, capsys, name):
    from fedprivopt.simulation.report_format import alt_text, code_span
    from fedprivopt.simulation.report_markdown import markdown
    from fedprivopt.simulation.rundata import RunData
    from fedprivopt.simulation.rundata_aggregate import aggregate_with_notes, select_runs

    metric = f"eval_{name}"
    run = RunData({"strategy": "fedavg", "noise_multiplier": 0.0, "seed": 0, "epsilon": None,
                   "primary_metric": metric, "rounds_completed": 1, "delta": 1e-4},
                  [{"round": 1, metric: 0.5, "eval_loss": 1.0}], tmp_path / "r")  # fmt: skip
    sel, _ = select_runs([run], metric)
    rows, _ = aggregate_with_notes(sel.runs, sel.metric)
    text = markdown("t", sel, rows, [], None)
    assert f"Task metric: {code_span(metric)}." in text
    image = next(line for line in text.splitlines() if "metric_vs_round.png" in line)
    assert image == f"![{alt_text(metric)} by round](metric_vs_round.png)", image


# -- finding 2: runs of an earlier call beside this call's ---------------------------------------


def test_2_runs_of_an_earlier_call_are_named(tmp_path, capsys):
    out = tmp_path / "c"
    base = ["compare", str(TOY), "--rounds", "1", "--quiet", "--out", str(out)]
    assert main([*base, "--strategies", "dp-fedavg,fedavg"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main([*base, "--strategies", "dp-fedavg"]) == 0
    err = capsys.readouterr().err
    assert "also holds 1 runs of an earlier call" in err, err  # before: nothing
    text = (out / "report.md").read_text()
    warned = text[text.index("## Warnings") :]
    assert "(fedavg__sigma0__seed0): this report leaves them out" in warned
    assert (out / "runs" / "fedavg__sigma0__seed0").is_dir()  # kept


def test_2_the_note_of_a_tuned_grid_and_of_none(tmp_path):
    from fedprivopt.simulation.cells import leftover_note

    (tmp_path / "tune" / "dp-fedavg__sigma0.5__seed0").mkdir(parents=True)
    (tmp_path / "tune" / "dp-fedavg__sigma0.5__seed1").mkdir()
    note = leftover_note(tmp_path, ["dp-fedavg__sigma0.5__seed0"], "tune")
    assert note is not None and "1 tunings of an earlier call" in note
    assert "(dp-fedavg__sigma0.5__seed1)" in note
    assert (
        leftover_note(
            tmp_path, ["dp-fedavg__sigma0.5__seed0", "dp-fedavg__sigma0.5__seed1"], "tune"
        )
        is None
    )
    assert leftover_note(tmp_path, [], "runs") is None  # no runs/


# -- finding 3: a trial's directory removed, then the same tune ---------------------------------


def test_3_a_removed_trial_is_not_run_again(tmp_path, capsys):
    import shutil

    out = tmp_path / "t"
    argv = ["tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "2",
            "--rounds", "1", "--seed", "3", "--quiet", "--out", str(out),
            "--set", "secure=true"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    trials = sorted((out / "runs").iterdir())
    shutil.rmtree(trials[0])
    capsys.readouterr()
    assert main(argv) == 2  # before: 0, the trial run again with new noise
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert f"{trials[0].name}: it is missing, but the trial ran" in err, err
    assert not trials[0].exists() and (out / "summary.json").is_file()  # nothing changed


def test_3_a_trial_left_without_its_config_and_ledger(tmp_path):
    from fedprivopt.simulation.tune_dir import check_vanished_trials

    (tmp_path / "runs" / "trial-002").mkdir(parents=True)
    (tmp_path / "runs" / "trial-002" / "metrics.jsonl").write_text("")
    entries = [{"trial": "trial-001", "status": "failed", "rounds_completed": 0},
               {"trial": "trial-002", "status": "finished", "rounds_completed": 2}]  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps({"trials": entries}))
    with pytest.raises(ValueError, match=r"trial-002: its config\.toml and privacy_ledger\.jsonl"):
        check_vanished_trials(tmp_path)
    entries.pop()  # a trial that failed before its run started released nothing
    (tmp_path / "summary.json").write_text(json.dumps({"trials": entries}))
    check_vanished_trials(tmp_path)
