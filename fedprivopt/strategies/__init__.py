"""Server strategies: engine-agnostic algorithms and their Flower adapter.

- :class:`StrategyConfig`: validated hyperparameters (kebab-case keys as in presets).
- :func:`build_algorithm`: the named strategy's :class:`ServerAlgorithm` (sampling, clipping,
  noise, server optimizer, accountant, budget), driven round by round by any engine.
- :class:`DPStrategy` (in :mod:`fedprivopt.strategies.flower`): the same algorithm as a Flower
  strategy (imported lazily so the core does not need Flower).
"""

from fedprivopt.core.lazy import lazy_package

__all__ = lazy_package(
    __name__,
    {
        "algorithms": (
            "ALGORITHMS",
            "build_algorithm",
        ),
        "config": (
            "STRATEGIES",
            "StrategyConfig",
        ),
        "core": (
            "RoundResult",
            "ServerAlgorithm",
            "TrainRequest",
        ),
    },
)
