"""Forty-fifth review of issue 15: the lead's findings (rows the reviewers left open).

1. ``deploy local toy.toml --nodes 1 --seed 99999999999999999999`` (the docs reviewer's open
   row on ``deploy local --help``, whose ``--seed`` named no range where ``simulate``'s does).
   Before: ``seed: integers must fit in 64 bits (as in TOML)``, naming a key and not the flag.
   Now: ``--seed must be an integer in [0, 9223372036854775807]`` (``deploy.cli``), the range
   ``--help`` now gives too; ``--timeout`` says its default (900), ``data synth``'s ``--vocab``
   and ``--tags`` theirs (20000, 500).
2. ``cd X; simulate stackoverflow-tp-mini.toml --rounds 1 --out r --set ray-address=H:P --set
   fast-actors=2`` (a relative synthetic ``data-dir``; the docs reviewer's open row: SCALING.md
   promises the check "before anything is written"). Before: rc 2 naming
   ``task-params.data-dir``, but only after the task was built: 500 synthetic users (12 MB) had
   been generated at ``X/data/...``, the relative path the check refuses. Now: refused before
   the task is built, nothing written (``cluster_config.check_cluster_config``, called first by
   ``simulation.run.simulate`` and by ``cli_runs.build_checked_run``: simulate, compare, tune).
3. ``simulate toy.toml --out C/runs/x`` while ``compare --out C`` runs (``--out T/runs/t``
   while ``tune --out T`` runs; the outputs follow-up's open row). Before: rc 0, a run written
   where the comparison's cell or the tuning's trial was to be (measured by that reviewer: the
   comparison stopped with rc 2 after two cells; the tuning ended rc 0 with the trial "failed"
   and the foreign run in its place). Now: rc 2 and one line naming the holder's PID, nothing
   written (``cli_args._refuse_inside_a_run`` calls ``deploy.out_checks.refuse_inside_writing``
   for every command's ``--out``; a lock this process holds is passed, as ``compare
   --tune-grid`` checks its tunings' ``--out`` under its own).
4. ``compare toy.toml --strategies dp-fedavg --seeds 2 --set secure=true --out C``, ``rm -rf
   C/runs/dp-fedavg__sigma0.5__seed1``, then the same command, or first ``--seeds 1`` (and with
   ``--tune-grid``: a cell's tuning removed with the plots; the ledger follow-up's open row,
   reports 3's twin for a comparison). Before: rc 0, the seed run (or tuned) again with new
   noise and the report written again, composed over 2 runs where 3 had been made; with
   ``--seeds 1`` first the report was rewritten without the cell, and a later ``--seeds 2``
   ran it again. Now: rc 2 and one line naming the cell's directory, the report kept
   (``cells.check_vanished_cells``: every cell the earlier ``report.md`` lists must still be
   there, before the report is removed; ``compare`` and ``compare --tune-grid``).
5. ``write_report(D, load_runs(R))`` of a dp-fedavg and a dp-fedadam run, the second's ledger
   cut to its header (the ledger follow-up's open row for contract 3's line). Before: "report
   composed: ... ε not computed here (a tuned row ..., a ledger that could not be read, or runs
   of other accountants ...)", naming no ledger short of its run's ε, which made it nan (the
   follow-up's ledger 1). Now the reason says it (``report_markdown._report_composed``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.cli import main

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


@pytest.mark.parametrize("seed", ["99999999999999999999", "9223372036854775808", "-1"])
def test_1_deploy_local_names_seed_and_its_range(tmp_path, capsys, seed):
    out = tmp_path / "d"
    code = main(["deploy", "local", str(TOY), "--nodes", "1", "--seed", seed, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert "--seed must be an integer in [0, 9223372036854775807]" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    "command, words",
    [
        (["deploy", "local", "--help"], ["in [0, 9223372036854775807]", "(default: 900)"]),
        (["data", "synth", "--help"], ["(default: 20000)", "(default: 500)"]),
    ],
)
def test_1_help_names_the_defaults_and_the_range(capsys, command, words):
    with pytest.raises(SystemExit) as stop:
        main(command)
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for word in words:
        assert word in text, text


def test_2_a_joining_run_s_relative_data_dir_is_refused_before_its_data_is_made(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.chdir(tmp_path)
    preset = Path(__file__).resolve().parents[2] / "simulations" / "stackoverflow-tp-mini.toml"
    args = ["simulate", str(preset), "--rounds", "1", "--out", "r", "--quiet"]
    sets = ["--set", "ray-address=127.0.0.1:1", "--set", "fast-actors=2"]
    code = main([*args, *sets, "--set", "task-params.data-dir=data/so"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "task-params.data-dir must be an absolute path" in err, err
    assert list(tmp_path.iterdir()) == []  # no data generated, no run directory


def test_2_the_python_api_refuses_it_before_its_data_is_made_too(tmp_path, monkeypatch):
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import simulate

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.chdir(tmp_path)
    preset = Path(__file__).resolve().parents[2] / "simulations" / "stackoverflow-tp-mini.toml"
    settings = {"ray-address": "127.0.0.1:1", "fast-actors": 2, "task-params.data-dir": "d/so"}
    config = load_config(preset, {**settings, "num-server-rounds": 1})
    with pytest.raises(ValueError, match=r"task-params\.data-dir must be an absolute path"):
        simulate(config, tmp_path / "r")
    assert list(tmp_path.iterdir()) == []


_HOLDER = """
import fcntl, os, sys, time
d = sys.argv[1]
fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
f = open(os.path.join(d, sys.argv[2]), "w")
fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
f.write(str(os.getpid())); f.flush()
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("lock, inside", [("compare.lock", "runs/x"), ("tune.lock", "runs/t")])
def test_3_simulate_into_a_running_comparison_or_tuning_is_refused(tmp_path, capsys, lock, inside):
    import subprocess
    import sys

    out = tmp_path / "C"
    (out / "runs").mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(out), lock], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        code = main(["simulate", str(TOY), "--rounds", "1", "--out", str(out / inside)])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and f"process {holder.pid} is writing" in err, err
    assert sorted(p.name for p in out.iterdir()) == sorted([lock, "runs"])
    assert list((out / "runs").iterdir()) == []


def _compare(out: Path, *extra: str) -> list[str]:
    args = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1"]
    return [*args, "--set", "secure=true", "--out", str(out), "--quiet", *extra]


@pytest.mark.parametrize("seeds", ["2", "1"])
def test_4_a_removed_cell_of_a_reported_comparison_is_not_run_again(tmp_path, capsys, seeds):
    import shutil

    out = tmp_path / "C"
    assert main(_compare(out, "--seeds", "2")) == 0
    shutil.rmtree(out / "runs" / "dp-fedavg__sigma0.5__seed1")
    report = (out / "report.md").read_text()
    capsys.readouterr()
    code = main(_compare(out, "--seeds", seeds))  # the same grid, or one without the cell
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "seed1: missing, but the comparison's report.md" in err, err
    assert (out / "report.md").read_text() == report  # kept: nothing ran
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["dp-fedavg__sigma0.5__seed0"]


def test_4_a_removed_tuning_of_a_tuned_comparison_is_not_run_again(tmp_path, capsys):
    import shutil

    out = tmp_path / "C"
    tuned = ["--tune-grid", "server-learning-rate=0.5,1", "--mean-trials", "1", "--seeds", "2"]
    assert main(_compare(out, *tuned)) == 0
    shutil.rmtree(out / "tune" / "dp-fedavg__sigma0.5__seed1")
    for plot in out.glob("*.png"):
        plot.unlink()
    capsys.readouterr()
    code = main(_compare(out, *tuned))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "seed1: missing, but the comparison's report.md lists this cell's tuning" in err, err
    assert not (out / "tune" / "dp-fedavg__sigma0.5__seed1").exists()


def test_5_the_report_composed_line_says_a_ledger_short_of_its_run(tmp_path):
    import warnings

    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.report import write_report
    from fedprivopt.simulation.run import simulate
    from fedprivopt.simulation.rundata import load_runs

    root = tmp_path / "runs"
    for strategy in ("dp-fedavg", "dp-fedadam"):
        config = load_config(TOY, {"num-server-rounds": 1, "strategy": strategy})
        simulate(config, root / f"{strategy}__sigma0.5__seed0")
    ledger = root / "dp-fedadam__sigma0.5__seed0" / "privacy_ledger.jsonl"
    ledger.write_text(ledger.read_text(encoding="utf-8").splitlines(keepends=True)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_report(tmp_path / "report", load_runs(root), title="t")
    report = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    (line,) = [x for x in report.splitlines() if x.startswith("- report composed")]
    assert "2 private runs: ε not computed here" in line, line
    assert "does not account for its run's ε" in line, line
