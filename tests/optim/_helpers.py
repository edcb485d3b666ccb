"""Small helpers shared by the optim tests."""

import torch


def randn(n: int, gen: torch.Generator, *, std: float = 1.0, dtype=torch.float32) -> torch.Tensor:
    """Standard normal draws from an explicit generator, scaled by ``std``, cast to ``dtype``."""
    return (torch.randn(n, generator=gen, dtype=torch.float64) * std).to(dtype)


def run(transform, deltas, params=None, **update_kwargs):
    """Apply ``transform`` to a sequence of deltas; return (list of steps, final state)."""
    state = transform.init(deltas[0] if params is None else params)
    steps = []
    for delta in deltas:
        step, state = transform.update(delta, state, **update_kwargs)
        steps.append(step)
    return steps, state
