"""Issue 15, nineteenth hostile review: regression tests of its findings.

1. A ``--set`` or ``--grid`` value that is a table without a value (``{}``, ``{x = {}}``) was
   dropped while the configuration was flattened: ``simulate toy.toml --set
   noise-multiplier={}`` (any key; also ``compare``, ``tune --set`` and ``deploy local``) ran
   with the preset's value and rc 0, and ``tune --grid max-noise-step=0.5,{}`` ran the ``{}``
   trials without the bound and released "best trial-001 (max-noise-step={})". Now rc 2, one
   line naming the flag and the key, before anything is written.
2. ``compare-tuned T`` with ``T/tune.json``'s ``base_config`` (or a trial's ``config.toml``)
   nested 100,000 arrays deep ended in a ``RecursionError`` traceback (rc 1). Now rc 2, one line
   naming the file.
3. ``compare-tuned T`` with a ``trial_count`` edited to a value out of range in ``tune.json``
   and ``summary.json`` (``"mean": "2"``, ``"distribution": "foo"``), or a negative ``seed``,
   was refused with ``mean must be a number in [1, 10000], got '2'``, naming no file. Now the
   line names ``T/tune.json`` and the field.
4. ``deploy local toy.toml --nodes 1 --set seed=1 --set seed=2`` ran with seed 2, and
   ``--rounds 1 --set num-server-rounds=3`` (also ``--seed``, ``--strategy``) with the flag's
   value: the last silently won, where ``simulate``, ``compare`` and ``tune`` refuse both.
   Now rc 2, one line naming both.
5. ``data info D`` with ``client_metadata`` counts near 2**63 (each a valid SQLite integer)
   summed them in int64: rc 0 with a negative number of examples per split and in total
   (``-9,223,372,036,854,775,806``). Now they are summed as Python integers.
6. ``simulate stackoverflow-tp-mini.toml --set task-params.data-dir=D --out R`` with
   ``D/stackoverflow.tag_count`` (or ``word_count``) a FIFO or a directory said ``argument
   --out: R: D: missing stackoverflow.tag_count``: the data directory's file blamed on ``--out``
   (also for a file truly missing) and a file that is there called missing. Now ``D/...: not a
   regular file ...`` (or ``D: missing ...``), without ``--out``.
7. ``compare-tuned T --untuned U`` with ``U/config.toml`` nested 100,000 arrays deep ended in a
   ``RecursionError`` traceback (rc 1). Now rc 2, one line naming the file.
8. ``compare-tuned T --untuned R --untuned R`` (also ``R/../R``, or ``R`` and a copy ``cp -r R
   R2``) reported the untuned row with 2 seeds, its std 0: one run counted as two seeds, where
   a tuning given twice is refused. Now rc 2, one line: a run counts once.
9. A finished tuning one of whose trials lost its ``privacy_ledger.jsonl``, then the same
   ``tune`` command again: rc 0, the trial resumed and its ledger rebuilt from the checkpoint,
   but without the plan's digest, so ``compare-tuned T`` refused the tuning ever after ("its
   header names no tuning plan ... the trial's files were edited"). The rebuilt ledger now
   names the plan ``tune`` resumed it under.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.reliability.test_fuzz_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
TOY = str(ROOT / "simulations" / "toy.toml")


def one_line_error(code: int, err: str, *parts: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err and err.endswith("\n") and len(err.splitlines()) == 1, err
    for part in parts:
        assert part in err, err


# -- finding 1: a --set or --grid value that is a table without a value ------------------------
@pytest.mark.parametrize("value", ["{}", "{x = {}}"])
@pytest.mark.parametrize(
    "command",
    [
        ["simulate", TOY, "--rounds", "1"],
        ["compare", TOY, "--rounds", "1", "--strategies", "dp-fedavg"],
        ["tune", TOY, "--rounds", "1", "--mean-trials", "2", "--seed", "1", "--grid", "x=1,2"],
        ["deploy", "local", TOY, "--rounds", "1", "--nodes", "1"],
    ],
)
def test_1_a_set_value_that_sets_nothing_is_refused(tmp_path, command, value):
    out = tmp_path / "out"
    code, _, err = run_cli([*command, "--out", str(out), "--set", f"noise-multiplier={value}"])
    one_line_error(code, err, "--set", "noise-multiplier", "sets nothing")
    assert not out.exists()


@pytest.mark.parametrize("grid", ["max-noise-step=0.5,{}", "max-noise-step={}", "seed={x={}}"])
def test_1_a_grid_value_that_sets_nothing_is_refused(tmp_path, grid):
    out = tmp_path / "tuning"
    argv = ["tune", TOY, "--rounds", "1", "--mean-trials", "2", "--seed", "1", "--grid", grid]
    code, _, err = run_cli([*argv, "--out", str(out), "--quiet"])
    one_line_error(code, err, "--grid", grid.split("=")[0], "sets nothing")
    assert not out.exists()


def test_1_compare_tune_grid_refuses_it_too(tmp_path):
    out = tmp_path / "cmp"
    argv = ["compare", TOY, "--rounds", "1", "--strategies", "dp-fedavg", "--mean-trials", "2"]
    code, _, err = run_cli([*argv, "--tune-grid", "max-noise-step=1,{}", "--out", str(out)])
    one_line_error(code, err, "--tune-grid", "max-noise-step", "sets nothing")
    assert not out.exists()


def test_1_a_table_with_a_value_is_still_read_as_dotted_keys(tmp_path):
    out = tmp_path / "run"
    argv = ["simulate", TOY, "--rounds", "1", "--out", str(out), "--quiet"]
    code, _, err = run_cli([*argv, "--set", "strategies={dp-fedavg={max-noise-step=0.25}}"])
    assert code == 0, err
    assert "max-noise-step = 0.25" in (out / "config.toml").read_text()


# -- findings 2 and 3: a tuning's plan that cannot be read names its file ----------------------
@pytest.fixture(scope="module")
def tuning(tmp_path_factory):
    """A finished 2-round tuning of toy's DP-FedAvg over max-noise-step (3 trials)."""
    out = tmp_path_factory.mktemp("tuning") / "T"
    argv = ["tune", TOY, "--strategy", "dp-fedavg", "--grid", "max-noise-step=0.05,5"]
    argv += ["--rounds", "2", "--mean-trials", "2", "--seed", "1", "--out", str(out), "--quiet"]
    code, _, err = run_cli(argv)
    assert code == 0, err
    return out


def _copy(tuning: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "T"
    shutil.copytree(tuning, copy)
    return copy


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def test_2_a_base_config_nested_too_deeply_is_one_line(tmp_path, tuning):
    copy = _copy(tuning, tmp_path)
    deep = "x = " + "[" * 100_000 + "]" * 100_000
    _edit_json(copy / "tune.json", lambda d: d.update(base_config=deep))
    code, _, err = run_cli(["compare-tuned", str(copy), "--out", str(tmp_path / "O")])
    one_line_error(code, err, str(copy / "tune.json"), "nested too deeply")


def test_2_a_trials_config_nested_too_deeply_is_one_line(tmp_path, tuning):
    copy = _copy(tuning, tmp_path)
    config = copy / "runs" / "trial-002" / "config.toml"
    config.write_text("x = " + "[" * 100_000 + "]" * 100_000)
    code, _, err = run_cli(["compare-tuned", str(copy), "--out", str(tmp_path / "O")])
    one_line_error(code, err, str(config), "nested too deeply")


@pytest.mark.parametrize(
    ("edit", "part"),
    [
        (lambda d: d["trial_count"].update(mean="2"), "mean"),
        (lambda d: d["trial_count"].update(distribution="foo"), "distribution"),
        (lambda d: d["trial_count"].update(mean=0), "mean"),
        (lambda d: d.update(seed=-1), "seed"),
    ],
)
def test_3_a_bad_trial_count_or_seed_names_tune_json(tmp_path, tuning, edit, part):
    copy = _copy(tuning, tmp_path)
    for name in ("tune.json", "summary.json"):  # edited alike, so they agree
        _edit_json(copy / name, edit)
    code, _, err = run_cli(["compare-tuned", str(copy), "--out", str(tmp_path / "O")])
    one_line_error(code, err, f"{copy / 'tune.json'}: its", part)


# -- finding 4: deploy local's --set and flags that contradict each other ---------------------
@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--set", "seed=1", "--set", "seed=2"], "--set"),
        (["--rounds", "1", "--set", "num-server-rounds=3"], "--rounds"),
        (["--seed", "1", "--set", "seed=3"], "--seed"),
        (["--strategy", "fedavg", "--set", "strategy=dp2"], "--strategy"),
    ],
)
def test_4_deploy_local_refuses_contradicting_values(tmp_path, extra, flag):
    out = tmp_path / "deploy"
    code, _, err = run_cli(["deploy", "local", TOY, "--nodes", "1", "--out", str(out), *extra])
    one_line_error(code, err, f"argument {flag}", "contradicts")
    assert not out.exists()


# -- finding 5: data info summed the example counts in int64 -----------------------------------
def test_5_data_info_sums_huge_counts_exactly(tmp_path):
    data = tmp_path / "data"
    code, _, err = run_cli(["data", "synth", "--out", str(data), "--clients", "5"])
    assert code == 0, err
    with sqlite3.connect(data / "stackoverflow.sqlite") as db:
        db.execute("UPDATE client_metadata SET num_examples = ?", (2**63 - 1,))
        (users,) = db.execute("SELECT COUNT(*) FROM client_metadata").fetchone()
    code, out, err = run_cli(["data", "info", str(data)])
    assert code == 0, err
    total = out.strip().splitlines()[-1].split()
    assert total[0] == "total" and int(total[2].replace(",", "")) == users * (2**63 - 1), out
    assert "-" not in out.replace("--", ""), out


def test_5_a_split_summary_is_exact_beyond_int64():
    from fedprivopt.data.summary import SplitSummary

    summary = SplitSummary.from_counts("train", [2**62, 2**62, 2**62])
    assert summary.num_examples == 3 * 2**62
    assert summary.mean == float(2**62)


# -- finding 6: a data directory's missing or special file was blamed on --out -----------------
TAG_MINI = str(ROOT / "simulations" / "stackoverflow-tp-mini.toml")


@pytest.mark.parametrize("kind", ["fifo", "directory", "missing"])
@pytest.mark.parametrize("name", ["stackoverflow.word_count", "stackoverflow.tag_count"])
def test_6_a_data_file_that_is_not_regular_is_named_not_out(tmp_path, mini, name, kind):
    data = tmp_path / "data"
    shutil.copytree(mini, data)
    (data / name).unlink()
    if kind == "fifo":
        os.mkfifo(data / name)
    elif kind == "directory":
        (data / name).mkdir()
    out = tmp_path / "run"
    argv = ["simulate", TAG_MINI, "--rounds", "1", "--out", str(out)]
    code, _, err = run_cli([*argv, "--set", f"task-params.data-dir={data}"])
    if kind == "missing":
        one_line_error(code, err, f"{data}: missing {name}")
    else:
        one_line_error(code, err, f"{data / name}: not a regular file")
    assert "--out" not in err, err
    assert not out.exists()


# -- findings 7 and 8: compare-tuned's untuned runs --------------------------------------------
@pytest.fixture(scope="module")
def untuned(tmp_path_factory):
    """A finished 2-round untuned run of the tuning's base configuration."""
    out = tmp_path_factory.mktemp("untuned") / "R"
    argv = ["simulate", TOY, "--rounds", "2", "--out", str(out), "--quiet"]
    code, _, err = run_cli(argv)
    assert code == 0, err
    return out


def test_7_an_untuned_config_nested_too_deeply_is_one_line(tmp_path, tuning, untuned):
    copy = tmp_path / "U"
    shutil.copytree(untuned, copy)
    (copy / "config.toml").write_text("x = " + "[" * 100_000 + "]" * 100_000)
    argv = ["compare-tuned", str(tuning), "--untuned", str(copy), "--out", str(tmp_path / "O")]
    code, _, err = run_cli(argv)
    one_line_error(code, err, "--untuned", "config.toml", "nested too deeply")


@pytest.mark.parametrize("second", ["same", "dotdot", "copy"])
def test_8_an_untuned_run_given_twice_or_copied_is_refused(tmp_path, tuning, untuned, second):
    other = {"same": untuned, "dotdot": untuned / ".." / untuned.name, "copy": tmp_path / "R2"}
    if second == "copy":
        shutil.copytree(untuned, other["copy"])
    out = tmp_path / "O"
    argv = ["compare-tuned", str(tuning), "--untuned", str(untuned), "--untuned"]
    code, _, err = run_cli([*argv, str(other[second]), "--out", str(out)])
    one_line_error(code, err, "--untuned", "a run counts once")
    assert not out.exists()


def test_8_untuned_runs_of_two_seeds_are_still_one_row(tmp_path, tuning, untuned):
    seed1 = tmp_path / "R1"
    code, _, err = run_cli(["simulate", TOY, "--rounds", "2", "--seed", "1", "--out", str(seed1),
                            "--quiet"])  # fmt: skip
    assert code == 0, err
    out = tmp_path / "O"
    argv = ["compare-tuned", str(tuning), "--untuned", str(untuned), "--untuned", str(seed1)]
    code, _, err = run_cli([*argv, "--out", str(out)])
    assert code == 0, err
    rows = (out / "summary.csv").read_text().splitlines()
    assert any(r.startswith("dp-fedavg,0.5,2,") for r in rows), rows


# -- finding 9: a trial's ledger rebuilt by tune named no plan ---------------------------------
@pytest.mark.parametrize("trial", ["trial-001", "trial-002"])  # the released one, another
def test_9_a_trial_ledger_rebuilt_by_tune_names_its_plan(tmp_path, tuning, trial):
    copy = _copy(tuning, tmp_path)
    (copy / "runs" / trial / "privacy_ledger.jsonl").unlink()
    argv = ["tune", TOY, "--strategy", "dp-fedavg", "--grid", "max-noise-step=0.05,5"]
    argv += ["--rounds", "2", "--mean-trials", "2", "--seed", "1", "--out", str(copy), "--quiet"]
    code, _, err = run_cli(argv)
    assert code == 0, err
    header = json.loads((copy / "runs" / trial / "privacy_ledger.jsonl").read_text().split("\n")[0])
    assert header.get("tuning_plan"), header
    code, _, err = run_cli(["compare-tuned", str(copy), "--out", str(tmp_path / "O")])
    assert code == 0, err
    stated = json.loads((tuning / "summary.json").read_text())["epsilon"]
    report = (tmp_path / "O" / "summary.csv").read_text().splitlines()[1].split(",")
    assert float(report[3]) >= stated, report
