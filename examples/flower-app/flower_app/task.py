"""The user's own model, data and training loop: plain PyTorch, nothing from Flower or fedprivopt.

A small classifier on synthetic data, so the app runs anywhere without a download: every class
``c`` has a mean ``μ_c`` in ``R^20``, an example of class ``c`` is ``μ_c + N(0, I)``, and user
``u`` holds 40 examples drawn mostly from two classes of its own (non-IID). Everything is keyed by
``(seed, user)``, so every process (the ServerApp, each simulated SuperNode) rebuilds the same
data, and the global random state is never read.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

NUM_FEATURES = 20
NUM_CLASSES = 4


class Net(nn.Module):
    """A multilayer perceptron: 20 features -> 32 hidden (ReLU) -> 4 classes."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(NUM_FEATURES, hidden)
        self.fc2 = nn.Linear(hidden, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch of feature vectors."""
        return self.fc2(F.relu(self.fc1(x)))


def _generator(seed: int, *keys: int) -> torch.Generator:
    value = int(seed)
    for key in keys:
        value = (value * 1_000_003 + int(key) + 1) % (2**63 - 1)
    return torch.Generator().manual_seed(value)


def build_model(seed: int) -> Net:
    """The initial model, its weights drawn from a generator seeded by ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed) % 2**63)  # any seed the strategy takes (>= 0)
        return Net()


def _class_means(seed: int) -> torch.Tensor:
    return 0.6 * torch.randn(NUM_CLASSES, NUM_FEATURES, generator=_generator(seed, -1))


def _draw(labels: torch.Tensor, seed: int, g: torch.Generator) -> torch.Tensor:
    return _class_means(seed)[labels] + torch.randn(len(labels), NUM_FEATURES, generator=g)


def load_user(user: int, *, seed: int, examples: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    """User ``user``'s examples: 80% from its two classes ``user % 4`` and ``(user + 1) % 4``."""
    g = _generator(seed, user)
    own = torch.tensor([user % NUM_CLASSES, (user + 1) % NUM_CLASSES])
    mixed = torch.rand(examples, generator=g) < 0.2
    labels = torch.where(
        mixed,
        torch.randint(NUM_CLASSES, (examples,), generator=g),
        own[torch.randint(2, (examples,), generator=g)],
    )
    return _draw(labels, seed, g), labels


def load_test(*, seed: int, examples: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    """A held-out test set with balanced classes, for the server's central evaluation."""
    g = _generator(seed, -2)
    labels = torch.randint(NUM_CLASSES, (examples,), generator=g)
    return _draw(labels, seed, g), labels


def train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    learning_rate: float,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
) -> float:
    """Plain minibatch SGD on cross-entropy; returns the mean loss of the first epoch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    model.train()
    first = 0.0
    for epoch in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), batch_size):
            batch = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            if epoch == 0:
                first += float(loss.detach()) * len(batch)
    return first / max(len(y), 1)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Loss and accuracy of ``model`` on ``(x, y)``."""
    model.eval()
    logits = model(x)
    return {
        "loss": float(F.cross_entropy(logits, y)),
        "accuracy": float((logits.argmax(dim=1) == y).float().mean()),
    }
