"""Non-private limits against Flower's own strategies on the same replies.

``fedavg`` (uniform weights) must equal Flower's ``FedAvg`` and ``fedadam`` (with Flower's
bias-correction convention, ``adam-flavor = "flower"``) Flower's ``FedAdam``, round after round,
with float32 kept on our side. Flower's strategies are called directly on hand-built replies that
carry each user's model ``w + Δ_u`` and ``num-examples = 1``.
"""

import logging

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, Metadata, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg

from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round

DIM = 40


@pytest.fixture(autouse=True)
def _quiet_flower():
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)


def _reply(model: np.ndarray, server_round: int, node: int) -> Message:
    metadata = Metadata(
        run_id=1,
        message_id="",
        src_node_id=node,
        dst_node_id=0,
        reply_to_message_id="instruction",
        group_id=str(server_round),
        created_at=0.0,
        ttl=3600.0,
        message_type="train",
    )
    content = RecordDict(
        {"arrays": ArrayRecord({"w": Array(model)}), "metrics": MetricRecord({"num-examples": 1})}
    )
    return Message(content, metadata=metadata)


def _delta(user: int, server_round: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(user * 7919 + server_round)
    return torch.randn(DIM, generator=g) * 0.05


@pytest.mark.parametrize(
    ("strategy", "flower", "extra"),
    [
        ("fedavg", lambda: FedAvg(), {}),
        (
            "fedadam",
            lambda: FedAdam(eta=0.05, beta_1=0.8, beta_2=0.95, tau=1e-3),
            {
                "adam_flavor": "flower",
                "server_learning_rate": 0.05,
                "beta1": 0.8,
                "beta2": 0.95,
                "tau": 1e-3,
            },
        ),
    ],
)
def test_non_private_baseline_equals_flower(strategy, flower, extra):
    cfg = StrategyConfig.from_mapping(
        dict(strategy=strategy, population=30, clients_per_round=6, seed=2, **extra)
    )
    w0 = torch.linspace(-1, 1, DIM)
    ours = build_algorithm(cfg, w0)
    reference = flower()
    current = w0.numpy().astype(np.float32)
    for server_round in range(1, 6):
        captured = {}

        def train(request, server_round=server_round, captured=captured):
            captured["users"] = request.users
            return {u: _delta(u, server_round) for u in request.users}

        result = drive_round(ours, server_round, train)
        users = captured["users"]
        assert len(users) > 0
        reference.current_arrays = {"w": current}  # what Flower's configure_train records
        replies = [
            _reply(current + _delta(u, server_round).numpy(), server_round, u) for u in users
        ]
        new, _ = reference.aggregate_train(server_round, replies)
        current = new["w"].numpy()
        assert result.params.dtype == torch.float32
        np.testing.assert_allclose(result.params.numpy(), current, rtol=1e-5, atol=1e-6)
        current = current.astype(np.float32)
