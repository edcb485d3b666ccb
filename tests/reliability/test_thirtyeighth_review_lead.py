"""Issue 15, thirty-eighth review: the lead's findings.

1. ``simulate toy.toml --engine flower --rounds 1 --quiet`` ended rc 0 with its one result
   line, and then six lines on stderr no user can act on: Flower's ``DEPRECATED FEATURE: The
   `run_simulation` function is deprecated …`` (the engine's own call; it named ``flwr run`` as
   the remedy) and Ray's ``FutureWarning: Tip: In future versions of Ray, Ray will no longer
   override accelerator visible devices env var if num_gpus=0 …`` (the engine asks for no GPU
   on purpose). ``core.logs.hide_engine_notices`` (called by ``log_warnings_to_stderr``, which
   every command and worker calls first) drops exactly these two; Flower's other warnings and
   other ``FutureWarning`` s still print.
2. (the rundirs reviewer's open row) ``simulate stackoverflow-tp-mini.toml --set
   task-params.data-dir=D --set task-params.token-cache=true --out D/.fedprivopt-cache`` (no
   ``cache-dir``): rc 0, the token store and its lock written into the run directory beside
   its ``config.toml`` (the twenty-second review's refusal covered a ``cache-dir`` given, not
   its default ``<data-dir>/.fedprivopt-cache``). ``run.check_task_dirs_outside`` checks that
   default as ``cache-dir``: rc 2, one line, before anything is written.
3. (the rundirs reviewer's open row) ``compare toy.toml --strategies dp-fedavg --rounds 1 --out
   C1``, then ``mkdir C2; ln -s C1/runs C2/runs; compare … --rounds 2 --out C2 --overwrite``:
   rc 0, C1's one-round cell replaced through the link by a two-round run, so C1's
   ``summary.csv`` and ``report.md`` no longer matched its runs (the sixth review refused a
   cell that is a link, not a linked ``runs/``). ``cell_plans.plan_cells`` refuses a cell to
   run, resume or rerun whose directory resolves outside ``--out``: rc 2, one line; C1 kept.
4. (the rundirs reviewer's open row) ``TMPDIR=D fedprivopt deploy local toy.toml --nodes 1
   --insecure --rounds 1 --out D`` (D empty): the deployment made its working directory (CA,
   keys, Flower's home) inside D, started SuperLink and SuperNode, and its ServerApp refused D
   for holding it: rc 1 after about 3.5 minutes, 34 lines and a traceback. ``deploy local``
   refuses a temporary directory that is ``--out`` or inside it before anything starts
   (``deploy.cli._check_temp_outside``): rc 2, one line naming TMPDIR; D stays empty.
5. (the follow-up rundirs reviewer's open row) ``RAY_TMPDIR= simulate toy.toml --engine flower
   --rounds 1`` (``export RAY_TMPDIR=$SCRATCH`` with ``SCRATCH`` unset; also ``RAY_TMPDIR=rt``,
   a relative path), ``--out`` anywhere: Ray takes the variable as it is and failed, rc 1 after
   about 50 s, 130 lines with 6 tracebacks, ``./ray`` left in the working directory.
   ``ray_processes.check_ray_temp_dir`` refuses an empty or relative directory before Ray
   starts: rc 2, one line naming the variable.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest

from fedprivopt.core.logs import (
    RAY_ACCELERATOR_TIP,
    RUN_SIMULATION_DEPRECATED,
    hide_engine_notices,
    log_warnings_to_stderr,
)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_1_flowers_notice_of_the_engines_own_call_is_dropped_and_no_other():
    from flwr.supercore.logger import warn_deprecated_feature

    records = _Records()
    flower = logging.getLogger("flwr")
    flower.addHandler(records)
    try:
        log_warnings_to_stderr()
        hide_engine_notices()  # twice: one filter, not two
        warn_deprecated_feature(RUN_SIMULATION_DEPRECATED + " and will be removed …")
        warn_deprecated_feature("something a user of Flower calls")
    finally:
        flower.removeHandler(records)
    assert len(records.lines) == 1, records.lines  # before: 2 (the engine's notice printed)
    assert "something a user of Flower calls" in records.lines[0]
    assert sum(type(f).__name__ == "_EngineNotices" for f in flower.filters) == 1


def test_1_rays_accelerator_tip_is_ignored_and_no_other_future_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hide_engine_notices()
        tip = RAY_ACCELERATOR_TIP + " visible devices env var if num_gpus=0"
        warnings.warn(tip, FutureWarning, stacklevel=1)
        warnings.warn("another future change", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another future change"]


TP_MINI = Path(__file__).resolve().parents[2] / "simulations" / "stackoverflow-tp-mini.toml"


def test_2_the_default_token_cache_inside_out_is_refused(tmp_path):
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import check_task_dirs_outside

    data = tmp_path / "D"
    config = load_config(
        TP_MINI, {"task-params.data-dir": str(data), "task-params.token-cache": True}
    )
    with pytest.raises(ValueError, match=r"task-params\.cache-dir = .*\.fedprivopt-cache.*default"):
        check_task_dirs_outside(config, data / ".fedprivopt-cache")  # before: no error
    check_task_dirs_outside(config, tmp_path / "elsewhere")
    off = load_config(TP_MINI, {"task-params.data-dir": str(data)})
    check_task_dirs_outside(off, data / ".fedprivopt-cache")  # no store without token-cache


def test_3_a_compare_does_not_write_through_a_linked_runs_directory(tmp_path, capsys):
    from fedprivopt.cli import main
    from fedprivopt.simulation.ledger import RunLedger

    toy = str(TP_MINI.parent / "toy.toml")
    small = ["--set", "population=12", "--set", "clients-per-round=4", "--set",
             "task-params.num-users=12", "--quiet"]  # fmt: skip
    first = tmp_path / "C1"
    assert main(["compare", toy, "--strategies", "dp-fedavg", "--rounds", "1", "--out",
                 str(first), *small]) == 0  # fmt: skip
    (second := tmp_path / "C2").mkdir()
    (second / "runs").symlink_to(first / "runs")
    capsys.readouterr()
    rc = main(["compare", toy, "--strategies", "dp-fedavg", "--rounds", "2", "--out",
               str(second), "--overwrite", *small])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "leads out of --out" in err[0], (rc, err)  # before: 0
    (cell,) = (first / "runs").iterdir()
    assert RunLedger.read(cell).last_round == 1


def test_4_deploy_local_refuses_a_temporary_directory_inside_out(tmp_path, monkeypatch, capsys):
    import tempfile

    from fedprivopt.cli import main

    out = tmp_path / "D"
    out.mkdir()
    monkeypatch.setenv("TMPDIR", str(out / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(out / "tmp"))  # as a process started so
    rc = main(["deploy", "local", str(TP_MINI.parent / "toy.toml"), "--nodes", "1",
               "--insecure", "--rounds", "1", "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "TMPDIR" in err[0], (rc, err)  # before: started
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("value", ["", "rt", "./scratch"])
def test_5_an_empty_or_relative_ray_tmpdir_is_refused_before_ray_starts(monkeypatch, value):
    from fedprivopt.simulation import ray_processes

    monkeypatch.setenv("RAY_TMPDIR", value)
    with pytest.raises(ValueError, match=r"RAY_TMPDIR = .*empty or relative"):  # before: taken
        ray_processes.check_ray_temp_dir("fast-actors")
    monkeypatch.setenv("RAY_TMPDIR", "/tmp")
    ray_processes.check_ray_temp_dir("fast-actors")
