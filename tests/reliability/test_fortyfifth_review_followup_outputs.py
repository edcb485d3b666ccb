"""Issue 15, follow-up of the forty-fifth hostile review (outputs: the input and processes fixes).

1. The twin of the forty-fifth review's processes 1 for the other commands (the processes
   reviewer's open row): while ``deploy local toy.toml --nodes 1 --rounds 40 --out D`` starts
   (``D`` then holds only its ``deploy/``, held with ``deploy.lock``; the ServerApp claims ``D``
   some 30 s later), ``simulate toy.toml --rounds 1 --out D/s``, ``compare toy.toml --strategies
   dp-fedavg --rounds 1 --out D/c``, ``tune ... --out D/t``, ``compare-tuned T --out D/ct`` and the
   Python API's ``simulate(config, "D/s")``. Before: rc 0 each (measured with a process holding
   ``D/deploy`` as a deployment does), a run written into ``D``, whose deployment's ServerApp
   then refuses ``D`` as not empty after its SuperLink and SuperNodes started (``deploy local
   --out D/x`` was refused by ``deploy.out_checks.refuse_inside_writing`` since processes 1, and
   ``data synth --out D/x`` by its own claim). Now rc 2 before anything is written, ``argument
   --out: D/s is inside the deployment's directory D, which process N holds: ...``
   (``simulation.run_places.refuse_inside_held``, which the command line's ``--out`` check and
   the Python API's ``simulate`` call, looks at an ancestor's held ``deploy/deploy.lock`` too).
   ``D/deploy/x`` is named as the deployment's log directory as before; a finished deployment's
   directory (``deploy/`` not held) is not refused by this check. (In-process: the deployment's
   hold of ``D/deploy`` taken with ``rundir.lock_directory``, as ``deploy_local`` takes it; no
   process starts.)
2. The twin of the forty-fifth review's input 4 (a synthetic dataset's knobs as NumPy scalars)
   for other Python values the knobs' checks take: ``fedprivopt.data.generate(out,
   SyntheticConfig(question_fraction=Fraction(1, 4)))`` (any real knob as a
   ``fractions.Fraction``, a ``numbers.Real``) and ``start_date=datetime.date(2009, 1, 1)``
   (which ``numpy.datetime64`` reads). Before: the whole dataset was written, then ``TypeError:
   Object of type Fraction (date) is not JSON serializable`` at its marker, left ``"complete":
   false``, so every task refused the directory as an interrupted generation;
   ``mean_examples_per_client=Fraction(10)`` ended in NumPy's ``loop of ufunc does not support
   argument 0 of type Fraction``; ``start_date=2009`` (a year as a number) was read by NumPy as
   2009 seconds after 1970 and a dataset of 1970 dates written. Now a real knob is kept as its
   float, a date (``datetime.date``, ``numpy.datetime64`` of a day) as its ISO text, and a date
   of another type (a number, a ``datetime`` with its time) refused naming the knob
   (``data.synthetic_config._recordable``).
3. The twin of the forty-fifth review's input 3 (a directory named by a number, given with
   ``--set``) for a directory named by a date or time, a dated snapshot: ``simulate
   stackoverflow-tp-mini.toml --set task-params.data-dir=2024-01-01`` (also ``07:30:00``,
   ``2024-01-01T07:32:00Z``, ``task-params.cache-dir``, a strategy table's task-params; ``deploy
   local``, ``compare`` and ``tune`` read ``--set`` alike). Before: rc 2, ``config:
   task-params.data-dir: a TOML date or time is no setting (strings, numbers, booleans and arrays
   of them are), got '2024-01-01'``, where ``=2024`` is taken as the directory ``2024``. Now the
   date's text (``config_presets.parse_override``); a date for another key, ``true`` and
   ``false`` for a directory, are read as before.
4. The twin of the forty-fifth review's input 7 (a token store's ``cache_dir`` that cannot be
   made) for one that exists but cannot be written: a shared dataset's ``.fedprivopt-cache``
   that another user made (holding no store for these parameters), a read-only mount, here
   ``simulate stackoverflow-tp-mini.toml --set task-params.token-cache=true --set
   task-params.cache-dir=/sys/kernel`` (also ``/proc``, in-process). Before: rc 2 with
   ``/sys/kernel/<digest>.lock: Permission denied`` (``No such file or directory`` for ``/proc``),
   naming neither the parameter nor a way out (input 7's check makes the directory only). Now
   ``cache_dir '/proc': cannot be written (No such file or directory), and token_cache = true
   writes its token store there: set cache_dir to a directory you can write``
   (``TagTaskData._in_cache_dir``, ``_cache_dir_refusal``); a store built beforehand is read
   without writing, as before.
"""

from __future__ import annotations

import datetime
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from fedprivopt.data import generate
from fedprivopt.data.synthetic import read_marker
from fedprivopt.data.synthetic_config import SyntheticConfig
from fedprivopt.deploy.local_checks import DEPLOY_LOCK
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.config_presets import parse_override
from fedprivopt.simulation.run_places import refuse_inside_held
from fedprivopt.simulation.rundir import lock_directory

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"

INSIDE = "is inside the deployment's directory"


def test_1_other_commands_inside_a_starting_deployments_directory_are_refused(tmp_path, capsys):
    from fedprivopt.cli import main
    from fedprivopt.simulation.run import simulate

    d = tmp_path / "D"
    (d / "deploy").mkdir(parents=True)
    toy = str(TOY)
    commands = {
        "s": ["simulate", toy, "--rounds", "1"],
        "c": ["compare", toy, "--strategies", "dp-fedavg", "--rounds", "1"],
        "t": [
            "tune",
            toy,
            "--strategy",
            "dp-fedavg",
            "--grid",
            "server-learning-rate=0.5,1",
            "--mean-trials",
            "2",
            "--rounds",
            "1",
        ],
    }
    quiet = {name: ["--quiet"] for name in commands}
    commands["ct"], quiet["ct"] = ["compare-tuned", str(tmp_path / "T")], []
    with lock_directory(d / "deploy", DEPLOY_LOCK, what=f"--out {d}"):
        for name, argv in commands.items():
            assert main([*argv, "--out", str(d / name), *quiet[name]]) == 2, name
            err = capsys.readouterr().err
            assert INSIDE in err and err.count("\n") == 1, (name, err)
            assert "Traceback" not in err
        with pytest.raises(ValueError, match=INSIDE):
            simulate(load_config(TOY), d / "s" / "deeper")
        with pytest.raises(ValueError, match="deployment's log directory"):
            refuse_inside_held(d / "deploy" / "x")
        assert sorted(p.name for p in d.iterdir()) == ["deploy"]
    refuse_inside_held(d / "s")  # the deployment gone: not this check's refusal


# -- finding 2: a synthetic dataset's knobs as other Python values ------------------------------

SMALL = {"num_clients": 8, "vocab_size": 200, "num_tags": 5}


@pytest.mark.parametrize(
    ("knob", "value", "recorded"),
    [
        ("question_fraction", Fraction(1, 4), 0.25),
        ("mean_examples_per_client", Fraction(10), 10.0),
        ("start_date", datetime.date(2009, 1, 1), "2009-01-01"),
        ("cut_date", np.datetime64("2017-01-01"), "2017-01-01"),
    ],
)
def test_2_knobs_are_recorded_as_the_marker_holds_them(tmp_path, knob, value, recorded):
    files = generate(tmp_path / "d", SyntheticConfig(**SMALL, **{knob: value}), workers=1)
    marker = read_marker(files.meta)  # before: TypeError at the marker, "complete": false
    assert marker["config"][knob] == recorded and "complete" not in marker


@pytest.mark.parametrize("value", [2009, datetime.datetime(2009, 1, 1, 12)])
def test_2_a_date_of_another_type_is_refused_naming_the_knob(value):
    with pytest.raises(ValueError, match=r"^start_date must be an ISO date like '2018-01-01'"):
        SyntheticConfig(**SMALL, start_date=value)  # before: 2009 s after 1970 (or the time)


# -- finding 3: a directory named by a date or time, given with --set ---------------------------


@pytest.mark.parametrize("text", ["2024-01-01", "07:30:00", "2024-01-01T07:32:00Z"])
@pytest.mark.parametrize(
    "key", ["task-params.data-dir", "task-params.cache_dir", "strategies.dp2.task-params.data-dir"]
)
def test_3_a_directory_named_by_a_date_is_its_text(key, text):
    assert parse_override(f"{key}={text}") == (key, text)  # before: a date, refused by the run


def test_3_dates_elsewhere_and_booleans_are_unchanged():
    mini = TOY.parent / "stackoverflow-tp-mini.toml"
    config = load_config(mini, dict([parse_override("task-params.data-dir=2024-01-01")]))
    assert config.task_params["data_dir"] == "2024-01-01"
    assert parse_override("start=2024-01-01") == ("start", datetime.date(2024, 1, 1))
    assert parse_override("task-params.data-dir=false") == ("task-params.data-dir", False)


# -- finding 4: a token store's cache_dir that exists but cannot be written ---------------------


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_4_a_cache_dir_that_cannot_be_written_is_named(tmp_path):
    from fedprivopt.models import StackOverflowTagTask

    generate(tmp_path / "d", SyntheticConfig(**SMALL), workers=1)
    params = {"data_dir": tmp_path / "d", "vocab_size": 100, "num_tags": 5, "eval_users": 2}
    task = StackOverflowTagTask(**params, token_cache=True, cache_dir="/proc")
    with pytest.raises(ValueError, match=r"^cache_dir '/proc': cannot be written \("):
        task.encoded_users()  # before: /proc/<digest>.lock: No such file or directory
    built = StackOverflowTagTask(**params, token_cache=True, cache_dir=tmp_path / "c")
    assert built.encoded_users() is not None  # a directory that can be written: as before
