"""Issue 15, forty-fifth hostile review, follow-up (ledger: the ledger, resume and report fixes).

1. ``compare toy.toml --strategies dp-fedavg --seeds 2 --rounds 2 --out C`` (``report.md``:
   "seeds composed ... 2 runs: 13.71"), then seed 1's ``privacy_ledger.jsonl`` cut to its
   header line (an older backup put back), then ``write_report(out, load_runs(C), ...)`` (the
   documented API; ``compare`` itself refuses the cut ledger). Before: "seeds composed ...
   dp-fedavg σ=0.5, 2 runs: 10.28" and ``summary.csv``'s ``epsilon_seeds_composed`` 10.28 (one
   run's ε), where publishing both costs 13.71: the composition took each ledger's events
   without checking that the ledger accounts for its run's ε (``load_run`` noted the files
   disagree: ledger 0, summary, rows and checkpoint 10.28). Now
   ``rundata_aggregate.seeds_composed_epsilon`` gives ``nan`` ("not computed ... a ledger ...
   does not account for its run's ε") when a run's ε exceeds its ledger's at its δ; whole
   ledgers composed as before (the forty-fifth review's open row, ledger/reports).
2. ``load_run(R)`` (also ``load_runs(R)``) of a run directory interrupted before its
   ``summary.json`` (config, ledger, checkpoint and rows; or killed before its first row, a
   ledger alone). Before: ``R/summary.json: missing (is R a fedprivopt run directory?)`` (of
   a ledger alone, ``load_runs``: "R: no run directories (with summary.json) found"), where
   ``load_runs`` of its parent says that it is not finished and to continue it with
   ``--resume`` (thirty-fifth review, outputs 3). Now ``rundata._refuse_unfinished`` says the
   same of a run given itself; a directory without a run's files is "missing" as before.
3. A bypass of the forty-fifth review's reports 3: ``tune toy.toml --grid
   server-learning-rate=0.5,1 --mean-trials 2 --rounds 1 --seed 3 --set secure=true --out T``,
   then in ``T/runs/trial-001`` its checkpoint, rows and summary removed and its ledger cut to
   its header (an older backup put back) or removed, ``config.toml`` kept; then the same
   command (also ``compare --tune-grid``'s cells). Before: rc 0, the trial run again from
   round 1 with new noise (score 0.4233, then 0.4333 or 0.5300), the tuning still at epsilon
   9.459 for one trial. Now ``tune_dir._check_recorded_rounds`` (from
   ``check_vanished_trials``) refuses, rc 2, one line; a trial whose ledger or checkpoint
   holds the stated rounds is resumed (the ledger rebuilt) as before.
4. ``compare-tuned T`` of that tuning with the ledger removed (config.toml alone). Before:
   "... missing or empty, but the trial ran ...; run the same tune command again, which
   rebuilds the ledger from the trial's checkpoint", of a trial with no checkpoint: that
   command ran the trial again (finding 3). Now ``tune_trials.check_trial`` says to put the
   trial's files back when it has no checkpoint; with one, the advice as before.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest

from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.report import write_report
from fedprivopt.simulation.run import simulate
from fedprivopt.simulation.rundata import load_run, load_runs
from fedprivopt.simulation.rundata_aggregate import aggregate_runs

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def _seeds(root: Path, seeds: int = 2) -> list[Path]:
    """``seeds`` one-round dp-fedavg toy runs on the same users (a compare row's runs)."""
    dirs = []
    for seed in range(seeds):
        out = root / f"dp-fedavg__sigma0.5__seed{seed}"
        simulate(load_config(TOY, {"num-server-rounds": 1, "seed": seed}), out)
        dirs.append(out)
    return dirs


def test_1_a_ledger_cut_to_its_header_is_not_composed_as_none(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    _, second = _seeds(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (row,) = aggregate_runs(load_runs(root))
    both = row["epsilon_seeds_composed"]  # 10.28, one run's 7.551
    assert both > row["epsilon"] * 1.2
    ledger = second / "privacy_ledger.jsonl"
    ledger.write_text(ledger.read_text(encoding="utf-8").splitlines(keepends=True)[0],
                      encoding="utf-8")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = load_runs(root)
        (row,) = aggregate_runs(runs)
        assert math.isnan(row["epsilon_seeds_composed"])  # was 7.551, one run's
        write_report(tmp_path / "report", runs, title="t")
    report = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert "2 runs: not computed" in report and "does not account for" in report
    table = (tmp_path / "report" / "summary.csv").read_text(encoding="utf-8")
    assert table.splitlines()[1].endswith(",nan")


def test_2_load_run_of_an_unfinished_run_says_so(tmp_path: Path) -> None:
    (run,) = _seeds(tmp_path, 1)
    (run / "summary.json").unlink()
    for load in (load_run, load_runs):
        with pytest.raises(
            ValueError,
            match=r"a run without summary.json: it is not finished "
            r"\(interrupted, or still running\); continue it with --resume",
        ):
            load(run)
    (run / "metrics.jsonl").unlink()  # killed before its first row: a ledger alone
    for load in (load_run, load_runs):
        with pytest.raises(ValueError, match="it is not finished"):
            load(run)
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ValueError, match=r"summary.json: missing \(is .* a fedprivopt run"):
        load_run(other)


def test_3_a_trial_left_with_its_config_alone_is_not_run_again(tmp_path: Path, capsys) -> None:
    from fedprivopt.cli import main

    out = tmp_path / "t"
    argv = ["tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "2",
            "--rounds", "1", "--seed", "3", "--quiet", "--out", str(out),
            "--set", "secure=true"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    (trial,) = sorted((out / "runs").iterdir())
    kept = {name: (trial / name).read_bytes()
            for name in ("privacy_ledger.jsonl", "checkpoint.pt", "metrics.jsonl")}  # fmt: skip
    header = kept["privacy_ledger.jsonl"].splitlines(keepends=True)[0]
    for name in ("checkpoint.pt", "metrics.jsonl", "summary.json"):
        (trial / name).unlink()
    for ledger in (header, None):  # cut to its header (an older backup), or removed
        if ledger is None:
            (trial / "privacy_ledger.jsonl").unlink()
        else:
            (trial / "privacy_ledger.jsonl").write_bytes(ledger)
        capsys.readouterr()
        assert main(argv) == 2  # before: 0, the trial run again from round 1 with new noise
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "Traceback" not in err, err
        assert f"{trial.name}: its privacy_ledger.jsonl and checkpoints record 0 rounds" in err
        assert not (trial / "metrics.jsonl").exists() and (out / "summary.json").is_file()
    for name in ("checkpoint.pt", "metrics.jsonl"):  # the ledger rebuilt from them, as before
        (trial / name).write_bytes(kept[name])
    assert main(argv) == 0, capsys.readouterr().err


def test_4_compare_tuned_gives_no_advice_that_runs_a_trial_again(tmp_path: Path, capsys) -> None:
    from fedprivopt.cli import main

    out = tmp_path / "t"
    argv = ["tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "2",
            "--rounds", "1", "--seed", "3", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    (trial,) = sorted((out / "runs").iterdir())
    (trial / "privacy_ledger.jsonl").unlink()
    (trial / "summary.json").unlink()
    report = ["compare-tuned", str(out), "--out", str(tmp_path / "c")]
    rebuild, put_back = "run the same tune command again, which rebuilds", "put the trial's"
    for name, advice in ((None, rebuild), ("checkpoint.pt", put_back)):
        if name is not None:
            (trial / name).unlink()
        capsys.readouterr()
        assert main(report) == 2
        err = capsys.readouterr().err.strip()
        assert "but the trial ran" in err and advice in err, err  # before: always 'rebuilds'
