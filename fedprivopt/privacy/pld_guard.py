"""dp-accounting's privacy loss distributions (PLD) behind a memory guard.

dp-accounting's PLD of a Poisson-subsampled Gaussian has a grid that grows like ``1/σ²`` over the
discretization interval, and its composition over ``T`` events an FFT whose length grows with
``T``. Before anything is allocated both are sized with dp-accounting's own bounds
(:func:`pld_grid_points` and the Chernoff bound of ``common.compute_self_convolve_bounds``) and a
ledger that would need more than :data:`PLD_MAX_BYTES` is refused with
:class:`PLDGridTooLargeError` (:func:`check_pld_ledger`); :func:`pld_epsilon` composes exactly as
``dp_accounting.pld.PLDAccountant`` does, step for step, with a size check before each step. Use
it through :func:`fedprivopt.privacy.accounting.compose_epsilon` with ``accountant="pld"``.

References
----------
Y. Zhu, J. Dong, Y.-X. Wang, "Optimal Accounting of Differential Privacy via Characteristic
Function", AISTATS 2022.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_dist
from dp_accounting.pld import privacy_loss_mechanism as pld_mech
from scipy import special

from fedprivopt.privacy.accounting_state import (
    Ledger,
    check_delta,
    check_pld_discretization,
    gib,
    merge_ledger,
    relation_of,
)
from fedprivopt.privacy.events import SubsampledGaussianEvent

__all__ = [
    "PLD_MAX_BYTES",
    "PLD_MAX_SIGMA",
    "PLDGridTooLargeError",
    "check_pld_ledger",
    "pld_epsilon",
    "pld_grid_points",
    "poisson_gaussians",
]

# How dp-accounting's PLD grows (dp_accounting/pld, version 0.6): a Poisson-subsampled Gaussian is
# discretized by connect-the-dots on the integer multiples of the interval h between the privacy
# losses at the tail truncation points (``GaussianPrivacyLoss.connect_dots_bounds``: the noise
# tails of mass e^-50 are cut). That range is about (1 + 2·9.9σ)/σ² wide for q = 1 and
# log(1 - q + q·e^((1 + 9.9σ)/σ²)) for small q, so a single distribution holds ~1/(σ²h) points
# for q = 1 (1.2e8 at σ = 0.01, h = 1e-4), and it is built through a Python dict (~200 bytes a
# point at peak). ``self_compose(T)`` then takes FFTs of the length that the Chernoff bound of
# ``common.compute_self_convolve_bounds`` gives for tail mass 1e-15 (about T·mean + c·√T·std of
# the loss, over h): complex128 arrays and copies, ~70-105 bytes a point measured.
PLD_MAX_BYTES = 512 * 2**20
"""Largest estimated peak memory (bytes) of one PLD computation; larger ledgers are refused."""
_PLD_BUILD_BYTES = 200  # per point of one distribution while dp-accounting builds it
_PLD_FFT_BYTES = 128  # per point of the FFT length of a composition
_PLD_TAIL_MASS = 1e-15  # dp-accounting's default tail_mass_truncation of (self_)compose
PLD_MAX_SIGMA = 1e150
"""Largest accountant noise multiplier of a PLD (dp-accounting squares it: overflow ~1.3e154)."""


class PLDGridTooLargeError(ValueError):
    """The PLD of a ledger would need more memory than :data:`PLD_MAX_BYTES`."""


def _refuse(event: SubsampledGaussianEvent, what: str, points: float, nbytes: float, h: float):
    raise PLDGridTooLargeError(
        f"accountant 'pld' refused noise_multiplier={event.noise_multiplier:g} with "
        f"sample_rate={event.sample_rate:g}: {what} would hold ~{points:.3g} grid points at "
        f"pld_discretization={h:g} (about {gib(nbytes)}, limit {gib(PLD_MAX_BYTES)}); "
        "use accountant 'rdp' or a coarser pld_discretization (CLI: --pld-discretization)"
    )


def _adjacencies(event: SubsampledGaussianEvent) -> list[pld_mech.AdjacencyType]:
    # dp-accounting builds one (REMOVE) distribution for q = 1 and two (REMOVE, ADD) otherwise
    remove = pld_mech.AdjacencyType.REMOVE
    return [remove] if event.sample_rate == 1.0 else [remove, pld_mech.AdjacencyType.ADD]


def pld_grid_points(event: SubsampledGaussianEvent, discretization: float = 1e-4) -> float:
    """Grid points of one occurrence of ``event``'s PLD, before anything is allocated.

    The count dp-accounting's connect-the-dots discretization uses: the integer multiples of the
    interval between the privacy losses at the tail truncation points (from
    ``GaussianPrivacyLoss.connect_dots_bounds``), rounded as dp-accounting rounds them; the
    larger of the remove and add distributions.

    Parameters
    ----------
    event : SubsampledGaussianEvent
        A Poisson-sampled event with ``noise_multiplier > 0``; an adaptive-clipping event (sum
        and count) is counted as the one Gaussian the PLD accountant builds for it
        (:func:`poisson_gaussians`).
    discretization : float
        ``value_discretization_interval`` of the PLD.

    Returns
    -------
    float
        The number of points (``inf`` if the loss range is not finite).

    Raises
    ------
    ValueError
        For a fixed-size or tree event, which the PLD accountant refuses.
    """
    # forty-second review of issue 15, follow-up (privacy 2): mechanisms 2 folded the count into
    # pld_epsilon and check_pld_ledger but not here: an adaptive event (q 0.1, sigma 2, count
    # multiplier 1.2) was estimated at 28,590 points where its PLD has 77,465 (q 1, sigma 0.5,
    # count 0.05: 429,821 for 7,957,635), and a fixed-size event got a number
    ((event, _),) = poisson_gaussians([(event, 1)], "pld")
    points = 0.0
    for adjacency in _adjacencies(event):
        try:
            bounds = pld_mech.GaussianPrivacyLoss(
                event.accountant_noise_multiplier,
                sampling_prob=event.sample_rate,
                adjacency_type=adjacency,
            ).connect_dots_bounds()
            upper = math.ceil(bounds.epsilon_upper / discretization)
            lower = math.floor(bounds.epsilon_lower / discretization)
        except (ArithmeticError, ValueError):  # σ so small that the loss range overflows
            return math.inf
        points = max(points, float(upper - lower + 1))
    return points


@functools.lru_cache(maxsize=4)
def _single_pld(event: SubsampledGaussianEvent, h: float) -> pld_dist.PrivacyLossDistribution:
    """dp-accounting's PLD of one occurrence of ``event`` (as ``PLDAccountant`` builds it).

    Cached: a run asks for ε after every round with the same event, and building is most of
    the cost of a PLD query. A cached PLD holds its PMFs as float arrays (8 bytes a point,
    at most ~45 MB each under :data:`PLD_MAX_BYTES`), never the dict used while building.
    """
    if event.accountant_noise_multiplier > PLD_MAX_SIGMA:
        # thirty-fifth review of issue 15: from σ ≈ 1.4e154 dp-accounting's σ² overflows, and
        # the refusal said the grid would hold ~inf points (advising a coarser discretization)
        raise ValueError(
            f"accountant 'pld' cannot account noise_multiplier={event.noise_multiplier:g} "
            f"(sample_rate={event.sample_rate:g}): dp-accounting's PLD takes noise_multiplier "
            f"<= {PLD_MAX_SIGMA:g} (it squares it); use accountant 'rdp'"
        )
    points = pld_grid_points(event, h)
    if points * _PLD_BUILD_BYTES > PLD_MAX_BYTES:
        _refuse(
            event, "one round's privacy loss distribution", points, points * _PLD_BUILD_BYTES, h
        )
    try:
        return pld_dist.from_gaussian_mechanism(
            standard_deviation=event.accountant_noise_multiplier,
            value_discretization_interval=h,
            sampling_prob=event.sample_rate,
            neighboring_relation=event.neighboring_relation,
        )
    except (ArithmeticError, ValueError) as exc:
        # thirty-fifth review of issue 15: a subnormal sample rate (below 2.2e-308; `epsilon
        # --accountant pld --sample-rate 1e-310`) ended in dp-accounting's "a must be greater
        # than b. Got a=inf and b=inf.", naming nothing
        reason = str(exc).strip().rstrip(".") or type(exc).__name__
        raise ValueError(
            f"accountant 'pld' cannot account noise_multiplier={event.noise_multiplier:g} with "
            f"sample_rate={event.sample_rate:g} (dp-accounting: {reason}); use accountant 'rdp'"
        ) from None


def _pmfs(distribution: pld_dist.PrivacyLossDistribution) -> list:
    # dp-accounting has no public accessor for the two PMFs of a PLD
    pmfs = [distribution._pmf_remove]
    if not distribution._symmetric:
        pmfs.append(distribution._pmf_add)
    return pmfs


@functools.lru_cache(maxsize=8)
def _log_mgfs(event: SubsampledGaussianEvent, h: float) -> tuple:
    """Per PMF of ``event``'s PLD: its length and the log-MGFs at the Chernoff orders.

    The same orders and values as ``common.compute_self_convolve_bounds`` (which recomputes
    them on every call); they do not depend on the number of compositions, so they are cached.
    """
    table = []
    for pmf in _pmfs(_single_pld(event, h)):
        probs = pmf.to_dense_pmf()._probs
        n = len(probs)
        orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / n
        values = [float(special.logsumexp(np.arange(n) * o, b=probs)) for o in orders]
        table.append((n, tuple(orders.tolist()), tuple(values)))
    return tuple(table)


def _self_compose_points(event: SubsampledGaussianEvent, h: float, count: int) -> int:
    """FFT length of ``self_compose(count)`` of ``event``'s PLD (``common.self_convolve``).

    ``compute_self_convolve_bounds``' Chernoff bounds at tail mass 1e-15, from cached log-MGFs;
    the larger of the remove and add PMFs. Tested equal to dp-accounting's function.
    """
    length = 1
    for n, orders, values in _log_mgfs(event, h):
        lower, upper = 0, (n - 1) * count
        for order, value in zip(orders, values, strict=True):
            bound = (count * value + math.log(2 / _PLD_TAIL_MASS)) / order
            if not math.isfinite(bound):
                continue
            if order > 0:
                upper = min(upper, math.ceil(bound))
            else:
                lower = max(lower, math.floor(bound))
        length = max(length, upper - lower + 1, n)
    return length


def _check_self_compose(event: SubsampledGaussianEvent, h: float, count: int) -> None:
    """Refuse ``self_compose(count)`` of ``event``'s PLD if its FFT would exceed the limit."""
    points = _self_compose_points(event, h, count)
    if points * _PLD_FFT_BYTES > PLD_MAX_BYTES:
        what = f"its composition over {count} events (rounds x events per round)"
        _refuse(event, what, points, points * _PLD_FFT_BYTES, h)


def _dense_for(distribution: pld_dist.PrivacyLossDistribution, count: int):
    """``distribution`` with dense PMFs when its sparse ``self_compose(count)`` would misbehave.

    dp-accounting's sparse PMF (at most 1000 points) self-composes by first computing
    ``size**count`` (a ``count``-digit integer: 2**1e12 exhausts memory) and, for a one-point
    PMF, by ``count`` Python-level compositions (a hang at 1e12 rounds). Whenever that power
    exceeds 1000 it converts to dense anyway; this does the conversion first, so the result is
    the same and the bad cases never run.
    """
    pmfs = _pmfs(distribution)
    sparse = [pmf for pmf in pmfs if not isinstance(pmf, pld_pmf.DensePLDPmf)]
    if not sparse or count * math.log2(max(2, max(p.size for p in sparse))) <= math.log2(1000):
        return distribution
    dense = [pmf.to_dense_pmf() for pmf in pmfs]
    return pld_dist.PrivacyLossDistribution(dense[0], dense[1] if len(dense) > 1 else None)


def poisson_gaussians(
    ledger: Iterable[tuple[SubsampledGaussianEvent, int]], accountant: str
) -> Ledger:
    """``ledger`` merged, each event as the one Poisson-subsampled Gaussian it is.

    What the PLD and PRV paths take (one Gaussian per sampled event): an adaptive-clipping event
    (sum and count) as :meth:`~fedprivopt.privacy.events.SubsampledGaussianEvent.single_gaussian`;
    fixed-size and tree events are refused as ``compose_epsilon`` refuses them for
    ``accountant`` (``ValueError`` naming the accountant). Forty-second review of issue 15
    (mechanisms 2): :func:`pld_epsilon` and ``prv_guard.prv_epsilon`` read every event as a
    Poisson-subsampled Gaussian of its ``noise_multiplier``: the count of an adaptive-clipping
    event was left out (ε 0.80 where ``compose_epsilon`` gives 2.69), a fixed-size event read
    as Poisson add/remove (prv 0.81 where rdp gives 4.59) and a tree period as one round
    (0.80 where 19.05).
    """
    merged = merge_ledger(ledger)
    if merged:
        relation_of(merged, accountant)
    return merge_ledger((event.single_gaussian(), count) for event, count in merged)


def pld_epsilon(ledger: Ledger, delta: float, h: float) -> float:
    """ε of a Poisson ledger with dp-accounting's PLD, refusing what would not fit in memory.

    Composes exactly as ``PLDAccountant`` does (identity, then for every ``(event, count)``
    ``from_gaussian_mechanism(...).self_compose(count)`` composed in), with a size check before
    each allocation. ``delta`` and ``h`` are checked as :func:`compose_epsilon` checks them (a
    short API review of issue 15: δ of inf, 2 or NaN gave ε 0 or NaN, and ``h`` of inf or 1e300
    an ``IndexError`` or ``OverflowError``).
    """
    delta = check_delta(delta)
    h = check_pld_discretization(h)
    ledger = poisson_gaussians(ledger, "pld")
    total = pld_dist.identity(value_discretization_interval=h)
    size = 1
    for event, count in ledger:
        single = _single_pld(event, h)
        _check_self_compose(event, h, count)
        composed = _dense_for(single, count).self_compose(count)
        # composing PMFs of a and b points gives a + b - 1 (thirty-eighth review of issue 15:
        # a + b refused the identity's composition with a PMF of exactly the limit, which
        # check_pld_ledger, the check at a run's start, had accepted: the run's last ε refused)
        size += max(pmf.size for pmf in _pmfs(composed)) - 1
        if size * _PLD_FFT_BYTES > PLD_MAX_BYTES:
            what = f"the composition with the {len(ledger)} distinct events of the ledger"
            _refuse(event, what, size, size * _PLD_FFT_BYTES, h)
        total = total.compose(composed)
        size = max(pmf.size for pmf in _pmfs(total))
    return float(total.get_epsilon_for_delta(delta))


def check_pld_ledger(
    ledger: Iterable[tuple[SubsampledGaussianEvent, int]], pld_discretization: float = 1e-4
) -> None:
    """Refuse, before any large allocation, a ledger whose PLD would exceed :data:`PLD_MAX_BYTES`.

    The size checks of an ε query with ``accountant="pld"`` without the composition: a run calls
    it with its planned ledger at start, so a noise level the PLD cannot account fails before
    training rather than at its first ε query. The one-round distribution it builds is cached
    and reused by the later queries.

    Raises
    ------
    PLDGridTooLargeError
        As :func:`~fedprivopt.privacy.accounting.compose_epsilon` would for this ledger.
    """
    h = check_pld_discretization(pld_discretization)
    for event, count in poisson_gaussians(ledger, "pld"):
        _single_pld(event, h)  # refuses an oversized one-round distribution before building it
        _check_self_compose(event, h, count)
