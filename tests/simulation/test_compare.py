import csv
import os
from pathlib import Path

import pytest

from fedprivopt.cli import main

PRESET = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = [
    "--set",
    "population=12",
    "--set",
    "clients-per-round=4",
    "--set",
    "task-params.num-users=12",
]


def test_compare_runs_the_grid_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = [
        "compare",
        str(PRESET),
        "--strategies",
        "dp-fedavg,dp-fedadam,fedavg",
        "--noise-multipliers",
        "0.5,2",
        "--seeds",
        "2",
        "--rounds",
        "3",
        "--out",
        str(out),
        "--quiet",
        *SMALL,
    ]
    assert main(argv) == 0
    assert f"report: {out / 'report.md'}" in capsys.readouterr().out
    with open(out / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    cells = {(r["strategy"], float(r["noise_multiplier"])) for r in rows}
    assert cells == {
        ("dp-fedavg", 0.5),
        ("dp-fedavg", 2.0),
        ("dp-fedadam", 0.5),
        ("dp-fedadam", 2.0),
        ("fedavg", 0.0),
    }
    assert all(r["seeds"] == "2" for r in rows)
    eps = {(r["strategy"], float(r["noise_multiplier"])): float(r["epsilon"]) for r in rows}
    assert eps[("dp-fedavg", 2.0)] < eps[("dp-fedavg", 0.5)] == eps[("dp-fedadam", 0.5)]
    assert eps[("fedavg", 0.0)] == float("inf")
    for name in ("metric_vs_round.png", "privacy_utility.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "dp-fedadam" in report and "privacy_utility.png" in report
    assert len(list((out / "runs").iterdir())) == 2 * 2 * 2 + 2
    # a second call reuses the finished runs
    stamp = (out / "runs" / "dp-fedavg__sigma0.5__seed0" / "summary.json").stat().st_mtime_ns
    assert main(argv) == 0
    assert (
        out / "runs" / "dp-fedavg__sigma0.5__seed0" / "summary.json"
    ).stat().st_mtime_ns == stamp


def test_compare_rejects_unknown_strategies(tmp_path, capsys):
    code = main(
        [
            "compare",
            str(PRESET),
            "--strategies",
            "dp-fedavg,sgd",
            "--out",
            str(tmp_path / "x"),
            "--quiet",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--strategies" in err and "'sgd'" in err
    assert not (tmp_path / "x").exists()


def test_compare_without_strategies_runs_every_registered_strategy(tmp_path):
    from fedprivopt.strategies import STRATEGIES

    out = tmp_path / "all"
    argv = ["compare", str(PRESET), "--rounds", "1", "--out", str(out), "--quiet", *SMALL]
    assert main(argv) == 0
    with open(out / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["strategy"] for r in rows) == sorted(STRATEGIES)


def _compare(out, *extra, quiet=True):
    # a flag is given once (tenth review of issue 15): --strategies of extra replaces the default;
    # quiet=False keeps the cells' "[i/n] cell (reuse)" lines, which --quiet omits (since the
    # twenty-eighth review)
    strategies = [] if "--strategies" in extra else ["--strategies", "dp-fedavg"]
    argv = ["compare", str(PRESET), *strategies, "--out", str(out), *(["--quiet"] * quiet)]
    return main([*argv, *SMALL, *extra])


def _summary_rows(out):
    with open(out / "summary.csv") as fh:
        return list(csv.DictReader(fh))


def _one_error_line(capsys):
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("[")]  # progress lines
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


CELL = "dp-fedavg__sigma0.5__seed0"


def _one_cell(tmp_path, rounds: int = 2):
    """A compare of one dp-fedavg cell into ``tmp_path/cmp``: (its --out, the cell's run)."""
    out = tmp_path / "cmp"
    assert _compare(out, "--rounds", str(rounds)) == 0
    return out, out / "runs" / CELL


def test_compare_refuses_a_cell_whose_run_has_another_config(tmp_path, capsys):
    out = tmp_path / "cmp"
    cell = out / "runs" / "dp-fedavg__sigma0.5__seed0"
    assert _compare(out, "--rounds", "2") == 0
    rows = _summary_rows(out)
    assert rows[0]["rounds"] == "2"
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in [*cell.iterdir(), out / "summary.csv"]}
    for extra, key in (
        (["--rounds", "4"], "num-server-rounds"),
        (["--rounds", "2", "--set", "clip-norm=0.1"], "clip-norm"),
        (["--rounds", "2", "--set", "task-params.heterogeneity=0.9"], "task-params.heterogeneity"),
    ):
        assert _compare(out, *extra) == 2
        line = _one_error_line(capsys)
        assert "dp-fedavg__sigma0.5__seed0" in line and key in line and "--overwrite" in line
        after = {p.name: p.read_bytes() for p in [*cell.iterdir(), out / "summary.csv"]}
        assert after == before  # nothing written, nothing lost
    # --overwrite reruns the stale cell, and the report says so
    assert _compare(out, "--rounds", "4", "--overwrite") == 0
    assert _summary_rows(out)[0]["rounds"] == "4"
    report = (out / "report.md").read_text()
    assert "rerun" in report and "num-server-rounds" in report
    # the same call again reuses it, and the report says that
    stamp = (cell / "summary.json").stat().st_mtime_ns
    assert _compare(out, "--rounds", "4") == 0
    assert (cell / "summary.json").stat().st_mtime_ns == stamp
    report = (out / "report.md").read_text()
    assert "dp-fedavg__sigma0.5__seed0 | reused" in report


def test_compare_resumes_only_a_cell_with_the_same_config(tmp_path, capsys):
    out = tmp_path / "cmp"
    cell = out / "runs" / "dp-fedavg__sigma0.5__seed0"
    assert _compare(out, "--rounds", "2") == 0
    (cell / "summary.json").unlink()  # as if killed after its last checkpoint
    capsys.readouterr()
    assert _compare(out, "--rounds", "3") == 2
    line = _one_error_line(capsys)
    assert "dp-fedavg__sigma0.5__seed0" in line and "num-server-rounds" in line
    assert not (cell / "summary.json").exists()
    assert _compare(out, "--rounds", "2") == 0  # the same config: resumed
    assert _summary_rows(out)[0]["rounds"] == "2"
    assert "dp-fedavg__sigma0.5__seed0 | resumed" in (out / "report.md").read_text()


def test_compare_rejects_repeated_strategies_and_noise_multipliers(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert _compare(out, "--strategies", "dp-fedavg,fedavg,dp-fedavg") == 2
    line = _one_error_line(capsys)
    assert "--strategies" in line and "'dp-fedavg'" in line and "twice" in line
    assert _compare(out, "--noise-multipliers", "0.5,1,0.50") == 2
    line = _one_error_line(capsys)
    assert "--noise-multipliers" in line and "0.5" in line
    assert _compare(out, "--noise-multipliers", "0.1234567,0.1234568") == 2
    assert "--noise-multipliers" in _one_error_line(capsys)
    assert not out.exists()


def test_a_stored_config_equals_the_config_it_was_written_from(tmp_path):
    """Reuse depends on it: every preset x strategy round-trips through config.toml unchanged."""
    from fedprivopt.simulation.cell_plans import first_difference
    from fedprivopt.simulation.config import config_to_toml, load_config
    from fedprivopt.strategies import STRATEGIES

    stored = tmp_path / "config.toml"
    checked = 0
    for preset in sorted(PRESET.parent.glob("*.toml")):
        for strategy in STRATEGIES:
            for extra in ({}, {"task-params.extra-list": [1, 2.5], "target-epsilon": 3.0}):
                try:
                    config = load_config(preset, {"strategy": strategy, **extra})
                except ValueError:
                    continue
                stored.write_text(config_to_toml(config))
                assert first_difference(load_config(stored), config) is None, (preset, strategy)
                checked += 1
    assert checked >= 2 * len(STRATEGIES)
    config = load_config(PRESET, {"task-params.heterogeneity": float("nan")})
    assert first_difference(config, config) is None  # NaN equals NaN here
    other = load_config(PRESET, {"clip-norm": 0.5, "task-params.dim": 3})
    assert first_difference(config, other) == ("clip-norm", 1.0, 0.5)
    assert first_difference(other, config) == ("clip-norm", 0.5, 1.0)


def test_the_report_leads_with_the_tasks_own_metric(tmp_path):
    # issue 16: the AdaDPS preset (single-label) reports accuracy, the mini preset recall@5
    mini = str(PRESET.with_name("stackoverflow-tp-mini.toml"))
    for single, shown in (("true", "accuracy (eval)"), ("false", "recall@5 (eval)")):
        out = tmp_path / single
        argv = ["compare", mini, "--strategies", "dp-fedavg", "--rounds", "1", "--quiet"]
        assert main([*argv, "--out", str(out), "--set", f"task-params.single-label={single}"]) == 0
        header = next(x for x in (out / "report.md").read_text().splitlines() if "| ε |" in x)
        assert shown in header and header.count("(eval)") == 1, header


def test_compare_builds_each_task_once(tmp_path, monkeypatch):
    # issue 16: the task (its data files) was built once per cell to validate, then again to run
    from fedprivopt.simulation import run

    calls = []
    original = run.build_task
    monkeypatch.setattr(run, "build_task", lambda *a, **k: calls.append(a) or original(*a, **k))
    argv = ["compare", str(PRESET), "--strategies", "dp-fedavg,fedavg", "--seeds", "2"]
    assert main([*argv, "--rounds", "1", "--out", str(tmp_path / "c"), "--quiet", *SMALL]) == 0
    assert calls == [("toy",)]
    calls.clear()
    sim = ["simulate", str(PRESET), "--rounds", "1", "--out", str(tmp_path / "s"), "--quiet"]
    assert main([*sim, *SMALL]) == 0 and calls == [("toy",)]


def test_a_reused_run_is_reported_with_its_ledgers_epsilon_and_its_rows(tmp_path, capsys):
    # found by a later review: editing summary.json's epsilon (or final accuracy) of a finished
    # cell put the forged value in the next report, which reused the cell
    import json

    out = tmp_path / "cmp"
    argv = ["compare", str(PRESET), "--strategies", "dp-fedavg", "--rounds", "2", "--quiet"]
    assert main([*argv, "--out", str(out), *SMALL]) == 0
    rows = list(csv.DictReader((out / "summary.csv").open()))
    run = next((out / "runs").iterdir())
    summary = json.loads((run / "summary.json").read_text())
    summary["epsilon"], summary["final"]["eval_accuracy"] = 0.001, 0.999
    (run / "summary.json").write_text(json.dumps(summary))
    assert main([*argv, "--out", str(out), *SMALL]) == 0
    again = list(csv.DictReader((out / "summary.csv").open()))
    assert again == rows and float(again[0]["epsilon"]) > 1  # the ledger's, not 0.001
    assert "state different epsilons" in (out / "report.md").read_text()  # noted


def test_an_edited_ledger_or_summary_never_lowers_a_reports_epsilon(tmp_path, capsys):
    # found by a third review: only the ledger edited (sigma 0.5 -> 50) gave epsilon 0.0235 in
    # summary.csv; a deleted ledger and an edited summary gave 0.001; a non-private run's ledger
    # flipped to private gave 0.0. A report of the files as they are shows the largest epsilon
    # any file states; compare itself now refuses such a cell (a fourth review: the checks of
    # --resume), and rebuilds a deleted ledger from the checkpoint as --resume does.
    import json

    from fedprivopt.simulation.report import load_run

    out = tmp_path / "cmp"
    argv = ["compare", str(PRESET), "--strategies", "dp-fedavg,fedavg", "--rounds", "2"]
    argv += ["--quiet", "--out", str(out), *SMALL]
    assert main(argv) == 0
    rows = {r["strategy"]: r for r in csv.DictReader((out / "summary.csv").open())}
    spent = float(rows["dp-fedavg"]["epsilon"])
    private = next((out / "runs").glob("dp-fedavg*"))
    ledger = private / "privacy_ledger.jsonl"
    ledger.write_text(
        ledger.read_text().replace('"noise_multiplier": 0.5', '"noise_multiplier": 50.0')
    )
    baseline = next((out / "runs").glob("fedavg*")) / "privacy_ledger.jsonl"
    kept = baseline.read_text()
    baseline.write_text(kept.replace('"private": false', '"private": true', 1))
    assert load_run(private).epsilon == spent
    assert load_run(baseline.parent).epsilon == float("inf")
    capsys.readouterr()
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert private.name in line and "privacy_ledger.jsonl" in line and "--overwrite" in line
    baseline.write_text(kept)
    ledger.unlink()
    summary = json.loads((private / "summary.json").read_text())
    summary["epsilon"] = 0.001
    (private / "summary.json").write_text(json.dumps(summary))
    assert load_run(private).epsilon == spent  # the metrics rows state it
    assert main(argv) == 0  # the ledger rebuilt from the checkpoint, as --resume does
    third = {r["strategy"]: r for r in csv.DictReader((out / "summary.csv").open())}
    assert float(third["dp-fedavg"]["epsilon"]) == pytest.approx(spent, rel=1e-9)
    assert "resumed" in (out / "report.md").read_text()


def test_a_second_compare_on_the_same_out_is_refused_whatever_its_grid(tmp_path, capsys):
    # found by a later review: two compare calls with different grids both wrote one --out
    from fedprivopt.simulation.cells import lock_compare_dir

    out = tmp_path / "cmp"
    argv = ["compare", str(PRESET), "--strategies", "fedavg", "--rounds", "1", "--quiet"]
    assert main([*argv, "--out", str(out), *SMALL]) == 0
    capsys.readouterr()
    with lock_compare_dir(out):  # another compare holds it
        assert main([*argv, "--out", str(out), *SMALL]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "comparison" in err[0] and str(os.getpid()) in err[0], err
    assert main([*argv, "--out", str(out), *SMALL]) == 0  # released: reused


def _edit(path, old, new):
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


def _files(*dirs):
    return {p: p.read_bytes() for d in dirs for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_cell_is_used_again_only_after_the_checks_of_resume(tmp_path, capsys):
    # found by a fourth review: compare checked only a cell's config.toml, so a config.toml
    # edited to match the call reused a 2-round clip-1.0 run as a 4-round clip-0.1 one (rc 0,
    # epsilon 10.28), and the sigma=1 cell's ledger, checkpoints and metrics copied over the
    # sigma=0.5 cell were reported as sigma 0.5 with sigma 1's epsilon; simulate --resume on
    # the same directories refused both
    out, cell = _one_cell(tmp_path)
    _edit(cell / "config.toml", "num-server-rounds = 2\n", "num-server-rounds = 4\n")
    _edit(cell / "config.toml", "clip-norm = 1.0\n", "clip-norm = 0.1\n")
    capsys.readouterr()
    before = _files(out)
    assert _compare(out, "--rounds", "4", "--set", "clip-norm=0.1") == 2
    line = _one_error_line(capsys)
    assert cell.name in line and "clip-norm" in line and "--overwrite" in line, line
    assert _files(out) == before  # nothing written, nothing lost
    assert main(["simulate", "--resume", str(cell), "--quiet"]) == 2  # the same check
    assert "clip-norm" in capsys.readouterr().err
    assert _compare(out, "--rounds", "4", "--set", "clip-norm=0.1", "--overwrite") == 0
    assert _summary_rows(out)[0]["rounds"] == "4"
    assert (
        "rerun (--overwrite): the earlier run failed the checks of --resume"
        in (out / "report.md").read_text()
    )
    # the swap: another cell's files under this cell's config.toml and (edited) summary
    out = tmp_path / "swap"
    grid = ("--rounds", "2", "--noise-multipliers", "0.5,1")
    assert _compare(out, *grid) == 0
    mine, other = (
        out / "runs" / "dp-fedavg__sigma0.5__seed0",
        out / "runs" / "dp-fedavg__sigma1__seed0",
    )
    for name in ("privacy_ledger.jsonl", "checkpoint.pt", "checkpoint.prev.pt", "metrics.jsonl"):
        if (other / name).exists():
            (mine / name).write_bytes((other / name).read_bytes())
    summary = (
        (other / "summary.json")
        .read_text()
        .replace('"noise_multiplier": 1.0', '"noise_multiplier": 0.5')
    )
    (mine / "summary.json").write_text(summary)
    capsys.readouterr()
    before = _files(out)
    assert _compare(out, *grid) == 2
    line = _one_error_line(capsys)
    assert mine.name in line and "noise-multiplier" in line, line
    assert _files(out) == before


def test_a_killed_resume_leaves_no_finished_summary_and_compare_resumes_the_cell(tmp_path, capsys):
    # found by a fourth review: a finished 2-round cell's config.toml set to 3000 rounds, then
    # simulate --resume SIGKILLed after 8 s: its old summary.json stayed (2 rounds, epsilon
    # 10.28) beside a ledger at round 226 (epsilon 211), and compare --rounds 3000 reused the
    # cell as "finished earlier" (rc 0; summary.csv: rounds 2 beside epsilon 211)
    import signal
    import subprocess
    import sys
    import time

    from fedprivopt.simulation.ledger import RunLedger

    out, cell = _one_cell(tmp_path)
    for name in ("summary.csv", "report.md"):  # else the resume by hand is refused beside them
        (out / name).unlink()  # (forty-first review follow-up, ledger 1)
    stale = (cell / "summary.json").read_bytes()
    _edit(cell / "config.toml", "num-server-rounds = 2\n", "num-server-rounds = 1000000\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedprivopt.cli", "simulate", "--resume", str(cell), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            ledger = RunLedger.read(cell)
            if ledger is not None and ledger.last_round >= 6:
                break  # rounds past the old summary's were released
            time.sleep(0.01)
        assert proc.poll() is None
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert not (cell / "summary.json").exists()  # removed before the first round was released
    released = RunLedger.read(cell).last_round
    rounds = str(released + 2)
    _edit(cell / "config.toml", "num-server-rounds = 1000000\n", f"num-server-rounds = {rounds}\n")
    (cell / "summary.json").write_bytes(stale)  # as an earlier version left it
    capsys.readouterr()
    assert _compare(out, "--rounds", rounds, quiet=False) == 0
    err = capsys.readouterr().err
    assert f"{cell.name} (resume)" in err and "Warning" not in err, err
    row = _summary_rows(out)[0]
    assert row["rounds"] == rounds
    assert float(row["epsilon"]) == RunLedger.read(cell).epsilon()
    report = (out / "report.md").read_text()
    assert f"{cell.name} | resumed with the same configuration" in report


def test_notes_on_the_runs_are_one_line_on_stderr_and_listed_once(tmp_path, capsys):
    # found by a fourth review: a note on a run (its files state different epsilons) was a
    # 2-line Python UserWarning on stderr, and listed twice in report.md
    import json

    out, cell = _one_cell(tmp_path)
    summary = json.loads((cell / "summary.json").read_text())
    summary["epsilon"] = 0.001
    (cell / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    assert _compare(out, "--rounds", "2") == 0
    err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("[")]
    assert len(err) == 1 and "UserWarning" not in err[0], err
    assert err[0].startswith("fedprivopt compare: warning: ") and "different epsilons" in err[0]
    report = (out / "report.md").read_text()
    assert report.count("state different epsilons") == 1


def test_a_run_is_reported_in_its_own_cells_row_whatever_its_summary_states(tmp_path, capsys):
    # found by a fourth review: "noise_multiplier": 2.0 written into the sigma=0.5 cell's
    # summary.json (grid sigma 0.5,2) made the sigma=0.5 row disappear and the sigma=2 row
    # average two runs, rc 0
    import json

    out = tmp_path / "cmp"
    grid = ("--rounds", "2", "--noise-multipliers", "0.5,2")
    assert _compare(out, *grid) == 0
    rows = _summary_rows(out)
    cell = out / "runs" / "dp-fedavg__sigma0.5__seed0"
    summary = json.loads((cell / "summary.json").read_text())
    summary["noise_multiplier"] = 2.0
    (cell / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    assert _compare(out, *grid) == 0
    again = _summary_rows(out)
    assert [(r["noise_multiplier"], r["seeds"]) for r in again] == [("0.5", "1"), ("2.0", "1")]
    assert again == rows  # every number as before
    assert (
        "noise_multiplier 2.0, but its config.toml noise_multiplier 0.5"
        in (out / "report.md").read_text()
    )
    assert "noise_multiplier 2.0" in capsys.readouterr().err  # the one warning line


def test_a_deleted_ledger_is_rebuilt_from_the_checkpoint_and_the_report_says_so(
    tmp_path, capsys, caplog
):
    # found by a fourth review: a finished 5-round cell (epsilon 15.03) with its ledger deleted
    # and epsilon divided by 100 in metrics.jsonl and summary.json was reported with epsilon
    # 0.150, rc 0, no note
    import json

    from fedprivopt.simulation.report import load_run

    out, cell = _one_cell(tmp_path, rounds=5)
    spent = float(_summary_rows(out)[0]["epsilon"])
    (cell / "privacy_ledger.jsonl").unlink()
    kept = {name: (cell / name).read_bytes() for name in ("metrics.jsonl", "summary.json")}
    rows = [json.loads(x) for x in (cell / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row["epsilon"] /= 100
    (cell / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = json.loads((cell / "summary.json").read_text())
    summary["epsilon"] /= 100
    (cell / "summary.json").write_text(json.dumps(summary))
    run = load_run(cell)  # a report of the files as they are: the checkpoint's accountant
    assert run.epsilon == pytest.approx(spent, rel=1e-9)
    assert any("recomputed from the accountant of checkpoint.pt" in w for w in run.warnings)
    capsys.readouterr()
    # compare refuses rows that are not the rows its checkpoint was written after (thirty-ninth
    # review of issue 15, outputs follow-up 1: checkpoint.pt's rows_sha256)
    assert _compare(out, "--rounds", "5") == 2
    assert "metrics.jsonl" in capsys.readouterr().err
    for name, data in kept.items():  # the ledger alone deleted: rebuilt and reported
        (cell / name).write_bytes(data)
    assert _compare(out, "--rounds", "5") == 0
    assert float(_summary_rows(out)[0]["epsilon"]) == pytest.approx(spent, rel=1e-9)
    assert (cell / "privacy_ledger.jsonl").exists()  # rebuilt, as --resume rebuilds it
    logged = [r.getMessage() for r in caplog.records]
    assert any("no ledger was found; rebuilt from checkpoint.pt" in x for x in logged), logged
    # the rebuilt ledger carries the checkpoint's own events: nothing was released after it
    assert not any("stay accounted" in x for x in logged), logged
    report = (out / "report.md").read_text()
    assert "privacy_ledger.jsonl is missing: rebuilt from checkpoint.pt's accountant" in report


def test_a_cell_whose_run_released_more_rounds_than_it_asks_is_not_reused(tmp_path, capsys):
    # a variant of the killed resume (found while fixing it): a 2-round cell resumed to 4
    # rounds, then its config.toml set back to 2, was "finished" and reported with 4 rounds
    out, cell = _one_cell(tmp_path)
    _edit(cell / "config.toml", "num-server-rounds = 2\n", "num-server-rounds = 4\n")
    # forty-first review follow-up (ledger 1): beside the comparison's report such a resume is
    # refused (the report would be stale); without it (as a stopped compare leaves) it runs
    assert main(["simulate", "--resume", str(cell), "--quiet"]) == 2
    assert "is a cell of the comparison" in capsys.readouterr().err
    for name in ("summary.csv", "report.md"):
        (out / name).unlink()
    assert main(["simulate", "--resume", str(cell), "--quiet"]) == 0
    _edit(cell / "config.toml", "num-server-rounds = 4\n", "num-server-rounds = 2\n")
    capsys.readouterr()
    before = _files(out)
    assert _compare(out, "--rounds", "2") == 2
    line = _one_error_line(capsys)
    assert cell.name in line and "rounds up to 4" in line and "num-server-rounds = 2" in line
    assert _files(out) == before
    assert _compare(out, "--rounds", "2", "--overwrite") == 0
    assert _summary_rows(out)[0]["rounds"] == "2"


def test_a_cell_whose_budget_allowed_no_round_is_reported_and_then_reused(tmp_path, capsys):
    # found while fixing the killed resume: a cell stopped at its budget before round 1 has no
    # metrics.jsonl, and compare failed on it ("metrics.jsonl: missing", rc 2); it is finished
    # (round 0 is the last its budget allows), so the next call reuses it
    out = tmp_path / "cmp"
    argv = ("--strategies", "dp-fedavg,fedavg", "--rounds", "3", "--set", "target-epsilon=0.5")
    assert _compare(out, *argv) == 0
    assert [r["strategy"] for r in _summary_rows(out)] == ["fedavg"]
    assert (  # thirty-first review of issue 15, compare finding 9: not blamed on the metric
        "dp-fedavg__sigma0.5__seed0: stopped at its privacy budget before its first round"
        in (out / "report.md").read_text()
    )
    capsys.readouterr()
    assert _compare(out, *argv, quiet=False) == 0
    assert "dp-fedavg__sigma0.5__seed0 (reuse)" in capsys.readouterr().err


@pytest.mark.parametrize("change", ["replaced", "resumed-longer"])
def test_a_cell_changed_while_the_grid_runs_is_not_reported(tmp_path, capsys, monkeypatch, change):
    # a fifth review: compare checked a reused cell when it planned the grid, and read it only
    # after the other cells had run; a run directory replaced by a 2-round run meanwhile (or
    # resumed to more rounds) was reported as the reused cell, rc 0 (epsilon 10.28 in a grid of
    # 4-round runs)
    import shutil

    from fedprivopt.simulation import cells

    out, cell = _one_cell(tmp_path, rounds=4)
    original = cells.run_cell

    def run_cell(plan, **kwargs):
        original(plan, **kwargs)
        if plan.action != "run":
            return
        if change == "replaced":  # another terminal: a different run under the cell's name
            shutil.rmtree(cell)
            argv = ["simulate", str(PRESET), "--quiet", "--rounds", "2", "--out", str(cell)]
            assert main([*argv, *SMALL]) == 0
        else:  # its config.toml asks for more rounds, and a resume runs them
            _edit(cell / "config.toml", "num-server-rounds = 4", "num-server-rounds = 6")
            assert main(["simulate", "--resume", str(cell), "--quiet"]) == 0

    monkeypatch.setattr(cells, "run_cell", run_cell)
    before = (out / "summary.csv").read_bytes()
    capsys.readouterr()
    argv = ["--rounds", "4", "--strategies", "dp-fedavg,fedavg"]
    assert main(["compare", str(PRESET), "--out", str(out), "--quiet", *SMALL, *argv]) == 2
    line = _one_error_line(capsys)
    assert CELL in line and "changed while this comparison ran" in line, line
    # no report of the changed cell; nor the earlier grid's, removed before this call ran its
    # new fedavg cell (sixth review: a stopped call left a report of runs no longer there)
    assert before and not (out / "summary.csv").exists()


def test_a_call_stopped_after_changing_a_cell_leaves_no_stale_report(tmp_path, monkeypatch):
    """A 2-round grid, then ``--rounds 3 --overwrite`` stopped during cell 2 (SIGTERM, or cell 2
    locked by another process): ``summary.csv`` and ``report.md`` still showed the 2-round runs
    while cell 1 held a 3-round run (sixth review)."""
    from fedprivopt.simulation import cells
    from fedprivopt.simulation.cells import REPORT_FILES

    out = tmp_path / "st"
    argv = ["compare", str(PRESET), "--strategies", "dp-fedavg", "--noise-multipliers", "0.5,1"]
    argv += ["--out", str(out), "--quiet", *SMALL]
    assert main([*argv, "--rounds", "2"]) == 0
    assert all((out / name).is_file() for name in REPORT_FILES)
    real, calls = cells.run_cell, []

    def stopped_in_cell_2(plan, **kwargs):
        calls.append(plan.cell.label)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what the CLI's SIGTERM handler raises, in effect
        real(plan, **kwargs)

    monkeypatch.setattr(cells, "run_cell", stopped_in_cell_2)
    assert main([*argv, "--rounds", "3", "--overwrite"]) == 130
    assert len(calls) == 2
    assert not any((out / name).exists() for name in REPORT_FILES)
    monkeypatch.setattr(cells, "run_cell", real)
    assert main([*argv, "--rounds", "3", "--overwrite"]) == 0
    with open(out / "summary.csv") as fh:
        assert {r["rounds"] for r in csv.DictReader(fh)} == {"3"}


def test_a_symlinked_cell_is_reused_but_never_written(tmp_path, capsys):
    """Sixth review of issue 15: --overwrite replaced the run a cell's link pointed at."""
    elsewhere, _ = _one_cell(tmp_path / "a", rounds=3)
    target = elsewhere / "runs" / CELL
    before = (target / "metrics.jsonl").read_bytes()
    out = tmp_path / "cmp"
    (out / "runs").mkdir(parents=True)
    (out / "runs" / CELL).symlink_to(target)
    assert _compare(out, "--rounds", "3") == 0  # the same config: reused, read only
    capsys.readouterr()
    assert _compare(out, "--rounds", "2", "--overwrite") == 2
    assert "is a symbolic link" in _one_error_line(capsys)
    assert (target / "metrics.jsonl").read_bytes() == before


def test_compare_notes_once_the_set_keys_a_compared_strategy_does_not_use(tmp_path, capsys):
    """As ``simulate`` does: ``--set dp2-s1=3`` changes nothing in a DP-FedAdam run.

    Before, ``compare`` ran such cells without a word. One line per set of unused keys, naming
    its strategies once whatever the seeds; a strategy that uses every key is not named.
    """
    strategies = "dp-fedadam,dp-fedadam-bc,dp-fedavg,dp2"
    argv = ["--strategies", strategies, "--rounds", "1", "--seeds", "2"]
    assert _compare(tmp_path / "a", *argv, "--set", "dp2-s1=3", "--set", "max-noise-step=0.5") == 0
    notes = [x for x in capsys.readouterr().err.splitlines() if x.startswith("note:")]
    assert notes == [
        "note: dp-fedadam, dp-fedadam-bc do not use dp2-s1, max-noise-step (other strategies' "
        "options, or ones they ignore)",
        "note: dp-fedavg does not use dp2-s1 (other strategies' options, or ones it ignores)",
    ]
    assert _compare(tmp_path / "b", "--strategies", "dp2", "--rounds", "1") == 0
    assert "note:" not in capsys.readouterr().err
