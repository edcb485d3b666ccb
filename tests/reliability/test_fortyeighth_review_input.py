"""Issue 15, forty-eighth hostile review (input: bad input and the files a command reads): tests.

1. ``compare-tuned T --out R`` (also ``compare`` reusing its runs, ``compare-tuned T --untuned
   D``) where a run's ``summary.json`` names its ``primary_metric`` as a list or a table (a
   summary edited by hand: ``["eval_accuracy"]``, ``{}``). Before: a ``TypeError: unhashable
   type: 'list'`` traceback, rc 1, from ``rundata_aggregate.choose_metric``'s set of the names.
   Now a name that is not text counts as none (as a run written before summaries named it):
   the report takes the preferred metric, rc 0.
2. ``python experiments/sweep.py S --out O`` run again after the sweep file's ``[set]`` changed
   (``num-server-rounds`` 1, then 3; also its preset or a condition's table). Before: every
   run was reused by its name (strategy, point, seed, condition), and ``sweep.md`` showed the
   1-round runs (ε 7.551) under "Overrides of every run: {'num-server-rounds': 3}". Now a
   finished run is reused only when its ``config.toml`` is the configuration the sweep asks
   of it (``sweep._check_reused``); otherwise the sweep exits naming the run.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fedprivopt.simulation.config import config_to_toml, load_config
from fedprivopt.simulation.rundata_aggregate import choose_metric

_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class _Run:
    """The two members of a RunData that choose_metric reads."""

    summary: dict = field(default_factory=dict)
    metrics: tuple = ("eval_accuracy", "eval_loss")

    def has_metric(self, name: str) -> bool:
        return name in self.metrics


@pytest.mark.parametrize("named", [["eval_accuracy"], {}, {"a": 1}, [1]])
def test_1_a_primary_metric_that_is_not_text_is_read_as_none(named):
    runs = [_Run({"primary_metric": named}), _Run({"primary_metric": "eval_accuracy"})]
    assert choose_metric(runs) == "eval_accuracy"
    assert choose_metric([_Run({"primary_metric": named})]) == "eval_accuracy"


@pytest.fixture
def sweep():
    spec = importlib.util.spec_from_file_location(
        "fedprivopt_sweep48", _ROOT / "experiments" / "sweep.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_2_a_sweep_reuses_a_finished_run_only_with_its_configuration(sweep, tmp_path):
    preset = str(_ROOT / "simulations" / "toy.toml")
    run = tmp_path / "runs" / "dp-fedavg__clip-norm=1.0__seed0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    ran = {"num-server-rounds": 1, "clip-norm": 1.0, "strategy": "dp-fedavg", "seed": 0}
    (run / "config.toml").write_text(config_to_toml(load_config(preset, ran)), encoding="utf-8")
    same = {"num-server-rounds": 1, "clip-norm": 1.0}
    assert sweep._check_reused(run, preset, "dp-fedavg", 0, same) is None
    with pytest.raises(SystemExit, match="not this sweep's configuration"):
        sweep._check_reused(run, preset, "dp-fedavg", 0, {**same, "num-server-rounds": 3})
    grid = {"clip-norm": [1.0]}
    with pytest.raises(SystemExit, match=r"dp-fedavg__clip-norm=1\.0__seed0"):
        sweep._run(
            None,
            preset,
            "dp-fedavg",
            grid,
            {"clip-norm": 1.0},
            0,
            ("", {}),
            {"num-server-rounds": 3},
            tmp_path,
        )
