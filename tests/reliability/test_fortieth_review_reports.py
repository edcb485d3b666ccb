"""Issue 15, fortieth hostile review (reports: compare, tune, compare-tuned, reports): tests.

1. ``tune toy.toml --grid server-learning-rate=0.5,1 --mean-trials 2 --rounds 2 --seed 1 --out
   T``, then ``cp -r T/runs/trial-002 U/r; rm U/r/privacy_ledger.jsonl`` and ``compare-tuned T
   --untuned U/r``; also an untuned run given beside its own copy without a ledger
   (``--untuned U2/a --untuned U2/b``). Before: rc 0, the trial reported as an untuned
   dp-fedavg row at its single run's ε 10.28 where its tuning spent 13.09 (the ledger's tuning
   plan and its models' digests, which ``audit.refuse_trial`` and ``check_untuned_copies`` read,
   went with the ledger; only the note "no privacy_ledger.jsonl; epsilon recomputed"), and the
   run with its copy one row of 2 seeds, ``0.6133 ± 0``. Now a run without a readable ledger is
   told by the models its checkpoints hold (``tune_untuned._checkpoint_digests``; the ledger's
   line of a checkpoint's round records that model's digest): rc 2, "released the models of
   T/runs/trial-002", "is U2/a again, or a copy of it".
2. ``write_report(out, load_runs("T/runs/trial-001"), title=...)`` (the documented API of
   reports) of the tuning above's released trial (also ``load_runs("T/runs")``). Before: ε
   10.28 in the Summary and ``summary.csv`` without a word, where the tuning that chose it spent
   13.09 (``compare`` and ``compare-tuned --untuned`` refuse a trial, ``audit.refuse_trial``).
   Now ``rundata.load_run`` notes a run whose ledger names a tuning plan (``trial_note``: "a
   trial of a tuning ...: the epsilon shown is its own run's, below what the tuning ... spent"),
   in the report's Warnings and on stderr; ``tune_report.load_tuned``, whose tuned row carries
   the tuning's ε, drops the note.
3. ``write_report("results", runs, title=...)`` into a directory holding the user's own
   ``report.md`` and ``summary.csv``. Before: both replaced without a word (every command refuses
   to write over files it did not write). Now ``report._check_replaceable`` refuses, naming
   ``out_dir`` and the file, unless its ``report.md`` is an earlier report of ``write_report``
   (rewritten as before).
4. ``compare toy.toml --strategies dp-fedavg --tune-grid server-learning-rate=0.5,1 --mean-trials
   1 --seeds 2 --rounds 2`` (also ``compare-tuned T1 T2``). Before: ``privacy_utility.png`` drew
   the tuned row's mean over its 2 tunings at one tuning's ε, 11.74, under "ε (at δ=0.0001)",
   while publishing that mean costs their composition, 16.62 (``summary.csv``'s
   ``epsilon_tunings_composed``; the report's text says so, the plot read alone did not). Now
   the axis says "a tuned row over n tunings is drawn at one tuning's ε, their composition is
   what publishing it costs" (``report_plots._tunings_text``); rows of one tuning as before.
5. ``load_runs(T)`` of a ``tune`` output (also of a ``compare --tune-grid`` output). Before:
   ``T/metrics.jsonl: missing (is T a fedprivopt run directory?)`` (its ``summary.json`` is the
   tuning's), and "no run directories (with summary.json) found". Now ``rundata._refuse_tunings``
   says what it is and that its released run's ε is the tuning's, which ``load_runs`` does not
   compute (report it with ``compare-tuned`` or ``tune_report.load_tuned``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedprivopt.simulation import report_plots
from fedprivopt.simulation.files import LEDGER_FILE
from fedprivopt.simulation.report import aggregate_runs, write_report
from fedprivopt.simulation.run import simulate
from fedprivopt.simulation.rundata import RunData, load_run, load_runs, trial_note
from fedprivopt.simulation.tune_report import load_tuned
from fedprivopt.simulation.tune_untuned import check_untuned_copies, check_untuned_seeds
from tests.simulation.test_run import small_config


@pytest.fixture(scope="module")
def trial_and_run(tmp_path_factory):
    """A 1-round "trial" (its ledger names a tuning plan) and an untuned run of another seed."""
    root = tmp_path_factory.mktemp("r40reports")
    trial = root / "T" / "runs" / "trial-001"
    simulate(small_config(**{"num-server-rounds": 1, "seed": 7}), trial, tuning_plan="a" * 64)
    run = root / "C" / "r"
    simulate(small_config(**{"num-server-rounds": 1, "seed": 0}), run)
    return root, trial, run


def _copy_without_ledger(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    (dst / LEDGER_FILE).unlink()
    return dst


def test_1_a_trial_copied_without_its_ledger_is_no_untuned_run(trial_and_run, tmp_path):
    root, trial, _ = trial_and_run
    copy = _copy_without_ledger(trial, tmp_path / "U" / "r")
    with pytest.raises(ValueError, match=r"released the models of .*trial-001.*this run's checkp"):
        check_untuned_copies([root / "T"], [SimpleNamespace(path=copy)])
    # the trial's own copy with its ledger is refused as before
    kept = tmp_path / "U" / "kept"
    shutil.copytree(trial, kept)
    with pytest.raises(ValueError, match=r"\(the same digests in their privacy ledgers\)"):
        check_untuned_copies([root / "T"], [SimpleNamespace(path=kept)])


def test_1_a_run_and_its_copy_without_a_ledger_are_not_two_seeds(trial_and_run, tmp_path):
    root, _, run = trial_and_run
    copy = _copy_without_ledger(run, tmp_path / "U2" / "b")
    runs = [load_run(run), load_run(copy)]
    with pytest.raises(ValueError, match=r"is .* again, or a copy of it"):
        check_untuned_seeds(runs)
    check_untuned_copies([root / "T"], runs[:1])  # another seed's run is no trial's copy
    check_untuned_seeds(runs[:1])


def test_2_a_report_of_a_trial_says_its_epsilon_is_not_its_tunings(trial_and_run):
    _, trial, run = trial_and_run
    with pytest.warns(UserWarning) as caught:
        aggregate_runs([load_run(trial)])
    assert [str(w.message) for w in caught].count(trial_note(trial)) == 1
    assert "below what the tuning that chose its hyperparameters spent" in trial_note(trial)
    assert load_run(run).warnings == ()  # an untuned run: no note


def test_3_a_report_is_not_written_over_the_users_own_files(trial_and_run, tmp_path):
    _, _, run = trial_and_run
    mine = tmp_path / "results"
    mine.mkdir()
    (mine / "report.md").write_text("my notes\n")
    (mine / "summary.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"out_dir .*results' holds 'summary.csv', which is not"):
        write_report(mine, [load_run(run)], title="t")
    assert (mine / "report.md").read_text() == "my notes\n"
    assert (mine / "summary.csv").read_text() == "a,b\n"
    ours = tmp_path / "ours"
    write_report(ours, [load_run(run)], title="first")
    assert write_report(ours, [load_run(run)], title="again").read_text().startswith("# again")


def _tuned(root: Path, name: str, seed: int, accuracy: float) -> RunData:
    """A tuning's released 2-round dp-fedavg trial at σ 0.5, carrying the tuning ε 11.74."""
    config = {"strategy": "dp-fedavg", "noise-multiplier": 0.5, "sampling": "poisson",
              "accountant": "rdp", "delta": 1e-4, "seed": 0}  # fmt: skip
    summary = {"strategy": "dp-fedavg", "noise_multiplier": 0.5, "seed": seed, "epsilon": 10.28,
               "delta": 1e-4, "rounds_completed": 2, "config": config}  # fmt: skip
    rows = [{"round": r, "eval_accuracy": accuracy, "eval_loss": 0.9} for r in (1, 2)]
    trial = RunData(summary, rows, root / name / "runs" / "trial-001", ledger_epsilon=10.28)
    return load_tuned(root / name, SimpleNamespace(run=trial, epsilon=11.74))


def _epsilon_axis(monkeypatch, tmp_path, runs) -> str:
    labels = []
    monkeypatch.setattr(report_plots, "_finish",
                        lambda fig, ax, path, n: labels.append(ax.get_xlabel()))  # fmt: skip
    report_plots.draw_privacy_utility(aggregate_runs(runs), tmp_path / "p.png")
    return labels[0]


def test_4_a_tuned_row_of_two_tunings_is_not_drawn_as_one_tunings_cost(monkeypatch, tmp_path):
    two = [_tuned(tmp_path, "T1", 11, 0.51), _tuned(tmp_path, "T2", 12, 0.52)]
    label = _epsilon_axis(monkeypatch, tmp_path, two)
    assert "a tuned row over n tunings is drawn at one tuning's ε" in label, label
    assert _epsilon_axis(monkeypatch, tmp_path, two[:1]) == "ε (at δ=0.0001)"


def test_5_load_runs_of_a_tuning_says_it_is_one(trial_and_run, tmp_path):
    _, trial, _ = trial_and_run
    tuning = tmp_path / "T"
    shutil.copytree(trial, tuning / "runs" / "trial-001")
    (tuning / "tune.json").write_text("{}")
    (tuning / "summary.json").write_text('{"kind": "fedprivopt-tune"}')
    with pytest.raises(ValueError, match=r"T is a tuning \(it holds tune.json\): its released"):
        load_runs(tuning)
    tuned = tmp_path / "G"
    shutil.copytree(tuning, tuned / "tune" / "dp-fedavg__sigma0.5__seed0")
    with pytest.raises(ValueError, match="G is a tuned comparison"):
        load_runs(tuned)
    assert len(load_runs(tuning / "runs")) == 1  # its trials, each with its note (finding 2)
