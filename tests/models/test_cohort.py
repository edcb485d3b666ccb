"""The base of the cohort trainers: settings, input checks and train() over train_batches()."""

from __future__ import annotations

import pytest
import torch

from fedprivopt.core.local import LocalConfig
from fedprivopt.models.cohort import CohortTrainer
from fedprivopt.privacy.rng import RngFactory


class _Batch:
    def __init__(self, users, model):
        self.users, self.model = users, model

    def split(self):
        return [(u, self.model + u) for u in self.users]


class _Doubling(CohortTrainer):
    """Chunks of users; each user's 'update' is the model plus its id."""

    length = 3

    def train_batches(self, global_flat, users, *, preconditioner=None, **_):
        model, _ = self.checked_inputs(global_flat, preconditioner)
        for start in range(0, len(users), self.chunk_users):
            yield _Batch(users[start : start + self.chunk_users], model)


def _train(trainer, flat, users, preconditioner=None):
    config = LocalConfig(learning_rate=0.1, epochs=1, batch_size=1, clip_norm=1.0)
    return list(
        trainer.train(
            flat, users, round_num=1, config=config, rngs=RngFactory(seed=0),
            preconditioner=preconditioner,
        )
    )  # fmt: skip


def test_train_yields_every_user_of_every_chunk_in_order():
    trainer = _Doubling(task=None, device="cpu", chunk_users=2)
    out = _train(trainer, torch.zeros(3), [4, 5, 6])
    assert [u for u, _ in out] == [4, 5, 6]
    assert torch.equal(out[2][1], torch.full((3,), 6.0))


@pytest.mark.parametrize(
    ("flat", "precond", "message"),
    [
        (torch.zeros(4), None, "flat vector of 3 entries, got shape \\(4,\\)"),
        (torch.zeros(1, 3), None, "flat vector of 3 entries, got shape \\(1, 3\\)"),
        (torch.zeros(3), torch.ones(4), "layout of global_flat"),
        (torch.zeros(3), torch.tensor([1.0, 0.0, 1.0]), "finite and > 0"),
        (torch.zeros(3), torch.tensor([1.0, float("nan"), 1.0]), "finite and > 0"),
    ],
)
def test_checked_inputs_refuses_a_wrong_model_or_preconditioner(flat, precond, message):
    with pytest.raises(ValueError, match=message):
        _train(_Doubling(task=None, device="cpu"), flat, [0], precond)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk_users": 0}, "chunk_users must be an integer >= 1"),
        ({"chunk_users": True}, "chunk_users must be an integer >= 1"),
        ({"cpu_threads": 0}, "cpu_threads must be an integer >= 1 or None"),
        ({"cpu_threads": False}, "cpu_threads must be an integer >= 1 or None"),
    ],
)
def test_settings_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _Doubling(task=None, **kwargs)


def test_step_threads_sets_and_restores_torch_threads_on_the_cpu():
    before = torch.get_num_threads()
    trainer = _Doubling(task=None, device="cpu", cpu_threads=1)
    with trainer._step_threads():
        inside = torch.get_num_threads()
    assert inside == 1 and torch.get_num_threads() == before
