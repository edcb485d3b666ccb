"""The Flower ServerApp: builds the task, the server algorithm and :class:`DPStrategy`, and runs.

:func:`make_server_app` returns a ``flwr.serverapp.ServerApp`` for a fixed configuration (used by
simulations and tests). Central evaluation on the task's held-out data runs after every round;
the evaluation data is the server's, so it is outside the DP guarantee on the training users.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from fedprivopt.models import build_task
from fedprivopt.models.task import frozen_mask, initial_flat, model_spec
from fedprivopt.strategies.algorithms import build_algorithm
from fedprivopt.strategies.config import StrategyConfig
from fedprivopt.strategies.core import RoundResult
from fedprivopt.strategies.flower import DPStrategy, flat_to_arrays

__all__ = ["RunRecorder", "make_server_app"]


class RunRecorder:
    """Collects per-round metrics of a run (and optionally forwards them)."""

    def __init__(self, forward: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.rows: list[dict[str, Any]] = []
        self.final_params: torch.Tensor | None = None
        self.stopped_reason: str | None = None
        self.forward = forward

    def __call__(self, result: RoundResult, eval_metrics: Mapping[str, float] | None) -> None:
        """Record one round (the ``on_round`` hook of :class:`DPStrategy`)."""
        row = {"round": result.round_num, **result.metrics}
        row |= {f"eval_{k}": float(v) for k, v in (eval_metrics or {}).items()}
        self.rows.append(row)
        self.final_params = result.params.detach().clone()
        if self.forward is not None:
            self.forward(row)


def _evaluate_fn(task) -> Callable[[int, ArrayRecord], MetricRecord]:
    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = task.build_model()
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({k: float(v) for k, v in task.evaluate(model).items()})

    return evaluate


def make_server_app(
    config: StrategyConfig,
    *,
    task: str,
    task_params: Mapping[str, Any] | str | None = None,
    side_information: torch.Tensor | None = None,
    recorder: RunRecorder | None = None,
    min_nodes: int = 1,
) -> ServerApp:
    """ServerApp running ``config.strategy`` on ``task`` for ``config.num_server_rounds`` rounds.

    Parameters
    ----------
    config : StrategyConfig
        The run's hyperparameters; ``population`` must equal the task's number of users.
    task, task_params
        Task name and keyword parameters (as for :func:`fedprivopt.models.build_task`).
    side_information : torch.Tensor, optional
        AdaDPS' public preconditioner (flat, the model's length).
    recorder : RunRecorder, optional
        Receives every round's metrics and the final model.
    min_nodes : int
        Nodes to wait for before discovering users.
    """
    params = json.loads(task_params) if isinstance(task_params, str) else dict(task_params or {})
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        the_task = build_task(task, **params)
        if the_task.num_users != config.population:
            raise ValueError(
                f"population must equal the task's number of users ({the_task.num_users}), "
                f"got {config.population}"
            )
        spec = model_spec(the_task)
        init = initial_flat(the_task)
        algorithm = build_algorithm(
            config, init, preconditioner=side_information, frozen=frozen_mask(the_task)
        )
        strategy = DPStrategy(algorithm, spec, min_nodes=min_nodes, on_round=recorder)
        strategy.start(
            grid,
            flat_to_arrays(init, spec),
            num_rounds=config.num_server_rounds,
            evaluate_fn=_evaluate_fn(the_task),
        )
        if recorder is not None:
            recorder.stopped_reason = algorithm.stopped_reason
            recorder.final_params = algorithm.params.detach().clone()

    return app
