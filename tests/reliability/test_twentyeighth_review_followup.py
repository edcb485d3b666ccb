"""Issue 15, twenty-eighth hostile review, follow-up: regression tests of its findings.

1. SIGHUP to the process group (the terminal closed) of ``compare stackoverflow-tp-mini.toml
   --strategies dp-fedavg,dp-fedadam --rounds 400 --jobs 2`` a few seconds in: rc 129, but
   stderr also carried the workers' "interrupted twice; ended at once" lines, multiprocessing's
   "resource_tracker: process died unexpectedly, relaunching" warning and five ``KeyError:
   '/mp-...'`` tracebacks (the resource tracker ignores SIGINT and SIGTERM but died of SIGHUP;
   the workers ran the parent's handler). SIGINT and SIGTERM of the group gave one line.

3. ``simulate stackoverflow-tp-mini.toml --set task-params.data-dir=~/sodata`` (quoted: the
   shell leaves the ``~``) ended rc 0 after generating the dataset into ``./~/sodata``, a
   directory named ``~`` in the current directory, where ``--out "~/x"`` and a preset
   ``"~/x.toml"`` are expanded. A leading ``~`` of ``task-params.data-dir`` and
   ``task-params.cache-dir`` is now expanded where the configuration is read (simulate,
   compare, tune, deploy, ``--resume``) and by the tasks themselves (Python API).
4. ``data.synthetic.user_size_knobs([1])`` raised ``TypeError: unhashable type: 'list'``
   rather than a ``ValueError`` naming the parameter.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from fedprivopt.data.synthetic_config import user_size_knobs
from fedprivopt.simulation.config import load_config
from tests.reliability.test_twentyeighth_review import _main as _in_process
from tests.reliability.test_twentyeighth_review import _started

ROOT = Path(__file__).resolve().parents[2]
MINI = ROOT / "simulations" / "stackoverflow-tp-mini.toml"
# a dataset small enough to generate and train on in about a second
SMALL = {
    "task-params.synth-clients": 40,
    "task-params.num-users": 30,
    "task-params.eval-users": 5,
    "population": 30,
    "clients-per-round": 5,
    "task-params.synth-vocab": 400,
    "task-params.vocab-size": 200,
    "task-params.synth-tags": 20,
    "task-params.num-tags": 10,
    "num-server-rounds": 2,
}


# -- finding 1: compare --jobs 2 and SIGHUP of the process group ---------------------------------


def _rows(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups, /proc")
@pytest.mark.parametrize("name", ["SIGHUP"])
def test_1_compare_jobs_signalled_as_a_group_is_one_line_and_continues(name, tmp_path, monkeypatch):
    sets = [f"--set={k}={v}" for k, v in SMALL.items() if k != "num-server-rounds"]
    sets.append(f"--set=task-params.data-dir={tmp_path / 'data'}")
    argv = ["compare", str(MINI), "--strategies", "dp-fedavg,dp-fedadam", "--rounds", "120",
            "--jobs", "2", "--out", "cmp", "--quiet", *sets]  # fmt: skip
    runs = tmp_path / "cmp" / "runs"
    proc = _started(tmp_path, *argv)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = list(runs.glob("*/metrics.jsonl"))
            if len(metrics) == 2 and all(_rows(m) >= 2 for m in metrics):
                break  # both workers are running their cells
            time.sleep(0.05)
        assert proc.poll() is None, "compare ended before the signal"
        os.killpg(proc.pid, getattr(signal, name))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + getattr(signal, name), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "interrupted; the same command continues it" in lines[0], err
    again = _in_process(tmp_path, monkeypatch, *argv)  # the same command, in this process
    assert again.returncode == 0, again.stderr
    assert "report" in again.stdout + again.stderr


# -- finding 3: task-params.data-dir / cache-dir given with a leading ~ ---------------------------


def test_3_the_task_directories_tilde_is_expanded_in_the_configuration(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    overrides = {"task-params.data-dir": "~/sodata", "task-params.cache-dir": "~/cache"}
    config = load_config(MINI, overrides)
    assert config.task_params["data_dir"] == str(tmp_path / "sodata")
    assert config.task_params["cache_dir"] == str(tmp_path / "cache")
    # anything else is left as given (a relative path stays relative)
    assert load_config(MINI).task_params["data_dir"] == "data/stackoverflow-synthetic-mini"


def test_3_the_task_expands_a_tilde_itself(monkeypatch, tmp_path):
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # before the fix, ./~ was made here
    task = StackOverflowTagTask(
        data_dir="~/sodata",
        synthetic=True,
        synth_clients=40,
        synth_vocab=400,
        synth_tags=20,
        vocab_size=200,
        num_tags=10,
        num_users=30,
        eval_users=5,
        token_cache=True,  # a cache_dir applies only with it (thirty-first review)
        cache_dir="~/cache",
    )
    assert task.data_dir == tmp_path / "home" / "sodata"
    assert task.cache_dir == tmp_path / "home" / "cache"
    assert (tmp_path / "home" / "sodata").is_dir() and not (tmp_path / "~").exists()


def test_3_simulate_generates_the_dataset_under_home_and_resumes(tmp_path, monkeypatch):
    sets = [f"--set={k}={v}" for k, v in SMALL.items()]
    argv = ["simulate", str(MINI), "--out", "run", "--quiet", *sets]
    done = _in_process(tmp_path, monkeypatch, *argv, "--set=task-params.data-dir=~/sodata")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "~").exists()
    assert (tmp_path / "home" / "sodata" / "stackoverflow.sqlite").is_file()
    again = _in_process(tmp_path, monkeypatch, "simulate", "--resume", "run")
    assert again.returncode == 0, again.stderr
    assert not (tmp_path / "~").exists()


# -- finding 4: user_size_knobs of a non-string ----------------------------------------------------


@pytest.mark.parametrize("value", [[1], {"small": 1}, None, 1])
def test_4_user_size_knobs_of_a_non_string_is_a_value_error_naming_it(value):
    with pytest.raises(ValueError, match="synth_user_sizes must be one of small, real"):
        user_size_knobs(value, "synth_user_sizes")
    with pytest.raises(ValueError, match="user_sizes must be one of"):
        user_size_knobs(value)
