"""Issue 15, forty-seventh hostile review, follow-up (outputs: the first wave's input and output
fixes, and its open rows): tests.

1. The processes reviewer's open row: the Python API ``fedprivopt.data.generate(R / "sub",
   SyntheticConfig(num_clients=3), workers=1)`` while another open file holds ``R`` with only
   ``run.lock`` written (a run starting; ``NewRunDir(R)`` held in-process; the test holds
   its ``flock`` as ``rundir.lock_directory`` does). Before: the dataset
   was written into the run (``stackoverflow.sqlite`` and its three companions in ``R/sub``),
   rc 0, where ``data synth --out R/sub`` refuses it. Now ``run_files_around`` (which
   ``generate``, ``data synth`` and a task's generation or token cache ask) knows an ancestor
   holding ``run.lock`` that is held: ``ValueError`` naming it, nothing written; once the run
   let go (``run.lock`` alone, a start's debris) the call writes as before.
2. The input reviewer's note: ``simulate stackoverflow-tp-mini.toml --set
   task-params.data-dir=D/<300 a's> --set task-params.synthetic=true`` (also ``D/ok/<300
   a's>/x``, 130 two-byte letters, ``task-params.cache-dir`` with ``token-cache``). Before:
   ``'D/aaa…/stackoverflow.sqlite' (347 characters): File name too long``, naming no key, where
   ``--out`` of the same text names its flag and the limit. Now ``check_dir_text`` (the task's
   ``data_dir`` and ``cache_dir``): ``config: data_dir: a path component is 300 bytes long, the
   limit is 255: ...``, rc 2, nothing made.
3. The input reviewer's note: ``deploy local --timeout ２`` (a full-width digit; also ``٣``).
   Before: read as 2 s (``float()`` reads any Unicode digit), where ``--nodes ２`` and every
   other command's numbers are refused. Now ``deploy.cli._timeout_flag`` refuses non-ASCII text:
   ``--timeout must be a number of seconds in (0, 2.592e+06], got '２'``; ``2``, ``1e-300`` and
   ``1_0`` (10 s, as TOML and ``--noise-multipliers`` read it) as before.
4. The api reviewer's open row: a task of one's own whose optional member is a property that
   raises its own exception (a file it reads gone: ``OSError``): ``primary_metric``,
   ``word_count_path`` (AdaDPS' bag-of-words side information), ``initialization`` or ``name``
   (``PROP47=<member> PYTHONPATH=mods fedprivopt simulate toy.toml --rounds 1 --set
   task=propraise47:make --set strategy=adadps``). Before: a traceback ending ``OSError: index
   file gone``, rc 1, for each (``getattr(task, name, default)`` catches ``AttributeError``
   alone). Now ``models.task_calls.task_attribute`` reads each (``models.task.primary_metric``,
   ``side_information_config.bag_of_words_shape`` and ``_build``, ``RunWriter.__init__``,
   ``run.build_run``, ``registry.build_task`` of a task by reference; also ``reference``,
   ``data_identity``, ``private_evaluation_users`` and ``cohort_trainer``, each a traceback
   too: ``reference`` after the rounds were released, as its call's own error ends):
   ``PropRaise.primary_metric raised OSError at propraise47.py:6: index file gone``, rc 2,
   nothing written; a property raising ``AttributeError`` reads as absent as before.
5. A way around input 1 (a setting given as a subclass of ``str``): the Python API
   ``simulate(replace(load_config(toy), task_params={"num_users": 40, K.SEED: 3}), out)``, a
   task parameter's KEY a ``(str, Enum)`` member (also a table's key inside a parameter).
   Before: the run went on with seed 3 (the key equals ``"seed"``), rc 0, and ``config.toml``
   recorded ``K.SEED = 3`` (its ``str``: a table ``K``), so ``simulate --resume`` was refused for
   ever (``task-params.K.SEED = 3, but the run's privacy ledger records ... "(not set)"``). Now
   ``config_values.plain_task_params`` gives each key as plain text (``plain_scalar``):
   ``seed = 3`` recorded, and the resume runs (2 rounds, epsilon 10.28).
6. Beside 5: ``RunConfig(task_params={"num_users": 40, 1: 3})`` (also ``b"seed"`` or ``None``
   as a parameter's name). Before: taken; ``simulate(config, out)`` ended in ``TypeError:
   keywords must be strings`` and ``config_to_toml`` in ``TypeError: expected string or
   bytes-like object, got 'int'``, naming nothing. Now ``ValueError`` 'task-params: a
   parameter's name is text in a run's config.toml, got 1', as a table's keys inside a
   parameter are refused.
"""

from __future__ import annotations

import enum
import fcntl
import os
import sys
import types

import pytest
import tomllib


def test_1_generate_refuses_a_directory_inside_a_run_that_is_starting(tmp_path):
    from fedprivopt.data import generate
    from fedprivopt.data.synthetic_config import SyntheticConfig
    from fedprivopt.data.synthetic_files import run_files_note

    run = tmp_path / "R"
    run.mkdir()
    (run / "run.lock").write_text(f"{os.getpid()}\n")
    fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)  # as NewRunDir holds it (lock_directory)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for target in (run / "sub", run / "a" / "b"):
            with pytest.raises(ValueError, match=r"which holds run\.lock \(a run into it starts"):
                generate(target, SyntheticConfig(num_clients=3), workers=1)
            assert not os.path.lexists(target)
        assert "run.lock" in (run_files_note(run / "cache") or "")  # a task's token cache
    finally:
        os.close(fd)
    # let go: run.lock alone (a start's debris) is no run, as before (generate writes there;
    # not called here: its token-store import costs 4 s of torch)
    assert run_files_note(run / "sub") is None


def test_2_a_data_dir_component_too_long_is_refused_naming_the_key(tmp_path):
    from fedprivopt.models.stackoverflow_datadir import StackOverflowDataDir, check_dir_text

    for long, size in (("a" * 300, 300), ("\u00e9" * 130, 260)):
        for text in (tmp_path / long, tmp_path / "ok" / long / "x"):
            task = StackOverflowDataDir()
            with pytest.raises(ValueError, match=rf"^data_dir: a path component is {size} bytes"):
                task._set_data_dir(
                    text,
                    synthetic=True,
                    synth_clients=3,
                    synth_vocab=None,
                    synth_tags=None,
                    synth_seed=None,
                )
        with pytest.raises(ValueError, match=r"^cache_dir: a path component is .* limit is 255"):
            check_dir_text("cache_dir", tmp_path / long)
    assert sorted(os.listdir(tmp_path)) == []
    fits = tmp_path / ("a" * 255)  # at the limit: as before
    assert check_dir_text("data_dir", fits) == fits


def test_3_deploy_timeout_refuses_digits_that_are_not_ascii(monkeypatch):
    from fedprivopt.deploy.cli import _timeout_flag

    # deploy.local_checks imports the run configuration (torch: 7 s under load): its
    # check_timeout, which refuses None naming --timeout, is stood in for by what it is given
    given = []
    checks = types.ModuleType("fedprivopt.deploy.local_checks")
    checks.check_timeout = lambda value, shown_as=None: given.append(value) or value
    monkeypatch.setitem(sys.modules, "fedprivopt.deploy.local_checks", checks)
    for text in ("\uff12", "\u0663", "1\uff10", "2", "1e-300", "1_0", " 5 "):
        _timeout_flag(text)
    assert given == [None, None, None, 2.0, 1e-300, 10.0, 5.0]


def _raises_its_own(self):
    raise OSError("index file gone")


def _absent(self):
    raise AttributeError("not this one")


def test_4_a_task_property_raising_its_own_error_is_one_line_naming_it(tmp_path, monkeypatch):
    from fedprivopt.models import build_task
    from fedprivopt.models import task as tasks
    from fedprivopt.models.side_information_config import bag_of_words_shape
    from fedprivopt.models.task import TaskError, primary_metric
    from fedprivopt.simulation.config import RunConfig
    from fedprivopt.simulation.fast_trainer import UserTrainer
    from fedprivopt.simulation.run import build_run
    from fedprivopt.simulation.tune_notes import selection_users
    from fedprivopt.simulation.writer import RunWriter

    reads = {
        "primary_metric": primary_metric,
        "word_count_path": bag_of_words_shape,
        "initialization": lambda task: RunWriter(tmp_path, None, None, task),
        "name": lambda task: build_run(RunConfig(), task),
        # the other optional members read so (a traceback each, rc 1, before)
        "reference": lambda task: RunWriter._reference(types.SimpleNamespace(task=task)),
        "data_identity": tasks.data_identity,
        "private_evaluation_users": lambda task: selection_users([task]),
        "cohort_trainer": lambda task: UserTrainer(
            task, device="cpu", vectorize=True, chunk_users=1, secure=False
        ),
    }
    for member, read in reads.items():
        own = type("PropRaise", (), {member: property(_raises_its_own)})
        with pytest.raises(TaskError, match=rf"^PropRaise\.{member} raised OSError at .*: index"):
            read(own())
    assert os.listdir(tmp_path) == []
    # a task by reference: isinstance(task, Task) read each member (hasattr) in build_task
    module = tmp_path / "mods" / "propraise47fo.py"
    module.parent.mkdir()
    module.write_text(
        "class PropRaise:\n"
        "    @property\n"
        "    def name(self):\n"
        "        raise OSError('index file gone')\n"
        "def make():\n"
        "    return PropRaise()\n"
    )
    monkeypatch.syspath_prepend(str(module.parent))
    with pytest.raises(TaskError, match=r"^PropRaise\.name raised OSError at propraise47fo"):
        build_task("propraise47fo:make")
    # a property raising AttributeError reads as absent, as before
    absent = type("Absent", (), {"primary_metric": property(_absent)})
    assert primary_metric(absent()) == "eval_accuracy"
    assert bag_of_words_shape(type("Absent", (), {"word_count_path": property(_absent)})()) is None


def test_5_a_task_parameter_key_given_as_a_str_subclass_is_recorded_as_its_text():
    from fedprivopt.simulation.config import RunConfig, config_to_toml

    class Key(str, enum.Enum):
        SEED = "seed"
        A = "a"

    config = RunConfig(task_params={"num_users": 40, Key.SEED: 3, "extra": {Key.A: 1}})
    assert [type(k) for k in config.task_params] == [str, str, str]
    assert [type(k) for k in config.task_params["extra"]] == [str]
    recorded = tomllib.loads(config_to_toml(config))["task-params"]
    assert recorded == {"num_users": 40, "seed": 3, "extra": {"a": 1}}


def test_6_a_task_parameter_name_that_is_not_text_is_refused_naming_task_params():
    from fedprivopt.simulation.config import RunConfig

    for name in (1, b"seed", None):
        with pytest.raises(ValueError, match=r"^task-params: a parameter's name is text in a run"):
            RunConfig(task_params={"num_users": 40, name: 3})
