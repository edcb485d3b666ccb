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
3. ``compare toy.toml --strategies dp-fedavg --seeds 3 --out C`` stopped (Ctrl-C) during its
   third seed, then ``compare-tuned T --untuned C --out O`` (also ``write_report(out,
   load_runs(C))``): rc 0, the dp-fedavg row over 2 seeds without a word: ``load_runs`` left out
   a run directory without ``summary.json`` (an interrupted run, one stopped again after a
   ``--resume``, which removes it, or one still running), where an unfinished run that kept an
   earlier ``summary.json`` is refused. Now refused alike, in one line naming the directory:
   ``…/dp-fedavg__sigma0.5__seed2: a run without summary.json: it is not finished
   (interrupted, or still running); continue it with --resume, …``.
4. ``compare toy.toml --noise-multipliers 0.3,0.5,0.7,1,1.5,2`` (every strategy: 44 groups):
   ``metric_vs_round.png`` drew ``adadps, σ=1`` and ``fedavg (non-private)`` (and three more
   pairs) in one color and line style (10 colors × 4 styles by position, then again); and
   ``compare-tuned`` of tunings beside an untuned comparison of every strategy (more than 10
   strategy names) drew the 11th strategy's privacy–utility line in the first one's color and
   marker. Now a marker tells them apart (320 series, and 80 strategies, stay distinct).
5. ``compare toy.toml --strategies dp-fedavg --noise-multipliers 0.5,2 --rounds 3 --set
   target-epsilon=11`` (the budget stops σ 0.5 after round 2): ``summary.csv`` and both plots
   set the 2-round row beside the 3-round one with nothing to say it was cut short (the
   privacy–utility line's slope, "the price of privacy", then mixes training length), and
   ``report.md`` said "1 runs stopped early at the privacy budget" naming no row. Now
   ``summary.csv`` ends with ``seeds_stopped_by_budget``, the seeds cell says ``1 (1 stopped at
   the privacy budget)``, the point's label ``σ=0.5, 1 of 1 stopped at the budget`` and the
   line's legend ``(1 of 1 stopped at the budget)``.
6. ``compare toy.toml --strategies fedavg --rounds 1`` (every row evaluated at one round):
   ``metric_vs_round.png``'s axis "communication round" was ticked 0.945, 0.960, …, 1.050
   (matplotlib's integer locator wants two ticks, else gives fractions). Now ``1``.
7. ``compare $'my\n## Notes.toml' --strategies fedavg --rounds 1`` (a preset whose file name
   holds a newline): ``report.md`` began ``# fedprivopt compare: my`` and then a heading
   ``## Notes.toml`` of its own (a task whose ``initialization`` text holds a newline alike,
   in the "Initial model:" line). Now the title is one line, its control characters escaped
   (``# fedprivopt compare: my\n## Notes.toml``), and the task's text too.
8. ``write_report(out, load_runs(F))`` (the documented API) of a folder holding two
   ``simulate`` runs of dp-fedavg, seed 0, at ``local-learning-rate`` 0.1 and 0.5 (or seeds 0
   and 1 at the two rates): one row "seeds 2, accuracy 0.543 ± 0.099" under "mean ± sample std
   over seeds", the header saying "1 seeds (0)", without a word: two configurations' spread
   read as the seeds' (``compare-tuned --untuned`` refuses such runs). Now a warning, on stderr
   and in the report: ``dp-fedavg, σ=0.5: 2 of its runs have seed 0 (…): runs of one seed are
   not seeds, …`` or ``… differs from … beyond the seed (local-learning-rate 0.5, not 0.1) …``.
9. ``simulate toy.toml --set task="m:NoF1"``, a task by reference whose ``primary_metric`` is
   ``"f1"`` while its ``evaluate()`` returns ``accuracy`` and ``loss`` (also ``--engine
   flower``): rc 0, its last line ``eval_loss = 0.9698`` and a ``compare`` report of
   ``eval_accuracy`` instead of the metric the task leads with, without a word. Now refused at
   its first evaluation, rc 2, one line: ``NoF1.primary_metric is 'f1', which its evaluate()
   does not return (it returns accuracy, loss); name one of them`` (the directory removed, as
   for the other faults of ``evaluate()``).
10. ``simulate toy.toml --rounds 2 --out R`` (no TensorBoard), then ``tensorboard = true`` and
    ``num-server-rounds = 4`` in ``R/config.toml`` and ``simulate --resume R``: TensorBoard
    showed rounds 3 and 4 only (the new event file purged from its first round, and nothing
    held the rows before it). Now a resumed run whose directory holds no event file writes its
    earlier rows first: steps 1-4, each once, with the rows' values.
"""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedprivopt.cli import main
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.simulation.files import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, read_rows
from fedprivopt.simulation.report import write_report
from fedprivopt.simulation.report_plots import _diverged_text, _strategy_colors, _styles
from fedprivopt.simulation.rundata import load_runs
from fedprivopt.simulation.rundata_aggregate import aggregate_runs
from fedprivopt.strategies.config import NON_PRIVATE, STRATEGIES

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


class _NoF1(ToyClassificationTask):
    primary_metric = "f1"


class _Initialized(ToyClassificationTask):
    initialization = "zero weights\n## Notes"


class _Dollar(_Named):
    METRIC = "cost_$_per_$_user"


class _DollarReference(_Named):
    def reference(self):
        return "prior $\\hat{p}_$", {self.METRIC: 0.3, "loss": 1.0}


class _Pipe(_Named):
    METRIC = "p(y|x)"


def _run(root: Path, task: str, capsys, name: str = "r", seed: int = 0, *sets: str) -> Path:
    out = root / name
    argv = ["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(out),
            "--set", f'task="{__name__}:{task}"', "--set", f"seed={seed}"]  # fmt: skip
    argv += [f"--set={s}" for s in sets]
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


def test_3_an_unfinished_run_in_a_folder_of_runs_is_refused(tmp_path, capsys):
    runs = tmp_path / "c" / "runs"
    runs.mkdir(parents=True)
    for seed in (0, 1):
        _run(runs, "_Named", capsys, f"dp-fedavg__sigma0.5__seed{seed}", seed)
    shutil.copytree(runs / "dp-fedavg__sigma0.5__seed1", runs / "dp-fedavg__sigma0.5__seed2")
    (runs / "dp-fedavg__sigma0.5__seed2" / SUMMARY_FILE).unlink()  # as a stopped run has none
    with pytest.raises(ValueError, match=r"seed2: a run without summary\.json: it is not fin"):
        load_runs(tmp_path / "c")
    (runs / "notes").mkdir()  # a directory of the user's own: not a run, still left out
    shutil.rmtree(runs / "dp-fedavg__sigma0.5__seed2")
    assert len(load_runs(tmp_path / "c")) == 2


def test_4_every_series_of_a_large_grid_has_its_own_style():
    sigmas = (0.3, 0.5, 0.7, 1.0, 1.5, 2.0)
    keys = sorted((s, 0.0) if s in NON_PRIVATE else (s, x) for s in STRATEGIES for x in sigmas)
    keys = list(dict.fromkeys(keys))
    assert len(keys) == 44
    assert len(set(_styles(keys).values())) == len(keys)
    names = [*STRATEGIES, *(f"{s} (tuned)" for s in STRATEGIES)]  # compare-tuned: 18 names
    assert len(set(_strategy_colors(names).values())) == len(names)


def test_5_a_row_stopped_by_its_budget_is_marked_in_every_output(tmp_path, capsys):
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--noise-multipliers", "0.5,2",
            "--rounds", "3", "--set", "target-epsilon=11", "--quiet",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    with (out / "summary.csv").open(encoding="utf-8") as fh:
        table = {r["noise_multiplier"]: r for r in csv.DictReader(fh)}
    assert (table["0.5"]["rounds"], table["0.5"]["seeds_stopped_by_budget"]) == ("2", "1")
    assert (table["2.0"]["rounds"], table["2.0"]["seeds_stopped_by_budget"]) == ("3", "0")
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "| dp-fedavg | 0.5 | 1 (1 stopped at the privacy budget) |" in text
    assert "| dp-fedavg | 2 | 1 |" in text
    rows = {r["noise_multiplier"]: r for r in aggregate_runs(load_runs(out))}
    assert _diverged_text(rows[0.5]) == ", 1 of 1 stopped at the budget"
    assert _diverged_text(rows[2.0]) == ""


def test_6_a_single_round_is_ticked_as_a_whole_round(tmp_path, capsys, monkeypatch):
    from fedprivopt.simulation import report_plots

    ticks = []
    finish = report_plots._finish

    def seen(fig, ax, path, n_series):
        lo, hi = ax.get_xlim()
        ticks.append([t for t in ax.get_xticks() if lo <= t <= hi])
        return finish(fig, ax, path, n_series)

    monkeypatch.setattr(report_plots, "_finish", seen)
    run = _run(tmp_path, "_Named", capsys)
    report_plots.plot_metric_vs_round(load_runs(run), tmp_path / "m.png")
    assert ticks == [[1.0]]


def test_7_the_title_of_a_preset_named_with_a_newline_is_one_line(tmp_path, capsys):
    preset = tmp_path / "my\n## Notes.toml"
    shutil.copy(TOY, preset)
    out = tmp_path / "c"
    argv = ["compare", str(preset), "--strategies", "fedavg", "--rounds", "1", "--quiet",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    lines = (out / "report.md").read_text(encoding="utf-8").splitlines()
    assert lines[0].endswith("my\\n## Notes.toml"), lines[0]
    assert not any(line.startswith("## Notes") for line in lines)


_NOT_SEEDS = [(0, "2 of its runs have seed 0"), (1, "beyond the seed (local-learning-rate 0.4")]


@pytest.mark.parametrize(("seed", "said"), _NOT_SEEDS)
def test_8_runs_of_one_row_that_are_not_seeds_are_named(tmp_path, capsys, seed, said):
    root = tmp_path / "f"
    _run(root, "_Named", capsys, "a")
    _run(root, "_Named", capsys, "b", seed, "local-learning-rate=0.4")
    with pytest.warns(UserWarning, match=re.escape(said)):
        report = write_report(tmp_path / "report", load_runs(root), title="t")
    assert said in report.read_text(encoding="utf-8")


def test_9_a_primary_metric_evaluate_does_not_return_is_one_line(tmp_path, capsys):
    out = tmp_path / "r"
    argv = ["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(out),
            "--set", f'task="{__name__}:_NoF1"']  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "fedprivopt simulate: error: _NoF1.primary_metric is 'f1', which its evaluate() does not "
        "return (it returns accuracy, loss); name one of them"
    ]
    assert not out.exists()


def test_7_a_task_s_initialization_text_is_one_line(tmp_path, capsys):
    run = _run(tmp_path, "_Initialized", capsys)
    lines = write_report(tmp_path / "report", load_runs(run), title="t").read_text().splitlines()
    assert "Initial model: zero weights\\n## Notes." in lines
    assert not any(line.startswith("## Notes") for line in lines)


def test_10_tensorboard_turned_on_for_a_resume_shows_every_round(tmp_path, capsys):
    run = tmp_path / "r"
    argv = ["simulate", str(TOY), "--rounds", "2", "--quiet", "--out", str(run)]
    assert main(argv) == 0, capsys.readouterr().err
    config = (run / CONFIG_FILE).read_text(encoding="utf-8")
    config = config.replace("tensorboard = false", "tensorboard = true")
    (run / CONFIG_FILE).write_text(config.replace("num-server-rounds = 2", "num-server-rounds = 4"))
    assert main(["simulate", "--resume", str(run), "--quiet"]) == 0, capsys.readouterr().err
    events = EventAccumulator(str(run))
    events.Reload()
    shown = events.Scalars("eval_accuracy")
    rows = read_rows(run / METRICS_FILE)
    assert [e.step for e in shown] == [r["round"] for r in rows] == [1, 2, 3, 4]
    assert [e.value for e in shown] == pytest.approx([r["eval_accuracy"] for r in rows])
