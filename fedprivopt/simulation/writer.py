"""Writing one run directory: its configuration, ledger lines, metrics rows, checkpoints, summary.

:func:`start_run_files` writes ``config.toml`` and the privacy ledger's header into a claimed
directory; :class:`RunWriter` then records every round (the ledger line first, then the metrics
row and the checkpoint) and finally writes ``summary.json``. The file layout:
:mod:`fedprivopt.simulation.files`. The summary's privacy statements (``threat_model``,
``not_covered``, the noise mechanism): :mod:`fedprivopt.simulation.summary_privacy`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from fedprivopt.clients.model_layout import ModelAtBuild
from fedprivopt.core.text import shown
from fedprivopt.models.task import Task, TaskError, data_identity, primary_metric
from fedprivopt.models.task_calls import task_attribute, task_call
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.flat import flatten, unflatten
from fedprivopt.simulation import interrupt
from fedprivopt.simulation.checkpoint import ROWS_DIGEST, RowsDigest, save_checkpoint
from fedprivopt.simulation.config import RunConfig, config_to_toml, side_information_of
from fedprivopt.simulation.divergence import (
    DIVERGED_KEY,
    checked_round,
    earliest,
    first_diverged,
    row_diverged,
)
from fedprivopt.simulation.files import (
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    atomic_write,
    json_line,
    read_rows,
    write_synced,
)
from fedprivopt.simulation.ledger import RunLedger
from fedprivopt.simulation.ledger_lines import tree_participants
from fedprivopt.simulation.rundir import check_held
from fedprivopt.simulation.summary_privacy import (
    DISTRIBUTED_VIEW_METRICS,
    SERVER_VIEW_METRICS,
)
from fedprivopt.simulation.summary_privacy import evaluated_model as _evaluated_model
from fedprivopt.simulation.summary_privacy import mechanism as _mechanism
from fedprivopt.simulation.summary_privacy import not_covered as _not_covered
from fedprivopt.simulation.summary_privacy import threat_model as _threat_model
from fedprivopt.simulation.summary_privacy import tuning_trial as _tuning_trial
from fedprivopt.simulation.tensorboard import TensorBoardLog, has_events
from fedprivopt.strategies.core import RoundResult, ServerAlgorithm

__all__ = [
    "DISTRIBUTED_VIEW_METRICS",
    "SERVER_VIEW_METRICS",
    "RunWriter",
    "checked_metrics",
    "start_run_files",
]


def start_run_files(
    out: Path,
    config: RunConfig,
    alg: ServerAlgorithm,
    task: Task | None = None,
    tuning_plan: str | None = None,
) -> RunLedger:
    """Write ``config.toml`` and the privacy ledger's header into a claimed, locked directory.

    ``out`` comes from :class:`~fedprivopt.simulation.rundir.NewRunDir` (new, empty, or a run
    of ours being overwritten). The ledger records ``task``'s
    :func:`~fedprivopt.models.task.data_identity`, checked on resume, and for a tuning's trial
    the digest of its plan (``tuning_plan``). Returns the new ledger.
    """
    data = None if task is None else data_identity(task)
    atomic_write(out / CONFIG_FILE, config_to_toml(config))
    return RunLedger.create(out, config, alg.accountant, data, tuning_plan)


class RunWriter:
    """Writes the ledger lines, rows, checkpoints and the summary of one run directory.

    With a ``ledger`` (every run of :func:`~fedprivopt.simulation.run.simulate`,
    :func:`~fedprivopt.simulation.run.resume` and a deployment) each round is recorded in it
    before its row, checkpoint or next broadcast, the accountant is set from it, and the
    summary's ε is composed from it. Without one (benchmarks) nothing is recorded.

    :attr:`diverged` is the first round whose released model or evaluation was not finite
    (:mod:`~fedprivopt.simulation.divergence`), ``None`` while there is none: on a resume the
    earliest of the checkpoint's ``diverged`` (given), the kept rows' and, when the restored
    model is not finite, its round. It goes into every checkpoint and the summary.
    """

    def __init__(
        self,
        out: Path,
        config: RunConfig,
        algorithm: ServerAlgorithm,
        task: Task,
        ledger: RunLedger | None = None,
        *,
        diverged: int | None = None,
    ):
        self.out = out
        self.config = config
        self.algorithm = algorithm
        self.task = task
        self.ledger = ledger
        self.rows = read_rows(out / METRICS_FILE)
        self.rows_digest = RowsDigest()  # of self.rows, in each checkpoint and the summary
        self.metric = primary_metric(task)
        self.initialization = task_attribute(task, "initialization")  # (follow-up outputs 4)
        if self.initialization is not None and not isinstance(self.initialization, str):
            raise TaskError(
                f"{type(task).__name__}.initialization must be a string (how build_model "
                f"initializes) or None, got {shown(self.initialization)}"
            )
        restored = algorithm.round_num if not _finite(algorithm.params) else None
        self.diverged = earliest(
            checked_round(diverged), first_diverged(self.rows, self.metric), checked_round(restored)
        )
        self.last_time = time.perf_counter()
        self.progress: Callable[[dict[str, Any]], None] | None = None
        self._eval_model: torch.nn.Module | None = None
        self._eval_spec = None
        self._eval_at_build: ModelAtBuild | None = None
        self.tensorboard = self._tensorboard() if config.tensorboard else None
        if self.tensorboard is None and has_events(out):  # resumed with tensorboard = false
            self._purge_events()
        if ledger is not None:
            algorithm.on_partial_release = self.on_partial_release

    def _tensorboard(self) -> TensorBoardLog:
        """The run's TensorBoard log, holding its earlier rows when no event file does.

        Thirty-fifth review of issue 15 (outputs, finding 10): a run made without TensorBoard
        whose ``config.toml`` was then given ``tensorboard = true`` (and more rounds) before
        ``--resume`` showed only the rounds after the resume (steps 3 of 1-3): the new event
        file purged from its first round, and nothing held the rows before it.

        Forty-fourth review follow-up of issue 15 (ledger 4): the same for rounds run by an
        earlier ``--resume`` with ``tensorboard = false`` (``--tensorboard`` to round 2, resumed
        without it to 4, then with it to 6): TensorBoard showed rounds 1, 2, 5, 6, since event
        files existed. The new event file purges every earlier event and holds every kept row.
        """
        log = TensorBoardLog(self.out)  # purges every earlier event (from step 0)
        for row in self.rows:  # the kept rows: up to the checkpoint's round (none from round 0)
            log.add_row(row)
        return log

    def _purge_events(self) -> None:
        """Purge the event files' steps after the restored round (a resume without TensorBoard).

        Forty-fourth review of issue 15 (ledger, finding 2): a secure ``--tensorboard`` run
        killed after round 3's row (checkpoint of round 2), resumed with ``tensorboard = false``
        in its ``config.toml``: TensorBoard showed round 3's first release (accuracy 0.63) beside
        the rows' redone round 3 (0.65). A new event file holding only TensorBoard's purge
        removes them from its view; the rounds up to the checkpoint stay shown.
        """
        TensorBoardLog(self.out, first_round=self.algorithm.round_num + 1).close()

    def save_checkpoint(self) -> None:
        """Checkpoint the algorithm (:func:`~fedprivopt.simulation.checkpoint.save_checkpoint`).

        The round was recorded in the privacy ledger by :meth:`on_round` already. The directory
        must still be the one this run locked (:func:`~fedprivopt.simulation.rundir.check_held`):
        forty-fourth review of issue 15 (ledger, finding 3), the last checkpoint, saved after the
        engine returned (Ray's and Flower's shutdown take seconds), was written into a new
        directory made at the run's path after it was moved away.
        """
        check_held(self.out)
        state = self.algorithm.state_dict()
        digest = self.rows_digest.of(self.rows)
        header = self.ledger.header if self.ledger is not None else None
        save_checkpoint(
            self.out, state, len(self.rows), self.diverged, rows_sha256=digest, ledger_header=header
        )

    def evaluate(self, params: torch.Tensor) -> dict[str, float]:
        """Central evaluation of ``params`` on the task's held-out data."""
        name = type(self.task).__name__
        if self._eval_model is None:  # built once; every evaluation loads the whole state
            with task_call(f"{name}.build_model()", f"{name}.build_model() must return"):
                self._eval_model = self.task.build_model()
            state = self._eval_model.state_dict()
            self._eval_spec = flatten(state)[1]
            self._eval_at_build = ModelAtBuild(self._eval_model, saved=set(state))
        model = self._eval_model
        # what an evaluate() set on the model (a buffer it registered) is removed first, as the
        # trainer does before every user (thirty-sixth review of issue 15, the tasks reviewer's
        # open case: a `Missing key(s) in state_dict` traceback at the next evaluation)
        self._eval_at_build.restore()
        model.load_state_dict(unflatten(params.detach().cpu(), self._eval_spec))
        # its own exception is one line (thirty-sixth review, the tasks reviewer's report)
        with task_call(f"{name}.evaluate()", f"{name}.evaluate() must return"):
            metrics = self.task.evaluate(model)
        metrics = checked_metrics(self.config.task, metrics)
        if self.metric not in metrics:
            # thirty-fifth review of issue 15 (outputs, finding 9): a task whose primary_metric
            # names no metric of its evaluate() ran to rc 0, its last line giving eval_loss and
            # a compare report eval_accuracy instead, without a word
            reported = ", ".join(sorted(k.removeprefix("eval_") for k in metrics)) or "none"
            raise TaskError(
                f"{name}.primary_metric is {shown(self.metric.removeprefix('eval_'))}, which its "
                f"evaluate() does not return (it returns {reported}); name one of them"
            )
        return metrics

    def wants_eval(self, round_num: int) -> bool:
        """Whether ``round_num`` is evaluated (every ``eval-every`` rounds and the last).

        The last is also the round after which the budget stops the run (called once the round
        is released). Fourteenth review of issue 15: with ``eval-every = 3`` and a target ε that
        allowed 4 rounds, ``summary.json`` gave round 3's ``eval_loss`` 0.7999 as the final one
        beside ``rounds_completed`` 4 and the ε of 4 rounds (round 4's model: 0.7660), and
        with ``eval-every = 5`` no metric at all.
        """
        c = self.config
        if round_num % c.eval_every == 0 or round_num == c.strategy.num_server_rounds:
            return True
        return (
            self.algorithm.round_num == round_num and not self.algorithm.budget_allows_next_round()
        )

    def on_partial_release(
        self, round_num: int, events: list[SubsampledGaussianEvent], point: torch.Tensor
    ) -> None:
        """Record the part of a round sent out before it ends (ADADP's half-step point).

        Its ledger line (fsynced) comes before the point leaves for the second cohort
        (:meth:`~fedprivopt.simulation.ledger.RunLedger.record_partial`).
        """
        check_held(self.out)
        self.ledger.record_partial(round_num, events, point)

    def on_round(self, result: RoundResult, eval_metrics: dict[str, float] | None) -> None:
        """Record one finished round: the ledger line, a metrics row if evaluated, a checkpoint.

        The ledger line (fsynced) comes first, before anything of the round leaves: its row, its
        checkpoint, the next round's broadcast. A signal meanwhile is raised once the round's
        checkpoint is saved (:func:`~fedprivopt.simulation.interrupt.held`; forty-eighth review
        of issue 15, processes 1: stopped between the two, a secure run released the round
        again on ``--resume``, with new noise, or could not be resumed at all with tree noise).
        """
        check_held(self.out)  # still the directory this run locked
        with interrupt.held():
            self._record_round(result, eval_metrics)

    def _record_round(self, result: RoundResult, eval_metrics: dict[str, float] | None) -> None:
        now = time.perf_counter()
        seconds, self.last_time = now - self.last_time, now
        r = result.round_num
        epsilon = result.metrics["epsilon"]
        if self.ledger is not None:
            alg = self.algorithm
            participants = tree_participants(alg)  # tree runs: checked against a checkpoint
            self.ledger.record(r, alg.round_events(r), result.params, alg.accountant, participants)
            epsilon = alg.epsilon()
        if self.diverged is None and (
            not _finite(result.params)
            or (eval_metrics is not None and row_diverged(eval_metrics, self.metric))
        ):
            self.diverged = r  # released and charged all the same; the summary says so
        if eval_metrics is not None:
            row = {
                "round": r,
                "epsilon": epsilon,
                "delta": self.config.strategy.delta,
                **eval_metrics,
                "seconds": seconds,
                **{k: v for k, v in result.metrics.items() if k != "epsilon"},
            }
            self.rows.append(row)
            write_synced(self.out / METRICS_FILE, json_line(row), mode="a")
            if self.tensorboard is not None:
                self.tensorboard.add_row(row)
            if self.progress is not None:
                self.progress(row)
        if r % self.config.checkpoint_every == 0 or r == self.config.strategy.num_server_rounds:
            self.save_checkpoint()

    def _reference(self) -> dict[str, Any] | None:
        """The task's untrained public reference model and its metrics (e.g. the tag prior)."""
        make = task_attribute(self.task, "reference")  # its own error named (outputs 4)
        if not callable(make):
            return None
        call = f"{type(self.task).__name__}.reference()"
        with task_call(call, f"{call} must return (name, metrics)"):  # (thirty-sixth review)
            value = make()
        if not (
            isinstance(value, tuple)
            and len(value) == 2
            and isinstance(value[0], str)
            and isinstance(value[1], Mapping)
        ):
            raise TaskError(
                f"{type(self.task).__name__}.reference() must return (name, metrics): a string "
                f"and a mapping of metric names to numbers, got {shown(value)}"
            )
        name, metrics = value
        task = self.config.task
        return {
            "name": name,
            "metrics": {
                f"eval_{k}": _metric_value(task, k, v, "reference()") for k, v in metrics.items()
            },
        }

    def epsilon(self) -> float:
        """ε of everything this directory released: from the ledger (the algorithm's without)."""
        if self.ledger is not None:
            return self.ledger.epsilon()
        return self.algorithm.epsilon()

    def write_summary(
        self, stopped_reason: str, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Write ``summary.json`` for the run as it stands (plus the entries of ``extra``)."""
        check_held(self.out)
        c = self.config
        side = side_information_of(c, self.task)
        final = {
            k: v for k, v in (self.rows[-1] if self.rows else {}).items() if k.startswith("eval_")
        }
        summary = {
            "strategy": c.strategy.strategy,
            "engine": c.engine,
            "task": c.task,
            "seed": c.strategy.seed,
            "noise_multiplier": c.strategy.noise_multiplier if c.strategy.private else 0.0,
            "rounds_completed": self.algorithm.round_num,
            "epsilon": self.epsilon(),
            "delta": c.strategy.delta,
            "accountant": c.strategy.accountant,
            "stopped_reason": stopped_reason,
            "primary_metric": self.metric,
            "final": final,
            DIVERGED_KEY: self.diverged,
            "noise_mode": c.strategy.noise_mode if c.strategy.private else "none",
            **_mechanism(self.algorithm.config),  # the sampled population's (public users out)
            # forty-sixth review of issue 15 (contract 2): a trial of a tuning says so
            "threat_model": _threat_model(c, side) + _tuning_trial(self.ledger_plan()),
            "not_covered": _not_covered(c, self.task),
            "evaluated_model": _evaluated_model(c),
            "initial_model": self.initialization,
            "side_information": None if side is None else side.summary(),
            "reference": self._reference(),
            "config": c.to_mapping(),
            ROWS_DIGEST: self.rows_digest.of(self.rows),  # checkpoint.check_rows_digest
        }
        summary.update(extra or {})
        atomic_write(self.out / SUMMARY_FILE, json.dumps(summary, indent=2, allow_nan=True))
        self.close()
        return summary

    def ledger_plan(self) -> str | None:
        """The tuning plan the run's ledger header names (a trial of a tuning), else ``None``."""
        header = self.ledger.header if self.ledger is not None else None
        plan = header.get("tuning_plan") if isinstance(header, Mapping) else None
        return plan if isinstance(plan, str) and plan else None

    def close(self) -> None:
        """Close the TensorBoard event file, if any (the rows are flushed as they are written)."""
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None


def checked_metrics(task: str, metrics: object) -> dict[str, float]:
    """``{"eval_" + name: value}`` of what the task's ``evaluate()`` returned, every value a float.

    Raises
    ------
    ValueError
        Naming ``task`` and the metric: ``metrics`` is not a mapping, or a value is not a number
        (twenty-third review of issue 15: ``could not convert string to float: 'high'``).
    """
    if not isinstance(metrics, Mapping):
        raise ValueError(
            f"task {shown(task)}: evaluate() returned {type(metrics).__name__!r}, not a "
            "mapping of metric names to numbers"
        )
    return {f"eval_{k}": _metric_value(task, k, v) for k, v in metrics.items()}


def _metric_value(task: str, key: object, value: object, method: str = "evaluate()") -> float:
    """``float(value)`` of the metric ``key`` the task's ``method`` returned, else a ``ValueError``.

    Twenty-third review of issue 15: a task by reference whose ``evaluate`` returned
    ``{"accuracy": "high"}`` (or ``None``) ended in ``error: could not convert string to float:
    'high'``, naming neither the task nor the metric.
    """
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError, RuntimeError):  # RuntimeError: a tensor
        raise ValueError(
            f"task {shown(task)}: {method} returned {shown(value)} for the metric {shown(key)}, "
            "not a number"
        ) from None


def _finite(params: torch.Tensor) -> bool:
    """Whether every coordinate of a model is finite."""
    return bool(torch.isfinite(params).all())
