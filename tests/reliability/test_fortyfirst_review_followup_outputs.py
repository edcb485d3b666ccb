"""Issue 15, follow-up of the forty-first hostile review (outputs: the input, processes and
lead fixes of that review): tests.

1. Input 1's twin through the Python API: a ``RunConfig`` whose ``task_params`` name a
   ``data_dir`` or ``cache_dir`` holding a null character (``dataclasses.replace(config,
   task_params={..., "data_dir": "D\\x00x"})``, ``RunConfig(...)``, a ``pathlib.Path``), then
   ``simulate(config, out)``. Before: ``ValueError: embedded null byte``, the operating
   system's words naming no parameter (``check_task_dirs_outside``'s ``realpath``), where the
   command line names ``task-params.data-dir`` since input 1. Now ``RunConfig`` refuses it when
   it is made, naming the key, as ``resolve_config`` does (``config._check_task_dirs``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.simulation.config import RunConfig, load_config

MINI = "simulations/stackoverflow-tp-mini.toml"


def _cli(*argv: str) -> tuple[int, list[str]]:
    """``fedprivopt ARGV`` in process: its exit code and its stderr lines."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
    return code, err.getvalue().strip().splitlines()

# -- finding 1: a null character in a task directory, through the Python API -------------------


@pytest.mark.parametrize("key", ["data_dir", "cache_dir"])
@pytest.mark.parametrize("kind", [str, Path])
def test_1_a_null_character_in_a_task_directory_is_named_by_the_api(tmp_path, key, kind):
    config = load_config(MINI)
    value = kind(f"{tmp_path}/d\x00x")
    named = rf"task-params\.{key.replace('_', '-')} holds a null character"
    with pytest.raises(ValueError, match=named):  # before: taken
        dataclasses.replace(config, task_params={**config.task_params, key: value})
    with pytest.raises(ValueError, match=named):
        RunConfig(task="stackoverflow-tp", task_params={key: value})


def test_1_ordinary_directories_are_taken(tmp_path):
    config = load_config(MINI)
    params = {**config.task_params, "data_dir": str(tmp_path / "d x"), "cache_dir": tmp_path}
    assert dataclasses.replace(config, task_params=params).task_params["cache_dir"] == tmp_path
