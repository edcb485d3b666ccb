"""Issue 15, the short Python API review's findings that were listed and not fixed (findings 5-15).

Found by a generated sweep of hostile values (NaN, ±inf, 0, -1, 5e-324, 1e300, 10**12, bools,
strings, wrong types) over the exported functions of ``privacy/``, ``optim/`` and
``strategies/``, one parameter at a time (``docs/RELIABILITY.md`` §7). The command line checks
its keys before these functions see them; these are the Python API's own checks.

5. ``pld_epsilon`` took δ inf, 2 or NaN (ε 0 or NaN) and ``h`` inf or 1e300 (``IndexError``,
   ``OverflowError``); ``prv_epsilon(eps_error=5.0)`` was accepted.
6. ``calibrate_noise_multiplier`` (rdp, pld) and ``calibrate_tree`` at a target ε of 1e300 raised
   dp-accounting's ``NoBracketIntervalFoundError``; ``calibrate_tree(rounds=10**12,
   restart_rounds=1)`` and ``calibrate_tree(1e-300, …)`` ran on (a nudge of 1e-9 per step).
7. ``ServerAlgorithm.aggregate(clip_norm=True or 1+0j)`` was taken as the configured C of 1;
   ``clip_norm=1e300`` (and ``NoisyMeanAggregator(clip_norm=1e300)``) overflowed squaring σC.
8. ``clip_factor`` took a NaN or negative norm or clip norm (NaN, 1.0 or a negative factor);
   ``norm_error_bound`` NaN, -1 and 2.5.
9. ``secure_gaussian_noise`` checked neither ``std`` nor ``numel``; ``gaussian_noise(secure=)``
   took any object; a ``numel``/``dim`` of 10**12 reached torch's allocator.
10. ``l2_norm`` of an int, bool or complex tensor raised torch's ``RuntimeError``.
11. ``adam_bc(gamma=1e300)`` and ``dp2(epsilon=1e300)`` overflowed on float32 parameters.
12. ``TrialCount("truncated-negative-binomial", …, shape=5e-324)`` divided by zero.
13. ``check_ledger_count`` returned NaN, -1 and 2.5 unchanged.
14. Type checks: a string ledger, ``trials="poisson"``, ``flatten([…])``, ``unflatten(…, None)``,
    a malformed ``FlatSpec``, ``RowSparse`` of length "6" or 6.5 (read as 6), ``RowSparseBatch``
    of users None, ``update(5)``, the segment helpers given lists or offsets past the rows, an
    aggregator entry that is not a pair or has a user id "u": ``AttributeError``, ``IndexError``,
    ``RuntimeError`` or silently accepted.
15. ``events_through(-1 or NaN)`` was taken; ``RngFactory.seed_for`` raised ``OverflowError`` at
    inf and gave round 1's stream for 1.5 and True.

A second sweep the next session (2,660 cases over 32 entry points, the same hostile values and
10**400, ``Decimal``, tensors and ``object()``) found 63 more:

16. An integer beyond float64 (10**400) raised ``OverflowError`` from 20 parameters (δ, the PLD
    and PRV resolutions, the calibration's target, σ, the count's σ, ``cohort_size``, ``clip_norm``,
    ``std``, the trial count's mean and shape, ``count_offset``, ``dim``, ``min-shares``).
17. ``device=0``, ``-1`` or ``"1"`` of the noise samplers, ``RngFactory.generator``, ``TreeNoise``
    and ``aggregate`` raised torch's ``RuntimeError``.
18. ``add_gaussian_noise`` of a non-tensor (``AttributeError``), ``RngFactory(secure=tensor)``
    (``RuntimeError``), ``aggregate(sum_noise="1" or a scalar tensor)`` (``AttributeError``,
    ``IndexError``).
19. Accepted: ``default_min_shares`` of population 0 or True, rate True, quantile 0 or 1+0j;
    ``NoisyMeanAggregator(min_shares=10**400)``; ``TreeNoise(dim=10**400)``.

A third sweep over methods (798 cases over 29 methods: accountant, tree cohorts and ledger,
samplers, adaptive clipping, the transforms' ``update``, the server algorithm) found:

20. ``TreeCohorts.cohort(available=…)``: a float tensor or a number raised torch's
    ``NotImplementedError``, a tensor of the wrong length a ``RuntimeError``, and ``True`` was
    taken as every user.
21. ``clip_bit``: a negative norm counted as unclipped, a NaN, zero or negative ``clip_norm``
    gave a bit, 10**400 or a tensor raised ``OverflowError``/``RuntimeError``.
22. ``adaptive_clip(...).update`` read ``"1"``, ``True`` and a tensor as 1 and raised on 10**400
    and on a state that is no ``ClipState``; ``ServerAlgorithm.optimizer_noise_std`` and
    ``load_state_dict`` raised ``AttributeError``/``IndexError`` on what they are not given;
    ``round_events(NaN or -1)`` was taken; ``RngFactory.seed_for`` keyed a purpose of ``None``,
    ``[1]`` or 1.5 by its text.

Found by the twenty-fifth review (the same session) in a file it left to its owner:

23. ``ServerAlgorithm.run_round`` summed an update sent for a user who was not sampled
    (``cohort_size`` 3, ``accepted`` 4): that user was released without the subsampling the
    accountant assumes. Python API only (the engines and ``DPStrategy`` send only the cohort).
24. ``simulate toy.toml --set noise-multiplier=1e39`` (or ``clip-norm=1e100``) drew infinite
    noise in float32 and ended rc 0 as a divergence whose advice named the learning rates.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedprivopt.privacy.accounting import compose_epsilon
from fedprivopt.privacy.events import SubsampledGaussianEvent
from tests.reliability.test_fuzz_readers import alarm

EVENT = SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=1.0)
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("delta", [INF, 2.0, NAN, 0.0])
def test_5_pld_epsilon_refuses_a_delta_outside_0_1(delta):
    from fedprivopt.privacy.pld_guard import pld_epsilon

    with pytest.raises(ValueError, match=r"delta must be"):
        pld_epsilon(((EVENT, 1),), delta, 1e-4)  # before: ε 0.0 or NaN


@pytest.mark.parametrize("h", [INF, 1e300, 0.0, -1.0])
def test_5_pld_epsilon_refuses_a_discretization_outside_0_1(h):
    from fedprivopt.privacy.pld_guard import pld_epsilon

    with pytest.raises(ValueError, match=r"pld_discretization must be"):
        pld_epsilon(((EVENT, 1),), 1e-5, h)  # before: IndexError / OverflowError


def test_5_prv_epsilon_refuses_an_eps_error_outside_0_1():
    from fedprivopt.privacy.prv_guard import prv_domain_points, prv_epsilon

    for eps_error in (5.0, 0.0, NAN):
        with pytest.raises(ValueError, match=r"prv_eps_error must be"):
            prv_epsilon(((EVENT, 1),), 1e-5, eps_error)  # before: 5.0 gave ε 6.55
        with pytest.raises(ValueError, match=r"prv_eps_error must be"):
            prv_domain_points(((EVENT, 1),), 1e-5, eps_error)
    assert prv_epsilon(((EVENT, 1),), 1e-5, 0.01) == compose_epsilon(
        [(EVENT, 1)], 1e-5, accountant="prv"
    )


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_6_a_target_met_below_the_search_is_refused_naming_target_epsilon(accountant):
    from fedprivopt.privacy.calibration import calibrate_noise_multiplier

    with pytest.raises(ValueError, match=r"target_epsilon=1e\+300 is met even at"):
        calibrate_noise_multiplier(  # before: NoBracketIntervalFoundError
            target_epsilon=1e300, delta=1e-5, rounds=10, sample_rate=0.1, accountant=accountant
        )


def test_6_calibrate_tree_refuses_1e300_and_ends_on_extreme_rounds_and_targets():
    from fedprivopt.privacy.tree import calibrate_tree

    with pytest.raises(ValueError, match=r"target_epsilon=1e\+300 is met even at"):
        calibrate_tree(1e300, 1e-5, restart_rounds=10, rounds=10)
    for target, restart, rounds in [(8.0, 1, 10**12), (1e-300, 10, 10)]:
        with alarm(60):  # before: ran on (a fixed nudge of 1e-9 per step)
            sigma = calibrate_tree(target, 1e-5, restart_rounds=restart, rounds=rounds)
        event = SubsampledGaussianEvent.tree(
            population=1, cohort_size=1, noise_multiplier=sigma, restart_rounds=restart
        )
        assert compose_epsilon([(event, -(-rounds // restart))], 1e-5) <= target
    sigma = calibrate_tree(8.0, 1e-5, restart_rounds=10, rounds=100)  # an ordinary one
    event = SubsampledGaussianEvent.tree(
        population=1, cohort_size=1, noise_multiplier=sigma, restart_rounds=10
    )
    assert 7.99 < compose_epsilon([(event, 10)], 1e-5) <= 8.0


def _algorithm():
    from fedprivopt.strategies import StrategyConfig, build_algorithm

    return build_algorithm(StrategyConfig(), torch.zeros(4))


@pytest.mark.parametrize("clip_norm", [True, 1 + 0j, "1", 0.0, NAN, 1e300])
def test_7_aggregate_refuses_a_clip_norm_that_is_no_norm_or_overflows(clip_norm):
    algorithm = _algorithm()
    assert algorithm.config.clip_norm == 1.0
    updates = {0: torch.ones(4)}
    with pytest.raises(ValueError, match=r"clip_norm must be"):
        algorithm.aggregate(1, updates, clip_norm=clip_norm)  # before: taken, or OverflowError
    assert algorithm.aggregate(1, updates, clip_norm=0.5).metrics["accepted"] == 1.0


def test_7_the_aggregator_refuses_a_noise_std_beyond_1e150():
    from fedprivopt.privacy.aggregate import NoisyMeanAggregator

    def make(clip_norm, sigma=1.0, cohort=10.0):
        return NoisyMeanAggregator(
            clip_norm=clip_norm, noise_multiplier=sigma, expected_cohort_size=cohort
        )

    with pytest.raises(ValueError, match=r"clip_norm must be at most 1e\+150 here"):
        make(1e300)  # before: OverflowError in aggregate
    with pytest.raises(ValueError, match=r"clip_norm must be at most 1e\+140 here"):
        make(1e145, cohort=1e-10)  # the mean's std σC/m̄ too
    for bad in (True, "1", NAN):
        with pytest.raises(ValueError, match=r"noise_multiplier must be"):
            make(1.0, sigma=bad)
        with pytest.raises(ValueError, match=r"expected_cohort_size must be"):
            make(1.0, cohort=bad)
    result = make(1e150).aggregate([(0, torch.ones(4))], dim=4, generator=torch.Generator())
    assert result.noise_std == pytest.approx(1e149)
    assert make(1e300, sigma=0.0).aggregate([(0, torch.ones(4))], dim=4).metrics["accepted"] == 1


@pytest.mark.parametrize(("norm", "clip_norm"), [(NAN, 1.0), (-1.0, 1.0), (2.0, NAN), (2.0, -1.0)])
def test_8_clip_factor_refuses_nan_and_negative_norms(norm, clip_norm):
    from fedprivopt.privacy.clip import clip_factor

    with pytest.raises(ValueError, match=r"norm must be"):
        clip_factor(norm, clip_norm)  # before: NaN, 1.0 or a negative factor


def test_8_clip_factor_and_norm_error_bound_keep_their_values():
    from fedprivopt.privacy.clip import clip_factor, norm_error_bound

    assert clip_factor(0.5, 1.0) == 1.0
    assert clip_factor(INF, 1.0) == 0.0  # finite float64 entries whose norm overflows
    assert clip_factor(2.0, 1.0) == pytest.approx(0.5, rel=1e-6) and clip_factor(2.0, 1.0) < 0.5
    assert norm_error_bound(10) == 26 * 2.0**-52
    for numel in (NAN, -1, 2.5, True):
        with pytest.raises(ValueError, match=r"numel must be an integer >= 0"):
            norm_error_bound(numel)


@pytest.mark.parametrize(("numel", "std"), [(3, -1.0), (3, NAN), (2.5, 1.0), (10**12, 1.0)])
def test_9_secure_noise_checks_its_std_and_numel(numel, std):
    from fedprivopt.privacy.noise import gaussian_noise, secure_gaussian_noise

    for draw in (secure_gaussian_noise, gaussian_noise):
        with pytest.raises(ValueError, match=r"std must be|numel must be"):
            draw(numel, std, generator=torch.Generator())  # before: torch's errors, NaN noise


def test_9_secure_must_be_a_bool_and_dim_must_fit_in_memory():
    from fedprivopt.privacy.aggregate import NoisyMeanAggregator
    from fedprivopt.privacy.noise import gaussian_noise

    with pytest.raises(ValueError, match=r"secure must be true, false or None"):
        gaussian_noise(3, 1.0, generator=torch.Generator(), secure="yes")
    assert gaussian_noise(3, 1.0, generator=torch.Generator(), secure=True).shape == (3,)
    aggregator = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=0.0, expected_cohort_size=1.0)
    with pytest.raises(ValueError, match=r"dim must be at most [\d,]+ on this cpu device"):
        aggregator.aggregate([], dim=10**15)  # before: torch's allocator RuntimeError
    with pytest.raises(ValueError, match=r"dim must be an integer >= 1"):
        aggregator.aggregate([], dim=2.5)
    with pytest.raises(ValueError, match=r"dtype must be a floating"):
        aggregator.aggregate([], dim=3, dtype=torch.int64)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_10_l2_norm_refuses_tensors_that_are_not_real_floats(dtype):
    from fedprivopt.privacy.clip import l2_norm

    with pytest.raises(ValueError, match=r"vector must have a real floating dtype"):
        l2_norm(torch.ones(3, dtype=dtype))  # before: torch's RuntimeError
    assert l2_norm(torch.full((4,), 0.5)) == 1.0


def test_11_optimizer_constants_beyond_the_parameters_dtype_are_refused_at_init():
    from fedprivopt.optim.adam_bc import adam_bc
    from fedprivopt.optim.dp2 import dp2

    bc = adam_bc(learning_rate=1.0, gamma=1e300, noise_variance=0.01)
    delayed = dp2(sgd_learning_rate=1.0, adaptive_learning_rate=1.0, s1=1, s2=1, epsilon=1e300)
    with pytest.raises(ValueError, match=r"gamma must be at most 3\.40282e\+38 for torch\.float32"):
        bc.init(torch.zeros(3))  # before: RuntimeError (overflow) at the first update
    with pytest.raises(ValueError, match=r"epsilon must be at most 3\.40282e\+38"):
        delayed.init(torch.zeros(3))  # before: RuntimeError at init
    state = bc.init(torch.zeros(3, dtype=torch.float64))  # float64 holds 1e300
    step, _ = bc.update(torch.ones(3, dtype=torch.float64), state)
    assert bool(torch.isfinite(step).all())
    assert delayed.init(torch.zeros(3, dtype=torch.float64)).preconditioner[0] == 1e300


def test_12_a_subnormal_shape_is_the_limit_of_shape_zero():
    from fedprivopt.privacy.tuning import TrialCount, tuning_epsilon

    zero = TrialCount("truncated-negative-binomial", 10.0, shape=0.0)
    tiny = TrialCount("truncated-negative-binomial", 10.0, shape=5e-324)  # ZeroDivisionError
    assert tiny.gamma == zero.gamma
    assert tuning_epsilon([(EVENT, 10)], 1e-5, tiny) == tuning_epsilon([(EVENT, 10)], 1e-5, zero)


@pytest.mark.parametrize("count", [NAN, -1, 2.5, True, "3"])
def test_13_check_ledger_count_refuses_what_is_not_a_count(count):
    from fedprivopt.privacy.accounting_state import check_ledger_count

    with pytest.raises(ValueError, match=r"^the rule, got"):
        check_ledger_count(count, "the rule")  # before: returned unchanged
    assert check_ledger_count(10**300, "the rule") == 10**300


def test_14_ledgers_and_trial_counts_of_the_wrong_type_are_named():
    from fedprivopt.privacy.tuning import tuning_epsilon

    with pytest.raises(ValueError, match=r"ledger must be a sequence"):
        compose_epsilon("x", 1e-5)  # before: "not enough values to unpack"
    with pytest.raises(ValueError, match=r"ledger\[0\] must be a \(SubsampledGaussianEvent"):
        compose_epsilon([EVENT], 1e-5)
    with pytest.raises(ValueError, match=r"trials must be a TrialCount"):
        tuning_epsilon([(EVENT, 1)], 1e-5, "poisson")  # before: AttributeError


def test_14_flatten_and_unflatten_name_what_is_wrong():
    from fedprivopt.privacy.flat import FlatSpec, flatten, unflatten

    with pytest.raises(ValueError, match=r"state must be a mapping"):
        flatten([1, 2])  # before: AttributeError
    flat, spec = flatten({"w": torch.ones(2, 2), "b": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"spec must be a FlatSpec"):
        unflatten(flat, {"w": (2, 2)})  # before: AttributeError
    with pytest.raises(ValueError, match=r"FlatSpec needs names"):
        FlatSpec("a", 3, None, None)  # before: a TypeError from unflatten
    assert torch.equal(unflatten(flat, spec)["w"], torch.ones(2, 2))


def test_14_row_sparse_updates_check_their_fields():
    from fedprivopt.privacy.aggregate import NoisyMeanAggregator
    from fedprivopt.privacy.sparse import (
        RowSparse,
        RowSparseBatch,
        segment_norms_checked,
        segment_scale,
        segment_sq_norms,
    )

    rows, values = torch.tensor([0, 1]), torch.ones(2, 3)
    for length in ("6", 6.5, None, NAN, True):
        with pytest.raises(ValueError, match=r"length must be an integer"):
            RowSparse(rows, values, length)  # before: "6" and 6.5 were summed as 6
    with pytest.raises(ValueError, match=r"values must be a torch\.Tensor"):
        RowSparse(rows, [[1.0]], 6)
    ptr = torch.tensor([0, 2])
    for users in (None, "ab", (1.5,)):
        with pytest.raises(ValueError, match=r"users"):
            RowSparseBatch(users, rows, values, ptr, 6)  # before: TypeError/ValueError in int()
    batch = RowSparseBatch((7,), rows, values, ptr, 6)
    with pytest.raises(ValueError, match=r"i must be an integer in \[0, 0\]"):
        batch.update(5)  # before: IndexError
    with pytest.raises(ValueError, match=r"values must be a torch\.Tensor"):
        segment_sq_norms([[1.0]], ptr)  # before: AttributeError
    with pytest.raises(ValueError, match=r"row_ptr must be an int64 1-D tensor of offsets"):
        segment_norms_checked(values, torch.tensor([0, 5]))  # before: RuntimeError
    with pytest.raises(ValueError, match=r"counts must be a torch\.Tensor"):
        segment_scale([1.0], [2], values)  # before: AttributeError
    with pytest.raises(ValueError, match=r"counts must be an int64 1-D tensor of non-negative"):
        segment_scale([1.0], torch.tensor([3]), values)
    assert segment_sq_norms(values, ptr).tolist() == [6.0]
    aggregator = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=0.0, expected_cohort_size=1.0)
    assert aggregator.aggregate([batch], dim=6).metrics["accepted"] == 1


def test_14_aggregator_entries_must_be_pairs_with_integer_users():
    from fedprivopt.privacy.aggregate import NoisyMeanAggregator

    aggregator = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=0.0, expected_cohort_size=1.0)
    with pytest.raises(ValueError, match=r"updates\[0\] must be a \(user_id, update\) pair"):
        aggregator.aggregate([torch.ones(2)], dim=2)  # before: "too many values to unpack"
    with pytest.raises(ValueError, match=r"updates\[1\] user_id must be an integer"):
        aggregator.aggregate([(0, torch.ones(2)), ("u", torch.ones(2))], dim=2)  # before: taken
    with pytest.raises(ValueError, match=r"updates must be an iterable"):
        aggregator.aggregate(None, dim=2)
    result = aggregator.aggregate([(0, torch.ones(2)), (1, None)], dim=2)
    assert result.metrics["accepted"] == 1 and set(result.rejected) == {1}


@pytest.mark.parametrize("round_num", [-1, NAN, 2.5, True])
def test_15_events_through_needs_a_round_count(round_num):
    algorithm = _algorithm()
    with pytest.raises(ValueError, match=r"round_num must be an integer >= 0"):
        algorithm.events_through(round_num)  # before: -1 events, or NaN
    assert algorithm.events_through(3) == 3


@pytest.mark.parametrize("round_num", [INF, NAN, 1.5, True, -1])
def test_15_seed_for_needs_an_integer_round(round_num):
    from fedprivopt.privacy.rng import RngFactory

    rngs = RngFactory(seed=1)
    with pytest.raises(ValueError, match=r"round_num must be an integer >= 0"):
        rngs.seed_for(round_num, "noise")  # before: OverflowError, or round 1's stream
    assert rngs.seed_for(1, "noise") != rngs.seed_for(2, "noise")


def test_11_dp_adambc_at_a_noise_variance_beyond_float32_reports_divergence(tmp_path):
    from fedprivopt.optim.adam_bc import adam_bc
    from tests.reliability.test_fuzz_cli import PRESET, run_cli

    transform = adam_bc(learning_rate=1.0, gamma=None, noise_variance=1e200)
    step, _ = transform.update(torch.ones(3), transform.init(torch.zeros(3)))  # RuntimeError
    assert step.shape == (3,)
    argv = ["simulate", str(PRESET), "--out", str(tmp_path / "r"), "--rounds", "1",
            "--set", "strategy=dp-fedadam-bc", "--set", "clip-norm=1e30"]  # fmt: skip
    code, _, err = run_cli(argv)  # before: an overflow RuntimeError traceback, rc 1
    assert code == 0, err
    assert "the model diverged at round 1" in err


BIG = 10**400


def test_16_integers_beyond_float64_are_refused_naming_the_parameter():
    from fedprivopt.optim import adam, noise_calibrated_tolerance
    from fedprivopt.privacy.accounting import PrivacyAccountant
    from fedprivopt.privacy.calibration import calibrate_noise_multiplier, make_round_event
    from fedprivopt.privacy.clip import clip_l2
    from fedprivopt.privacy.noise import gaussian_noise
    from fedprivopt.privacy.tuning import TrialCount
    from fedprivopt.strategies import StrategyConfig

    calls = {
        "delta": lambda: compose_epsilon([(EVENT, 1)], BIG),
        "pld_discretization": lambda: PrivacyAccountant(accountant="pld", pld_discretization=BIG),
        "prv_eps_error": lambda: PrivacyAccountant(accountant="prv", prv_eps_error=BIG),
        "target_epsilon": lambda: calibrate_noise_multiplier(
            target_epsilon=BIG, delta=1e-5, rounds=1, sample_rate=0.1
        ),
        "noise_multiplier": lambda: SubsampledGaussianEvent.poisson(
            sample_rate=0.1, noise_multiplier=BIG
        ),
        "count_noise_multiplier": lambda: SubsampledGaussianEvent.poisson(
            sample_rate=0.1, noise_multiplier=1.0, count_noise_multiplier=BIG
        ),
        "cohort_size": lambda: SubsampledGaussianEvent.tree(
            population=10, cohort_size=BIG, noise_multiplier=1.0, restart_rounds=2
        ),
        "sample_rate": lambda: make_round_event(
            1.0, sampling="fixed", sample_rate=BIG, population=10, cohort_size=2
        ),
        "clip_norm": lambda: clip_l2(torch.ones(3), BIG),
        "std": lambda: gaussian_noise(3, BIG, generator=torch.Generator()),
        "mean": lambda: TrialCount("poisson", BIG),
        "shape": lambda: TrialCount("truncated-negative-binomial", 5.0, shape=BIG),
        "count_offset": lambda: adam(learning_rate=0.1, count_offset=BIG),
        "dim": lambda: noise_calibrated_tolerance(learning_rate=1.0, noise_std=0.1, dim=BIG),
        "min-shares": lambda: StrategyConfig(min_shares=BIG),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=name.split("_")[0]):  # before: OverflowError
            call()


@pytest.mark.parametrize("device", [0, -1, "1", "cuda:7", True])
def test_17_a_device_this_machine_lacks_is_refused_naming_device(device):
    from fedprivopt.privacy.aggregate import NoisyMeanAggregator
    from fedprivopt.privacy.noise import gaussian_noise
    from fedprivopt.privacy.rng import RngFactory
    from fedprivopt.privacy.tree import TreeNoise

    if device == "cuda:7" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")  # pragma: no cover - CPU CI
    rngs = RngFactory(seed=0)
    aggregator = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=0.0, expected_cohort_size=1.0)
    calls = [
        lambda: gaussian_noise(3, 1.0, generator=torch.Generator(), device=device),
        lambda: rngs.generator(1, "noise", device=device),
        lambda: TreeNoise(std=1.0, restart_rounds=2, rngs=rngs, dim=3, device=device),
        lambda: aggregator.aggregate([], dim=3, device=device),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=r"device"):  # before: torch's RuntimeError
            call()
    assert gaussian_noise(3, 1.0, generator=torch.Generator(), device="cpu").shape == (3,)


def test_18_noise_vectors_secure_flags_and_sum_noise_are_checked():
    from fedprivopt.privacy.aggregate import NoisyMeanAggregator
    from fedprivopt.privacy.noise import add_gaussian_noise
    from fedprivopt.privacy.rng import RngFactory

    with pytest.raises(ValueError, match=r"vector must be a torch\.Tensor"):
        add_gaussian_noise(1.0, 1.0, generator=torch.Generator())  # before: AttributeError
    with pytest.raises(ValueError, match=r"secure must be true or false"):
        RngFactory(seed=None, secure=torch.ones(3))  # before: RuntimeError
    aggregator = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1.0, expected_cohort_size=1.0)
    for bad in ("1", [1], torch.tensor(1.0), (torch.zeros(3), NAN)):
        with pytest.raises(ValueError, match=r"sum_noise"):
            aggregator.aggregate([], dim=3, sum_noise=bad)  # before: AttributeError, IndexError
    result = aggregator.aggregate([], dim=3, sum_noise=(torch.ones(3), 2.0))
    assert result.delta_tilde.tolist() == [1.0, 1.0, 1.0] and result.noise_std == math.sqrt(2.0)


def test_19_share_counts_and_tree_lengths_are_bounded():
    from fedprivopt.privacy.aggregate import NoisyMeanAggregator, default_min_shares
    from fedprivopt.privacy.rng import RngFactory
    from fedprivopt.privacy.tree import TreeNoise

    for kwargs in ({"population": 0}, {"population": True}, {"sample_rate": True},
                   {"sample_rate": 0}, {"quantile": 0}, {"quantile": 1 + 0j}):  # fmt: skip
        args = {"population": 100, "sample_rate": 0.1, "quantile": 0.01} | kwargs
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            default_min_shares(**args)  # before: 1 or 100
    assert default_min_shares(100, 0.1) == 4
    with pytest.raises(ValueError, match=r"min_shares must be an integer in \[1, 100000000\]"):
        NoisyMeanAggregator(  # before: accepted
            clip_norm=1.0,
            noise_multiplier=1.0,
            expected_cohort_size=10.0,
            noise_mode="distributed",
            min_shares=BIG,
        )
    with pytest.raises(ValueError, match=r"dim must be at most"):
        TreeNoise(std=1.0, restart_rounds=2, rngs=RngFactory(seed=0), dim=BIG)  # before: taken


def test_20_tree_cohorts_check_the_available_mask():
    from fedprivopt.privacy.rng import RngFactory
    from fedprivopt.privacy.tree import TreeCohorts

    def cohorts():
        return TreeCohorts(population=10, cohort_size=2, restart_rounds=4, rngs=RngFactory(seed=0))

    for available in (torch.ones(10), torch.ones(3, dtype=torch.bool), True, 1.0):
        with pytest.raises(ValueError, match=r"available must be a bool tensor with one entry"):
            cohorts().cohort(1, available)  # before: NotImplementedError, RuntimeError, or all
    mask = torch.zeros(10, dtype=torch.bool)
    mask[[3, 5, 7]] = True
    assert set(cohorts().cohort(1, mask)) <= {3, 5, 7}
    assert len(cohorts().cohort(1)) == 2


def test_21_clip_bit_checks_its_norms():
    from fedprivopt.privacy.adaptive_clip import clip_bit

    for norm in (-1.0, BIG * -1, torch.tensor(1.0), "1", True):
        with pytest.raises(ValueError, match=r"norm must be a number >= 0"):
            clip_bit(norm, 1.0)  # before: -1 counted as unclipped
    for clip_norm in (NAN, 0.0, -1.0, torch.ones(3)):
        with pytest.raises(ValueError, match=r"clip_norm must be"):
            clip_bit(0.5, clip_norm)  # before: a bit, or RuntimeError
    assert clip_bit(BIG, 1.0) == 0.0  # before: OverflowError
    assert (clip_bit(0.5, 1.0), clip_bit(2.0, 1.0), clip_bit(NAN, 1.0)) == (1.0, 0.0, 0.0)


def test_22_adaptive_updates_and_server_methods_check_what_they_are_given():
    from fedprivopt.privacy.adaptive_clip import ClipState, adaptive_clip
    from fedprivopt.privacy.rng import RngFactory

    clip = adaptive_clip(initial_clip_norm=1.0, quantile=0.5, learning_rate=0.2)
    for fraction in ("1", True, torch.tensor(1.0), BIG, NAN):
        with pytest.raises(ValueError, match=r"the released fraction must be"):
            clip.update(fraction, clip.init())  # before: read as 1, or OverflowError
    with pytest.raises(ValueError, match=r"state must be a ClipState"):
        clip.update(0.5, 1.0)  # before: AttributeError
    assert (
        clip.update(-1.0, clip.init()).clip_norm > 1.0 > clip.update(2.0, ClipState(1.0)).clip_norm
    )
    algorithm = _algorithm()
    with pytest.raises(ValueError, match=r"agg must be an AggregationResult"):
        algorithm.optimizer_noise_std(0.5)  # before: AttributeError
    agg = algorithm.aggregate(1, {0: torch.ones(4)})
    for clip_norm in ("1", NAN, torch.tensor(True)):
        with pytest.raises(ValueError, match=r"clip_norm must be"):
            algorithm.optimizer_noise_std(agg, clip_norm)  # before: ignored in server mode
    assert algorithm.optimizer_noise_std(agg) == agg.noise_std
    for state in (torch.ones(3), 1.0, {"x": 1}):
        with pytest.raises(ValueError, match=r"state must be a mapping made by state_dict"):
            algorithm.load_state_dict(state)  # before: IndexError / KeyError
    algorithm.load_state_dict(algorithm.state_dict())
    for round_num in (NAN, -1, 0):
        with pytest.raises(ValueError, match=r"round_num must be an integer >= 1"):
            algorithm.round_events(round_num)  # before: taken
    for purpose in (None, [1], 1.5):
        with pytest.raises(ValueError, match=r"purpose must be a str"):
            RngFactory(seed=0).seed_for(1, purpose)  # before: keyed as str(purpose)


def test_11_an_adadp_round_whose_error_is_not_finite_is_a_failed_step(tmp_path):
    from fedprivopt.optim import adadp
    from tests.reliability.test_fuzz_cli import PRESET, run_cli

    controller = adadp(learning_rate=1.0, tolerance=0.1)
    state, params = controller.init(), torch.zeros(3)
    nan = controller.update(state, params, torch.full((3,), NAN), torch.ones(3))
    assert not nan.accepted and bool(nan.params.isnan().all())  # the authors' code keeps it
    zeros = torch.zeros(3, dtype=torch.float64)
    inf = controller.update(state, zeros, zeros, torch.full((3,), 1e308, dtype=torch.float64))
    assert inf.error == INF and not inf.accepted  # the error's square sum overflows
    assert torch.equal(inf.params, zeros)  # and restores this one
    for result in (nan, inf):  # before: ValueError ("ADADP error must be finite")
        assert result.state.learning_rate == 0.9 and result.state.rejected == 1
    argv = ["simulate", str(PRESET), "--out", str(tmp_path / "r"), "--rounds", "2",
            "--set", "strategy=dp-fedavg-adadp", "--set", "clip-norm=1e30",
            "--set", "server-learning-rate=1e20"]  # fmt: skip
    code, _, err = run_cli(argv)  # before: rc 2 (and compare stopped with it)
    assert code == 0, err
    assert "the model diverged at round 1" in err


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp"])
@pytest.mark.parametrize("adaptive", [False, True])
def test_23_an_update_of_a_user_outside_the_cohort_is_rejected(strategy, adaptive):
    from fedprivopt.strategies import StrategyConfig, build_algorithm

    config = StrategyConfig(
        strategy=strategy, population=20, clients_per_round=5, num_server_rounds=3,
        noise_multiplier=0.8, clip_norm=1.0, seed=5, adaptive_clipping=adaptive,
        clip_count_stddev=1.0 if adaptive else None,
    )  # fmt: skip
    alg = build_algorithm(config, torch.zeros(4))
    rounds = alg.run_round(1)
    request, outsiders = next(rounds), set()
    while True:
        outsider = next(u for u in range(20) if u not in request.users)
        outsiders.add(outsider)
        updates = {u: torch.full((4,), 0.1) for u in [*request.users, outsider]}
        if adaptive:
            updates = _with_bits(updates)
        try:
            request = rounds.send(updates)
        except StopIteration as stop:
            result = stop.value
            break
    assert outsiders <= set(result.rejected)  # before: accepted and summed
    assert all(result.rejected[u] == "not in the round's cohort" for u in outsiders)
    suffixes = ["_1", "_2"] if strategy == "dp-fedavg-adadp" else [""]
    assert sum(result.metrics["accepted" + k] for k in suffixes) == result.metrics["cohort_size"]


class _Replies(dict):
    """Decoded replies with their clip bits, as the Flower strategy hands them over."""

    def __init__(self, updates):
        super().__init__(updates)
        self.clip_bits = {u: 1.0 for u in updates}


def _with_bits(updates):
    return _Replies(updates)


@pytest.mark.parametrize("setting", ["noise-multiplier=1e39", "clip-norm=1e100"])
def test_24_a_noise_std_beyond_the_model_dtype_is_refused_before_the_run(tmp_path, setting):
    from tests.reliability.test_fuzz_cli import PRESET, run_cli

    out = tmp_path / "r"
    code, _, err = run_cli(["simulate", str(PRESET), "--out", str(out), "--rounds", "1",
                            "--set", setting])  # fmt: skip
    assert code == 2 and len(err.splitlines()) == 1, err  # before: rc 0, "diverged"
    # the bound is float32's largest number over 64 since the twenty-sixth review
    assert "noise-multiplier * clip-norm must be at most 5.31691e+36 for a torch.float32" in err
    assert not out.exists()
    from fedprivopt.strategies import StrategyConfig, build_algorithm

    config = StrategyConfig(noise_multiplier=1e39)
    assert build_algorithm(config, torch.zeros(4, dtype=torch.float64)).config is config
