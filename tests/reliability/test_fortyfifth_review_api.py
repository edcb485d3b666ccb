"""Issue 15, forty-fifth hostile review (api: the documented Python API): tests.

1. A ``drive_round`` train callback (or ``aggregate``'s caller) returning a mapping of its own
   (a ``collections.abc.Mapping``) whose ``items()`` trains each user when it reaches it, into
   one workspace it reuses (a lazy view; the fast engine's cohort trainers reuse theirs so):
   the last user's update 1.0 in every entry, the others 0 (dp-fedavg and ADADP, population
   40, q 0.25, sigma 1e-6). Before: the aggregation read all pairs first, so every user's pair
   held the same tensor, the last user's update when they were summed: that user's clipped
   update was summed once for every user of the cohort (the model at 0.45 where that user
   alone moves it 0.05 over m 10), a sensitivity of 9C under a charge of C. Now
   ``strategies.aggregation._read_now`` copies the values of a mapping whose ``items()`` is not
   a plain ``dict``'s as they are read: the model of the honest callback.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch

from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
)

# -- finding 1: a mapping of one's own whose items() reuses one workspace ---------------------


class _Workspace(Mapping):
    """Trains a user when it is read, into one tensor it reuses: the last user moves by 1."""

    def __init__(self, users):
        self.users = list(users)
        self.work = torch.zeros(4)

    def __getitem__(self, user):
        self.work.fill_(1.0 if user == self.users[-1] else 0.0)
        return self.work

    def __iter__(self):
        return iter(self.users)

    def __len__(self):
        return len(self.users)


def _honest(request):
    last = request.users[-1]
    return {u: torch.full((4,), 1.0 if u == last else 0.0) for u in request.users}


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp"])
def test_1_a_mapping_reusing_its_workspace_sums_each_user_once(strategy):
    config = _config(strategy=strategy, **{"noise-multiplier": 1e-6})
    honest = drive_round(build_algorithm(config, torch.zeros(4)), 1, _honest)
    lazy = drive_round(
        build_algorithm(config, torch.zeros(4)), 1, lambda r: _Workspace(r.users)
    )
    assert torch.equal(lazy.params, honest.params)
    assert float(lazy.params.max()) < 0.1  # 0.45 before: the last user summed nine times


def test_1_aggregate_of_a_mapping_reusing_its_workspace():
    config = _config(**{"noise-multiplier": 1e-6})
    alg, other = build_algorithm(config, torch.zeros(4)), build_algorithm(config, torch.zeros(4))
    users = alg.sample(1)
    lazy = alg.aggregate(1, _Workspace(users), cohort=users)
    last = users[-1]
    plain = {u: torch.full((4,), 1.0 if u == last else 0.0) for u in users}
    honest = other.aggregate(1, plain, cohort=users)
    assert torch.equal(lazy.delta_tilde, honest.delta_tilde)
