"""Cohort samplers over users, driven by ``(seed, round)``.

Sampling is over *users* (the privacy unit), never over transport nodes. Poisson sampling is the
default: each user joins a round independently with probability ``q``, which is what the
Poisson-subsampled Gaussian accountant assumes. Fixed-size sampling draws exactly ``m`` distinct
users uniformly without replacement and is accounted for as such (replace-one adjacency).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedprivopt.core.checks import check_int
from fedprivopt.privacy.rng import RngFactory

__all__ = ["MAX_POPULATION", "FixedSizeSampler", "PoissonSampler", "make_sampler"]

#: Upper bound of the number of users ``N`` a sampler draws from. A round draws one value per
#: user (a float64 uniform and a bool mask for Poisson sampling, an int64 permutation for
#: fixed-size sampling: 9 or 8 bytes a user), so 10**8 users take about 0.9 GB a round;
#: 10**9 used to be accepted and fail in the first round with an 8 GB allocation. Real
#: cross-device populations (StackOverflow: ~380,000 users) are far below it.
MAX_POPULATION = 100_000_000


@dataclass(frozen=True)
class PoissonSampler:
    """Poisson sampling: user ``i`` joins round ``t`` with probability ``sample_rate``.

    Parameters
    ----------
    population : int
        Number of users ``N``, in ``[1, MAX_POPULATION]`` (:data:`MAX_POPULATION` = 10**8: a
        round draws one float64 per user); users are ``0 .. N-1``.
    sample_rate : float
        Inclusion probability ``q`` in ``(0, 1]``.
    rngs : RngFactory
        Source of the per-round generators (purpose ``"sampling"``).
    """

    population: int
    sample_rate: float
    rngs: RngFactory = field(default_factory=RngFactory)
    kind = "poisson"

    def __post_init__(self) -> None:
        n = check_int("population", self.population, 1, MAX_POPULATION)
        object.__setattr__(self, "population", n)
        if not (0.0 < float(self.sample_rate) <= 1.0):
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate}")

    @property
    def expected_cohort_size(self) -> float:
        """Expected cohort size ``m̄ = qN``: the fixed denominator of the noised mean."""
        return float(self.sample_rate) * self.population

    def sample(self, round_num: int, purpose: str = "sampling") -> torch.Tensor:
        """Return the sorted user ids sampled in ``round_num`` (an ``int64`` tensor).

        ``purpose`` separates independent cohorts of the same round (ADADP draws two).
        """
        gen = self.rngs.generator(round_num, purpose)
        mask = torch.rand(self.population, generator=gen, dtype=torch.float64) < self.sample_rate
        return torch.nonzero(mask, as_tuple=False).flatten()


@dataclass(frozen=True)
class FixedSizeSampler:
    """Uniform sampling of exactly ``cohort_size`` distinct users without replacement.

    Parameters
    ----------
    population : int
        Number of users ``N``, in ``[1, MAX_POPULATION]`` (a round draws a permutation of the
        users).
    cohort_size : int
        Users per round ``m``, ``1 <= m <= N``.
    rngs : RngFactory
        Source of the per-round generators (purpose ``"sampling"``).
    """

    population: int
    cohort_size: int
    rngs: RngFactory = field(default_factory=RngFactory)
    kind = "fixed"

    def __post_init__(self) -> None:
        n = check_int("population", self.population, 1, MAX_POPULATION)
        m = check_int("cohort_size", self.cohort_size, 1, n, high_name="population")
        object.__setattr__(self, "population", n)
        object.__setattr__(self, "cohort_size", m)

    @property
    def sample_rate(self) -> float:
        """Marginal inclusion probability ``m / N``."""
        return self.cohort_size / self.population

    @property
    def expected_cohort_size(self) -> float:
        """The cohort size ``m`` (fixed)."""
        return float(self.cohort_size)

    def sample(self, round_num: int, purpose: str = "sampling") -> torch.Tensor:
        """Return the sorted user ids sampled in ``round_num`` (an ``int64`` tensor)."""
        gen = self.rngs.generator(round_num, purpose)
        perm = torch.randperm(self.population, generator=gen)
        return torch.sort(perm[: self.cohort_size]).values


def make_sampler(
    kind: str,
    *,
    population: int,
    sample_rate: float | None = None,
    cohort_size: int | None = None,
    rngs: RngFactory | None = None,
) -> PoissonSampler | FixedSizeSampler:
    """Build a sampler by name (``"poisson"`` or ``"fixed"``)."""
    rngs = RngFactory() if rngs is None else rngs
    if kind == "poisson":
        if sample_rate is None:
            if cohort_size is None:
                raise ValueError("poisson sampling needs sample_rate (or cohort_size)")
            sample_rate = cohort_size / check_int("population", population, 1, MAX_POPULATION)
        return PoissonSampler(population, sample_rate, rngs)
    if kind == "fixed":
        if cohort_size is None:
            raise ValueError("fixed sampling needs cohort_size")
        return FixedSizeSampler(population, cohort_size, rngs)
    raise ValueError(f"sampling must be 'poisson' or 'fixed', got {kind!r}")
