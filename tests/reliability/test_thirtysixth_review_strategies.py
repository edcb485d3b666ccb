"""Issue 15, thirty-sixth hostile review (strategies: the server side): regression tests.

1. ``ServerAlgorithm.load_state_dict`` with ``ema-decay > 0`` (Python API). A state refused
   after its model was taken (its accountant invalid) rolled the algorithm back to round 0 but
   kept the refused state's moving average: ``output_params()``, the model a run evaluates and
   reports, was that other run's average before any round (``[-0.0056, 0.0131, 0.2394,
   0.2710]`` where the initial model is zeros), and the next round folded it into its average.
   A round-0 state loaded into an algorithm that had run rounds likewise kept that algorithm's
   average. A state without an average now clears it: the contract "all of it or nothing".
"""

from __future__ import annotations

import copy

import pytest
import torch

from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round


def _train(request):
    """Every user of a request sends the same small update (clipped already)."""
    return {u: torch.full((4,), 0.1 * (1 + u % 3)) for u in request.users}


def _config(**changes) -> StrategyConfig:
    values = {"strategy": "dp-fedavg", "population": 20, "clients-per-round": 5,
              "num-server-rounds": 8, "noise-multiplier": 1.0, "seed": 1, **changes}  # fmt: skip
    return StrategyConfig.from_mapping(values)


# -- finding 1: a state without a moving average clears the algorithm's ---------------------


@pytest.fixture(scope="module")
def ema_state():
    """The state of an ``ema-decay = 0.5`` algorithm after two rounds."""
    alg = build_algorithm(_config(**{"ema-decay": 0.5}), torch.zeros(4))
    for r in (1, 2):
        drive_round(alg, r, _train)
    assert not torch.equal(alg.output_params(), alg.params)  # an average of two iterates
    return alg.state_dict()


def test_1_a_refused_state_leaves_no_moving_average_behind(ema_state):
    fresh = build_algorithm(_config(**{"ema-decay": 0.5}), torch.zeros(4))
    refused = {**copy.deepcopy(ema_state), "accountant": {"x": 1}}
    with pytest.raises(ValueError, match="accountant"):
        fresh.load_state_dict(refused)
    assert fresh.round_num == 0 and fresh.averaged is None  # before: the refused state's
    assert torch.equal(fresh.output_params(), torch.zeros(4))
    reference = build_algorithm(_config(**{"ema-decay": 0.5}), torch.zeros(4))
    drive_round(fresh, 1, _train)
    drive_round(reference, 1, _train)
    assert torch.equal(fresh.output_params(), reference.output_params())


def test_1_a_round_0_state_clears_the_average_of_an_algorithm_that_ran(ema_state):
    used = build_algorithm(_config(**{"ema-decay": 0.5}), torch.zeros(4))
    used.load_state_dict(copy.deepcopy(ema_state))
    assert used.averaged is not None
    used.load_state_dict(build_algorithm(used.config, torch.zeros(4)).state_dict())
    assert used.round_num == 0 and used.averaged is None  # before: the round-2 average kept
    assert torch.equal(used.output_params(), torch.zeros(4))
