import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    """An explicit, seeded generator (no global RNG in tests)."""
    return torch.Generator().manual_seed(20240611)
