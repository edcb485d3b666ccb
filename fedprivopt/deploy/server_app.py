"""The deployment ServerApp: ``[tool.flwr.app.components] serverapp`` of the Flower app.

``flwr run . <connection>`` makes the SuperLink start this app with the run config of
``pyproject.toml`` (plus the ``--run-config`` overrides). Its main validates the run config
(:func:`~fedprivopt.deploy.runconfig.run_config_from_flower`), builds the task and the server
algorithm, and runs the rounds with :func:`~fedprivopt.simulation.engines.serve_flower`, so the run
directory (``out``) holds the same ``config.toml``, ``metrics.jsonl``, ``checkpoint.pt`` and
``summary.json`` as ``fedprivopt simulate``. The server logs ε after every round.

The run directory is written by the ServerApp process, on the SuperLink's machine; ``out`` is best
given as an absolute path (a relative one is taken from that process's working directory). It is
claimed and locked as ``simulate`` claims it (:class:`~fedprivopt.simulation.rundir.NewRunDir`):
new or empty, except for the ``deploy`` log directory that ``fedprivopt deploy local`` keeps
there; a start that fails before its first round leaves no half-made run.
"""

from __future__ import annotations

import logging
import os
import threading
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from fedprivopt.core.logs import log_warnings_to_stderr
from fedprivopt.core.text import epsilon_text
from fedprivopt.deploy.runconfig import RUN_ID, run_config_from_flower
from fedprivopt.simulation.divergence import warning_line
from fedprivopt.simulation.engines import serve_flower
from fedprivopt.simulation.interrupt import stoppable_grid
from fedprivopt.simulation.run import build_run, check_task_dirs_outside
from fedprivopt.simulation.run_places import (
    refuse_inside_a_run,
    refuse_inside_held,
    refuse_inside_writing,
)
from fedprivopt.simulation.rundir import NewRunDir
from fedprivopt.simulation.writer import RunWriter, start_run_files

__all__ = ["app", "run_deployment"]

RUNTIME = "flower-deployment"
DEPLOY_LOGS = "deploy"  # fedprivopt.deploy.local's log directory inside the run directory


def _log_row(total: int):
    def report(row: dict[str, Any]) -> None:
        shown = " ".join(f"{k}={row[k]:.4f}" for k in ("eval_loss", "eval_accuracy") if k in row)
        log(
            INFO,
            "[fedprivopt] round %d/%d: epsilon=%s (delta=%g) %s",
            row["round"],
            total,
            epsilon_text(row["epsilon"], 6),  # rounded up (forty-third review, docs 15)
            row["delta"],
            shown,
        )

    return report


def _out_dir(template: str, run_id: int) -> Path:
    out = Path(template.replace(RUN_ID, str(run_id))).expanduser()
    return out if out.is_absolute() else Path(os.getcwd()) / out


def run_deployment(grid: Grid, context: Context) -> dict[str, Any]:
    """Body of the ServerApp's main; returns the run summary (also in ``summary.json``)."""
    config, options = run_config_from_flower(context.run_config)
    out_dir = _out_dir(options.out, context.run_id)
    # forty-second review of issue 15 (lead 9; the outputs follow-up's open row): a ServerApp
    # reached by flwr run without deploy local wrote a run inside a finished run's directory
    refuse_inside_a_run(out_dir, "out")
    # forty-seventh review of issue 15 (processes 3; the forty-third review follow-up's open
    # row): nor inside a run another process is starting (run.lock alone), a running
    # deployment's OUT/deploy, or a comparison, tuning or deployment being written (out =
    # "T/runs/trial-003" while tune --out T ran took that trial's place), as simulate and
    # deploy local refuse them. Strict ancestors only: this deployment's own OUT/deploy is not one
    refuse_inside_held(out_dir, "out")
    refuse_inside_writing(out_dir, "out")
    # the task's data-dir or cache-dir inside out, which simulate and deploy local refuse: its
    # synthetic data or token store was written into the run (processes 3); checked before the
    # task is built, which may generate the data
    check_task_dirs_outside(config, out_dir)
    task, alg = build_run(config)
    with NewRunDir(out_dir, allowed=(DEPLOY_LOGS,)) as out:
        ledger = start_run_files(out, config, alg, task)
        log(INFO, "[fedprivopt] run %s writes to %s", context.run_id, out)
        writer = RunWriter(out, config, alg, task, ledger)
        writer.progress = _log_row(config.strategy.num_server_rounds)
        # Flower's deployment grid pulls for replies every 3 s; this one at most every second
        prompt = stoppable_grid(grid, threading.Event())  # never stopped: signals end the process
        reason = serve_flower(prompt, config, task, alg, writer, min_nodes=options.min_nodes)
        alg.stopped_reason = reason
        if alg.round_num and alg.round_num % config.checkpoint_every:
            writer.save_checkpoint()
        # what only a deployment knows, beside what the writer knows of every run
        extra = {"runtime": RUNTIME, "flower_run_id": int(context.run_id)}
        summary = writer.write_summary(reason, extra)
    log(
        INFO,
        "[fedprivopt] finished after %d rounds (%s): epsilon=%s at delta=%g; results in %s",
        alg.round_num,
        reason,
        epsilon_text(summary["epsilon"], 6),
        config.strategy.delta,
        out,
    )
    if writer.diverged is not None:
        log(WARNING, "[fedprivopt] %s", warning_line(writer.diverged))
    return summary


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run one fedprivopt deployment (see :func:`run_deployment`).

    Logging as the command line sets it (``cli.main``): dp-accounting's notes on the RDP orders
    it drops go through absl, whose first note gave the root logger ``logging.basicConfig``'s
    handler, and every later Flower line of ``flwr log`` was printed twice (``INFO:flwr:...``;
    forty-third review of issue 15, docs 17).
    """
    logging.getLogger("absl").setLevel(logging.ERROR)
    log_warnings_to_stderr()
    run_deployment(grid, context)
