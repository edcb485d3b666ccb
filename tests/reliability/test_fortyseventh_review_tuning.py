"""Forty-seventh review of issue 15, tuning: what a tuning's publishable outputs say.

The tuning's epsilon (Papernot & Steinke's private selection with a random number of trials K)
covers the release of the selected trial's result only: K, the tuning seed and the other trials
stay with the operator. ``compare-tuned``'s report is the one published beside that epsilon.

1. ``compare-tuned TA TB`` of two tunings whose data records differ (tasks by reference of
   other modules) warned "data 1, as in runs/trial-004" in its report and on the console: the
   released trial's number, a lower bound on K (at least 4 trials ran). Such a run is now named
   by its tuning ("as in the tuning TA").
2. ``compare-tuned T`` said "1 seeds (248092671)" in its header, the released trial's run seed
   ``derive_seed(tuning seed, "tune", "run", i)``: with a guessable ``--seed`` it gives ``i``
   and confirms the seed; a seeded trial's seed regenerates its noise. The header now counts a
   tuned row's tunings without their seeds, and the seeded-runs line says where they are.
3. ``compare-tuned TC TD`` of tunings of a task by reference whose string parameter differs
   (``--set 'task-params.label=![x](http://evil.example/t.png)'`` in one) wrote the Warnings
   item quoting it as Markdown: an image of another address, fetched when the report is shown.
   The Warnings' items are now plain text (brackets and ``<`` escaped).
4. ``compare-tuned TH`` of a tuning whose released trial's evaluation loss was infinite at
   round 1 only (final values finite, so ``tune`` released it; ``summary.json`` diverged 1)
   warned "TH/runs/trial-001: diverged at round 1 ..." and its Summary's seeds column said
   "1 (1 diverged: seed 2128243444 from round 1)": the trial's number and run seed. Every
   warning now names a tuned run by its tuning, and a tuned row's cell gives the round alone.
5. ``compare-tuned '<img src=x onerror=alert(1)>'`` (a tuning directory of that name; also
   ``![x](t.png)``) wrote the name into the table of released hyperparameters (and the
   selection note) as HTML or an image. Both write it as plain text now.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from fedprivopt.simulation import report, report_markdown
from fedprivopt.simulation.report_format import seeds_cell
from fedprivopt.simulation.rundata_aggregate import Selection
from fedprivopt.simulation.tune_notes import selection_lines
from fedprivopt.simulation.tune_report import tunings_lines


def _trial(root: Path, tuning: str, trial: str, data: dict, strategy: str) -> SimpleNamespace:
    """A released trial ``root/tuning/runs/trial`` whose ledger header records ``data``."""
    path = root / tuning / "runs" / trial
    path.mkdir(parents=True)
    header = {"ledger": 2, "kind": "header", "round": 0, "events": 0, "data": data}
    (path / "privacy_ledger.jsonl").write_text(json.dumps(header) + "\n")
    config = {"task": f"{tuning.lower()}:Task", "strategy": strategy, "secure": False}
    return SimpleNamespace(path=path, strategy=strategy + " (tuned)", summary={"config": config},
                           epsilon=9.459, noise_multiplier=0.5, seed=248092671)  # fmt: skip


def test_1_a_task_difference_names_a_tuned_run_by_its_tuning_not_its_trial(tmp_path):
    runs = [
        _trial(tmp_path, "TA", "trial-004", {"task_source": "a"}, "dp-fedavg"),
        _trial(tmp_path, "TB", "trial-001", {"task_source": "b"}, "dp-fedadam"),
    ]
    (warning,) = report._task_differences(runs)
    assert "trial-004" not in warning and "trial-001" not in warning
    assert '"data 1, as in the tuning TA"' in warning and "the tuning TB" in warning
    untuned = SimpleNamespace(**{**vars(runs[1]), "strategy": "dp-fedadam"})
    (warning,) = report._task_differences([runs[0], untuned])
    assert "as in runs/trial-001" in warning  # an untuned run: named as before


def test_2_the_header_does_not_list_a_released_trials_run_seed(tmp_path):
    tuned = [{"strategy": "dp-fedavg (tuned)", "seeds": [248092671]}]
    runs = [_trial(tmp_path, "T", "trial-001", {}, "dp-fedavg")]
    text = report_markdown._header_seeds(tuned, runs)
    assert "248092671" not in text and text.startswith("1 tuning per tuned group")
    untuned = [{"strategy": "dp-fedadam", "seeds": [0, 1]}]
    both = report_markdown._header_seeds(tuned + untuned, runs)
    assert "248092671" not in both and both.endswith("untuned groups: 2 seeds (0, 1)")
    seeded = [SimpleNamespace(seed=0), SimpleNamespace(seed=1)]
    assert report_markdown._header_seeds(untuned, seeded) == "2 seeds (0, 1)"  # as before
    (line,) = report_markdown._seeded_runs(runs)
    assert "which their tunings' files name" in line and "this report names" not in line


def test_3_a_warning_quoting_a_task_parameter_draws_no_image():
    issue = ('the runs differ in their task settings: task-params.label '
             '("![x](http://evil.example/t.png)", null) <img src=x>')  # fmt: skip
    text = report_markdown.markdown("t", Selection("eval_accuracy", []), [], [issue], None)
    item = text.split("## Warnings", 1)[1].strip()
    assert "![x](" not in item and "!\\[x\\](" in item and "\\<img src=x>" in item
    assert item.startswith("- the runs differ in their task settings: task-params.label")


def test_4_a_diverged_released_trial_is_named_by_its_tuning_without_its_seed(tmp_path):
    (run,) = [_trial(tmp_path, "TH", "trial-004", {}, "dp-fedavg")]
    note = f"{run.path}: diverged at round 1 (an evaluation loss ...)"
    (hidden,) = report._trial_paths_hidden([note], [run])
    assert "trial-004" not in hidden and hidden.startswith("the released trial of the tuning TH")
    assert seeds_cell(1, 1, [(2128243444, 1)], seeds_named=False) == "1 (1 diverged: from round 1)"
    assert seeds_cell(2, 2, [(7, 3)]) == "2 (1 diverged: seed 7 from round 3)"  # untuned rows


def test_5_a_tuning_named_as_html_or_an_image_is_written_as_plain_text(tmp_path):
    plan = {
        "strategy": "dp-fedavg",
        "metric": "eval_accuracy",
        "grid": {"server-learning-rate": [0.5, 1]},
        "trial_count": {"distribution": "poisson", "mean": 2.0},
        "trials": [{"trial": "trial-001", "hyperparameters": {"server-learning-rate": 1}}],
    }
    checks = [SimpleNamespace(path=Path(name), plan=plan, best_dir=Path(name, "runs/trial-001"),
                              selection={"private": 3, "evaluated": 5})
              for name in ("<img src=x onerror=alert(1)>", "![x](t.png)")]  # fmt: skip
    text = "\n".join(tunings_lines(checks) + selection_lines(checks))
    assert "<img" not in text.replace("\\<img", "") and "![x](" not in text
    assert (
        "| \\<img src=x onerror=alert(1)> | dp-fedavg (tuned) | server-learning-rate = 1 |" in text
    )
