"""Issue 15, forty-eighth hostile review (compare: a cell's run reused only when it is the cell's).

1. (The forty-seventh review's open row sameness 8.) ``compare toy.toml --strategies dp-fedavg
   --rounds 1 --out C``, then the same with ``--set task-params.heterogeneity=0.5`` (the toy
   task's default), or a cell whose ``task-params.data-dir`` is spelled otherwise (``/tmp/D``,
   ``/tmp/x/../D``) or names a copy of the same data. Before: rc 2, ``holds a run made with
   task-params.heterogeneity = (not set), this call asks for 0.5 ...; pass --overwrite to rerun
   it``, an advice that releases the cell's rounds again. Now ``cell_plans.cell_difference``
   takes a parameter at the task factory's default as not set, and where the task identifies
   its data leaves the data's place to the audit, which compares the data identity with the
   ledger's, as ``--resume`` does; other data, another value, or a task without a data
   identity are refused as before, and ``first_difference`` alone (``tune``'s base check,
   ``compare-tuned``) is unchanged.
2. (The forty-seventh review's open row sameness 7.) ``tune toy.toml --grid
   server-learning-rate=1,2 --mean-trials 1 --rounds 1 --seed 1 --out T``, then the same with
   ``--grid server-learning-rate=1.0,2.0``. Before: rc 2, ``holds a tuning of another plan
   (--grid differs ...)`` though every trial's configuration is the same. Now
   ``tune_replan.stored_grid`` compares the grids value by value through the configurations
   they make, and a grid that makes the same trials takes the stored grid's spelling, so
   ``tune.json`` and the plan digest the trials' ledgers record stay as they were.
3. The report of compare 1's reused cell beside new ones warned "the runs differ in their task
   settings: task-params.heterogeneity (0.5, null)"; now filled at the task's default, and the
   data's place left to the ledgers' data records (``report._task_differences``).
4. ``compare-tuned T T4`` of tunings of ``--grid server-learning-rate=1,2`` and ``=1.0,2.0``
   (seeds 1 and 2) was refused as "another grid"; ``tune_check._same_grid`` compares them as
   ``tune`` does (2).
5. ``compare toy.toml --seed 2`` (simulate's and tune's flag) was read by argparse as an
   abbreviation of ``--seeds``: two seeds, 0 and 1, rc 0. Now one line, rc 2.
6. An unfinished cell whose data directory moved (compare 1) was planned as resumed, but a
   resume reads the data where its ``config.toml`` says: ``L: missing stackoverflow.sqlite`` when
   its turn came. Now refused when planned unless both name one directory.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from fedprivopt.simulation.cell_plans import (
    cell_difference,
    first_difference,
    load_cell,
    plan_cells,
)
from fedprivopt.simulation.cells import REUSE, Cell, StaleCellError
from fedprivopt.simulation.config import load_config

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
LABEL = "dp-fedavg__sigma0.5__seed0"

_MODULE = """import hashlib
from pathlib import Path
from fedprivopt.models.toy import ToyClassificationTask


class Task(ToyClassificationTask):
    def __init__(self, data_dir, **p):
        self.where = Path(data_dir) / "seed.txt"
        p["seed"] = int(self.where.read_text())
        super().__init__(**p)
{identity}

def make(data_dir, **p):
    return Task(data_dir, **p)
"""
_IDENTITY = """
    def data_identity(self):
        return {"seed_sha256": hashlib.sha256(self.where.read_bytes()).hexdigest()}
"""


def _config(**overrides):
    return load_config(TOY, {"num-server-rounds": 1, "strategy": "dp-fedavg", **overrides})


def _run(tmp_path, config):
    """A finished one-round run of ``config`` in the cell of ``tmp_path/C``."""
    from fedprivopt.simulation.run import simulate

    out = tmp_path / "C"
    simulate(config, out / "runs" / LABEL)
    return out


def _cell(config):
    from fedprivopt.models.registry import build_task

    return Cell(LABEL, config, build_task(config.task, **config.task_params))


def _warned(path: Path, *configs: dict) -> list[str]:
    """The report's warning on the task settings of runs of ``configs`` (``path``'s ledger)."""
    from types import SimpleNamespace

    from fedprivopt.simulation.report import _task_differences

    return _task_differences([SimpleNamespace(summary={"config": c}, path=path) for c in configs])


def _data(where: Path, seed: int) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "seed.txt").write_text(str(seed))
    return where


@pytest.fixture
def own_task(tmp_path):
    """``name:make`` of a module of one's own whose data seed is read from ``data_dir``."""
    made = []

    def module(identity: bool) -> str:
        name = f"compare48_{'id' if identity else 'noid'}_{len(made)}"
        (tmp_path / f"{name}.py").write_text(_MODULE.format(identity=_IDENTITY * identity))
        made.append(name)
        return f"{name}:make"

    sys.path.insert(0, str(tmp_path))
    try:
        yield module
    finally:
        sys.path.remove(str(tmp_path))
        for name in made:
            sys.modules.pop(name, None)


def test_1_a_task_parameter_at_the_task_s_default_is_the_same_as_not_set(tmp_path):
    out = _run(tmp_path, _config())
    given = _config(**{"task-params.heterogeneity": 0.5})  # the toy task's default
    (plan,) = plan_cells(out, [_cell(given)], overwrite=False)  # was StaleCellError
    assert plan.action == REUSE
    assert load_cell(plan).path == out / "runs" / LABEL
    for value in (0.6, 1):  # another value is another configuration
        with pytest.raises(StaleCellError, match=r"task-params\.heterogeneity = \(not set\)"):
            plan_cells(out, [_cell(_config(**{"task-params.heterogeneity": value}))],
                       overwrite=False)  # fmt: skip
    # nor does the report warn of it beside a run of the same task given the default
    toy = {"task": "toy", "task-params": {"num-users": 40, "seed": 0}}
    given = {**toy, "task-params": {**toy["task-params"], "heterogeneity": 0.5}}
    assert _warned(tmp_path, toy, given) == []  # was "task-params.heterogeneity (0.5, null)"
    other = {**toy, "task-params": {**toy["task-params"], "heterogeneity": 0.7}}
    assert "task-params.heterogeneity (0.5, 0.7)" in _warned(tmp_path, toy, other)[0]
    given = _config(**{"task-params.heterogeneity": 0.5})
    # tune's base check and compare-tuned compare configurations as they are (unchanged)
    assert first_difference(_config(), given) == ("task-params.heterogeneity", "(not set)", 0.5)


def test_1_the_data_directory_is_compared_by_the_data_identity(tmp_path, own_task):
    task = own_task(True)
    data = _data(tmp_path / "D", 3)
    (tmp_path / "x").mkdir()
    out = _run(tmp_path, _config(task=task, **{"task-params.data-dir": str(data)}))
    spelled = str(tmp_path / "x" / ".." / "D")
    copy = shutil.copytree(data, tmp_path / "copy")
    for where in (spelled, str(copy)):
        cell = _cell(_config(task=task, **{"task-params.data-dir": where}))
        (plan,) = plan_cells(out, [cell], overwrite=False)  # was StaleCellError naming data-dir
        assert plan.action == REUSE
        load_cell(plan)
    other = _data(tmp_path / "other", 4)  # other data at another place: refused
    cell = _cell(_config(task=task, **{"task-params.data-dir": str(other)}))
    with pytest.raises(StaleCellError, match="holds other data than the run was started on"):
        plan_cells(out, [cell], overwrite=False)
    # the report names no difference of task settings for the reused cell beside a new one
    config = {"task": task, "task-params": {"num-users": 40, "data-dir": str(data)}}
    moved = {"task": task, "task-params": {"num-users": 40, "data-dir": spelled}}
    assert _warned(out / "runs" / LABEL, config, moved) == []
    assert _warned(tmp_path, config, moved) != []  # no ledger records the data: named
    # another parameter beside a moved directory is still the difference named
    cell = _cell(_config(task=task, **{"task-params.data-dir": str(copy), "seed": 1}))
    assert cell_difference(load_config(out / "runs" / LABEL / "config.toml"), cell)[0][0] == "seed"


def test_1_a_task_without_a_data_identity_keeps_the_data_directory_compared(tmp_path, own_task):
    task = own_task(False)  # its identity is its module's digest only: says nothing of the data
    data = _data(tmp_path / "D", 3)
    out = _run(tmp_path, _config(task=task, **{"task-params.data-dir": str(data)}))
    copy = shutil.copytree(data, tmp_path / "copy")
    cell = _cell(_config(task=task, **{"task-params.data-dir": str(copy)}))
    with pytest.raises(StaleCellError, match=r"task-params\.data-dir = "):
        plan_cells(out, [cell], overwrite=False)


_OWN = "strategies.dp-fedavg"


def _tuning(out: Path, grid: str):
    """``prepare_tuning`` of ``tune toy.toml --grid GRID ... --out OUT`` (nothing run)."""
    from fedprivopt.cli_compare_tune import _tune_namespace
    from fedprivopt.cli_tune_setup import prepare_tuning

    argv = ["tune", str(TOY), f"--grid={grid}", "--mean-trials", "1", "--rounds", "1"]
    return prepare_tuning(_tune_namespace([*argv, "--seed", "1", "--out", str(out)]))


@pytest.mark.parametrize(
    ("first", "again"),
    [
        ("server-learning-rate=1,2", "server-learning-rate=1.0,2.0"),
        ("server-learning-rate=1.0,2.0", "server-learning-rate=1,2"),
        (
            "strategies.dp-fedavg.server-learning-rate=1,2",
            "strategies.dp-fedavg.server-learning-rate=1.0,2e0",
        ),
    ],
)
def test_2_a_grid_spelled_otherwise_that_makes_the_same_trials_continues_the_tuning(
    tmp_path, first, again
):
    import json

    from fedprivopt.simulation.tune_plan import plan_digest
    from fedprivopt.simulation.tune_replan import check_plan

    out = tmp_path / "T"
    (out / "runs").mkdir(parents=True)  # an earlier tuning's directory
    stored = _tuning(out, first).document
    (out / "tune.json").write_text(json.dumps(stored))
    setup = _tuning(out, again)
    assert setup.document["grid"] == stored["grid"]  # tune.json's grid as it was
    assert plan_digest(setup.document) == plan_digest(stored)  # the trials' ledgers agree
    assert check_plan(out, setup.document, overwrite=False) is False  # was: another plan
    assert [c.config for c in setup.cells] == [
        c.config for c in _tuning(tmp_path / "U", first).cells
    ]


@pytest.mark.parametrize(
    "again",
    ["server-learning-rate=1.0,2.5", "server-learning-rate=2,1", "server-learning-rate=1,2,3"],
)
def test_2_a_grid_of_other_trials_is_still_another_plan(tmp_path, again):
    import json

    from fedprivopt.cli_args import UsageError
    from fedprivopt.simulation.tune_replan import check_plan

    out = tmp_path / "T"
    (out / "runs").mkdir(parents=True)  # an earlier tuning's directory
    key = again.partition("=")[0]
    (out / "tune.json").write_text(json.dumps(_tuning(out, f"{key}=1,2").document))
    with pytest.raises((ValueError, UsageError), match="--grid differs"):
        check_plan(out, _tuning(out, again).document, overwrite=False)


@pytest.mark.parametrize(
    ("again", "same"),
    [("server-learning-rate=1.0,2.0", True), ("server-learning-rate=1,2", True),
     ("server-learning-rate=1.0,2.5", False), ("server-learning-rate=2,1", False),
     ("local-learning-rate=1,2", False)],
)  # fmt: skip
def test_4_compare_tuned_takes_tunings_of_one_grid_spelled_otherwise_as_seeds(
    tmp_path, again, same
):
    from fedprivopt.simulation.tune_check import _same_grid

    first = _tuning(tmp_path / "T", "server-learning-rate=1,2").document
    second = _tuning(tmp_path / "T4", again).document
    assert _same_grid(first, second) is same  # =1.0,2.0 was "has another grid than 'T'"


@pytest.mark.parametrize("flag", ["--seed", "--seed=2"])
def test_5_compare_refuses_seed_which_argparse_read_as_seeds(tmp_path, capsys, flag):
    from fedprivopt.cli import main

    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--out"]
    try:
        code = main([*argv, str(tmp_path / "C"), *([flag, "2"] if flag == "--seed" else [flag])])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "C").exists()  # was rc 0: seeds 0 and 1, not seed 2
    assert "compare has no --seed (and --seed is not --seeds)" in err and err.count("\n") == 1


def test_6_an_unfinished_cell_is_resumed_only_where_its_data_is_read_again(tmp_path, own_task):
    from fedprivopt.simulation.cells import RESUME

    task = own_task(True)
    data = _data(tmp_path / "D", 3)
    out = _run(tmp_path, _config(task=task, **{"task-params.data-dir": str(data)}))
    stored = out / "runs" / LABEL / "config.toml"  # unfinished: 1 of 2 rounds
    stored.write_text(stored.read_text().replace("num-server-rounds = 1", "num-server-rounds = 2"))
    (tmp_path / "link").symlink_to(data)
    for where, action in (
        (tmp_path / "link", RESUME),
        (shutil.copytree(data, tmp_path / "c"), None),
    ):
        cell = _cell(
            _config(task=task, **{"task-params.data-dir": str(where), "num-server-rounds": 2})
        )
        if action is not None:  # the same directory: the resume reads the same files
            assert plan_cells(out, [cell], overwrite=False)[0].action == action
            continue
        with pytest.raises(
            StaleCellError, match="its run is unfinished and a resume reads its data"
        ):
            plan_cells(out, [cell], overwrite=False)  # was RESUME, failing where D is gone
