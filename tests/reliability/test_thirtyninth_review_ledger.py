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
"""

from __future__ import annotations

import json
import shutil

from fedprivopt.cli import main
from fedprivopt.simulation.files import CHECKPOINT, LEDGER_FILE, PREVIOUS_CHECKPOINT, read_rows
from fedprivopt.simulation.run import simulate
from tests.simulation.test_run import small_config

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
