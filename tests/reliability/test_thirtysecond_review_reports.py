"""Issue 15, thirty-second review (reports): regression tests of its findings.

1. ``compare toy.toml --strategies dp-fedavg --metric eval_loss`` (also ``compare --tune-grid
   … --metric eval_loss``): ``report.md`` described the privacy–utility plot of the loss as
   "one point per noise multiplier; up and to the left is better", where a better loss lies
   down. Now "down and to the left is better" for ``eval_loss``; the task metrics keep "up".
2. ``tune toy.toml --grid server-learning-rate=0.1,1,1e39 --mean-trials 3 --distribution
   poisson --seed 1 --metric eval_loss`` (the 1e39 trial diverges): ``trials.png`` drew the
   failed trial's red cross at the lowest finite loss, beside the released trial's star, as
   if it had scored best. Failed and diverged trials are drawn at the worst finite score:
   the highest loss when the tuning minimizes, the lowest accuracy when it maximizes.
3. ``compare toy.toml --strategies dp-fedavg,fedavg --tune-grid server-learning-rate=0.5,1``
   (the preset's noise multiplier 0.5): the Notes' table of composed tunings gave the
   non-private baseline's row "fedavg | 0.5 | 1 | ∞", a noise multiplier it never ran at
   (``summary.csv``, the Summary table and its cell ``fedavg__sigma0__seed0`` say 0). Now
   "fedavg | 0 | …", as ``compare-tuned`` writes it.
4. ``simulate toy.toml --rounds 2 --set checkpoint-every=2 --tensorboard --out R``, its
   checkpoints and ``summary.json`` then lost (as after a kill before the first checkpoint,
   the thirty-first review's compare finding 10), ``simulate --resume R``: the run started
   again from round 0 and TensorBoard showed every round twice (``EventAccumulator``: steps
   1, 2, 1, 2; a line drawn back to round 1), the discarded run's events beside the new ones,
   against the module's "rounds that were redone after a kill are shown once". A log that
   starts from round 1 now purges every earlier event (``purge_step`` 0), as a resume from a
   checkpoint purges from its first redone round.
5. ``compare toy.toml --strategies dp-fedavg --tune-grid num-server-rounds=1,3 --mean-trials 1
   --seeds 4`` (two tunings released a 1-round trial, two a 3-round one; also ``compare-tuned
   T1 T2`` of ``tune --grid num-server-rounds=1,2 --seed 0`` and ``--seed 1``): the Summary
   said "rounds 1" of a row whose mean is over 1-round and 3-round runs. Now "1–3" when a
   row's runs completed different numbers of rounds (``summary.csv`` keeps the fewest, as
   :func:`aggregate_runs` documents).
6. ``compare-tuned T0 T1`` of ``tune toy.toml --grid noise-multiplier=0.5,1 --mean-trials 1
   --seed 0`` and ``--seed 1`` (two tunings of one plan on the same users, whose released
   trials drew σ 0.5 and σ 1): the Summary's two rows, one tuning each, and the Notes' table
   "dp-fedavg | 0.5 | 1 | 11.73" and "dp-fedavg | 1 | 1 | 11.73", where publishing the report
   releases both tunings (16.61, their composition; the thirty-first review's finding 4
   composed a row's tunings, but these fell into two rows by the σ they released). Now the
   tunings of one strategy are composed together: "dp-fedavg | 0.5, 1 | 2 | 16.61", with a
   sentence saying that they are in several rows.
7. ``tune toy.toml --grid noise-multiplier=0.5,1 --mean-trials 3 --distribution poisson
   --seed 1``: ``report.md`` said "epsilon of one run: 7.551 (RDP)" beside a σ 1 trial whose
   run spent 2.53 (``--rounds 1``), without saying which run that is. Now "(RDP; a run at
   the costliest grid point, noise-multiplier = 0.5)" when the trials' runs spent different
   ε; a grid that leaves the privacy events alone (every trial's ε equal) is written as before.
8. ``compare toy.toml --strategies fedavg --seeds 7 --rounds 1 --set
   server-learning-rate=1e-30`` (every seed's model stays the initial one: accuracy 0.37333 in
   each): ``report.md`` said "0.37333333 ± 0.00000000" (the float mean of 7 equal values is
   one ulp off, its std 6e-17), where 6 seeds gave "0.3733 ± 0". A std within 1e-12 of the
   mean is now the rounding it is: "0.3733 ± 0".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedprivopt.cli import main

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


@pytest.fixture(scope="module")
def tuned_loss_report(tmp_path_factory) -> str:
    """``compare --tune-grid`` of dp-fedavg and fedavg at one round, selected by the loss.

    The truncated negative binomial of mean 1 draws one trial always, whatever the secret seed.
    """
    out = tmp_path_factory.mktemp("r32") / "c"
    code = main([
        "compare", str(TOY), "--strategies", "dp-fedavg,fedavg",
        "--tune-grid", "server-learning-rate=0.5,1", "--mean-trials", "1",
        "--rounds", "1", "--metric", "eval_loss",
        "--out", str(out), "--quiet",
    ])  # fmt: skip
    assert code == 0
    return (out / "report.md").read_text(encoding="utf-8")


# -- finding 1: which way is better on the privacy-utility plot of the loss --------------------


def test_1_a_loss_report_says_better_points_lie_down(tuned_loss_report):
    assert "Privacy–utility trade-off" in tuned_loss_report
    assert "up and to the left is better" not in tuned_loss_report  # was said of the loss
    assert "down and to the left is better" in tuned_loss_report


def test_1_an_accuracy_report_still_says_up():
    from fedprivopt.simulation.report_markdown import _better

    assert _better("eval_accuracy") == "up" and _better("eval_recall_at_5") == "up"
    assert _better("eval_loss") == "down"


# -- finding 2: where trials.png draws a failed trial -------------------------------------------


def test_2_a_failed_trial_is_drawn_at_the_worst_loss(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    drawn = {}
    save = Figure.savefig

    def keep(fig, path, *args, **kwargs):
        if Path(path).name == "trials.png":
            drawn.update({ln.get_label(): list(ln.get_ydata()) for ln in fig.axes[0].lines})
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    out = tmp_path / "t"
    code = main([
        "tune", str(TOY), "--grid", "server-learning-rate=0.1,1,1e39", "--mean-trials", "3",
        "--distribution", "poisson", "--seed", "1", "--rounds", "1", "--metric", "eval_loss",
        "--out", str(out), "--quiet",
    ])  # fmt: skip
    assert code == 0
    trials = json.loads((out / "summary.json").read_text(encoding="utf-8"))["trials"]
    assert sorted(t["status"] for t in trials) == ["diverged", "finished", "finished"]
    scores = [t["eval_loss"] for t in trials if t["status"] == "finished"]
    assert drawn["released (best)"] == [min(scores)]
    assert drawn["failed / diverged"] == [max(scores)]  # was min(scores): beside the best


# -- finding 3: the baseline's noise multiplier in the composition table -----------------------


def test_3_the_composition_table_gives_a_baseline_sigma_0(tuned_loss_report):
    notes = tuned_loss_report.split("## Notes", 1)[1]
    assert "| fedavg | 0 | 1 | ∞ |" in notes, notes
    assert "| fedavg | 0.5 |" not in notes  # was: the preset's sigma, never run
    assert "| dp-fedavg | 0.5 | 1 |" in notes


# -- finding 4: TensorBoard after a restart from round 0 -----------------------------------------


def test_4_a_log_restarted_from_round_0_shows_each_round_once(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fedprivopt.simulation.tensorboard import TensorBoardLog

    first = TensorBoardLog(tmp_path, first_round=1)
    for r in (1, 2, 3):
        first.add_row({"round": r, "eval_loss": 10.0 + r})
    first.close()
    second = TensorBoardLog(tmp_path, first_round=1)  # no checkpoint: started again
    for r in (1, 2):
        second.add_row({"round": r, "eval_loss": 20.0 + r})
    second.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    shown = [(e.step, e.value) for e in acc.Scalars("eval_loss")]
    assert shown == [(1, 21.0), (2, 22.0)]  # was 1, 2, 3 of the discarded run, then 1, 2


# -- finding 5: a row whose runs completed different numbers of rounds -----------------------


def test_5_a_row_of_1_and_2_round_runs_says_1_to_2(tmp_path, capsys):
    tunings = []
    for seed in ("0", "1"):  # the one trial of seed 0 draws 1 round, of seed 1 2 rounds
        tunings.append(tmp_path / f"t{seed}")
        code = main([
            "tune", str(TOY), "--grid", "num-server-rounds=1,2", "--mean-trials", "1",
            "--seed", seed, "--out", str(tunings[-1]), "--quiet",
        ])  # fmt: skip
        assert code == 0
    out = tmp_path / "r"
    assert main(["compare-tuned", *map(str, tunings), "--out", str(out)]) == 0
    capsys.readouterr()
    summary = (out / "report.md").read_text(encoding="utf-8").split("## Summary", 1)[1]
    row = next(line for line in summary.splitlines() if line.startswith("| dp-fedavg (tuned)"))
    assert row.split(" | ")[5] == "1–2", row  # was 1, the fewest


# -- finding 6: tunings of one plan that released different noise multipliers ----------------


def test_6_tunings_released_at_two_sigmas_are_composed_together(tmp_path, capsys):
    tunings = []
    for seed in ("0", "1"):  # the one trial of seed 0 draws sigma 0.5, of seed 1 sigma 1
        tunings.append(tmp_path / f"t{seed}")
        code = main([
            "tune", str(TOY), "--grid", "noise-multiplier=0.5,1", "--mean-trials", "1",
            "--seed", seed, "--rounds", "1", "--out", str(tunings[-1]), "--quiet",
        ])  # fmt: skip
        assert code == 0
    out = tmp_path / "r"
    assert main(["compare-tuned", *map(str, tunings), "--out", str(out)]) == 0
    capsys.readouterr()
    report = (out / "report.md").read_text(encoding="utf-8")
    notes = report.split("## Notes", 1)[1]
    (row,) = [line for line in notes.splitlines() if line.startswith("| dp-fedavg |")]
    one = json.loads((tunings[0] / "summary.json").read_text(encoding="utf-8"))["epsilon"]
    cells = row.strip("| ").split(" | ")
    assert cells[1:3] == ["0.5, 1", "2"], row  # was two rows of n 1
    assert float(cells[3]) > one * 1.1  # two tunings composed, not one tuning's epsilon
    assert "are in several rows of the summary" in notes


# -- finding 7: which run "epsilon of one run" is ---------------------------------------------


def test_7_a_sigma_grid_names_the_costliest_point_of_one_run(tmp_path, capsys):
    out = tmp_path / "t"
    code = main([
        "tune", str(TOY), "--grid", "noise-multiplier=0.5,1", "--mean-trials", "3",
        "--distribution", "poisson", "--seed", "1", "--rounds", "1", "--out", str(out),
        "--quiet",
    ])  # fmt: skip
    assert code == 0
    capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert len({t["epsilon"] for t in summary["trials"]}) == 2  # sigma 0.5 and 1 both drawn
    report = (out / "report.md").read_text(encoding="utf-8")
    line = next(x for x in report.splitlines() if x.startswith("- epsilon of one run:"))
    assert line.endswith("(RDP; a run at the costliest grid point, noise-multiplier = 0.5)"), line


# -- finding 8: equal values whose float mean is rounded ----------------------------------------


def test_8_seven_equal_accuracies_are_shown_with_no_spread(tmp_path, capsys):
    out = tmp_path / "c"
    code = main([
        "compare", str(TOY), "--strategies", "fedavg", "--seeds", "7", "--rounds", "1",
        "--set", "server-learning-rate=1e-30", "--out", str(out), "--quiet",
    ])  # fmt: skip
    assert code == 0
    capsys.readouterr()
    report = (out / "report.md").read_text(encoding="utf-8")
    row = next(line for line in report.splitlines() if line.startswith("| fedavg | 0 | 7 |"))
    assert row.split(" | ")[6] == "0.3733 ± 0", row  # was 0.37333333 ± 0.00000000
