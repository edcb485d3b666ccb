"""A task implementing exactly the documented Task protocol and nothing else.

Referenced as ``tests.models.minimal_task:make_task`` (or ``:MinimalTask``) by the tests of tasks
by reference: no ``cohort_trainer``, ``primary_metric``, ``reference``, ``initialization``,
``user_size``, ``seed`` or any other attribute an engine could use if present.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class MinimalTask:
    """Two Gaussian blobs per user, shifted by the user id; a linear classifier."""

    name = "minimal"

    def __init__(self, *, num_users: int = 6, dim: int = 4, examples: int = 12, seed: int = 0):
        self.num_users = int(num_users)
        self._dim, self._examples, self._seed = int(dim), int(examples), int(seed)
        gen = torch.Generator().manual_seed(self._seed)
        self._w = torch.randn(self._dim, generator=gen)
        self._test = self._draw(gen, 200, shift=0.0)

    def _draw(self, gen: torch.Generator, n: int, shift: float):
        x = torch.randn(n, self._dim, generator=gen) + shift
        y = (x @ self._w > shift * self._w.sum()).long()
        return x, y

    def build_model(self) -> torch.nn.Module:
        gen = torch.Generator().manual_seed(self._seed + 1)
        model = torch.nn.Linear(self._dim, 2)
        with torch.no_grad():
            model.weight.copy_(torch.randn(2, self._dim, generator=gen) * 0.01)
            model.bias.zero_()
        return model

    def user_data(self, user_id: int):
        gen = torch.Generator().manual_seed(1000 * self._seed + int(user_id) + 7)
        return self._draw(gen, self._examples, shift=0.1 * int(user_id))

    def loss(self, model, x, y):
        return F.cross_entropy(model(x), y)

    def evaluate_data(self, model, x, y):
        device = next(model.parameters()).device
        with torch.no_grad():
            logits = model(x.to(device))
            y = y.to(device)
            return {
                "loss": float(F.cross_entropy(logits, y)),
                "accuracy": float((logits.argmax(1) == y).double().mean()),
            }

    def evaluate(self, model):
        return self.evaluate_data(model, *self._test)


def make_task(**params) -> MinimalTask:
    """The factory a preset names: ``task = "tests.models.minimal_task:make_task"``."""
    return MinimalTask(**params)


NOT_CALLABLE = 42


def not_a_task(**params) -> object:
    """A factory returning something that is not a Task."""
    return object()
