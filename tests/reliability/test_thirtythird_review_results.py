"""Issue 15, thirty-third review (results): regression tests of its findings.

1. ``compare-tuned T0 T1`` of ``tune toy.toml --grid num-server-rounds=1,2 --mean-trials 1
   --seed 0`` and ``--seed 1`` (the released trial of one ran 1 round, of the other 2; also
   ``compare --tune-grid num-server-rounds=1,3``): ``report.md`` said rounds ``1–2`` (the
   thirty-second review's finding 5), but ``summary.csv``'s ``rounds`` was ``1``, the fewest,
   as if both seeds of the row had run one round. Now ``summary.csv`` writes the same ``1–2``
   (``report.rounds_text``; a row whose seeds agree is written as before, ``2``), and the rows
   of :func:`~fedprivopt.simulation.report.aggregate_runs` carry ``rounds_max`` beside
   ``rounds`` (the fewest).
2. ``compare toy.toml --strategies dp-fedavg --seeds 2 --rounds 1 --set
   server-learning-rate=3e37`` (both seeds' models overflow in round 1): ``report.md``'s seeds
   cell said ``2 (2 diverged: seed 0 from round 1, seed 1 from round 1)``, but ``summary.csv``'s
   row read ``seeds 2``, accuracy ``0.59 ± 0.028``, like any other, with nothing to say the
   models overflowed (nor, for a row with a non-finite seed, that its mean is over fewer seeds
   than ``seeds``). Now ``summary.csv`` ends with ``seeds_finite`` (the seeds behind the
   metric's mean) and ``seeds_diverged``; the other columns keep their places.
3. ``tune toy.toml --grid num-server-rounds=1,2 --mean-trials 1 --seed 0`` (one trial, drawn at
   1 round, whose run spent 7.551): ``report.md`` said "epsilon of one run: 10.28 (RDP)"
   beside the trials table's 7.551, without saying which run that is: the thirty-second
   review's finding 7 named the grid point only when two trials' runs spent different ε. Now
   "(RDP; a run at the costliest grid point, num-server-rounds = 2)" whenever a trial's run
   spent another ε than the single run's, and ``tune``'s last line likewise ("(one run: 10.28;
   a run at the costliest grid point, num-server-rounds = 2)", where it was "(one run: 10.28)").
4. ``compare toy.toml --strategies fedavg --seeds 2 --rounds 1 --set
   server-learning-rate=1e20`` (finite losses near 1e19, not diverged): ``report.md``'s eval
   loss was ``11425513507383148544 ± 629722879734169856``, every digit of the float, where
   the std is meant to two significant digits (a spread of 100 or more kept all its digits;
   near float32's largest loss 39 digits each). Now ``1.143e+19 ± 6.3e+17``; a spread
   below a million is rounded likewise (``1000 ± 120``), a smaller one written as before.
5. ``compare-tuned T0 F`` of ``tune toy.toml --grid num-server-rounds=1,2 --seed 0`` (dp-fedavg,
   selected by accuracy) and ``tune toy.toml --strategy dp-fedadam --grid
   server-learning-rate=0.01,0.03,0.1 --metric eval_loss`` (three points, selected by the
   loss): ``report.md`` recorded no tuning's grid, trial distribution or selection metric
   (``compare --tune-grid`` lists its tunings' commands), and set the two rows side by side as
   equal procedures. Now its notes give each strategy's grid, grid points, trials per tuning and
   selection, each tuning's released hyperparameters, and "The strategies were not tuned
   alike: their grid sizes (…); selection metrics (…) differ" when they were not.
6. The comparison of finding 2: ``privacy_utility.png`` drew the diverged dp-fedavg row (both
   models overflowed; accuracy 0.59) as a point labelled ``σ=0.5`` like any other, and
   ``metric_vs_round.png`` its line as ``dp-fedavg, σ=0.5``. Now ``σ=0.5, 2 of 2 diverged`` and
   ``dp-fedavg, σ=0.5 (2 of 2 diverged)`` (a baseline's dashed line alike).
7. The ``compare-tuned T0 T1`` of finding 1 (two tunings of dp-fedavg on the same users):
   ``summary.csv`` gave the row ``epsilon`` 11.73, one tuning's, and nothing else, where
   publishing the row (its mean over both) costs their composition, 16.61, which only
   ``report.md``'s notes stated. Now ``summary.csv`` has ``epsilon_tunings_composed`` after
   ``epsilon`` (the notes' value; empty for an untuned row, whose seeds the report does not
   compose).
8. The ``compare-tuned`` of finding 1: ``metric_vs_round.png`` drew the row's round 2 as its
   "mean ± 1 std over seeds", which was the one 2-round seed's value without a band (a step up
   from the two seeds' mean at round 1, as if trained). The legend now says
   ``dp-fedavg (tuned), σ=0.5 (rounds 1–2: later rounds over fewer seeds)``.
9. ``write_report(out, load_runs(R))`` (the documented API of reports) of a finished run whose
   ``summary.json`` has ``rounds_completed`` edited to ``"abc"``, ``null``, ``[2]`` or ``1e400``:
   ``ValueError``/``TypeError``/``OverflowError`` from ``int()`` naming no file; ``2.5``, ``-3``,
   ``true``, ``"2"``: reported as rounds 2, -3, 1, 2. ``load_run`` now refuses them as
   ``--resume`` and ``compare`` do: ``ValueError: R/summary.json is unreadable
   (rounds_completed must be an integer >= 0, got 'abc')`` (beyond 10**6: "the file was edited").
   Likewise the summary's ``seed`` of a run without ``config.toml`` (which otherwise gives it):
   ``"abc"`` was ``ValueError: invalid literal for int()``, ``2.7`` reported as seed 2.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.core.text import epsilon_text

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


@pytest.fixture(scope="module")
def rounds_tunings(tmp_path_factory) -> list[Path]:
    """Two tunings over ``num-server-rounds = 1, 2``: seed 0 released 1 round, seed 1 two."""
    root = tmp_path_factory.mktemp("r33")
    tunings = []
    for seed in ("0", "1"):
        tunings.append(root / f"t{seed}")
        code = main([
            "tune", str(TOY), "--grid", "num-server-rounds=1,2", "--mean-trials", "1",
            "--seed", seed, "--out", str(tunings[-1]), "--quiet",
        ])  # fmt: skip
        assert code == 0
    return tunings


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory) -> Path:
    """A comparison whose dp-fedavg models overflow (diverged) and fedavg's losses reach 1e19."""
    out = tmp_path_factory.mktemp("r33") / "c"
    code = main([
        "compare", str(TOY), "--strategies", "dp-fedavg,fedavg", "--seeds", "2", "--rounds", "1",
        "--set", "strategies.dp-fedavg.server-learning-rate=3e37",
        "--set", "strategies.fedavg.server-learning-rate=1e20", "--out", str(out), "--quiet",
    ])  # fmt: skip
    assert code == 0
    return out


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _summary_row(report: Path, strategy: str) -> list[str]:
    summary = report.read_text(encoding="utf-8").split("## Summary", 1)[1]
    row = next(line for line in summary.splitlines() if line.startswith(f"| {strategy} |"))
    return row.strip("| ").split(" | ")


# -- finding 1: summary.csv's rounds of a row whose seeds completed different numbers ---------


@pytest.fixture(scope="module")
def tuned_report(rounds_tunings, tmp_path_factory) -> Path:
    """``compare-tuned`` of the two tunings, beside an untuned 1-round run."""
    root = tmp_path_factory.mktemp("r33")
    untuned = root / "u"
    code = main(["simulate", str(TOY), "--rounds", "1", "--out", str(untuned), "--quiet"])
    assert code == 0
    out = root / "r"
    argv = ["compare-tuned", *map(str, rounds_tunings), "--untuned", str(untuned)]
    assert main([*argv, "--out", str(out)]) == 0
    return out


def test_1_summary_csv_gives_the_range_of_rounds_as_report_md(tuned_report, capsys):
    out = tuned_report
    capsys.readouterr()
    row = next(r for r in _csv_rows(out / "summary.csv") if r["strategy"] == "dp-fedavg (tuned)")
    assert row["rounds"] == "1–2", row  # was 1, the fewest
    assert _summary_row(out / "report.md", "dp-fedavg (tuned)")[5] == row["rounds"]


def test_1_rows_whose_seeds_agree_keep_one_count(rounds_tunings, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["compare-tuned", str(rounds_tunings[1]), "--out", str(out)]) == 0
    capsys.readouterr()
    (row,) = _csv_rows(out / "summary.csv")
    assert row["rounds"] == "2", row


# -- finding 2: summary.csv says how many seeds diverged ----------------------------------------


def test_2_summary_csv_counts_diverged_seeds(overflowing, capsys):
    capsys.readouterr()
    row = next(r for r in _csv_rows(overflowing / "summary.csv") if r["strategy"] == "dp-fedavg")
    assert (row["seeds"], row["seeds_finite"], row["seeds_diverged"]) == ("2", "2", "2"), row
    assert _summary_row(overflowing / "report.md", "dp-fedavg")[2].startswith("2 (2 diverged")
    row = next(r for r in _csv_rows(overflowing / "summary.csv") if r["strategy"] == "fedavg")
    assert (row["seeds_finite"], row["seeds_diverged"]) == ("2", "0"), row


# -- finding 3: which run "epsilon of one run" is, when the one trial spent less ----------------


def test_3_one_cheaper_trial_names_the_costliest_point(rounds_tunings):
    report = (rounds_tunings[0] / "report.md").read_text(encoding="utf-8")
    (line,) = [x for x in report.splitlines() if x.startswith("- epsilon of one run:")]
    assert line.endswith("(RDP; a run at the costliest grid point, num-server-rounds = 2)"), line
    assert "| trial-001 | 1 | finished |" in report  # the one trial ran 1 round
    report = (rounds_tunings[1] / "report.md").read_text(encoding="utf-8")
    (line,) = [x for x in report.splitlines() if x.startswith("- epsilon of one run:")]
    assert line.endswith(": 10.28 (RDP)"), line  # its trial ran at the costliest point


def test_3_tune_says_so_on_its_last_line(rounds_tunings, tmp_path, capsys):
    import shutil

    copy = tmp_path / "t0"  # the same plan again: its trial reused, the line printed
    shutil.copytree(rounds_tunings[0], copy, ignore=shutil.ignore_patterns("*.lock"))
    code = main([
        "tune", str(TOY), "--grid", "num-server-rounds=1,2", "--mean-trials", "1",
        "--seed", "0", "--out", str(copy), "--quiet",
    ])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "(one run: 10.28; a run at the costliest grid point, num-server-rounds = 2)" in out, out


# -- finding 4: a spread of 100 or more to two significant digits -------------------------------


def test_4_a_huge_spread_is_shown_to_two_significant_digits(overflowing):
    row = next(r for r in _csv_rows(overflowing / "summary.csv") if r["strategy"] == "fedavg")
    assert float(row["eval_loss_std"]) > 1e6, row  # finite losses near 1e19
    loss = _summary_row(overflowing / "report.md", "fedavg")[7]
    mean, std = loss.split(" ± ")
    assert re.fullmatch(r"\d\.\d+e\+\d+", mean) and re.fullmatch(r"\d\.\de\+\d+", std), loss
    assert math.isclose(float(mean), float(row["eval_loss_mean"]), rel_tol=1e-2), loss


# -- finding 5: compare-tuned records how each strategy was tuned -------------------------------


def test_5_compare_tuned_records_grids_and_selection(rounds_tunings, tmp_path, capsys):
    other = tmp_path / "f"
    code = main([
        "tune", str(TOY), "--strategy", "dp-fedadam", "--grid",
        "server-learning-rate=0.01,0.03,0.1", "--mean-trials", "1", "--seed", "0", "--rounds", "1",
        "--metric", "eval_loss", "--out", str(other), "--quiet",
    ])  # fmt: skip
    assert code == 0
    out = tmp_path / "r"
    assert main(["compare-tuned", str(rounds_tunings[0]), str(other), "--out", str(out)]) == 0
    capsys.readouterr()
    notes = (out / "report.md").read_text(encoding="utf-8").split("## Notes", 1)[1]
    assert "| dp-fedavg (tuned) | 1 | num-server-rounds in [1, 2] | 2 |" in notes, notes
    assert "| dp-fedadam (tuned) | 1 | server-learning-rate in [0.01, 0.03, 0.1] | 3 |" in notes
    assert "min of `eval_loss` |" in notes and "max of `eval_accuracy` |" in notes, notes
    assert (
        "not tuned alike:** their grid sizes (dp-fedavg: 2, dp-fedadam: 3 points); selection "
        "metrics (eval_accuracy, eval_loss) differ"
    ) in notes, notes
    # thirty-fifth review (tuning, finding 4): the released trial's number is no longer shown
    released = f"| {rounds_tunings[0]} | dp-fedavg (tuned) | num-server-rounds = 1 |"
    assert released in notes, notes


# -- finding 6: the plots mark a diverged row ---------------------------------------------------


def _drawn_labels(monkeypatch, write) -> list[str]:
    """The annotations and legend labels of the plots ``write()`` draws."""
    from fedprivopt.simulation import report_plots

    drawn: list[str] = []
    finish = report_plots._finish

    def record(fig, ax, path, n_series):
        drawn.extend(t.get_text() for t in ax.texts)
        drawn.extend(ax.get_legend_handles_labels()[1])
        return finish(fig, ax, path, n_series)

    monkeypatch.setattr(report_plots, "_finish", record)
    write()
    return drawn


def test_6_plots_label_diverged_rows(overflowing, tmp_path, monkeypatch):
    from fedprivopt.simulation.report import load_runs, write_report

    def write():
        with pytest.warns(UserWarning):  # the notes on the diverged runs
            write_report(tmp_path / "r", load_runs(overflowing / "runs"), title="t")

    drawn = _drawn_labels(monkeypatch, write)
    assert "σ=0.5, 2 of 2 diverged" in drawn, drawn  # was σ=0.5
    assert "dp-fedavg, σ=0.5 (2 of 2 diverged)" in drawn, drawn  # was dp-fedavg, σ=0.5
    assert "fedavg (non-private)" in drawn, drawn  # fedavg's runs did not diverge


# -- finding 7: summary.csv gives a tuned row's composed epsilon --------------------------------


def test_7_summary_csv_gives_the_composed_epsilon_of_a_tuned_row(tuned_report, capsys):
    capsys.readouterr()
    rows = {r["strategy"]: r for r in _csv_rows(tuned_report / "summary.csv")}
    tuned, untuned = rows["dp-fedavg (tuned)"], rows["dp-fedavg"]
    notes = (tuned_report / "report.md").read_text(encoding="utf-8").split("## Notes", 1)[1]
    (line,) = [x for x in notes.splitlines() if x.startswith("| dp-fedavg | 0.5 | 2 |")]
    composed = float(tuned["epsilon_tunings_composed"])
    assert f"| {epsilon_text(composed)} |" in line, (tuned, line)  # rounded up (39th review)
    assert composed > float(tuned["epsilon"]), (tuned, line)
    assert untuned["epsilon_tunings_composed"] == "", untuned  # an untuned row: not composed
    header = list(rows["dp-fedavg"])
    assert header.index("epsilon_tunings_composed") == header.index("epsilon") + 1, header


# -- finding 8: the metric-by-round plot says where a row's rounds are over fewer seeds ---------


def test_8_metric_by_round_names_rounds_over_fewer_seeds(rounds_tunings, tmp_path, monkeypatch):
    def write():
        out = str(tmp_path / "r")
        assert main(["compare-tuned", *map(str, rounds_tunings), "--out", out]) == 0

    drawn = _drawn_labels(monkeypatch, write)
    label = "dp-fedavg (tuned), σ=0.5 (rounds 1–2: later rounds over fewer seeds)"
    assert label in drawn, drawn  # was dp-fedavg (tuned), σ=0.5


# -- finding 9: load_run refuses a summary's rounds_completed that is not a count ----------------


@pytest.mark.parametrize("value", ["abc", None, [2], 2.5, -3, True, "2", 10**7])
def test_9_load_run_refuses_an_edited_rounds_completed(tuned_report, tmp_path, value):
    import shutil

    from fedprivopt.simulation.report import load_run

    untuned = tuned_report.parent / "u"
    run = tmp_path / "u"
    shutil.copytree(untuned, run, ignore=shutil.ignore_patterns("*.lock"))
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    (run / "summary.json").write_text(json.dumps({**summary, "rounds_completed": value}))
    with pytest.raises(ValueError, match=r"summary\.json is unreadable \(rounds_completed"):
        load_run(run)  # was TypeError, OverflowError, or reported as rounds 2, -3, 1, 2


@pytest.mark.parametrize("value", ["abc", None, 2.7, -1, True])
def test_9_load_run_refuses_an_edited_seed_without_config(tuned_report, tmp_path, value):
    import shutil

    from fedprivopt.simulation.report import load_run

    run = tmp_path / "u"
    shutil.copytree(tuned_report.parent / "u", run, ignore=shutil.ignore_patterns("*.lock"))
    (run / "config.toml").unlink()  # the summary's seed is then the run's
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    (run / "summary.json").write_text(json.dumps({**summary, "seed": value}))
    with pytest.raises(ValueError, match=r"summary\.json is unreadable \(seed must be"):
        load_run(run)  # was ValueError from int() naming no file, or seed 2 for 2.7
