"""Issue 15, thirty-seventh hostile review (core: the privacy contract end to end): tests.

1. ``drive_round(alg, r, train)`` (Python API) of a configuration with ``target-epsilon = 8``
   (``toy.toml``'s σ 0.5, 10 of 40 users a round, δ 1e-4; one round spends ε 7.55): rounds 2
   and 3 were released, ε 10.28 and 12.17, while ``budget_allows_next_round()`` said false
   before each. Only the engines checked the budget; the algorithm that holds the target
   released whatever it was driven to (``dp-fedavg-adadp`` both cohorts of its round, the
   Flower strategy's ``configure_train`` / ``aggregate_train`` alike). ``aggregate`` now
   refuses a round whose events would push ε above ``target-epsilon`` before any noise is
   drawn (``ValueError``: ``round 2 would spend epsilon 10.2798, above target-epsilon 8
   (7.55085 spent through round 1): stop when budget_allows_next_round() is false``);
   nothing is released or charged. The engines stop before such a round as they did.
2. ``dp-fedavg-adadp`` through ``drive_round`` (or ``DPStrategy.start`` again after a grid
   error) whose second cohort's training failed (``ConnectionError``) after the half-step
   point ``w + η/2·Δ̃₁`` had been sent to it, then the round run again: the retry drew the
   same seeded noise for cohort 1's sum, and with one user of cohort 1 missing the second time
   the two half-step points differed by 0.0025 in every entry, ``η/2 · 0.05 / m̄``: that user's
   clipped update without noise, under one charge (in secure mode a second release of the sum
   with fresh noise, also uncharged). ``aggregate`` now refuses a ``(round, stream)`` whose
   noised sum an unfinished attempt computed (``round 1 was begun already: its noised sum of
   stream 'train' was computed by an earlier attempt that did not finish ...``); a round whose
   training failed before anything was aggregated still runs again.
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round


def _train(request):
    """Every user of a request sends the same small update."""
    return {u: torch.full((4,), 0.1 * (1 + u % 3)) for u in request.users}


def _config(**changes) -> StrategyConfig:
    values = {"strategy": "dp-fedavg", "population": 40, "clients-per-round": 10,
              "num-server-rounds": 5, "noise-multiplier": 0.5, "delta": 1e-4, "seed": 0,
              **changes}  # fmt: skip
    return StrategyConfig.from_mapping(values)


# -- finding 1: the algorithm refuses a round beyond its target epsilon -----------------------


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp", "dp2"])
def test_1_drive_round_refuses_a_round_beyond_target_epsilon(strategy):
    # one round of dp-fedavg spends 7.55 (ADADP's two events 10.28): a target just above it
    target = 8.0 if strategy != "dp-fedavg-adadp" else 11.0
    alg = build_algorithm(_config(strategy=strategy, **{"target-epsilon": target}), torch.zeros(4))
    drive_round(alg, 1, _train)
    spent, params = alg.epsilon(), alg.params.clone()
    assert spent <= target and not alg.budget_allows_next_round()
    with pytest.raises(ValueError, match=r"round 2 would spend epsilon .* above target-epsilon"):
        drive_round(alg, 2, _train)  # released round 2 at epsilon 10.28 (13.7 for ADADP)
    assert alg.epsilon() == spent and alg.round_num == 1
    assert torch.equal(alg.params, params)
    assert alg.accountant.num_events == (2 if strategy == "dp-fedavg-adadp" else 1)


# -- finding 2: a round begun and not finished is not run again -------------------------------


def _failing_second_cohort(points, fail):
    """Train every user; the second cohort's request records its point and fails when asked."""

    def train(request):
        if request.stream == "train-2":
            points.append(request.params.clone())
            if fail:
                raise ConnectionError("cohort 2 lost")
        return _train(request)

    return train


@pytest.mark.parametrize("secure", [False, True])
def test_2_an_adadp_round_whose_second_cohort_failed_is_not_run_again(secure):
    alg = build_algorithm(_config(strategy="dp-fedavg-adadp", secure=secure), torch.zeros(4))
    points = []
    with pytest.raises(ConnectionError):
        drive_round(alg, 1, _failing_second_cohort(points, fail=True))
    assert len(points) == 1  # the half-step point, carrying cohort 1's noised sum, left
    with pytest.raises(ValueError, match=r"round 1 was begun already: its noised sum of stream"):
        drive_round(alg, 1, _failing_second_cohort(points, fail=False))
    # the half-step point that left is charged (thirty-eighth review follow-up, privacy 3)
    assert len(points) == 1 and alg.round_num == 0 and alg.accountant.num_events == 1
    if secure:  # its drawn second cohort is released first (forty-fourth follow-up, privacy 3)
        alg.aggregate(1, {}, stream="train-2", cohort=alg.sample(1, "sampling-2"))
    # the next round still runs (its noise is keyed by its own round)
    drive_round(alg, 2, _failing_second_cohort(points, fail=False))
    assert alg.round_num == 2 and alg.accountant.num_events == (4 if secure else 3)


def test_2_a_round_whose_training_failed_before_aggregation_runs_again():
    alg = build_algorithm(_config(), torch.zeros(4))
    calls = []

    def train(request):
        calls.append(request.round_num)
        if len(calls) == 1:
            raise ConnectionError("cohort lost")
        return _train(request)

    with pytest.raises(ConnectionError):
        drive_round(alg, 1, train)
    assert drive_round(alg, 1, train).round_num == 1 and alg.accountant.num_events == 1
