"""Issue 15, forty-sixth hostile review (mechanisms: the mechanisms and epsilon): tests.

1. Tree aggregation through the documented Python API for a float16 model (the tree's twin of
   the fortieth review's mechanisms 2): ``NoisyMeanAggregator(clip_norm=1000,
   noise_multiplier=100, expected_cohort_size=1000).aggregate(..., dtype=torch.float16,
   sum_noise=TreeNoise(std=1e5, ...).release(1))`` (node std ``σC`` 1e5 on the sum, std 100 on
   the mean, which float16 holds). Before: ``TreeNoise(dtype=torch.float16)`` drew its nodes in
   float16, about half of each node ``±inf`` (float16 ends at 65504), and given float64 nodes
   (``dtype=torch.float64``) ``aggregate`` cast them to the model's float16 before adding them
   to its float64 sum: the released mean ``±inf`` in about half its entries either way, with a
   reported ``noise_std`` of 100. Now ``aggregate`` adds ``sum_noise`` in the sum's dtype
   (float64 here: a finite mean of std about 100), and ``TreeNoise.release`` refuses a ``std``
   beyond its dtype's largest number over 64 (the strategies' bound, which a strategy checks
   first and refuses naming its keys, as before), naming ``std`` and the dtype.
2. The vectorized cohort trainers' Python API against ``LocalTrainer``'s checks (forty-second
   review, api 7): ``task.cohort_trainer(device="CPU")`` (or ``" cpu"``) and a ``global_flat``
   or ``preconditioner`` on the meta device or sparse given to ``train_batches``. Before:
   torch's ``RuntimeError`` or ``NotImplementedError`` (a preconditioner that is no tensor:
   ``AttributeError``), and ``device="meta"`` built a trainer whose batches have no data. Now
   ``ValueError`` naming ``device`` (``core.devices.check_device``, as ``LocalTrainer``),
   ``global_flat`` or ``preconditioner`` (``models.cohort.CohortTrainer``).
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.privacy import RngFactory
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.tree import TreeNoise


def _tree(dtype: torch.dtype, std: float = 1e5, dim: int = 4000) -> TreeNoise:
    return TreeNoise(std=std, restart_rounds=4, rngs=RngFactory(seed=0), dim=dim, dtype=dtype)


def test_1_tree_noise_of_a_float16_model_is_finite():
    agg = NoisyMeanAggregator(clip_norm=1000.0, noise_multiplier=100.0, expected_cohort_size=1000)
    dim = 4000
    update = torch.zeros(dim, dtype=torch.float16)
    update[0] = 1000.0
    noise, nodes = _tree(torch.float64).release(1)
    result = agg.aggregate(
        [(0, update)], dim=dim, dtype=torch.float16, sum_noise=(noise, nodes * 1e10)
    )
    assert result.noise_std == pytest.approx(100.0)
    assert bool(torch.isfinite(result.delta_tilde).all())
    assert result.delta_tilde.dtype == torch.float16
    assert float(result.delta_tilde.double().std()) == pytest.approx(100.0, rel=0.1)
    # drawn in float16 itself, such nodes would overflow: refused, naming std and the dtype
    with pytest.raises(ValueError, match=r"std must be at most 1023.5 for torch.float16"):
        _tree(torch.float16).release(1)
    with pytest.raises(ValueError, match=r"std must be at most .* for torch.bfloat16"):
        _tree(torch.bfloat16, std=1e37).release(1)
    # within the bound: accepted as before (the strategies refuse beyond it already)
    small, _ = _tree(torch.float16, std=1000.0, dim=8).release(1)
    assert small.dtype == torch.float16 and bool(torch.isfinite(small).all())
    assert _tree(torch.float16, std=65504 / 64, dim=2).release(1)[1] == 1


def test_1_a_strategy_still_names_its_keys_for_tree_noise_beyond_the_dtype():
    from fedprivopt.strategies import StrategyConfig, build_algorithm

    config = StrategyConfig(
        strategy="dp-fedavg", population=40, clients_per_round=10, noise_multiplier=1e37,
        clip_norm=1.0, delta=1e-4, noise_mechanism="tree",
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"noise-multiplier \* clip-norm must be at most"):
        build_algorithm(config, torch.zeros(4))


def test_2_cohort_trainers_refuse_devices_and_tensors_without_data(tmp_path_factory):
    from fedprivopt.core.local import LocalConfig
    from fedprivopt.models import initial_flat
    from tests.tag_synth import make_synth_dir, tag_task

    task = tag_task(make_synth_dir(tmp_path_factory, "r46-mechanisms-tag"))
    for device in ("CPU", " cpu", "meta"):  # torch's RuntimeError, or a trainer without data
        with pytest.raises(ValueError, match="device"):
            task.cohort_trainer(device=device)
    trainer = task.cohort_trainer(device="cpu")
    w = initial_flat(task)
    config = LocalConfig(learning_rate=0.5, batch_size=8, clip_norm=0.05)

    def train(global_flat, preconditioner=None):
        return list(trainer.train_batches(
            global_flat, [0, 1], round_num=1, config=config, rngs=RngFactory(seed=0),
            preconditioner=preconditioner,
        ))  # fmt: skip

    # LocalTrainer refuses these naming the argument (forty-second review, api 7)
    for bad in (w.to("meta"), w.to_sparse()):
        with pytest.raises(ValueError, match="global_flat must be a dense tensor with values"):
            train(bad)
    for bad in (torch.ones_like(w).to("meta"), torch.ones_like(w).to_sparse(), [1.0]):
        with pytest.raises(ValueError, match="preconditioner must be"):
            train(w, bad)
    # an honest model and preconditioner train as before
    assert sum(len(b.users) for b in train(w)) == 2
    assert sum(len(b.users) for b in train(w, torch.ones_like(w))) == 2
