"""Issue 15, forty-fourth hostile review (reports: compare, tune and the reports): tests.

1. A report over many runs whose seeds make no ranges: ``compare toy.toml --strategies dp-fedavg
   --tune-grid server-learning-rate=0.5,1 --mean-trials 1 --seeds 300`` (or ``compare-tuned`` of
   300 tunings), whose rows are the released trials, each with its own scattered run seed
   (1356721935, ...); also their diverged seeds, at many rounds. Before: the header listed all
   300 seeds (3,621 characters: the twenty-ninth review's ranges fold only consecutive seeds),
   and the Summary's seeds cell of a row whose 300 seeds diverged at 15 rounds held 3,816
   characters, one group per round. Now ``report_markdown._seed_list`` shows the first 10 spans
   and "and 290 more", and the seeds cell at most 10 rounds, then "N more from later rounds"
   (the Runs table still lists every run).
"""

from __future__ import annotations

import random
from pathlib import Path

from fedprivopt.simulation.report_markdown import markdown
from fedprivopt.simulation.rundata import RunData
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
