"""The equal-effort sweep's selection rule (experiments/sweep.py, not part of the package)."""

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "experiments" / "sweep.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("fedprivopt_sweep", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its worker function is pickled by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _cell(mean, reference, loss):
    return {"mean": mean, "margin": mean - reference, "report_mean": loss}


def test_one_condition_ranks_by_the_mean_then_the_lower_loss(sweep):
    a = sweep.rank_key({"": _cell(0.30, 0.27, 4.0)}, "max", "eval_loss", None)
    b = sweep.rank_key({"": _cell(0.31, 0.27, 5.0)}, "max", "eval_loss", None)
    c = sweep.rank_key({"": _cell(0.31, 0.27, 4.5)}, "max", "eval_loss", None)
    assert b > a and c > b


def test_conditions_rank_by_the_worst_margin_over_the_reference(sweep):
    # best on average, but at the reference in one condition
    steady = {"s03": _cell(0.30, 0.27, 4.0), "synth1": _cell(0.22, 0.19, 4.0)}
    peaky = {"s03": _cell(0.40, 0.27, 4.0), "synth1": _cell(0.19, 0.19, 4.0)}
    key = lambda cells: sweep.rank_key(cells, "max", "eval_loss", None)  # noqa: E731
    assert key(steady) > key(peaky)
    # margins, not raw values: synth1's lower reference is not held against it
    assert key(steady)[1] == pytest.approx(0.03)


def test_a_point_over_the_report_limit_anywhere_ranks_last(sweep):
    over = {"s03": _cell(0.40, 0.27, 4.0), "s05": _cell(0.35, 0.27, 6.3)}
    under = {"s03": _cell(0.28, 0.27, 4.0), "s05": _cell(0.271, 0.27, 6.0)}
    key = lambda cells: sweep.rank_key(cells, "max", "eval_loss", 6.2146)  # noqa: E731
    assert key(under) > key(over)
    assert key(over)[0] is False


def test_min_mode_prefers_the_smaller_metric(sweep):
    low = sweep.rank_key({"": _cell(3.0, 0.0, 0.5)}, "min", "eval_accuracy", None)
    high = sweep.rank_key({"": _cell(3.5, 0.0, 0.5)}, "min", "eval_accuracy", None)
    assert low > high


_STAGED = """
preset = "{preset}"
seeds = [0]
metric = "eval_accuracy"
select = "{select}"
[set]
num-server-rounds = 1
population = 12
clients-per-round = 4
"task-params.num-users" = 12
[grid."dp-fedavg:a"]
server-learning-rate = [0.5]
[grid."dp-fedavg:b"]
server-learning-rate = [1.0]
[grid.dp-fedadam]
server-learning-rate = [0.01, 0.05]
"""


def test_stages_of_one_strategy_are_pooled_for_effort_and_selection(sweep, tmp_path):
    preset = Path(__file__).resolve().parents[1] / "simulations" / "toy.toml"
    spec = tmp_path / "staged.toml"
    spec.write_text(_STAGED.format(preset=preset, select="grid"))
    with pytest.raises(SystemExit, match="unequal tuning effort"):  # 1, 1 and 2 points per grid
        sweep.main([str(spec), "--out", str(tmp_path / "a"), "--jobs", "1"])
    spec.write_text(_STAGED.format(preset=preset, select="strategy"))
    assert sweep.main([str(spec), "--out", str(tmp_path / "b"), "--jobs", "1"]) == 0
    table = (tmp_path / "b" / "sweep.md").read_text()
    marked = [line.split("|")[1].strip() for line in table.splitlines() if "**yes**" in line]
    assert sorted(name.split(":")[0] for name in marked) == ["dp-fedadam", "dp-fedavg"], table


def test_a_failed_run_does_not_stop_the_others(sweep, tmp_path):
    """One session's sweep stopped reporting at its first failed run (the pool ran on unseen)."""
    preset = Path(__file__).resolve().parents[1] / "simulations" / "toy.toml"
    spec = tmp_path / "failing.toml"
    text = _STAGED.format(preset=preset, select="strategy")
    spec.write_text(text.replace("server-learning-rate = [0.01, 0.05]", "tau = [-1.0, 0.001]"))
    with pytest.raises(SystemExit, match=r"1 of 4 runs failed.*tau=-1\.0.*tau must be"):
        sweep.main([str(spec), "--out", str(tmp_path / "c"), "--jobs", "1"])
    done = sorted(p.parent.name for p in (tmp_path / "c" / "runs").glob("*/summary.json"))
    assert len(done) == 3 and not any("tau=-1.0" in name for name in done)
