"""Issue 15, thirty-ninth hostile review, the ledger: regression tests of its findings.

1. A seeded tree run (``tree-restart-rounds = 3``, 5 rounds) killed after round 5 with its
   newest checkpoint of round 4 (the first round of the second restart period), its
   ``privacy_ledger.jsonl`` lost, then ``simulate --resume``: the ledger rebuilt from the
   checkpoint (``RunLedger.convert``) charged round 5, inside the period whose event the
   checkpoint's accountant already held, a whole period's event (ε 31.57 where the run had
   spent 23.82, the uninterrupted run's), and the next ``--resume`` (rounds raised to 7) was
   refused, rc 2: ``line 3: round 5 released count=1, but config.toml makes a round release
   count=0 … the ledger or the configuration was edited``, a run the tool itself had rebuilt
   that could not be finished. Now a rebuilt ledger charges each round after the checkpoint
   what that round releases (a tree period's event at its first round only,
   ``ledger_convert._released_by``): ε 23.82, and the run is resumed again to 7 rounds (ε
   31.57, three periods).
2. A run (``eval-every = 5``, 5 rounds: one metrics row, round 5's, ε 17.27) killed with its
   newest checkpoint of round 3, the checkpoint's events and configuration set to σ 50 (digest
   recomputed with ``state_digest``), ``noise-multiplier = 50`` in ``config.toml`` and the
   ledger deleted, then ``simulate --resume``: the rebuilt ledger was checked only against
   the rows of rounds up to the checkpoint (``check_carried``; there were none), so the run
   resumed, rc 0, ε 0.0466 in its new summary, and the resume dropped the row that had
   reported 17.27 (also with ``summary.json`` kept, which stated 17.27 too, or only it). Now
   the ledger a resume would rebuild is composed first and refused when it composes to less
   than any ε the rows or the summary reported (``LedgerConversion.check_rebuilt``, from
   ``audit_run_dir`` and ``convert``): exit 2, one line naming the checkpoint and the row,
   nothing written.
3. Python API: ``load_run(R)`` (what ``write_report(out, load_runs(root))`` reads) of a run
   whose ledger's line of round 2 was edited to a fixed-size event (``sampling = "fixed"``,
   ``cohort_size`` 4, its rate unchanged) beside round 1's Poisson one: each line was checked
   alone, so the file was read, and composing it ended in ``ValueError: cannot compose
   Poisson and fixed-size events (or tree events with either) in one ledger``, naming no file
   (``--resume`` and ``compare`` refuse the line, through ``check_algorithm``). Now
   ``ledger_lines.parse_lines`` refuses a line whose events cannot be composed with an earlier
   line's: ``…/privacy_ledger.jsonl: line 3: its events cannot be composed with those of line
   2 …``.
4. A seeded tree toy run (``tree-restart-rounds = 3``, 2 rounds: a restart period half done)
   whose ledger header lost ``settings["task-params"]`` (the form of a header written before
   task parameters were recorded), then ``task-params.seed`` changed in ``config.toml`` and
   the rounds raised, ``simulate --resume``: the check of the task parameters was off, and the
   period ran on with its users' indices holding other examples than in its first rounds
   (rc 0). Every version that writes a tree round's participants (or a partial line, or the
   task's data identity) records the task parameters, so such a header beside those lines was
   edited: ``LedgerChecks._refuse_lost`` refuses it, exit 2, one line naming the header.
5. The same with the header's ``data`` deleted (the task's data identity, here the digest of
   a task module's source: ``task = "mod:make"``), then the module edited (its data seed 3 to
   4): ``check_data`` took the header as one written before data was recorded (rc 0). Now
   refused as in 4 (``LedgerChecks._refuse_lost``, from ``check_data``).
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.simulation.checkpoint import state_digest
from fedprivopt.simulation.files import CHECKPOINT, LEDGER_FILE, PREVIOUS_CHECKPOINT, read_rows
from fedprivopt.simulation.run import simulate
from fedprivopt.simulation.rundata import load_run
from tests.reliability.test_ledger import kept_files
from tests.simulation.test_run import small_config

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
TREE3 = {"noise-mechanism": "tree", "tree-restart-rounds": 3, "checkpoint-every": 100}


# -- 1: a tree run's rebuilt ledger charges a period's event once ---------------------------------
def test_1_a_rebuilt_tree_ledger_charges_each_round_what_it_released(tmp_path, capsys):
    four = simulate(small_config(**TREE3, **{"num-server-rounds": 4}), tmp_path / "r4").out_dir
    five = simulate(small_config(**TREE3, **{"num-server-rounds": 5}), tmp_path / "r5").out_dir
    spent = json.loads((five / "summary.json").read_text())["epsilon"]
    run = tmp_path / "run"  # round 5 released, newest checkpoint of round 4, the ledger lost
    shutil.copytree(five, run)
    for name in (CHECKPOINT, PREVIOUS_CHECKPOINT):
        shutil.copy(four / name, run / name)
    (run / LEDGER_FILE).unlink()
    (run / "summary.json").unlink()
    assert main(["simulate", "--resume", str(run), "--quiet"]) == 0
    lines = read_rows(run / LEDGER_FILE)[1:]
    assert [(x["kind"], x["round"], x["events"]) for x in lines] == [
        ("carried", 4, 2),
        ("round", 5, 2),  # was 3: a second event of the period that round 4 had opened
        ("round", 5, 2),
    ]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epsilon"] == spent  # was 31.57 against 23.82
    config = (run / "config.toml").read_text()
    (run / "config.toml").write_text(
        config.replace("num-server-rounds = 5", "num-server-rounds = 7")
    )
    capsys.readouterr()
    rc = main(["simulate", "--resume", str(run), "--quiet"])
    assert rc == 0, capsys.readouterr().err  # was 2: "line 3: round 5 released count=1, …"
    seven = json.loads((run / "summary.json").read_text())
    assert seven["rounds_completed"] == 7 and seven["epsilon"] > spent
    assert read_rows(run / LEDGER_FILE)[-1]["events"] == 3  # periods 1, 2 and 3 (rounds 7-9)


# -- 2: a rebuilt ledger composing to less than the rows or the summary reported ------------------
@pytest.mark.parametrize("kept", ["rows", "rows-and-summary", "summary"])
def test_2_a_rebuilt_ledger_below_a_reported_epsilon_is_refused(tmp_path, capsys, kept):
    every = {"checkpoint-every": 100, "eval-every": 5}
    three = simulate(small_config(**every, **{"num-server-rounds": 3}), tmp_path / "r3").out_dir
    five = simulate(small_config(**every, **{"num-server-rounds": 5}), tmp_path / "r5").out_dir
    assert [row["round"] for row in read_rows(five / "metrics.jsonl")] == [5]
    run = tmp_path / "run"
    shutil.copytree(five, run)
    for name in (CHECKPOINT, PREVIOUS_CHECKPOINT):
        state = torch.load(three / name, weights_only=True)
        algorithm = state["algorithm"]
        for item in algorithm["accountant"]["ledger"]:
            item["event"]["noise_multiplier"] = 50.0
        algorithm["config"]["noise-multiplier"] = 50.0
        del state["sha256"]
        state["sha256"] = state_digest(state)
        torch.save(state, run / name)
    config = (run / "config.toml").read_text()
    assert "noise-multiplier = 0.5" in config
    (run / "config.toml").write_text(
        config.replace("noise-multiplier = 0.5", "noise-multiplier = 50.0")
    )
    (run / LEDGER_FILE).unlink()
    if kept == "rows":
        (run / "summary.json").unlink()
    if kept == "summary":
        (run / "metrics.jsonl").write_text("")
    files = kept_files(run)
    capsys.readouterr()
    rc = main(["simulate", "--resume", str(run), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, err  # was 0: epsilon 0.0466 where round 5's row said 17.27
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "checkpoint.pt and the rounds released after it rebuild a privacy ledger" in err
    where = "summary.json" if kept == "summary" else "metrics.jsonl (round 5)"
    assert f"but {where} reported epsilon 17.27" in err
    assert kept_files(run) == files
    if kept != "summary":
        assert [row["round"] for row in read_rows(run / "metrics.jsonl")] == [5]  # was dropped


# -- 3: ledger lines whose events cannot be composed together ------------------------------------
def test_3_lines_of_events_that_cannot_be_composed_are_refused_naming_the_line(tmp_path):
    run = simulate(small_config(**{"num-server-rounds": 2}), tmp_path / "run").out_dir
    path = run / LEDGER_FILE
    lines = path.read_text().splitlines()
    line = json.loads(lines[2])
    line["released"][0]["event"].update(sampling="fixed", cohort_size=4)
    path.write_text("\n".join([*lines[:2], json.dumps(line)]) + "\n")
    with pytest.raises(ValueError) as refused:
        load_run(run)  # was: "cannot compose Poisson and fixed-size events …", no file named
    assert str(refused.value).startswith(f"{path}: line 3: its events cannot be composed with")


# -- 4: a header whose task-params were removed ---------------------------------------------------
def test_4_a_header_that_lost_its_task_params_beside_later_lines_is_refused(tmp_path, capsys):
    run = simulate(small_config(**TREE3, **{"num-server-rounds": 2}), tmp_path / "run").out_dir
    path = run / LEDGER_FILE
    lines = path.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    del header["settings"]["task-params"]
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    config = (run / "config.toml").read_text()
    assert "num-server-rounds = 2" in config and "\nseed = 0\n" in config.split("[task-params]")[1]
    head, task = config.split("[task-params]")
    head = head.replace("num-server-rounds = 2", "num-server-rounds = 3")
    (run / "config.toml").write_text(head + "[task-params]" + task.replace("seed = 0", "seed = 1"))
    files = kept_files(run)
    capsys.readouterr()
    rc = main(["simulate", "--resume", str(run), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, err  # was 0: round 3 of the period on other data
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{path}: line 1: its header lacks settings.task-params, but line 2 records" in err
    assert kept_files(run) == files


# -- 5: a header whose data identity was removed --------------------------------------------------
WRAP = """
    from fedprivopt.models.toy import ToyClassificationTask

    def make(num_users=40, seed=0):
        return ToyClassificationTask(num_users=num_users, dim=4, seed={seed})
"""


def test_5_a_header_that_lost_its_data_beside_later_lines_is_refused(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "modules"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    module = folder / "review39_wrap.py"
    module.write_text(textwrap.dedent(WRAP.format(seed=3)))
    run = tmp_path / "run"
    tree = ["--set", "noise-mechanism=tree", "--set", "tree-restart-rounds=3"]
    args = ["simulate", str(TOY), "--rounds", "2", "--out", str(run), "--quiet", *tree]
    try:
        assert main([*args, "--set", "task=review39_wrap:make"]) == 0
        path = run / LEDGER_FILE
        lines = path.read_text().splitlines(keepends=True)
        header = json.loads(lines[0])
        assert "task_source" in header.pop("data")
        path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
        config = run / "config.toml"
        config.write_text(
            config.read_text().replace("num-server-rounds = 2", "num-server-rounds = 3")
        )
        module.write_text(textwrap.dedent(WRAP.format(seed=4)))
        sys.modules.pop("review39_wrap", None)
        files = kept_files(run)
        capsys.readouterr()
        rc = main(["simulate", "--resume", str(run), "--quiet"])
    finally:
        sys.modules.pop("review39_wrap", None)
    err = capsys.readouterr().err
    assert rc == 2, err  # was 0: round 3 of the period on the edited module's data
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{path}: line 1: its header lacks data, but line 2 records a tree round's" in err
    assert kept_files(run) == files
