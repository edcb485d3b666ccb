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
"""

from __future__ import annotations

from pathlib import Path

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
