"""Issue 15, forty-fourth hostile review, follow-up of the ledger and reports fixes: tests.

1. ``load_runs(D)`` (and ``compare-tuned T --untuned D``) of a folder of runs ``D`` that holds
   a folder of runs named ``runs`` (``D/runs/X``, ``D/runs/Y``) beside a loose run ``D/S``; the
   same for a ``compare`` output ``C`` into which a run was copied (``cp -r R C/R``). Before:
   ``D/runs`` was read as a compare output's runs and ``D/S`` left out without a word (the
   checks of the forty-fourth review's reports 2 and 3 looked only inside ``D/runs``). Now
   ``rundata.load_runs`` refuses ``D/S is a run or holds runs, beside D/runs ...``; a compare
   output holding only ``runs/`` and its report files is read as before.
2. ``load_runs(D)`` of ``D/S`` beside ``D/E/F/S2`` (runs kept by experiment and by date, one
   level deeper than reports 3's ``D/E/S2``). Before: ``D/E``'s runs left out without a word.
   Now ``rundata._holding_runs`` also looks deeper (at most 10,000 directories): ``D/E is a
   folder of runs, not a run of D ...`` (below the first level a run is a directory with a
   ledger, or with ``summary.json`` and ``config.toml``); a subdirectory holding no run (plots,
   another tool's ``summary.json``) is still ignored.
3. ``write_report(out, load_runs(A) + load_runs(B))`` of dp-fedavg runs at σ 0.5 (``secure =
   true``) and σ 1 (seeded): two rows of one strategy. Before (the names of the forty-fourth
   review's reports 4 and 5 are strategies, where a row is a strategy at a σ): ``secure: varies
   (see the runs): false (dp-fedavg); true (dp-fedavg)`` and ``seeded runs: 1 of the 2 private
   runs (secure = false), of dp-fedavg,``: which row depends on a secret seed was not said. Now
   ``report_markdown._row_names`` names a strategy whose runs differ in the value by its rows
   (``false (dp-fedadam, dp-fedavg σ=1); true (dp-fedavg σ=0.5)``, ``of dp-fedadam, dp-fedavg
   σ=1,``); a strategy whose runs agree (a σ grid at one clip norm) is named alone, as before.
4. ``simulate toy.toml --tensorboard --rounds 1 --out R``, then ``--resume R`` with
   ``tensorboard = false`` and 2 rounds in its ``config.toml`` (the forty-fourth review's ledger
   2 case, which purges from round 2), then ``--resume R`` with ``tensorboard = true`` and 3
   rounds. Before: TensorBoard showed rounds 1 and 3, not round 2, which the rows hold (the
   thirty-fifth review's outputs 10 wrote the kept rows only when no event file existed). Now
   ``RunWriter._tensorboard`` starts every log with a purge of every earlier event and writes
   every kept row again: rounds 1-3 shown, with the rows' values.
"""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

import pytest

from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import CONFIG_FILE, METRICS_FILE, read_rows
from fedprivopt.simulation.report import write_report
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.simulation.rundata import load_runs

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = {"population": 12, "task-params.num-users": 12, "num-server-rounds": 1}


def _fake_run(path: Path) -> Path:
    """A directory that ``load_runs`` counts as a finished run (refused before it is read)."""
    path.mkdir(parents=True)
    (path / "summary.json").write_text("{}", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """dp-fedavg at σ 0.5 (secure) and σ 1 (seeded), dp-fedadam at clip 0.3: one round each."""
    root = tmp_path_factory.mktemp("runs")
    a, b, c = root / "A", root / "B", root / "C"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        simulate(load_config(TOY, {**SMALL, "noise-multiplier": 0.5, "secure": True}), a)
        simulate(load_config(TOY, {**SMALL, "noise-multiplier": 1.0}), b)
        simulate(load_config(TOY, {**SMALL, "strategy": "dp-fedadam", "clip-norm": 0.3}), c)
    return a, b, c


def test_1_a_run_beside_a_folder_named_runs_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "D"
    _fake_run(d / "runs" / "X")
    _fake_run(d / "runs" / "Y")
    _fake_run(d / "S")
    with pytest.raises(ValueError, match=r"D/S is a run or holds runs, beside .*D/runs"):
        load_runs(d)
    shutil.rmtree(d / "S")
    _fake_run(d / "old" / "S")  # a folder of runs beside it alike
    with pytest.raises(ValueError, match=r"D/old is a run or holds runs"):
        load_runs(d)


def test_1_a_compare_output_is_read_as_before(tmp_path: Path, two_runs) -> None:
    c = tmp_path / "C"
    (c / "runs").mkdir(parents=True)
    shutil.copytree(two_runs[0], c / "runs" / "A")
    (c / "report.md").write_text("# r\n", encoding="utf-8")
    (c / "compare.lock").touch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert [r.path.name for r in load_runs(c)] == ["A"]
    shutil.copytree(two_runs[1], c / "B")  # cp -r R C/R
    with pytest.raises(ValueError, match=r"C/B is a run or holds runs, beside .*C/runs"):
        load_runs(c)


def test_2_a_folder_of_runs_two_levels_down_is_refused(tmp_path: Path, two_runs) -> None:
    d = tmp_path / "D"
    shutil.copytree(two_runs[0], d / "S")
    (d / "plots" / "png").mkdir(parents=True)  # no run inside: ignored, as before
    (d / "plots" / "png" / "a.png").write_bytes(b"\x89PNG")
    (d / "plots" / "png" / "tool").mkdir()
    (d / "plots" / "png" / "tool" / "summary.json").write_text("{}")  # another tool's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert [r.path.name for r in load_runs(d)] == ["S"]
    (_fake_run(d / "E" / "F" / "S2") / "config.toml").write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=r"D/E is a folder of runs, not a run of"):
        load_runs(d)


def test_3_a_report_names_the_rows_of_one_strategy_at_two_sigmas(tmp_path: Path, two_runs) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = [run for path in two_runs for run in load_runs(path)]
        write_report(tmp_path / "rep", runs, title="t")
    text = (tmp_path / "rep" / "report.md").read_text(encoding="utf-8")
    secure = "- secure: varies (see the runs): false (dp-fedadam, dp-fedavg σ=1); true (dp-"
    assert secure in text
    assert "(secure = false), of dp-fedadam, dp-fedavg σ=1, derive" in text
    # a strategy whose runs agree is named alone (a σ grid at one clip norm)
    assert "- clip-norm: varies (see the runs): 0.3 (dp-fedadam); 1.0 (dp-fedavg)" in text


def test_4_rounds_resumed_without_tensorboard_are_shown_when_it_is_on_again(
    tmp_path: Path,
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "R"
    simulate(load_config(TOY, {**SMALL, "tensorboard": True}), run)

    def resume_with(tensorboard: str, rounds: int) -> None:
        text = (run / CONFIG_FILE).read_text(encoding="utf-8")
        for old, new in (
            (r"tensorboard = \w+", f"tensorboard = {tensorboard}"),
            (r"num-server-rounds = \d+", f"num-server-rounds = {rounds}"),
        ):
            text, n = re.subn(old, new, text)
            assert n == 1
        (run / CONFIG_FILE).write_text(text, encoding="utf-8")
        resume(run)

    resume_with("false", 2)
    resume_with("true", 3)
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    rows = {r["round"]: r["eval_loss"] for r in read_rows(run / METRICS_FILE)}
    assert sorted(rows) == [1, 2, 3]
    assert {e.step: e.value for e in acc.Scalars("eval_loss")} == pytest.approx(rows)
