"""Issue 15, forty-sixth hostile review (flags: what a user's object says decides a path): tests.

1. A task of one's own (by reference) whose ``private_evaluation_users`` is written as an
   attribute, not a method (``private_evaluation_users = (40, 40)``: all 40 evaluation users are
   training users), ``fedprivopt tune simulations/toy.toml --set task=mod:factory --grid
   clip-norm=0.5,1.0 --mean-trials 1 --rounds 1``. Before: it was read as absent (only a
   callable one is asked), so the tuning ran with rc 0 and released the trial selected on 40
   private users' data without ``--selection-on-private-users`` (the report: not checked), where
   the method returning the same ``(40, 40)`` is refused (rc 2). Now
   ``simulation.tune_notes.selection_users`` refuses an attribute that is no method, naming it
   (rc 2, one line); the method is refused as before.
"""

from __future__ import annotations

import pytest

from fedprivopt.cli import main

_TASKS = '''
from fedprivopt.models.toy import ToyClassificationTask


class AttrTask(ToyClassificationTask):
    private_evaluation_users = (40, 40)


class MethodTask(ToyClassificationTask):
    def private_evaluation_users(self):
        return (40, 40)


def attr(**params):
    return AttrTask(**params)


def method(**params):
    return MethodTask(**params)
'''


@pytest.fixture
def task_module(tmp_path, monkeypatch):
    """A module of one's own holding the two tasks, importable under a name of this test."""
    name = f"flags46_tasks_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(_TASKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _tune(tmp_path, task, out):
    argv = [
        "tune", "simulations/toy.toml", "--set", f"task={task}", "--grid",
        "clip-norm=0.5,1.0", "--mean-trials", "1", "--seed", "1", "--rounds", "1",
        "--out", str(tmp_path / out), "--quiet",
    ]  # fmt: skip
    return main(argv)


# -- finding 1: private_evaluation_users written as an attribute -----------------------------


def test_1_private_evaluation_users_as_an_attribute_is_refused(
    tmp_path, task_module, capsys, monkeypatch
):
    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])
    assert _tune(tmp_path, f"{task_module}:attr", "attr") == 2  # 0 before: tuned, selected
    err = capsys.readouterr().err.strip()
    assert "AttrTask.private_evaluation_users must be a method" in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "attr" / "summary.json").exists()
    assert _tune(tmp_path, f"{task_module}:method", "method") == 2  # as before
    assert "40 of the task's 40 evaluation users" in capsys.readouterr().err
