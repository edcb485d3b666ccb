"""Issue 15, thirty-fifth hostile review (lifecycle: a run from config to summary, crash, resume).

1. A task of one's own (``task = "mod:factory"``) with a parameter that is an array of inline
   tables, ``simulate toy.toml --set task=m:make --set 'task-params.layers=[{size=10},{size=5}]'
   --out R``: rc 0, but ``R/config.toml`` said ``layers = ["{'size': 10}", "{'size': 5}"]``
   (each table written as Python's text of it), so every later ``simulate --resume R`` (more
   rounds) was refused, rc 2, ``R/config.toml: task-params.layers = [...], but the run's privacy
   ledger records task-params.layers = [{"size": 10}, ...]: resuming with a different
   configuration ... is refused``: a file the user never edited blamed, and the run could not be
   continued. ``files.toml_value`` now writes a mapping as an inline table (``{size = 10}``, at
   any depth), so ``config.toml`` reads back as the configuration that ran; the resume goes on.
2. A secure run (``secure = true``, ``eval-every = 3``, ``target-epsilon`` = the ε of 5 rounds)
   killed after round 5's ledger line, its newest checkpoint of round 4 (``metrics.jsonl``:
   round 3's row), then ``simulate --resume``: rightly stopped at round 4 (``budget``: round 5
   stays charged and its redo would exceed the target), but said ``4 rounds (budget),
   eval_accuracy = 0.6833`` and ``summary.json``'s ``final`` was round 3's row: the metrics of an
   earlier model reported as those of the 4-round model (a resume that releases no round
   evaluated nothing). The last released model is now evaluated when no row holds its round
   (a row of that round, with the ε the ledger composes), so the summary, the line and reports
   describe the model the run ends with (``run._evaluate_last_round``).
3. SIGTERM (or Ctrl-C, SIGHUP) while the final checkpoint or ``summary.json`` was written, or
   while ``--resume`` audited and prepared the directory: rc 143 with ``fedprivopt simulate:
   interrupted`` alone, where an interruption during the rounds says ``the run can be continued
   with --resume R`` (every round was kept, and ``--resume`` finishes the run). The
   interruption now names the run directory wherever it comes once the directory is claimed
   (``run._naming_the_run``), so the line says so; a start interrupted before its first
   released round says that nothing was kept.
4. ``simulate --resume R`` where ``R/config.toml`` is a directory or a dangling symbolic link
   said ``--resume directory 'R' has no config.toml`` (``ls`` shows one), and ``--resume X`` of
   a path that does not exist said the same of it; a file ``F``: ``argument --resume:
   F/config.toml: Not a directory``. Each now says what it is (rc 2, one line).
5. One key reached through two spellings with different values: a preset with the quoted key
   ``"task-params.seed" = 5`` beside ``[task-params] seed = 0`` (TOML reads the quoted key as
   one key; also ``task-params = {seed = 3}`` beside ``"task-params.seed" = 4``, and
   ``"strategies.dp-fedavg.clip-norm" = 0.5`` beside its table's 2.0), or ``--set
   strategies.dp-fedavg.noise-multiplier=50 --set 'strategies={dp-fedavg={noise-multiplier=0.5}}'``:
   rc 0, the last spelling silently won (σ 0.5 where the first asked for 50), where ``--set`` of
   one key twice is refused (eighth review). Now rc 2, one line naming the key and both values
   (and the preset), before anything is written; equal values pass (``config._flatten``).
"""

from __future__ import annotations

import json
import shutil
import signal
import sys

import pytest

from fedprivopt.cli import main
from fedprivopt.privacy.flat import flatten, unflatten
from fedprivopt.simulation import interrupt
from fedprivopt.simulation import run as run_module
from fedprivopt.simulation.checkpoint import load_checkpoint
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import (
    CHECKPOINT,
    CONFIG_FILE,
    METRICS_FILE,
    PREVIOUS_CHECKPOINT,
    SUMMARY_FILE,
    read_rows,
    toml_value,
)
from fedprivopt.simulation.run import build_run, simulate
from fedprivopt.simulation.writer import RunWriter
from tests.reliability.test_ledger import _set
from tests.reliability.test_thirtyfourth_review_tasks import OwnTask
from tests.simulation.test_run import PRESET, small_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def layered_task(num_users: int = 6, **params):
    """A factory taking any parameter (``**params``), as a user's own may."""
    return OwnTask(num_users=num_users)


def _lines(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


# -- 1: an array of inline tables as a task parameter ----------------------------------------------
@pytest.mark.parametrize(
    "value",
    [
        [{"size": 10}, {"size": 5}],
        [{"k y": {"z": [1, {}]}, "ü": 'a"b'}],
        {"inner": {"deeper": [1.5, "x"]}},
    ],
)
def test_1_toml_value_writes_a_mapping_as_an_inline_table(value):
    assert tomllib.loads(f"v = {toml_value(value)}")["v"] == value  # was: Python's text of it


def test_1_a_run_with_inline_tables_in_a_task_parameter_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    task = f"task={__name__}:layered_task"
    rc = main(["simulate", str(PRESET), "--rounds", "1", "--quiet", "--out", str(out),
               "--set", task, "--set", "population=6", "--set", "clients-per-round=4",
               "--set", "task-params={num-users=6}",
               "--set", "task-params.layers=[{size=10},{size=5}]"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    config = load_config(out / CONFIG_FILE)
    assert config.task_params["layers"] == [{"size": 10}, {"size": 5}]  # was: two strings
    _set(out, "num-server-rounds", "2")
    capsys.readouterr()
    # was: rc 2, "R/config.toml: task-params.layers = [...], but the run's privacy ledger records"
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 0, _lines(capsys)
    assert json.loads((out / SUMMARY_FILE).read_text())["rounds_completed"] == 2


# -- 2: a resume that releases no round ends at a round no row describes ---------------------------
def test_2_a_resume_stopped_at_once_by_its_budget_reports_its_last_model(tmp_path, capsys):
    five = simulate(small_config(**{"num-server-rounds": 5}), tmp_path / "five").epsilon
    config = small_config(**{"secure": True, "eval-every": 3, "target-epsilon": five})
    ref = simulate(config, tmp_path / "ref").out_dir  # stops at round 5, its budget
    assert [r["round"] for r in read_rows(ref / METRICS_FILE)] == [3, 5]
    killed = tmp_path / "killed"  # as killed after round 5's ledger line: checkpoint of round 4
    shutil.copytree(ref, killed)
    (killed / PREVIOUS_CHECKPOINT).unlink()
    (killed / SUMMARY_FILE).unlink()
    rows = [r for r in read_rows(killed / METRICS_FILE) if r["round"] <= 4]
    (killed / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    state = load_checkpoint(killed)
    assert state["algorithm"]["round"] == 5
    (killed / CHECKPOINT).unlink()
    shutil.copy(ref / PREVIOUS_CHECKPOINT, killed / CHECKPOINT)
    restored = load_checkpoint(killed)["algorithm"]
    assert restored["round"] == 4

    assert main(["simulate", "--resume", str(killed), "--quiet"]) == 0
    out = capsys.readouterr().out
    rows = read_rows(killed / METRICS_FILE)
    assert [r["round"] for r in rows] == [3, 4]  # was: [3], round 3's metrics reported as final
    summary = json.loads((killed / SUMMARY_FILE).read_text())
    assert (summary["rounds_completed"], summary["stopped_reason"]) == (4, "budget")
    assert summary["epsilon"] == rows[-1]["epsilon"] == five  # round 5 stays charged
    assert summary["final"] == {k: v for k, v in rows[-1].items() if k.startswith("eval_")}
    task, _ = build_run(config)  # the evaluation of the round-4 model itself
    model = task.build_model()
    model.load_state_dict(unflatten(restored["params"], flatten(model.state_dict())[1]))
    expected = task.evaluate(model)
    assert summary["final"]["eval_accuracy"] == expected["accuracy"]
    assert out.startswith(f"4 rounds (budget), eval_accuracy = {expected['accuracy']:.4f}")


# -- 3: an interruption after the rounds, or while a resume prepares the directory -----------------
def _interrupting(monkeypatch, owner, name: str, signum: int) -> None:
    """``owner.name`` raising what the program's handler raises for ``signum``, once."""
    original = getattr(owner, name)
    calls = []

    def raising(*args, **kwargs):
        if not calls:
            calls.append(1)
            raise interrupt.Interrupted(signum)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, raising)


@pytest.mark.parametrize(
    ("owner", "name", "signum"),
    [
        (RunWriter, "write_summary", signal.SIGTERM),
        (RunWriter, "save_checkpoint", signal.SIGHUP),  # the final one: 3 % checkpoint-every 2
    ],
)
def test_3_an_interruption_after_the_rounds_says_the_run_continues(
    tmp_path, capsys, monkeypatch, owner, name, signum
):
    out = tmp_path / "run"
    args = ["--set", "checkpoint-every=2"] if name == "save_checkpoint" else []
    if name == "save_checkpoint":  # the rounds' checkpoints pass; the one after them is hit
        original = RunWriter.save_checkpoint

        def after_rounds(self):
            if self.algorithm.round_num == 3 and self.algorithm.stopped_reason is not None:
                raise interrupt.Interrupted(signum)
            return original(self)

        monkeypatch.setattr(RunWriter, name, after_rounds)
    else:
        _interrupting(monkeypatch, owner, name, signum)
    rc = main(["simulate", str(PRESET), "--rounds", "3", "--quiet", "--out", str(out), *args])
    assert rc == 128 + signum
    (line,) = _lines(capsys)  # was: "fedprivopt simulate: interrupted" alone
    assert line == f"fedprivopt simulate: interrupted; the run can be continued with --resume {out}"
    assert not (out / SUMMARY_FILE).exists()
    monkeypatch.undo()
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 0
    assert json.loads((out / SUMMARY_FILE).read_text())["rounds_completed"] == 3


def test_3_an_interruption_while_a_resume_prepares_says_the_run_continues(
    tmp_path, capsys, monkeypatch
):
    out = simulate(small_config(**{"num-server-rounds": 1}), tmp_path / "run").out_dir
    _set(out, "num-server-rounds", "2")
    _interrupting(monkeypatch, run_module, "audit_run_dir", signal.SIGINT)
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 130
    (line,) = _lines(capsys)  # was: "fedprivopt simulate: interrupted" alone
    assert line.endswith(f"interrupted; the run can be continued with --resume {out}")


def test_3_a_start_interrupted_before_its_first_round_says_nothing_was_kept(
    tmp_path, capsys, monkeypatch
):
    out = tmp_path / "run"
    _interrupting(monkeypatch, run_module, "start_run_files", signal.SIGTERM)
    assert main(["simulate", str(PRESET), "--rounds", "1", "--quiet", "--out", str(out)]) == 143
    (line,) = _lines(capsys)
    assert line == "fedprivopt simulate: interrupted before it released a round; nothing was kept"
    assert not out.exists()


# -- 4: what --resume finds in place of a run directory's config.toml ------------------------------
@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda d: None, "--resume directory '{d}' does not exist"),
        (lambda d: d.write_text("x"), "--resume directory '{d}' is not a directory"),
        (
            lambda d: (d / CONFIG_FILE).mkdir(parents=True),
            "--resume directory '{d}': its config.toml is a directory, not the run's",
        ),
        (
            lambda d: d.mkdir() or (d / CONFIG_FILE).symlink_to(d / "gone.toml"),
            "--resume directory '{d}': its config.toml is a symbolic link to '{d}/gone.toml', "
            "which does not exist",
        ),
    ],
)
def test_4_resume_says_what_stands_in_place_of_config_toml(tmp_path, capsys, make, said):
    out = tmp_path / "run"
    make(out)
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 2
    (line,) = _lines(capsys)  # was: "has no config.toml" (or "Not a directory")
    assert said.format(d=out) in line


# -- 5: one key in two spellings -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("preset", "key", "values"),
    [
        ('"task-params.seed" = 5\n[task-params]\nseed = 0\n', "task-params.seed", "5 and 0"),
        ('task-params = {seed = 3}\n"task-params.seed" = 4\n', "task-params.seed", "3 and 4"),
        (
            '"strategies.dp-fedavg.clip-norm" = 0.5\n[strategies.dp-fedavg]\nclip-norm = 2.0\n',
            "strategies.dp-fedavg.clip-norm",
            "0.5 and 2.0",
        ),
    ],
)
def test_5_a_preset_giving_a_key_twice_is_refused(tmp_path, capsys, preset, key, values):
    path = tmp_path / "p.toml"
    path.write_text("population = 20\n" + preset)  # the toy task's 20 users by default
    out = tmp_path / "run"
    assert main(["simulate", str(path), "--rounds", "1", "--quiet", "--out", str(out)]) == 2
    (line,) = _lines(capsys)  # was: rc 0, the last spelling used
    # the preset's path is cut in the middle where it is long (a pytest-xdist worker's tmp_path)
    assert "p.toml': " in line and f": {key} is given twice, as {values}" in line
    assert not out.exists()


def test_5_set_giving_a_key_in_two_spellings_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["simulate", str(PRESET), "--rounds", "1", "--quiet", "--out", str(out),
               "--set", "strategies.dp-fedavg.noise-multiplier=50",
               "--set", "strategies={dp-fedavg={noise-multiplier=0.5}}"])  # fmt: skip
    assert rc == 2  # was: rc 0 at sigma 0.5
    (line,) = _lines(capsys)
    assert "strategies.dp-fedavg.noise-multiplier is given twice, as 50 and 0.5" in line
    assert not out.exists()
    rc = main(["simulate", str(PRESET), "--rounds", "1", "--quiet", "--out", str(out),
               "--set", "task-params.seed=0", "--set", "task-params={seed=0}"])  # fmt: skip
    assert rc == 0, _lines(capsys)  # the same value twice passes
