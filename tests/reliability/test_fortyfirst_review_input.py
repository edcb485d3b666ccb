"""Issue 15, forty-first hostile review (input: bad settings and data files): tests.

1. ``simulate stackoverflow-tp-mini.toml --set 'task-params.data-dir="D\\u0000x"'`` (TOML
   writes a null character so; also ``task-params.cache-dir`` with ``token-cache = true``,
   ``compare``, a preset's or a run's ``config.toml``): rc 2, but ``config: embedded null
   byte``, the operating system's words naming no key, raised by the check that the task's
   directories lie outside ``--out`` before the task (which names the key for every other
   control character) was built. Now ``simulation.config`` refuses it when the configuration
   is read (``_task_path``): one line naming the key.
"""

from __future__ import annotations

import pytest

from fedprivopt.simulation.config import load_config
from tests.reliability.test_thirtyeighth_review_input import _cli

MINI = "simulations/stackoverflow-tp-mini.toml"


# -- finding 1: a null character in a task directory --------------------------------------------


@pytest.mark.parametrize("key", ["data-dir", "cache-dir"])
@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_1_a_null_character_in_a_task_directory_is_named(tmp_path, key, command):
    argv = [command, MINI, "--rounds", "1", "--out", str(tmp_path / "r"), "--quiet"]
    if command == "compare":
        argv += ["--strategies", "dp-fedavg"]
    code, lines = _cli(
        *argv, "--set", "task-params.token-cache=true",
        "--set", f'task-params.{key}="{tmp_path}/d\\u0000x"',
    )  # fmt: skip
    assert code == 2 and len(lines) == 1, lines
    assert f"task-params.{key} holds a null character" in lines[0], lines
    assert not (tmp_path / "r").exists()


def test_1_a_preset_s_null_character_is_named(tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text(
        'task = "stackoverflow-tp"\n[task-params]\ndata-dir = "so\\u0000"\n', encoding="utf-8"
    )
    with pytest.raises(ValueError, match=r"task-params\.data-dir holds a null character"):
        load_config(preset)
