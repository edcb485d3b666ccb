"""``fedprivopt compare --tune-grid``: every cell a private tuning, the report at its ε.

The report reads each tuning with ``compare-tuned``'s own checks (``check_tunings``).
"""

import csv
import itertools
import json
import secrets
from pathlib import Path

import pytest

from fedprivopt import cli_tune_setup
from fedprivopt.cli import main

PRESET = Path(__file__).resolve().parents[1] / "simulations" / "toy.toml"
# seed 2: the truncated negative binomial with mean 1.5 draws one trial for seeds 2 and 3
SMALL = ["--set", "population=12", "--set", "clients-per-round=4", "--set",
         "task-params.num-users=12", "--set", "seed=2", "--rounds", "2", "--quiet"]  # fmt: skip
TRIALS = ["--mean-trials", "1.5", "--nb-shape", "1"]
GRID = ["--tune-grid", "server-learning-rate=0.3,1",
        "--tune-grid", "dp-fedadam:server-learning-rate=0.05,0.1",
        "--tune-grid", "dp-fedadam:local-learning-rate=0.1,0.5"]  # fmt: skip
CELLS = ("dp-fedavg__sigma0.5__seed2", "dp-fedadam__sigma0.5__seed2")


@pytest.fixture(autouse=True)
def tuning_seeds(monkeypatch):
    """Each cell's secret tuning seed (``secrets.randbits``) as 2, 3, ...: known trial counts.

    Only inside :func:`fedprivopt.cli_tune_setup.tuning_seed`: numpy's ``default_rng()`` also draws
    from ``secrets``, e.g. when scipy.stats is first imported during the test, which took seeds
    2-6 when this file ran alone.
    """
    seeds = itertools.count(2)
    drawn = cli_tune_setup.tuning_seed

    def tuning_seed(args, out):
        with monkeypatch.context() as patch:
            patch.setattr(secrets, "randbits", lambda bits: next(seeds))
            return drawn(args, out)

    monkeypatch.setattr(cli_tune_setup, "tuning_seed", tuning_seed)


def _exit_code(argv):
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors
        return exc.code


def _compare(out, *extra, grid=GRID):
    return ["compare", str(PRESET), "--strategies", "dp-fedavg,dp-fedadam", *grid, *TRIALS,
            "--out", str(out), *SMALL, *extra]  # fmt: skip


def _rows(out):
    with open(out / "summary.csv") as fh:
        return {r["strategy"]: r for r in csv.DictReader(fh)}


def test_compare_tune_reports_the_tunings_epsilon_and_reuses(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(_compare(out)) == 0
    assert capsys.readouterr().out.strip() == f"report: {out / 'report.md'}"
    assert sorted(p.name for p in (out / "tune").iterdir()) == sorted(CELLS)
    # per-strategy prefixes: dp-fedadam's own keys (its rate replaces the shared one)
    plans = {c: json.loads((out / "tune" / c / "tune.json").read_text()) for c in CELLS}
    assert plans[CELLS[0]]["grid"] == {"server-learning-rate": [0.3, 1]}
    assert plans[CELLS[1]]["grid"] == {"server-learning-rate": [0.05, 0.1],
                                       "local-learning-rate": [0.1, 0.5]}  # fmt: skip
    # each tuning seed is secret, drawn as tune without --seed draws it (here 2, then 3)
    assert [p["seed"] for p in plans.values()] == [2, 3]
    assert all(p["seed_source"] == "os-entropy" for p in plans.values())
    rows = _rows(out)
    assert set(rows) == {"dp-fedavg (tuned)", "dp-fedadam (tuned)"}
    # the same cell tuned by `fedprivopt tune` states the same epsilon as the report
    alone = tmp_path / "alone"
    argv = ["tune", str(PRESET), "--strategy", "dp-fedavg", "--grid",
            "server-learning-rate=0.3,1", *TRIALS, "--seed", "2", "--set",
            "noise-multiplier=0.5", "--out", str(alone), *SMALL]  # fmt: skip
    assert main(argv) == 0
    tuned = json.loads((alone / "summary.json").read_text())
    ours = json.loads((out / "tune" / CELLS[0] / "summary.json").read_text())
    assert ours["trials"] == [{**t, "origin": ours["trials"][i]["origin"]}
                              for i, t in enumerate(tuned["trials"])]  # fmt: skip
    row = rows["dp-fedavg (tuned)"]
    assert float(row["epsilon"]) == pytest.approx(tuned["epsilon"], rel=1e-12)
    assert float(row["epsilon_single_run"]) == pytest.approx(tuned["epsilon_single_run"])
    assert float(row["epsilon"]) > float(row["epsilon_single_run"])
    report = (out / "report.md").read_text()
    assert "epsilon includes the tuning" in report and "epsilon_single_run" in report
    # a rerun reuses every trial
    best = out / "tune" / CELLS[0] / "runs" / ours["best"]["trial"] / "summary.json"
    stamp = best.stat().st_mtime_ns
    capsys.readouterr()
    assert main(_compare(out)) == 0
    assert "from an earlier call" in capsys.readouterr().out
    assert best.stat().st_mtime_ns == stamp and _rows(out) == rows
    # a changed grid is refused (exit 2, one line), nothing changed; --overwrite reruns it
    changed = ["--tune-grid", "server-learning-rate=0.4,1", *GRID[2:]]
    summary = (out / "tune" / CELLS[0] / "summary.json").read_text()
    assert _exit_code(_compare(out, grid=changed)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--overwrite" in err and "Traceback" not in err
    assert (out / "tune" / CELLS[0] / "summary.json").read_text() == summary
    assert (out / "report.md").is_file()


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--mean-trials", "2"], "--mean-trials"),
        (["--distribution", "poisson"], "--distribution"),
        (["--nb-shape", "1"], "--nb-shape"),
        (["--tune-grid", "server-learning-rate=0.3,1"], "--mean-trials"),
        (["--tune-grid", "dp-fedavg:server-learning-rate=0.3,1", *TRIALS], "--tune-grid"),
        (["--tune-grid", "fedavg:server-learning-rate=1,2", *TRIALS], "--tune-grid"),
        (["--tune-grid", "server-learning-rate=1,1", *TRIALS], "--tune-grid"),
        (["--tune-grid", "clip-norm=1,2", "--tune-grid", "dp-fedavg:server-learning-rate=1,2",
          "--tune-grid", "dp-fedavg:server-learning-rate=3", *TRIALS], "--tune-grid"),
        (["--tune-grid", "noise-multiplier=0.3,1", *TRIALS], "--tune-grid"),
        (["--tune-grid", "seed=1,2", *TRIALS], "--tune-grid"),
        (["--tune-grid", "clip-norm=-1,1", *TRIALS], "clip-norm"),
        (["--tune-grid", "server-learning-rate=0.3,1", "--set", "server-learning-rate=1",
          *TRIALS], "--tune-grid"),
        (["--tune-grid", "server-learning-rate=0.3,1", "--mean-trials", "2",
          "--distribution", "poisson", "--nb-shape", "1"], "--nb-shape"),
        (["--tune-grid", "server-learning-rate=0.3,1", "--mean-trials", "0.5"], "--mean-trials"),
    ],
)  # fmt: skip
def test_bad_flags_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, extra, flag):
    out = tmp_path / "cmp"
    argv = ["compare", str(PRESET), "--strategies", "dp-fedavg,dp-fedadam", "--out", str(out),
            *SMALL, *extra]  # fmt: skip
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and "Traceback" not in err
    assert not out.exists()


def test_an_untuned_comparisons_out_is_refused(tmp_path, capsys):
    out = tmp_path / "cmp"
    (out / "runs").mkdir(parents=True)
    argv = _compare(out)
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out" in err and "runs" in err
    assert sorted(p.name for p in out.iterdir()) == ["runs"]
