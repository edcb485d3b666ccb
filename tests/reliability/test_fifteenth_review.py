"""Issue 15, fifteenth hostile review: variants of the ten case classes not tried before.

Finding 1 (an ε smaller than what was spent, API): ``composed_tuning_epsilon(…, count=2.5)``
charged 2.5 tunings as 2 (``int()``: ε 19.50 instead of at least that of 3 runs' worth), took
``True`` and ``"3"`` as counts, and a NaN count ended in ``cannot convert float NaN to integer``
naming no parameter. Now a ``ValueError`` naming ``count``.

Finding 2 (an RDP smaller than what was spent, API): ``ledger_rdp(ledger, (0.5,))`` returned an
RDP curve of ``-inf``; orders of NaN, inf, 1 or below were silently turned into ``inf``. Now
``event_rdp`` (and so ``ledger_rdp``, ``finite_orders``, ``tuning_epsilon``) refuses orders that
are not finite numbers > 1, naming ``orders``.
"""

from __future__ import annotations

import math

import pytest

from fedprivopt.privacy.accounting import SubsampledGaussianEvent, event_rdp
from fedprivopt.privacy.tuning import (
    TrialCount,
    composed_tuning_epsilon,
    finite_orders,
    ledger_rdp,
    tuning_epsilon,
)

EVENT = SubsampledGaussianEvent(1.0, "poisson", 0.1)
LEDGER = [(EVENT, 10)]
TRIALS = TrialCount("poisson", 5)


@pytest.mark.parametrize("count", [2.5, True, "3", math.nan, 0, -1, None])
def test_composed_tuning_epsilon_refuses_a_count_that_is_not_a_positive_integer(count):
    with pytest.raises(ValueError, match=r"count must be an integer >= 1"):
        composed_tuning_epsilon(LEDGER, 1e-5, TRIALS, count)


def test_composed_tuning_epsilon_still_composes_integer_counts():
    one = composed_tuning_epsilon(LEDGER, 1e-5, TRIALS, 1)
    assert one == pytest.approx(tuning_epsilon(LEDGER, 1e-5, TRIALS))
    assert (
        composed_tuning_epsilon(LEDGER, 1e-5, TRIALS, 3)
        > composed_tuning_epsilon(LEDGER, 1e-5, TRIALS, 2)
        > one
    )


@pytest.mark.parametrize("orders", [(0.5,), (1.0,), (-3.0,), (math.nan,), (math.inf,), (2.0, 0.9)])
def test_rdp_orders_must_be_finite_and_above_one(orders):
    for call in (
        lambda: ledger_rdp(LEDGER, orders),
        lambda: event_rdp(EVENT, orders),
        lambda: finite_orders([LEDGER], orders),
        lambda: tuning_epsilon(LEDGER, 1e-5, TRIALS, orders),
    ):
        with pytest.raises(ValueError, match=r"orders must be finite numbers > 1"):
            call()


@pytest.mark.parametrize("orders", [(2, "x"), (True, 2.0)])
def test_rdp_orders_must_be_numbers(orders):
    with pytest.raises(ValueError, match=r"orders must be real numbers > 1"):
        ledger_rdp(LEDGER, orders)


def test_valid_orders_still_give_the_same_curve():
    curve = ledger_rdp(LEDGER, (2.0, 8.0, 32.0))
    assert (curve > 0).all() and math.isfinite(curve.sum())
    assert tuning_epsilon(LEDGER, 1e-5, TRIALS, (2.0, 8.0, 32.0)) >= tuning_epsilon(
        LEDGER, 1e-5, TRIALS
    )
