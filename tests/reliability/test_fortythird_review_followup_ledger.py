"""Issue 15, follow-up of the forty-third hostile review (ledger: today's reports and ledger fixes).

1. The forty-third review's reports 3 refuses a tuning's trial whose ``privacy_ledger.jsonl``
   was deleted while its checkpoint, rows or summary remain (with ``summary.json``'s
   ``single_run`` lowered to the plan, ``compare-tuned`` said 19.03 where a resumed secure
   trial made the tuning spend 22.14). Two close variants passed: the trial's ledger deleted
   together with its ``config.toml`` (``check_trial`` took a trial without both as one that
   failed before its run started, before looking at what remains), and the trial's whole
   directory removed (``rm -r T/runs/trial-002``; the tuning's ``summary.json`` still states
   that trial finished with its rounds completed). Before: ``check_tuning`` passed (the toy
   tuning below at 14.68, the trial counted as one that released nothing). Now both are refused,
   naming the trial's directory and what says it ran (its remaining files, or the tuning's
   ``summary.json`` entry: ``tune_trials.check_trial`` and ``_stated_run``); a trial that
   failed before its run started (nothing left, nothing stated) still counts as before.
2. The forty-third review's reports 4 refuses a trial's ledger that composes to less than the
   trial's ``metrics.jsonl``, ``summary.json`` or newest checkpoint states. The same ledger cut
   to its header with those three removed (the trial's ``config.toml`` kept) passed: nothing
   left in the trial's directory stated an ε, though the tuning's ``summary.json`` entry of
   that trial states its ε (9.998 in a 2-round pld tuning of 12 users, the ledger's 0). Now
   that entry's ε bounds the ledger too (``tune_trials._check_covered``): refused, naming it.
3. The forty-third review's reports 2 reads ``composed_tuning_epsilon``'s ``count`` of an int
   subclass by its stored value; the ledger's own counts were still read through the
   subclass's ``__int__`` (``core.checks.check_int`` in ``merge_ledger``): a ledger
   ``((event, c),)`` with ``c`` an int subclass storing 5 whose ``__int__`` says 1 composed one
   event: ``tuning_epsilon`` 9.03 where 22.48, ``composed_tuning_epsilon(..., 2)`` 13.33 where
   34.56, ``compose_epsilon`` 7.99 where 17.27 (q 1/3, σ 0.5, δ 1e-4). ``merge_ledger`` reads
   the stored value (``operator.index``) first: each composes 5 events.
4. The forty-third review's ledger 1 charges an earlier version's ledger's events beyond the
   checkpoint in ``load_run``. With no readable checkpoint (a secure 2-round toy run of 12
   users, its ledger an earlier version's counting 3 events, its checkpoints deleted), the run
   was reported at its rows' 11.25 with the note ``no privacy_ledger.jsonl and no readable
   checkpoint``: a ledger there counts 3 events (13.61 when charged from a checkpoint), and the
   note denied it. Now the note names the earlier version's ledger and its count and says the
   epsilon may be less than those events cost (``rundata_epsilon.accounted_epsilon``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def _tuning(tmp_path_factory):
    """One small tuning (1 round, 12 users), made once; each test edits its own copy."""
    from fedprivopt.cli import main

    preset = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
    tuning = tmp_path_factory.mktemp("r43_followup_ledger") / "t"
    argv = ["tune", str(preset), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "2",
            "--rounds", "1", "--seed", "1", "--out", str(tuning), "--quiet", "--set",
            "population=12", "--set", "clients-per-round=4", "--set",
            "task-params.num-users=12"]  # fmt: skip
    assert main(argv) == 0
    return tuning


def _copy_and_other_trial(tuning: Path, tmp_path: Path) -> tuple[Path, Path]:
    copy_ = tmp_path / "t"
    shutil.copytree(tuning, copy_)
    best = json.loads((copy_ / "summary.json").read_text())["best"]["trial"]
    return copy_, next(p for p in sorted((copy_ / "runs").iterdir()) if p.name != best)


def test_1_a_trial_without_its_ledger_and_config_is_refused(_tuning, tmp_path):
    from fedprivopt.simulation.tune_check import check_tuning

    tuning, other = _copy_and_other_trial(_tuning, tmp_path)
    assert check_tuning(tuning).epsilon > 0
    (other / "privacy_ledger.jsonl").unlink()
    (other / "config.toml").unlink()
    said = r"config\.toml and privacy_ledger\.jsonl are missing, but the trial ran \(its checkpoint"
    with pytest.raises(ValueError, match=said):
        check_tuning(tuning)  # passed before


def test_1_a_removed_trial_directory_that_ran_is_refused(_tuning, tmp_path):
    from fedprivopt.simulation.tune_check import check_tuning

    tuning, other = _copy_and_other_trial(_tuning, tmp_path)
    shutil.rmtree(other)
    said = rf"{other.name}: it is missing, but the trial ran \(summary\.json's '{other.name}'"
    with pytest.raises(ValueError, match=said):
        check_tuning(tuning)  # passed before
    # a trial the tuning's summary does not state as run (it failed before its run started)
    summary = json.loads((tuning / "summary.json").read_text())
    for entry in summary["trials"]:
        if entry["trial"] == other.name:
            entry.update(status="failed", rounds_completed=0)
    (tuning / "summary.json").write_text(json.dumps(summary))
    assert check_tuning(tuning).epsilon > 0


def test_2_a_trial_ledger_cut_with_its_own_files_removed_is_refused(_tuning, tmp_path):
    from fedprivopt.simulation.tune_check import check_tuning

    tuning, other = _copy_and_other_trial(_tuning, tmp_path)
    ledger = other / "privacy_ledger.jsonl"
    ledger.write_text(ledger.read_text().splitlines(keepends=True)[0])  # its header alone
    for name in ("metrics.jsonl", "summary.json", "checkpoint.pt", "checkpoint.prev.pt"):
        (other / name).unlink(missing_ok=True)
    said = r"composes to epsilon 0, but the trial's entry in the tuning's summary\.json states"
    with pytest.raises(ValueError, match=said):
        check_tuning(tuning)  # passed before: nothing left stated an epsilon for the trial


# -- finding 3: a ledger's counts of an int subclass read through its own __int__ ---------------


class _SaysOne(int):
    """An int storing its count whose own ``__int__`` says 1 (as the reports 2 test's)."""

    def __int__(self) -> int:
        return 1


def test_3_ledger_counts_of_an_int_subclass_compose_what_they_store():
    from fedprivopt.privacy.accounting import compose_epsilon
    from fedprivopt.privacy.accounting_state import merge_ledger
    from fedprivopt.privacy.events import SubsampledGaussianEvent
    from fedprivopt.privacy.tuning import TrialCount, composed_tuning_epsilon, tuning_epsilon

    event = SubsampledGaussianEvent.poisson(sample_rate=1 / 3, noise_multiplier=0.5)
    five, liar = ((event, 5),), ((event, _SaysOne(5)),)
    assert merge_ledger(liar) == five  # ((event, 1),) before
    assert type(merge_ledger(liar)[0][1]) is int
    trials = TrialCount("truncated-negative-binomial", 1.0, shape=1.0)
    assert tuning_epsilon(liar, 1e-4, trials) == tuning_epsilon(five, 1e-4, trials)  # 9.03: 22.48
    assert composed_tuning_epsilon(liar, 1e-4, trials, 2) == composed_tuning_epsilon(
        five, 1e-4, trials, 2
    )  # 13.33 where 34.56 was spent
    assert compose_epsilon(liar, 1e-4) == compose_epsilon(five, 1e-4)  # 7.99 where 17.27


# -- finding 4: an earlier version's ledger beside no readable checkpoint -------------------------


def test_4_an_old_ledger_without_a_checkpoint_is_named_by_load_run(tmp_path):
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import simulate
    from fedprivopt.simulation.rundata import load_run

    preset = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
    run = tmp_path / "run"
    config = load_config(preset, {"num-server-rounds": 2, "secure": True, "population": 12,
                                  "task-params.num-users": 12, "clients-per-round": 4})  # fmt: skip
    simulate(config, run)
    lines = [{"round": r, "events": r} for r in range(4)]  # an earlier version's counts: 3
    (run / "privacy_ledger.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        (run / name).unlink(missing_ok=True)
    notes = load_run(run).warnings
    assert any("earlier version's (event counts only: 3 events by round 3)" in n for n in notes)
    assert not any("no privacy_ledger.jsonl" in note for note in notes)  # said so before
