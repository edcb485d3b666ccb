"""The fast engine's vectorized, streamed and Ray-sharded client side give the same model."""

import json
from dataclasses import replace

import pytest
import torch

from fedprivopt.simulation.config import resolve_config
from fedprivopt.simulation.fast import StreamedUpdates
from fedprivopt.simulation.fast_trainer import UserTrainer
from fedprivopt.simulation.run import build_run, simulate


@pytest.fixture(scope="module")
def so_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("so-fast")


def so_config(so_dir, **extra):
    data = {
        "task": "stackoverflow-tp",
        "strategy": "dp-fedadam",
        "population": 30,
        "clients-per-round": 6,
        "num-server-rounds": 3,
        "noise-multiplier": 0.8,
        "clip-norm": 0.5,
        "delta": 1e-3,
        "seed": 4,
        "server-learning-rate": 0.05,
        "local-learning-rate": 5.0,
        "batch-size": 8,
        "max-examples": 24,
        "dp2-s1": 1,
        "dp2-s2": 1,
        "ray-cpus": 2,
        "task-params": {
            "data-dir": str(so_dir),
            "synth-clients": 60,
            "synth-vocab": 400,
            "synth-tags": 12,
            "synth-seed": 1,
            "vocab-size": 300,
            "num-tags": 10,
            "num-users": 30,
            "eval-users": 5,
        },
    }
    data.update(extra)
    return resolve_config(data)


@pytest.mark.parametrize("strategy", ["dp-fedadam", "adadps", "dp2", "dp-fedavg-adadp", "fedavg"])
def test_vectorized_and_sequential_fast_engines_agree(tmp_path, so_dir, strategy):
    vec = simulate(so_config(so_dir, strategy=strategy), tmp_path / "vec")
    seq = simulate(so_config(so_dir, strategy=strategy, vectorize=False), tmp_path / "seq")
    torch.testing.assert_close(vec.params, seq.params, rtol=0, atol=1e-5)
    assert vec.epsilon == seq.epsilon
    key = "accepted_1" if strategy == "dp-fedavg-adadp" else "accepted"
    accepted = [r[key] for r in vec.rows]
    assert accepted == [r[key] for r in seq.rows] and sum(accepted) > 0


def test_tag_prior_initial_bias_is_used_and_named_in_the_summary(tmp_path, so_dir):
    base = so_config(so_dir)
    prior = so_config(so_dir, **{"task-params": {**base.task_params, "init-bias": "tag-prior"}})
    task, alg = build_run(prior)
    k = task.num_tags
    assert torch.equal(alg.params[-k:], task.log_tag_prior())
    assert torch.all(build_run(base)[1].params[-k:] == 0)
    outcome = simulate(prior, tmp_path / "prior")
    summary = json.loads((outcome.out_dir / "summary.json").read_text())
    assert "bias the log tag prior of the published tag counts" in summary["initial_model"]


@pytest.mark.parametrize("strategy", ["dp-fedadam-bc", "dp-fedavg-adadp", "dp2"])
def test_a_frozen_bias_stays_at_the_prior_while_the_weights_learn(tmp_path, so_dir, strategy):
    """train-bias = false: no strategy moves the bias (its noise is dropped), the weights move."""
    base = so_config(so_dir, strategy=strategy)
    params = {**base.task_params, "init-bias": "tag-prior", "train-bias": False}
    config = so_config(so_dir, strategy=strategy, **{"task-params": params})
    task, alg = build_run(config)
    k = task.num_tags
    assert alg.frozen is not None and int(alg.frozen.sum()) == k and bool(alg.frozen[-k:].all())
    outcome = simulate(config, tmp_path / "frozen")
    assert torch.equal(outcome.params[-k:], task.log_tag_prior())
    assert not torch.equal(outcome.params[:-k], alg.params[:-k])
    trained = simulate(
        so_config(so_dir, strategy=strategy, **{"task-params": {**params, "train-bias": True}}),
        tmp_path / "trained",
    )
    assert not torch.equal(trained.params[-k:], task.log_tag_prior())
    summary = json.loads((outcome.out_dir / "summary.json").read_text())
    assert summary["initial_model"].endswith("(fixed: not trained, its noise dropped)")
    assert outcome.epsilon == trained.epsilon  # the release is the same; only its use differs


def test_vectorized_fast_engine_matches_the_flower_engine_with_a_frozen_bias(tmp_path, so_dir):
    """One Flower run (a Ray start costs seconds): the weights train, the bias is frozen."""
    params = {**so_config(so_dir).task_params, "init-bias": "tag-prior", "train-bias": False}
    fast = simulate(so_config(so_dir, **{"task-params": params}), tmp_path / "fast")
    flower = simulate(
        so_config(so_dir, engine="flower", **{"task-params": params}), tmp_path / "flower"
    )
    torch.testing.assert_close(flower.params, fast.params, rtol=0, atol=1e-5)
    assert torch.equal(flower.params[-10:], fast.params[-10:])
    assert not torch.equal(flower.params[:-10], build_run(so_config(so_dir))[1].params[:-10])
    assert flower.epsilon == fast.epsilon


def test_ray_actor_shards_give_the_in_process_model(tmp_path, so_dir):
    local = simulate(so_config(so_dir, **{"cohort-chunk": 2}), tmp_path / "local")
    sharded = simulate(
        so_config(so_dir, **{"cohort-chunk": 2, "fast-actors": 2}), tmp_path / "sharded"
    )
    torch.testing.assert_close(sharded.params, local.params, rtol=0, atol=0)
    assert sharded.epsilon == local.epsilon


def test_streamed_updates_are_sorted_lazy_and_read_once():
    produced = []

    def produce(users):
        for u in users:
            produced.append(u)
            yield u, torch.zeros(2)

    updates = StreamedUpdates([5, 1, 3], produce)
    assert len(updates) == 3 and list(updates) == [1, 3, 5] and produced == []
    assert [u for u, _ in updates.items()] == [1, 3, 5] == produced
    with pytest.raises(RuntimeError, match="once"):
        updates.items()


def test_distributed_noise_falls_back_to_sequential_training(so_dir):
    config = so_config(so_dir, **{"noise-mode": "distributed"})
    task, alg = build_run(config)
    trainer = UserTrainer(task, device="cpu", vectorize=True, chunk_users=4, secure=False)
    noisy = alg.client_settings()
    assert noisy.local.noise_std > 0 and trainer.mode(noisy) == "sequential"
    quiet = replace(noisy, local=replace(noisy.local, noise_std=0.0))
    assert trainer.mode(quiet) == "vectorized"
    off = UserTrainer(task, device="cpu", vectorize=False, chunk_users=4, secure=False)
    assert off.mode(quiet) == "sequential"
