"""Issue 15, forty-fourth hostile review (mechanisms: clipping, noise and epsilon): tests.

1. ``adaptive-clipping = true`` (dp-fedavg, sigma 0.5, 10 of 40 users), ``drive_round(alg, 1,
   train)`` whose server optimizer step raised after the cohort's noised sum and noised clip
   count were computed (a transform of one's own, or any failure of the step or of the round's
   finish at the Python API), then ``drive_round(alg, 2, train)``. Before: round 1 was never
   charged (epsilon 0.0 after it; round 1 cannot run again, "begun already"), but its noised
   count stayed with the clip state and round 2's step of C averaged it in:
   ``clip_count_fraction`` 0.5406, the mean of round 1's (bits 0) and round 2's 1.0726, under
   the charge of one round (7.55). Now a count moves C only in its own round's step
   (``strategies.clipping.AdaptiveClipping.count`` drops the fractions of a round that never
   finished): round 2's fraction is its own, 1.0726, as in an honest run.
"""

from __future__ import annotations

import logging

import pytest
import torch

from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from fedprivopt.strategies.requests import ReportedUpdates


@pytest.fixture(autouse=True)
def quiet():
    logging.disable(logging.WARNING)  # absl's RDP warnings at q = 0.25
    yield
    logging.disable(logging.NOTSET)


def config(**changes) -> StrategyConfig:
    values = {"strategy": "dp-fedavg", "population": 40, "clients-per-round": 10,
              "num-server-rounds": 5, "noise-multiplier": 0.5, "delta": 1e-4, "seed": 0,
              "adaptive-clipping": True, **changes}  # fmt: skip
    return StrategyConfig.from_mapping(values)


def reported(bit: float):
    def train(request):
        updates = {u: torch.full((4,), 0.1) for u in request.users}
        return ReportedUpdates(updates, clip_bits={u: bit for u in request.users})

    return train


class FailsOnce:
    """A server transform whose first update raises (after the round's sum and count)."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, 0
        self.hparams = inner.hparams

    def init(self, *args, **kwargs):
        return self.inner.init(*args, **kwargs)

    def update(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("the optimizer step failed")
        return self.inner.update(*args, **kwargs)


@pytest.fixture(scope="module")
def honest():
    """An honest seeded run's rounds 1 and 2 (the same config)."""
    logging.disable(logging.WARNING)
    alg = build_algorithm(config(), torch.zeros(4))
    first = drive_round(alg, 1, reported(1.0)).metrics
    return first, drive_round(alg, 2, reported(1.0)).metrics


@pytest.mark.parametrize("secure", [False, True])
def test_1_a_round_that_never_finished_does_not_move_the_clip_norm(secure, honest):
    alg = build_algorithm(config(**({"secure": True} if secure else {})), torch.zeros(4))
    alg.transform = FailsOnce(alg.transform)
    with pytest.raises(RuntimeError, match="optimizer step failed"):
        drive_round(alg, 1, reported(0.0))  # every user of round 1 reports "clipped"
    assert alg.epsilon() == 0.0  # never charged
    metrics = drive_round(alg, 2, reported(1.0)).metrics
    assert metrics["epsilon"] == honest[0]["epsilon"]  # one round charged
    if not secure:  # the same seeded count noise as the honest run's round 2
        want = honest[1]["clip_count_fraction"]
        assert metrics["clip_count_fraction"] == want  # was 0.5406: round 1's count averaged in
    else:  # round 2's count alone: its bits are all 1, so its fraction is about 1 (noise 1/20)
        assert metrics["clip_count_fraction"] > 0.6  # was about 0.5 with round 1's bits 0
