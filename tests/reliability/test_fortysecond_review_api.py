"""Issue 15, forty-second hostile review (api: the documented Python API): tests.

1. ``drive_round(alg, r, train)`` given a round that is no plain ``int``: a NumPy integer
   (``for r in np.arange(1, 4)``) or an ``int`` subclass whose comparisons lie (dp-fedavg and
   ADADP, seeded). Before: ``run_round`` kept it as the algorithm's round. With NumPy rounds
   ``state_dict()["round"]`` was ``np.int64(3)``, which the algorithm's own ``load_state_dict``
   refused (``checkpoint's round must be an integer >= 0, got np.int64(3)``) and JSON cannot
   write; with the subclass, ``drive_round(alg, 1, train)`` after it was not refused as
   released already: round 1 ran again with the same seeded noise, so the two released means
   differed by the left-out user's clipped update without noise (0.01 in every entry), charged
   as two independent releases (epsilon 10.28). A state whose round was such a subclass was
   kept alike. Now ``core.round_number`` makes the round a plain ``int`` (``run_round`` of
   every strategy, ``_finish``), and ``load_state_dict`` takes an integral round as an ``int``:
   the rerun is refused (``round 1 was released already``), the NumPy state loads.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
    _train,
)

# -- finding 1: a round that is no plain int -----------------------------------------------


class _LyingInt(int):
    """An int whose order comparisons all say no (so a round never reads as released)."""

    def __lt__(self, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__


@pytest.mark.parametrize("changes", [{}, {"strategy": "dp-fedavg-adadp"}])
def test_1_a_round_given_as_an_int_subclass_is_not_run_again(changes):
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    drive_round(alg, _LyingInt(1), _train)
    assert type(alg.round_num) is int
    events = alg.accountant.num_events
    fewer = lambda r: {u: torch.full((4,), 0.1) for u in r.users[1:]}  # noqa: E731
    with pytest.raises(ValueError, match=r"round 1 was released already"):
        drive_round(alg, 1, fewer)  # was run again: the same noise, the difference unnoised
    assert alg.accountant.num_events == events


def test_1_a_state_whose_round_is_an_int_subclass_cannot_rewind_the_algorithm():
    alg = build_algorithm(_config(), torch.zeros(4))
    drive_round(alg, 1, _train)
    first = alg.state_dict()
    for r in (2, 3):
        drive_round(alg, r, _train)
    state = {**first, "accountant": alg.state_dict()["accountant"], "round": _LyingInt(1)}
    with pytest.raises(ValueError, match=r"released rounds up to 3, the state is of round 1"):
        alg.load_state_dict(state)  # was taken: round 2 then ran again with its noise
    assert alg.round_num == 3


@pytest.mark.parametrize("changes", [{}, {"strategy": "dp-fedavg-adadp"}])
def test_1_an_algorithm_driven_with_numpy_rounds_loads_its_own_state(changes):
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    for r in np.arange(1, 3):
        drive_round(alg, r, _train)
    state = alg.state_dict()
    assert type(state["round"]) is int and json.dumps(state["round"]) == "2"
    other = build_algorithm(_config(**changes), torch.zeros(4))
    other.load_state_dict(state)  # was refused: "round must be an integer >= 0, got 2"
    assert other.round_num == 2 and other.epsilon() == alg.epsilon()
    legacy = {**state, "round": np.int64(2)}  # a state saved so before
    other = build_algorithm(_config(**changes), torch.zeros(4))
    other.load_state_dict(legacy)
    assert type(other.round_num) is int
