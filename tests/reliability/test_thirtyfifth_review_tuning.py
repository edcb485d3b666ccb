"""Issue 15, thirty-fifth review (tuning): regression tests of its findings.

1. ``tune toy.toml --grid server-learning-rate=0.5,1 --grid local-learning-rate=0.1,0.05
   --mean-trials 1 --seed 1 --out O``, then the same command with the two ``--grid`` flags in the
   other order (to continue it, or to add trials): rc 2, ``--out 'O' holds a tuning of another
   plan (the drawn trials differ (the tuning was made by another version))``, though the same
   version made both; the grids compare equal as JSON objects, but a trial's values are drawn
   from the seed key by key in the grid's order, so the trials differ. ``compare --tune-grid``
   with its ``--tune-grid`` flags reordered said the same. Now the refusal names the cause:
   ``--grid differs: the earlier tuning gave its keys in the order server-learning-rate,
   local-learning-rate, this call local-learning-rate, server-learning-rate; … give the --grid
   flags in the earlier order to continue it`` (``tune_replan.plan_difference``).
2. ``tune stackoverflow-tp-mini.toml --set task-params.eval-split=test
   --selection-on-private-users … --out S`` (91 of the task's 100 evaluation users are training
   users; the tuning's own report says "Selection: NOT covered by epsilon"), then
   ``compare-tuned S --out R``: rc 0, and ``R/report.md`` said the row's epsilon "is that of the
   whole tuning procedure", with no word that the choice of the released trial and its score
   read private users' data without noise. Now ``compare-tuned`` recomputes, from the tasks of
   the tuning's grid points, whether its selection read private users
   (``TunedCheck.selection``, ``tune_report.selection_users``, the function ``tune`` checks it
   with), and the notes say "Tuned rows whose epsilon does not (or may not) cover their
   selection: - S (dp-fedavg (tuned)): Selection: NOT covered by epsilon. 91 of the task's 100
   evaluation users …" (also "not checked" for a task that does not say).
3. ``tune toy.toml --grid server-learning-rate=0.5,1 --mean-trials 1 --distribution poisson
   --seed 2`` (the Poisson draw K = 0): ``report.md`` said "this tuning drew 0, all run in this
   call" (noticed and left by the thirty-third and thirty-fourth reviews). Now "this tuning drew
   0 (K = 0), so no trial was run and none released".
4. ``compare-tuned T --out R``: ``R/report.md``, the comparison one publishes beside the
   tuning's ε, had a column "released trial" (``trial-007``): the released trial's number, a
   lower bound on the number of trials K (at least 7 ran), which the Papernot-Steinke bound
   assumes secret (``compare --tune-grid``'s report, which shows K, says it is the operator's
   view, not a release; the tuning's privacy note named K and the seed, not the trial's
   number). Now the table gives each tuning's released hyperparameters without the number and
   says why; the tuning's own privacy note adds "the released trial's number (trial-NNN: at
   least NNN trials ran)" to what epsilon does not cover. ``test_thirtythird_review_results``
   ``test_5`` now expects the row without the number.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.models.toy import ToyClassificationTask
from tests.reliability.test_thirtyfourth_review_tuning import TOY, _error

SLR, LLR = "server-learning-rate=0.5,1", "local-learning-rate=0.1,0.05"


def _tune(out: Path, *flags: str, seed: str = "1") -> list[str]:
    """A one-round toy tuning of mean 1 trial into ``out``, with ``flags``."""
    return ["tune", str(TOY), *flags, "--mean-trials", "1", "--seed", seed, "--rounds", "1",
            "--out", str(out), "--quiet"]  # fmt: skip


# -- finding 1: --grid flags in another order are named as such ------------------------------


def test_1_grid_flags_in_another_order_are_named(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(_tune(out, "--grid", SLR, "--grid", LLR)) == 0
    capsys.readouterr()
    assert main(_tune(out, "--grid", LLR, "--grid", SLR)) == 2
    err = _error(capsys)
    assert "another version" not in err, err
    assert (
        "--grid differs: the earlier tuning gave its keys in the order server-learning-rate, "
        "local-learning-rate, this call local-learning-rate, server-learning-rate"
    ) in err, err
    assert main(_tune(out, "--grid", SLR, "--grid", LLR)) == 0  # the earlier order continues


# -- finding 2: compare-tuned says when a tuning's selection read private users ---------------


class OverlappingToy(ToyClassificationTask):
    """The toy task, evaluated on 1 of 4 users who also train (as eval-split=test would)."""

    def private_evaluation_users(self):
        return (1, 4)


@pytest.fixture(scope="module")
def overlapping(tmp_path_factory) -> tuple[Path, Path]:
    """A tuning of :class:`OverlappingToy` with ``--selection-on-private-users``, and
    ``compare-tuned``'s report of it."""
    base = tmp_path_factory.mktemp("r35t")
    out, report = base / "s", base / "r"
    task = f"task={__name__}:OverlappingToy"
    assert main(_tune(out, "--grid", SLR, "--set", task, "--selection-on-private-users")) == 0
    assert main(["compare-tuned", str(out), "--out", str(report)]) == 0
    return out, report


def test_2_compare_tuned_says_the_selection_is_not_covered(overlapping):
    out, report = overlapping
    assert "Selection: NOT covered by epsilon" in (out / "report.md").read_text(encoding="utf-8")
    notes = (report / "report.md").read_text(encoding="utf-8").split("## Notes", 1)[1]
    assert "Tuned rows whose epsilon does not (or may not) cover their selection" in notes, notes
    assert (
        f"- {out} (dp-fedavg (tuned)): Selection: NOT covered by epsilon. 1 of the task's 4 "
        "evaluation users are in the private population"
    ) in notes, notes


# -- finding 3: a tuning that drew no trial says so ------------------------------------------


def test_3_a_tuning_that_drew_no_trial_says_none_was_run(tmp_path, capsys):
    out = tmp_path / "z"
    # the seed whose Poisson draw is K = 0
    assert main(_tune(out, "--grid", SLR, "--distribution", "poisson", seed="2")) == 0
    assert capsys.readouterr().out.startswith("0 trials, no trial released;")
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "all run in this call" not in text, text
    assert "this tuning drew 0 (K = 0), so no trial was run and none released" in text, text


# -- finding 4: compare-tuned does not publish the released trial's number --------------------


def test_4_compare_tuned_leaves_out_the_released_trials_number(overlapping):
    out, report = overlapping
    text = (report / "report.md").read_text(encoding="utf-8")
    assert "trial-0" not in text, text  # the number bounds K from below
    assert f"| {out} | dp-fedavg (tuned) | server-learning-rate = " in text, text
    assert "the released trial's number is not shown: trial-NNN means that at least NNN" in text
    own = (out / "report.md").read_text(encoding="utf-8")  # the operator's: names the trial
    assert "the released trial's number (trial-NNN: at least NNN trials ran)" in own, own
