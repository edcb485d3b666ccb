"""Issue 15, thirty-seventh hostile review (adaptive clipping and distributed noise): regressions.

1. Adaptive clipping kept ``C`` where the round's noise std ``σ_Δ C`` fits the model's dtype
   (float32's largest number over the headroom 64), but in distributed-noise mode the sum of
   ``n`` accepted shares has noise std ``σ_Δ C √(n/m_min)``. ``simulate toy.toml --rounds 4
   --set population=1000 --set task-params.num-users=1000 --set clients-per-round=500 --set
   noise-mode=distributed --set min-shares=1 --set noise-multiplier=1 --set
   adaptive-clipping=true --set clip-quantile=0.9999 --set clip-learning-rate=1000``: ``C`` grew
   to 5.3e36 after round 1, round 2's sum of 519 shares overflowed, the model was infinite, and
   the run ended rc 0 "the model diverged at round 2 ... (lower the learning rates)"; server
   noise at the same ``C`` stayed finite. ``--set clip-norm=5e36`` alike from round 1. Now the
   bound on ``C`` is divided by ``√(most shares / min-shares)`` (the population under Poisson
   sampling, the cohort under fixed-size sampling; ``privacy.aggregate.share_noise_growth``):
   ``C`` stops at 1.68e35 and the model stays finite, and a starting ``clip-norm`` above it is
   refused (rc 2, one line naming ``clip-norm`` and ``min-shares``).
2. ``privacy.adaptive_clip.count_share(bit, std, generator)``, what a client reports in
   distributed mode (Python API), took any ``float(bit)``: ``count_share(2, 0.1, g)`` gave
   ``1.5 + N(0, 0.01)`` (also 0.5, NaN, ``"1"``), a share the server cannot tell from an
   honest one, while the count's noise is sized for a centred bit of at most 1/2 (the client
   released more about itself than the round accounts). A bit other than 0 or 1 (a bool, a
   number, a one-element tensor or array) is refused now, naming ``bit``.
3. ``NoisyCountAggregator.aggregate(reports, generator=g)`` (Python API) took any user id:
   ``[(1.2, 7.0), (1.7, 8.0)]`` gave one rejected entry (user 1) for two rejected reports,
   ``[("u", 1.0)]`` was counted, ``[("u", 7.0)]`` raised ``int()``'s "invalid literal" naming
   nothing, and a bare report ``[1.0]`` a ``TypeError`` ("cannot unpack"). Each entry is checked
   as ``NoisyMeanAggregator.aggregate`` checks its updates (``privacy.received.user_pair``):
   ``ValueError`` naming ``reports[i]``.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from fedprivopt.privacy.adaptive_clip import NoisyCountAggregator, count_share
from fedprivopt.privacy.aggregate import share_noise_growth
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from fedprivopt.strategies.requests import ReportedUpdates

FLOAT32_NOISE_STD = torch.finfo(torch.float32).max / 64.0  # largest_noise_std(float32)


def _config(**changes) -> StrategyConfig:
    values = {"strategy": "dp-fedavg", "population": 1000, "clients-per-round": 500,
              "num-server-rounds": 4, "noise-multiplier": 1.0, "seed": 1,
              "noise-mode": "distributed", "min-shares": 1, "adaptive-clipping": True,
              **changes}  # fmt: skip
    return StrategyConfig.from_mapping(values)


# -- finding 1: the adaptive C's bound counts the distributed shares' growth ----------------


def _shares(request):
    """Every user sends only its noise share (a zero update) and a clipped bit's count share."""
    local = request.settings.local
    gen = torch.Generator().manual_seed(request.round_num)
    updates = {u: torch.randn(256, generator=gen) * local.noise_std for u in request.users}
    bits = {u: -0.5 + float(torch.randn(1, generator=gen)) * local.count_noise_std
            for u in request.users}  # fmt: skip
    return ReportedUpdates(updates, clip_bits=bits)


def test_1_adaptive_c_in_distributed_mode_keeps_the_sum_finite():
    config = _config(**{"clip-quantile": 0.9999, "clip-learning-rate": 1000.0})
    alg = build_algorithm(config, torch.zeros(256))
    bound = alg.clipping.max_clip_norm
    growth = share_noise_growth(1, 1000)
    assert config.update_noise_multiplier * bound * growth <= FLOAT32_NOISE_STD * (1 + 1e-12)
    for r in (1, 2):
        result = drive_round(alg, r, _shares)
    assert result.metrics["clip_norm"] == bound  # C grew to its bound in round 1
    assert bool(torch.isfinite(alg.params).all())


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_1_a_starting_clip_norm_above_the_bound_is_refused(sampling):
    with pytest.raises(ValueError, match=r"clip-norm must be at most .*min-shares") as info:
        build_algorithm(_config(sampling=sampling, **{"clip-norm": 5e36}), torch.zeros(4))
    most = 1000 if sampling == "poisson" else 500
    assert f"up to {most} shares" in str(info.value)
    # the growth is the shares' std ratio, and server noise or min-shares = the cohort has none
    assert share_noise_growth(1, 500) == math.sqrt(500)
    assert share_noise_growth(500, 500) == 1.0 == share_noise_growth(600, 500)
    build_algorithm(_config(sampling="fixed", **{"clip-norm": 5e36, "min-shares": 500}),
                    torch.zeros(4))  # fmt: skip


# -- finding 2: a count share is of a bit 0 or 1 ----------------------------------------------


@pytest.mark.parametrize("bit", [2, 0.5, -1.0, float("nan"), "1", None, torch.tensor([1.0, 0.0])])
def test_2_count_share_refuses_a_bit_other_than_0_or_1(bit):
    with pytest.raises(ValueError, match="bit must be 0 or 1"):
        count_share(bit, 0.1, torch.Generator().manual_seed(0))  # before: (bit - 1/2) + noise


def test_2_count_share_takes_bools_and_one_element_bits():
    gen = torch.Generator()
    for bit, centred in ((1.0, 0.5), (0, -0.5), (True, 0.5), (torch.tensor(False), -0.5),
                         (torch.tensor([1.0]), 0.5)):  # fmt: skip
        assert count_share(bit, 0.0, gen) == centred


# -- finding 3: the count's reports are (integer user, report) pairs --------------------------


@pytest.mark.parametrize(
    ("reports", "named"),
    [([(1.2, 7.0), (1.7, 8.0)], "reports[0] user_id"), ([("u", 1.0)], "reports[0] user_id"),
     ([(0, 1.0), ("u", 7.0)], "reports[1] user_id"), ([1.0], "reports[0] must be a")],
)  # fmt: skip
def test_3_count_reports_need_integer_users(reports, named):
    counter = NoisyCountAggregator(count_stddev=1.0, expected_cohort_size=2)
    with pytest.raises(ValueError, match=re.escape(named)):
        counter.aggregate(reports, generator=torch.Generator().manual_seed(0))
