"""Forty-third review of issue 15, the docs reviewer's finding that needed code.

1. ``DPStrategy.start`` (the Flower strategy of ``simulate --engine flower``, of the deployment
   ServerApp and of a Flower app of one's own, such as ``examples/flower-app``) logs
   ``round N: epsilon=E cohort=M`` after every round. Case: ``flwr run examples/flower-app``
   (σ 0.7, q 0.2, δ 1e-3), round 3, ε 4.756095. Before: ``epsilon=4.756`` (``%.4g``, rounded to
   nearest, below what was spent; README promises every shown ε rounded up, and the app's own
   line shows 4.7561). After: ``epsilon=4.757`` (``core.text.epsilon_text``). Measured here on
   an in-process grid whose node hosts the users and never replies (rounds of noise only,
   charged as sampled), no Flower or Ray started.
"""

from __future__ import annotations

import logging
import uuid

import torch
from flwr.app import ConfigRecord, Message, RecordDict

from fedprivopt import wire as P
from fedprivopt.privacy.flat import flatten
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy
from fedprivopt.strategies.flower_arrays import flat_to_arrays
from tests.messages import reply_metadata

POPULATION = 100


class _SilentGrid:
    """One node (100) hosting every user; it answers the user query and no train message."""

    def get_node_ids(self):
        return [100]

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            if msg.metadata.message_type == "query":
                users = ConfigRecord({P.USER_IDS: list(range(POPULATION))})
                content = RecordDict({P.USERS_RECORD: users})
                replies.append(Message(content, metadata=reply_metadata(msg, 100)))
        return replies


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_1_the_strategys_round_line_shows_epsilon_rounded_up(server_side):
    config = StrategyConfig(
        strategy="dp-fedavg", population=POPULATION, clients_per_round=20, num_server_rounds=3,
        noise_multiplier=0.7, clip_norm=1.0, delta=1e-3, seed=0,
    )  # fmt: skip
    flat, spec = flatten({"w": torch.zeros(4)})
    strategy = DPStrategy(build_algorithm(config, flat), spec, node_wait=0.0)
    logger = logging.getLogger("flwr")
    handler, level = _Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        strategy.start(_SilentGrid(), flat_to_arrays(flat, spec), num_rounds=3, timeout=1)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    rounds = [line for line in handler.lines if line.startswith("round ")]
    assert rounds[0].startswith("round 1: epsilon=3.265 ")  # 3.264939, as before
    assert rounds[2].startswith("round 3: epsilon=4.757 ")  # 4.756095: was 4.756
