"""The fast engine's per-user client side, for tests that compare it with Flower's ClientApp."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedprivopt.clients.trainer import LocalTrainer
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.strategies.core import TrainRequest


def fast_train(trainer: LocalTrainer, secure: bool) -> Callable[[TrainRequest], dict]:
    """The fast engine's client side: train every requested user in process."""

    def train(request: TrainRequest) -> dict[int, torch.Tensor]:
        settings = request.settings
        rngs = RngFactory(seed=None, secure=True) if secure else RngFactory(seed=settings.seed)
        return {
            u: trainer.train(
                request.params,
                user_id=u,
                round_num=request.round_num,
                config=settings.local,
                rngs=rngs,
                preconditioner=request.preconditioner,
                stream=request.stream,
            ).delta
            for u in request.users
        }

    return train
