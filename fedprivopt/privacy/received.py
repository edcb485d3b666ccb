"""A received update on its way into the sum: its form, its re-clip and the tally of arrivals.

:class:`~fedprivopt.privacy.aggregate.NoisyMeanAggregator` takes each reply apart with
:func:`user_pair` (a user id and an update), rejects a non-finite one with :data:`NON_FINITE`,
re-clips an accepted one by a product with its clip factor (:data:`PRODUCT_DTYPES`), after
:func:`prescaled` where that factor is subnormal, or by :func:`reclipped` (float16, bfloat16),
and counts what arrived in a :class:`Tally` (which refuses a user received twice).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

import torch

from fedprivopt.core.checks import check_int
from fedprivopt.privacy.clip import clip_l2
from fedprivopt.privacy.sparse import RowSparse

__all__ = [
    "NON_FINITE",
    "PRODUCT_DTYPES",
    "Tally",
    "exact_reclip",
    "prescaled",
    "reclipped",
    "user_pair",
    "whole_segment",
]

NON_FINITE = "contains NaN or Inf"
"""The reason of an update of the right form rejected for a NaN or infinite entry (or norm)."""


def prescaled(update, values: torch.Tensor, factor: float):
    """``(update / 2^k, factor * 2^k)`` for an update whose clip factor is subnormal.

    Only a (hostile) update with norm near the float maximum gets a clip factor below the
    smallest normal float; the factor, cast to the update's dtype, would then lose the relative
    precision that :func:`~fedprivopt.privacy.clip.clip_factor`'s margin relies on, and the
    re-clipped update could exceed the bound (measured: by 2.6e-6 relative at entries of 3e38).
    Dividing by a power of two is exact, so the product keeps the margin. The factor is scaled
    by :func:`math.ldexp` (thirty-eighth review of issue 15: ``factor * 2.0**1024`` raised
    ``OverflowError`` for a float64 update holding an entry of at least ``2^1023``, 9e307, and
    the whole aggregation failed).
    """
    exponent = math.frexp(float(values.abs().max()))[1]
    scale = math.ldexp(1.0, -exponent)
    if isinstance(update, RowSparse):
        scaled = RowSparse(update.rows, update.values * scale, update.length)
    else:
        scaled = update * scale
    return scaled, math.ldexp(factor, exponent)


def exact_reclip(norm: float, factor: float, dtype: torch.dtype) -> bool:
    """Whether an accepted update is re-clipped by :func:`reclipped` rather than a product.

    Float16 and bfloat16 updates that need scaling (see :data:`PRODUCT_DTYPES`), and any update
    whose measured norm is infinite: finite float64 entries whose norm exceeds the float range
    get a clip factor of 0 from ``C / inf`` (thirty-eighth review of issue 15: such an update
    made the aggregation raise ``OverflowError``), where :func:`reclipped` keeps its direction.
    """
    return factor != 1.0 and (dtype not in PRODUCT_DTYPES or not math.isfinite(norm))


#: Dtypes whose re-clip is a product with
#: :meth:`~fedprivopt.privacy.aggregate.NoisyMeanAggregator._factor`'s factor: their clipped
#: entries are normal numbers for every ``C >= MIN_CLIP_NORM``. Others (float16, bfloat16) are
#: re-clipped by :func:`~fedprivopt.privacy.clip.clip_l2`, exact at every magnitude: thirty-fifth
#: review of issue 15, float16's normal numbers end at 6.1e-5, and a re-clipped float16 update
#: of 149 entries at C = 1.2e-7 had norm 1.73·C (entries rounded to subnormals).
PRODUCT_DTYPES = (torch.float32, torch.float64)


def reclipped(update, values: torch.Tensor, bound: float):
    """``update`` clipped to ``bound`` by :func:`clip_l2` (a dense tensor or a :class:`RowSparse`).

    A row-sparse update's norm is that of its values (its rows are distinct), so clipping the
    values clips the update.
    """
    clipped = clip_l2(values, bound).vector
    if isinstance(update, RowSparse):
        return RowSparse(update.rows, clipped, update.length)
    return clipped


def user_pair(
    i: int,
    entry: object,
    name: str = "updates",
    form: str = "(user_id, update) pair or a RowSparseBatch",
) -> tuple[int, object]:
    """``(user, value)`` of ``name[i]``, or ``ValueError`` naming it and ``form``.

    A short API review of issue 15: a bare tensor ended in "too many values to unpack", and a
    user id of "u" was accepted (or raised from ``int()`` when its update was rejected). The
    thirty-seventh review: :meth:`~fedprivopt.privacy.adaptive_clip.NoisyCountAggregator.
    aggregate`'s reports alike (``name="reports"``).
    """
    if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
        raise ValueError(f"{name}[{i}] must be a {form}, got {type(entry).__name__}")
    return check_int(f"{name}[{i}] user_id", entry[0]), entry[1]


def whole_segment(values: torch.Tensor) -> torch.Tensor:
    """Row offsets of a single segment covering ``values``."""
    return torch.tensor([0, int(values.shape[0])], dtype=torch.int64)


@dataclass
class Tally:
    """Counts of one aggregation."""

    received: int = 0
    accepted: int = 0
    server_clipped: int = 0
    at_bound: int = 0
    norm_sum: float = 0.0
    rejected: dict[int, str] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)

    def arrive(self, users: list[int]) -> None:
        """Count ``users``' entries as received; ``ValueError`` for a user already received.

        Thirty-fifth review of issue 15: ``aggregate([(0, u), (0, u)], ...)`` summed both of
        user 0's updates (a sensitivity of 2C where the noise is sized for C), as did a user in
        two ``RowSparseBatch`` entries. The strategies key replies by user (and refuse a streamed
        cohort that yields a user twice); a caller of its own gets the error. Forty-second
        review (wire 4): the repeated user of one batch was found by ``users.count`` of each user,
        quadratic: 35 s before the error for a batch of 40,000 users repeating its last (about
        15 minutes at 200,000); now one pass.
        """
        again = self.seen.intersection(users)
        if again or len(set(users)) != len(users):
            times = collections.Counter(users)
            user = min(again) if again else next(u for u in users if times[u] > 1)
            raise ValueError(
                f"updates: user {user} appears twice (one update a user: the noise is sized for "
                "one clipped update of each)"
            )
        self.seen.update(users)
        self.received += len(users)
