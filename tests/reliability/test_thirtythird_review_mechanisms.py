"""Issue 15, thirty-third hostile review (mechanisms: sampling, tree, clipping, calibration).

1. Fixed-size sampling was not uniform. ``FixedSizeSampler`` took ``torch.randperm(N)[:m]``, and
   torch's CPU ``randperm`` (below ``2**32 / 20`` users) swaps in user ``i + (r % (N - i))`` for a
   32-bit draw ``r``: a draw modulo the users left. Its first pick is the generator's first 32-bit
   output modulo ``N`` (checked: 20 of 20 seeds), so users below ``2**32 mod N`` joined with
   probability ``(⌊2**32/N⌋ + 1)/2**32`` instead of ``1/N`` a pick: 2.3 % above ``m/N`` for 59
   users at ``N = 99,882,959`` (``population`` may be 10**8; 0.23 % at 10**7), where the
   accountant's replace-one bound (dp-accounting's ``SampledWithoutReplacementDpEvent``) assumes
   every ``m``-subset equally likely. Now the cohort is the users of the ``m`` smallest of ``N``
   float64 uniforms (``torch.rand``: each of the ``2**53`` multiples of ``2**-53`` equally
   likely), drawn again if the ``m``-th smallest ties another: exactly uniform.
2. The Poisson sampler included a user when its float64 uniform was below ``q``; the uniforms are
   multiples of ``2**-53``, so the probability was ``ceil(q·2**53)/2**53``, above the ``q``
   charged, and ``2**-53`` for any ``q`` below it: ``simulate toy.toml --rounds 10 --set
   clients-per-round=1e-150 --set delta=1e-300`` charged ``q = 2.5e-152`` and reported epsilon
   5.39, while every user joined with probability 1.1e-16, whose epsilon is 38.16. Now a user
   joins when its uniform is below ``q`` rounded down to a multiple of ``2**-53``
   (``sampling.inclusion_threshold``): probability exactly that, at most ``q`` (0 below
   ``2**-53``). Cohorts of ordinary rates change only where a uniform equals that multiple
   (probability ``2**-53`` a user).
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.privacy import FixedSizeSampler, PoissonSampler, RngFactory

STEP = 2.0**-53  # torch.rand's float64 uniforms are k * 2**-53, k uniform in [0, 2**53)


def _uniforms(seed: int, round_num: int, population: int) -> torch.Tensor:
    gen = RngFactory(seed=seed).generator(round_num, "sampling")
    return torch.rand(population, generator=gen, dtype=torch.float64)


def test_1_fixed_size_cohort_is_the_m_smallest_uniforms_not_a_modulo_biased_permutation():
    for population, cohort, seed in ((40, 10, 0), (1000, 1, 3), (997, 996, 5), (7, 7, 1)):
        sampler = FixedSizeSampler(population, cohort, RngFactory(seed=seed))
        uniforms = _uniforms(seed, 4, population)
        expected = torch.sort(torch.argsort(uniforms)[:cohort]).values
        assert torch.equal(sampler.sample(4), expected), (population, cohort)


@pytest.mark.parametrize(
    ("tied", "drawn_again", "cohort"),
    [
        ([0.5, 0.25, 0.5, 0.75], [0.125, 0.9, 0.8, 0.0625], [0, 3]),  # 2 of 4: 2nd = 3rd
        ([0.75, 0.25, 0.75, 0.5], [0.1, 0.9, 0.2, 0.3], [0, 2, 3]),  # 3 of 4: 3rd = 4th
    ],
)
def test_1_a_tie_at_the_cohort_boundary_is_drawn_again(monkeypatch, tied, drawn_again, cohort):
    draws = iter([torch.tensor(tied, dtype=torch.float64), torch.tensor(drawn_again).double()])
    real_rand = torch.rand
    monkeypatch.setattr(torch, "rand", lambda *a, **k: next(draws))
    try:
        drawn = FixedSizeSampler(4, len(cohort), RngFactory(seed=0)).sample(1)
    finally:
        monkeypatch.setattr(torch, "rand", real_rand)
    assert drawn.tolist() == cohort


def test_2_a_poisson_user_joins_with_probability_at_most_q(monkeypatch):
    below = (0.1 // STEP) * STEP  # the largest uniform below 0.1: P(u <= it) is above 0.1
    values = {
        1e-150: torch.zeros(40, dtype=torch.float64),  # before: everyone joined (0 < q)
        0.1: torch.full((40,), below, dtype=torch.float64),
    }
    real_rand = torch.rand
    for q, uniforms in values.items():
        monkeypatch.setattr(torch, "rand", lambda *a, u=uniforms, **k: u.clone())
        try:
            cohort = PoissonSampler(40, q, RngFactory(seed=0)).sample(1)
        finally:
            monkeypatch.setattr(torch, "rand", real_rand)
        assert cohort.numel() == 0, q
    # ordinary rates: the same users as a comparison with q (a uniform equal to the threshold
    # is the only difference)
    uniforms = _uniforms(2, 3, 1000)
    joined = PoissonSampler(1000, 0.05, RngFactory(seed=2)).sample(3)
    assert torch.equal(joined, torch.nonzero(uniforms < 0.05).flatten())
    from fedprivopt.privacy.sampling import UNIFORM_STEP, inclusion_threshold

    assert UNIFORM_STEP == STEP and inclusion_threshold(0.1) == below
    assert inclusion_threshold(1e-300) == 0.0 and inclusion_threshold(1.0) == 1.0
    assert inclusion_threshold(STEP) == STEP
