"""The digits example (examples/digits): 3 rounds of dp-fedadam on both engines raise accuracy."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn")  # the [examples] extra; `make test` installs it

from fedprivopt.models import build_task
from fedprivopt.models.task import Task
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import simulate

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits"
PRESET = EXAMPLE / "digits.toml"
REF = "digits_task:make_task"


@pytest.fixture
def in_example(monkeypatch):
    """Run from the example's directory, as its README does (the task module is found there)."""
    monkeypatch.chdir(EXAMPLE)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the resolver appends the directory
    yield
    sys.modules.pop("digits_task", None)


def test_the_split_is_non_iid_seeded_and_complete(in_example):
    task = build_task(REF, num_users=20, alpha=0.3, seed=4)
    make_task = sys.modules["digits_task"].make_task
    assert isinstance(task, Task)
    labels = [task.user_data(u)[1] for u in range(20)]
    train = sum(len(y) for y in labels)
    assert train == 1797 - 359  # 20% of every digit held out (rounded per digit)
    again = make_task(num_users=20, alpha=0.3, seed=4)
    assert all((a == again.user_data(u)[1]).all() for u, a in enumerate(labels))
    other = make_task(num_users=20, alpha=0.3, seed=5)
    assert any(len(a) != len(other.user_data(u)[1]) for u, a in enumerate(labels))
    # non-IID: the typical user holds far fewer than the 10 digits in equal shares
    top_share = [y.bincount(minlength=10).max().item() / max(1, len(y)) for y in labels]
    assert sorted(top_share)[10] > 0.3


@pytest.mark.parametrize("engine", ["fast", "flower"])
def test_three_rounds_of_dp_fedadam_raise_accuracy(in_example, tmp_path, engine):
    overrides = {"strategy": "dp-fedadam", "num-server-rounds": 3, "engine": engine}
    if engine == "flower":
        overrides["client-cpus"] = 1
    config = load_config(PRESET.name, overrides)
    assert config.task == REF
    task = build_task(REF, **config.task_params)
    before = task.evaluate(task.build_model())["accuracy"]
    out = simulate(config, tmp_path / engine)
    accuracy = [row["eval_accuracy"] for row in out.rows]
    assert [row["round"] for row in out.rows] == [1, 2, 3]
    assert before < accuracy[0] < accuracy[-1], (before, accuracy)
    assert accuracy[-1] > 0.2  # chance is 0.1
    summary = json.loads((out.out_dir / "summary.json").read_text())
    assert summary["task"] == REF and summary["epsilon"] > 0
