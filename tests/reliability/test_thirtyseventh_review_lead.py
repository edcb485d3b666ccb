"""Issue 15, thirty-seventh review: the lead's findings (from the reviewers' reports).

1. (the adaptive reviewer's open report) ``simulate toy.toml --rounds 2 --set population=1000
   --set task-params.num-users=1000 --set clients-per-round=500 --set noise-mode=distributed --set
   min-shares=1 --set noise-multiplier=1 --set clip-norm=5e36`` (no adaptive clipping) ended rc 0
   with an infinite model and the advice to lower the learning rates: the bound on ``σ C`` (the
   dtype's largest number over the headroom) ignored that the sum of ``n`` distributed shares
   has noise std ``σ C √(n/m_min)``; the same config in server mode stays finite. DP2's
   ``clip-norm-adaptive`` and ``ServerAlgorithm.aggregate(clip_norm=…)`` had the same gap. Now
   the bound is divided by ``strategies.clipping.sum_noise_growth`` (the adaptive reviewer's
   growth, at the most shares a round can accept) in every check: rc 2, one line naming
   ``clip-norm`` and ``min-shares``.
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.strategies import StrategyConfig, build_algorithm


def _config(**changes) -> StrategyConfig:
    values = {"strategy": "dp-fedavg", "population": 1000, "clients-per-round": 500,
              "num-server-rounds": 4, "noise-multiplier": 1.0, "seed": 1,
              "noise-mode": "distributed", "min-shares": 1, **changes}  # fmt: skip
    return StrategyConfig.from_mapping(values)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"clip-norm": 5e36}, "clip-norm"),
        ({"strategy": "dp2", "clip-norm-adaptive": 5e36}, "clip-norm-adaptive"),
    ],
)
def test_1_a_fixed_clip_norm_counts_the_distributed_shares_growth(changes, key):
    with pytest.raises(ValueError, match=rf"{key} must be at most .*min-shares"):
        build_algorithm(_config(**changes), torch.zeros(4))
    # server noise at the same norm fits, as does min-shares at the cohort under fixed sampling
    build_algorithm(_config(**changes, **{"noise-mode": "server", "min-shares": 0}), torch.zeros(4))
    fixed = {"sampling": "fixed", "min-shares": 500}
    build_algorithm(_config(**changes, **fixed), torch.zeros(4))


def test_1_an_explicit_round_clip_norm_counts_the_growth():
    alg = build_algorithm(_config(), torch.zeros(4))
    with pytest.raises(ValueError, match="clip_norm must be at most"):
        alg.aggregate(1, {0: torch.zeros(4)}, clip_norm=5e36)
    alg.aggregate(1, {0: torch.zeros(4)}, clip_norm=1e35)
