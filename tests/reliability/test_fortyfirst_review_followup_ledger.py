"""Issue 15, forty-first hostile review follow-up, the ledger: regression tests of its findings.

1. The first-wave ledger reviewer's open row. ``compare toy.toml --strategies dp-fedavg
   --rounds 1 --out C1`` (ε 7.55), the cell's ``config.toml`` raised to 2 rounds and
   ``simulate --resume C1/runs/<cell>`` (ε 10.28): rc 0, and ``C1/summary.csv`` and
   ``C1/report.md`` kept stating 7.55 and 1 round beside a run that had spent more (a later
   ``compare`` refused, keeping that report on purpose); a ``tune ... --rounds 1 --out T1``
   trial raised to 3 rounds and resumed alike (the trial at ε 12.17, the tuning's
   ``summary.json`` and ``report.md`` unchanged); the Python API's ``simulate(config, cell,
   overwrite=True)`` replaced a cell beside its report the same way. ``compare`` and ``tune``
   remove their report before any cell changes, so a report beside ``runs/`` describes every
   cell as it is. Now a resume (or an overwriting ``simulate``) of such a cell or trial by hand
   is refused while the report is there, before anything is written, naming the command that
   resumes or reruns it and writes the report again
   (``cells.check_not_reported`` from ``run.resume`` when a round would be released, and
   ``run.simulate`` with ``overwrite``; ``compare`` and ``tune`` pass ``planned=True`` through
   ``cells.run_cell``; a trial of a ``compare --tune-grid`` cell names that command). A cell of
   a comparison that stopped (no report) still resumes by hand, and ``compare`` still resumes
   it itself (tests/simulation/test_compare.py).
2. A variant of the forty-first review's ledger 1 (a directory where a resume replaces a
   file): a finished secure run whose newest checkpoint is unreadable, a directory at
   ``checkpoint.pt.bad`` (where ``resume`` sets such a checkpoint aside), its rounds raised.
   Before: ``summary.json`` removed, then rc 2 ``checkpoint.pt -> checkpoint.pt.bad: Is a
   directory`` (nothing released, but the finished run's summary lost and every check not
   made first). Now ``files.check_replaced`` refuses it before the lock, nothing changed.
3. The same for an earlier version's ledger (event counts only), which a resume converts and
   sets aside as ``privacy_ledger.jsonl.v1``: a directory there, rounds raised. Before:
   ``summary.json`` removed, then ``IsADirectoryError`` (``privacy_ledger.jsonl ->
   privacy_ledger.jsonl.v1``). Now refused first (``check_replaced(out, extra=...)`` from
   ``run.resume``); without the directory the run converts and resumes as before.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import LEDGER_FILE
from fedprivopt.simulation.run import resume, simulate
from tests.reliability.test_fortieth_review_followup_ledger import raise_rounds
from tests.reliability.test_misuse_cli import TOY
from tests.simulation.test_run import small_config

CELL = "dp-fedavg__sigma0.5__seed0"
ONE = ["--rounds", "1", "--quiet", "--set", "population=12", "--set", "clients-per-round=4",
       "--set", "task-params.num-users=12"]  # fmt: skip


@pytest.fixture(scope="module")
def comparison(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("compare") / "C1"
    assert main(["compare", str(TOY), "--strategies", "dp-fedavg", "--out", str(out), *ONE]) == 0
    return out


@pytest.fixture(scope="module")
def tuning(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tune") / "T1"
    argv = ["tune", str(TOY), "--grid", "local-learning-rate=0.1,0.5", "--mean-trials", "1",
            "--distribution", "poisson", "--seed", "5", "--out", str(out), *ONE]  # fmt: skip
    assert main(argv) == 0
    assert any((out / "runs").iterdir()), "the seed drew no trial"
    return out


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def test_1_resume_of_a_reported_cell_by_hand_is_refused(comparison, tmp_path, capsys):
    out = _copy(comparison, tmp_path)
    cell = out / "runs" / CELL
    raise_rounds(cell, 2)
    ledger, report = (cell / LEDGER_FILE).read_bytes(), (out / "summary.csv").read_bytes()
    with pytest.raises(ValueError, match=r"is a cell of the comparison in .* fedprivopt compare"):
        resume(cell)
    capsys.readouterr()
    assert main(["simulate", "--resume", str(cell)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "summary.csv, report.md state its rounds and epsilon" in err
    assert (cell / LEDGER_FILE).read_bytes() == ledger  # nothing released
    assert (out / "summary.csv").read_bytes() == report and (cell / "summary.json").exists()


def test_1_overwrite_of_a_reported_cell_through_the_api_is_refused(comparison, tmp_path):
    out = _copy(comparison, tmp_path)
    cell = out / "runs" / CELL
    config = load_config(cell / "config.toml")
    ledger = (cell / LEDGER_FILE).read_bytes()
    with pytest.raises(ValueError, match="is a cell of the comparison"):
        simulate(config, cell, overwrite=True)
    assert (cell / LEDGER_FILE).read_bytes() == ledger


def test_1_resume_of_a_reported_trial_by_hand_is_refused(tuning, tmp_path):
    out = _copy(tuning, tmp_path)
    trial = next((out / "runs").iterdir())
    raise_rounds(trial, 2)
    summary = json.loads((out / "summary.json").read_text())
    ledger = (trial / LEDGER_FILE).read_bytes()
    with pytest.raises(ValueError, match=r"is a trial of the tuning in .* fedprivopt tune"):
        resume(trial)
    assert (trial / LEDGER_FILE).read_bytes() == ledger
    assert json.loads((out / "summary.json").read_text()) == summary


def test_1_a_stopped_comparisons_cell_still_resumes(comparison, tmp_path):
    """No report (as a stopped compare leaves it): the cell resumes by hand as before."""
    out = _copy(comparison, tmp_path)
    cell = out / "runs" / CELL
    for name in ("summary.csv", "report.md"):
        (out / name).unlink()
    raise_rounds(cell, 2)
    (cell / "summary.json").unlink()  # as a run stopped after its first round leaves it
    assert resume(cell).rounds_completed == 2


def test_1_a_tuned_comparisons_trial_names_compare_tune_grid(tmp_path):
    from fedprivopt.simulation.cells import check_not_reported

    out = tmp_path / "CT"
    trial = out / "tune" / "dp-fedavg__sigma0.5__seed0" / "runs" / "trial-001"
    trial.mkdir(parents=True)
    (out / "compare.lock").touch()
    (out / "tune" / "dp-fedavg__sigma0.5__seed0" / "tune.json").touch()
    check_not_reported(trial)  # no report there: a stopped call's trial resumes
    (out / "tune" / "dp-fedavg__sigma0.5__seed0" / "summary.json").touch()
    with pytest.raises(
        ValueError, match=r"fedprivopt compare --tune-grid with --out '.*CT' instead"
    ):
        check_not_reported(trial)
    check_not_reported(tmp_path / "elsewhere" / "runs" / "x")  # no comparison or tuning there


def test_2_a_directory_where_an_unreadable_checkpoint_is_set_aside_is_refused_first(tmp_path):
    config = small_config(**{"num-server-rounds": 2, "secure": True})
    run = simulate(config, tmp_path / "run").out_dir
    data = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(data[:1000])  # unreadable: resumed from the previous
    (run / "checkpoint.pt.bad").mkdir()
    raise_rounds(run, 3)
    ledger = (run / LEDGER_FILE).read_bytes()
    with pytest.raises(ValueError, match=r"checkpoint.pt.bad' is a directory, where a resume"):
        resume(run)
    assert (run / "summary.json").exists() and (run / LEDGER_FILE).read_bytes() == ledger


def test_3_a_directory_where_an_old_ledger_is_set_aside_is_refused_first(tmp_path):
    run = simulate(small_config(**{"num-server-rounds": 2}), tmp_path / "run").out_dir
    old = [{"round": r, "events": r, "kind": "checkpoint"} for r in (1, 2)]  # an earlier version's
    (run / LEDGER_FILE).write_text("".join(json.dumps(x) + "\n" for x in old))
    (run / (LEDGER_FILE + ".v1")).mkdir()
    raise_rounds(run, 3)
    ledger = (run / LEDGER_FILE).read_bytes()
    with pytest.raises(ValueError, match=r"jsonl.v1' is a directory, where a resume writes"):
        resume(run)
    assert (run / "summary.json").exists() and (run / LEDGER_FILE).read_bytes() == ledger
    (run / (LEDGER_FILE + ".v1")).rmdir()
    assert resume(run).rounds_completed == 3  # converted, as before
