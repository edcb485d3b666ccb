"""The vectorized next-word cohort trainer computes LocalTrainer's updates."""

import math

import pytest
import torch

from fedprivopt.clients import LocalConfig, LocalTrainer
from fedprivopt.models import build_task, initial_flat
from fedprivopt.models.next_word_cohort import DenseUpdates, NextWordCohortTrainer, model_flops
from fedprivopt.privacy import RngFactory
from fedprivopt.simulation.config import resolve_config
from fedprivopt.simulation.fast_trainer import UserTrainer
from fedprivopt.simulation.run import build_run, simulate

SYNTH = dict(synth_clients=300, synth_vocab=600, synth_tags=20, synth_seed=3)
TINY = dict(vocab_size=500, embedding_dim=16, hidden_size=32)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("nwp-cohort")
    return build_task(
        "stackoverflow-nwp", data_dir=str(root), num_users=60, eval_users=5, **TINY, **SYNTH
    )


def _reference(task, w, users, cfg, rngs, precond=None, stream="train"):
    trainer = LocalTrainer(task, device="cpu")
    return {
        u: trainer.train(
            w, user_id=u, round_num=3, config=cfg, rngs=rngs, preconditioner=precond, stream=stream
        )
        for u in users
    }


CONFIGS = [
    LocalConfig(learning_rate=1.0, epochs=1, batch_size=4, clip_norm=0.5),
    LocalConfig(learning_rate=0.5, epochs=2, batch_size=3, max_examples=7, clip_norm=10.0),
    LocalConfig(learning_rate=0.3, epochs=1, batch_size=64, clip_norm=None),
    LocalConfig(learning_rate=0.5, epochs=1, batch_size=5, clip_norm=0.2, noise_std=0.01),
]


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked", "user-by-user"])
@pytest.mark.parametrize("preconditioned", [False, True])
@pytest.mark.parametrize("cfg", CONFIGS, ids=["clip-small", "epochs-cap", "no-clip", "noise"])
def test_cohort_updates_equal_local_trainer(task, preconditioned, cfg, stacked):
    """Stacked (the GPU's path, run here on the CPU) and user by user on 2 worker threads."""
    w = initial_flat(task)
    gen = torch.Generator().manual_seed(1)
    precond = torch.rand(w.shape, generator=gen) + 0.5 if preconditioned else None
    rngs = RngFactory(seed=11)
    users = list(range(0, 60, 5))
    sizes = {task.user_size(u) for u in users}
    assert len(sizes) > 3  # users of different sizes: some finish early
    ref = _reference(task, w, users, cfg, rngs, precond)
    # several chunks, a partial one
    cohort = NextWordCohortTrainer(
        task, device="cpu", chunk_users=5, cpu_workers=2, stacked=stacked
    )
    batches = list(
        cohort.train_batches(w, users, round_num=3, config=cfg, rngs=rngs, preconditioner=precond)
    )
    assert [len(b) for b in batches] == [5, 5, 2]
    got = [pair for b in batches for pair in b.split()]
    assert [u for u, _ in got] == users
    norms = [n for b in batches for n in b.norms]
    for (u, delta), norm in zip(got, norms, strict=True):
        assert delta.shape == w.shape and delta.dtype == torch.float32
        torch.testing.assert_close(delta, ref[u].delta, rtol=1e-4, atol=2e-6)
        assert norm == pytest.approx(ref[u].norm, rel=1e-4)
        if cfg.clip_norm is not None and cfg.noise_std == 0:
            assert float(delta.norm()) <= cfg.clip_norm * (1 + 1e-6)


def test_secure_rngs_and_streams_are_per_user(task):
    """Secure generators differ per call; streams key the shuffles as LocalTrainer keys them."""
    w = initial_flat(task)
    cfg = LocalConfig(learning_rate=1.0, epochs=1, batch_size=4, clip_norm=1.0)
    rngs = RngFactory(seed=5)
    ref = _reference(task, w, [2, 9], cfg, rngs, stream="second")
    got = dict(
        task.cohort_trainer(device="cpu").train(
            w, [2, 9], round_num=3, config=cfg, rngs=rngs, stream="second"
        )
    )
    for u in (2, 9):
        torch.testing.assert_close(got[u], ref[u].delta, rtol=1e-4, atol=2e-6)
    secure = RngFactory(seed=None, secure=True)
    a = dict(task.cohort_trainer(device="cpu").train(w, [2], round_num=3, config=cfg, rngs=secure))
    assert torch.isfinite(a[2]).all() and float(a[2].norm()) <= 1.0 + 1e-6


def test_a_diverging_user_sends_the_zero_update(task):
    w = initial_flat(task)
    cfg = LocalConfig(learning_rate=1e30, epochs=1, batch_size=4, clip_norm=1.0)
    rngs = RngFactory(seed=2)
    ref = _reference(task, w, [1, 4], cfg, rngs)
    batch = next(
        task.cohort_trainer(device="cpu").train_batches(
            w, [1, 4], round_num=3, config=cfg, rngs=rngs
        )
    )
    for i, u in enumerate((1, 4)):
        assert math.isinf(ref[u].norm) == math.isinf(batch.norms[i])
        if math.isinf(ref[u].norm):
            assert not batch.deltas[i].any()


def test_bad_arguments_and_flops(task):
    w = initial_flat(task)
    cfg = LocalConfig(learning_rate=1.0)
    cohort = NextWordCohortTrainer(task, device="cpu")
    assert cohort.length == w.numel() == task.parameter_count()
    with pytest.raises(ValueError, match="chunk_users"):
        NextWordCohortTrainer(task, chunk_users=0)
    with pytest.raises(ValueError, match="cpu_threads"):
        NextWordCohortTrainer(task, cpu_threads=0)
    with pytest.raises(ValueError, match="cpu_workers"):
        NextWordCohortTrainer(task, cpu_workers=0)
    assert not cohort.stacked and NextWordCohortTrainer(task, device="cpu", stacked=True).stacked
    with pytest.raises(ValueError, match="device"):  # no data there (forty-sixth review)
        NextWordCohortTrainer(task, device="meta")
    with pytest.raises(ValueError, match="flat vector"):
        next(cohort.train_batches(w[:-1], [0], round_num=1, config=cfg, rngs=RngFactory(seed=1)))
    with pytest.raises(ValueError, match="preconditioner"):
        next(
            cohort.train_batches(
                w, [0], round_num=1, config=cfg, rngs=RngFactory(seed=1), preconditioner=-w.abs()
            )
        )
    # the default model: 3 x 2 x (4h (e + h) + h e + e W) per target token
    assert model_flops(1, 10_000, 96, 670) == 6 * (4 * 670 * 766 + 670 * 96 + 96 * 10_004)
    batch = DenseUpdates((3,), torch.ones(1, 4), (2.0,))
    assert batch.clone().deltas.data_ptr() != batch.deltas.data_ptr()
    ((user, update),) = batch.split()  # its own memory: pickles alone (Ray actors)
    assert user == 3 and update.untyped_storage().nbytes() == 4 * 4


def _run_config(data_dir, **extra):
    data = {
        "task": "stackoverflow-nwp",
        "strategy": "dp-fedadam",
        "population": 40,
        "clients-per-round": 6,
        "num-server-rounds": 3,
        "noise-multiplier": 0.8,
        "clip-norm": 0.5,
        "delta": 1e-3,
        "seed": 4,
        "server-learning-rate": 0.05,
        "local-learning-rate": 0.5,
        "batch-size": 4,
        "max-examples": 12,
        "task-params": {
            "data-dir": str(data_dir),
            **{k.replace("_", "-"): v for k, v in {**SYNTH, **TINY}.items()},
            "num-users": 40,
            "eval-users": 3,
        },
    }
    data.update(extra)
    return resolve_config(data)


@pytest.mark.parametrize(
    "extra",
    [{}, {"strategy": "dp2", "dp2-s1": 1, "dp2-s2": 1}, {"noise-mode": "distributed"}],
    ids=["dp-fedadam", "dp2-preconditioned", "distributed-noise"],
)
def test_fast_engine_vectorized_and_sequential_agree(task, tmp_path, monkeypatch, extra):
    data_dir = task.data_dir
    chunks = []
    train_chunk = NextWordCohortTrainer._train_chunk

    def counted(self, *args):
        chunks.append(args[2])
        return train_chunk(self, *args)

    monkeypatch.setattr(NextWordCohortTrainer, "_train_chunk", counted)
    vec = simulate(_run_config(data_dir, **extra), tmp_path / "vec")
    assert len(chunks) >= 3  # every round's cohort went through the cohort trainer
    del chunks[:]
    seq = simulate(_run_config(data_dir, vectorize=False, **extra), tmp_path / "seq")
    torch.testing.assert_close(vec.params, seq.params, rtol=0, atol=1e-5)
    assert not torch.equal(vec.params, initial_flat(task))
    assert vec.epsilon == seq.epsilon and not chunks


def test_the_engine_trains_next_word_cohorts_vectorized(task):
    _, alg = build_run(_run_config(task.data_dir, **{"noise-mode": "distributed"}))
    settings = alg.client_settings()
    trainer = UserTrainer(task, device="cpu", vectorize=True, chunk_users=4, secure=False)
    assert settings.local.noise_std > 0 and trainer.mode(settings) == "vectorized"
    assert isinstance(trainer.cohort, NextWordCohortTrainer)


def test_steps_run_on_cpu_threads_and_restore_them(task, monkeypatch):
    from fedprivopt.models import next_word_cohort

    seen = []
    step = next_word_cohort.sgd_step

    def spy(*args):
        seen.append(torch.get_num_threads())
        return step(*args)

    monkeypatch.setattr(next_word_cohort, "sgd_step", spy)
    w = initial_flat(task)
    cfg = LocalConfig(learning_rate=0.5, batch_size=8, max_examples=16)
    torch.set_num_threads(2)
    trainer = NextWordCohortTrainer(task, device="cpu", cpu_threads=1)
    list(trainer.train(w, [0, 1], round_num=1, config=cfg, rngs=RngFactory(seed=1)))
    assert seen and set(seen) == {1} and torch.get_num_threads() == 2
    seen.clear()
    unset = NextWordCohortTrainer(task, device="cpu", cpu_threads=None)
    list(unset.train(w, [0], round_num=1, config=cfg, rngs=RngFactory(seed=1)))
    assert set(seen) == {2}


def test_the_gpus_batched_products_equal_the_cpus_per_user_ones(task, monkeypatch):
    """Off the CPU every user's products and recurrence run as one batched call per step (one
    kernel instead of one per user); run here on the CPU, that path gives LocalTrainer's
    updates too."""
    from fedprivopt.models import next_word_cohort_step

    calls = []
    real = torch.baddbmm
    monkeypatch.setattr(next_word_cohort_step, "_batched", lambda device: True)
    monkeypatch.setattr(
        next_word_cohort_step.torch, "baddbmm", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    cfg = CONFIGS[0]
    w = initial_flat(task)
    rngs = RngFactory(seed=11)
    users = list(range(0, 60, 5))
    ref = _reference(task, w, users, cfg, rngs)
    cohort = NextWordCohortTrainer(task, device="cpu", chunk_users=6, stacked=True)
    got = [pair for b in cohort.train_batches(w, users, round_num=3, config=cfg, rngs=rngs)
           for pair in b.split()]  # fmt: skip
    assert calls  # the batched path ran
    assert [u for u, _ in got] == users
    for u, delta in got:
        torch.testing.assert_close(delta, ref[u].delta, rtol=1e-4, atol=2e-6)
