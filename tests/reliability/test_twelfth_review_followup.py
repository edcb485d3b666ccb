"""Issue 15, twelfth hostile review, its two minor findings (fixed in a follow-up).

Minor finding 1: ``--set server-learning-rate=1e308`` overflowed the toy model; the evaluation
loss was NaN from round 1, the run released every round, and ``summary.json`` reported the
overflowed model's accuracy (0.343) with ``stopped_reason`` ``rounds`` and nothing else, as did
``compare``'s report. ``tune`` already counted such a trial as diverged. Now the summary names
the first diverged round (``diverged``, ``None`` otherwise; a resumed run names the same round as
an uninterrupted one), ``simulate`` ends with one warning line on stderr, and ``compare``'s report
marks the cell, also when an edited summary says ``null``. The run is not stopped: its ledger
still records every released round.

Minor finding 2: an empty ``config.toml`` on ``--resume`` was refused naming the noise
multiplier (the default 1.0 against the ledger's 0.5). Now it is one line naming the file and
saying it is empty (also blank or comment-only), before anything in the run directory is
touched; ``compare`` says the same of a cell's empty ``config.toml``.

Run against the code before the fixes (commit 6885f77, 2026-11-25): every test failed there
except the control ``test_compare_of_a_healthy_cell_marks_nothing``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from fedprivopt.simulation.checkpoint import check_checkpoint
from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_misuse_cli import SMALL, TOY, usage_error

OVERFLOW = ["--set", "server-learning-rate=1e308"]


def _simulate(out: Path, rounds: int, *extra: str) -> tuple[int, str, str]:
    return run_cli(["simulate", str(TOY), "--rounds", str(rounds), "--out", str(out), *SMALL,
                    *extra])  # fmt: skip


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _ledger_rounds(out: Path) -> list[int]:
    lines = (out / "privacy_ledger.jsonl").read_text().splitlines()[1:]  # after the header
    return [json.loads(line)["round"] for line in lines]


# -- minor finding 1: a diverged run says so ----------------------------------------------------


def test_an_overflowed_run_names_the_round_it_diverged_and_warns(tmp_path):
    out = tmp_path / "run"
    code, _, err = _simulate(out, 3, *OVERFLOW)
    assert code == 0, err[-2000:]
    summary = _summary(out)
    assert summary["diverged"] == 1
    # not stopped: every round released, recorded and charged as before
    assert summary["stopped_reason"] == "rounds" and summary["rounds_completed"] == 3
    assert _ledger_rounds(out) == [1, 2, 3]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["epsilon"] == pytest.approx(summary["epsilon"], rel=1e-12)
    (line,) = err.splitlines()  # --quiet: the warning is the only line on stderr
    assert line.startswith("warning: the model diverged at round 1") and "diverged = 1" in line


def test_a_healthy_run_has_no_diverged_round_and_no_warning(tmp_path):
    out = tmp_path / "run"
    code, _, err = _simulate(out, 2)
    assert code == 0 and err == "", err[-2000:]
    assert "diverged" in _summary(out) and _summary(out)["diverged"] is None


def test_a_model_that_overflows_between_evaluations_is_caught_and_kept_on_resume(tmp_path):
    # eval-every 3: round 1 is not evaluated, but its released model is already non-finite
    whole, part = tmp_path / "whole", tmp_path / "part"
    every = ["--set", "eval-every=3", "--set", "checkpoint-every=1"]
    assert _simulate(whole, 4, *OVERFLOW, *every)[0] == 0
    assert _summary(whole)["diverged"] == 1
    # the same run stopped after round 2 (evaluated: its last) and resumed to round 4
    assert _simulate(part, 2, *OVERFLOW, *every)[0] == 0
    config = part / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 2", "num-server-rounds = 4"))
    code, _, err = run_cli(["simulate", "--resume", str(part), "--quiet"])
    assert code == 0, err[-2000:]
    assert _summary(part)["diverged"] == 1 and "diverged at round 1" in err
    assert _summary(part)["epsilon"] == _summary(whole)["epsilon"]


def test_a_checkpoint_whose_diverged_is_not_a_round_is_unreadable():
    state = {"algorithm": {"round": 3, "params": torch.zeros(2), "accountant": {}, "config": {}}}
    check_checkpoint({**state, "diverged": 3})  # control
    for bad in (0, 4, True, "1", 1.0):
        with pytest.raises(ValueError, match="diverged must be a round in"):
            check_checkpoint({**state, "diverged": bad})


def test_compare_marks_a_cell_whose_seeds_diverged_even_with_an_edited_summary(tmp_path):
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "2", "--seeds", "2",
            "--out", str(out), *SMALL, *OVERFLOW]  # fmt: skip
    code, _, err = run_cli(argv)
    assert code == 0, err[-2000:]
    marked = "| 2 (2 diverged: seed 0 from round 1, seed 1 from round 1) |"
    report = (out / "report.md").read_text()
    assert marked in report and "2 of 2 runs diverged" in report
    assert "diverged at round 1" in err  # the notes' line on stderr
    for cell in (out / "runs").iterdir():  # the summaries say null: the rows still show it
        summary = json.loads((cell / "summary.json").read_text())
        (cell / "summary.json").write_text(json.dumps({**summary, "diverged": None}))
    assert run_cli(argv)[0] == 0
    assert marked in (out / "report.md").read_text()


def test_compare_of_a_healthy_cell_marks_nothing(tmp_path):  # control
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--out", str(out),
            *SMALL]  # fmt: skip
    assert run_cli(argv)[0] == 0
    assert "diverged" not in (out / "report.md").read_text()


# -- minor finding 2: an empty config.toml on --resume ------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("followup") / "run"
    code, _, err = _simulate(out, 2)
    assert code == 0, err[-2000:]
    return out


def _snapshot(out: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.iterdir())}


@pytest.mark.parametrize("text", ["", " \n\t\n\r\n", "# emptied\n\n"])
def test_an_empty_config_on_resume_is_one_line_naming_the_file(finished, tmp_path, text):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "config.toml").write_text(text)
    before = _snapshot(out)
    line = usage_error(run_cli(["simulate", "--resume", str(out), "--quiet"]), "config.toml")
    assert f"{out / 'config.toml'}: the file is empty" in line and "noise-multiplier" not in line
    assert _snapshot(out) == before  # nothing touched: no lock file, no summary removed


def test_a_compare_cell_with_an_empty_config_says_it_is_empty(tmp_path):
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--out", str(out),
            *SMALL]  # fmt: skip
    assert run_cli(argv)[0] == 0
    (cell,) = (out / "runs").iterdir()
    (cell / "config.toml").write_text("")
    usage_error(run_cli(argv), f"cell {cell.name}", "the file is empty")
