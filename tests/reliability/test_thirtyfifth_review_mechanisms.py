"""Issue 15, thirty-fifth hostile review (mechanisms: tree, clipping, noise, accounting).

1. A tree period of ``2**49`` rounds or more was charged one node a leaf too few. dp-accounting
   takes a leaf's depth in ``SingleEpochTreeAggregationDpEvent(σ, T)`` as
   ``math.ceil(math.log2(T + 1))`` in float64, and ``log2(2**k + 1)`` rounds to ``k`` from
   ``k = 49``: ``compose_epsilon`` of one period of ``2**50`` rounds at σ 10 (``δ = 1e-5``) was
   3.189, the ε of ``2**50 - 1`` rounds (depth 50), where a leaf of ``2**50`` rounds has 51
   ancestors (3.225); ``calibrate_tree(1, 1e-5, restart_rounds=2**50, rounds=2**50)`` returned
   the σ of the shallower tree (28.61 instead of 28.89). Runs never reach it (a period has at
   most ``population`` = 10**8 rounds); the Python API did. Now the event hands dp-accounting
   ``2**d - 1`` rounds for a tree of depth ``d`` (``tree.tree_depth``, exact on integers), whose
   depth it computes exactly; every ε below ``2**49`` rounds is unchanged.
2. ``NoisyMeanAggregator`` re-clipped a float16 update above ``C``. The re-clip is a product
   with ``clip_factor``'s factor, whose margin holds while the clipped entries are normal
   numbers; float16's end at 6.1e-5 (``MIN_CLIP_NORM`` keeps float32 and bfloat16 normal, not
   float16), so at a small ``C`` the entries rounded to subnormals: ``aggregate([(0,
   torch.ones(100, dtype=torch.float16))], dim=100, dtype=torch.float16)`` at ``C = 7.5e-7``
   released a sum of norm 1.59·C, a row-sparse update at ``C = 3.6e-7`` 1.67·C, and random
   updates up to 1.73·C (140 of 1,500). ``clip_l2`` itself clipped them (its exact path rounds
   toward zero). Now updates of dtypes other than float32 and float64 are re-clipped by
   ``clip_l2`` (dense, row-sparse, and in a ``RowSparseBatch``).
3. ``NoisyMeanAggregator.aggregate`` summed every entry of a user id given twice:
   ``aggregate([(0, u), (0, u)], ...)`` with ``‖u‖ = C`` released a sum of norm 2C (accepted 2),
   as did a user in two ``RowSparseBatch`` entries or in a pair and a batch, and
   ``NoisyCountAggregator.aggregate([(0, 1.0), (0, 1.0)])`` counted the bit twice: one user moved
   the release by twice the sensitivity its noise is sized for. The strategies key replies by
   user (a caller of the documented Python API, e.g. a loop that retries a user and keeps both
   replies, was not). Now a user id seen twice in one aggregation raises ``ValueError`` naming it.
4. ``TreeNoise.release`` took a period's first round again after later rounds (``release(1)``
   after ``release(3)``: "rounds are released in order", but a first round was let through
   whatever came before), and in a seeded run drew the same node noise: two releases of round 1
   with different sums differed by exactly the difference of the sums. Now a round at or before
   the last one released is refused (``ValueError`` naming both); a later period's first round
   and a resumed tree's next round are taken as before.
5. The ``pld`` accountant's numerical edges named nothing or misled. ``fedprivopt epsilon
   --accountant pld --noise-multiplier 0.5 --sample-rate 1e-310 --rounds 10 --delta 1e-5`` (any
   subnormal rate; also ``calibrate``) printed ``error: a must be greater than b. Got a=inf and
   b=inf.`` (dp-accounting's, rc 2), and ``--noise-multiplier 1e155`` (up to 1.7e308, which the
   flag takes) ``would hold ~inf grid points … (about inf GiB); use … a coarser
   pld_discretization``: dp-accounting squares σ, which overflows, while the distribution is one
   point wide. Now the first names the accountant, σ, the rate and dp-accounting's reason and
   advises ``rdp``; σ above ``PLD_MAX_SIGMA`` (1e150) is refused as Opacus' PRV above 1e6 is,
   naming the bound (``pld_guard``).
6. In distributed-noise mode the aggregator counted a row-sparse update as a noise share:
   ``NoisyMeanAggregator(clip_norm=1, noise_multiplier=1, expected_cohort_size=1,
   noise_mode="distributed", min_shares=1).aggregate([(0, RowSparse(rows=[0], values=[[0.6,
   0.8]], length=8))], dim=8)`` released ``[0.6, 0.8, 0, …]`` exactly, no top-up, with
   ``noise_std`` 1.0 (a ``RowSparseBatch`` alike): a share's noise ``N(0, σ²C²/m_min)`` must be on
   every coordinate, and a row-sparse update carries nothing outside its rows. The fast engine
   takes such batches from a task's own cohort trainer that declares ``noise_shares``. Now a
   row-sparse update (or batch user) is rejected in that mode ("a noise share is dense"), and the
   server tops up for it as for any missing share; server mode takes them as before.
7. Secure mode drew adaptive clipping's count noise with one ``torch.randn`` draw: the server's
   ``N(0, σ_b²)`` in ``NoisyCountAggregator.aggregate`` and the clients' shares in
   ``count_share``, while every other Gaussian on the privacy path takes the hardened sampler
   (Opacus' secure mode: one draw discarded, four summed and halved; RELIABILITY §6), so a
   ``simulate --set secure=true --set adaptive-clipping=true`` run released its noised counts
   from single floating-point draws, the case Holohan & Braghin attack. Now both draw through
   ``noise.gaussian_noise``, which takes the hardened sampler for a secure generator; a seeded
   draw is the same number as before (checked over 1,000 seeds and stds).
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.privacy.accounting import compose_epsilon
from fedprivopt.privacy.adaptive_clip import NoisyCountAggregator, count_share
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.noise import secure_gaussian_noise
from fedprivopt.privacy.rng import RngFactory, SecureGenerator
from fedprivopt.privacy.sparse import RowSparse, RowSparseBatch
from fedprivopt.privacy.tree import TreeNoise, calibrate_tree


def _tree_epsilon(steps: int, sigma: float = 10.0) -> float:
    event = SubsampledGaussianEvent.tree(
        population=1, cohort_size=1, noise_multiplier=sigma, restart_rounds=steps
    )
    return compose_epsilon([(event, 1)], 1e-5)


@pytest.mark.parametrize("k", [49, 50, 53, 70])
def test_1_a_period_of_2_to_the_k_rounds_is_charged_depth_k_plus_1(k):
    # depth(2**k) = k + 1 = depth(2**(k+1) - 1); before: the ε of depth k = depth(2**k - 1)
    assert _tree_epsilon(2**k) == _tree_epsilon(2 ** (k + 1) - 1)
    assert _tree_epsilon(2**k) > _tree_epsilon(2**k - 1)


def test_1_ordinary_periods_keep_their_epsilon():
    # α·depth/(2σ²) at every order: depth 3 for 4 to 7 rounds, 4 for 8
    assert _tree_epsilon(4) == _tree_epsilon(7) < _tree_epsilon(8)
    assert _tree_epsilon(4) == pytest.approx(0.6797634071506626, rel=1e-12)  # before the fix


def test_1_calibrate_tree_sizes_sigma_for_the_deeper_tree():
    deep = calibrate_tree(1.0, 1e-5, restart_rounds=2**50, rounds=2**50)
    shallow = calibrate_tree(1.0, 1e-5, restart_rounds=2**50 - 1, rounds=2**50 - 1)
    assert deep > shallow * 1.005  # before: equal (28.61)
    event = SubsampledGaussianEvent.tree(
        population=1, cohort_size=1, noise_multiplier=deep, restart_rounds=2**50
    )
    assert compose_epsilon([(event, 1)], 1e-5) <= 1.0


_ONES = torch.ones(10, 10, dtype=torch.float16)


def _norm(result) -> float:
    return float(torch.linalg.vector_norm(result.delta_tilde.double()))


@pytest.mark.parametrize(
    ("clip_norm", "update"),
    [
        (7.5e-7, torch.ones(100, dtype=torch.float16)),  # before: 1.59·C
        (3.6e-7, RowSparse(torch.arange(10), torch.ones(10, 10, dtype=torch.float16), 100)),
        (3.6e-7, RowSparseBatch((0,), torch.arange(10), _ONES, torch.tensor([0, 10]), 100)),
    ],
)
def test_2_a_float16_update_is_re_clipped_within_c(clip_norm, update):
    agg = NoisyMeanAggregator(clip_norm=clip_norm, noise_multiplier=1e-300, expected_cohort_size=1)
    entry = update if isinstance(update, RowSparseBatch) else (0, update)
    result = agg.aggregate([entry], dim=100, dtype=torch.float16, generator=torch.Generator())
    assert _norm(result) <= clip_norm  # rounded toward zero (the row-sparse ones to 0)
    assert result.metrics["server_clipped"] == 1.0


def test_2_random_float16_and_bfloat16_updates_stay_within_c():
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        for _ in range(60):
            n = int(torch.randint(1, 2000, (1,), generator=gen))
            scale = 10 ** float(torch.empty(1).uniform_(-4, 4, generator=gen))
            update = (torch.randn(n, generator=gen, dtype=torch.float64) * scale).to(dtype)
            clip_norm = 10 ** float(torch.empty(1).uniform_(-9, 2, generator=gen))
            agg = NoisyMeanAggregator(
                clip_norm=clip_norm, noise_multiplier=1e-300, expected_cohort_size=1
            )
            result = agg.aggregate([(0, update)], dim=n, dtype=dtype, generator=gen)
            assert _norm(result) <= clip_norm, (dtype, n, clip_norm)


_UNIT = torch.tensor([1.0, 0.0, 0.0, 0.0])


def _batch(*users: int) -> RowSparseBatch:
    n = len(users)
    return RowSparseBatch(users, torch.arange(n), torch.ones(n, 4), torch.arange(n + 1), 4 * n)


@pytest.mark.parametrize(
    ("entries", "dim"),
    [
        ([(0, _UNIT), (0, _UNIT)], 4),  # before: accepted 2, a sum of norm 2C
        ([(3, _UNIT), (5, _UNIT.clone()), (3, _UNIT)], 4),  # 45th: a tensor of its own each
        ([_batch(0), _batch(0)], 4),
        ([(0, _UNIT), _batch(0)], 4),
        ([_batch(1, 1)], 8),
    ],
)
def test_3_a_user_given_twice_is_refused(entries, dim):
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1.0, expected_cohort_size=1)
    with pytest.raises(ValueError, match=r"user \d appears twice"):
        agg.aggregate(entries, dim=dim, dtype=torch.float32, generator=torch.Generator())


def test_3_distinct_users_are_summed_as_before():
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1e-300, expected_cohort_size=1)
    # forty-fifth review (mechanisms 1): two users holding one tensor are refused; one each
    result = agg.aggregate([(0, _UNIT), (1, _UNIT.clone())], dim=4, generator=torch.Generator())
    assert result.metrics["accepted"] == 2.0
    assert torch.allclose(result.delta_tilde, 2 * _UNIT)  # each at C, within its margin


def test_3_a_clip_bit_given_twice_is_refused():
    counter = NoisyCountAggregator(count_stddev=1.0, expected_cohort_size=1)
    with pytest.raises(ValueError, match="user 0 appears twice"):  # before: counted twice
        counter.aggregate([(0, 1.0), (1, 0.0), (0, 1.0)], generator=torch.Generator())
    assert counter.aggregate([(0, 1.0), (1, 0.0)], generator=torch.Generator()).counted == 2


@pytest.mark.parametrize(("released", "again"), [((1, 2, 3), 1), ((1,), 1), ((1, 2, 3, 4, 5), 5)])
def test_4_a_released_round_of_the_tree_is_not_released_again(released, again):
    tree = TreeNoise(std=1.0, restart_rounds=4, rngs=RngFactory(seed=0), dim=3)
    for round_num in released:
        tree.release(round_num)
    with pytest.raises(ValueError, match=f"round {again} was released already"):
        tree.release(again)  # before: round 1's noise again, bit for bit


def test_4_later_periods_and_a_resumed_tree_go_on():
    tree = TreeNoise(std=1.0, restart_rounds=4, rngs=RngFactory(seed=0), dim=3)
    tree.release(1)
    tree.release(9)  # the first round of a later period
    resumed = TreeNoise(std=1.0, restart_rounds=4, rngs=RngFactory(seed=0), dim=3)
    resumed.load_state_dict(tree.state_dict())
    assert resumed.release(10)[1] == 2


@pytest.mark.parametrize(
    ("sigma", "rate", "says"),
    [
        ("0.5", "1e-310", "cannot account noise_multiplier=0.5 with sample_rate=1e-310 (dp-acc"),
        ("1e155", "0.5", "PLD takes noise_multiplier <= 1e+150 (it squares it); use accountant"),
    ],
)
def test_5_pld_at_its_numerical_edges_names_the_values(capsys, sigma, rate, says):
    argv = ["epsilon", "--accountant", "pld", "--noise-multiplier", sigma, "--sample-rate", rate]
    assert main([*argv, "--rounds", "10", "--delta", "1e-5"]) == 2
    err = capsys.readouterr().err
    assert says in err and "'rdp'" in err and err.count("\n") == 1, err
    assert "inf grid points" not in err and "a must be greater" not in err.split("(")[0]


def test_5_pld_up_to_its_bound_is_computed(capsys):
    argv = ["epsilon", "--accountant", "pld", "--noise-multiplier", "1e150", "--sample-rate"]
    assert main([*argv, "0.5", "--rounds", "3", "--delta", "1e-5"]) == 0
    assert capsys.readouterr().out.startswith("epsilon = 0.0000 ")


def _distributed(min_shares: int) -> NoisyMeanAggregator:
    return NoisyMeanAggregator(
        clip_norm=1.0,
        noise_multiplier=1.0,
        expected_cohort_size=1,
        noise_mode="distributed",
        min_shares=min_shares,
    )


@pytest.mark.parametrize(
    "entry",
    [
        (0, RowSparse(torch.tensor([0]), torch.tensor([[0.6, 0.8]]), 8)),
        RowSparseBatch((0,), torch.tensor([0]), torch.tensor([[0.6, 0.8]]), torch.arange(2), 8),
    ],
)
def test_6_a_row_sparse_update_is_no_distributed_noise_share(entry):
    result = _distributed(1).aggregate([entry], dim=8, generator=torch.Generator().manual_seed(0))
    assert result.rejected == {0: "row-sparse update in distributed-noise mode (a noise share is "
                                  "dense)"}  # fmt: skip
    assert result.metrics["accepted"] == 0.0
    assert result.metrics["topup_std"] == 1.0  # before: 0.0, the sum [0.6, 0.8, 0, ...] exactly
    assert bool((result.delta_tilde[2:] != 0).all())


def test_6_server_mode_takes_row_sparse_updates_as_before():
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1e-300, expected_cohort_size=1)
    update = RowSparse(torch.tensor([0]), torch.tensor([[0.6, 0.8]]), 8)
    result = agg.aggregate([(0, update)], dim=8, generator=torch.Generator())
    assert result.metrics["accepted"] == 1.0 and not result.rejected


def _secure(seed: int) -> SecureGenerator:
    generator = SecureGenerator()
    generator.manual_seed(seed)
    return generator


def _hardened(std: float, seed: int) -> float:
    return float(secure_gaussian_noise(1, std, generator=_secure(seed), dtype=torch.float64)[0])


def test_7_secure_count_noise_takes_the_hardened_sampler():
    counter = NoisyCountAggregator(count_stddev=2.0, expected_cohort_size=4)
    result = counter.aggregate([(0, 1.0), (1, 0.0), (2, 1.0)], generator=_secure(11))
    assert result.fraction == pytest.approx((0.5 + _hardened(2.0, 11)) / 4 + 0.5, abs=1e-15)
    assert count_share(1.0, 0.3, _secure(12)) == 0.5 + _hardened(0.3, 12)  # before: one draw


def test_7_seeded_count_noise_is_the_same_number_as_before():
    def one_draw(std: float, seed: int) -> float:
        z = torch.randn((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        return std * float(z)

    for seed in range(20):
        assert count_share(0.0, 0.7, torch.Generator().manual_seed(seed)) == -0.5 + one_draw(
            0.7, seed
        )
        counter = NoisyCountAggregator(count_stddev=1.5, expected_cohort_size=2)
        fraction = counter.aggregate([(0, 1.0)], generator=torch.Generator().manual_seed(seed))
        assert fraction.fraction == (0.5 + one_draw(1.5, seed)) / 2 + 0.5
