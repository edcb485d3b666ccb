"""Issue 15, thirty-fourth review (tuning): regression tests of its findings.

1. ``compare toy.toml --strategies dp-fedavg,dp-fedadam --tune-grid server-learning-rate=0.5,1
   --tune-grid dp-fedadam:server-learning-rate=0.01,0.03,0.1 --mean-trials 1`` (dp-fedavg
   tuned over 2 points, dp-fedadam over 3): ``report.md`` set the two rows side by side with no
   word that their searches differ in size (only the tunings' commands, at the end, showed the
   grids), where ``compare-tuned`` of the same tunings says "The strategies were not tuned
   alike: their grid sizes (dp-fedavg: 2, dp-fedadam: 3 points) differ" (the thirty-third
   review's results finding 5, left open for ``compare --tune-grid``). Now the notes of a tuned
   comparison have the same table of how each strategy was tuned (grid, grid points, trials
   per tuning, selection) and the same sentence (``tune_report.procedure_lines``, shared).
2. A tuned comparison's cell directory copied into the place of another seed's cell (``cp -r
   C/tune/dp-fedavg__sigma0.5__seed0 C/tune/dp-fedavg__sigma0.5__seed1``), then the same
   ``compare --tune-grid`` with ``--seeds 2``: the copy kept the first cell's secret tuning seed
   (in its ``tune.json``), so the two cells were one tuning; the command checked and "ran" them,
   removed the earlier report, and ended rc 2 with compare-tuned's words ``TUNED:
   'C/tune/dp-fedavg__sigma0.5__seed1' has the tuning seed of …`` (``TUNED`` is no argument of
   ``compare``). Now rc 2 before anything is written: ``argument --out: '…seed1' holds the
   tuning of '…seed0' (the same secret tuning seed in its tune.json: a copy) …; remove
   '…seed1' to tune that cell afresh``, the earlier report kept.
3. ``compare-tuned C --out R`` of a tuned comparison ``C`` (its cells' tunings in ``C/tune/``):
   ``C: not a finished tuning (no summary.json)``, of a comparison that had finished;
   ``compare-tuned T --untuned C/tune``: ``C/tune/dp-fedadam__sigma0.5__seed0/metrics.jsonl:
   missing (is … a fedprivopt run directory?)``; ``--untuned C``: ``C: no run directories
   (with summary.json) found``. None said what the directories are. Now: ``TUNED: 'C' is a
   tuned comparison (compare --tune-grid), not one tuning; give its 2 cells' tunings as TUNED
   ('C/tune/*')``; ``--untuned C/tune`` is refused as a tuning given as untuned (``is (or holds)
   a trial of the tuning …; give the tuning as TUNED``), ``--untuned C`` as a tuned comparison.
4. ``tune toy.toml --grid checkpoint-every=1,2`` (also ``eval-every``, ``tensorboard``,
   ``vectorize``, ``fast-actors``, ``cohort-chunk``, ``round-timeout``, ``engine``, the
   resources; ``compare --tune-grid`` alike): rc 0, "best trial-001 (checkpoint-every=2)",
   released by a value that changes nothing a trial is selected by (the same run seed releases
   bit-identical models at every value of these keys: the seventeenth review's finding 1 for a
   strategy's unused option). Now rc 2 before anything is written: ``argument --grid:
   'checkpoint-every' cannot be tuned: it changes how a run is executed or recorded, not the
   model it trains nor its score, …`` (``tune_grid.RUN_ONLY_KEYS``).
5. A tuned comparison ``C``'s notes give each cell's ``tune`` command; that command with
   another grid and ``--overwrite`` (``tune toy.toml --grid server-learning-rate=0.1,0.2 …
   --out C/tune/dp-fedavg__sigma0.5__seed0 --overwrite``) discarded the cell's tuning and ran
   another, rc 0, while ``C/report.md`` and ``summary.csv`` still reported the old tuning's
   released trial (``server-learning-rate = 1``, no longer on disk): a stale report. Now rc 2
   before anything is written: ``argument --out: '…' is a cell of the tuned comparison 'C',
   whose report shows its tuning; --overwrite would replace it with another plan (--grid
   differs: …) and leave that report stale: rerun compare --tune-grid with --overwrite for the
   whole comparison, or choose another --out``. The same plan still continues the cell, and
   ``compare --tune-grid --overwrite`` still replaces cells with their report.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fedprivopt.cli import main

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


UNEQUAL = [
    "compare", str(TOY), "--strategies", "dp-fedavg,dp-fedadam",
    "--tune-grid", "server-learning-rate=0.5,1",
    "--tune-grid", "dp-fedadam:server-learning-rate=0.01,0.03,0.1",
    "--mean-trials", "1", "--rounds", "1", "--quiet",
]  # fmt: skip
"""A tuned comparison: dp-fedavg over 2 grid points, dp-fedadam over 3 (one round)."""


@pytest.fixture(scope="module")
def unequal_grids(tmp_path_factory) -> Path:
    """The comparison of :data:`UNEQUAL`, one seed."""
    out = tmp_path_factory.mktemp("r34t") / "c"
    assert main([*UNEQUAL, "--out", str(out)]) == 0
    return out


def _error(capsys) -> str:
    """The one line a refusal wrote on stderr."""
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


# -- finding 1: compare --tune-grid states per-strategy grids of different sizes ------------


def test_1_tuned_compare_states_the_grid_size_of_each_strategy(unequal_grids, capsys):
    capsys.readouterr()
    notes = (unequal_grids / "report.md").read_text(encoding="utf-8").split("## Notes", 1)[1]
    # a strategy's tunings here differ in the noise multiplier too (compare's axis)
    assert "tunings differ in the noise multiplier and the tuning seed alone" in notes, notes
    assert "| dp-fedavg (tuned) | 1 | server-learning-rate in [0.5, 1] | 2 |" in notes, notes
    assert "| dp-fedadam (tuned) | 1 | server-learning-rate in [0.01, 0.03, 0.1] | 3 |" in notes
    assert (
        "not tuned alike:** their grid sizes (dp-fedavg: 2, dp-fedadam: 3 points) differ"
    ) in notes, notes


# -- finding 2: a cell copied into another seed's place is refused before anything is written -


def test_2_a_copied_cell_is_refused_before_anything_is_written(unequal_grids, tmp_path, capsys):
    out = tmp_path / "c"
    shutil.copytree(unequal_grids, out)
    cells = out / "tune"
    shutil.copytree(cells / "dp-fedavg__sigma0.5__seed0", cells / "dp-fedavg__sigma0.5__seed1")
    report = (out / "report.md").read_text(encoding="utf-8")
    capsys.readouterr()
    assert main([*UNEQUAL, "--seeds", "2", "--out", str(out)]) == 2
    err = _error(capsys)
    assert "argument --out:" in err and "TUNED" not in err, err
    assert "dp-fedavg__sigma0.5__seed1' holds the tuning of" in err, err
    assert "dp-fedavg__sigma0.5__seed0' (the same secret tuning seed" in err, err
    assert (out / "report.md").read_text(encoding="utf-8") == report  # nothing written
    assert not (cells / "dp-fedadam__sigma0.5__seed1").exists()


# -- finding 3: a tuned comparison given to compare-tuned is named as one ---------------------


def test_3_compare_tuned_names_a_tuned_comparison(unequal_grids, tmp_path, capsys):
    cell = unequal_grids / "tune" / "dp-fedavg__sigma0.5__seed0"
    capsys.readouterr()
    assert main(["compare-tuned", str(unequal_grids), "--out", str(tmp_path / "r1")]) == 2
    err = _error(capsys)
    assert "is a tuned comparison (compare --tune-grid), not one tuning" in err, err
    assert "give its 2 cells' tunings as TUNED" in err and "not a finished tuning" not in err
    for untuned, words in (
        (unequal_grids / "tune", "is (or holds) a trial of the tuning"),
        (unequal_grids, "is a tuned comparison (compare --tune-grid): its 2 cells are tunings"),
    ):
        argv = ["compare-tuned", str(cell), "--untuned", str(untuned)]
        assert main([*argv, "--out", str(tmp_path / "r2")]) == 2
        err = _error(capsys)
        assert "argument --untuned:" in err and words in err, err
        assert "metrics.jsonl" not in err and "no run directories" not in err, err
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


# -- finding 4: keys of how a run is executed cannot be tuned ---------------------------------


@pytest.mark.parametrize(
    "grid", ["checkpoint-every=1,2", "eval-every=1,2", "tensorboard=true,false",
             "vectorize=true,false", "engine=fast,flower", "fast-actors=0,2"],
)  # fmt: skip
def test_4_a_key_of_how_a_run_is_executed_is_refused_in_a_grid(grid, tmp_path, capsys):
    key = grid.partition("=")[0]
    argv = ["--mean-trials", "1", "--rounds", "1", "--out", str(tmp_path / "t"), "--quiet"]
    assert main(["tune", str(TOY), "--grid", grid, "--seed", "1", *argv]) == 2
    err = _error(capsys)
    assert f"argument --grid: '{key}' cannot be tuned: it changes how a run is executed" in err
    argv[-2] = str(tmp_path / "c")
    assert main(["compare", str(TOY), "--strategies", "dp-fedavg", "--tune-grid", grid,
                 *argv]) == 2  # fmt: skip
    assert f"argument --tune-grid: '{key}' cannot be tuned" in _error(capsys)
    assert not (tmp_path / "t").exists() and not (tmp_path / "c").exists()


# -- finding 5: tune --overwrite of a tuned comparison's cell with another plan ---------------


def test_5_overwriting_a_cell_of_a_tuned_comparison_is_refused(unequal_grids, tmp_path, capsys):
    out = tmp_path / "c"
    shutil.copytree(unequal_grids, out)
    cell = out / "tune" / "dp-fedavg__sigma0.5__seed0"
    plan = (cell / "tune.json").read_text(encoding="utf-8")
    capsys.readouterr()
    code = main([
        "tune", str(TOY), "--strategy", "dp-fedavg", "--grid", "server-learning-rate=0.1,0.2",
        "--mean-trials", "1", "--rounds", "1", "--set", "noise-multiplier=0.5",
        "--out", str(cell), "--overwrite", "--quiet",
    ])  # fmt: skip
    assert code == 2
    err = _error(capsys)
    assert f"is a cell of the tuned comparison '{out}'" in err and "(--grid differs" in err, err
    assert "leave that report stale" in err, err
    assert (cell / "tune.json").read_text(encoding="utf-8") == plan  # nothing replaced
    assert (cell / "runs" / "trial-001" / "config.toml").is_file()
