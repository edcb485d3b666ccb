"""Cohort samplers over users, driven by ``(seed, round)``.

Sampling is over *users* (the privacy unit), never over transport nodes. Poisson sampling is the
default: each user joins a round independently with probability ``q``, which is what the
Poisson-subsampled Gaussian accountant assumes. Fixed-size sampling draws exactly ``m`` distinct
users uniformly without replacement and is accounted for as such (replace-one adjacency).

Both draw one float64 uniform per user (``torch.rand``: a multiple of ``2**-53``, each of the
``2**53`` values equally likely), so that the probabilities the accountant assumes hold exactly:
a Poisson user joins when its uniform is below :func:`inclusion_threshold` (``q`` rounded down to
a multiple of ``2**-53``: probability exactly that, never above ``q``), and a fixed-size cohort is
the ``m`` users of the smallest uniforms (a uniform ``m``-subset; a draw whose ``m``-th and
``m+1``-th smallest tie is drawn again). Thirty-third review of issue 15: the fixed-size cohort was
``torch.randperm(N)[:m]``, whose Fisher-Yates steps take a 32-bit draw modulo the users left, so
some users joined more often than ``m/N`` (up to 2.3 % more at ``N = 99,882,959``), and a Poisson
user joined with probability ``ceil(q·2**53)/2**53`` above ``q`` (``2**-53`` for any ``q`` below
it).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch

from fedprivopt.core.checks import as_float, check_int
from fedprivopt.core.text import shown
from fedprivopt.privacy.rng import RngFactory, check_rngs

__all__ = [
    "MAX_POPULATION",
    "FixedSizeSampler",
    "PoissonSampler",
    "SamplingSpec",
    "check_round",
    "inclusion_threshold",
    "make_sampler",
]

#: The step of ``torch.rand``'s float64 uniforms: ``k · 2**-53`` for ``k`` in ``[0, 2**53)``.
UNIFORM_STEP = 2.0**-53

#: Upper bound of the number of users ``N`` a sampler draws from. A round draws one value per
#: user (a float64 uniform and a bool mask: 9 bytes a user), so 10**8 users take about 0.9 GB a
#: round; 10**9 used to be accepted and fail in the first round with an 8 GB allocation. Real
#: cross-device populations (StackOverflow: ~380,000 users) are far below it.
MAX_POPULATION = 100_000_000


def inclusion_threshold(sample_rate: float) -> float:
    """``q`` rounded down to a multiple of :data:`UNIFORM_STEP`: ``P(torch.rand < it)`` exactly.

    A float64 uniform of ``torch.rand`` is ``k · 2**-53`` with ``k`` uniform in ``[0, 2**53)``,
    so ``u < t`` for a multiple ``t`` of ``2**-53`` has probability exactly ``t``, and ``u < q``
    for any other ``q`` has ``ceil(q·2**53)·2**-53 > q``. Thirty-third review of issue 15: the
    Poisson sampler compared with ``q`` itself, so its users joined more often than the ``q`` the
    accountant charged: ``simulate toy.toml --rounds 10 --set clients-per-round=1e-150 --set
    delta=1e-300`` charged ``q = 2.5e-152`` (epsilon 5.39) while each user joined with probability
    ``2**-53`` (1.1e-16, epsilon 38.16). The scaling is exact (a power of two), and the result is
    at most ``q`` (0 below ``2**-53``: nobody joins), so the accountant's ``q`` bounds it.
    """
    return math.floor(sample_rate / UNIFORM_STEP) * UNIFORM_STEP


def check_round(round_num: object) -> int:
    """``round_num`` as an ``int``; ``ValueError`` naming it unless it is an integer ``>= 0``.

    The engines sample rounds from 1 (0 is a valid step counter). Sixteenth review of issue 15:
    ``PoissonSampler.sample(-1)`` and ``sample(2.5)`` drew a cohort (the round's text keys its
    generator), so a caller's off-by-one or a float round passed unnoticed.
    """
    return check_int("round_num", round_num, 0)


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
        check_rngs(self.rngs)  # forty-seventh review of issue 15 (mechanisms 4)
        q = self.sample_rate
        # fourteenth review of issue 15: True was kept as the rate and "0.5" passed the check
        # (then failed inside the draw), as a raw event's rate was
        if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0.0 < q <= 1.0:
            raise ValueError(f"sample_rate must be a number in (0, 1], got {shown(q)}")
        object.__setattr__(self, "sample_rate", float(q))

    @property
    def expected_cohort_size(self) -> float:
        """Expected cohort size ``m̄ = qN``: the fixed denominator of the noised mean."""
        return float(self.sample_rate) * self.population

    def sample(self, round_num: int, purpose: str = "sampling") -> torch.Tensor:
        """Return the sorted user ids sampled in ``round_num`` (an ``int64`` tensor).

        ``purpose`` separates independent cohorts of the same round (ADADP draws two).
        ``round_num`` is an integer ``>= 0`` (:func:`check_round`).
        """
        gen = self.rngs.generator(check_round(round_num), purpose)
        uniforms = torch.rand(self.population, generator=gen, dtype=torch.float64)
        mask = uniforms < inclusion_threshold(self.sample_rate)  # probability exactly <= q
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
        check_rngs(self.rngs)  # forty-seventh review of issue 15 (mechanisms 4)

    @property
    def sample_rate(self) -> float:
        """Marginal inclusion probability ``m / N``."""
        return self.cohort_size / self.population

    @property
    def expected_cohort_size(self) -> float:
        """The cohort size ``m`` (fixed)."""
        return float(self.cohort_size)

    def sample(self, round_num: int, purpose: str = "sampling") -> torch.Tensor:
        """Return the sorted user ids sampled in ``round_num`` (an ``int64`` tensor).

        ``round_num`` is an integer ``>= 0`` (:func:`check_round`). The users of the ``m``
        smallest of ``N`` float64 uniforms: every ``m``-subset equally likely. A draw where the
        ``m``-th smallest uniform ties another (probability below ``N·2**-53``) is drawn again
        from the same generator, which keeps the choice exactly uniform (the tie is an event
        that does not depend on which users hold the uniforms). Thirty-third review of issue 15:
        ``torch.randperm(N)[:m]`` takes a 32-bit draw modulo the users left at each step, so
        users whose index falls below the remainder joined up to ``N/2**32`` more often (2.3 %
        at ``N = 99,882,959``) than the ``m/N`` the accountant assumes.
        """
        gen = self.rngs.generator(check_round(round_num), purpose)
        n, m = self.population, self.cohort_size
        if m == n:
            return torch.arange(n)
        while True:
            uniforms = torch.rand(n, generator=gen, dtype=torch.float64)
            if m <= n // 2:
                cohort = _extreme(uniforms, m, largest=False)
            else:  # the cohort is everyone but the n - m users of the largest uniforms
                left_out = _extreme(uniforms, n - m, largest=True)
                if left_out is not None:
                    keep = torch.ones(n, dtype=torch.bool)
                    keep[left_out] = False
                    cohort = torch.nonzero(keep, as_tuple=False).flatten()
                else:
                    cohort = None
            if cohort is not None:
                return cohort


def _extreme(uniforms: torch.Tensor, k: int, *, largest: bool) -> torch.Tensor | None:
    """The sorted indices of the ``k`` smallest (or largest) ``uniforms`` (``k < N``).

    ``None`` when the ``k``-th and ``k + 1``-th of them tie (the draw must be made again). Only
    the uniforms beyond a cut that ``k + 1`` of them pass but for a chance below 1.3e-8 (1e-15
    at ``k = 10**4``) are sorted (``N`` bytes of mask and ``O(k)`` more, not a copy of all
    ``N``); when fewer pass, all are. The cut changes what is sorted, never the result.
    """
    n = uniforms.numel()
    cut = (k + 1 + 8.0 * math.sqrt(k + 1) + 8.0) / n
    passed = uniforms >= 1.0 - cut if largest else uniforms < cut
    ids = torch.nonzero(passed, as_tuple=False).flatten()
    if ids.numel() <= k:
        ids = torch.arange(n)
    values, order = torch.sort(uniforms[ids], descending=largest)
    if values[k - 1] == values[k]:
        return None
    return torch.sort(ids[order[:k]]).values


def _cohort(cohort_size: object, population: int) -> int:
    """``cohort_size`` checked against ``population`` before a rate is computed from it.

    A short API review of issue 15: ``cohort_size=10**400`` raised "integer division result
    too large for a float".
    """
    return check_int("cohort_size", cohort_size, 1, population, high_name="population")


@dataclass(frozen=True)
class SamplingSpec:
    """How a round picks its users: one value that builds the sampler and its privacy event.

    The one place where "Poisson sampling takes a rate, or a cohort and a population; fixed-size
    sampling takes a population and a cohort" is decided: the server algorithm, the
    ``epsilon``/``calibrate`` commands and the calibration all go through it, so the users a
    run samples and the event it accounts come from the same numbers.

    Parameters
    ----------
    kind : {"poisson", "fixed"}
    population : int, optional
        ``N``; required for fixed-size sampling and to build a sampler.
    sample_rate : float, optional
        Poisson's ``q``; defaults to ``cohort_size / population``.
    cohort_size : int, optional
        Fixed-size sampling's ``m`` (or, for Poisson, the expected cohort that gives ``q``).
    """

    kind: str
    population: int | None = None
    sample_rate: float | None = None
    cohort_size: int | None = None

    def __post_init__(self) -> None:
        given = self.sample_rate is not None and self.cohort_size is not None
        if self.kind in ("poisson", "fixed") and given and self.population is not None:
            # fourteenth review of issue 15: one of two disagreeing rates silently won
            # (calibrate_noise_multiplier(sample_rate=0.5, population=100, cohort_size=10)
            # calibrated q = 0.5; with sampling "fixed" the sample_rate was ignored)
            population = check_int("population", self.population, 1, MAX_POPULATION)
            implied = _cohort(self.cohort_size, population) / population
            if not math.isclose(as_float(self.sample_rate), implied, rel_tol=1e-12):
                raise ValueError(
                    f"sample_rate={shown(self.sample_rate)} disagrees with "
                    "cohort_size/population = "
                    f"{self.cohort_size}/{population} = {implied:g}; give one of them"
                )
        elif self.kind == "poisson" and given:
            raise ValueError(
                "cohort_size without population does not define a sample rate; give "
                "sample_rate alone, or population and cohort_size"
            )
        if self.kind == "poisson":
            if self.sample_rate is None:
                if self.population is None or self.cohort_size is None:
                    raise ValueError(
                        "poisson sampling needs sample_rate (or population and cohort_size)"
                    )
                population = check_int("population", self.population, 1, MAX_POPULATION)
                cohort = _cohort(self.cohort_size, population)
                object.__setattr__(self, "sample_rate", cohort / population)
        elif self.kind == "fixed":
            if self.population is None or self.cohort_size is None:
                raise ValueError("fixed sampling needs population and cohort_size")
        else:
            raise ValueError(f"sampling must be 'poisson' or 'fixed', got {shown(self.kind)}")

    def sampler(self, rngs: RngFactory | None = None) -> PoissonSampler | FixedSizeSampler:
        """The sampler of these users (``rngs``: its per-round generators)."""
        rngs = RngFactory() if rngs is None else rngs
        if self.population is None:
            raise ValueError(f"{self.kind} sampling needs population to build a sampler")
        if self.kind == "poisson":
            return PoissonSampler(self.population, self.sample_rate, rngs)
        return FixedSizeSampler(self.population, self.cohort_size, rngs)

    def event(self, noise_multiplier: float, count_noise_multiplier: float | None = None):
        """The privacy event of one round that samples this way and adds noise ``σ``.

        ``count_noise_multiplier``: ``2σ_b`` when the round also releases the noised count of
        adaptive clipping (:mod:`fedprivopt.privacy.adaptive_clip`).
        """
        # imported here: events loads dp-accounting, which a sampler alone does not need
        from fedprivopt.privacy.events import SubsampledGaussianEvent

        if self.kind == "poisson":
            return SubsampledGaussianEvent.poisson(
                sample_rate=self.sample_rate,
                noise_multiplier=noise_multiplier,
                population=self.population,
                count_noise_multiplier=count_noise_multiplier,
            )
        return SubsampledGaussianEvent.fixed(
            population=self.population,
            cohort_size=self.cohort_size,
            noise_multiplier=noise_multiplier,
            count_noise_multiplier=count_noise_multiplier,
        )


def make_sampler(
    kind: str,
    *,
    population: int,
    sample_rate: float | None = None,
    cohort_size: int | None = None,
    rngs: RngFactory | None = None,
) -> PoissonSampler | FixedSizeSampler:
    """Build a sampler by name (``"poisson"`` or ``"fixed"``): :meth:`SamplingSpec.sampler`."""
    spec = SamplingSpec(kind, population, sample_rate=sample_rate, cohort_size=cohort_size)
    return spec.sampler(rngs)
