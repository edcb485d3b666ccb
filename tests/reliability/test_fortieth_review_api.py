"""Issue 15, fortieth hostile review (api: the documented Python API): tests.

1. An algorithm that went on to round 2 after round 1 was refused (a ``drive_round`` train
   callback that changed ``request.params`` in place: nothing of round 1 released), then
   ``load_state_dict`` of a state that is refused after its accountant was read (another
   run's round-1 state whose accountant holds no event). Before: the rollback to the
   algorithm's own state ran every check again, and that state's round checks fail (1 update
   and 1 round's events at round 2), so the rollback raised half done: the refused state's
   accountant was kept, ``epsilon()`` 0.0 where 7.55 was spent, and the error named the
   optimizer's count (``count = 1 updates, its model is at round 2``) instead of what was
   refused. Now the rollback puts the algorithm's own state back without those checks
   (``AlgorithmState._load_state(verify=False)``): the error is the accountant's and epsilon
   stays 7.55.
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
    _train,
)


def _changes_request(request):
    """A train callback that trains on ``request.params`` in place (its round is refused)."""
    request.params.add_(1.0)
    return _train(request)


def _after_a_refused_round(**changes):
    """An algorithm whose round 1 was refused and whose round 2 was released."""
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    with pytest.raises(ValueError, match=r"round 1: the train callback"):
        drive_round(alg, 1, _changes_request)
    drive_round(alg, 2, _train)
    return alg


# -- finding 1: a refused load whose rollback could not complete ------------------------------


@pytest.mark.parametrize("changes", [{}, {"ema-decay": 0.5}, {"strategy": "dp-fedadam"}])
def test_1_a_refused_load_keeps_the_accountant_of_a_run_that_skipped_a_round(changes):
    alg = _after_a_refused_round(**changes)
    spent, params = alg.epsilon(), alg.params.clone()
    assert alg.accountant.num_events == 1 and spent > 7
    other = build_algorithm(_config(**changes), torch.zeros(4))
    drive_round(other, 1, _train)
    state = other.state_dict()
    fresh = build_algorithm(_config(**changes), torch.zeros(4))
    state["accountant"] = fresh.accountant.state_dict()
    with pytest.raises(ValueError, match=r"accountant records 0 privacy events"):
        alg.load_state_dict(state)  # the rollback raised 'count = 1 updates ...'
    assert alg.accountant.num_events == 1 and alg.epsilon() == spent  # was 0.0
    assert alg.round_num == 2 and torch.equal(alg.params, params)
    drive_round(alg, 3, _train)  # goes on from its own state
    assert alg.accountant.num_events == 2
