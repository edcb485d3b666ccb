"""Handwritten digits as a federated task: one file, in the style of Flower's ``task.py``.

scikit-learn ships 1,797 8x8 images of handwritten digits inside the package
(:func:`sklearn.datasets.load_digits`, no download). This file splits them over users non-IID (a
Dirichlet distribution over labels, with a seed), defines a small torch model, and wraps both in a
class with the seven members of the ``Task`` protocol (``fedprivopt/models/task.py``), nothing else.
A preset names it by reference, ``task = "digits_task:make_task"``, and the ``[task-params]``
table becomes the keywords of :func:`make_task`; fedprivopt does the federated, private rest.

Everything is deterministic from the seed (the split, the held-out set, the initial model), and the
global random state is never read: every process (a Ray worker, a SuperNode) rebuilds the same
users.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

NUM_CLASSES = 10
NUM_FEATURES = 64  # 8 x 8 pixels, values 0..16


class Net(nn.Module):
    """A small multilayer perceptron: 64 pixels -> hidden (ReLU) -> 10 classes."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(NUM_FEATURES, hidden)
        self.fc2 = nn.Linear(hidden, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch of flattened images."""
        return self.fc2(F.relu(self.fc1(x)))


@functools.lru_cache(maxsize=1)
def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 images as float32 features in [0, 1] and int64 labels (cached per process)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.data / 16.0).astype(np.float32), data.target.astype(np.int64)


def dirichlet_split(
    labels: np.ndarray, num_users: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Split example indices over users: each class's examples in Dirichlet(alpha) proportions.

    Small ``alpha`` gives each user few classes (non-IID); large ``alpha`` approaches IID.
    Users may receive no example.
    """
    parts: list[list[int]] = [[] for _ in range(num_users)]
    for c in range(NUM_CLASSES):
        idx = np.flatnonzero(labels == c)
        idx = idx[rng.permutation(len(idx))]
        shares = rng.dirichlet(np.full(num_users, alpha))
        cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
        for user, chunk in enumerate(np.split(idx, cuts)):
            parts[user].extend(chunk.tolist())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


class DigitsTask:
    """Federated handwritten-digit classification (a fedprivopt Task).

    Parameters
    ----------
    num_users : int
        Training users, ``>= 1``.
    alpha : float
        Dirichlet concentration of the label split, ``> 0`` (0.5: most users hold a few digits).
    test_fraction : float
        Share of the images held out for evaluation (stratified), in ``(0, 1)``.
    hidden : int
        Width of the hidden layer, ``>= 1``.
    seed : int
        Seed of the split, the held-out set and the initial model, ``>= 0``.
    """

    name = "digits"

    def __init__(
        self,
        *,
        num_users: int = 50,
        alpha: float = 0.5,
        test_fraction: float = 0.2,
        hidden: int = 32,
        seed: int = 0,
    ) -> None:
        if int(num_users) < 1:
            raise ValueError(f"num_users must be an integer >= 1, got {num_users!r}")
        if not float(alpha) > 0:
            raise ValueError(f"alpha must be > 0, got {alpha!r}")
        if not 0 < float(test_fraction) < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
        if int(hidden) < 1 or int(seed) < 0:
            raise ValueError(f"hidden must be >= 1 and seed >= 0, got {hidden!r}, {seed!r}")
        self.num_users, self._hidden, self._seed = int(num_users), int(hidden), int(seed)
        x, y = load_digits_arrays()
        rng = np.random.default_rng(self._seed)
        test = np.concatenate(  # stratified: the same share of every digit
            [
                (idx := np.flatnonzero(y == c))[rng.permutation(len(idx))][
                    : round(test_fraction * len(idx))
                ]
                for c in range(NUM_CLASSES)
            ]
        )
        train = np.setdiff1d(np.arange(len(y)), test)
        self._x, self._y = torch.from_numpy(x), torch.from_numpy(y)
        self._test = np.sort(test)
        self._users = [train[p] for p in dirichlet_split(y[train], self.num_users, alpha, rng)]

    def build_model(self) -> nn.Module:
        """The initial :class:`Net`, initialized like torch's default from the task's seed."""
        # torch's default initialization draws from the global generator: it runs on a fork
        # of it (the global state is restored after), then every weight is drawn again below
        with torch.random.fork_rng(devices=[]):
            net = Net(self._hidden)
        gen = torch.Generator().manual_seed(self._seed)
        with torch.no_grad():
            for layer in (net.fc1, net.fc2):
                bound = 1.0 / math.sqrt(layer.in_features)
                layer.weight.uniform_(-bound, bound, generator=gen)
                layer.bias.uniform_(-bound, bound, generator=gen)
        return net

    def user_data(self, user_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of one user's images: float32 ``(n, 64)`` and int64 ``(n,)``."""
        idx = torch.from_numpy(self._users[int(user_id)])
        return self._x[idx], self._y[idx]

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy."""
        return F.cross_entropy(model(x), y)

    def evaluate_data(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
        """Mean ``loss`` and ``accuracy`` on ``(x, y)`` (NaN for no examples)."""
        if len(y) == 0:
            return {"loss": float("nan"), "accuracy": float("nan")}
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        with torch.no_grad():
            logits = model(x.to(device))
            y = y.to(device)
            out = {
                "loss": float(F.cross_entropy(logits, y)),
                "accuracy": float((logits.argmax(1) == y).double().mean()),
            }
        model.train(was_training)
        return out

    def evaluate(self, model: nn.Module) -> dict:
        """Loss and accuracy on the held-out images."""
        idx = torch.from_numpy(self._test)
        return self.evaluate_data(model, self._x[idx], self._y[idx])


def make_task(**params) -> DigitsTask:
    """The factory a preset names: ``task = "digits_task:make_task"``."""
    return DigitsTask(**params)
