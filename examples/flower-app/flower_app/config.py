"""The run config (``[tool.flwr.app.config]``) as both apps read it, checked before it is used.

fedprivopt's strategy keys become a :class:`~fedprivopt.strategies.StrategyConfig` (``""`` = not
set, so the code default); this app's own keys (``data-seed``, ``metrics-file``) are checked here.
Every bad value is a ``ValueError`` naming the key and its valid range, raised before the
ServerApp releases anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fedprivopt.strategies import StrategyConfig


def strategy_config(run_config: Mapping) -> StrategyConfig:
    """The StrategyConfig of the run config's fedprivopt keys (``""`` = not set)."""
    keys = StrategyConfig.keys()
    return StrategyConfig.from_mapping(
        {k: v for k, v in run_config.items() if k in keys and v != ""}
    )


def population(run_config: Mapping) -> int:
    """The population ``N`` as the strategy reads it (``""``: the strategy's default)."""
    return strategy_config(run_config).population


def data_seed(run_config: Mapping) -> int:
    """``data-seed``: an integer ``>= 0`` (the seed of every user's and the test set's data)."""
    value = run_config.get("data-seed")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"run config 'data-seed' must be an integer >= 0, got {value!r:.80}")
    return value


def metrics_file(run_config: Mapping) -> str:
    """``metrics-file``: ``""`` (none) or a file path whose folder exists (appended to)."""
    value = run_config.get("metrics-file", "")
    if not isinstance(value, str):
        raise ValueError(f"run config 'metrics-file' must be a path or '', got {value!r:.80}")
    if value and (Path(value).is_dir() or not Path(value).parent.is_dir()):
        raise ValueError(
            "run config 'metrics-file' must be a file in an existing folder (or '' for none), "
            f"got {value!r:.80}"
        )
    return value
