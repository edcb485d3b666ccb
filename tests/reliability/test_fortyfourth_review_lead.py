"""Forty-fourth review of issue 15: the lead's findings (rows the reviewers left open).

1. ``compare toy.toml --strategies dp-fedavg --rounds 3000 --out C`` running (``tune … --out T``
   alike), then ``deploy local toy.toml --nodes 1 --rounds 1 --out C/x`` or ``--out C/runs/x``
   (the processes reviewer's open row). Before: every check passed and the SuperLink and
   SuperNode started; the deployment's run would land among the cells the comparison was
   making. Now: refused before anything starts, rc 2 and one line naming the comparison and
   its holder's PID (``deploy.out_checks.refuse_inside_writing``, called by
   ``check_out_claimable``, which the command line and ``deploy_local`` share). A finished
   comparison (nobody holds it) is not refused by this check.
2. ``simulate toy.toml --set task=extratask:make``, a task whose model has a module with
   ``get_extra_state()`` returning a dict (the api reviewer's open row; api 4 refused it in the
   trainer, ``initial_flat`` and ``model_spec``). Before: rc 1 and a 20-line traceback
   (``AttributeError: 'dict' object has no attribute 'device'`` from
   ``simulation.run._initial_model``). Now: rc 2 and one line naming the entry
   (``models.task.refuse_tensorless_entries``, called there too).
3. ``fedprivopt.data.write_hdf5("h\\x00.h5", {})`` (the outputs follow-up's open row; input 3
   and outputs 2 fixed ``generate``, ``write_sqlite`` and ``decompress_lzma``). Before:
   ``ValueError: embedded null byte``, naming no parameter. Now: ``path holds a null character``
   (``data.sqlite_files.refuse_null``, called first), nothing written.
4. ``simulate stackoverflow-tp-mini.toml --rounds 1 --set noise-mechanism=tree`` (the privacy
   follow-up's open row on contract 1 and 2). Before: ``summary.json``'s ``not_covered`` ran the
   data-identity and tree clauses together (``...one user's counts)every checkpoint of a tree
   run ...``). Now: joined by ``; `` (``simulation.writer._not_covered``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedprivopt.simulation.rundir import lock_directory

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


@pytest.mark.parametrize("lock", ["compare.lock", "tune.lock"])
@pytest.mark.parametrize("inside", ["x", "runs/x"])
def test_1_deploy_out_inside_a_comparison_being_written_is_refused(tmp_path, lock, inside):
    from fedprivopt.deploy.out_checks import check_out_claimable
    from fedprivopt.simulation.config import load_config

    out = tmp_path / "C"
    (out / "runs").mkdir(parents=True)
    config = load_config(TOY)
    what = "comparison" if lock == "compare.lock" else "tuning"
    with lock_directory(out, lock, what=what):  # compare's or tune's hold (here, this process)
        with pytest.raises(ValueError, match=f"inside the {what} .*process {os.getpid()} is"):
            check_out_claimable(out / inside, config)
        assert not (out / inside).exists()
    check_out_claimable(out / inside, config)  # a finished one: this check passes


def test_1_the_command_line_refuses_it_in_one_line(tmp_path, capsys):
    from fedprivopt.cli import main

    out = tmp_path / "C"
    out.mkdir()
    args = ["deploy", "local", str(TOY), "--nodes", "1", "--rounds", "1", "--out"]
    with lock_directory(out, "compare.lock", what="comparison"):
        code = main([*args, str(out / "x")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "inside the comparison" in err, err
    assert list(out.iterdir()) == [out / "compare.lock"]


def test_2_a_model_with_a_dict_extra_state_is_one_line_from_simulate(tmp_path, capsys):
    import sys

    from fedprivopt.cli import main

    module = tmp_path / "extratask44.py"
    module.write_text(
        "import torch\n"
        "from fedprivopt.models.toy import ToyClassificationTask\n"
        "class Extra(torch.nn.Module):\n"
        "    def __init__(self, inner):\n"
        "        super().__init__()\n"
        "        self.inner = inner\n"
        "    def forward(self, x):\n"
        "        return self.inner(x)\n"
        "    def get_extra_state(self):\n"
        "        return {'version': 2}\n"
        "    def set_extra_state(self, state):\n"
        "        pass\n"
        "class T(ToyClassificationTask):\n"
        "    def build_model(self):\n"
        "        return Extra(super().build_model())\n"
        "def make(**kw):\n"
        "    return T(**kw)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        out = tmp_path / "S"
        args = ["simulate", str(TOY), "--rounds", "1", "--set", "task=extratask44:make"]
        code = main([*args, "--out", str(out), "--quiet"])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("extratask44", None)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "entry '_extra_state' holding a dict" in err, err
    assert "get_extra_state" in err and "Traceback" not in err, err
    assert not out.exists() or not any(out.iterdir())  # nothing left of the refused run


@pytest.mark.parametrize("path", ["h\x00.h5", b"h\x00.h5"])
def test_3_write_hdf5_names_its_path_with_a_null_character(tmp_path, monkeypatch, path):
    from fedprivopt.data import write_hdf5

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^path holds a null character"):
        write_hdf5(path, {})
    assert not any(tmp_path.iterdir())


def test_4_a_tree_run_s_two_checkpoint_clauses_are_separated(tmp_path):
    import json

    from fedprivopt.cli import main

    mini = TOY.with_name("stackoverflow-tp-mini.toml")
    out = tmp_path / "tr"
    args = ["simulate", str(mini), "--rounds", "1", "--set", "noise-mechanism=tree"]
    assert main([*args, "--out", str(out), "--quiet"]) == 0
    text = json.loads((out / "summary.json").read_text())["not_covered"]
    assert "data identity" in text and "live nodes" in text
    assert "counts)every" not in text and "counts); every checkpoint of a tree run" in text


@pytest.mark.parametrize("command", ["compare", "tune"])
def test_5_an_output_moved_while_it_runs_gets_nothing_more(tmp_path, monkeypatch, capsys, command):
    from fedprivopt.cli import main
    from fedprivopt.simulation import cells

    out = tmp_path / "O"
    real = cells.run_cell

    def run_then_move(plan, **kwargs):  # someone moves O and makes a new O after the first run
        real(plan, **kwargs)
        if not (tmp_path / "O.old").exists():
            out.rename(tmp_path / "O.old")
            (out / "runs").mkdir(parents=True)
            (out / "mine.txt").write_text("another's")

    monkeypatch.setattr(cells, "run_cell", run_then_move)
    if command == "compare":
        args = ["compare", str(TOY), "--strategies", "dp-fedavg,fedavg", "--rounds", "1"]
    else:
        args = ["tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "2"]
        args += ["--rounds", "1", "--seed", "3"]
    code = main([*args, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "was moved or replaced while this call held it" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt", "runs"]
    assert not any((out / "runs").iterdir())  # no cell, no trial, no report written there


def test_6_a_tuning_s_privacy_note_says_the_trial_s_checkpoints_are_not_covered(tmp_path):
    import json

    from fedprivopt.cli import main

    out = tmp_path / "T"
    args = ["tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "1"]
    assert main([*args, "--rounds", "1", "--out", str(out), "--quiet"]) == 0
    note = json.loads((out / "summary.json").read_text())["privacy"]
    assert "checkpoint.pt, checkpoint.prev.pt and ledger header" in note, note
    assert "checkpoint.prev.pt and ledger header" in (out / "report.md").read_text()
