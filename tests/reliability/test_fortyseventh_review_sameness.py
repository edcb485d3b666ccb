"""Issue 15, forty-seventh hostile review (sameness: what counts as the same config or file).

1. A task by reference whose module is imported from a zip archive (``PYTHONPATH=tasks.zip
   fedprivopt simulate toy.toml --set task=mymod47:make``, ``make`` building the toy task with
   its own data seed 3). Before: ``models.task._task_source`` read ``__file__``
   (``tasks.zip/mymod47.py``) from the file system, failed, and skipped the module: the ledger
   header recorded no ``data`` (its ``records`` still said ``task_source``), so after the
   module was edited (seed 3 to 4) ``simulate --resume R`` ran rounds 3-4 on other data, rc 0
   (eval accuracy 0.6467 at round 2, 0.5300 at round 3). Now the module's loader reads the
   source (``get_data``, as ``zipimport`` does) and the digest is recorded; a source neither the
   file system nor the loader can read is refused naming it (``TaskError``), not skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import types
import zipfile
from pathlib import Path

import pytest

from fedprivopt.cli_args import UsageError
from fedprivopt.cli_runs import set_overrides
from fedprivopt.models.task import TASK_SOURCE, TaskError, data_identity

_MODULE = """from fedprivopt.models.toy import ToyClassificationTask
SEED = {seed}
def make(**p):
    p["seed"] = SEED
    return ToyClassificationTask(**p)
"""


def _zipped_task(tmp_path, name, seed):
    """The task ``name.make`` builds, its module imported from a zip archive, and its source."""
    from fedprivopt.models.task import note_factory

    archive = tmp_path / f"tasks{seed}.zip"
    source = _MODULE.format(seed=seed).encode()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr(f"{name}.py", source)
    sys.modules.pop(name, None)
    sys.path.insert(0, str(archive))
    try:
        module = __import__(name)
    finally:
        sys.path.remove(str(archive))
    assert module.__file__.startswith(str(archive))  # tasks3.zip/name.py: no file of its own
    task = module.make(num_users=4)
    note_factory(task, name)  # as build_task notes a task by reference's factory
    return task, source


def test_1_a_task_module_in_a_zip_archive_records_its_source_digest(tmp_path):
    name = "sameness47_zipped"
    try:
        task, source = _zipped_task(tmp_path, name, 3)
        identity = data_identity(task)
        assert identity is not None and TASK_SOURCE in identity  # was None: nothing recorded
        assert identity[TASK_SOURCE]["module"] == name
        assert identity[TASK_SOURCE]["sha256"] == hashlib.sha256(source).hexdigest()
        edited, _ = _zipped_task(tmp_path, name, 4)
        assert data_identity(edited)[TASK_SOURCE]["sha256"] != identity[TASK_SOURCE]["sha256"]
    finally:
        sys.modules.pop(name, None)


def test_1_a_task_module_whose_source_cannot_be_read_is_refused_not_skipped(tmp_path):
    name = "sameness47_unreadable"
    try:
        task, _ = _zipped_task(tmp_path, name, 3)
        gone = types.ModuleType(name)
        gone.__file__ = str(tmp_path / "moved" / f"{name}.py")  # moved away after its import
        gone.__loader__ = None
        sys.modules[name] = gone
        with pytest.raises(TaskError, match=f"the source of task module {name} .* cannot be read"):
            data_identity(task)
    finally:
        sys.modules.pop(name, None)


@pytest.mark.parametrize(
    "sets",
    [
        ["strategies.dp-fedavg={seed=true}", "strategies.dp-fedavg={seed=1}"],
        ["task-params={seed=1}", "task-params={seed=true}"],
        ["task-params.sizes=[true, 2]", "task-params.sizes=[1, 2]"],
        ["task-params={a={b=[1]}}", "task-params={a={b=[true]}}"],
    ],
)
def test_2_a_boolean_beside_a_number_inside_set_tables_is_a_contradiction(sets):
    with pytest.raises(UsageError, match="contradicts an earlier --set"):
        set_overrides(argparse.Namespace(set=sets))


def test_2_set_tables_of_other_keys_or_equal_values_still_merge():
    sets = ["task-params={seed=1}", "task-params={num-users=40}", "task-params={seed=1}"]
    assert set_overrides(argparse.Namespace(set=sets)) == {
        "task-params": {"seed": 1, "num-users": 40}
    }
    same = ["clip-norm=1", "clip-norm=1.0", "task-params.x=[1, 2]", "task-params.x=[1, 2]"]
    assert set_overrides(argparse.Namespace(set=same)) == {
        "clip-norm": 1.0,
        "task-params.x": [1, 2],
    }


def test_2_deploy_local_alike():
    from fedprivopt.deploy.cli import _overrides

    with pytest.raises(ValueError, match="contradicts an earlier --set"):
        _overrides(["strategies.dp-fedavg={seed=true}", "strategies.dp-fedavg={seed=1}"])
    assert _overrides(["task-params={seed=1}", "task-params={seed=1}"]) == {
        "task-params": {"seed": 1}
    }


def test_3_a_task_without_identity_where_the_ledger_records_one_is_refused(tmp_path):
    from fedprivopt.simulation.ledger_checks import LedgerChecks

    ledger = LedgerChecks()
    ledger.path = tmp_path / "privacy_ledger.jsonl"
    ledger.header = {
        "records": ["data", "task-params", "task_source"],
        "data": {TASK_SOURCE: {"module": "mymod48", "sha256": "c9" * 32}},
    }
    with pytest.raises(ValueError, match=r"records the task's data and code \(task_source\), but"):
        ledger.check_data(None, "R/config.toml")
    ledger.header = {}  # a ledger of a version before data was recorded, a task without one
    ledger.check_data(None, "R/config.toml")


def test_4_a_data_identity_with_keys_of_two_types_is_compared_not_a_traceback(tmp_path):
    from fedprivopt.simulation.ledger_checks import LedgerChecks
    from fedprivopt.simulation.ledger_lines import canonical

    mine = {"counts": {1: 5, "total": 5}}
    assert canonical(mine) == canonical({"counts": {"1": 5, "total": 5}})  # was TypeError
    ledger = LedgerChecks()
    ledger.path = tmp_path / "privacy_ledger.jsonl"
    ledger.header = {"records": ["data"], "data": {"counts": {"1": 5, "total": 5}}}  # as read
    ledger.check_data(mine, "R/config.toml")
    with pytest.raises(ValueError, match="holds other data than the run was started on"):
        ledger.check_data({"counts": {1: 6, "total": 6}}, "R/config.toml")


def test_5_round_timeout_as_an_integer_is_the_same_setting():
    from fedprivopt.simulation.cell_plans import first_difference
    from fedprivopt.simulation.config import load_config

    toy = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
    given = load_config(toy, {"round-timeout": 3600})
    assert first_difference(load_config(toy), given) is None  # was round-timeout 3600.0, 3600
    assert type(given.round_timeout) is float


@pytest.mark.parametrize(
    ("stored", "wanted"),
    [([{"flag": True}], [{"flag": 1}]), ([{"w": 1}], [{"w": 1.0}]), ([{"a": 1}], [{"b": 1}])],
)
def test_6_a_table_inside_an_array_is_compared_entry_by_entry(stored, wanted):
    from fedprivopt.simulation.cell_plans import first_difference
    from fedprivopt.simulation.config import load_config

    toy = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
    a = load_config(toy, {"task-params.opts": stored})
    b = load_config(toy, {"task-params.opts": wanted})
    assert first_difference(a, b) == ("task-params.opts", stored, wanted)  # was None: reused
    assert first_difference(a, load_config(toy, {"task-params.opts": stored})) is None
