"""Issue 15, forty-fourth hostile review (reports: compare, tune and the reports): tests.

1. A report over many runs whose seeds make no ranges: ``compare toy.toml --strategies dp-fedavg
   --tune-grid server-learning-rate=0.5,1 --mean-trials 1 --seeds 300`` (or ``compare-tuned`` of
   300 tunings), whose rows are the released trials, each with its own scattered run seed
   (1356721935, ...); also their diverged seeds, at many rounds. Before: the header listed all
   300 seeds (3,621 characters: the twenty-ninth review's ranges fold only consecutive seeds),
   and the Summary's seeds cell of a row whose 300 seeds diverged at 15 rounds held 3,816
   characters, one group per round. Now ``report_format.seed_list`` shows the first 10 spans
   and "and 290 more", and the seeds cell at most 10 rounds, then "N more from later rounds"
   (the Runs table still lists every run).
2. ``load_runs(D)`` (the documented API of reports, and ``compare-tuned T --untuned D``) of a
   folder of runs ``D`` that also holds a ``compare`` output ``D/C`` (its runs in ``D/C/runs``)
   or a tuning ``D/T``. Before: the compare output was left out without a word
   (``compare-tuned`` rc 0: a row over the loose run alone, C's dp-fedavg and fedavg runs
   missing), and the tuning was refused as ``D/T/metrics.jsonl: missing (is D/T a fedprivopt
   run directory?)``. Now ``rundata.load_runs`` refuses both by name: ``D/C is a compare output
   (its runs are in D/C/runs) ...; give D/C on its own``, and for ``D/T`` the refusal of a
   tuning given to ``load_runs`` itself (the fortieth review's reports 5).
3. The same with a folder of runs inside the folder: ``load_runs(D)`` of ``D/S`` and ``D/E/S2``
   (results kept by experiment). Before: ``D/E``'s runs were left out without a word (finding
   2's check looked for a compare output's ``runs/``). Now ``rundata.load_runs`` refuses
   ``D/E is a folder of runs, not a run of D ...; give D/E on its own``.
4. ``compare toy.toml --strategies dp-fedavg,dp-fedadam --rounds 2 --set
   strategies.dp-fedadam.ema-decay=0.9`` (one strategy evaluated at its moving average, the other
   at its last iterate). Before: ``report.md`` said "Evaluated: the exponential moving average
   (decay 0.9) of the released iterates: ...; the last iterate.", not which row's metric is of
   which model. Now each kind names its strategies: "... (dp-fedadam); the last iterate
   (dp-fedavg)." (one kind: as before).
5. ``compare toy.toml --strategies dp-fedavg,dp-fedadam --rounds 2 --set
   strategies.dp-fedadam.clip-norm=0.3 --set strategies.dp-fedadam.secure=true``. Before: the
   privacy parameters said "clip-norm: varies (see the runs)", "secure: varies (see the runs)"
   and "seeded runs: 1 of the 2 private runs (secure = false) ... epsilon holds only while the
   seeds are secret", naming no value and no strategy (the Runs table lists directories only).
   Now each varying key lists its values by strategy ("0.3 (dp-fedadam); 1.0 (dp-fedavg)", up
   to 10 values) and the seeded line names its strategies when not every private run is seeded.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from fedprivopt.simulation.report_markdown import markdown
from fedprivopt.simulation.rundata import RunData, load_runs
from fedprivopt.simulation.rundata_aggregate import aggregate_with_notes, select_runs


def _run(tmp_path: Path, seed: int, diverged_at: int | None = None, rounds: int = 3) -> RunData:
    """A released trial's run as a report reads it: its summary and metrics rows (no files)."""
    config = {"strategy": "dp-fedavg", "noise-multiplier": 0.5, "seed": seed,
              "accountant": "rdp", "sampling": "poisson"}  # fmt: skip
    rows = [{"round": r, "epsilon": 1.0 * r, "eval_accuracy": 0.5, "eval_loss": 0.7}
            for r in range(1, rounds + 1)]  # fmt: skip
    if diverged_at is not None:
        rows = [{**row, "eval_loss": float("nan")} if row["round"] >= diverged_at else row
                for row in rows]  # fmt: skip
    summary = {"strategy": "dp-fedavg", "noise_multiplier": 0.5, "seed": seed, "epsilon": 3.0,
               "delta": 1e-4, "rounds_completed": rounds, "config": config,
               "final": {"eval_accuracy": 0.5, "eval_loss": rows[-1]["eval_loss"]},
               "diverged": diverged_at}  # fmt: skip
    return RunData(summary, rows, tmp_path / f"trial-{seed}", (), 3.0)


def test_1_scattered_seeds_are_not_all_listed(tmp_path):
    rng = random.Random(44)
    seeds = rng.sample(range(2**31), 300)
    runs = [_run(tmp_path, s) for s in seeds]
    sel, _ = select_runs(runs, "eval_accuracy")
    rows, notes = aggregate_with_notes(runs, "eval_accuracy")
    text = markdown("t", sel, rows, notes, None)
    header = text.splitlines()[2]
    assert len(header) < 600, len(header)  # was 3,621 characters of seeds
    assert "and 290 more" in header, header
    first = sorted(seeds)[:10]
    assert ", ".join(map(str, first)) in header, header


def test_1_diverged_seeds_at_many_rounds_are_cut(tmp_path):
    rng = random.Random(45)
    seeds = rng.sample(range(2**31), 300)
    runs = [_run(tmp_path, s, diverged_at=1 + i % 15, rounds=15) for i, s in enumerate(seeds)]
    sel, _ = select_runs(runs, "eval_accuracy")
    rows, notes = aggregate_with_notes(runs, "eval_accuracy")
    text = markdown("t", sel, rows, notes, None)
    row = next(line for line in text.splitlines() if line.startswith("| dp-fedavg |"))
    assert len(row) < 2000, len(row)  # was 3,816 characters: every seed of 15 rounds
    assert "300 diverged: seeds " in row and "100 more from later rounds" in row, row


@pytest.fixture
def one_run(tmp_path):
    """A folder ``D`` holding one finished 1-round toy run ``D/S``."""
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import simulate

    preset = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
    folder = tmp_path / "D"
    simulate(load_config(preset, {"num-server-rounds": 1}), folder / "S")
    return folder


def test_2_a_compare_output_in_a_folder_of_runs_is_not_left_out(one_run):
    cell = one_run / "C" / "runs" / "fedavg__sigma0__seed0"
    cell.mkdir(parents=True)
    (cell / "summary.json").write_text("{}")  # refused before any run of D is read
    with pytest.raises(ValueError, match="C is a compare output") as info:
        load_runs(one_run)  # was [D/S]: C's runs left out, no word
    assert "give " in str(info.value) and "on its own" in str(info.value)


def test_2_a_tuning_in_a_folder_of_runs_is_named_as_a_tuning(one_run):
    tuning = one_run / "T"
    (tuning / "runs").mkdir(parents=True)
    (tuning / "tune.json").write_text("{}")
    (tuning / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match="T is a tuning") as info:
        load_runs(one_run)  # was: D/T/metrics.jsonl: missing (is D/T a fedprivopt run ...)
    assert "metrics.jsonl" not in str(info.value)


def test_2_a_folder_of_runs_and_a_compare_output_still_load(one_run):
    assert [r.path.name for r in load_runs(one_run)] == ["S"]
    assert len(load_runs(one_run / "S")) == 1


def test_3_a_folder_of_runs_in_a_folder_of_runs_is_not_left_out(one_run):
    inner = one_run / "E" / "S2"
    inner.mkdir(parents=True)
    (inner / "summary.json").write_text("{}")  # refused before any run of D is read
    with pytest.raises(ValueError, match="E is a folder of runs"):
        load_runs(one_run)  # was [D/S]: D/E/S2 left out, no word
    (one_run / "F").mkdir()  # a folder of no runs is not one
    (inner / "summary.json").unlink()
    assert [r.path.name for r in load_runs(one_run)] == ["S"]


def test_4_each_evaluated_model_names_its_strategies(tmp_path):
    ema = "the exponential moving average (decay 0.9) of the released iterates"
    runs = []
    for strategy, evaluated in (("dp-fedavg", "the last iterate"), ("dp-fedadam", ema)):
        run = _run(tmp_path, 0)
        summary = {**run.summary, "strategy": strategy, "evaluated_model": evaluated}
        runs.append(RunData(summary, run.rows, tmp_path / strategy, (), 3.0))
    sel, _ = select_runs(runs, "eval_accuracy")
    rows, notes = aggregate_with_notes(runs, "eval_accuracy")
    text = markdown("t", sel, rows, notes, None)
    assert f"Evaluated: {ema} (dp-fedadam); the last iterate (dp-fedavg)." in text, text
    sel, _ = select_runs(runs[:1], None)
    one = markdown("t", sel, *aggregate_with_notes(runs[:1], None), None)
    assert "Evaluated: the last iterate." in one, one


def test_5_varying_privacy_settings_name_their_strategies(tmp_path):
    runs = []
    for strategy, clip, secure in (("dp-fedavg", 1.0, False), ("dp-fedadam", 0.3, True)):
        run = _run(tmp_path, 0)
        config = {**run.summary["config"], "strategy": strategy, "clip-norm": clip,
                  "secure": secure}  # fmt: skip
        summary = {**run.summary, "strategy": strategy, "config": config}
        runs.append(RunData(summary, run.rows, tmp_path / strategy, (), 3.0))
    sel, _ = select_runs(runs, "eval_accuracy")
    text = markdown("t", sel, *aggregate_with_notes(runs, "eval_accuracy"), None)
    assert "- clip-norm: varies (see the runs): 0.3 (dp-fedadam); 1.0 (dp-fedavg)" in text, text
    assert "- secure: varies (see the runs): false (dp-fedavg); true (dp-fedadam)" in text, text
    assert "private runs (secure = false), of dp-fedavg, derive" in text, text
