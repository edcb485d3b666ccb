"""What the Flower tests record of a run: every round's metrics and the final model."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, MetricRecord

from fedprivopt.strategies.core import RoundResult


class RunRecorder:
    """Collects per-round metrics of a run (the ``on_round`` hook of ``DPStrategy``)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.final_params: torch.Tensor | None = None

    def __call__(self, result: RoundResult, eval_metrics: Mapping[str, float] | None) -> None:
        row = {"round": result.round_num, **result.metrics}
        row |= {f"eval_{k}": float(v) for k, v in (eval_metrics or {}).items()}
        self.rows.append(row)
        self.final_params = result.params.detach().clone()


def evaluate_fn(task) -> Callable[[int, ArrayRecord], MetricRecord]:
    """Flower's central evaluation of ``task`` on its held-out data, every round."""

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = task.build_model()
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({k: float(v) for k, v in task.evaluate(model).items()})

    return evaluate
