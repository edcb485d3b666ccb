"""Issue 15, thirty-first hostile review (command line): regression tests of its findings.

1. A task's error that names more than one task parameter named only its first one as the
   config writes it, and only when the config gave it (``name_task_param``):
   ``simulate toy.toml --set task-params.num-classes=3000000`` was refused as ``config: dim *
   num_classes must be at most 16,777,216 …, got dim=10 * num_classes=3000000``, naming no key
   of the config (``dim`` is a default, so the lead was not renamed either); ``--set
   task-params.dim=8388608 --set task-params.num-classes=2`` as ``task-params.dim=8388608 must
   be at most 894,782 with num_classes=2, examples_per_user=(5, 40) and test_examples=300``;
   the next-word task's ``task-params.hidden-size=100000, embedding_dim=96 …``. Now every task
   parameter such a message names (also one left at its default: the task's signature,
   ``models.registry.task_parameters``) is ``task-params.KEY``: ``task-params.dim *
   task-params.num-classes must be …, got task-params.dim=10 * task-params.num-classes=…``.
   A message that does not lead with a task parameter is unchanged, so a name in a nested
   error (``invalid synth_* parameters: vocab_size …``, the generator's ``vocab_size``, not the
   task's ``task-params.vocab-size``) is not misnamed.
2. ``simulate toy.toml --set task=builtins:print`` (also ``os:system``, ``builtins:int``: any
   task factory written in C) ended in ``TypeError: 'num_users' is an invalid keyword argument
   for print()`` (``system() takes at most 1 keyword argument (2 given)``), a traceback with
   rc 1: a builtin's refusal of a keyword matches none of the messages the twenty-eighth
   review's ``task_param_error`` reads. A ``TypeError`` whose traceback ends in ``build_task``
   itself (the call refused, no code of the factory ran) is now one line, rc 2: ``config: task
   'builtins:print' cannot be called with the config's task parameters (task-params.num-users,
   task-params.seed): …``; one raised inside a factory's code is named as the factory's
   (forty-second review, lead 6; it was a traceback).
3. ``FEDPRIVOPT_DEBUG=0 fedprivopt data info /nowhere`` (also ``false``, ``no``, ``off``: a CI
   file that lists the variable to turn it off) printed the traceback of
   ``UsageError: argument PATH: /nowhere does not exist`` with rc 1, where every bad input
   is one line with rc 2: any non-empty value counted as on. Now ``0``, ``false``, ``no``,
   ``off`` (any case, blanks around) and empty leave it off; ``1``, ``yes`` or ``true`` show
   the traceback as documented.
4. A preset saved with a UTF-8 byte-order mark (as some Windows editors save), ``simulate
   bom.toml``: ``config file 'bom.toml' is not valid TOML: Invalid statement (at line 1, column
   1)``, a line that looks right; one saved as UTF-16: ``'utf-8' codec can't decode byte 0xff
   in position 0``. Both now say what is wrong: ``it starts with a UTF-8 byte-order mark
   (U+FEFF); TOML is UTF-8 without a byte-order mark (save it as plain UTF-8)``.
5. ``simulate toy.toml --set device=cuda:`` and 5,000 digits passed the configuration's check
   and ended in ``error: Exceeds the limit (4300 digits) for integer string conversion …``,
   Python's line naming no key (rc 2). The index has at most 9 digits now: ``config: device
   must be auto, cpu or cuda[:i] (i of at most 9 digits), got 'cuda:999…999'``, the value cut.
6. ``simulate toy.toml --strategy adadps --set side-information.KEY=1`` with a key of 100,000
   characters echoed the key up to the line's cap of 2,000 characters (``aaa… needs an
   explicit side-information.kind``; also ``unknown key 'side-information.aaa…' for
   side-information.kind = 'two-level'``), where every other unknown key is cut to 80
   characters. Both are cut now.
7. The configuration's own messages at the Python API (``load_config(preset, overrides)``, what
   ``simulate`` and a resume call): ``engine``, ``eval-every``, ``checkpoint-every``,
   ``ray-cpus``, ``tensorboard``, ``vectorize``, ``ray-address``, ``task``, ``--set`` text, an
   unknown key and the preset's path were echoed whole (a 100,000-character value: a message of
   100,040 characters; 30 of 6,080 key x value x strategy cases), where the command line cut
   them. Each is shown cut (``core.text.shown``), as every other key's value.
8. ``fedprivopt --help > /dev/full`` (also ``simulate --help``, ``--version``, a bare
   ``fedprivopt``, ``deploy local --help``: a full disk under the redirected output) ended with
   rc 0 and nothing written: argparse drops an ``OSError`` of its help and version text, where
   a command's own output that cannot be written is one line and rc 2 (twenty-fifth review).
   Now the same: ``fedprivopt simulate: error: cannot write standard output: No space left on
   device``, rc 2; 141 when the pipe's reader left; a help written completely is unchanged.
9. A task by reference whose ``num_users`` is ``"40"`` (a string; also ``-3``, ``None``,
   ``True``): ``config: population must equal the number of users of task 'mod:Make' (40), got
   40``, a line that contradicts itself. ``build_task`` now refuses such a task by reference:
   ``task 'mod:Make': the factory's task has num_users = '40'; it must be an integer >= 1``
   (a NumPy integer is an integer).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import run_program_forked
from tests.reliability.test_twentyeighth_review import _env
from tests.reliability.test_twentyninth_review_cli import _cli as _in_process
from tests.reliability.test_twentyninth_review_cli import _one_line

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"


def _cli(tmp_path: Path, *argv: str, env: dict[str, str] | None = None):
    """``fedprivopt ARGV`` in a child process from ``tmp_path`` (with the twenty-eighth review's
    ``_env`` unless ``env``), killed after 120 s: forked from a server that has imported the
    program (``tests.procs.run_program_forked``), no interpreter start-up of its own."""
    env = _env(tmp_path) if env is None else env
    code, out, err = run_program_forked(list(argv), env=env, cwd=tmp_path, timeout=120)
    if code is None:
        pytest.fail(f"{argv[:3]}... still running after 120 s")
    return subprocess.CompletedProcess(list(argv), code, out, err)


# -- 1: every task parameter a task's message names is the config's key ----------------------


def test_1_a_model_too_large_names_both_keys(tmp_path):
    proc = _in_process(
        tmp_path,
        *("simulate", str(TOY), "--rounds", "1", "--out", str(tmp_path / "r")),
        *("--set", "task-params.num_classes=3000000"),
    )
    line = _one_line(proc)
    assert "config: task-params.dim * task-params.num-classes must be at most" in line, line
    assert "got task-params.dim=10 * task-params.num-classes=3000000" in line, line
    assert "num_classes" not in line, line
    assert not (tmp_path / "r").exists()


def test_1_a_tensor_too_large_names_every_key_it_lists(tmp_path):
    proc = _cli(
        tmp_path,
        *("simulate", str(TOY), "--rounds", "1", "--out", str(tmp_path / "r")),
        *("--set", "task-params.dim=8388608", "--set", "task-params.num-classes=2"),
    )
    line = _one_line(proc)
    assert "config: task-params.dim=8388608 must be at most 894,782 with " in line, line
    assert "task-params.num-classes=2, task-params.examples-per-user=(5, 40) and " in line, line
    assert "task-params.test-examples=300" in line, line
    assert "_" not in line.partition("config: ")[2], line


def test_1_name_task_param_leaves_a_nested_message_alone():
    from fedprivopt.cli_task_errors import name_task_param
    from fedprivopt.models.registry import task_parameters

    names = task_parameters("stackoverflow-tp")
    assert {"vocab_size", "num_tags", "synth_vocab"} <= set(names)
    nested = "invalid synth_* parameters: vocab_size must be an integer >= 2000, got 5"
    assert name_task_param(nested, {"synth_vocab": 5}, names) == nested
    # a parameter's single-word name in prose is not a key: only NAME=, `*` or the lead
    message = "seed must be a seed, got seed=x; data_dir /a/seed_x"
    assert name_task_param(message, {}, names) == (
        "task-params.seed must be a seed, got task-params.seed=x; task-params.data-dir /a/seed_x"
    )


def test_1_task_parameters_of_what_has_no_signature_is_empty():
    from fedprivopt.models.registry import task_parameters

    assert task_parameters("no-such-task") == ()
    assert task_parameters(None) == ()
    assert task_parameters("math:pi") == ()  # not callable
    assert "num_classes" in task_parameters("toy")


# -- 2: a factory that refuses the call itself (a builtin) -------------------------------------


def test_2_a_builtin_task_factory_is_one_line(tmp_path):
    # in a child: once Ray has run in a process, builtins.print is Ray's Python wrapper, no
    # builtin any more (in process this failed after tests/strategies/test_flower_simulation.py)
    proc = _cli(
        tmp_path,
        *("simulate", str(TOY), "--rounds", "1", "--out", str(tmp_path / "r")),
        *("--set", "task=builtins:print"),
    )
    line = _one_line(proc)
    assert "config: task 'builtins:print' cannot be called with the config's task parameters " in (
        line
    )
    assert "(task-params.num-users, task-params.seed): 'num_users' is an invalid keyword" in line
    assert not (tmp_path / "r").exists()


def test_2_a_type_error_inside_a_factory_names_the_factorys_exception():
    from fedprivopt.cli_task_errors import task_param_error
    from fedprivopt.models.registry import build_task

    for name, params in (("os:system", {"num_users": 3, "seed": 0}), ("builtins:int", {"x": 1})):
        with pytest.raises(TypeError) as info:
            build_task(name, **params)
        message = task_param_error(info.value) or ""
        assert f"task '{name}' cannot be called with the config's task parameters" in message
    with pytest.raises(TypeError) as info:  # raised by the factory's own code
        build_task("textwrap:dedent", text=5)
    # since the forty-second review (lead 6) one line too, as docs/TASKS.md promises for a
    # factory that raises: it names the factory's exception rather than the config's keys
    message = task_param_error(info.value) or ""
    assert message.startswith("task 'textwrap:dedent': the factory raised TypeError"), message


# -- 3: FEDPRIVOPT_DEBUG=0 is off -----------------------------------------------------------


@pytest.mark.parametrize(("value", "on"), [("0", False), (" Off ", False), ("1", True)])
def test_3_debug_zero_keeps_the_one_line(value, on, tmp_path, monkeypatch):
    argv = ["data", "info", str(tmp_path / "nowhere")]
    if on:  # the traceback and rc 1 of a process: a child
        env = dict(os.environ, FEDPRIVOPT_DEBUG=value, PYTHONPATH=str(ROOT))
        proc = _cli(tmp_path, *argv, env=env)
        assert proc.returncode == 1 and "Traceback" in proc.stderr, proc.stderr
    else:  # the one line: main in this process (no interpreter start-up)
        monkeypatch.setenv("FEDPRIVOPT_DEBUG", value)
        proc = _in_process(tmp_path, *argv)
        assert _one_line(proc).endswith("nowhere does not exist"), proc.stderr


@pytest.mark.parametrize(
    ("value", "on"),
    [("", False), ("0", False), ("false", False), ("NO", False), ("off", False), ("yes", True)],
)
def test_3_debug_values(value, on, monkeypatch):
    from fedprivopt.cli import _debug

    monkeypatch.setenv("FEDPRIVOPT_DEBUG", value)
    assert _debug() is on
    monkeypatch.delenv("FEDPRIVOPT_DEBUG")
    assert _debug() is False


# -- 4: a byte-order mark is named ------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "what"),
    [("utf-8-sig", "a UTF-8 byte-order mark (U+FEFF)"), ("utf-16", "a UTF-16 byte-order mark")],
)
def test_4_a_preset_with_a_byte_order_mark_is_named(encoding, what, tmp_path):
    from fedprivopt.simulation.config import load_config

    preset = tmp_path / "bom.toml"
    preset.write_text(TOY.read_text(encoding="utf-8"), encoding=encoding)
    with pytest.raises(ValueError, match=r"^config file '.*bom\.toml' is not valid TOML: it") as e:
        load_config(preset)
    assert f"it starts with {what}" in str(e.value)
    assert "save it as plain UTF-8" in str(e.value)


# -- 5: a CUDA index of 5,000 digits -----------------------------------------------------------


def test_5_a_device_index_of_thousands_of_digits_names_device(tmp_path):
    from fedprivopt.simulation.config import load_config

    with pytest.raises(ValueError, match=r"^device must be auto, cpu or cuda\[:i\] \(i of") as e:
        load_config(TOY, {"device": "cuda:" + "9" * 5000})
    assert len(str(e.value)) < 300, len(str(e.value))
    assert load_config(TOY, {"device": "cuda:123456789"}).device == "cuda:123456789"


# -- 6: a huge side-information key is cut ------------------------------------------------------


@pytest.mark.parametrize("kind", [None, "two-level"])
def test_6_a_huge_side_information_key_is_cut(kind):
    from fedprivopt.models.side_information_config import SideInformationSpec

    key = "k" * 100_000
    params = {key: 1} if kind is None else {"kind": kind, key: 1}
    with pytest.raises(ValueError, match=r"side-information\.kkk") as e:
        SideInformationSpec.parse(params)
    assert len(str(e.value)) < 300, len(str(e.value))


# -- 7: the configuration's messages cut what they echo ---------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "engine",
        "eval-every",
        "checkpoint-every",
        "ray-cpus",
        "tensorboard",
        "ray-address",
        "vectorize",
    ],
)
def test_7_a_huge_value_is_cut_in_the_configuration_s_message(key):
    from fedprivopt.simulation.config import load_config

    with pytest.raises(ValueError, match=f"^{key} ") as e:
        load_config(TOY, {key: "x" * 100_000})
    assert len(str(e.value)) < 400, len(str(e.value))


def test_7_a_huge_unknown_key_is_cut():
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.config_presets import parse_override

    with pytest.raises(ValueError, match=r"^unknown key 'kkk") as e:
        load_config(TOY, {"k" * 100_000: 1})
    assert len(str(e.value)) < 200, len(str(e.value))
    with pytest.raises(ValueError, match=r"^--set expects key=value") as e:
        parse_override("v" * 100_000)
    assert len(str(e.value)) < 200, len(str(e.value))


# -- 8: help and version text that cannot be written ------------------------------------------


def _help(tmp_path: Path, argv: list[str], stdout) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("FEDPRIVOPT_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "fedprivopt.cli", *argv],
        cwd=tmp_path,
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("argv", "name"),
    [(["--help"], "fedprivopt"), (["simulate", "--help"], "fedprivopt simulate")],
)
def test_8_help_on_a_full_disk_is_one_line(argv, name, tmp_path):
    with open("/dev/full", "w") as full:
        proc = _help(tmp_path, argv, full)
    assert (
        _one_line(proc) == f"{name}: error: cannot write standard output: No space left on device"
    )


def test_8_help_to_a_pipe_whose_reader_left_is_141_and_a_file_gets_it_all(tmp_path):
    read, write = os.pipe()
    os.close(read)
    try:
        proc = _help(tmp_path, ["--version"], write)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")
    with open(tmp_path / "help.txt", "w") as out:
        proc = _help(tmp_path, ["--help"], out)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert (tmp_path / "help.txt").read_text().startswith("usage: fedprivopt")


# -- 9: a task by reference whose num_users is not a count -------------------------------------


class _Users:
    """The toy task with another ``num_users``."""

    def __init__(self, count) -> None:
        from fedprivopt.models.toy import ToyClassificationTask

        self._task = ToyClassificationTask(num_users=4)
        self.num_users = count

    def __getattr__(self, name: str):
        return getattr(self._task, name)


_COUNT = {}


def _make(**_params):
    return _Users(_COUNT["value"])


@pytest.mark.parametrize("count", ["40", -3, None, True, 0])
def test_9_a_task_whose_num_users_is_not_a_count_is_named(count):
    from fedprivopt.models.registry import build_task

    _COUNT["value"] = count
    with pytest.raises(ValueError, match=r"the factory's task has num_users = .*integer >= 1"):
        build_task(f"{__name__}:_make")


def test_9_a_numpy_count_is_a_count():
    import numpy as np

    from fedprivopt.models.registry import build_task

    _COUNT["value"] = np.int64(4)
    assert build_task(f"{__name__}:_make").num_users == 4
