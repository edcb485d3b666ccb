"""Issue 15, thirty-first review (compare and tuning reports): regression tests of its findings.

1. ``tune toy.toml --grid server-learning-rate=0.5,1 --grid
   strategies.dp-fedavg.server-learning-rate=0.1,0.2`` (also ``compare --tune-grid
   server-learning-rate=0.5,1 --tune-grid dp-fedavg:strategies.dp-fedavg.server-learning-rate=
   0.1,0.2``, a task parameter in snake and kebab case, or a ``strategies={...}`` table beside
   the bare key): rc 0, every trial ran at the strategy table's rate, and the report released
   "best trial-001 (server-learning-rate=0.5, strategies.dp-fedavg.server-learning-rate=0.2)",
   naming a rate no trial ran (``trials.csv`` too). Two grid keys that set one key were
   compared only by their spelling; a grid key against ``--set`` was already refused (eleventh
   review, finding 2). Now rc 2 before anything is written, one line naming both grid keys and
   the key they set.
2. ``compare toy.toml --strategies dp-fedavg,fedavg --metric eval_loss``: ``summary.csv`` had
   two ``eval_loss_mean`` and two ``eval_loss_std`` columns (a CSV reader keeps one of each,
   pandas renames the second ``eval_loss_mean.1``), and ``report.md`` two identical columns,
   "loss (eval)" and "eval loss". Now one of each (also ``compare --tune-grid``'s report and
   ``compare-tuned``'s, which write the same files).
3. ``compare toy.toml --strategies dp-fedavg --tune-grid server-learning-rate=1e38,1
   --mean-trials 1 --seeds 3``, where two of the three tunings drew only the diverging rate and
   released nothing: the row's "n tunings composed" table said n = 1, ε 11.73 (one tuning's),
   although the report (and the row's seeds, 1 of 3) shows the outcome of all three tunings
   on the same users, each covered only by its own ε. Now n counts every tuning of the row,
   3, ε 20.65 (their composition); a row whose tunings all released a trial is unchanged.
4. ``compare-tuned T1 T2`` of two tunings of dp-fedavg (``tune --seed 1`` and ``--seed 2``, the
   same users): one row over both, at ε 11.73, one tuning's, with no word that publishing it
   costs their composition (16.61; ``compare --tune-grid`` has said so since the issue 20
   review), and "Privacy parameters" read "ε is the accountant's value after each run's last
   completed round" beside a tuned row whose run's was 10.28. Now the notes give each tuned
   row's n and composed ε (computed from the ledgers the tuning check recomputed, as ``compare
   --tune-grid`` now does too, no longer from ``summary.json`` alone), and the sentence says
   which rows' ε is a tuning's.
5. A trial of a tuning copied (``cp -r T/runs/trial-001``) or linked into a ``compare`` cell
   of its configuration (``compare --set server-learning-rate=0.5 --set seed=<its run seed>``),
   or given to ``compare-tuned`` as ``--untuned`` from outside its tuning: rc 0, reported at its
   single run's ε 10.28 where its tuning, which chose it on the private data, spent 13.08 (the
   eighth review refused a trial given as ``--untuned`` only inside its tuning's ``runs/``). Its
   ledger's header names the tuning's plan: now such a run is refused as a cell (``--overwrite``
   reruns a copy; a link stays refused) and as an untuned run, one line naming the ledger.
6. ``compare toy.toml --strategies dp-fedavg,fedavg --noise-multipliers 0.5,1``: ``report.md``
   began "3 runs in 3 groups: 2 strategies (dp-fedavg, fedavg) × 3 noise multipliers (0, 0.5,
   1)", counting the non-private baseline's σ 0 as a noise multiplier of the grid (a grid of
   6). Now "× 2 noise multipliers (0.5, 1) plus non-private baselines" (and "no noise
   (non-private)" for baselines alone).
7. ``compare-tuned T --untuned U`` where ``U`` reports ``eval_recall_at_5`` (a tag-prediction
   run of the mini preset; here a toy run whose rows say so) and the tuning's released trial
   does not, with ``--metric eval_recall_at_5`` or without ``--metric`` (chosen from the
   runs): rc 0 with a warning, the tuned run "skipped": a tuned comparison without its tuned
   row, whose notes still gave the tuning's ε. Now rc 2, one line naming the metric and the
   released trial.
8. ``tune toy.toml --grid server-learning-rate=0.5,1 --set target-epsilon=1 --rounds 2``
   (below one round's ε 7.55; also ``compare --tune-grid``, and a grid point such as
   ``noise-multiplier=0.2`` under ``target-epsilon=5``): rc 0, "no trial released", every
   trial's status "diverged" in ``trials.csv`` and the report, though none diverged: each
   stopped at its budget before its first round, training nothing (``compare`` refuses a grid
   whose every cell does so since the twenty-first review). Now rc 2 before anything is
   written, one line naming ``target-epsilon`` (and the grid point).
9. ``compare toy.toml --strategies dp-fedavg --noise-multipliers 0.2,1 --set
   target-epsilon=5`` (one round at σ 0.2 exceeds the budget): the σ 0.2 cell was left out of
   the report as "no 'eval_accuracy'; run skipped", blaming the metric. Now the warning (on
   stderr and in the report) says it stopped at its privacy budget before its first round,
   naming ``target-epsilon``; when every run did, the report is still refused naming it.
10. ``compare toy.toml --rounds 300 --set checkpoint-every=5`` killed (SIGKILL) after its
    fifth round's ledger line but before the first checkpoint, then the same command: the
    cell started again from round 0 (the restart the audit allows before a first checkpoint),
    and ``report.md`` said "resumed with the same configuration: no checkpoint, though its
    ledger records round 5; continued from its checkpoint". Now "... started again from round
    0 (no checkpoint to continue from)"; a resume from a checkpoint names its round. (Here:
    a 2-round cell with ``checkpoint-every=2`` whose checkpoints and summary are removed.)
11. The same ``tune`` command run again (every trial reused): its ``report.md`` said "number
    of trials: drawn from …; this call ran 2", though this call ran none. Now "this tuning
    drew 2, 2 of them run (or begun) in an earlier call" ("…, all run in this call" when so).
12. ``compare-tuned T --untuned R``, R a finished 2-round run whose ``config.toml`` was then
    set to 5 rounds (its ``summary.json`` of 2 rounds kept): rc 0, R reported as a final run
    of its configuration ("num-server-rounds: varies"), where ``compare`` refuses or resumes
    such a cell (fourth review). Now rc 2, one line: ``R fails the checks of --resume (it is
    not finished: it stopped at round 2 of 5; --resume it first)``.
13. ``compare --tune-grid …`` run again after a trial lost its ``summary.json`` (resumed, as
    after a kill): stdout gave no "(1 trials from an earlier call)" and the notes' "trials
    reused" said 0, where an untuned ``compare`` counts a resumed cell as from an earlier call.
    Now resumed trials count: stdout "(1 trials from an earlier call)", column "trials from an
    earlier call".
"""

from __future__ import annotations

import csv
import json
import re
import secrets
import shutil
from pathlib import Path

import pytest

from fedprivopt.cli import main

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- finding 1: two grid keys that set one key ---------------------------------------------------


@pytest.mark.parametrize(
    "grid",
    [
        ["server-learning-rate=0.5,1", "strategies.dp-fedavg.server-learning-rate=0.1,0.2"],
        ["strategies={dp-fedavg={server-learning-rate=0.1}},{dp-fedavg={server-learning-rate=0.2}}",
         "server-learning-rate=1,2"],
    ],
)  # fmt: skip
def test_1_tune_refuses_two_grid_keys_setting_one_key(tmp_path, capsys, grid):
    out = tmp_path / "t"
    argv = ["tune", str(TOY), *(f"--grid={g}" for g in grid), "--mean-trials", "1"]
    code, _, err = _run(capsys, *argv, "--rounds", "1", "--out", str(out), "--quiet")
    assert code == 2, err  # was rc 0: trials labelled by a rate that did not run
    assert len(err.strip().splitlines()) == 1, err
    assert "argument --grid:" in err and "both set 'server-learning-rate'" in err, err
    assert not out.exists()


def test_1_compare_tune_grid_refuses_a_prefixed_spelling_of_a_shared_key(tmp_path, capsys):
    out = tmp_path / "c"
    code, _, err = _run(
        capsys, "compare", str(TOY), "--strategies", "dp-fedavg",
        "--tune-grid", "server-learning-rate=0.5,1",
        "--tune-grid", "dp-fedavg:strategies.dp-fedavg.server-learning-rate=0.1,0.2",
        "--mean-trials", "1", "--rounds", "1", "--out", str(out), "--quiet",
    )  # fmt: skip
    assert code == 2, err
    assert "argument --tune-grid:" in err and "both set 'server-learning-rate'" in err, err
    assert not out.exists()


def test_1_distinct_grid_keys_still_tune(tmp_path, capsys):
    out = tmp_path / "t"
    code, stdout, err = _run(
        capsys, "tune", str(TOY), "--grid", "server-learning-rate=0.5,1",
        "--grid", "local-learning-rate=0.1,0.2", "--mean-trials", "1", "--seed", "1",
        "--rounds", "1", "--out", str(out), "--quiet",
    )  # fmt: skip
    assert code == 0, err
    assert "best trial-001" in stdout or "no trial released" in stdout, stdout


# -- finding 2: --metric eval_loss gives one loss column ------------------------------------------


def test_2_compare_metric_eval_loss_writes_one_loss_column(tmp_path, capsys):
    out = tmp_path / "c"
    code, _, err = _run(
        capsys, "compare", str(TOY), "--strategies", "dp-fedavg,fedavg", "--rounds", "1",
        "--metric", "eval_loss", "--out", str(out), "--quiet",
    )  # fmt: skip
    assert code == 0, err
    with (out / "summary.csv").open(newline="", encoding="utf-8") as fh:
        header, *rows = list(csv.reader(fh))
    assert len(header) == len(set(header)), header  # was eval_loss_mean, eval_loss_std twice
    assert header.count("eval_loss_mean") == 1 and len(rows) == 2, header
    table = [line for line in (out / "report.md").read_text().splitlines() if "| strategy" in line]
    assert table == ["| strategy | σ | seeds | ε | δ | rounds | loss (eval) | s/round |"], table


# -- finding 3: a tuning that released nothing is composed into its row -------------------------


def test_3_a_row_composes_its_tunings_that_released_nothing(tmp_path, capsys, monkeypatch):
    # tuning seeds 1 and 0 (OS entropy, here fixed): with --mean-trials 1 each tuning runs one
    # trial; seed 1 draws the rate 1 (released), seed 0 the rate 1e38 (diverges: released
    # nothing)
    drawn, randbits = iter([1, 0]), secrets.randbits  # numpy draws its own entropy too
    monkeypatch.setattr(secrets, "randbits", lambda k: next(drawn) if k == 63 else randbits(k))
    out = tmp_path / "c"
    code, _, err = _run(
        capsys, "compare", str(TOY), "--strategies", "dp-fedavg", "--seeds", "2",
        "--tune-grid", "server-learning-rate=1e38,1", "--mean-trials", "1", "--rounds", "1",
        "--out", str(out), "--quiet",
    )  # fmt: skip
    assert code == 0, err
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "Released nothing" in report and "dp-fedavg__sigma0.5__seed1" in report, report
    row = re.search(r"^\| dp-fedavg \| 0\.5 \| (\d+) \| ([0-9.]+) \|$", report, re.M)
    assert row is not None, report
    one = float(re.search(r"\| trial-001 \| [^|]+ \| ([0-9.]+) \|", report).group(1))
    assert row.group(1) == "2", report  # was 1: the empty tuning left out of the composition
    assert float(row.group(2)) > one, report


# -- finding 4: compare-tuned states a row's composed epsilon and what its epsilon is -------------


def test_4_compare_tuned_composes_a_row_of_two_tunings(tmp_path, capsys):
    tunings = []
    for seed in ("1", "2"):
        tunings.append(str(tmp_path / f"t{seed}"))
        code, _, err = _run(
            capsys, "tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials",
            "1", "--seed", seed, "--rounds", "1", "--out", tunings[-1], "--quiet",
        )  # fmt: skip
        assert code == 0, err
    out = tmp_path / "r"
    code, _, err = _run(capsys, "compare-tuned", *tunings, "--out", str(out))
    assert code == 0, err
    report = (out / "report.md").read_text(encoding="utf-8")
    one = float(re.search(r"^\| dp-fedavg \(tuned\) \| 0\.5 \| 2 \| ([0-9.]+) \|", report,
                          re.M).group(1))  # fmt: skip
    row = re.search(r"^\| dp-fedavg \| 0\.5 \| 2 \| ([0-9.]+) \|$", report, re.M)
    assert row is not None, report  # was: no composition of the row's two tunings
    assert float(row.group(1)) > one, report
    privacy = report.split("## Privacy parameters", 1)[1]
    assert "whose strategy ends in '(tuned)' is its tuning's" in privacy, privacy


# -- finding 5: a tuning's trial is no compare cell and no untuned run --------------------------


def test_5_a_copied_trial_is_refused_as_a_cell_and_as_an_untuned_run(tmp_path, capsys):
    tuning = tmp_path / "t"
    code, _, err = _run(
        capsys, "tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "1",
        "--seed", "1", "--rounds", "1", "--out", str(tuning), "--quiet",
    )  # fmt: skip
    assert code == 0, err
    trial = json.loads((tuning / "summary.json").read_text(encoding="utf-8"))["trials"][0]
    rate, seed = trial["hyperparameters"]["server-learning-rate"], trial["seed"]
    out = tmp_path / "c"
    (out / "runs").mkdir(parents=True)
    shutil.copytree(
        tuning / "runs" / "trial-001", out / "runs" / f"dp-fedavg__sigma0.5__seed{seed}"
    )
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1",
            "--set", f"server-learning-rate={rate}", "--set", f"seed={seed}", "--out", str(out),
            "--quiet"]  # fmt: skip
    code, _, err = _run(capsys, *argv)
    assert code == 2, err  # was rc 0: the trial reported at its single run's epsilon
    assert "is a trial of a tuning" in err and len(err.strip().splitlines()) == 1, err
    assert not (out / "summary.csv").exists()
    code, _, err = _run(capsys, *argv, "--overwrite")  # the copy is rerun as a cell of compare
    assert code == 0, err
    other = tmp_path / "t2"  # another tuning: the copy is not one of its trials' models
    code, _, err = _run(
        capsys, "tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "1",
        "--seed", "2", "--rounds", "1", "--out", str(other), "--quiet",
    )  # fmt: skip
    assert code == 0, err
    copy = tmp_path / "u"
    shutil.copytree(tuning / "runs" / "trial-001", copy)
    code, _, err = _run(capsys, "compare-tuned", str(other), "--untuned", str(copy), "--out",
                        str(tmp_path / "r"))  # fmt: skip
    assert code == 2, err  # was rc 0
    assert "argument --untuned:" in err and "is a trial of a tuning" in err, err


# -- finding 6: a baseline's sigma 0 is no noise multiplier of the grid ---------------------------


def test_6_report_counts_the_private_noise_multipliers(tmp_path, capsys):
    out = tmp_path / "c"
    code, _, err = _run(
        capsys, "compare", str(TOY), "--strategies", "dp-fedavg,fedavg", "--noise-multipliers",
        "0.5,1", "--rounds", "1", "--out", str(out), "--quiet",
    )  # fmt: skip
    assert code == 0, err
    first = (out / "report.md").read_text(encoding="utf-8").splitlines()[2]
    assert first.startswith(
        "3 runs in 3 groups: 2 strategies (dp-fedavg, fedavg) × 2 noise "
        "multipliers (0.5, 1) plus non-private baselines × 1 seeds"
    ), first


def _tuning_and_run(tmp_path, capsys) -> tuple:
    """A one-trial tuning ``t`` of dp-fedavg and an untuned one-round run ``u`` of it."""
    tuning, untuned = tmp_path / "t", tmp_path / "u"
    code, _, err = _run(
        capsys, "tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "1",
        "--seed", "1", "--rounds", "1", "--out", str(tuning), "--quiet",
    )  # fmt: skip
    assert code == 0, err
    code, _, err = _run(capsys, "simulate", str(TOY), "--rounds", "1", "--out", str(untuned))
    assert code == 0, err
    return tuning, untuned


# -- finding 7: compare-tuned never skips a tuning for the report's metric ------------------------


def _rebind_rows(run: Path, summary: dict) -> None:
    """Give ``run``'s checkpoints and ``summary`` the digest of its edited metrics rows.

    Since the thirty-ninth review (outputs follow-up 1) a checkpoint and ``summary.json`` hold
    the digest of the rows written before them, and edited rows are refused as another run's.
    """
    import torch

    from fedprivopt.simulation.checkpoint import RowsDigest, state_digest
    from fedprivopt.simulation.files import read_rows

    rows = read_rows(run / "metrics.jsonl")
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        if (run / name).exists():
            state = torch.load(run / name, weights_only=True)
            state["rows_sha256"] = RowsDigest().of(rows[: state["rows"]])
            state["sha256"] = state_digest(state)
            torch.save(state, run / name)
    summary["rows_sha256"] = RowsDigest().of(rows)


def test_7_compare_tuned_refuses_a_metric_a_tuning_lacks(tmp_path, capsys):
    tuning, untuned = _tuning_and_run(tmp_path, capsys)
    rows = untuned / "metrics.jsonl"  # a task's metric
    last = json.loads(rows.read_text(encoding="utf-8").splitlines()[-1])
    rows.write_text(json.dumps({**last, "eval_recall_at_5": 0.5}) + "\n", encoding="utf-8")
    summary = json.loads((untuned / "summary.json").read_text(encoding="utf-8"))
    summary["primary_metric"] = "eval_recall_at_5"
    _rebind_rows(untuned, summary)  # the rows are bound to the run since the thirty-ninth review
    (untuned / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    for metric in (["--metric", "eval_recall_at_5"], []):
        out = tmp_path / f"r{len(metric)}"
        argv = ["compare-tuned", str(tuning), "--untuned", str(untuned), "--out", str(out)]
        code, _, err = _run(capsys, *argv, *metric)
        assert code == 2, err  # was rc 0, the tuned run skipped with a warning
        assert "argument --metric: 'eval_recall_at_5'" in err and "trial-001" in err, err
        assert len(err.strip().splitlines()) == 1 and not out.exists(), err


# -- finding 8: a tuning whose runs train no round is refused ---------------------------------


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--grid", "server-learning-rate=0.5,1", "--set", "target-epsilon=1"], "config: "),
        (["--grid", "noise-multiplier=0.2,1", "--set", "target-epsilon=5"],
         "argument --grid: at grid point noise-multiplier=0.2, "),
    ],
)  # fmt: skip
def test_8_tune_refuses_a_budget_below_one_round(tmp_path, capsys, flags, named):
    out = tmp_path / "t"
    code, _, err = _run(capsys, "tune", str(TOY), *flags, "--mean-trials", "1", "--seed", "3",
                        "--rounds", "2", "--out", str(out), "--quiet")  # fmt: skip
    assert code == 2, err  # was rc 0: trials "diverged", no trial released
    assert f"{named}target-epsilon is below the epsilon of one round" in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists(), err


# -- finding 9: a cell stopped at its budget before round 1 is named for that ---------------------


def test_9_report_names_the_budget_of_a_cell_that_trained_nothing(tmp_path, capsys):
    out = tmp_path / "c"
    code, _, err = _run(
        capsys, "compare", str(TOY), "--strategies", "dp-fedavg", "--noise-multipliers", "0.2,1",
        "--rounds", "1", "--set", "target-epsilon=5", "--out", str(out), "--quiet",
    )  # fmt: skip
    assert code == 0, err
    warnings = (out / "report.md").read_text(encoding="utf-8").split("## Warnings", 1)[1]
    assert "no 'eval_accuracy'" not in warnings and "no 'eval_accuracy'" not in err, warnings
    assert "sigma0.2__seed0: stopped at its privacy budget before its first round" in err, err
    assert "target-epsilon is below the epsilon of one round" in warnings, warnings


# -- finding 10: a resumed cell's origin says where it continued from ----------------------------


def test_10_a_cell_restarted_without_a_checkpoint_is_not_said_to_continue_one(tmp_path, capsys):
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "2", "--set",
            "checkpoint-every=2", "--out", str(out), "--quiet"]  # fmt: skip
    code, _, err = _run(capsys, *argv)
    assert code == 0, err
    cell = out / "runs" / "dp-fedavg__sigma0.5__seed0"
    for name in ("checkpoint.pt", "checkpoint.prev.pt", "summary.json"):  # killed before them
        (cell / name).unlink(missing_ok=True)
    code, _, err = _run(capsys, *argv)
    assert code == 0, err
    runs = (out / "report.md").read_text(encoding="utf-8").split("## Runs", 1)[1]
    assert "continued from its checkpoint" not in runs, runs  # there was none
    assert "started again from round 0 (no checkpoint to continue from)" in runs, runs


# -- finding 11: a tuning's report does not say this call ran reused trials -----------------------


def test_11_tune_report_counts_the_trials_of_an_earlier_call(tmp_path, capsys):
    out = tmp_path / "t"
    argv = ["tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "1",
            "--seed", "1", "--rounds", "1", "--out", str(out), "--quiet"]  # fmt: skip
    code, _, err = _run(capsys, *argv)
    assert code == 0, err
    assert "this tuning drew 1, all run in this call" in (out / "report.md").read_text()
    code, _, err = _run(capsys, *argv)  # every trial reused
    assert code == 0, err
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "this call ran" not in text, text  # was "this call ran 1"
    assert "this tuning drew 1, 1 of them run (or begun) in an earlier call" in text, text


# -- finding 12: compare-tuned reports no unfinished untuned run ----------------------------------


def test_12_compare_tuned_refuses_an_unfinished_untuned_run(tmp_path, capsys):
    tuning, untuned = _tuning_and_run(tmp_path, capsys)
    config = untuned / "config.toml"
    text = config.read_text(encoding="utf-8")
    assert "num-server-rounds = 1\n" in text
    config.write_text(text.replace("num-server-rounds = 1\n", "num-server-rounds = 5\n"))
    out = tmp_path / "r"
    argv = ["compare-tuned", str(tuning), "--untuned", str(untuned), "--out", str(out)]
    code, _, err = _run(capsys, *argv)
    assert code == 2, err  # was rc 0: a 1-round run reported as final for a 5-round config
    assert "it is not finished: it stopped at round 1 of 5" in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists(), err


# -- finding 13: a resumed trial is from an earlier call ----------------------------------------


def test_13_compare_tune_grid_counts_a_resumed_trial_as_from_an_earlier_call(tmp_path, capsys):
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--tune-grid",
            "server-learning-rate=0.5,1", "--mean-trials", "1", "--rounds", "1", "--out",
            str(out), "--quiet"]  # fmt: skip
    code, _, err = _run(capsys, *argv)
    assert code == 0, err
    (out / "tune" / "dp-fedavg__sigma0.5__seed0" / "runs" / "trial-001" / "summary.json").unlink()
    code, stdout, err = _run(capsys, *argv)  # the trial is resumed
    assert code == 0, err
    assert "(1 trials from an earlier call)" in stdout, stdout  # was no note
    report = (out / "report.md").read_text(encoding="utf-8")
    assert re.search(r"\| trial-001 \| [^|]+ \| [0-9.]+ \| [0-9.]+ \| 1 \|$", report, re.M), report
