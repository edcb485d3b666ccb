"""Issue 15, thirty-first hostile review (privacy area): regression tests of its findings.

1. The ``rdp`` accountant reported far more ε for more noise: ``fedprivopt epsilon
   --noise-multiplier 77 --sample-rate 1e-6 --rounds 1000000 --delta 1e-5`` printed
   ``epsilon = 145.0550`` where ``--noise-multiplier 70`` printed 0.0035 (q = 1e-5: σ 806 gave
   6.07 for 0.0035; q = 1e-4: σ 8455 gave 0.45; 1000 rounds at q = 1e-6, σ 77: 1.75). From such σ
   every order's RDP of a round is below ``MIN_LOG_A`` (dp-accounting's ``log A_α`` is
   ``log(1 + tiny)``, within rounding of 0), so the twenty-ninth review's fix gave each order the
   unsampled Gaussian's ``α/(2σ²)``, which ignores the sampling rate: valid, but 10**4 times too
   large, and a run with a target ε at such σ stopped rounds early (``calibrate`` refused targets
   it could meet). A Poisson event's integer orders now take dp-accounting's own series,
   ``A_α − 1 = Σ_{k≥2} C(α,k)(1−q)^(α−k) q^k expm1(k(k−1)/(2σ²))``, summed without the
   cancellation (positive terms) and inflated by a relative 1e-6 (``_poisson_int_rdp``): ε is
   0.0035 at σ 77, never above σ 70's, and the series is checked against a 400-digit evaluation
   (never below it). Fractional orders and fixed-size sampling keep the unsampled bound; finite
   values dp-accounting gives are kept as before (ordinary ledgers compose to the same ε).
2. DP2's ``clip-norm-adaptive`` (the clip norm of its adaptive rounds) was left out of the
   twenty-sixth review's check of the noise std against the model's dtype: ``simulate toy.toml
   --strategy dp2 --set clip-norm-adaptive=3e38 --set noise-multiplier=1`` drew infinite float32
   noise in its first adaptive round and ended rc 0 with "the model diverged ... (lower the
   learning rates)". It is refused before anything is written (rc 2, one line naming
   ``clip-norm-adaptive`` and the bound 5.31691e+36), as ``clip-norm`` is.
3. The adaptive clip norm was kept at most ``max_clip_norm`` (the eleventh review's bound, about
   1e150/σ_Δ, for a float64 square), not at the model dtype's bound: ``simulate toy.toml --set
   adaptive-clipping=true --set clip-quantile=0.9999 --set clip-learning-rate=1000 --set
   clip-count-stddev=1`` moved C from 1 to 9e100 after round 1 on a float32 model, whose noise
   of std σ_Δ·C was then infinite (metrics recorded ``noise_std`` 4.7e99 for it). C now stays at
   most the dtype's largest number over ``NOISE_HEADROOM`` divided by σ_Δ, so every noise draw
   is finite (the run itself, at that clip learning rate, still diverges and says so).
4. (the Python API's variant of 2) ``ServerAlgorithm.aggregate(round, updates, clip_norm=3e38)``
   of a float32 model, σ = 1: a noised mean with 257 of 1,000 entries infinite (the aggregator
   bounds σC only at 1e150). An explicit ``clip_norm`` whose noise std exceeds the dtype's bound
   is now a ``ValueError`` naming ``clip_norm`` and its largest value, before any noise is
   drawn; non-private strategies take any clip norm as before.
5. ``PrivacyAccountant.would_exceed`` (the budget check) took ``target_epsilon`` through
   ``float()``: ``"5"``, ``b"5"`` and ``True`` were budgets of 5, 5 and 1, and ``10**400``
   raised ``OverflowError``. It now takes a real number > 0 (``inf`` and ``10**400``: no budget),
   else ``ValueError`` naming ``target_epsilon``, as ``calibrate_noise_multiplier`` does.
6. ``fedprivopt calibrate --target-epsilon 0.05 --population 1000000 --cohort 1 --rounds 1
   --delta 1e-6`` was refused: "target_epsilon=0.05 is not reached: at the noise_multiplier
   0.98243 dp-accounting's search found, the RDP of a round is within rounding of 0 and the
   epsilon that can be shown is 0.3669; raise target_epsilon or delta" although σ 1.5 meets the
   target (ε 0 under the same accountant, and under pld). dp-accounting's search had taken an
   order whose RDP cancelled to 0 for a met target; the check caught that, but gave up. The
   ``rdp`` calibration now searches on from that σ with ``compose_epsilon`` itself (doubling,
   then bisecting to ``tol``; ``_rdp_checked``): σ 1.2012, whose ε is 0 and σ 0.02 % lower's is
   0.23. A target no σ up to 2**40 times dp-accounting's meets is still refused.
"""

from __future__ import annotations

import json
import math

import mpmath
import pytest
import torch
from dp_accounting import rdp

from fedprivopt.privacy.accounting import PrivacyAccountant, compose_epsilon
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.rdp_curves import _poisson_int_rdp
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.aggregation import NOISE_HEADROOM
from fedprivopt.strategies.core import ReportedUpdates, drive_round
from tests.reliability.test_eighteenth_review import one_line_error
from tests.reliability.test_fuzz_cli import PRESET, run_cli

# -- finding 1: the rdp accountant's bound where dp-accounting's orders cancel ------------------


def _eps(q: float, sigma: float, rounds: int, delta: float = 1e-5) -> float:
    event = SubsampledGaussianEvent.poisson(sample_rate=q, noise_multiplier=sigma)
    return compose_epsilon([(event, rounds)], delta)


@pytest.mark.parametrize(
    ("q", "lower", "higher"), [(1e-6, 70.0, 77.0), (1e-5, 700.0, 806.3), (1e-4, 8000.0, 8454.8)]
)
def test_1_more_noise_does_not_report_more_epsilon(q, lower, higher):
    for rounds in (1000, 10**6):
        assert _eps(q, higher, rounds) <= _eps(q, lower, rounds) < 0.004  # was up to 145.05


def test_1_epsilon_command(tmp_path):
    argv = ["epsilon", "--noise-multiplier", "77", "--sample-rate", "1e-6", "--rounds", "1000000",
            "--delta", "1e-5"]  # fmt: skip
    code, out, err = run_cli(argv)
    assert code == 0, err
    # was 145.0550; 0.0035015 is shown rounded up (thirty-ninth review of issue 15)
    assert out.startswith("epsilon = 0.0036 "), out


def _exact_rdp(q: float, sigma: float, alpha: int) -> mpmath.mpf:
    # sum_k C(alpha, k) (1 - q)^(alpha - k) q^k exp((k^2 - k) / (2 sigma^2)), each term from the
    # last (term k + 1 over term k: (alpha - k) / (k + 1) * q / (1 - q) * exp(k / sigma^2))
    q, sigma = mpmath.mpf(q), mpmath.mpf(sigma)
    term, terms = (1 - q) ** alpha, []
    for k in range(alpha + 1):
        terms.append(term)
        term *= mpmath.mpf(alpha - k) / (k + 1) * q / (1 - q) * mpmath.exp(k / sigma**2)
    return mpmath.log(mpmath.fsum(terms)) / (alpha - 1)


def test_1_the_series_is_an_upper_bound_and_tight():
    with mpmath.workdps(400):
        for q in (0.9, 0.1, 1e-3, 1e-6, 1e-9):
            for sigma in (0.3, 1.0, 77.0, 1e3, 1e6, 1e12):
                for alpha in (2, 3, 10, 63, 1024):
                    exact = _exact_rdp(q, sigma, alpha)
                    ours = _poisson_int_rdp(q, sigma, alpha)
                    assert exact <= ours <= exact * (1 + 1e-5), (q, sigma, alpha, ours)
    assert _poisson_int_rdp(0.1, 1.0, 2.5) == math.inf  # no series at a fractional order


def test_1_ordinary_and_fixed_size_ledgers_are_unchanged():
    # every order of an ordinary event is dp-accounting's; fixed-size sampling keeps its bound
    ordinary = SubsampledGaussianEvent.poisson(sample_rate=0.01, noise_multiplier=1.0)
    reference = rdp.RdpAccountant()
    reference.compose(ordinary.to_dp_event(), 10_000)
    assert _eps(0.01, 1.0, 10_000) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)
    fixed = SubsampledGaussianEvent.fixed(population=20, cohort_size=1, noise_multiplier=1.26e5)
    assert compose_epsilon([(fixed, 40)], 1e-5) == pytest.approx(0.01949, rel=1e-3)


# -- finding 2: DP2's clip-norm-adaptive against the model's dtype ------------------------------


@pytest.mark.parametrize("strategy", ["dp2", "dp2-noise-first"])
def test_2_clip_norm_adaptive_whose_noise_overflows_is_refused(tmp_path, strategy):
    out = tmp_path / "r"
    code, _, err = run_cli(["simulate", str(PRESET), "--strategy", strategy, "--out", str(out),
                            "--rounds", "2", "--set", "clip-norm-adaptive=3e38",
                            "--set", "noise-multiplier=1"])  # fmt: skip
    one_line_error(code, err, "noise-multiplier * clip-norm-adaptive must be at most 5.31691e+36")
    assert not out.exists()


def test_2_clip_norm_adaptive_at_the_bound_runs():
    bound = torch.finfo(torch.float32).max / NOISE_HEADROOM

    def config(clip: float) -> StrategyConfig:
        keys = {"strategy": "dp2", "population": 20, "clients-per-round": 4.0,
                "noise-multiplier": 1.0, "clip-norm": 1.0, "clip-norm-adaptive": clip}  # fmt: skip
        return StrategyConfig.from_mapping(keys)

    build_algorithm(config(bound), torch.zeros(4))  # accepted
    with pytest.raises(ValueError, match="clip-norm-adaptive must be at most"):
        build_algorithm(config(bound * 1.01), torch.zeros(4))
    build_algorithm(config(bound * 1.01), torch.zeros(4, dtype=torch.float64))  # float64 holds it


# -- finding 3: the adaptive clip norm against the model's dtype ---------------------------------


def test_3_the_adaptive_clip_norm_keeps_the_noise_finite():
    config = StrategyConfig(population=12, clients_per_round=4.0, noise_multiplier=0.5,
                            clip_norm=1.0, adaptive_clipping=True, clip_quantile=0.9999,
                            clip_learning_rate=1000.0, clip_count_stddev=1.0,
                            seed=0)  # fmt: skip
    alg = build_algorithm(config, torch.zeros(4))
    limit = torch.finfo(torch.float32).max / NOISE_HEADROOM / config.update_noise_multiplier

    def train(request):  # every update far above C: every bit 0, C grows as fast as it can
        users = request.users
        return ReportedUpdates({u: torch.full((4,), 10.0) for u in users},
                               clip_bits={u: 0.0 for u in users})  # fmt: skip

    for r in (1, 2, 3):
        res = drive_round(alg, r, train)
        assert res.metrics["next_clip_norm"] <= limit  # was 9.0e100 after round 1
        assert bool(torch.isfinite(alg.params).all()), r  # the noise was inf from round 2
        assert math.isfinite(res.metrics["noise_std"])
    assert alg.current_clip_norm() == pytest.approx(limit)


# -- finding 4: ServerAlgorithm.aggregate's explicit clip norm against the model's dtype ----------


def test_4_an_explicit_clip_norm_whose_noise_overflows_is_refused():
    config = StrategyConfig(population=20, clients_per_round=4.0, noise_multiplier=1.0,
                            clip_norm=1.0, seed=1)  # fmt: skip
    alg = build_algorithm(config, torch.zeros(1000))
    with pytest.raises(ValueError, match=r"clip_norm must be at most 5\.31691e\+36"):
        alg.aggregate(1, {0: torch.ones(1000)}, clip_norm=3e38)  # was 257 entries inf
    agg = alg.aggregate(1, {0: torch.ones(1000)}, clip_norm=5e36)  # at the bound: finite
    assert bool(torch.isfinite(agg.delta_tilde).all())
    plain = build_algorithm(StrategyConfig(strategy="fedavg", population=20,
                                           clients_per_round=4.0), torch.zeros(4))  # fmt: skip
    assert plain.aggregate(1, {0: torch.ones(4)}, clip_norm=3e38).delta_tilde.tolist() == [1.0] * 4


# -- finding 5: the budget check's target ----------------------------------------------------------


@pytest.mark.parametrize("target", ["5", b"5", True, math.nan, 0, -1.0])
def test_5_the_budget_check_refuses_a_target_that_is_no_number_above_0(target):
    event = SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="target_epsilon must be a number > 0"):
        PrivacyAccountant().would_exceed(target, 1e-5, event)


def test_5_the_budget_check_takes_any_real_number_above_0():
    event = SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=1.0)
    acc = PrivacyAccountant()
    assert not acc.would_exceed(10**400, 1e-5, event)  # was OverflowError
    assert not acc.would_exceed(math.inf, 1e-5, event) and acc.would_exceed(0.01, 1e-5, event)


# -- finding 6: calibrate gave up where dp-accounting's search had used a cancelled RDP ---------


def test_6_calibrate_searches_on_where_the_check_fails():
    argv = ["calibrate", "--target-epsilon", "0.05", "--population", "1000000", "--cohort", "1",
            "--rounds", "1", "--delta", "1e-6", "--json"]  # fmt: skip
    code, out, err = run_cli(argv)
    assert code == 0, err  # was rc 2, "target_epsilon=0.05 is not reached ..."
    result = json.loads(out)
    sigma = result["noise_multiplier"]
    assert result["epsilon"] <= 0.05 and 1.0 < sigma < 1.5
    assert _eps(1e-6, sigma, 1, 1e-6) <= 0.05 < _eps(1e-6, sigma * (1 - 1e-3), 1, 1e-6)  # smallest
