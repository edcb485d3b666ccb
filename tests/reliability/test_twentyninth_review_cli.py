"""Issue 15, twenty-ninth hostile review (command line): regression tests of its findings.

1. An empty cell directory counted as a cell for the report rule (the open item the
   twenty-seventh review's follow-up left): ``compare toy.toml --strategies fedavg --out P``,
   ``P`` holding an empty ``runs/dp-fedavg__sigma0.5__seed0/`` (``mkdir -p``, or a cell whose
   files were deleted) and the user's ``report.md`` and ``summary.csv``, replaced both (rc 0);
   the same for ``tune --out Q`` beside an empty ``runs/trial-001/`` and for ``compare
   --tune-grid … --out S`` beside an empty ``tune/<cell>/``. A report of ours never stands
   beside cells that are all empty (it is removed before the first cell changes and written
   after the last), so a cell, trial or tuned cell now counts only when it holds a run's
   ``config.toml`` (a tuning's ``tune.json``): rc 2, one line naming ``report.md``, nothing
   changed.
2. ``simulate toy.toml --strategy fedavg --rounds 1 --set
   strategies.fedavg.num-server-rounds=3`` ran 3 rounds (rc 0; also ``--set
   num-server-rounds=1`` beside ``--set 'strategies.fedavg={num-server-rounds=3}'``,
   ``--engine``, a task parameter, and ``tune --strategy fedavg``): the run's strategy's table
   is applied over the other overrides, so the flag silently lost, where ``--set
   num-server-rounds=3`` beside ``--rounds 1`` is refused. Now rc 2, one line naming both;
   equal values, and another strategy's table, are still accepted (``compare`` keeps a table
   of one strategy as that strategy's exception, as ``--tune-grid S:KEY``).
3. Every command's ``--help`` appended argparse's ``(default: None)`` to 48 flags and
   ``(default: False)`` to switches: ``--out DIR  run directory (default
   runs/<strategy>-seed<S>) (default: None)``, ``--nb-shape … (default 1) (default: None)``,
   the required ``CONFIG  preset TOML file (default: None)``. A help that states its own
   default, and a default of ``None`` or ``False``, now get no second one; real defaults
   (``--seeds K … (default: 1)``, ``data synth --seed S  seed (default: 0)``) stay.
4. ``compare toy.toml --strategies dp-fedavg,fedavg --set
   strategies.fedavg.task-params.seed=3`` (or a preset's ``[strategies.fedavg.task-params]``)
   trained and evaluated fedavg on other users and another test set than dp-fedavg, and the
   report set the two accuracies side by side without a word (rc 0). Now the report's
   warnings (and stderr) name the differing task settings, ``task-params.seed (0, 3)``; a
   tuning's model shape (a tunable hyperparameter) and the token store's location are not
   counted.
5. ``compare … --seeds 300`` wrote all 300 seed numbers into the report's first paragraph and,
   when they diverged (``--set server-learning-rate=1e308``), a seeds cell of 6,893 characters
   (``seed 0 from round 1, seed 1 from round 1, …``); the "Runs" table was sorted as text
   (``seed0, seed1, seed10, seed100``). Above 10 seeds they are now ranges (``0-299``,
   ``300 diverged: seeds 0-299 from round 1``), and runs are listed by strategy, σ and seed.
6. ``compare toy.toml --strategies fedavg --seeds 2 --set server-learning-rate=1e39`` (a
   baseline whose rate is too high: every seed diverges), then ``compare-tuned T --untuned C``:
   refused, ``'C/runs/fedavg__sigma0__seed1' is 'C/runs/fedavg__sigma0__seed0' again, or a
   copy of it``: the seeds released the same overflowed model, so their ledgers' digests
   matched. A released model now counts as a copy's only with the same seed (the ledger
   header's): rc 0 with the report; a copied run, or a copied trial, is still refused.
7. ``simulate toy.toml --tensorboard --out`` a directory whose name has 230 characters (a
   valid name; generated names with hyperparameters get long): a TensorBoard writer thread's
   traceback, then ``error: b'aaa…' (503 characters): File name too long``, rc 2: the event
   file's name is TensorBoard's ~45 characters plus the directory's name. The name in the
   suffix is now cut to fit 255 bytes (whole UTF-8 characters): rc 0, the events written.
8. ``fedprivopt simulate --help`` gave ``--set`` the example ``--set clip-norm=0.5 --set
   task-params.num-users=50``, which every preset refuses (``population must equal the number
   of users of task 'toy' (50), got 40``). The example now sets ``population`` too, and runs.
9. ``epsilon --noise-multiplier 1 --sample-rate 0.1 --rounds 10 --delta 1e-5
   --pld-discretization 0.5`` (also ``--accountant prv``, and ``calibrate``): rc 0, the flag
   silently ignored by the ``rdp`` accountant, where ``compare --mean-trials`` without
   ``--tune-grid`` is refused. Now rc 2, ``argument --pld-discretization: applies only with
   --accountant pld``; with ``pld`` it works as before (default 1e-4).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_twentyeighth_review import _forked as _child

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"


@pytest.fixture(autouse=True)
def _as_a_child_runs(tmp_path, monkeypatch):
    """The working directory and environment the twenty-eighth review's ``_cli`` gives a child."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))
    monkeypatch.delenv("FEDPRIVOPT_DEBUG", raising=False)


def _cli(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """``fedprivopt ARGV`` run by ``main`` in this process (no interpreter start-up): these
    findings are about the commands' results and messages, not their processes (the one about a
    writer thread's traceback runs in a child: ``_child``)."""
    code, out, err = run_cli(list(argv))
    return subprocess.CompletedProcess(list(argv), code, out, err)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# -- finding 1: an empty cell directory is no cell -------------------------------------------------

TUNE = ["--grid", "server-learning-rate=0.5,1", "--mean-trials", "1", "--rounds", "1"]
TUNED = ["--strategies", "dp-fedavg", "--tune-grid", *TUNE[1:]]
EMPTY_CELLS = {
    "compare": (
        "runs/dp-fedavg__sigma0.5__seed0",
        ["compare", str(TOY), "--strategies", "fedavg", "--rounds", "1"],
    ),
    "tune": ("runs/trial-001", ["tune", str(TOY), *TUNE]),
    "compare --tune-grid": ("tune/dp-fedavg__sigma0.5__seed0", ["compare", str(TOY), *TUNED]),
}


@pytest.mark.parametrize("command", sorted(EMPTY_CELLS))
def test_1_a_report_beside_only_empty_cells_is_the_users(tmp_path, command):
    cell, argv = EMPTY_CELLS[command]
    out = tmp_path / "P"
    (out / cell).mkdir(parents=True)
    (out / "report.md").write_text("my notes\n")
    proc = _cli(tmp_path, *argv, "--out", str(out))
    line = _one_line(proc)  # was rc 0, the user's report.md replaced
    assert "holds 'report.md'" in line, line
    assert (out / "report.md").read_text() == "my notes\n"
    assert sorted(p.name for p in out.iterdir()) == ["report.md", cell.split("/")[0]]


def test_1_a_report_beside_a_run_cell_is_still_replaced(tmp_path):
    out = tmp_path / "P"
    argv = ["compare", str(TOY), "--strategies", "fedavg", "--rounds", "1", "--out", str(out)]
    assert _cli(tmp_path, *argv).returncode == 0
    (out / "runs" / "dp-fedavg__sigma0.5__seed0").mkdir()  # an empty cell beside a real one
    again = _cli(tmp_path, *argv)
    assert again.returncode == 0, again.stderr
    assert "1 of 1 runs from an earlier call" in again.stdout, again.stdout


# -- finding 2: a strategy's --set table against a flag of the one run --------------------------


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["simulate", "--strategy", "fedavg", "--rounds", "1",
          "--set", "strategies.fedavg.num-server-rounds=3"], "contradicts --rounds 1"),
        (["simulate", "--strategy", "fedavg", "--set", "num-server-rounds=1",
          "--set", "strategies.fedavg={num-server-rounds=3}"],
         "contradicts --set num-server-rounds=1"),
        (["simulate", "--rounds", "1", "--set", "task-params.seed=1",
          "--set", "strategies.dp-fedavg.task-params.seed=2"], "task-params.seed=1"),
        (["tune", "--strategy", "fedavg", *TUNE, "--set", "strategies.fedavg.num-server-rounds=3"],
         "contradicts --rounds 1"),
    ],
)  # fmt: skip
def test_2_a_strategy_table_set_contradicting_a_flag_is_refused(tmp_path, argv, needle):
    out = tmp_path / "R"
    proc = _cli(tmp_path, argv[0], str(TOY), *argv[1:], "--out", str(out))
    line = _one_line(proc)  # was rc 0: 3 rounds (task seed 2) where the flag said 1
    assert needle in line, line
    assert not out.exists()


def test_2_equal_values_and_other_strategies_tables_still_run(tmp_path):
    argv = ["simulate", str(TOY), "--strategy", "fedavg", "--rounds", "1", "--quiet",
            "--set", "strategies.fedavg.num-server-rounds=1",
            "--set", "strategies.dp-fedavg.num-server-rounds=3"]  # fmt: skip
    proc = _cli(tmp_path, *argv, "--out", str(tmp_path / "R"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("1 rounds"), proc.stdout


# -- finding 3: help texts state a default only where there is one ---------------------------------


@pytest.mark.parametrize(
    "command", ["simulate", "compare", "compare-tuned", "tune", "epsilon", "data synth"]
)
def test_3_help_has_no_none_or_false_default(tmp_path, command):
    proc = _cli(tmp_path, *command.split(), "--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "(default: None)" not in text, text  # was 48 of them
    assert "(default: False)" not in text, text
    if command == "simulate":
        assert "run directory (default runs/<strategy>-seed<S>) --set" in text, text
    if command == "compare":
        assert "(default: 1)" in text, text  # a real default stays (--seeds, --jobs)
    if command == "data synth":
        assert "--seed S seed (default: 0)" in text, text


# -- finding 4: a report over runs of other task settings says so ---------------------------------


def test_4_a_report_names_task_settings_that_differ_between_runs(tmp_path):
    out = tmp_path / "C"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg,fedavg", "--rounds", "1", "--quiet",
            "--set", "strategies.fedavg.task-params.seed=3", "--out", str(out)]  # fmt: skip
    proc = _cli(tmp_path, *argv)
    assert proc.returncode == 0, proc.stderr
    warning = "the runs differ in their task settings: task-params.seed (0, 3)"
    assert warning in proc.stderr, proc.stderr  # was silent
    assert warning in (out / "report.md").read_text()


def test_4_one_task_gives_no_such_warning(tmp_path):
    out = tmp_path / "C"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg,fedavg", "--rounds", "1", "--quiet"]
    proc = _cli(tmp_path, *argv, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "task settings" not in (out / "report.md").read_text()


# -- finding 5: many seeds are written as ranges ---------------------------------------------------


def test_5_many_seeds_are_ranges_and_runs_are_in_seed_order(tmp_path):
    out = tmp_path / "C"
    argv = ["compare", str(TOY), "--strategies", "fedavg", "--rounds", "1", "--seeds", "12",
            "--quiet", "--set", "server-learning-rate=1e308", "--out", str(out)]  # fmt: skip
    proc = _cli(tmp_path, *argv)
    assert proc.returncode == 0, proc.stderr
    report = (out / "report.md").read_text()
    assert "× 12 seeds (0-11)" in report, report  # was 0, 1, 2, ..., 11
    assert "| 12 (12 diverged: seeds 0-11 from round 1) |" in report, report
    runs = [line.split(" | ")[0][2:] for line in report.splitlines() if "fedavg__sigma0__" in line]
    assert runs[:3] == [f"fedavg__sigma0__seed{s}" for s in (0, 1, 2)], runs  # was 0, 1, 10


# -- finding 6: diverged seeds are not copies of each other ----------------------------------------


def test_6_diverged_seeds_are_not_taken_for_copies(tmp_path):
    tuning, runs = tmp_path / "T", tmp_path / "C"
    tuned = _cli(tmp_path, "tune", str(TOY), *TUNE, "--seed", "1", "--quiet", "--out", str(tuning))
    assert tuned.returncode == 0, tuned.stderr
    argv = ["compare", str(TOY), "--strategies", "fedavg", "--seeds", "2", "--rounds", "3",
            "--quiet", "--set", "server-learning-rate=1e39", "--out", str(runs)]  # fmt: skip
    assert _cli(tmp_path, *argv).returncode == 0
    report = tmp_path / "R"
    proc = _cli(
        tmp_path, "compare-tuned", str(tuning), "--untuned", str(runs), "--out", str(report)
    )
    assert proc.returncode == 0, proc.stderr  # was rc 2: "... again, or a copy of it"
    assert (report / "report.md").is_file()
    # a copy (same seed, same released models) is still refused
    seed0 = runs / "runs" / "fedavg__sigma0__seed0"
    shutil.copytree(seed0, tmp_path / "copy")
    again = _cli(tmp_path, "compare-tuned", str(tuning), "--untuned", str(seed0),
                 "--untuned", str(tmp_path / "copy"), "--out", str(tmp_path / "R2"))  # fmt: skip
    assert "again, or a copy of it" in _one_line(again)


# -- finding 7: TensorBoard's event file fits a file name ------------------------------------------


@pytest.mark.parametrize("name", ["a" * 230, "é" * 127])
def test_7_tensorboard_beside_a_long_directory_name(tmp_path, name):
    out = tmp_path / name
    argv = ["simulate", str(TOY), "--rounds", "1", "--quiet", "--tensorboard", "--out", str(out)]
    proc = _child(tmp_path, *argv)  # a thread's traceback reaches a child's stderr
    assert proc.returncode == 0, proc.stderr  # was rc 2 after a thread's traceback
    assert proc.stderr == "", proc.stderr
    (events,) = (p.name for p in out.iterdir() if p.name.startswith("events.out.tfevents."))
    assert len(events.encode()) <= 255
    assert "." + name[:20] in events  # named by its directory, cut


# -- finding 8: the --set example of simulate's help runs ------------------------------------------


def test_8_simulates_help_example_of_set_runs(tmp_path):
    text = " ".join(_cli(tmp_path, "simulate", "--help").stdout.split())
    example = text.split("override any preset key, e.g. ")[1].split(" (repeatable)")[0]
    assert "population=50" in example, example
    argv = ["simulate", str(TOY), "--rounds", "1", "--quiet", *example.split()]
    proc = _cli(tmp_path, *argv, "--out", str(tmp_path / "R"))
    assert proc.returncode == 0, proc.stderr  # was rc 2: population must equal ... (50), got 40


# -- finding 9: --pld-discretization only with --accountant pld ------------------------------------

RATE = ["--sample-rate", "0.1", "--rounds", "10", "--delta", "1e-5"]


@pytest.mark.parametrize(
    "argv",
    [
        ["epsilon", "--noise-multiplier", "1", *RATE, "--pld-discretization", "0.5"],
        ["epsilon", "--noise-multiplier", "1", *RATE, "--accountant", "prv",
         "--pld-discretization", "0.5"],
        ["calibrate", "--target-epsilon", "5", *RATE, "--pld-discretization", "0.5"],
    ],
)  # fmt: skip
def test_9_pld_discretization_without_pld_is_refused(tmp_path, argv):
    line = _one_line(_cli(tmp_path, *argv))  # was rc 0, the flag ignored
    assert "argument --pld-discretization: applies only with --accountant pld" in line, line


def test_9_pld_discretization_with_pld_still_applies(tmp_path):
    argv = ["epsilon", "--noise-multiplier", "1", *RATE, "--accountant", "pld", "--json"]
    fine = json.loads(_cli(tmp_path, *argv).stdout)["epsilon"]
    coarse = json.loads(_cli(tmp_path, *argv, "--pld-discretization", "0.1").stdout)["epsilon"]
    assert coarse > fine  # coarser: a larger, still valid epsilon
