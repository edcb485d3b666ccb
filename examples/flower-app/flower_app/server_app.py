"""The user's own ServerApp: their model and evaluation, fedprivopt's DP strategy as the strategy.

The run config (``[tool.flwr.app.config]`` in ``pyproject.toml``, overridable with ``flwr run
--run-config``) holds fedprivopt's strategy keys (``strategy``, ``noise-multiplier``,
``clip-norm``, ``target-epsilon``, ...) next to this app's own (``data-seed``, ``metrics-file``).
The strategy samples users by Poisson sampling, clips, noises the sum, then runs the server
optimizer on the noised mean, and its accountant reports ε after every round; with
``target-epsilon`` set, the run stops before the round that would exceed it.
"""

from __future__ import annotations

import json
from logging import INFO
from pathlib import Path

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from fedprivopt.strategies import RoundResult, StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy, arrays_to_flat
from flower_app.task import build_model, evaluate, load_test

app = ServerApp()


def strategy_config(run_config) -> StrategyConfig:
    """The StrategyConfig of the run config's fedprivopt keys (``""`` = not set)."""
    keys = StrategyConfig.keys()
    return StrategyConfig.from_mapping(
        {k: v for k, v in run_config.items() if k in keys and v != ""}
    )


def _append(path: str, row: dict) -> None:
    if path:
        with Path(path).open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run DP federated training of the user's model; log ε per round."""
    config = strategy_config(context.run_config)
    metrics_file = str(context.run_config.get("metrics-file", ""))
    model = build_model(config.seed)
    initial = ArrayRecord(model.state_dict())
    flat, spec = arrays_to_flat(initial)
    algorithm = build_algorithm(config, flat)
    test_x, test_y = load_test(seed=int(context.run_config["data-seed"]))

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord(evaluate(model, test_x, test_y))

    def on_round(result: RoundResult, eval_metrics: dict[str, float] | None) -> None:
        m, ev = result.metrics, eval_metrics or {}
        log(
            INFO,
            "[flower_app] round %d: epsilon=%.4f (delta=%g) cohort=%d accuracy=%.4f",
            result.round_num,
            m["epsilon"],
            config.delta,
            int(m.get("cohort_size", 0)),
            ev.get("accuracy", float("nan")),
        )
        _append(metrics_file, {"round": result.round_num, **m, **ev})

    initial_metrics = evaluate(model, test_x, test_y)
    log(INFO, "[flower_app] round 0: accuracy=%.4f", initial_metrics["accuracy"])
    _append(metrics_file, {"round": 0, "epsilon": 0.0, **initial_metrics})
    strategy = DPStrategy(algorithm, spec, on_round=on_round)
    strategy.start(grid, initial, num_rounds=config.num_server_rounds, evaluate_fn=evaluate_fn)
    log(
        INFO,
        "[flower_app] stopped (%s) after %d rounds: epsilon=%.4f at delta=%g",
        algorithm.stopped_reason,
        algorithm.round_num,
        algorithm.epsilon(),
        config.delta,
    )
    _append(
        metrics_file,
        {
            "stopped_reason": algorithm.stopped_reason,
            "rounds": algorithm.round_num,
            "epsilon": algorithm.epsilon(),
            "delta": config.delta,
        },
    )
