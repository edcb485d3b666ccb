"""Twenty-seventh review of issue 15, follow-up: the rule of 12538c5 for tune and resume.

Issue 15: a directory that holds anything is never overwritten unless it is recognisably a run
of ours, and every bad input ends with rc 2 and one line naming the flag, key or file.

1. ``tune --out P``, ``P`` holding an empty ``runs/`` and the user's ``report.md``,
   ``summary.json`` and ``trials.csv``, replaced all three (rc 0). ``runs/`` must hold only
   ``trial-NNN`` directories, a report stand beside a trial or tune's own ``tune.json``, and
   ``summary.json`` be tune's.
2. ``compare --tune-grid ... --out P``, ``P`` holding an empty ``tune/`` and the user's
   ``report.md`` and ``summary.csv``, replaced both (rc 0): the same rule for ``tune/``.
3. ``simulate --resume R`` after ``cache_dir = "/x"`` (or ``token_cache = true``) was added
   under ``[task-params]`` of ``R/config.toml`` ended in the task's ``TypeError`` traceback,
   rc 1; ``data_dir = 5`` there was one line naming neither the file nor the key.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_twentythird_review import one_line_error

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"
NWP = ROOT / "simulations" / "stackoverflow-nwp.toml"
TUNE = ["tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "2"]
TUNED_COMPARE = ["compare", str(TOY), "--strategies", "dp-fedavg", "--tune-grid",
                 "server-learning-rate=0.5,1", "--mean-trials", "2"]  # fmt: skip


def _snapshot(path: Path) -> dict[str, bytes | None]:
    """Every entry under ``path``: a file's bytes, a directory's ``None``."""
    return {
        str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(path.rglob("*"))
    }


def _user_files(out: Path, *names: str) -> dict[str, bytes | None]:
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        (out / name).write_text("the user's own\n")
    return _snapshot(out)


# -- finding 1: tune's runs/ and its reports -------------------------------------------------------


@pytest.mark.parametrize(
    "layout, named",
    [
        ({"runs/": None, "report.md": "x", "summary.json": "x", "trials.csv": "x"}, "summary.json"),
        ({"runs/": None, "report.md": "x", "trials.csv": "x"}, "report.md"),
        ({"runs/": None, "trials.png": "x"}, "trials.png"),
        ({"runs/": None, "summary.json": '{"kind": "other"}'}, "summary.json"),
        ({"runs/trial-001": "a file", "report.md": "x"}, "runs/trial-001"),
        ({"runs": "a file", "report.md": "x"}, "runs"),
        ({"runs/": None, "tune.json": "not json"}, "tune.json"),
    ],
)
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_1_tune_refuses_reports_that_are_not_a_tunings(tmp_path, layout, named, overwrite):
    out = tmp_path / "p"
    out.mkdir()
    for name, text in layout.items():
        if name.endswith("/"):
            (out / name).mkdir()
            continue
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    before = _snapshot(out)
    code, _, err = run_cli([*TUNE, "--rounds", "1", "--out", str(out), *overwrite])
    one_line_error(code, err, repr(named), "which tune did not write")
    assert _snapshot(out) == before


@pytest.mark.parametrize("command", [TUNE, TUNED_COMPARE])
def test_1_an_empty_out_still_passes(tmp_path, command):
    out = tmp_path / "p"
    out.mkdir()
    code, _, err = run_cli([*command, "--rounds", "1", "--out", str(out)])
    assert code == 0, err


def test_1_an_earlier_tuning_and_an_empty_runs_still_pass(tmp_path):
    out = tmp_path / "p"
    (out / "runs").mkdir(parents=True)
    assert run_cli([*TUNE, "--rounds", "1", "--out", str(out)])[0] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kind"] == "fedprivopt-tune"
    code, _, err = run_cli([*TUNE, "--rounds", "1", "--out", str(out)])
    assert code == 0, err
    code, _, err = run_cli([*TUNE, "--rounds", "1", "--out", str(out), "--overwrite"])
    assert code == 0, err


# -- finding 2: compare --tune-grid's tune/ and its reports ----------------------------------------


@pytest.mark.parametrize(
    "entry, named",
    [
        (None, "report.md"),
        ("whatever", "tune/whatever"),
        ("dp-fedavg__sigma1__seed0", "tune/dp-fedavg__sigma1__seed0"),  # a file, not a tuning
    ],
)
def test_2_a_tuned_compare_refuses_reports_beside_no_tuning(tmp_path, entry, named):
    out = tmp_path / "p"
    (out / "tune").mkdir(parents=True)
    if entry == "whatever":
        (out / "tune" / entry).mkdir()
    elif entry is not None:
        (out / "tune" / entry).write_text("x")
    before = _user_files(out, "report.md", "summary.csv")
    code, _, err = run_cli([*TUNED_COMPARE, "--rounds", "1", "--out", str(out)])
    one_line_error(code, err, "argument --out", repr(named), "compare --tune-grid did not write")
    assert _snapshot(out) == before


def test_2_an_earlier_tuned_comparison_still_passes(tmp_path):
    out = tmp_path / "p"
    (out / "tune").mkdir(parents=True)
    for _ in range(2):
        code, _, err = run_cli([*TUNED_COMPARE, "--rounds", "1", "--out", str(out)])
        assert code == 0, err
    assert (out / "report.md").is_file()


# -- finding 3: a task parameter edited into a run's config.toml before --resume -------------------


def _two_rounds(tmp_path: Path, preset: Path, *sets: str) -> Path:
    run = tmp_path / "r"
    code, _, err = run_cli(["simulate", str(preset), "--rounds", "2", "--out", str(run),
                            "--quiet", *[f"--set={s}" for s in sets]])  # fmt: skip
    assert code == 0, err
    return run


def _edit(run: Path, key: str, value: str) -> None:
    """Put ``key = value`` first under ``[task-params]`` and ask for a third round."""
    path = run / "config.toml"
    text = re.sub(rf"(?m)^{re.escape(key)} = .*\n", "", path.read_text())
    text = text.replace("[task-params]\n", f"[task-params]\n{key} = {value}\n", 1)
    path.write_text(re.sub(r"num-server-rounds = \d+", "num-server-rounds = 3", text))


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("cache_dir", '"/x"', "unknown key 'task-params.cache-dir'"),
        ("token_cache", "true", "unknown key 'task-params.token-cache'"),
        ("data_dir", '"/x"', "unknown key 'task-params.data-dir'"),
    ],
)
def test_3_resume_names_a_task_parameter_the_task_does_not_take(tmp_path, key, value, said):
    run = _two_rounds(tmp_path, TOY)
    _edit(run, key, value)
    code, _, err = run_cli(["simulate", "--resume", str(run), "--quiet"])
    one_line_error(code, err, f"{run / 'config.toml'}: {said}")


@pytest.fixture(scope="module")
def nwp_two_rounds(tmp_path_factory) -> Path:
    """One two-round run of the NWP task (its dataset generated once); tests edit copies."""
    root = tmp_path_factory.mktemp("nwp")
    data = root / "data"
    return _two_rounds(root, NWP, f"task-params.data-dir={data}", "task-params.synth-clients=60",
                       "task-params.num-users=40", "task-params.eval-users=10",
                       "population=40")  # fmt: skip


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("cache_dir", '"/x"', "unknown key 'task-params.cache-dir'"),
        ("data_dir", "5", "task-params.data-dir must be a non-empty path, got 5"),
        ("data_dir", '""', "task-params.data-dir must be a non-empty path"),
    ],
)
def test_3_the_same_for_stackoverflow_nwp(tmp_path, nwp_two_rounds, key, value, said):
    import shutil

    run = tmp_path / "r"
    shutil.copytree(nwp_two_rounds, run)  # the shared run is never edited
    _edit(run, key, value)
    code, _, err = run_cli(["simulate", "--resume", str(run), "--quiet"])
    one_line_error(code, err, f"{run / 'config.toml'}: {said}")


def test_3_a_privacy_relevant_edit_is_still_refused_by_the_ledger(tmp_path):
    run = _two_rounds(tmp_path, TOY)
    _edit(run, "num_users", "41")
    code, _, err = run_cli(["simulate", "--resume", str(run), "--quiet"])
    one_line_error(code, err, "task-params.num-users = 41", "privacy ledger")
