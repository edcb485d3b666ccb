"""Issue 15, follow-up of the thirty-eighth hostile review (privacy: today's fixes): tests.

1. ``state = alg.state_dict()`` after round 1 of DP-FedAdam, then ``state["opt_state"]["mu"]
   *= 100`` (and ``"nu"``; Python's augmented assignment of a dict's tensor is in place), then
   round 2; also ``load_state_dict(state)`` followed by the same edit of ``state``, and a tree
   run's ``state["tree"]["noise"]["nodes"]``. Before: api 5 made the model and its average
   copies, but the optimizer's moments and the tree's live nodes were still the algorithm's own
   tensors (and ``load_state_dict`` kept the caller's): round 2 released 7.28 where 1.53. Now
   ``AlgorithmState.state_dict`` and ``load_state_dict`` copy them (``state._copied``).
2. A tree run (restart 4, sigma 1) whose round 1 is refused by api 1's check (the train callback
   did ``request.params.add_(1.0)``), then ``drive_round`` of round 1 again with a good
   callback, or of round 2. Before: the refusal came after the tree had released round 1's
   node noise, so round 1 could not run again ("round 1 was released already") and round 2 was
   released with ``epsilon()`` 0.0 (the period's charge belongs to its first round, which
   never finished). Now the tree is put back as it was (``AlgorithmAggregation.
   _undo_tree_release``, also when the aggregation itself fails): round 1 runs again, the same
   release as a run without the refusal and charged (8.07), and round 2 first is refused.
3. ``dp-fedavg-adadp`` (sigma 1, q 0.25) whose second cohort's request is changed in place by
   the train callback (api 1 refuses round 1 after cohort 2's sum), then round 2. Before: the
   half-step point (a function of cohort 1's noised sum) had reached cohort 2's trainer, but
   the accountant was charged a round's events only when the round finished: ``epsilon()`` 0.0
   after the refusal and 3.19 after round 2, the value of two cohorts where three were
   released. Now ``ServerAlgorithm.charge_partial`` charges cohort 1's event when its half step
   is sent (as the run's ledger records it): 2.53 and 3.66; a run without a refusal keeps its
   epsilon (``_finish`` and the budget check take ``uncharged_events``).
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_thirtyeighth_review_api import _config as _api_config
from tests.reliability.test_thirtyeighth_review_api import _quiet, _train  # noqa: F401


def _config(**changes) -> StrategyConfig:
    return _api_config(**{"strategy": "dp-fedadam", **changes})


def _scale_tensors(value) -> None:
    if isinstance(value, torch.Tensor):
        value.mul_(100)
    elif isinstance(value, dict):
        for v in value.values():
            _scale_tensors(v)
    elif isinstance(value, list | tuple):
        for v in value:
            _scale_tensors(v)


@pytest.mark.parametrize("after_load", [False, True])
@pytest.mark.parametrize("strategy", ["dp-fedadam"])
def test_1_editing_a_state_dict_leaves_the_optimizer_as_it_was(strategy, after_load):
    released = []
    for edit in (False, True):
        alg = build_algorithm(_config(strategy=strategy), torch.zeros(4))
        drive_round(alg, 1, _train)
        state = alg.state_dict()
        if after_load:
            alg = build_algorithm(_config(strategy=strategy), torch.zeros(4))
            alg.load_state_dict(state)
        if edit:
            _scale_tensors(state["opt_state"])
        released.append(drive_round(alg, 2, _train).params)
    assert torch.equal(released[0], released[1]), released


def test_1_editing_a_state_dict_leaves_the_tree_nodes_as_they_were():
    config = _config(strategy="dp-fedavg", **{"noise-mechanism": "tree", "tree-restart-rounds": 4})
    released = []
    for edit in (False, True):
        alg = build_algorithm(config, torch.zeros(4))
        drive_round(alg, 1, _train)
        state = alg.state_dict()
        if edit:
            _scale_tensors(state["tree"])
        released.append(drive_round(alg, 2, _train).params)
    assert torch.equal(released[0], released[1]), released


def _tree_algorithm():
    config = _config(
        strategy="dp-fedavg",
        **{"noise-mechanism": "tree", "tree-restart-rounds": 4, "noise-multiplier": 1.0},
    )
    return build_algorithm(config, torch.zeros(4))


def _changing(request):
    request.params.add_(1.0)
    return _train(request)


def test_2_a_refused_tree_round_runs_again_and_is_charged():
    clean = _tree_algorithm()
    expected = drive_round(clean, 1, _train).params
    alg = _tree_algorithm()
    with pytest.raises(ValueError, match=r"changed request\.params in place"):
        drive_round(alg, 1, _changing)
    assert torch.equal(drive_round(alg, 1, _train).params, expected)
    assert alg.epsilon() == pytest.approx(clean.epsilon()) and alg.epsilon() > 1.0


def test_2_the_round_after_a_refused_tree_round_is_not_released_uncharged():
    alg = _tree_algorithm()
    with pytest.raises(ValueError, match=r"changed request\.params in place"):
        drive_round(alg, 1, _changing)
    try:
        drive_round(alg, 2, _train)
    except ValueError:
        return  # refused: nothing released
    assert alg.epsilon() > 1.0  # released: charged


def _adadp():
    return build_algorithm(
        _config(strategy="dp-fedavg-adadp", **{"noise-multiplier": 1.0}), torch.zeros(4)
    )


def _changing_second(request):
    if request.stream == "train-2":
        request.params.add_(1.0)
    return _train(request)


def test_3_adadps_half_step_is_charged_when_it_is_sent():
    clean = _adadp()
    drive_round(clean, 1, _train)
    one_round = clean.epsilon()
    assert clean.accountant.ledger[0][1] == 2
    alg = _adadp()
    with pytest.raises(ValueError, match=r"\(train-2\)"):
        drive_round(alg, 1, _changing_second)
    assert alg.accountant.ledger[0][1] == 1 and 0.0 < alg.epsilon() < one_round
    drive_round(alg, 2, _train)
    assert alg.accountant.ledger[0][1] == 3 and alg.epsilon() > one_round
