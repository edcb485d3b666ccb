"""Privacy events: immutable descriptions of what one data access released.

A round of user-level DP training releases a *subsampled Gaussian*: a cohort is sampled from the
users, each user's update is clipped to L2 norm ``C``, the clipped updates are summed and Gaussian
noise of standard deviation ``σC`` is added to the sum. :class:`SubsampledGaussianEvent` records
``σ`` and how the cohort was sampled; accountants in :mod:`fedprivopt.privacy.accounting` interpret
it with dp-accounting or Opacus.

Throughout the package the *noise multiplier* ``σ`` is the noise standard deviation on the clipped
sum divided by the clip norm ``C``. The accountant's own multiplier is the noise standard deviation
divided by the L2 sensitivity under the neighbouring relation that the sampling scheme needs:

* Poisson sampling, add/remove-one adjacency: sensitivity ``C``, accountant multiplier ``σ``;
* fixed-size sampling without replacement, replace-one adjacency: replacing one user's update
  moves the sum by up to ``2C``, so the accountant multiplier is ``σ / 2``.

With adaptive clipping (:mod:`fedprivopt.privacy.adaptive_clip`) a round also releases the noised
count of users whose update was not clipped. Its *count noise multiplier* ``2σ_b`` is, in the same
units, the noise std ``σ_b`` over the add/remove sensitivity ``1/2`` of the centred count
``Σ (b_i − 1/2)``; under replace-one the sensitivity is ``1`` and the accountant multiplier is
``σ_b``, again half. The event's inner mechanism is then dp-accounting's
``ComposedDpEvent([GaussianDpEvent(σ_Δ), GaussianDpEvent(2σ_b)])`` (scaled by the sampling's
factor), which is exactly one Gaussian of multiplier ``(σ_Δ⁻² + (2σ_b)⁻²)^(-1/2)``
(:meth:`SubsampledGaussianEvent.single_gaussian`; Andrew et al. 2021, Theorem 1).

Under tree aggregation (``noise-mechanism = "tree"``, :mod:`fedprivopt.privacy.tree`) nothing is
sampled: one event, :meth:`SubsampledGaussianEvent.tree` (``sampling = "tree"``), stands for a
whole restart period of ``T`` rounds in which every user joins at most one round. dp-accounting
accounts it as ``SingleEpochTreeAggregationDpEvent(σ, T)`` (given ``2**d - 1`` rounds of the same
depth ``d``, which its float64 ``log2`` computes exactly) under
``NeighboringRelation.REPLACE_SPECIAL`` (a user's clipped update replaced by the zero update
moves every node by at most ``C``, so the multiplier is ``σ``); RDP only.

References
----------
G. Andrew, O. Thakkar, H. B. McMahan, S. Ramaswamy, "Differentially Private Learning with Adaptive
Clipping", NeurIPS 2021.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any

import dp_accounting as dpa

from fedprivopt.core.checks import as_float, check_int
from fedprivopt.core.text import shown

__all__ = ["EVENT_KINDS", "MIN_NOISE_MULTIPLIER", "SAMPLING_KINDS", "SubsampledGaussianEvent"]

SAMPLING_KINDS = ("poisson", "fixed")
#: Kinds of events: the sampling kinds, and ``"tree"`` (one restart period of tree aggregation,
#: no sampling: :mod:`fedprivopt.privacy.tree`).
EVENT_KINDS = (*SAMPLING_KINDS, "tree")

#: Smallest positive noise multiplier an event may have. dp-accounting's RDP of a subsampled
#: Gaussian squares ``σ``: below ~1.5e-154 ``σ**2`` is subnormal and ``inf - inf`` makes the RDP
#: NaN, which its ε conversion drops (ε printed as 0 for σ between ~1.3e-154 and 4.7e-152 at
#: q 0.01), and below ~1.5e-162 it divides by zero. ``1e-100`` leaves 50 orders of magnitude
#: of margin (the ε of one round there is ~5e199, checked against the scan in the tests); no
#: σ that small protects anything, so a run asking for it is a slip, refused naming the key.
MIN_NOISE_MULTIPLIER = 1e-100


def _finite(value: object) -> bool:
    """Whether ``value`` is a real number (not a bool) that is a finite float.

    A short API review of issue 15: an integer beyond float64 (10**400) raised
    ``OverflowError`` from ``math.isfinite`` (:func:`~fedprivopt.core.checks.as_float` makes
    it ``inf``).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return math.isfinite(as_float(value))


@dataclass(frozen=True)
class SubsampledGaussianEvent:
    """One subsampled Gaussian release of the clipped sum of user updates.

    Use the constructors :meth:`poisson` and :meth:`fixed`.

    Attributes
    ----------
    noise_multiplier : float
        ``σ``: noise std on the clipped sum divided by the clip norm. ``0`` means no privacy.
    sampling : str
        ``"poisson"`` or ``"fixed"``.
    sample_rate : float
        Poisson inclusion probability ``q``; for fixed-size sampling the marginal ``m / N``.
    population : int or None
        Number of users ``N`` (required for fixed-size sampling).
    cohort_size : int or None
        Users per round ``m`` (fixed-size sampling only).
    count_noise_multiplier : float or None
        ``2σ_b`` when the round also released the noised count of unclipped users (adaptive
        clipping): its noise std over the add/remove sensitivity ``1/2`` of the centred count.
        ``None``: the round released the sum only.
    tree_steps : int or None
        Rounds of the restart period a ``"tree"`` event stands for (``None`` otherwise).
    """

    noise_multiplier: float
    sampling: str
    sample_rate: float
    population: int | None = None
    cohort_size: int | None = None
    count_noise_multiplier: float | None = None
    tree_steps: int | None = None

    def __post_init__(self) -> None:
        sigma = self.noise_multiplier
        # sixteenth review of issue 15: a numpy.float32 sigma was refused while a float32 rate
        # was kept unconverted (its event then could not be written as JSON), and the
        # constructors poisson()/fixed() took True and "0.5" through float(): every real
        # scalar but a bool is taken, as a float
        if not (_finite(sigma) and sigma >= 0):
            raise ValueError(f"noise_multiplier must be a finite number >= 0, got {shown(sigma)}")
        sigma = float(sigma)
        object.__setattr__(self, "noise_multiplier", sigma)
        if 0 < sigma < MIN_NOISE_MULTIPLIER:
            raise ValueError(
                f"noise_multiplier must be 0 (no privacy) or at least {MIN_NOISE_MULTIPLIER:g} "
                f"(below it the accountants are not numerically reliable), got {shown(sigma)}"
            )
        count = self.count_noise_multiplier
        if count is not None:
            if not (_finite(count) and count > 0):
                raise ValueError(
                    f"count_noise_multiplier must be a finite number > 0, got {shown(count)}"
                )
            if count < MIN_NOISE_MULTIPLIER:
                raise ValueError(
                    f"count_noise_multiplier must be at least {MIN_NOISE_MULTIPLIER:g} (below it "
                    f"the accountants are not numerically reliable), got {shown(count)}"
                )
            if sigma == 0:
                raise ValueError("count_noise_multiplier needs a noised sum (noise_multiplier > 0)")
            object.__setattr__(self, "count_noise_multiplier", float(count))
        if self.sampling not in EVENT_KINDS:
            raise ValueError(f"sampling must be one of {EVENT_KINDS}, got {shown(self.sampling)}")
        if self.population is not None:
            object.__setattr__(self, "population", check_int("population", self.population, 1))
        if (self.sampling == "tree") != (self.tree_steps is not None):
            raise ValueError("tree_steps is given exactly for a tree event")
        if self.sampling == "tree":
            steps = check_int("tree_steps", self.tree_steps, 1)
            object.__setattr__(self, "tree_steps", steps)
            if self.count_noise_multiplier is not None:
                raise ValueError("a tree event has no count_noise_multiplier")
        if self.sampling in ("fixed", "tree"):
            n, m = self.population, self.cohort_size
            if n is None or m is None:
                raise ValueError("fixed sampling needs population and cohort_size")
            m = check_int("cohort_size", m, 1, n, high_name="population")
            object.__setattr__(self, "cohort_size", m)
            if not math.isclose(self.sample_rate, m / n, rel_tol=1e-12):
                raise ValueError(
                    f"sample_rate of a {self.sampling} event must be cohort_size/population"
                )
        elif self.cohort_size is not None:
            raise ValueError("cohort_size is only meaningful for fixed sampling")
        rate = self.sample_rate
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0.0 < rate <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {shown(self.sample_rate)}")
        object.__setattr__(self, "sample_rate", float(rate))

    @classmethod
    def poisson(
        cls,
        *,
        sample_rate: float,
        noise_multiplier: float,
        population: int | None = None,
        count_noise_multiplier: float | None = None,
    ) -> SubsampledGaussianEvent:
        """Poisson-subsampled Gaussian with inclusion probability ``sample_rate``."""
        return cls(
            noise_multiplier,
            "poisson",
            sample_rate,
            population,
            None,
            count_noise_multiplier,
        )

    @classmethod
    def fixed(
        cls,
        *,
        population: int,
        cohort_size: int,
        noise_multiplier: float,
        count_noise_multiplier: float | None = None,
    ) -> SubsampledGaussianEvent:
        """Gaussian on a cohort of exactly ``cohort_size`` users drawn without replacement."""
        population = check_int("population", population, 1)
        cohort_size = check_int("cohort_size", cohort_size, 1, population, high_name="population")
        return cls(
            noise_multiplier,
            "fixed",
            cohort_size / population,
            population,
            cohort_size,
            count_noise_multiplier,
        )

    @classmethod
    def tree(
        cls, *, population: int, cohort_size: int, noise_multiplier: float, restart_rounds: int
    ) -> SubsampledGaussianEvent:
        """One restart period of tree aggregation: ``restart_rounds`` rounds of ``cohort_size``.

        Each user joins at most one round of the period; every tree node carries noise of std
        ``σC``. ``sample_rate`` is the share ``m/N`` of users a round holds (nothing is sampled).
        """
        population = check_int("population", population, 1)
        cohort_size = check_int("cohort_size", cohort_size, 1, population, high_name="population")
        return cls(
            noise_multiplier,
            "tree",
            cohort_size / population,
            population,
            cohort_size,
            None,
            restart_rounds,
        )

    @property
    def effective_noise_multiplier(self) -> float:
        """``σ`` of the one Gaussian the round is: ``(σ_Δ⁻² + (2σ_b)⁻²)^(-1/2)`` with a count."""
        if self.count_noise_multiplier is None or self.noise_multiplier == 0:
            return self.noise_multiplier
        # σ_Δ (1 + (σ_Δ/c)²)^(-1/2): no overflow of σ⁻² for a tiny σ
        return self.noise_multiplier / math.hypot(
            1.0, self.noise_multiplier / self.count_noise_multiplier
        )

    def single_gaussian(self) -> SubsampledGaussianEvent:
        """The same release as one subsampled Gaussian (itself when there is no count).

        Two Gaussian queries of one dataset, of multipliers ``σ_1`` and ``σ_2`` (noise over
        sensitivity), are together the Gaussian mechanism of multiplier
        ``(σ_1⁻² + σ_2⁻²)^(-1/2)``: scale each query by its multiplier and the pair is one
        query with isotropic unit noise whose sensitivity is ``√(σ_1⁻² + σ_2⁻²)`` (Andrew et
        al. 2021, Theorem 1). Sampling acts on the pair, so the subsampled events are the same
        too. dp-accounting's RDP accountant reduces ``ComposedDpEvent`` of Gaussians inside a
        sampled event the same way; its PLD accountant and Opacus' PRV accountant take only a
        single Gaussian, and are given this one.
        """
        if self.count_noise_multiplier is None:
            return self
        return SubsampledGaussianEvent(
            self.effective_noise_multiplier,
            self.sampling,
            self.sample_rate,
            self.population,
            self.cohort_size,
        )

    @property
    def neighboring_relation(self) -> dpa.NeighboringRelation:
        """Adjacency under which the event is accounted."""
        if self.sampling == "tree":
            return dpa.NeighboringRelation.REPLACE_SPECIAL
        if self.sampling == "fixed":
            return dpa.NeighboringRelation.REPLACE_ONE
        return dpa.NeighboringRelation.ADD_OR_REMOVE_ONE

    @property
    def accountant_noise_multiplier(self) -> float:
        """Noise std over the L2 sensitivity under :attr:`neighboring_relation`."""
        return self.noise_multiplier / 2.0 if self.sampling == "fixed" else self.noise_multiplier

    def to_dp_event(self) -> dpa.DpEvent:
        """Return the equivalent ``dp_accounting`` event.

        With a count: the sampled event's inner mechanism is
        ``ComposedDpEvent([GaussianDpEvent(sum), GaussianDpEvent(count)])``, both multipliers in
        the units of :attr:`neighboring_relation`. A tree event is
        ``SingleEpochTreeAggregationDpEvent(σ, 2**d - 1)`` for a period of depth
        ``d = tree_depth(tree_steps)``: the same RDP as ``tree_steps`` rounds, with the depth
        computed exactly.
        """
        if self.sampling == "tree":
            # dp-accounting takes a leaf's depth as math.ceil(math.log2(T + 1)) in float64,
            # which rounds to log2(T) for T = 2**49 and beyond: a period of 2**50 rounds was
            # charged 50 nodes a leaf where a leaf has 51 (ε 3.19 instead of 3.22 at σ 10,
            # thirty-fifth review of issue 15). 2**d - 1 rounds has the same depth d
            # (tree.tree_depth, exact on integers) and log2(2**d) is exact.
            from fedprivopt.privacy.tree import tree_depth

            steps = (1 << tree_depth(self.tree_steps)) - 1
            return dpa.SingleEpochTreeAggregationDpEvent(self.noise_multiplier, steps)
        gaussian = dpa.GaussianDpEvent(self.accountant_noise_multiplier)
        if self.count_noise_multiplier is not None:
            scale = 0.5 if self.sampling == "fixed" else 1.0
            count = dpa.GaussianDpEvent(self.count_noise_multiplier * scale)
            gaussian = dpa.ComposedDpEvent([gaussian, count])
        if self.sampling == "fixed":
            return dpa.SampledWithoutReplacementDpEvent(self.population, self.cohort_size, gaussian)
        return dpa.PoissonSampledDpEvent(self.sample_rate, gaussian)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-serialisable); the optional fields only when set."""
        out = asdict(self)
        for key in ("count_noise_multiplier", "tree_steps"):
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SubsampledGaussianEvent:
        """Inverse of :meth:`to_dict`."""
        keys = {
            "noise_multiplier",
            "sampling",
            "sample_rate",
            "population",
            "cohort_size",
            "count_noise_multiplier",
            "tree_steps",
        }
        unknown = set(data) - keys
        if unknown:
            raise ValueError(f"unknown privacy event fields: {shown(sorted(unknown, key=repr))}")
        return cls(**{k: data.get(k) for k in keys})
