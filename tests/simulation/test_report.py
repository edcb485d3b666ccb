import csv
import json
import math

import pytest

from fedprivopt.simulation.report import (
    RunData,
    aggregate_runs,
    choose_metric,
    load_run,
    load_runs,
    plot_metric_vs_round,
    plot_privacy_utility,
    write_report,
    write_summary_csv,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(
    root,
    strategy,
    sigma,
    seed,
    *,
    final=0.6,
    final_loss=1.0,
    rounds=5,
    epsilon=2.0,
    delta=1e-5,
    metric="eval_accuracy",
    seconds=1.0,
    extra_final=None,
):
    """A run directory with a synthetic learning curve that ends at ``final``/``final_loss``."""
    path = root / "runs" / f"{strategy}__sigma{sigma:g}__seed{seed}"
    path.mkdir(parents=True)
    rows = [{"round": 0, "epsilon": 0.0, "delta": delta, "eval_loss": 3.0, metric: 0.0,
             "cohort_size": 0, "seconds": 100.0}]  # fmt: skip
    for r in range(1, rounds + 1):
        frac = r / rounds
        rows.append({
            "round": r,
            "epsilon": epsilon * frac,
            "delta": delta,
            "eval_loss": 3.0 + (final_loss - 3.0) * frac,
            metric: final * frac,
            "cohort_size": 10,
            "seconds": seconds,
            "noise_std": 0.01 * sigma,
        })  # fmt: skip
    with (path / "metrics.jsonl").open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    final_block = {metric: final, "eval_loss": final_loss, **(extra_final or {})}
    summary = {
        "strategy": strategy, "engine": "fast", "seed": seed, "noise_multiplier": sigma,
        "rounds_completed": rounds, "epsilon": epsilon, "delta": delta, "stopped_reason": "rounds",
        "final": final_block,
        "config": {"strategy": strategy, "clip-norm": 0.5, "accountant": "rdp",
                   "noise-multiplier": sigma, "num-rounds": rounds, "lr": 0.1},
    }  # fmt: skip
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def grid(tmp_path):
    """dp-fedavg and dp-fedadam at σ 0.5/1/2 (ε 50/8/2), 3 seeds each, and a fedavg baseline."""
    eps = {0.5: 50.0, 1.0: 8.0, 2.0: 2.0}
    base = {0.5: 0.7, 1.0: 0.6, 2.0: 0.45}
    paths = []
    for k, strategy in enumerate(["dp-fedavg", "dp-fedadam"]):
        for sigma, e in eps.items():
            for seed in range(3):
                acc = base[sigma] + 0.05 * k + 0.01 * (seed - 1)
                paths.append(write_run(tmp_path, strategy, sigma, seed, final=acc, epsilon=e,
                                       final_loss=2.0 - acc))  # fmt: skip
    for seed in range(3):
        paths.append(write_run(tmp_path, "fedavg", 0.0, seed, final=0.8 + 0.01 * seed,
                               epsilon=math.inf, final_loss=1.0))  # fmt: skip
    return [load_run(p) for p in paths]


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000


# --- loading ----------------------------------------------------------------------------------


def test_load_run_reads_summary_rows_and_infinite_epsilon(tmp_path):
    path = write_run(tmp_path, "fedavg", 0.0, 3, epsilon=math.inf)
    assert "Infinity" in (path / "summary.json").read_text()  # what Python's json writes
    run = load_run(path)
    assert isinstance(run, RunData)
    assert (run.strategy, run.noise_multiplier, run.seed) == ("fedavg", 0.0, 3)
    assert math.isinf(run.epsilon) and run.delta == 1e-5
    assert [r["round"] for r in run.rows] == [0, 1, 2, 3, 4, 5]
    assert run.warnings == ()


def test_load_run_skips_a_truncated_final_line(tmp_path):
    path = write_run(tmp_path, "dp-fedavg", 1.0, 0)
    with (path / "metrics.jsonl").open("a") as fh:
        fh.write('{"round": 6, "epsilon": 2.1, "eval_lo')  # killed mid-write: no newline
    run = load_run(path)
    assert [r["round"] for r in run.rows] == [0, 1, 2, 3, 4, 5]
    assert len(run.warnings) == 1 and "truncated final line 7" in run.warnings[0]


def test_load_run_accepts_a_complete_final_line_without_newline(tmp_path):
    path = write_run(tmp_path, "dp-fedavg", 1.0, 0)
    metrics = path / "metrics.jsonl"
    metrics.write_text(metrics.read_text().rstrip("\n"))
    assert len(load_run(path).rows) == 6


@pytest.mark.parametrize("terminated", [True, False])
def test_load_run_rejects_a_corrupt_line_naming_file_and_line(tmp_path, terminated):
    path = write_run(tmp_path, "dp-fedavg", 1.0, 0)
    metrics = path / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    lines[2] = lines[2][:-5]  # a corrupt middle line
    metrics.write_text("\n".join(lines) + ("\n" if terminated else ""))
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 3 is not valid JSON"):
        load_run(path)


def test_load_run_rejects_a_corrupt_terminated_final_line(tmp_path):
    path = write_run(tmp_path, "dp-fedavg", 1.0, 0)
    with (path / "metrics.jsonl").open("a") as fh:
        fh.write('{"round": 6, "eps\n')  # the newline was written, so the line is complete
    with pytest.raises(ValueError, match="line 7"):
        load_run(path)


def test_load_run_rejects_rows_without_an_int_round(tmp_path):
    path = write_run(tmp_path, "dp-fedavg", 1.0, 0)
    with (path / "metrics.jsonl").open("a") as fh:
        fh.write('{"epsilon": 1.0}\n[1, 2]\n')
    with pytest.raises(ValueError, match="line 7 is not an object with an int 'round'"):
        load_run(path)


def test_load_run_errors_name_the_missing_or_bad_file(tmp_path):
    with pytest.raises(ValueError, match=r"summary\.json: missing"):
        load_run(tmp_path / "nowhere")
    path = write_run(tmp_path, "dp-fedavg", 1.0, 0)
    (path / "metrics.jsonl").unlink()
    with pytest.raises(ValueError, match=r"metrics\.jsonl: missing"):
        load_run(path)
    path = write_run(tmp_path, "dp-fedavg", 1.0, 1)
    (path / "summary.json").write_text('{"strategy": "dp-fe')
    with pytest.raises(ValueError, match=r"summary\.json: not valid JSON"):
        load_run(path)
    (path / "summary.json").write_text('{"strategy": "dp-fedavg"}')
    with pytest.raises(ValueError, match=r"summary\.json: missing keys \['noise_multiplier'"):
        load_run(path)


def test_load_runs_finds_the_compare_layout(tmp_path):
    for seed in (1, 0):
        write_run(tmp_path, "dp-fedavg", 1.0, seed)
    (tmp_path / "runs" / "not-a-run").mkdir()
    runs = load_runs(tmp_path)
    assert [r.seed for r in runs] == [0, 1]
    assert len(load_runs(tmp_path / "runs")) == 2
    assert load_runs(runs[0].path)[0].seed == 0
    with pytest.raises(ValueError, match="no run directories"):
        load_runs(tmp_path / "runs" / "not-a-run")


# --- aggregation ------------------------------------------------------------------------------


def test_aggregate_hand_computed(tmp_path):
    finals, losses, secs = [0.5, 0.6, 0.7], [1.0, 1.2, 1.7], [1.0, 2.0, 3.0]
    runs = [
        load_run(write_run(tmp_path, "dp-fedadam", 1.0, s, final=finals[s], final_loss=losses[s],
                           seconds=secs[s], epsilon=8.0, rounds=5 - (s == 2)))
        for s in range(3)
    ]  # fmt: skip
    runs.append(load_run(write_run(tmp_path, "dp-fedadam", 2.0, 0, final=0.4, final_loss=2.5,
                                   epsilon=2.0)))  # fmt: skip
    rows = aggregate_runs(runs)
    assert [(r["strategy"], r["noise_multiplier"]) for r in rows] == [
        ("dp-fedadam", 1.0), ("dp-fedadam", 2.0)]  # fmt: skip
    r = rows[0]
    assert r["metric"] == "eval_accuracy"
    assert r["n_seeds"] == 3 and r["seeds"] == [0, 1, 2] and r["n_finite"] == 3
    assert r["eval_accuracy_mean"] == pytest.approx(0.6, rel=1e-12)
    assert r["eval_accuracy_std"] == pytest.approx(0.1, rel=1e-12)  # sample std (ddof 1)
    assert r["eval_loss_mean"] == pytest.approx(1.3, rel=1e-12)
    assert r["eval_loss_std"] == pytest.approx(math.sqrt(0.13), rel=1e-12)  # (.09+.01+.16)/2
    assert r["seconds_per_round"] == pytest.approx(2.0)  # round 0 (100 s) left out
    assert (r["epsilon"], r["delta"], r["rounds"]) == (8.0, 1e-5, 4)
    single = rows[1]
    assert single["eval_accuracy_mean"] == 0.4 and math.isnan(single["eval_accuracy_std"])
    assert math.isnan(single["eval_loss_std"])  # one value: no spread (thirtieth review)


def test_aggregate_reports_the_largest_epsilon_and_warns(tmp_path):
    runs = [load_run(write_run(tmp_path, "dp-fedavg", 1.0, s, epsilon=e))
            for s, e in enumerate([3.0, 3.5])]  # fmt: skip
    with pytest.warns(UserWarning, match="ε differs across seeds"):
        rows = aggregate_runs(runs)
    assert rows[0]["epsilon"] == 3.5


def test_metric_choice_prefers_recall_and_final_falls_back_to_rows(tmp_path):
    p = write_run(tmp_path, "dp-fedavg", 1.0, 0, metric="eval_recall_at_5", final=0.3,
                  extra_final={"eval_accuracy": 0.9})  # fmt: skip
    summary = json.loads((p / "summary.json").read_text())
    del summary["final"]["eval_recall_at_5"]  # only the rows have it now
    (p / "summary.json").write_text(json.dumps(summary))
    run = load_run(p)
    assert choose_metric([run]) == "eval_recall_at_5"
    row = aggregate_runs([run])[0]
    assert row["eval_recall_at_5_mean"] == pytest.approx(0.3)
    assert aggregate_runs([run], metric="eval_accuracy")[0]["eval_accuracy_mean"] == 0.9


def test_the_report_leads_with_the_metric_the_runs_task_names(tmp_path):
    def run(root, named):
        p = write_run(root, "dp-fedavg", 1.0, 0, metric="eval_recall_at_5", final=0.3,
                      extra_final={"eval_accuracy": 0.9})  # fmt: skip
        summary = json.loads((p / "summary.json").read_text())
        if named is not None:
            summary["primary_metric"] = named
        (p / "summary.json").write_text(json.dumps(summary))
        return load_run(p)

    single = run(tmp_path / "a", "eval_accuracy")  # a single-label task reports both
    assert choose_metric([single]) == "eval_accuracy"
    text = write_report(tmp_path / "ra", [single], title="t").read_text()
    assert "accuracy (eval)" in text and "recall@5 (eval)" not in text
    assert choose_metric([run(tmp_path / "b", "eval_recall_at_5")]) == "eval_recall_at_5"
    # written before summaries named it: the old preference
    assert choose_metric([run(tmp_path / "c", None)]) == "eval_recall_at_5"
    # a named metric no run reports falls back too
    assert choose_metric([run(tmp_path / "d", "eval_precision_at_5")]) == "eval_recall_at_5"


def test_runs_lacking_the_metric_are_skipped_with_a_warning(tmp_path):
    a = load_run(write_run(tmp_path, "dp-fedavg", 1.0, 0, metric="eval_recall_at_5"))
    b = load_run(write_run(tmp_path, "dp-fedavg", 1.0, 1, metric="eval_accuracy"))
    with pytest.warns(UserWarning, match=r"seed1: no 'eval_recall_at_5'; run skipped"):
        rows = aggregate_runs([a, b])
    assert rows[0]["n_seeds"] == 1
    with pytest.raises(ValueError, match="no run reports 'eval_precision'"):
        aggregate_runs([a, b], metric="eval_precision")


def test_nan_finals_are_left_out_and_counted(tmp_path):
    values = [(0.2, 1.0), (math.nan, math.nan), (0.4, 3.0)]
    runs = [load_run(write_run(tmp_path, "dp-fedadam", 4.0, s, final=acc, final_loss=loss))
            for s, (acc, loss) in enumerate(values)]  # fmt: skip
    with pytest.warns(UserWarning) as record:
        row = aggregate_runs(runs)[0]
    messages = [str(w.message) for w in record]
    assert len(messages) == 3 and all("seed1: " in m for m in messages)
    assert "seed1: diverged at round 1" in messages[0]  # twelfth review of issue 15, follow-up
    assert "final eval_accuracy is nan; left out of the mean" in messages[1]
    assert row["n_seeds"] == 3 and row["n_finite"] == 2
    assert row["eval_accuracy_mean"] == pytest.approx(0.3)
    assert row["eval_loss_mean"] == pytest.approx(2.0)
    with pytest.warns(UserWarning):
        row = aggregate_runs(runs[1:2])[0]
    assert math.isnan(row["eval_accuracy_mean"]) and math.isnan(row["eval_accuracy_std"])


def test_empty_inputs_are_rejected(tmp_path):
    for call in (aggregate_runs, choose_metric):
        with pytest.raises(ValueError, match="runs: "):
            call([])
    with pytest.raises(ValueError, match="runs: empty"):
        write_report(tmp_path, [], title="t")
    with pytest.raises(ValueError, match="rows: empty"):
        write_summary_csv([], tmp_path / "s.csv")


def test_summary_csv_header_and_values(tmp_path):
    rows = aggregate_runs(grid(tmp_path))
    path = write_summary_csv(rows, tmp_path / "summary.csv")
    with path.open() as fh:
        header = next(csv.reader(fh))
    assert header == ["strategy", "noise_multiplier", "seeds", "epsilon", "delta", "rounds",
                      "eval_accuracy_mean", "eval_accuracy_std", "eval_loss_mean",
                      "eval_loss_std", "seconds_per_round", "seeds_finite",
                      "seeds_diverged", "seeds_stopped_by_budget", "accountant",
                      "neighbouring_relation", "evaluations_covered", "public_users",
                      "epsilon_seeds_composed"]  # fmt: skip
    with path.open() as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 7
    by_key = {(t["strategy"], float(t["noise_multiplier"])): t for t in table}
    adam = by_key[("dp-fedadam", 1.0)]
    assert (adam["seeds"], float(adam["epsilon"]), float(adam["delta"]), adam["rounds"]) == (
        "3", 8.0, 1e-5, "5")  # fmt: skip
    assert float(adam["eval_accuracy_mean"]) == pytest.approx(0.65, rel=1e-12)
    assert float(adam["eval_accuracy_std"]) == pytest.approx(0.01, rel=1e-9)
    baseline = by_key[("fedavg", 0.0)]
    assert math.isinf(float(baseline["epsilon"]))
    assert float(baseline["eval_accuracy_mean"]) == pytest.approx(0.81)


# --- plots and report -------------------------------------------------------------------------


def test_plots_are_valid_pngs_with_an_infinite_epsilon_baseline(tmp_path):
    runs = grid(tmp_path)
    assert_png(plot_metric_vs_round(runs, tmp_path / "curve.png"))
    assert_png(plot_privacy_utility(runs, tmp_path / "pu.png"))


def test_plots_with_many_series_and_only_baselines(tmp_path):
    runs = [load_run(write_run(tmp_path, f"s{k}", sigma, 0, epsilon=10.0 / sigma))
            for k in range(4) for sigma in (0.5, 1.0, 2.0, 4.0, 8.0)]  # fmt: skip
    assert_png(plot_metric_vs_round(runs, tmp_path / "many.png"))
    assert_png(plot_privacy_utility(runs, tmp_path / "many-pu.png"))
    base = [load_run(write_run(tmp_path, "fedavg", 0.0, s, epsilon=math.inf)) for s in (7, 8)]
    assert_png(plot_privacy_utility(base, tmp_path / "base-pu.png"))


def test_write_report(tmp_path):
    runs = grid(tmp_path / "grid")
    runs.append(load_run(write_run(tmp_path / "grid", "dp-fedavg", 8.0, 0,
                                   metric="eval_recall_at_5")))  # fmt: skip
    out = tmp_path / "report"
    with pytest.warns(UserWarning, match="run skipped"):
        report = write_report(out, runs, title="Adaptive vs SGD at equal ε",
                              metric="eval_accuracy", notes="Synthetic data.")  # fmt: skip
    assert report == out / "report.md"
    for name in ("metric_vs_round.png", "privacy_utility.png"):
        assert_png(out / name)
    assert (out / "summary.csv").read_text().startswith("strategy,noise_multiplier,seeds,")
    text = report.read_text()
    assert text.startswith("# Adaptive vs SGD at equal ε\n")
    assert "21 runs in 7 groups: 3 strategies (dp-fedadam, dp-fedavg, fedavg)" in text
    header = "| strategy | σ | seeds | ε | δ | rounds | accuracy (eval) | eval loss | s/round |"
    assert header in text
    assert "| dp-fedadam | 1 | 3 | 8 | 1e-05 | 5 | 0.650 ± 0.010 | 1.350 ± 0.010 | 1 |" in text
    assert "| fedavg | 0 | 3 | ∞ (non-private) | 1e-05 | 5 | 0.810 ± 0.010 | 1 ± 0 | 1 |" in text
    assert "![accuracy (eval) by round](metric_vs_round.png)" in text
    assert "](privacy_utility.png)" in text
    assert "- δ: 1e-05" in text and "- clip-norm: 0.5" in text and "- accountant: rdp" in text
    assert "- noise-multiplier: varies" in text and "lr" not in text
    assert "## Warnings" in text and "sigma8__seed0: no 'eval_accuracy'; run skipped" in text
    assert text.rstrip().endswith("## Notes\n\nSynthetic data.")


def test_report_marks_non_finite_seeds(tmp_path):
    values = [(0.2, 1.0), (math.nan, math.inf), (0.4, 3.0)]
    runs = [load_run(write_run(tmp_path, "dp-fedadam", 4.0, s, final=acc, final_loss=loss))
            for s, (acc, loss) in enumerate(values)]  # fmt: skip
    with pytest.warns(UserWarning):
        text = write_report(tmp_path / "r", runs, title="t").read_text()
    seeds = "3 (1 non-finite; 1 diverged: seed 1 from round 1)"  # twelfth review, follow-up
    assert f"| dp-fedadam | 4 | {seeds} | 2 | 1e-05 | 5 | 0.30 ± 0.14 | 2.0 ± 1.4 |" in text
    assert "seed1: final eval_loss is inf; left out of the mean" in text


def test_report_draws_the_reference_model_when_the_runs_agree(tmp_path):
    runs = grid(tmp_path)
    ref = {"name": "tag prior (bias only)", "metrics": {"eval_accuracy": 0.31, "eval_loss": 2.5}}
    for run in runs:
        run.summary["reference"] = ref
    report = write_report(tmp_path / "out", runs, title="t").read_text()
    assert "Reference: tag prior (bias only)" in report and "0.31" in report
    assert "The dotted grey line is the tag prior (bias only)." in report
    assert report.count("up and to the left is better") == 1
    # runs that disagree on the reference get no reference line
    runs[0].summary["reference"] = {**ref, "metrics": {"eval_accuracy": 0.2}}
    report = write_report(tmp_path / "out2", runs, title="t").read_text()
    assert "Reference:" not in report and "dotted grey" not in report


def test_report_says_which_model_was_evaluated_and_how_it_started(tmp_path):
    paths = [write_run(tmp_path, "dp-fedadam", 1.0, s) for s in range(2)]
    for p in paths:
        summary = json.loads((p / "summary.json").read_text())
        summary["evaluated_model"] = "the exponential moving average (decay 0.8) of the iterates"
        summary["initial_model"] = "bias the log tag prior"
        (p / "summary.json").write_text(json.dumps(summary))
    text = write_report(tmp_path / "r", [load_run(p) for p in paths], title="t").read_text()
    assert "Evaluated: the exponential moving average (decay 0.8) of the iterates." in text
    assert "Initial model: bias the log tag prior." in text
    plain = write_run(tmp_path / "plain", "dp-fedadam", 1.0, 0)
    text = write_report(tmp_path / "p", [load_run(plain)], title="t").read_text()
    assert "Evaluated:" not in text and "Initial model:" not in text


def test_tree_runs_show_no_sampling_and_the_report_names_each_relation(tmp_path):
    """Review of issue 20, finding 5: a tree run showed 'sampling: poisson' and the report named
    no neighbouring relation, which differs between Poisson and tree rows."""
    runs = []
    for seed in range(2):
        path = write_run(tmp_path / "g", "dp-fedavg", 1.0, seed)
        summary = json.loads((path / "summary.json").read_text())
        summary["config"].update({"sampling": "poisson", "noise-mechanism": "tree"})
        (path / "summary.json").write_text(json.dumps(summary))
        runs.append(load_run(path))
    text = write_report(tmp_path / "tree", runs, title="t", metric="eval_accuracy").read_text()
    assert "- sampling: none (tree: cohorts from a seeded shuffle per restart period)" in text
    assert "sampling: poisson" not in text
    assert "differ in one user, replaced, dp-accounting's replace-special relation" in text
    assert "added or removed" not in text
    runs.append(load_run(write_run(tmp_path / "g", "dp-fedadam", 1.0, 0)))  # Poisson by default
    text = write_report(tmp_path / "both", runs, title="t", metric="eval_accuracy").read_text()
    assert "added or removed (Poisson sampling); or replaced, dp-accounting's" in text
    assert "- sampling: varies" in text
