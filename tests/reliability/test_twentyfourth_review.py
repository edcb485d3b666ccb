"""Issue 15, a short review of the Python API (report only; the two privacy-accounting findings
fixed in the same session; the rest are listed in ``docs/RELIABILITY.md`` §7).

1. ``fedprivopt epsilon --noise-multiplier 1 --sample-rate 0.1 --rounds 1 --delta 0.1
   --accountant prv`` printed ``epsilon = -0.0953`` (rc 0); ``compose_epsilon`` and
   ``PrivacyAccountant("prv").epsilon`` gave -0.095 to -2.28 for δ from 0.1 to 0.9. Opacus
   solves δ(ε) = δ over every real ε; ε(δ) is the least ε >= 0 with δ(ε) <= δ, so a negative
   root means ε = 0 (rdp and pld say 0 at δ 0.9 too).
2. The ``prv`` accountant at δ = 5e-324 (which ``check_delta`` accepts) raised
   ``ZeroDivisionError`` (its error budget δ/1000 underflows to 0). Now a ``ValueError`` naming
   ``delta``: rc 2, one line.
3. Adaptive clipping's count noise: ``count_share(bit, std=-1 or nan, g)`` added no noise, and
   ``generator=None`` drew from the global RNG; ``default_count_stddev(-1)`` was -0.05. Now
   ``ValueError``/``TypeError`` naming the parameter.
4. ``ServerAlgorithm.client_settings(clip_norm=0, True or False)`` silently told the clients the
   configured C. Now a ``ValueError`` naming ``clip_norm``.
"""

from __future__ import annotations

import pytest

from fedprivopt.privacy.accounting import PrivacyAccountant, compose_epsilon
from fedprivopt.privacy.events import SubsampledGaussianEvent
from tests.reliability.test_fuzz_cli import run_cli

EVENT = SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=1.0)


@pytest.mark.parametrize("delta", [0.1, 0.3, 0.5, 0.9])
@pytest.mark.parametrize(("q", "sigma"), [(0.1, 1.0), (0.5, 2.0), (1.0, 4.0)])
def test_1_prv_never_reports_a_negative_epsilon(delta, q, sigma):
    event = SubsampledGaussianEvent.poisson(sample_rate=q, noise_multiplier=sigma)
    eps = compose_epsilon([(event, 1)], delta, accountant="prv")
    assert eps >= 0.0
    assert eps <= compose_epsilon([(event, 1)], delta, accountant="rdp") + 1e-9
    accountant = PrivacyAccountant(accountant="prv")
    accountant.step(event)
    assert accountant.epsilon(delta) >= 0.0


def test_1_the_command_line_prints_zero_not_a_negative_epsilon():
    argv = ["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--rounds", "1",
            "--delta", "0.1", "--accountant", "prv"]  # fmt: skip
    code, out, err = run_cli(argv)
    assert code == 0, err
    assert out.startswith("epsilon = 0.0000 at delta = 0.1"), out


def test_1_a_positive_prv_epsilon_is_unchanged():
    eps = compose_epsilon([(EVENT, 100)], 1e-5, accountant="prv")
    assert eps == pytest.approx(7.057, abs=0.01)  # Opacus' own value (fedprivopt epsilon)


def test_2_prv_at_a_delta_whose_budget_underflows_is_refused_naming_delta():
    accountant = PrivacyAccountant(accountant="prv")
    accountant.step(EVENT)
    with pytest.raises(ValueError, match=r"delta must be at least .* for the prv accountant"):
        accountant.epsilon(5e-324)  # ZeroDivisionError before
    argv = ["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--rounds", "1",
            "--delta", "5e-324", "--accountant", "prv"]  # fmt: skip
    code, _, err = run_cli(argv)
    assert code == 2 and len(err.splitlines()) == 1 and "delta" in err, err


@pytest.mark.parametrize("std", [-1.0, float("nan"), float("inf"), True])
def test_3_a_count_share_with_a_std_that_is_no_noise_level_is_refused(std):
    import torch

    from fedprivopt.privacy.adaptive_clip import count_share

    with pytest.raises(ValueError, match="std must be"):
        count_share(1.0, std, torch.Generator().manual_seed(0))  # before: 0.5, no noise


def test_3_a_count_share_needs_its_generator_and_the_default_stddev_a_cohort():
    import torch

    from fedprivopt.privacy.adaptive_clip import count_share, default_count_stddev

    with pytest.raises(TypeError, match=r"generator must be a torch\.Generator"):
        count_share(1.0, 1.0, None)  # before: the global RNG
    assert count_share(1.0, 0.0, torch.Generator()) == 0.5
    shares = {count_share(1.0, 1.0, torch.Generator().manual_seed(s)) for s in range(3)}
    assert len(shares) == 3  # noised
    assert default_count_stddev(100) == 5.0
    with pytest.raises(ValueError, match="expected_cohort_size"):
        default_count_stddev(-1)  # before: -0.05


@pytest.mark.parametrize("clip_norm", [0, True, False, -1.0, float("nan")])
def test_4_client_settings_refuse_a_clip_norm_that_is_none(clip_norm):
    import torch

    from fedprivopt.strategies import StrategyConfig, build_algorithm

    algorithm = build_algorithm(StrategyConfig(), torch.zeros(4))
    with pytest.raises(ValueError, match="clip_norm must be"):
        algorithm.client_settings(clip_norm=clip_norm)  # before: the configured C, silently
    assert algorithm.client_settings(clip_norm=0.5).local.clip_norm == 0.5
