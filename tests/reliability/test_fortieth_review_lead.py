"""Fortieth review of issue 15: the lead's findings.

1. (the outputs follow-up's open row) A preset within the 1 MiB preset limit of the input
   reviewer's finding 4 whose resolved configuration is longer as TOML (here a task's list of
   ``1e-5`` values, written back as ``1e-05``; also long ``--set`` lists): 750 kB read, a
   ``config.toml`` of 1,050,732 bytes written. Before: the run went on (rc 0), and ``--resume``
   and ``compare`` then refused its own ``config.toml`` as above the limit. Now
   ``config.config_to_toml`` refuses the configuration, and ``load_config`` calls it before
   anything is written: one line naming the size and the limit.
"""

from __future__ import annotations

import pytest

from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.config_presets import PRESET_LIMIT

TASK = """
from tests.models.minimal_task import MinimalTask


def make(*, num_users=6, values=()):
    return MinimalTask(num_users=num_users)
"""


def test_1_a_configuration_whose_config_toml_would_pass_the_limit_is_refused(tmp_path, monkeypatch):
    (tmp_path / "bigtask40lead.py").write_text(TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    count = 150_000  # "1e-5," in the preset, "1e-05, " in config.toml
    preset = tmp_path / "big.toml"
    preset.write_text(
        'task = "bigtask40lead:make"\npopulation = 6\nclients-per-round = 3\n'
        f"[task-params]\nnum-users = 6\nvalues = [{','.join(['1e-5'] * count)}]\n"
    )
    assert preset.stat().st_size < PRESET_LIMIT
    with pytest.raises(ValueError, match=r"configuration .* is 1,050,\d+ bytes as TOML, above"):
        load_config(preset)
    small = tmp_path / "small.toml"  # the same preset with a short list runs as before
    small.write_text(preset.read_text().replace(",".join(["1e-5"] * count), "1e-5, 2e-5"))
    assert load_config(small).task_params["values"] == [1e-5, 2e-5]
