"""Issue 15, forty-third hostile review (contract: the privacy contract, measured): tests.

1. ``compare stackoverflow-tp-mini.toml --strategies dp-fedavg,fedavg --rounds 1`` (the
   preset's default ``eval-split``, ``test``: 91 of its 100 evaluation users are training users;
   also ``write_report`` of such runs, or of runs of a task that does not say). Each private
   run's ``summary.json`` says ε does not cover its evaluations ("publish the models and
   epsilon, not these rows"). Before: ``report.md`` published the recall@5 and eval loss
   columns beside ε (3.305), the reference line and the privacy-utility plot with no word of
   it (its only caveat was the s/round line). Now a line under the Summary table says how many
   private runs evaluated users of the private population without noise (or did not say) and
   that ε does not cover those values (``report_markdown._private_evaluations``); a report
   whose runs evaluate users outside the private population (the toy task) has no such line.
2. ``tune toy.toml --grid server-learning-rate=0.5,1 --mean-trials 1`` (any tuning; here the
   Poisson draw K = 0 of seed 2). Its ``report.md`` shows the number of trials drawn ("this
   tuning drew 1"), every trial's hyperparameters, status, score and epsilon (the Trials table
   and ``trials.png``), while the tuning epsilon assumes K and the other trials stay secret.
   Before: the report said so only as one clause of its closing Privacy paragraph, and nothing
   said the report itself is not a release, where ``compare --tune-grid``'s report of the same
   tunings says in bold "This report is the operator's view, not a release". Now the tuning's
   report says the same under its title, naming what it shows and what to publish
   (``tune_report._markdown``).
"""

from __future__ import annotations

from pathlib import Path

from fedprivopt.cli import main
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.report import load_run, write_report
from fedprivopt.simulation.run import simulate

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


class _EvaluatesTrainingUsers(ToyClassificationTask):
    """The toy task reporting 3 of its 5 evaluation users as training users (as the test split)."""

    def private_evaluation_users(self) -> tuple[int, int]:
        return 3, 5


class _SaysNothing(ToyClassificationTask):
    """The toy task without ``private_evaluation_users`` (a task of one's own, unknown)."""

    private_evaluation_users = None


def _run(tmp_path: Path, name: str, cls=ToyClassificationTask, **overrides: object):
    config = load_config(TOY, {"num-server-rounds": 1, **overrides})
    simulate(config, tmp_path / name, task=cls(num_users=40, seed=0))
    return load_run(tmp_path / name)


def test_1_a_report_says_evaluations_of_private_users_are_outside_epsilon(tmp_path: Path) -> None:
    private = _run(tmp_path, "private", _EvaluatesTrainingUsers)
    unknown = _run(tmp_path, "unknown", _SaysNothing, seed=1)
    apart = _run(tmp_path, "apart", seed=2)
    assert "nor the evaluations (eval_* metrics)" in private.summary["not_covered"]
    text = write_report(tmp_path / "report", [private], title="t").read_text()
    line = next(x for x in text.splitlines() if x.startswith("Evaluations:"))
    assert "1 of the 1 private runs" in line and "epsilon does not cover" in line
    assert "eval loss" in line  # the columns it names
    both = write_report(tmp_path / "both", [private, unknown], title="t").read_text()
    assert "2 of the 2 private runs" in both
    alone = write_report(tmp_path / "apart-report", [apart], title="t").read_text()
    assert "Evaluations:" not in alone


def test_2_a_tuning_report_says_it_is_not_a_release(tmp_path: Path) -> None:
    out = tmp_path / "tune"
    argv = ["tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "1",
            "--distribution", "poisson", "--seed", "2", "--rounds", "1", "--out", str(out),
            "--quiet"]  # fmt: skip
    assert main(argv) == 0
    lines = (out / "report.md").read_text(encoding="utf-8").splitlines()
    assert lines[2].startswith("**This report is the operator's view, not a release.**")
    assert "publishing this report" in lines[2] and "NOT covered" in lines[2]
    assert "Publish only the released trial" in lines[2]
