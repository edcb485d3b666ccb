"""Issue 15, thirty-fifth review (outputs): regression tests of its findings.

1. ``compare toy.toml --strategies fedavg --rounds 1 --set task="m:Dollar"``, a task by
   reference whose metric is named ``cost_$_per_$_user`` (or whose ``reference()`` model is
   named ``prior $\\hat{p}_$``): every cell ran, then rc 2 with matplotlib's 5-line
   ``ParseSyntaxException`` (the text between two ``$`` read as TeX), naming nothing; no
   ``report.md``, a lone ``summary.csv``. A name whose pair of ``$`` parsed was drawn as a
   formula (``usd$ and $x`` as ``usd and x`` in italics). Now the plots draw such names as
   written (``report_plots.plot_text`` escapes ``$``): rc 0, the report and both plots.
2. The same with a metric named ``p(y|x)``: ``report.md``'s Summary header was ``| … |
   eval_p(y|x) | eval loss | s/round |``, 10 cells over a delimiter row of 9, which Markdown
   does not take for a table (the Summary showed as lines of text). Now the header's cell is
   escaped as the rows' cells are (``eval_p(y\\|x)``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.simulation.report import write_report
from fedprivopt.simulation.rundata import load_runs

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


class _Named(ToyClassificationTask):
    """The toy task, its accuracy reported under :attr:`METRIC` (a name of the user's)."""

    METRIC = "accuracy"

    @property
    def primary_metric(self) -> str:
        return self.METRIC

    def evaluate(self, model):
        metrics = super().evaluate(model)
        return {"loss": metrics["loss"], self.METRIC: metrics["accuracy"]}


class _Dollar(_Named):
    METRIC = "cost_$_per_$_user"


class _DollarReference(_Named):
    def reference(self):
        return "prior $\\hat{p}_$", {self.METRIC: 0.3, "loss": 1.0}


class _Pipe(_Named):
    METRIC = "p(y|x)"


def _run(root: Path, task: str, capsys, name: str = "r", seed: int = 0) -> Path:
    out = root / name
    argv = ["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(out),
            "--set", f'task="{__name__}:{task}"', "--set", f"seed={seed}"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    return out


@pytest.mark.parametrize("task", ["_Dollar", "_DollarReference"])
def test_1_a_dollar_in_a_metric_or_reference_name_is_drawn_as_written(tmp_path, capsys, task):
    run = _run(tmp_path, task, capsys)
    report = write_report(tmp_path / "report", load_runs(run), title="t")
    for name in ("report.md", "summary.csv", "metric_vs_round.png", "privacy_utility.png"):
        assert (report.parent / name).is_file(), name


def test_2_a_pipe_in_the_metric_name_keeps_the_summary_a_table(tmp_path, capsys):
    run = _run(tmp_path, "_Pipe", capsys)
    text = write_report(tmp_path / "report", load_runs(run), title="t").read_text()
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| strategy |"))
    assert "eval_p(y\\|x)" in lines[head]
    cells = [line.replace("\\|", "").count("|") for line in lines[head : head + 3]]
    assert cells[0] == cells[1] == cells[2], lines[head : head + 3]
