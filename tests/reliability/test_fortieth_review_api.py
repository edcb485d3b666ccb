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
2. ``s0 = alg.state_dict()``, three rounds driven (dp-fedavg, sigma 0.5, q 0.25; also secure
   mode, ADADP and tree aggregation), then ``alg.load_state_dict(s0)`` into the same
   algorithm and the rounds driven again. Before: taken; ``epsilon()`` fell from 12.17 to 0.0,
   and after the three rounds again it said 12.17 where six noised sums were released (seeded,
   with other updates: the first releases' noise again, their difference without noise). Now
   a state whose accountant holds fewer of an event than the algorithm's is refused, the
   algorithm left as it was (``AlgorithmState._refuse_fewer_events``: ``this algorithm's
   accountant records 3 privacy events of its rounds, the state's (round 0) 0 ...``); a state
   of as many events or more (a resumed copy, a later round) is taken as before.
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


# -- finding 2: an older state loaded into the algorithm that released the rounds after it ---


@pytest.mark.parametrize(
    "changes",
    [{}, {"secure": True}, {"strategy": "dp-fedavg-adadp"}, {"noise-mechanism": "tree"}],
)
def test_2_an_older_state_cannot_lower_what_the_algorithm_spent(changes):
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    s0 = alg.state_dict()
    for r in (1, 2, 3):
        drive_round(alg, r, _train)
    s3, spent, events = alg.state_dict(), alg.epsilon(), alg.accountant.num_events
    with pytest.raises(ValueError, match=r"accountant records \d+ privacy events of its rounds"):
        alg.load_state_dict(s0)  # was taken: epsilon 0.0
    assert alg.round_num == 3 and alg.epsilon() == spent
    assert alg.accountant.num_events == events
    alg.load_state_dict(s3)  # as many events: taken
    drive_round(alg, 4, _train)
    later = alg.state_dict()
    fresh = build_algorithm(_config(**changes), torch.zeros(4))
    fresh.load_state_dict(s3)  # into a new algorithm: taken (a documented limit, DESIGN.md)
    fresh.load_state_dict(later)  # more events: taken
    assert fresh.round_num == 4
