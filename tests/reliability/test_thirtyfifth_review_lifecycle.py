"""Issue 15, thirty-fifth hostile review (lifecycle: a run from config to summary, crash, resume).

1. A task of one's own (``task = "mod:factory"``) with a parameter that is an array of inline
   tables, ``simulate toy.toml --set task=m:make --set 'task-params.layers=[{size=10},{size=5}]'
   --out R``: rc 0, but ``R/config.toml`` said ``layers = ["{'size': 10}", "{'size': 5}"]``
   (each table written as Python's text of it), so every later ``simulate --resume R`` (more
   rounds) was refused, rc 2, ``R/config.toml: task-params.layers = [...], but the run's privacy
   ledger records task-params.layers = [{"size": 10}, ...]: resuming with a different
   configuration ... is refused``: a file the user never edited blamed, and the run could not be
   continued. ``files.toml_value`` now writes a mapping as an inline table (``{size = 10}``, at
   any depth), so ``config.toml`` reads back as the configuration that ran; the resume goes on.
"""

from __future__ import annotations

import json
import sys

import pytest

from fedprivopt.cli import main
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import (
    CONFIG_FILE,
    SUMMARY_FILE,
    toml_value,
)
from tests.reliability.test_ledger import _set
from tests.reliability.test_thirtyfourth_review_tasks import OwnTask
from tests.simulation.test_run import PRESET

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def layered_task(num_users: int = 6, **params):
    """A factory taking any parameter (``**params``), as a user's own may."""
    return OwnTask(num_users=num_users)


def _lines(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


# -- 1: an array of inline tables as a task parameter ----------------------------------------------
@pytest.mark.parametrize(
    "value",
    [
        [{"size": 10}, {"size": 5}],
        [{"k y": {"z": [1, {}]}, "ü": 'a"b'}],
        {"inner": {"deeper": [1.5, "x"]}},
    ],
)
def test_1_toml_value_writes_a_mapping_as_an_inline_table(value):
    assert tomllib.loads(f"v = {toml_value(value)}")["v"] == value  # was: Python's text of it


def test_1_a_run_with_inline_tables_in_a_task_parameter_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    task = f"task={__name__}:layered_task"
    rc = main(["simulate", str(PRESET), "--rounds", "1", "--quiet", "--out", str(out),
               "--set", task, "--set", "population=6", "--set", "clients-per-round=4",
               "--set", "task-params={num-users=6}",
               "--set", "task-params.layers=[{size=10},{size=5}]"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    config = load_config(out / CONFIG_FILE)
    assert config.task_params["layers"] == [{"size": 10}, {"size": 5}]  # was: two strings
    _set(out, "num-server-rounds", "2")
    capsys.readouterr()
    # was: rc 2, "R/config.toml: task-params.layers = [...], but the run's privacy ledger records"
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 0, _lines(capsys)
    assert json.loads((out / SUMMARY_FILE).read_text())["rounds_completed"] == 2
