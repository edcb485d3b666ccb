"""Our ``flower_fedadam`` against Flower's own ``FedAdam.aggregate_train`` (flwr 1.41).

Flower's strategy is exercised directly, without a Grid: ``current_arrays`` is what its
``configure_train`` would record, and the replies are hand-built Messages carrying explicit
metadata (a reply built with ``reply_to`` needs a running Flower task). Each reply holds the
client's model ``current + delta`` and ``num-examples = 1``, so Flower's weighted mean is exactly
that model and its ``delta_t = aggregate - current``.
"""

import logging

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, Metadata, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam

from fedprivopt.optim import adam, flower_fedadam

from ._helpers import randn

ROUNDS = 6
SIZE = 64


@pytest.fixture(autouse=True)
def _quiet_flower():
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)


def _reply(arrays: np.ndarray, server_round: int) -> Message:
    metadata = Metadata(
        run_id=1,
        message_id="",
        src_node_id=7,
        dst_node_id=0,
        reply_to_message_id="instruction",
        group_id=str(server_round),
        created_at=0.0,
        ttl=3600.0,
        message_type="train",
    )
    content = RecordDict(
        {"arrays": ArrayRecord({"w": Array(arrays)}), "metrics": MetricRecord({"num-examples": 1})}
    )
    return Message(content, metadata=metadata)


def _flower_trajectory(w0: np.ndarray, deltas: list[np.ndarray], **hparams) -> list[np.ndarray]:
    strategy = FedAdam(**hparams)
    current = w0
    out = []
    for server_round, delta in enumerate(deltas, start=1):
        strategy.current_arrays = {"w": current}  # what configure_train records
        new, _ = strategy.aggregate_train(server_round, [_reply(current + delta, server_round)])
        current = new["w"].numpy()
        out.append(current)
    return out


def _our_trajectory(tx, w0: torch.Tensor, deltas: list[torch.Tensor]) -> list[torch.Tensor]:
    state = tx.init(w0)
    w = w0
    out = []
    for delta in deltas:
        step, state = tx.update(delta, state, w)
        w = w + step
        out.append(w)
    return out


HPARAMS = [
    {"eta": 0.1, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3},
    {"eta": 0.03, "beta_1": 0.5, "beta_2": 0.9, "tau": 1e-2},
]


@pytest.mark.parametrize("hparams", HPARAMS)
def test_flower_fedadam_equals_flower(hparams, gen):
    w0 = randn(SIZE, gen)
    deltas = [randn(SIZE, gen, std=0.05) for _ in range(ROUNDS)]
    # Flower sees float32 replies (current + delta); its later rounds run in float64 because
    # its output is float64. Feed it the float32 deltas we feed our transform.
    theirs = _flower_trajectory(w0.numpy(), [d.numpy() for d in deltas], **hparams)
    ours = _our_trajectory(flower_fedadam(**hparams), w0, deltas)
    for r, (a, b) in enumerate(zip(ours, theirs, strict=True), start=1):
        assert a.dtype == torch.float32, "our transform keeps float32"
        assert b.dtype == np.float64, "Flower returns float64 for a float32 model"
        np.testing.assert_allclose(a.numpy(), b, rtol=2e-5, atol=2e-6, err_msg=f"round {r}")


@pytest.mark.parametrize(
    "variant",
    [
        {},  # textbook Adam: tau on the corrected sqrt(v_hat), t from 1
        {"tau_placement": "raw"},  # Flower's tau placement but t from 1
        {"count_offset": 1},  # Flower's t but tau on the corrected sqrt(v_hat)
    ],
)
def test_each_flower_convention_matters(variant, gen):
    """The comparison above is sensitive: changing either convention breaks it by far more."""
    w0 = randn(SIZE, gen)
    deltas = [randn(SIZE, gen, std=0.05) for _ in range(ROUNDS)]
    theirs = _flower_trajectory(w0.numpy(), [d.numpy() for d in deltas], **HPARAMS[0])
    tx = adam(learning_rate=0.1, beta1=0.9, beta2=0.99, tau=1e-3, **variant)
    ours = _our_trajectory(tx, w0, deltas)
    assert np.abs(ours[0].numpy() - theirs[0]).max() > 1e-3
