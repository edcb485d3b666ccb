"""Tasks by reference: ``task = "package.module:factory"`` (issue 18)."""

import json

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.models import ToyClassificationTask, build_task
from fedprivopt.models.registry import TASK_MEMBERS, is_reference, resolve_task
from fedprivopt.models.task import Task
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import build_run, simulate
from tests.models.minimal_task import MinimalTask, make_task

REF = "tests.models.minimal_task:make_task"
PRESET = f"""
strategy = "dp-fedadam"
engine = "fast"
task = "{REF}"
population = 6
clients-per-round = 3
num-server-rounds = 3
noise-multiplier = 0.3
clip-norm = 1.0
delta = 1e-4
seed = 0
server-learning-rate = 0.1
local-learning-rate = 0.5
batch-size = 4

[task-params]
num-users = 6
seed = 1
"""


def test_the_minimal_task_has_exactly_the_protocol():
    task = make_task(num_users=3)
    assert isinstance(task, Task)
    public = {n for n in dir(task) if not n.startswith("_")}
    assert public == set(TASK_MEMBERS)


def test_a_reference_builds_with_the_params_as_keywords():
    assert is_reference(REF) and not is_reference("toy")
    task = build_task(REF, num_users=4, seed=2)
    assert isinstance(task, MinimalTask) and task.num_users == 4
    assert isinstance(build_task("tests.models.minimal_task:MinimalTask", num_users=5), MinimalTask)
    assert resolve_task(REF) is make_task
    assert isinstance(build_task("toy", num_users=3), ToyClassificationTask)  # names still work


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "no_such_module_xyz.mod:make",
            r"task 'no_such_module_xyz.mod:make': module .* does not "
            r"import \(ModuleNotFoundError",
        ),
        ("tests.models.minimal_task:nothing", r"task '.*': .* has no attribute 'nothing'"),
        ("tests.models.minimal_task:NOT_CALLABLE", r"task '.*': 'NOT_CALLABLE' is not callable"),
        (
            "tests.models.minimal_task:not_a_task",
            r"task '.*': the factory returned 'object', not a Task "
            r"\(it lacks name, num_users",
        ),
        ("tests.models.minimal_task:", r"task '.*' is not a reference"),
        ("a b:c", r"task '.*' is not a reference"),
        ("no-such-task", r"unknown task 'no-such-task'; known tasks: .*toy"),
    ],
)
def test_bad_references_name_the_task(name, message):
    with pytest.raises(ValueError, match=message):
        build_task(name, num_users=3)


def test_a_module_that_raises_while_importing_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_task_mod.py").write_text(
        "x = 1\nraise RuntimeError('boom\\nsecond line')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"does not import \(RuntimeError: boom second line\)$"):
        build_task("broken_task_mod:make")


@pytest.mark.parametrize(
    "ref",
    ["no_such_module_xyz:make", "tests.models.minimal_task:not_a_task", "tests.models:zzz"],
)
def test_cli_exits_2_with_one_line_naming_task(tmp_path, capsys, ref):
    preset = tmp_path / "p.toml"
    preset.write_text(PRESET)
    code = main(["simulate", str(preset), "--set", f"task={ref}", "--out", str(tmp_path / "o")])
    _, err = capsys.readouterr()
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"task '{ref}'" in err
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


def _preset(tmp_path, **overrides):
    path = tmp_path / "p.toml"
    path.write_text(PRESET)
    return load_config(path, overrides)


@pytest.mark.parametrize("vectorize", [True, False])
def test_the_minimal_task_runs_on_the_fast_engine(tmp_path, vectorize):
    config = _preset(tmp_path, vectorize=vectorize)
    task, _ = build_run(config)
    build_run(config, task)  # a task built before is accepted: its name is not the reference
    out = simulate(config, tmp_path / "run")
    summary = json.loads((out.out_dir / "summary.json").read_text())
    assert summary["task"] == REF and summary["rounds_completed"] == 3
    assert summary["primary_metric"] == "eval_accuracy" and summary["reference"] is None
    assert [r["round"] for r in out.rows] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(r["eval_loss"])) for r in out.rows)


def test_the_minimal_task_runs_on_the_flower_engine_and_matches_the_fast_one(tmp_path):
    # Flower's Ray workers rebuild the task from the reference: they import the module
    fast = simulate(_preset(tmp_path, **{"num-server-rounds": 2}), tmp_path / "fast")
    flower = simulate(
        _preset(tmp_path, engine="flower", **{"num-server-rounds": 2, "client-cpus": 1}),
        tmp_path / "flower",
    )
    assert [r["round"] for r in flower.rows] == [1, 2]
    assert all(r["node_errors"] == 0 and r["accepted"] == r["cohort_size"] for r in flower.rows)
    torch.testing.assert_close(flower.params, fast.params, rtol=0, atol=1e-6)
    assert flower.epsilon == pytest.approx(fast.epsilon, rel=1e-12)
