"""The argument checks and bounds of the noised mean (:mod:`fedprivopt.privacy.aggregate`).

Split from :mod:`fedprivopt.privacy.aggregate` (the forty-third review's module splits), which
re-exports every public name here:

* :func:`check_aggregator`, the checks of
  :class:`~fedprivopt.privacy.aggregate.NoisyMeanAggregator`'s arguments (:data:`NOISE_MODES`),
  and :func:`check_sum_noise`, the check of a ``sum_noise`` given to its ``aggregate``;
* :data:`MAX_SUM_NOISE_STD`, the largest noise std ``σC`` on a round's sum, and
  :func:`sum_dtype`, the dtype in which the updates are summed;
* :func:`default_min_shares` and :func:`share_noise_growth`, the distributed-noise share
  counts (``m_min``, and how far the sum's noise std grows beyond it).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable

import torch

from fedprivopt.core.checks import check_int, check_real
from fedprivopt.core.text import shown
from fedprivopt.privacy.clip import MIN_CLIP_NORM, PLAIN_TENSORS, l2_norm
from fedprivopt.privacy.sampling import MAX_POPULATION
from fedprivopt.privacy.sparse import RowSparse, RowSparseBatch, dense_problem

__all__ = [
    "MAX_SUM_NOISE_STD",
    "NOISE_MODES",
    "KeptReads",
    "check_aggregator",
    "check_sum_noise",
    "check_sum_noise_draws",
    "default_min_shares",
    "memory_place",
    "noise_dtype",
    "refuse_shared_updates",
    "share_noise_growth",
    "shared_users",
    "sum_dtype",
    "sum_grid",
]

NOISE_MODES = ("server", "distributed")

#: Largest noise std ``σC`` on a round's sum (and ``σC/m̄`` on its mean; with adaptive clipping
#: ``σ_Δ C``, checked by the strategy's configuration): its square, times up to the population
#: (at most :data:`~fedprivopt.privacy.sampling.MAX_POPULATION` = 10**8; distributed noise
#: scales the sum's variance by the accepted shares) or the 64 nodes of a tree release stays a
#: float (1e300 * 1e8 < 1.8e308). Eleventh review of issue 15, finding 1.
MAX_SUM_NOISE_STD = 1e150


def sum_dtype(dtype: torch.dtype, bound: float) -> torch.dtype:
    """The dtype in which :meth:`NoisyMeanAggregator.aggregate` sums updates of ``dtype``.

    Float64 for every private sum (``bound`` finite; forty-eighth review, :func:`sum_grid`), a
    non-private float32 sum in float32 (float16 and bfloat16 always in float64: their sums also
    lose whole updates to rounding, 256 + 1 = 256 in bfloat16). Thirty-eighth review of issue
    15: the sum was kept in the model's dtype, and a partial sum that overflowed stayed infinite
    whatever noise was added, so an infinite release said, without noise, that the clipped sum
    overflowed:
    130 float32 updates at ``C = 5.3e36`` whose exact sum is 0 (65 of ``+0.999C``, then 65 of
    ``-0.999C``) gave an infinite mean every time, one user fewer a finite one; 66 float16
    updates at ``C = 1000`` alike. A float64 model is refused a bound at which it could
    overflow (runs keep ``noise-multiplier · C <= 1e150`` with ``noise-multiplier >= 1e-100``).
    A non-private float32 sum (``bound`` infinite) stays in float32.
    """
    most = torch.finfo(dtype).max / 2 / MAX_POPULATION  # the largest bound that cannot overflow
    if dtype == torch.float64:
        if math.isfinite(bound) and bound > most:
            raise ValueError(
                f"clip_norm is too large for a float64 model: the sum of up to {MAX_POPULATION} "
                f"updates of norm {bound:g} could overflow (at most {most:g})"
            )
        return dtype
    # forty-eighth review of issue 15 (clipping 1): a private float32 sum is float64 too (see
    # sum_grid); a float32 sum's rounding moved the release by up to 1.06 C for one user
    if dtype == torch.float32 and math.isinf(bound):  # inf: not private
        return dtype
    return torch.float64


def noise_dtype(dtype: torch.dtype, bound: float) -> torch.dtype:
    """The dtype the server's Gaussian noise is drawn in for a sum of updates of ``dtype``.

    Float32 for a float32 model whose float32 sum could not overflow (``bound`` up to 1.7e30):
    the draw every seeded run made before the forty-eighth review moved the sum to float64
    (:func:`sum_dtype`), so a seeded run keeps its noise stream; the float32 draw is added to
    the exact float64 sum. Else the sum's dtype (fortieth review of issue 15, mechanisms 2: in
    a float16 model's dtype a draw beyond 65504 was infinite where the float64 sum had room).
    """
    most = torch.finfo(torch.float32).max / 2 / MAX_POPULATION
    if dtype == torch.float32 and math.isfinite(bound) and bound <= most:
        return dtype
    return sum_dtype(dtype, bound)


#: Fewest bits of a float64 sum kept for the count of updates summed on :func:`sum_grid`'s
#: grid (up to ``2**20`` updates a sum; more where the expected cohort is larger).
SUM_COUNT_BITS = 20


def sum_grid(
    dtype: torch.dtype, bound: float, noise_mode: str, expected_cohort_size: float
) -> tuple[float, int] | None:
    """``(q, most)``: a float64 sum of up to ``most`` updates on multiples of ``q`` is exact.

    Forty-eighth review of issue 15 (clipping 1): every rounding of a floating-point sum depends
    on the other terms, so one user's presence changed how the later additions rounded. In a
    float32 sum, 511 updates of ``C`` then 512 of ``2^-15 C`` after a user of ``C`` moved the
    sum by 1.0156 C (1.0624 C for a cohort of 2048; ``drive_round``, dense, row-sparse and the
    fast engine's batches alike): a sensitivity above the ``C`` epsilon is charged for. Each
    re-clipped update, in float64, is rounded toward zero (its norm can only shrink) to
    multiples of the power of two ``q = 2^(E - 53 + b)``, ``bound < 2^E``: every entry is below
    ``2^(53 - b) q``, so a sum of up to ``most = 2^b`` of them is a multiple of ``q`` below
    ``2^53 q``, held exactly whatever the order. ``b`` is :data:`SUM_COUNT_BITS`, or more where
    ``4 m̄ + 1024`` needs more (a Poisson cohort beyond it: about never). An entry loses less
    than ``q`` (``2^-32`` of ``bound`` at ``b = 20``).

    ``None`` (summed as before) where the sum is not private, for a float64 model (whose
    precision the grid would cut; a float64 sum's rounding moves it by about ``n^2 2^-53``
    relative) and in distributed-noise mode (the grid would cut the shares' noise).
    """
    if not math.isfinite(bound) or dtype == torch.float64 or noise_mode != "server":
        return None
    bits = max(SUM_COUNT_BITS, math.ceil(math.log2(4.0 * expected_cohort_size + 1024.0)))
    return math.ldexp(1.0, math.frexp(bound)[1] - (53 - bits)), 2**bits


def default_min_shares(population: int, sample_rate: float, quantile: float = 0.01) -> int:
    """A low quantile of the cohort size ``Binomial(population, sample_rate)`` (at least 1).

    Distributed noise shares are calibrated to this many clients, so in all but ``quantile`` of the
    rounds at least ``m_min`` shares arrive and no top-up is needed.
    """
    from scipy.stats import binom

    # a short API review of issue 15: a population of 0 or True, a rate of True and a quantile
    # of 1+0j or 0 were taken
    population = check_int("population", population, 1, MAX_POPULATION)
    sample_rate = check_real("sample_rate", sample_rate, low=0.0, high=1.0, low_open=True)
    quantile = check_real("quantile", quantile, low=0.0, high=1.0, low_open=True, high_open=True)
    return max(1, int(binom.ppf(quantile, population, sample_rate)))


def share_noise_growth(min_shares: int, most_shares: int) -> float:
    """``√(max(n, m_min)/m_min)`` at ``n = most_shares``: how far a distributed noise std grows.

    In distributed-noise mode every accepted share carries ``N(0, σ²C²/m_min)``, so the sum of
    ``n`` of them has noise std ``σC·√(max(n, m_min)/m_min)``: above ``σC`` as soon as more than
    ``min_shares`` arrive. A bound on ``σC`` that keeps a round's noise within the model dtype's
    range must divide by this at the most shares a round can accept (the population under
    Poisson sampling, the cohort under fixed-size sampling). Thirty-seventh review of issue 15:
    adaptive clipping kept ``σ_Δ C`` at float32's largest number over the headroom, and with
    ``min-shares = 1`` and 500 shares the sum overflowed to an infinite model.
    """
    min_shares = check_int("min_shares", min_shares, 1)
    most_shares = check_int("most_shares", most_shares, 1)
    return math.sqrt(max(most_shares, min_shares) / min_shares)


def check_sum_noise(sum_noise: object, allowed: bool) -> None:
    """``sum_noise`` as :meth:`NoisyMeanAggregator.aggregate` takes it: ``(tensor, variance)``.

    A short API review of issue 15: a string, a list or a scalar tensor ended in
    ``AttributeError`` or ``IndexError``.
    """
    if not allowed:
        raise ValueError("sum_noise replaces the server noise of a private aggregation only")
    ok = isinstance(sum_noise, tuple) and len(sum_noise) == 2
    ok = ok and isinstance(sum_noise[0], torch.Tensor) and sum_noise[0].is_floating_point()
    ok = ok and dense_problem(sum_noise[0]) is None  # a meta one: NotImplementedError (r39)
    if not ok:
        raise ValueError(
            f"sum_noise must be a (floating tensor, variance) pair, got {type(sum_noise).__name__}"
        )
    check_real("sum_noise variance", sum_noise[1], low=0.0)


def check_sum_noise_draws(noise: torch.Tensor, variance: object, least: float) -> None:
    """``ValueError`` unless ``noise`` can be draws of ``N(0, variance I)``, ``variance >= least``.

    Forty-seventh review of issue 15 (mechanisms 1): ``aggregate(..., sum_noise=tree.release(r))``
    (:meth:`~fedprivopt.privacy.tree.TreeNoise.release` returns the noise and its node count,
    not its variance) reported the noise std ``sqrt(nodes)/m̄``, whatever the nodes' std: 0.1
    where the mean carried 0.2 (node std 2), 0.1 where it carried 0.05 (node std 0.5); and a
    variance below ``σ²C²`` (a tree of another std) replaced the aggregator's noise by less.
    ``least`` is the aggregator's ``σ²C²``. A mean square of ``d > 200`` draws lies within
    ``[1 - 2√(50/d), 1 + 2√(50/d) + 100/d]`` times the variance but for a chance ``e^-50``
    (Laurent and Massart; 1 % more covers a float16 draw's rounding); fewer are not measured.
    """
    variance = check_real("sum_noise variance", variance, low=0.0)
    if variance < least * (1.0 - 1e-9):
        raise ValueError(
            f"sum_noise variance {variance:g} is below the aggregator's sigma^2 C^2 = {least:g}: "
            "the noise that replaces its N(0, sigma^2 C^2 I) draw must carry at least as much"
        )
    dim = noise.numel()
    if dim <= 200 or variance == 0.0:
        return
    ratio = (l2_norm(noise) / math.sqrt(dim) / math.sqrt(variance)) ** 2
    low = 0.99 * (1.0 - 2.0 * math.sqrt(50.0 / dim))
    high = 1.01 * (1.0 + 2.0 * math.sqrt(50.0 / dim) + 100.0 / dim)
    if not low <= ratio <= high:
        raise ValueError(
            f"sum_noise: its {dim} draws have mean square {ratio:.4g} times the variance given "
            f"({variance:g}), where N(0, variance) draws lie within [{low:.4g}, {high:.4g}] of "
            "it: give the noise's own per-coordinate variance (TreeNoise.release(r) returns "
            "(noise, nodes), whose variance is nodes * std**2); nothing was released"
        )


def check_aggregator(
    clip_norm: float | None,
    noise_multiplier: float,
    expected_cohort_size: float,
    noise_mode: str,
    min_shares: int | None,
) -> tuple[float | None, float, float, int | None]:
    """:class:`~fedprivopt.privacy.aggregate.NoisyMeanAggregator`'s arguments, checked.

    Returns ``(clip_norm, noise_multiplier, expected_cohort_size, min_shares)`` as checked
    (``min_shares`` checked in distributed-noise mode only); raises ``ValueError`` naming the
    first argument out of its range.
    """
    noise_multiplier = check_real("noise_multiplier", noise_multiplier, low=0.0)
    if clip_norm is None:
        if noise_multiplier > 0:
            raise ValueError("clip_norm must be a number > 0 when noise_multiplier > 0")
    else:
        clip_norm = check_real("clip_norm", clip_norm, low=MIN_CLIP_NORM)
    expected_cohort_size = check_real(
        "expected_cohort_size", expected_cohort_size, low=0.0, low_open=True
    )
    scale = noise_multiplier * max(1.0, 1.0 / expected_cohort_size)
    if clip_norm is not None and scale > 0 and not clip_norm * scale <= MAX_SUM_NOISE_STD:
        # a short API review of issue 15: clip_norm=1e300 overflowed squaring σC
        raise ValueError(
            f"clip_norm must be at most {MAX_SUM_NOISE_STD / scale:.6g} here: noise_multiplier"
            f" * clip_norm / min(1, expected_cohort_size) must be at most "
            f"{MAX_SUM_NOISE_STD:g} (the noise std of a sum and a mean), got "
            f"{noise_multiplier:g} * {clip_norm:g} / min(1, {expected_cohort_size:g})"
        )
    if noise_mode not in NOISE_MODES:
        raise ValueError(f"noise_mode must be one of {NOISE_MODES}, got {shown(noise_mode)}")
    if noise_mode == "distributed":  # at most the largest population (a short API review)
        min_shares = check_int("min_shares", min_shares, 1, MAX_POPULATION)
    return clip_norm, noise_multiplier, expected_cohort_size, min_shares


def memory_place(tensor: object) -> tuple | None:
    """Where a plain strided tensor's entries lie, or ``None`` (the aggregation checks it).

    ``((device, storage), start byte, end byte, contiguous, view)``; also for the strategies'
    cohorts (:func:`~fedprivopt.strategies.cohorts.refuse_shared_memory`).
    """
    if type(tensor) not in PLAIN_TENSORS or tensor.layout != torch.strided:
        return None
    if tensor.is_nested or tensor.device.type == "meta" or tensor.numel() == 0:
        return None
    size = tensor.element_size()
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    start = tensor.storage_offset() * size
    view = (tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
    storage = tensor.untyped_storage().data_ptr()
    return (str(tensor.device), storage), start, start + extent * size, tensor.is_contiguous(), view


def _entry_places(entry: object) -> list[tuple[tuple, object]]:
    """``(place, user)`` of the update tensors an entry of ``aggregate``'s list holds."""
    if type(entry) is RowSparseBatch:
        place = memory_place(entry.values)
        if place is None:
            return []
        users = [u for i, u in enumerate(entry.users) if _rows_of(entry, i)]
        if len(users) > 1 and entry.values.dim() == 2 and entry.values.stride(0) == 0:
            # every row the same entries (an expanded tensor): each user holds the others' rows
            raise _shared(users[0], users[1])
        return [(place, users[0])] if users else []
    if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
        return []  # the aggregation rejects or refuses it
    user, update = entry
    if type(update) is RowSparse:
        update = update.values
    place = memory_place(update)
    return [] if place is None else [(place, user)]


def _rows_of(batch, i: int) -> int:
    """How many rows user ``i`` of ``batch`` has (0 where its offsets are malformed)."""
    ptr = batch.row_ptr
    ok = isinstance(ptr, torch.Tensor) and ptr.dim() == 1 and ptr.numel() > i + 1
    return max(0, int(ptr[i + 1]) - int(ptr[i])) if ok else 0


def _shared(user_a: object, user_b: object) -> ValueError:
    return ValueError(
        f"updates: users {shown(user_a)} and {shown(user_b)} are held in the same memory (one "
        "tensor, or views of the same entries: a workspace reused for every user, or the batches "
        "of a cohort trainer kept past the next one, hold the last user's update when they are "
        "summed); give each user a tensor of its own (.clone()); nothing was released"
    )


def refuse_shared_updates(updates: list | tuple) -> None:
    """Raise ``ValueError`` when two users' updates in ``updates`` share memory.

    Forty-fifth review of issue 15 (mechanisms 1): :meth:`~fedprivopt.privacy.aggregate.
    NoisyMeanAggregator.aggregate` of a list of pairs whose updates are one workspace tensor
    (``[(u, work) for u in users]``, a user's own loop training each user into it), or of
    ``list(trainer.train_batches(...))`` of the tag task's cohort trainer (whose batches reuse
    two workspaces), summed the last user's update once for every user holding it: a
    sensitivity of several ``C`` under a charge of ``C``. A list holds all its entries at once,
    so entries that share memory hold the same values when summed; they are refused before
    anything is summed (a stream, read one entry at a time, may reuse memory). Views of
    distinct entries of one tensor (the rows of a stacked matrix) are distinct updates; the
    strategies refuse the same in their cohorts (forty-fifth review, api 3).
    """
    placed = [pair for entry in updates for pair in _entry_places(entry)]
    pair = _first_shared(placed)
    if pair is not None:
        raise _shared(*pair)


def shared_users(entries: list | tuple) -> tuple[object, object] | None:
    """The first two users of ``(user, update)`` entries whose updates share memory, or ``None``.

    ``update`` a tensor or a :class:`~fedprivopt.privacy.sparse.RowSparse` (its values); other
    entries are left to the aggregation. The strategies' check of a cohort
    (:func:`~fedprivopt.strategies.cohorts.refuse_shared_memory`) and :func:`refuse_shared_updates`
    share it.
    """
    placed = []
    for user, update in entries:
        place = memory_place(update.values if type(update) is RowSparse else update)
        if place is not None:
            placed.append((place, user))
    return _first_shared(placed)


def _first_shared(placed: list[tuple[tuple, object]]) -> tuple[object, object] | None:
    """The first two users of ``(place, user)`` whose entries overlap, or ``None``."""
    groups: dict[tuple, list] = {}
    for place, user in placed:
        groups.setdefault(place[0], []).append((place, user))
    for group in groups.values():
        # one view twice (contiguous or not): the same entries
        views: dict[tuple, object] = {}
        for place, user in group:
            other = views.setdefault(place[4], user)
            if other is not user and not _same(other, user):
                return other, user
        # contiguous ranges, by start: one overlaps an earlier one exactly when it starts
        # before the furthest end so far (O(n log n): a stacked matrix's rows, 2,000 users)
        spans = sorted(((p[1], p[2], u) for p, u in group if p[3]), key=lambda t: t[:2])
        end, owner = -1, None
        for start, stop, user in spans:
            if start < end and not _same(owner, user):
                return owner, user
            if stop > end:
                end, owner = stop, user
    return None


def _same(user_a: object, user_b: object) -> bool:
    """Whether two entries name one user (a user twice is the aggregation's own refusal)."""
    try:
        return bool(user_a == user_b)
    except Exception:  # an id that does not compare is left to the aggregation
        return False


class KeptReads:
    """Updates remembered as they are read, to find two users read from one unchanged memory.

    Forty-fifth review of issue 15 and its follow-up (privacy 2, 3, 7 and 8): a reply
    (:func:`~fedprivopt.clients.replies.reply_updates`), a cohort's mapping of one's own
    (:class:`~fedprivopt.strategies.cohorts.ReadOnce`) and a cohort trainer's batches
    (:mod:`fedprivopt.simulation.fast_trainer`) are read one update at a time, each copied or
    summed as it is read, so memory reused from one read to the next is right when it was
    written in between (a lazy mapping, a generator that writes each user into its workspace);
    updates read from one memory at one version of it (not written between their reads) held
    the same values: the last user's update sent or summed once for each of them, a
    sensitivity of several C under a charge of C. A tensor that is its whole memory is kept by
    a weak reference (one its owner let go is no workspace another update holds); a view, a
    fresh one of a kept workspace too (privacy 8), is kept itself.
    """

    def __init__(self) -> None:
        self.kept: list[tuple[object, Callable[[], object], int]] = []

    def keep(self, user: object, tensor: object, *, version: bool = True) -> None:
        """Remember ``tensor`` as read for ``user`` (``version=False``: every read as one).

        What :func:`memory_place` does not place (no plain strided tensor) is not kept: no
        check of shared memory looks at it.
        """
        if memory_place(tensor) is None:
            return
        size = tensor.numel() * tensor.element_size()
        whole = tensor._base is None and tensor.untyped_storage().nbytes() == size
        ref = weakref.ref(tensor) if whole else (lambda t=tensor: t)
        self.kept.append((user, ref, tensor._version if version else 0))

    def shared(self) -> tuple[object, object] | None:
        """The first two users kept from one memory at one version, or ``None``; forgets all."""
        groups: dict[int, list] = {}
        for user, ref, version in self.kept:
            tensor = ref()
            if tensor is not None:
                groups.setdefault(version, []).append((user, tensor))
        self.kept.clear()
        for entries in groups.values():
            pair = shared_users(entries)
            if pair is not None:
                return pair
        return None

    def refuse(self) -> None:
        """Raise :func:`refuse_shared_updates`' ``ValueError`` for :meth:`shared`'s two users."""
        pair = self.shared()
        if pair is not None:
            raise _shared(*pair)
