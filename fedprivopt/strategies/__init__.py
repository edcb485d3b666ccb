"""Server strategies: engine-agnostic algorithms and their Flower adapter.

- :class:`StrategyConfig`: validated hyperparameters (kebab-case keys as in presets).
- :func:`build_algorithm`: the named strategy's :class:`ServerAlgorithm` (sampling, clipping,
  noise, server optimizer, accountant, budget), driven round by round by any engine.
- :class:`DPStrategy` (in :mod:`fedprivopt.strategies.flower`): the same algorithm as a Flower
  strategy (imported lazily so the core does not need Flower).
"""

from fedprivopt.strategies.algorithms import ALGORITHMS, build_algorithm
from fedprivopt.strategies.config import STRATEGIES, StrategyConfig
from fedprivopt.strategies.core import RoundResult, ServerAlgorithm, TrainRequest

__all__ = [
    "ALGORITHMS",
    "STRATEGIES",
    "RoundResult",
    "ServerAlgorithm",
    "StrategyConfig",
    "TrainRequest",
    "build_algorithm",
]
