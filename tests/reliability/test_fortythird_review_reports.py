"""Issue 15, forty-third hostile review (reports: what ``compare``, ``tune`` and reports say).

1. The public functions of the reports and of the tuned comparison given a one-shot iterable
   (a generator over tunings, runs or rows, as ``(r for r in runs if ...)`` gives; the
   forty-second review's ``aggregate()`` given a cohort iterator, in this area):
   ``tune_check.composed_epsilon(iter(checks), 2)`` read the checks once for their own ε and
   found none left to compose: it returned one tuning's ε (9.03 for two 1-round dp-fedavg
   tunings at σ 0.5 of 12 users) where publishing both costs 13.33, an ε below what was
   spent; ``write_summary_csv(iter(rows), path)`` wrote the header alone (no row, no error);
   ``unequal_epsilon_notes(iter(rows))`` returned no note for dp-fedadam at 11.25 beside
   dp-fedavg at 3; ``bases_notes(iter(rows))`` named no row (``different accountants ()``);
   ``choose_metric(iter(runs))`` said ``none reports a task metric`` of runs that report
   accuracy; ``write_report(out, iter(runs))`` said ``runs: empty``. Each reads its argument
   into a list first now; a list gives what it gave before.
2. ``privacy.tuning.composed_tuning_epsilon(ledger, delta, trials, count)`` (the ε of ``count``
   tunings on the same users that ``compare-tuned`` and ``compare --tune-grid`` state) given an
   ``int`` subclass whose ``__int__`` says 1 (and whose ``<`` says no), storing 5: composed once
   by ``int(count)``, ε 9.03 where five tunings cost 22.48; storing 0: composed once. The
   count's stored value is read as a plain int (``operator.index``) before it is checked and
   composed: 22.48, and 0 refused.
3. ``tune toy.toml --grid server-learning-rate=0.5,1 --mean-trials 3 --rounds 3 --seed 1 --set
   checkpoint-every=2 --set secure=true``, trial-002 killed after round 3's ledger line and
   resumed by the same command (charged its redone round: 4 events where the plan has 3, the
   tuning 22.14), then that trial's ``privacy_ledger.jsonl`` deleted (it is not the released
   trial) and ``summary.json``'s ``single_run.ledger`` count set to 3, then ``compare-tuned``:
   rc 0 at 19.03, the plan's, below what the trials spent: ``tune_check`` took a trial without
   a ledger as one that released nothing. A trial that ran (its checkpoint, rows or summary
   remain) without a ledger is refused now, naming the ledger: the same ``tune`` command
   rebuilds it from the checkpoint (4 events). The tests of 3 and 4 run one small tuning in
   process (a module fixture) and edit copies of it.
4. The same with trial-002's ledger cut to its header line (or its redone round's line
   removed) instead of deleted: rc 0 at 19.03, the ledger read as what the trial released
   though its ``metrics.jsonl``, ``summary.json`` and checkpoint's accountant state 15.58 for
   it (the released trial's files are audited as ``--resume`` audits them; the others were
   not). A trial's ledger that composes to less than any ε its rows, summary or newest
   checkpoint state is refused now, naming the ledger and the file.
5. ``tune_untuned.check_untuned_seeds(iter(runs))`` (what ``compare-tuned --untuned`` checks:
   runs of one strategy and σ are seeds only when their configurations differ in the seed
   alone) of two dp-fedavg runs at σ 0.5, one of 1 round and one of 5: passed, the
   repeated-runs check had read the iterator to its end, so none was compared. Refused now,
   naming ``num-server-rounds``, as for a list.
6. ``tune_check.composed_epsilon([c1, c2], 1)`` (two tunings' checks, a count of one): one
   tuning's ε, 9.03, where publishing the two costs 13.33 (the callers pass at least the number
   of checks; a larger count adds tunings that released nothing). Refused now: the count must be
   at least the number of checks.
7. ``tune_report.tunings_lines(iter(checks))`` (``compare-tuned``'s note on how each strategy
   was tuned and what each tuning released): the table of each tuning's released
   hyperparameters was empty (its header alone), the checks read to their end by the table of
   procedures. Each tuning has its row now.
"""

from __future__ import annotations

import copy
import csv
import math
from pathlib import Path

import pytest

from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.tuning import TrialCount, tuning_epsilon
from fedprivopt.simulation import rundata_aggregate as ra
from fedprivopt.simulation.report import write_summary_csv
from fedprivopt.simulation.rundata import RunData
from fedprivopt.simulation.tune_check import TunedCheck, composed_epsilon

# -- finding 1: one-shot iterables read once ----------------------------------------------------


def _check(name: str) -> TunedCheck:
    ledger = ((SubsampledGaussianEvent.poisson(sample_rate=1 / 3, noise_multiplier=0.5), 1),)
    trials = TrialCount("truncated-negative-binomial", 1.0, shape=1.0)
    return TunedCheck(
        path=Path(name), epsilon=tuning_epsilon(ledger, 1e-4, trials),
        best_dir=Path(name) / "runs" / "trial-001", base_config=None, plan={"delta": 1e-4},
        run=None, ledgers=(ledger,), trials=trials,
    )  # fmt: skip


def test_1_composed_epsilon_of_a_generator_composes_every_tuning():
    checks = [_check("t1"), _check("t2")]
    composed = composed_epsilon(checks, 2)
    assert composed > checks[0].epsilon * 1.2  # two tunings cost more than one
    assert composed_epsilon(iter(checks), 2) == composed  # one tuning's epsilon before
    assert composed_epsilon((c for c in checks), 2) == composed
    with pytest.raises(ValueError, match="checks: empty"):
        composed_epsilon(iter(()), 1)


def _row(strategy: str, epsilon: float, accountant: str = "rdp") -> dict:
    return {
        "strategy": strategy, "noise_multiplier": 0.5, "metric": "eval_accuracy",
        "n_seeds": 1, "seeds": [0], "n_finite": 1, "epsilon": epsilon, "delta": 1e-4,
        "rounds": 2, "rounds_max": 2, "eval_accuracy_mean": 0.5, "eval_accuracy_std": math.nan,
        "eval_loss_mean": 1.0, "eval_loss_std": math.nan, "seconds_per_round": 0.1,
        "stopped_reasons": [], "n_budget": 0, "diverged": [], "accountants": [accountant],
        "relations": ["add/remove"], "private": True,
    }  # fmt: skip


def test_1_summary_csv_of_a_generator_has_its_rows(tmp_path):
    rows = [_row("dp-fedadam", 11.25), _row("dp-fedavg", 3.0)]
    path = write_summary_csv((r for r in rows), tmp_path / "summary.csv")
    with open(path, newline="", encoding="utf-8") as fh:
        lines = list(csv.DictReader(fh))
    assert [line["strategy"] for line in lines] == ["dp-fedadam", "dp-fedavg"]  # header alone


def test_1_epsilon_notes_of_a_generator_are_said():
    rows = [_row("dp-fedadam", 11.25), _row("dp-fedavg", 3.0)]
    notes = ra.unequal_epsilon_notes(rows)
    assert notes and "unequal epsilon" in notes[0]
    assert ra.unequal_epsilon_notes(iter(rows)) == notes  # [] before
    other = [*copy.deepcopy(rows), _row("dp-fedavg-adadp", 3.0, accountant="pld")]
    bases = ra.bases_notes(other)
    assert bases and "dp-fedavg-adadp σ=0.5" in bases[0]
    assert ra.bases_notes(iter(other)) == bases  # "different accountants ()" before
    assert ra.differing_bases(iter(other)) == ["accountants"]


def test_1_choose_metric_of_a_generator():
    runs = [
        RunData({"primary_metric": "eval_accuracy"}, [{"round": 1, "eval_accuracy": 0.5}],
                Path(f"r{i}"))
        for i in range(2)
    ]  # fmt: skip
    assert ra.choose_metric(iter(runs)) == "eval_accuracy"  # "none reports a task metric"
    assert ra.reference_model(iter(runs), "eval_accuracy") is None


# -- finding 2: the number of tunings composed is read as the int it stores ---------------------


class _SaysOne(int):
    """An int whose ``__int__`` (and comparisons) say one tuning where it stores more."""

    def __int__(self) -> int:
        return 1

    def __lt__(self, other) -> bool:
        return False


def test_2_composed_tuning_epsilon_of_an_int_subclass_counts_what_it_stores():
    import warnings

    import numpy as np

    from fedprivopt.privacy.tuning import composed_tuning_epsilon

    check = _check("t")
    ledger, trials = check.ledgers[0], check.trials
    five = composed_tuning_epsilon(ledger, 1e-4, trials, 5)
    assert five > composed_tuning_epsilon(ledger, 1e-4, trials, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert composed_tuning_epsilon(ledger, 1e-4, trials, _SaysOne(5)) == five  # 1 before
        with pytest.raises(ValueError, match="count must be an integer >= 1"):
            composed_tuning_epsilon(ledger, 1e-4, trials, _SaysOne(0))  # composed once before
    assert composed_tuning_epsilon(ledger, 1e-4, trials, np.int64(5)) == five
    for bad in (True, np.True_, 2.5, "3", 0, -1):
        with pytest.raises(ValueError, match="count must be an integer"):
            composed_tuning_epsilon(ledger, 1e-4, trials, bad)


# -- findings 3 and 4: a trial's ledger must bound what the trial's files state ----------------


@pytest.fixture(scope="module")
def _tuning(tmp_path_factory):
    """One small tuning (3 trials of one round), made once; each test edits its own copy."""
    from fedprivopt.cli import main

    preset = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
    tuning = tmp_path_factory.mktemp("r43_reports") / "t"
    argv = ["tune", str(preset), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "2",
            "--rounds", "1", "--seed", "1", "--out", str(tuning), "--quiet", "--set",
            "population=12", "--set", "clients-per-round=4", "--set",
            "task-params.num-users=12"]  # fmt: skip
    assert main(argv) == 0
    return tuning


def _copy_and_other_trial(tuning: Path, tmp_path: Path) -> tuple[Path, Path]:
    import json
    import shutil

    copy_ = tmp_path / "t"
    shutil.copytree(tuning, copy_)
    best = json.loads((copy_ / "summary.json").read_text())["best"]["trial"]
    return copy_, next(p for p in sorted((copy_ / "runs").iterdir()) if p.name != best)


def test_3_a_trial_without_its_ledger_is_refused(_tuning, tmp_path):
    from fedprivopt.simulation.tune_check import check_tuning

    tuning, other = _copy_and_other_trial(_tuning, tmp_path)
    assert check_tuning(tuning).epsilon > 0
    (other / "privacy_ledger.jsonl").unlink()
    with pytest.raises(ValueError, match=r"privacy_ledger\.jsonl: missing or empty, but the trial"):
        check_tuning(tuning)  # passed before, the trial counted as one that released nothing


def test_4_a_trial_ledger_cut_below_its_files_is_refused(_tuning, tmp_path):
    from fedprivopt.simulation.tune_check import check_tuning

    tuning, other = _copy_and_other_trial(_tuning, tmp_path)
    ledger = other / "privacy_ledger.jsonl"
    ledger.write_text(ledger.read_text().splitlines(keepends=True)[0])  # its header alone
    with pytest.raises(ValueError, match=r"composes to epsilon 0, but the trial's metrics"):
        check_tuning(tuning)  # passed before: the trial read as one that released nothing


# -- finding 5: the untuned runs' seeds check of a one-shot iterable -----------------------------


def test_5_untuned_runs_of_other_configurations_from_a_generator_are_refused(tmp_path):
    from types import SimpleNamespace

    from fedprivopt.simulation.config import config_to_toml, load_config
    from fedprivopt.simulation.tune_untuned import check_untuned_seeds

    preset = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
    runs = []
    for seed, rounds in ((0, 1), (1, 5)):
        path = tmp_path / f"r{seed}"
        path.mkdir()
        config = load_config(preset, {"seed": seed, "num-server-rounds": rounds})
        (path / "config.toml").write_text(config_to_toml(config))
        runs.append(SimpleNamespace(path=path, strategy="dp-fedavg", noise_multiplier=0.5))
    with pytest.raises(ValueError, match="num-server-rounds"):
        check_untuned_seeds(runs)
    with pytest.raises(ValueError, match="num-server-rounds"):
        check_untuned_seeds(iter(runs))  # passed before


def test_6_composed_epsilon_refuses_a_count_below_its_checks():
    checks = [_check("t1"), _check("t2")]
    with pytest.raises(ValueError, match=r"count must be at least the number of checks \(2\)"):
        composed_epsilon(checks, 1)  # one tuning's epsilon before
    assert composed_epsilon(checks, 3) > composed_epsilon(checks, 2)  # a larger count: as before


def test_7_tunings_lines_of_a_generator_list_every_tuning():
    import dataclasses

    from fedprivopt.simulation.tune_report import tunings_lines

    released = {"trial": "trial-001", "hyperparameters": {"server-learning-rate": 1}}
    plan = {
        "strategy": "dp-fedavg",
        "grid": {"server-learning-rate": [0.5, 1]},
        "metric": "eval_accuracy",
        "trial_count": {"distribution": "poisson", "mean": 1.0},
        "trials": [released],
    }
    checks = [dataclasses.replace(_check(name), plan=plan) for name in ("t1", "t2")]
    lines = tunings_lines(checks)
    assert sum("server-learning-rate = 1" in line for line in lines) == 2
    assert tunings_lines(iter(checks)) == lines  # no tuning's row before
