"""Issue 15, twenty-ninth hostile review (privacy area): regression tests of its findings.

1. The ``rdp`` accountant at a large σ or a tiny q: ``fedprivopt epsilon --noise-multiplier 1e10
   --sample-rate 0.1 --rounds 1`` printed ``epsilon = inf`` (also σ 1e8 at q = 1, σ 1000 at
   q = 1e-5, σ 100 at q = 1e-8), and ``--noise-multiplier 1e5 --sample-rate 0.001 --rounds 1``
   printed 14.80 where σ = 1e4 printed 0.0000. The thirteenth review dropped (as ``inf``) every
   order whose RDP dp-accounting computes within rounding of 0, so at such σ every order was
   dropped, or only fractional orders near 1 were left, whose series dp-accounting sums with an
   absolute error near 1e-10 (1.7e-10 at order 1.7 for a true 8.5e-17). Both were upper bounds,
   but useless ones: a run with a target ε at such a σ stopped before its first round. Now
   those orders take the RDP dp-accounting gives the event's mechanism without sampling (a
   closed form; sampling never raises a Rényi divergence), and an order whose sampled value is
   larger than that takes it too: ε is finite, still an upper bound (checked against the exact
   ε of the Gaussian mechanism), and never larger for more noise in these cases. The tuning
   bound, which dp-accounting composes from the run's event, keeps its orders.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from fedprivopt.privacy.accounting import compose_epsilon
from fedprivopt.privacy.events import SubsampledGaussianEvent

ROOT = Path(__file__).resolve().parents[2]


def _cli(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", PYTHONPATH=str(ROOT))
    env["HOME"] = str(tmp_path)
    return subprocess.run(
        [sys.executable, "-m", "fedprivopt.cli", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact ε at ``delta`` of a Gaussian mechanism of sensitivity over noise ``mu``."""

    def excess(eps: float) -> float:
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta

    return 0.0 if excess(0.0) <= 0 else brentq(excess, 0.0, 10.0, xtol=1e-15)


# -- finding 1: the rdp accountant at a large sigma or a tiny sample rate --------------------------


def test_1_rdp_epsilon_at_a_huge_sigma_is_a_finite_upper_bound():
    # q = 1: 10**12 rounds at σ = 1e8 are exactly one Gaussian of σ/√(10**12) = 100 (μ = 0.01)
    event = SubsampledGaussianEvent.poisson(sample_rate=1.0, noise_multiplier=1e8)
    eps = compose_epsilon([(event, 10**12)], 1e-5)  # was inf
    exact = _gaussian_epsilon(0.01, 1e-5)  # 0.0272
    assert exact <= eps <= 1.5 * exact
    # the same with fixed-size sampling (replace-one) and with the adaptive-clipping pair
    fixed = SubsampledGaussianEvent.fixed(population=10**6, cohort_size=10, noise_multiplier=1e8)
    assert math.isfinite(compose_epsilon([(fixed, 10**12)], 1e-5))
    pair = SubsampledGaussianEvent.poisson(
        sample_rate=0.5, noise_multiplier=1e9, count_noise_multiplier=1e10
    )
    assert math.isfinite(compose_epsilon([(pair, 10**12)], 1e-5))


@pytest.mark.parametrize(("q", "sigma"), [(1.0, 1e8), (0.1, 1e10), (1e-5, 1e3), (1e-8, 100.0)])
def test_1_rdp_epsilon_is_finite_where_every_order_cancelled(q, sigma):
    event = SubsampledGaussianEvent.poisson(sample_rate=q, noise_multiplier=sigma)
    for rounds in (1, 10**6):
        eps = compose_epsilon([(event, rounds)], 1e-5)
        assert math.isfinite(eps), (q, sigma, rounds)  # was inf
        # never above the unsampled Gaussian's (q = 1: dp-accounting's closed form)
        alone = SubsampledGaussianEvent.poisson(sample_rate=1.0, noise_multiplier=sigma)
        assert eps <= compose_epsilon([(alone, rounds)], 1e-5)


def test_1_more_noise_never_reports_more_epsilon():
    def eps(sigma: float) -> float:
        event = SubsampledGaussianEvent.poisson(sample_rate=0.001, noise_multiplier=sigma)
        return compose_epsilon([(event, 1)], 1e-5)

    assert eps(1e5) <= eps(1e4) < 0.01  # was 14.80 and 0.0
    assert eps(1e6) <= eps(1e5)


def test_1_epsilon_command_prints_a_finite_epsilon(tmp_path):
    argv = ["epsilon", "--sample-rate", "0.1", "--rounds", "1", "--delta", "1e-5"]
    proc = _cli(tmp_path, *argv, "--noise-multiplier", "1e10")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("epsilon = 0.0000 "), proc.stdout  # was "epsilon = inf"
    proc = _cli(tmp_path, "epsilon", "--noise-multiplier", "1e5", "--sample-rate", "0.001",
                "--rounds", "1", "--delta", "1e-5")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("epsilon = 0.0000 "), proc.stdout  # was 14.8017
