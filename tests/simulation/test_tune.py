"""``fedprivopt tune`` and ``compare-tuned``: trials, selection, the tuning ε, the error path."""

import csv
import json
import math
from pathlib import Path

import dp_accounting as dpa
import pytest
from dp_accounting import dp_event, rdp

from fedprivopt.cli import main
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.tuning import TrialCount
from fedprivopt.simulation.ledger import RunLedger
from fedprivopt.simulation.rundata import load_run
from fedprivopt.simulation.tune import (
    dominating_plan,
    draw_trials,
    parse_grid,
    planned_ledger,
)

PRESET = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = ["--set", "population=12", "--set", "clients-per-round=4",
         "--set", "task-params.num-users=12", "--rounds", "2", "--quiet"]  # fmt: skip
GRID = ["--grid", "server-learning-rate=0.3,1.0", "--grid", "local-learning-rate=0.1,0.5"]
TNB = "truncated-negative-binomial"


def _exit_code(argv):
    """``main``'s exit code; argparse's own errors exit through ``SystemExit``."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def _tune(out, *extra):
    return ["tune", str(PRESET), "--strategy", "dp-fedavg", *GRID, "--out", str(out),
            *SMALL, *extra]  # fmt: skip


# -- the grid and the draws ---------------------------------------------------------------------


def test_parse_grid_types_values_as_set_does():
    grid = parse_grid(["server-learning-rate=0.1,1", "local-epochs=1,2", "sampling=poisson,fixed"])
    assert grid == {
        "server-learning-rate": (0.1, 1),
        "local-epochs": (1, 2),
        "sampling": ("poisson", "fixed"),
    }


@pytest.mark.parametrize(
    "texts, match",
    [
        (["server-learning-rate"], "KEY=V1"),
        (["=1,2"], "KEY=V1"),
        (["seed=1,2"], "own seed"),
        (["strategy=dp-fedavg"], "--strategy"),
        (["clip-norm=1,,2"], "empty value"),
        (["clip-norm=1,1"], "twice"),
        (["clip-norm=1", "clip-norm=2"], "twice"),
        ([], "at least one"),
    ],
)
def test_parse_grid_refuses_bad_flags(texts, match):
    with pytest.raises(ValueError, match=match):
        parse_grid(texts)


def test_draws_are_seeded_and_a_trial_does_not_depend_on_the_count():
    grid = {"a": (1, 2, 3), "b": ("x", "y")}
    one = draw_trials(grid, TrialCount(TNB, 6.0, shape=1.0), seed=5)
    assert one == draw_trials(grid, TrialCount(TNB, 6.0, shape=1.0), seed=5)
    other = draw_trials(grid, TrialCount("poisson", 30.0), seed=5)
    n = min(len(one), len(other))
    assert n >= 1 and one[:n] == other[:n]
    assert len({t.seed for t in other}) == len(other)  # every trial its own run seed
    # hyperparameters are drawn uniformly: every value of a appears over many trials
    many = draw_trials(grid, TrialCount("poisson", 300.0), seed=1)
    counts = {v: sum(t.hyperparameters["a"] == v for t in many) for v in (1, 2, 3)}
    assert all(abs(c / len(many) - 1 / 3) < 0.1 for c in counts.values())


# -- the single run's bound ---------------------------------------------------------------------


def _event(sigma, q=0.1):
    return SubsampledGaussianEvent.poisson(sample_rate=q, noise_multiplier=sigma)


def test_dominating_plan_picks_the_costliest_point():
    small, large = ((_event(0.5), 10),), ((_event(2.0), 10),)
    assert dominating_plan([({"s": 2.0}, large), ({"s": 0.5}, small)]) == ({"s": 0.5}, small)
    more = ((_event(0.5), 20),)
    assert dominating_plan([({"r": 10}, small), ({"r": 20}, more)])[1] == more
    assert dominating_plan([({"x": 1}, small), ({"x": 2}, None)]) == ({"x": 2}, None)


def test_dominating_plan_refuses_incomparable_points():
    few_noisy, many_quiet = ((_event(0.3), 1),), ((_event(3.0), 500),)
    with pytest.raises(ValueError, match="none spends at least as much"):
        dominating_plan([({"a": 1}, few_noisy), ({"a": 2}, many_quiet)])


def test_planned_ledger_stops_where_the_run_stops_at_its_target(tmp_path):
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import build_run, simulate

    overrides = {"population": 12, "clients-per-round": 4, "task-params.num-users": 12,
                 "num-server-rounds": 50, "target-epsilon": 8.0}  # fmt: skip
    config = load_config(PRESET, overrides)
    _, alg = build_run(config)
    plan = planned_ledger(config, alg)
    outcome = simulate(config, tmp_path / "run")
    assert outcome.stopped_reason == "budget"
    released = RunLedger.read(tmp_path / "run").total()
    assert released == plan
    assert sum(c for _, c in plan) == outcome.rounds_completed < 50


# -- end to end -----------------------------------------------------------------------------------


def _independent_tuning_epsilon(ledger, mean, shape, delta):
    (event, count), = ledger  # fmt: skip
    inner = dpa.PoissonSampledDpEvent(
        event.sample_rate, dpa.GaussianDpEvent(event.noise_multiplier)
    )
    acc = rdp.RdpAccountant()
    acc.compose(dp_event.RepeatAndSelectDpEvent(dpa.SelfComposedDpEvent(inner, count), mean, shape))
    return acc.get_epsilon(delta)


def test_tune_end_to_end_writes_both_epsilons_and_the_best_trial(tmp_path, capsys):
    out = tmp_path / "tune"
    argv = _tune(out, "--mean-trials", "3", "--nb-shape", "0.5", "--seed", "7")
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "for the tuning" in printed and "report:" in printed
    summary = json.loads((out / "summary.json").read_text())
    trials = summary["trials"]
    assert summary["trials_run"] == len(trials) >= 1
    assert len(list((out / "runs").iterdir())) == len(trials)
    # the reported epsilon is dp-accounting's RepeatAndSelect around the run's own ledger
    ledger = RunLedger.read(out / "runs" / trials[0]["trial"]).total()
    expected = _independent_tuning_epsilon(ledger, 3.0, 0.5, summary["delta"])
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-12)
    single = load_run(out / "runs" / trials[0]["trial"]).epsilon
    assert summary["epsilon_single_run"] == pytest.approx(single, rel=1e-12)
    assert summary["epsilon"] > summary["epsilon_single_run"]
    # the best trial has the largest final accuracy of the trials
    best = summary["best"]
    scores = {t["trial"]: t["eval_accuracy"] for t in trials}
    assert best["eval_accuracy"] == max(scores.values())
    assert best["eval_accuracy"] == load_run(out / best["run_dir"]).final_value("eval_accuracy")
    assert best["hyperparameters"]["server-learning-rate"] in (0.3, 1.0)
    for name in ("report.md", "trials.csv", "trials.png"):
        assert (out / name).is_file()
    assert "epsilon of the tuning" in (out / "report.md").read_text()
    # a second call reuses every trial and writes the same summary
    stamp = (out / "runs" / best["trial"] / "summary.json").stat().st_mtime_ns
    assert main(argv) == 0
    assert (out / "runs" / best["trial"] / "summary.json").stat().st_mtime_ns == stamp
    again = json.loads((out / "summary.json").read_text())
    assert again["epsilon"] == summary["epsilon"] and again["best"]["trial"] == best["trial"]
    # another tuning seed draws other trials: refused (exit 2), the earlier results kept
    other = _tune(out, "--mean-trials", "3", "--nb-shape", "0.5", "--seed", "8")
    capsys.readouterr()
    assert _exit_code(other) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert json.loads((out / "summary.json").read_text()) == again


def test_a_failed_trial_counts_and_loses(tmp_path, monkeypatch):
    import fedprivopt.simulation.cells as cells

    real = cells.run_cell

    def flaky(plan, progress=False):
        if plan.cell.label == "trial-001":
            raise RuntimeError("injected failure")
        return real(plan, progress=progress)

    monkeypatch.setattr(cells, "run_cell", flaky)
    out = tmp_path / "tune"
    count = TrialCount("poisson", 3.0)
    seed = next(s for s in range(100) if len(draw_trials({"x": (1,)}, count, s)) >= 2)
    argv = _tune(out, "--mean-trials", "3", "--distribution", "poisson", "--seed", str(seed))
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    first = summary["trials"][0]
    assert first["status"] == "failed" and "injected failure" in first["error"]
    assert summary["trials_run"] >= 2
    assert summary["best"] is None or summary["best"]["trial"] != "trial-001"
    with open(out / "trials.csv") as fh:
        assert next(csv.DictReader(fh))["status"] == "failed"


def test_poisson_can_draw_no_trial(tmp_path):
    seed = next(
        s for s in range(100) if not draw_trials({"x": (1,)}, TrialCount("poisson", 1.0), s)
    )
    out = tmp_path / "tune"
    argv = _tune(out, "--mean-trials", "1", "--distribution", "poisson", "--seed", str(seed))
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trials_run"] == 0 and summary["best"] is None
    assert math.isfinite(summary["epsilon"]) and summary["epsilon"] > 0


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--mean-trials", "0.5"], "--mean-trials"),
        (["--mean-trials", "3", "--nb-shape", "-1"], "--nb-shape"),
        (["--mean-trials", "3", "--distribution", "poisson", "--nb-shape", "1"], "--nb-shape"),
        (["--mean-trials", "3", "--distribution", "binomial"], "--distribution"),
        (["--mean-trials", "3", "--grid", "seed=1,2"], "--grid"),
        (["--mean-trials", "3", "--grid", "clip-norm=-1,1"], "clip-norm"),
        (["--mean-trials", "3", "--set", "server-learning-rate=2"], "--grid"),
        (["--mean-trials", "3", "--grid", "noise-multiplier=0.3,3", "--grid",
          "num-server-rounds=1,40"], "--grid"),
    ],
)  # fmt: skip
def test_bad_flags_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, extra, flag):
    out = tmp_path / "tune"
    assert _exit_code(_tune(out, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and "Traceback" not in err
    assert not out.exists()


def test_an_out_with_foreign_files_is_refused_untouched(tmp_path, capsys):
    out = tmp_path / "tune"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(_tune(out, "--mean-trials", "2")) == 2
    err = capsys.readouterr().err
    assert "notes.txt" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"


def test_compare_tuned_reports_the_tuning_epsilon(tmp_path, capsys):
    tuned = tmp_path / "tune"
    assert main(_tune(tuned, "--mean-trials", "2", "--seed", "1")) == 0
    untuned = tmp_path / "plain"
    assert main(["simulate", str(PRESET), "--out", str(untuned), *SMALL]) == 0
    report = tmp_path / "report"
    capsys.readouterr()
    assert main(["compare-tuned", str(tuned), "--untuned", str(untuned),
                 "--out", str(report)]) == 0  # fmt: skip
    summary = json.loads((tuned / "summary.json").read_text())
    with open(report / "summary.csv") as fh:
        rows = {r["strategy"]: r for r in csv.DictReader(fh)}
    assert float(rows["dp-fedavg (tuned)"]["epsilon"]) == pytest.approx(summary["epsilon"])
    assert float(rows["dp-fedavg"]["epsilon"]) == pytest.approx(load_run(untuned).epsilon)
    assert float(rows["dp-fedavg (tuned)"]["epsilon"]) > float(rows["dp-fedavg"]["epsilon"])
    assert "whole tuning procedure" in (report / "report.md").read_text()
    # a summary edited to state a lower epsilon does not lower the report's
    summary["epsilon"] = 0.01
    (tuned / "summary.json").write_text(json.dumps(summary))
    assert main(["compare-tuned", str(tuned), "--out", str(report)]) == 0
    with open(report / "summary.csv") as fh:
        row = next(csv.DictReader(fh))
    assert float(row["epsilon"]) > 1.0


def test_a_pld_preset_with_a_target_gets_an_rdp_tuning_epsilon_and_both_numbers(tmp_path):
    from fedprivopt.privacy.accounting import compose_epsilon

    out = tmp_path / "tune"
    argv = ["tune", str(PRESET), "--strategy", "dp-fedavg", "--grid", "server-learning-rate=0.5,1",
            "--out", str(out), "--mean-trials", "1", *SMALL[:6], "--rounds", "40", "--quiet",
            "--set", "accountant=pld", "--set", "target-epsilon=3",
            "--set", "noise-multiplier=2"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    single = summary["single_run"]
    assert summary["accountant"] == "rdp" and single["accountant"] == "pld"
    assert single["target_epsilon"] == 3.0
    ledger = RunLedger.read(out / "runs" / "trial-001").total()
    assert ledger == tuple(
        (SubsampledGaussianEvent.from_dict(x["event"]), x["count"]) for x in single["ledger"]
    )
    (_, rounds), = ledger  # fmt: skip
    assert 1 < rounds < 40  # the target stopped the single run
    assert single["epsilon"] == pytest.approx(compose_epsilon(ledger, 1e-4, accountant="pld"))
    assert single["epsilon"] <= 3.0 < summary["epsilon_single_run"] < summary["epsilon"]
    assert summary["epsilon_single_run"] == pytest.approx(compose_epsilon(ledger, 1e-4))
    assert "pld" in summary["privacy"] and "target epsilon 3" in summary["privacy"]


def test_a_tree_aggregation_tuning_repeats_the_runs_tree_events(tmp_path):
    """Tree noise: one event per restart period, REPLACE_SPECIAL, wrapped in RepeatAndSelect."""
    out = tmp_path / "tune"
    argv = ["tune", str(PRESET), "--strategy", "dp-fedavg", "--grid", "server-learning-rate=0.5,1",
            "--out", str(out), "--mean-trials", "2", *SMALL[:6], "--rounds", "5", "--quiet",
            "--set", "noise-mechanism=tree", "--seed", "1"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    (event, periods), = RunLedger.read(out / "runs" / "trial-001").total()  # fmt: skip
    assert periods == 2  # rounds 1-3 and 4-5 with the default restart of 12 // 4 rounds
    assert event.to_dict()["tree_steps"] == 3
    tree = dpa.SingleEpochTreeAggregationDpEvent(0.5, 3)
    acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_SPECIAL)
    acc.compose(dp_event.RepeatAndSelectDpEvent(dpa.SelfComposedDpEvent(tree, 2), 2.0, 1.0))
    assert summary["epsilon"] == pytest.approx(acc.get_epsilon(1e-4), rel=1e-12)
    assert summary["epsilon_single_run"] == pytest.approx(
        load_run(out / "runs" / "trial-001").epsilon
    )


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--metric", "eval_recall_at_5"], "--metric"),  # seventh review F7: toy has no recall
        (["--nb-shape", "1000000", "--mean-trials", "10000"], "--nb-shape"),  # F6: an overflow
    ],
)
def test_seventh_review_flags_exit_2_before_any_trial(tmp_path, capsys, extra, flag):
    out = tmp_path / "tune"
    argv = _tune(out, *extra)
    if "--mean-trials" not in extra:
        argv += ["--mean-trials", "2"]
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and "Traceback" not in err
    assert not out.exists()


def test_a_trial_that_released_less_gets_no_note():
    """Seventh review minor 2: a trial at a noisier grid point was noted as releasing more."""
    from fedprivopt.simulation.tune import PrivacyPlan, check_released

    plan = PrivacyPlan(((_event(0.5), 2),), {"noise-multiplier": 0.5}, 1e-4, "rdp")
    same, notes = check_released(plan, {"trial-001": ((_event(50.0), 2),)})
    # orders where dp-accounting fails for one ledger only are left out (eighth review F1)
    assert same.ledger == plan.ledger and same.point == plan.point and notes == []
    more = ((_event(0.5), 3),)  # a resumed secure-mode run charged a redone round
    raised, notes = check_released(plan, {"trial-001": ((_event(50.0), 2),), "trial-002": more})
    assert raised.ledger == more and len(notes) == 1 and notes[0].startswith("trial-002 released")


def test_a_grid_where_dp_accounting_fails_at_an_order_is_tuned(tmp_path, capsys):
    """Eighth review F1: σ = 1.0 is inf at RDP order 1.7 (dp-accounting fails), σ = 0.5 is not;
    the grid was refused as having no dominating point."""
    T16 = ["--set", "population=16", "--set", "clients-per-round=4",
           "--set", "task-params.num-users=16", "--quiet"]  # fmt: skip
    out = tmp_path / "t"
    assert main(["tune", str(PRESET), "--strategy", "dp-fedavg", "--grid",
                 "noise-multiplier=0.5,1.0", "--mean-trials", "2", "--rounds", "3", "--out",
                 str(out), "--seed", "1", *T16]) == 0  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["single_run"]["grid_point"] == {"noise-multiplier": 0.5}
    assert math.isfinite(summary["epsilon"]) and summary["epsilon"] > summary["epsilon_single_run"]
    assert main(["compare-tuned", str(out), "--out", str(tmp_path / "r")]) == 0
    with open(tmp_path / "r" / "summary.csv") as fh:
        (row,) = list(csv.DictReader(fh))
    assert float(row["epsilon"]) == pytest.approx(summary["epsilon"], rel=1e-12)


def test_trials_csv_has_one_eval_loss_column_when_tuned_on_it(tmp_path):
    """Eighth review m4: ``--metric eval_loss`` wrote two eval_loss columns."""
    out = tmp_path / "tune"
    assert _exit_code(_tune(out, "--metric", "eval_loss", "--mean-trials", "1")) == 0
    with open(out / "trials.csv") as fh:
        header = next(csv.reader(fh))
    assert header.count("eval_loss") == 1


def test_max_noise_step_is_no_key_to_tune_for_non_private_fedavg(tmp_path, capsys):
    """Without noise the rate is never lowered: its trials would differ in their seeds only."""
    argv = ["tune", str(PRESET), "--strategy", "fedavg", "--grid", "max-noise-step=0.5,1",
            "--mean-trials", "2", "--rounds", "1", "--out", str(tmp_path / "t")]  # fmt: skip
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert "'max-noise-step' changes nothing in a run of fedavg" in err
    assert not (tmp_path / "t" / "runs").exists()
