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
2. The Python API's ``simulate(config, out, overwrite="False")`` (a flag read from an
   environment variable or a text file) with a finished toy run of 2 rounds in ``out``.
   Before: ``overwrite`` was read by its truth, so the run was replaced by a run of 1 round,
   its ledger of released rounds with it, where ``overwrite=False`` refuses. Now
   ``simulation.rundir`` (``_check_claimable``, behind ``NewRunDir`` and ``check_claimable``)
   refuses an ``overwrite`` that is no bool, naming it; ``np.bool_(True)`` and ``True`` replace
   the run as before.
3. The Python API's ``resume(cell, planned="False")`` on a cell of ``compare simulations/toy.toml
   --strategies dp-fedavg --rounds 1`` whose ``num-server-rounds`` was raised to 2 (and
   ``simulate(..., overwrite=True, planned="False")``). Before: ``planned`` was read by its
   truth, so ``cells.check_not_reported`` was skipped: round 2 was released into the cell
   (epsilon 10.28) while the comparison's ``summary.csv`` and ``report.md`` kept 7.55 and 1
   round. Now ``core.checks.check_flag`` refuses a ``planned`` (and ``overwrite``)
   that is no bool in ``run.simulate`` and ``run.resume``, before anything is read or written.
4. A task of one's own that sets ``data_identity`` as an attribute in ``__init__``
   (``self.data_identity = {"data_sha256": ...}`` of its data file), ``simulate toy.toml --set
   task=mod:make``. Before: read as absent unless callable, so the run's ledger recorded only
   the task module's digest, nothing of the data: after the data file changed, ``--resume``
   and ``compare``'s reuse would go on with rounds released on other data. Now
   ``models.task.data_identity`` refuses a ``data_identity`` that is no method, naming it
   (rc 2, one line from the command line); the method is recorded as before.
5. A ``drive_round`` train callback (adaptive clipping, dp-fedavg) returning a dict subclass
   of its own whose ``clip_bits`` is a method (``def clip_bits(self): return {...}``). Before:
   ``TypeError: 'method' object is not iterable``, naming nothing. Now
   ``strategies.requests.ReportedUpdates`` refuses a ``clip_bits`` that is no mapping, naming
   it (``TypeError``), before anything is summed; a mapping of bits is taken as before.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.models.task import TaskError, data_identity
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_thirtyeighth_review_api import _config

_TASKS = """
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
"""


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


# -- finding 2: overwrite="False" through the Python API ------------------------------------


def test_2_an_overwrite_that_is_no_bool_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])
    out = tmp_path / "run"
    simulate(load_config("simulations/toy.toml", {"num-server-rounds": 2}), out)
    ledger = (out / "privacy_ledger.jsonl").read_bytes()
    one = load_config("simulations/toy.toml", {"num-server-rounds": 1})
    with pytest.raises(ValueError, match=r"overwrite must be True or False, got 'False'"):
        simulate(one, out, overwrite="False")  # before: the 2-round run replaced
    assert (out / "privacy_ledger.jsonl").read_bytes() == ledger
    assert simulate(one, out, overwrite=np.bool_(True)).rounds_completed == 1


# -- finding 3: planned="False" through the Python API --------------------------------------


def test_3_a_planned_that_is_no_bool_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])
    out = tmp_path / "run"
    one = load_config("simulations/toy.toml", {"num-server-rounds": 1})
    simulate(one, out)
    config = out / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 1", "num-server-rounds = 2"))
    ledger = (out / "privacy_ledger.jsonl").read_bytes()
    with pytest.raises(ValueError, match=r"planned must be True or False, got 'False'"):
        resume(out, planned="False")  # before: round 2 released past check_not_reported
    assert (out / "privacy_ledger.jsonl").read_bytes() == ledger
    with pytest.raises(ValueError, match=r"planned must be True or False, got 'no'"):
        simulate(one, tmp_path / "other", overwrite=True, planned="no")
    assert not (tmp_path / "other").exists()


# -- finding 4: data_identity set as an attribute -------------------------------------------


class _DataTask(ToyClassificationTask):
    def __init__(self, **params):
        super().__init__(**params)
        self.data_identity = {"data_sha256": "ab" * 32}  # of its data file


class _MethodDataTask(ToyClassificationTask):
    def data_identity(self):
        return {"data_sha256": "ab" * 32}


def test_4_data_identity_as_an_attribute_is_refused():
    with pytest.raises(TaskError, match=r"_DataTask.data_identity must be a method .* 'dict'"):
        data_identity(_DataTask(num_users=4))  # before: {task_source} alone
    assert data_identity(_MethodDataTask(num_users=4))["data_sha256"] == "ab" * 32


# -- finding 5: clip_bits written as a method -------------------------------------------------


class _BitsMethod(dict):
    def clip_bits(self):
        return dict.fromkeys(self, 1.0)


def test_5_clip_bits_that_is_a_method_is_refused_naming_it():
    config = _config(**{"adaptive-clipping": True, "clip-count-stddev": 1.0})
    alg = build_algorithm(config, torch.zeros(4))
    with pytest.raises(TypeError, match=r"clip_bits must be a mapping .* got method"):
        drive_round(alg, 1, lambda q: _BitsMethod({u: torch.full((4,), 0.1) for u in q.users}))
