"""Issue 15, ninth hostile review (N1-N13): each case failed before its fix.

A tuning directory re-used by another plan (N5), run and lock files that are FIFOs or devices
(N1-N3, N12), ``deploy local --timeout`` (N4), a task parameter in both spellings (N6), the
messages of ``data info`` and ``data synth --tags`` (N7, N8), ``compare --quiet`` (N9),
``--resume`` of a config with fewer rounds than released (N10), a cell recognised by file names
alone (N11) and ``clip_l2``'s argument types (N13).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_misuse_cli import SMALL, TOY, compare, simulate, usage_error


def _tune(out: Path, *extra: str) -> list[str]:
    return ["tune", str(TOY), "--strategy", "dp-fedavg", "--rounds", "1", "--mean-trials", "1",
            "--seed", "1", "--out", str(out), *SMALL, *extra]  # fmt: skip


def _state(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` and its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.name != "tune.lock"
    }


# -- N5: a tuning's trials are reused only under its own plan -------------------------------------


@pytest.fixture(scope="module")
def tuning(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("n5") / "U1"
    code, _, err = run_cli(_tune(out, "--grid", "noise-multiplier=0.5,1.0"))
    assert code == 0, err
    return out


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--grid", "noise-multiplier=0.7,1.0"], "--grid"),
        (["--grid", "noise-multiplier=0.5,1.0", "--distribution", "poisson"], "--distribution"),
        (["--grid", "noise-multiplier=0.5,1.0", "--nb-shape", "2"], "--nb-shape"),
        (["--grid", "noise-multiplier=0.5,1.0", "--metric", "eval_loss"], "--metric"),
        (["--grid", "noise-multiplier=0.5,1.0", "--set", "delta=1e-6"], "delta"),
    ],
)
def test_tune_into_a_tuning_of_another_plan_is_refused(tuning, tmp_path, extra, flag):
    import shutil

    out = tmp_path / "U"
    shutil.copytree(tuning, out)
    before = _state(out)
    line = usage_error(run_cli(_tune(out, *extra)), flag, "--overwrite", "another plan")
    assert "tune" in line
    assert _state(out) == before


def test_tune_overwrite_of_another_plan_starts_over(tuning, tmp_path):
    import shutil

    out = tmp_path / "U"
    shutil.copytree(tuning, out)
    (out / "runs" / "trial-009").mkdir()  # a trial of the earlier plan this one does not draw
    (out / "runs" / "trial-009" / "config.toml").write_text(
        (out / "runs" / "trial-001" / "config.toml").read_text()
    )
    code, _, err = run_cli(_tune(out, "--grid", "noise-multiplier=0.7,1.0", "--overwrite"))
    assert code == 0, err
    plan = json.loads((out / "tune.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert plan["grid"] == {"noise-multiplier": [0.7, 1.0]}
    assert [t["origin"] for t in summary["trials"]] == ["ran in this call"]
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["trial-001"]
    old = json.loads((tuning / "summary.json").read_text())
    assert summary["epsilon"] < old["epsilon"]  # ε of the plan that drew the released trial


def test_tune_overwrite_keeps_a_stranger_in_runs(tuning, tmp_path):
    import shutil

    out = tmp_path / "U"
    shutil.copytree(tuning, out)
    (out / "runs" / "trial-001" / "thesis.tex").write_text("mine")
    before = _state(out)
    usage_error(run_cli(_tune(out, "--grid", "noise-multiplier=0.7,1.0", "--overwrite")),
                "thesis.tex")  # fmt: skip
    assert _state(out) == before


def test_tune_with_the_same_plan_still_reuses(tuning, tmp_path):
    import shutil

    out = tmp_path / "U"
    shutil.copytree(tuning, out)
    code, _, err = run_cli(_tune(out, "--grid", "noise-multiplier=0.5,1.0"))
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trials"][0]["origin"].startswith("reused")
    assert "trial-001: reused" in (out / "report.md").read_text()


# -- N3: lock files that are FIFOs ----------------------------------------------------------------


@pytest.mark.parametrize("command", ["simulate", "compare", "tune"])
def test_a_fifo_lock_file_is_refused(tmp_path, command):
    out = tmp_path / "out"
    argv = {
        "simulate": lambda: simulate(str(out)),
        "compare": lambda: compare(str(out)),
        "tune": lambda: _tune(out, "--grid", "noise-multiplier=0.5,1.0"),
    }[command]()
    out.mkdir()
    if command != "simulate":
        (out / "runs").mkdir()  # an earlier comparison's or tuning's directory
    lock = {"simulate": "run.lock", "compare": "compare.lock", "tune": "tune.lock"}[command]
    os.mkfifo(out / lock)
    usage_error(run_cli(argv), lock, "not a regular file")


# -- N1, N2, N12: run files that are FIFOs or links to a device -----------------------------------

RUN_FILES = ["privacy_ledger.jsonl", "metrics.jsonl", "summary.json", "checkpoint.pt",
             "config.toml"]  # fmt: skip


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("n1") / "r1"
    code, _, err = run_cli(simulate(str(out)))
    assert code == 0, err
    return out


def _spoil(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("name", RUN_FILES)
def test_resume_refuses_a_run_file_that_is_not_regular(finished_run, tmp_path, name, kind):
    import shutil

    from tests.reliability.test_misuse_cli import run_child

    run = tmp_path / "D"
    shutil.copytree(finished_run, run)
    _spoil(run / name, kind)
    usage_error(run_child(["simulate", "--resume", str(run)], timeout=60),
                f"{name}: not a regular file")  # fmt: skip


@pytest.mark.parametrize("name, kind", [("metrics.jsonl", "fifo"), ("summary.json", "dev-zero")])
def test_compare_refuses_a_cell_file_that_is_not_regular(tmp_path, name, kind):
    from tests.reliability.test_misuse_cli import run_child

    out = tmp_path / "C"
    code, _, err = run_cli(compare(str(out)))
    assert code == 0, err
    (cell,) = (out / "runs").iterdir()
    _spoil(cell / name, kind)
    usage_error(run_child(compare(str(out)), timeout=60), f"cell {cell.name}",
                f"{name}: not a regular file")  # fmt: skip


def test_a_run_file_over_its_size_cap_is_refused(finished_run, tmp_path):
    import shutil

    from fedprivopt.simulation.files import SMALL_FILE_LIMIT

    run = tmp_path / "D"
    shutil.copytree(finished_run, run)
    with open(run / "summary.json", "ab") as fh:
        fh.truncate(SMALL_FILE_LIMIT + 1)  # sparse: no disk used
    usage_error(run_cli(["simulate", "--resume", str(run)]), "summary.json", "bytes")


# -- N4: deploy local --timeout is bounded before anything starts --------------------------------


@pytest.mark.parametrize("value", ["1e308", "2592001"])
def test_deploy_timeout_is_bounded_before_anything_starts(tmp_path, value):
    out = tmp_path / "DL"
    argv = ["deploy", "local", str(TOY), "--nodes", "2", "--out", str(out), "--quiet",
            "--rounds", "1", "--timeout", value]  # fmt: skip
    usage_error(run_cli(argv), "--timeout", "2.592e+06")
    assert not out.exists()


# -- N6: a task parameter in both spellings in one preset ----------------------------------------


@pytest.mark.parametrize("order", ["kebab-first", "snake-first"])
def test_a_task_parameter_in_both_spellings_is_refused(tmp_path, order):
    lines = ["num-classes = 10", "num_classes = 3"]
    if order == "snake-first":
        lines.reverse()
    text = TOY.read_text().replace("num-users = 40", "num-users = 40\n" + "\n".join(lines))
    preset = tmp_path / "dup.toml"
    preset.write_text(text)
    out = tmp_path / "X"
    argv = ["simulate", str(preset), "--rounds", "1", "--out", str(out), "--quiet"]
    usage_error(run_cli(argv), "task-params.num-classes", "task-params.num_classes")
    assert not out.exists()


def test_a_task_parameter_override_in_the_other_spelling_still_wins(tmp_path):
    out = tmp_path / "X"
    code, _, err = run_cli(simulate(str(out), "--set", "task-params.num_classes=3"))
    assert code == 0, err
    assert "num_classes = 3" in (out / "config.toml").read_text()


# -- N9: compare --quiet prints only the error line -----------------------------------------------


def test_compare_quiet_refusal_is_one_line(tmp_path):
    out = tmp_path / "S5"
    cell = out / "runs" / "dp-fedavg__sigma0.5__seed0"
    cell.mkdir(parents=True)
    (cell / "thesis.tex").write_text("thesis")
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--out", str(out),
            "--noise-multipliers", "0.5", "--quiet", "--overwrite"]  # fmt: skip
    usage_error(run_cli(argv), "thesis.tex")
    assert (cell / "thesis.tex").read_text() == "thesis"


# -- N10: --resume of a config.toml with fewer rounds than released -------------------------------


def test_resume_refuses_fewer_rounds_than_released(tmp_path):
    out = tmp_path / "E1"
    code, _, err = run_cli(["simulate", str(TOY), "--rounds", "2", "--out", str(out), *SMALL])
    assert code == 0, err
    config = out / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 2", "num-server-rounds = 1"))
    before = _state(out)
    usage_error(run_cli(["simulate", "--resume", str(out)]), "num-server-rounds = 1",
                "config.toml")  # fmt: skip
    assert _state(out) == before


# -- N13: clip_l2's clip_norm and meta tensors ----------------------------------------------------


@pytest.mark.parametrize("clip_norm", ["0.1", True, None])
def test_clip_norm_must_be_a_real_number(clip_norm):
    import torch

    from fedprivopt.privacy.clip import clip_l2

    with pytest.raises(TypeError, match="clip_norm"):
        clip_l2(torch.ones(5), clip_norm)


def test_clip_norm_of_numpy_and_tensor_types_still_works():
    import numpy as np
    import torch

    from fedprivopt.privacy.clip import clip_l2

    for clip_norm in (np.float32(0.5), torch.tensor(0.5), 1):
        out = clip_l2(torch.ones(5), clip_norm)
        assert float(torch.linalg.vector_norm(out.vector)) <= float(clip_norm)


def test_clip_of_a_meta_tensor_is_a_value_error():
    import torch

    from fedprivopt.privacy.clip import clip_l2

    with pytest.raises(ValueError, match="meta"):
        clip_l2(torch.empty(5, device="meta"), 1.0)


# -- N7, N8: the messages of data info and data synth --tags ---------------------------------------


def test_data_info_says_what_is_wrong(tmp_path, finished_run):
    empty = tmp_path / "emptyd"
    empty.mkdir()
    usage_error(run_cli(["data", "info", str(empty)]), "holds no stackoverflow.sqlite")
    usage_error(run_cli(["data", "info", str(finished_run)]), "holds no stackoverflow.sqlite")
    usage_error(run_cli(["data", "info", "/dev/zero"]), "is not a regular file")


def test_data_synth_with_one_tag(tmp_path):
    out = tmp_path / "SY"
    argv = ["data", "synth", "--out", str(out), "--clients", "20", "--tags", "1"]
    code, _, err = run_cli(argv)
    assert code == 0, err
    assert (out / "stackoverflow.sqlite").is_file()


def test_data_errors_name_the_action(tmp_path):
    line = usage_error(run_cli(["data", "info", str(tmp_path / "nope")]), "does not exist")
    assert line.startswith("fedprivopt data info: error:")
    out = tmp_path / "SY"
    out.mkdir()
    (out / "stackoverflow.word_count").write_text("a stranger's\n")
    line = usage_error(run_cli(["data", "synth", "--out", str(out), "--clients", "20"]), "--out")
    assert line.startswith("fedprivopt data synth: error:")


# -- N11: a cell is not recognised as a run by its file names alone -------------------------------


def test_compare_overwrite_keeps_a_stranger_beside_an_invalid_config(tmp_path):
    out = tmp_path / "S6"
    cell = out / "runs" / "dp-fedavg__sigma0.5__seed0"
    cell.mkdir(parents=True)
    (cell / "metrics.jsonl").write_text("stranger\n")
    (cell / "config.toml").write_text('strategy="x"\n')
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--out", str(out),
            "--noise-multipliers", "0.5", "--quiet", "--overwrite"]  # fmt: skip
    usage_error(run_cli(argv), "not recognisably a run", "metrics.jsonl")
    assert (cell / "metrics.jsonl").read_text() == "stranger\n"
