"""Issue 15, thirty-eighth hostile review (input: bad settings and data files): tests.

1. ``simulate toy.toml --set task=fedprivopt.models.task:Task`` (the protocol a task
   implements, named where a task class belongs; also ``typing:Any``): a traceback ending in
   typing's ``TypeError: Protocols cannot be instantiated``, rc 1 (a ``TypeError`` raised inside
   code other than ``build_task`` counts as a bug of the factory). ``registry.resolve_task`` now
   refuses a ``Protocol`` class or a ``typing`` form before calling it: one line naming
   ``task`` (``… is a type for annotations (a Protocol or a typing form), which cannot be
   called …``), rc 2.
"""

from __future__ import annotations

import contextlib
import io

import pytest

from fedprivopt.cli import main

TOY = "simulations/toy.toml"


def _cli(*argv: str) -> tuple[int, list[str]]:
    """``fedprivopt ARGV`` in process: its exit code and its stderr lines."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
    return code, err.getvalue().strip().splitlines()


# -- finding 1: a Protocol (or a typing form) named as the task --------------------------------


@pytest.mark.parametrize("task", ["fedprivopt.models.task:Task", "typing:Any"])
def test_1_a_protocol_named_as_the_task_is_one_line(task, tmp_path):
    code, lines = _cli(
        "simulate", TOY, "--rounds", "1", "--out", str(tmp_path / "r"), "--quiet",
        "--set", f"task={task}",
    )  # fmt: skip
    assert code == 2 and len(lines) == 1, lines
    assert "task" in lines[0] and "cannot be called" in lines[0]
    assert not (tmp_path / "r").exists()
