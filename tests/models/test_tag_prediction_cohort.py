"""The vectorized row-sparse cohort trainer computes LocalTrainer's updates."""

import threading

import pytest
import torch

from fedprivopt.clients import LocalConfig, LocalTrainer
from fedprivopt.models import StackOverflowTagTask, initial_flat
from fedprivopt.models.tag_prediction_cohort import TagCohortTrainer
from fedprivopt.privacy import RngFactory
from fedprivopt.privacy.sparse import RowSparse
from tests.tag_synth import make_synth_dir, tag_task


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return make_synth_dir(tmp_path_factory, "cohort-synth")


_task = tag_task


def _reference(task, w, users, cfg, rngs, precond, stream="train"):
    trainer = LocalTrainer(task, device="cpu")
    return {
        u: trainer.train(
            w, user_id=u, round_num=3, config=cfg, rngs=rngs, preconditioner=precond, stream=stream
        ).delta
        for u in users
    }


@pytest.mark.parametrize("single_label", [False, True])
@pytest.mark.parametrize("preconditioned", [False, True])
@pytest.mark.parametrize(
    "cfg",
    [
        LocalConfig(learning_rate=2.0, epochs=1, batch_size=4, clip_norm=0.5),
        LocalConfig(learning_rate=1.0, epochs=2, batch_size=3, max_examples=7, clip_norm=10.0),
        LocalConfig(learning_rate=0.5, epochs=1, batch_size=64, clip_norm=None),
    ],
    ids=["clip-small", "epochs-cap", "no-clip"],
)
def test_cohort_updates_equal_local_trainer(synth_dir, single_label, preconditioned, cfg):
    task = _task(synth_dir, single_label=single_label)
    w = initial_flat(task)
    gen = torch.Generator().manual_seed(1)
    precond = torch.rand(w.shape, generator=gen) + 0.5 if preconditioned else None
    rngs = RngFactory(seed=11)
    users = list(range(0, 80, 3))
    ref = _reference(task, w, users, cfg, rngs, precond)
    cohort = task.cohort_trainer(device="cpu", chunk_users=5)  # several chunks, a partial one
    got = list(cohort.train(w, users, round_num=3, config=cfg, rngs=rngs, preconditioner=precond))
    assert [u for u, _ in got] == users
    for u, update in got:
        assert isinstance(update, RowSparse)
        assert update.problem(w.numel(), torch.float32) is None
        dense = update.to_dense()
        torch.testing.assert_close(dense, ref[u], rtol=1e-4, atol=2e-6)
        assert torch.count_nonzero(ref[u]) <= update.values.numel()  # zero off the rows
        if cfg.clip_norm is not None:
            assert float(dense.norm()) <= cfg.clip_norm * (1 + 1e-6)


@pytest.mark.parametrize("single_label", [False, True])
def test_a_frozen_bias_gets_no_update_in_either_trainer(synth_dir, single_label):
    """train_bias=False: both trainers leave the bias at 0 in every update and agree elsewhere."""
    task = _task(synth_dir, single_label=single_label, init_bias="tag-prior", train_bias=False)
    w = initial_flat(task)
    cfg = LocalConfig(learning_rate=2.0, epochs=2, batch_size=4, clip_norm=0.5)
    rngs = RngFactory(seed=11)
    users = list(range(0, 80, 7))
    ref = _reference(task, w, users, cfg, rngs, None)
    got = dict(task.cohort_trainer(device="cpu", chunk_users=4).train(
        w, users, round_num=3, config=cfg, rngs=rngs
    ))  # fmt: skip
    K = task.num_tags
    trained = _task(synth_dir, single_label=single_label, init_bias="tag-prior")
    free = dict(trained.cohort_trainer(device="cpu", chunk_users=4).train(
        w, users, round_num=3, config=cfg, rngs=rngs
    ))  # fmt: skip
    moved = 0
    for u in users:
        dense = got[u].to_dense()
        torch.testing.assert_close(dense, ref[u], rtol=1e-4, atol=2e-6)
        assert torch.count_nonzero(dense[-K:]) == 0 and torch.count_nonzero(ref[u][-K:]) == 0
        moved += int(torch.count_nonzero(free[u].to_dense()[-K:]) > 0)
    assert moved > 0  # with a trained bias the same users do change it


def test_users_without_examples_and_streams(synth_dir):
    task = _task(synth_dir)
    w = initial_flat(task)
    empty = [u for u in range(task.num_users) if task.user_size(u) == 0]
    cfg = LocalConfig(learning_rate=1.0, batch_size=8, clip_norm=1.0)
    rngs = RngFactory(seed=2)
    users = sorted(set(empty[:2]) | {1, 2})
    cohort = task.cohort_trainer(device="cpu")
    for stream in ("train", "train-2"):
        ref = _reference(task, w, users, cfg, rngs, None, stream=stream)
        got = dict(cohort.train(w, users, round_num=3, config=cfg, rngs=rngs, stream=stream))
        for u in users:
            torch.testing.assert_close(got[u].to_dense(), ref[u], rtol=1e-4, atol=2e-6)
    for u in empty[:2]:
        assert float(got[u].values.abs().sum()) == 0.0


def test_a_diverging_user_sends_the_zero_update(synth_dir):
    task = _task(synth_dir)
    w = initial_flat(task)
    words = [set(task.user_data(u)[0].flatten().tolist()) for u in range(20)]
    rare = next(j for j in range(task.num_features) if 0 < sum(j in ws for ws in words) < 10)
    precond = torch.ones_like(w)
    precond.view(-1, task.num_tags)[rare] = 1e-44  # g / P overflows to inf for its writers
    cfg = LocalConfig(learning_rate=1.0, batch_size=8, clip_norm=1.0)
    rngs = RngFactory(seed=2)
    cohort = task.cohort_trainer(device="cpu")
    got = dict(
        cohort.train(w, range(20), round_num=3, config=cfg, rngs=rngs, preconditioner=precond)
    )
    ref = _reference(task, w, range(20), cfg, rngs, precond)
    diverged = [u for u in range(20) if rare in words[u]]
    assert diverged and len(diverged) < 20
    for u in range(20):
        assert torch.isfinite(got[u].values).all()
        torch.testing.assert_close(got[u].to_dense(), ref[u], rtol=1e-4, atol=2e-6)
        assert (float(got[u].values.abs().sum()) == 0.0) == (u in diverged)


def test_bad_arguments(synth_dir):
    task = _task(synth_dir)
    w = initial_flat(task)
    cohort = task.cohort_trainer(device="cpu")
    rngs = RngFactory(seed=0)
    noisy = LocalConfig(learning_rate=1.0, clip_norm=1.0, noise_std=0.1)
    with pytest.raises(ValueError, match="noise_std"):
        list(cohort.train(w, [0], round_num=1, config=noisy, rngs=rngs))
    cfg = LocalConfig(learning_rate=1.0, clip_norm=1.0)
    with pytest.raises(ValueError, match="global_flat"):
        list(cohort.train(w[:-1], [0], round_num=1, config=cfg, rngs=rngs))
    with pytest.raises(ValueError, match="preconditioner"):
        list(cohort.train(w, [0], round_num=1, config=cfg, rngs=rngs, preconditioner=-w.abs()))
    with pytest.raises(ValueError, match="chunk_users"):
        task.cohort_trainer(chunk_users=0)


def test_minibatches_without_vocabulary_words_train_only_the_bias(tmp_path):
    from fedprivopt.data import StackOverflowExample, encode_example, write_sqlite
    from fedprivopt.data.vocab import write_tag_counts, write_word_counts

    def ex(text, tags):
        return StackOverflowExample(
            tokens=text, title="", tags=tags, creation_date="d", score=0, type="question"
        )

    data = {
        # u0's words are all out of the vocabulary; steps 2 and 3 train u0 alone
        "train": {"u0": [ex("zz qq", "a"), ex("yy", "b")], "u1": [ex("w w", "b")]},
        "heldout": {"h": [ex("w", "a")]},
        "test": {"t": [ex("w", "a")]},
    }
    rows = [(s, c, encode_example(e)) for s, cs in data.items() for c, es in cs.items() for e in es]
    meta = [(c, s, len(es)) for s, cs in data.items() for c, es in cs.items()]
    write_sqlite(tmp_path / "stackoverflow.sqlite", rows, meta)
    write_word_counts(tmp_path / "stackoverflow.word_count", ["w", "v"], [3, 1])
    write_tag_counts(tmp_path / "stackoverflow.tag_count", ["a", "b"], [2, 1])
    task = StackOverflowTagTask(data_dir=str(tmp_path), synthetic=False, vocab_size=2, num_tags=2)
    w = initial_flat(task)
    cfg = LocalConfig(learning_rate=0.5, batch_size=1, epochs=2, clip_norm=10.0)
    rngs = RngFactory(seed=0)
    ref = _reference(task, w, [0, 1], cfg, rngs, None)
    got = dict(
        task.cohort_trainer(device="cpu").train(w, [0, 1], round_num=3, config=cfg, rngs=rngs)
    )
    for u in (0, 1):
        torch.testing.assert_close(got[u].to_dense(), ref[u], rtol=1e-5, atol=1e-7)
    assert got[0].rows.tolist() == [2]  # u0 wrote no vocabulary word: its update is the bias


@pytest.mark.parametrize("single_label", [False, True])
def test_token_cache_gives_bit_identical_updates(synth_dir, tmp_path, single_label):
    cfg = LocalConfig(learning_rate=2.0, epochs=2, batch_size=4, max_examples=9, clip_norm=0.5)
    plain = _task(synth_dir, single_label=single_label)
    cached = _task(synth_dir, single_label=single_label, token_cache=True, cache_dir=str(tmp_path))
    w = initial_flat(plain)
    users = list(range(0, 80, 2))
    got = [
        list(
            t.cohort_trainer(device="cpu", chunk_users=7).train(
                w, users, round_num=2, config=cfg, rngs=RngFactory(seed=5)
            )
        )
        for t in (plain, cached)
    ]
    for (u, a), (v, b) in zip(*got, strict=True):
        assert u == v
        assert torch.equal(a.rows, b.rows) and torch.equal(a.values, b.values)


@pytest.mark.parametrize("workers", [1, 2])
def test_cpu_threads_are_set_for_the_steps_and_restored(synth_dir, monkeypatch, workers):
    task = _task(synth_dir)
    w = initial_flat(task)
    cfg = LocalConfig(learning_rate=1.0, epochs=1, batch_size=4, clip_norm=1.0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        trainer = TagCohortTrainer(task, device="cpu", chunk_users=4, cpu_workers=workers)
        trainer.min_parallel_users = 1  # threads for these 5 users too
        in_steps, steps = [], trainer._steps

        def recording(*args, **kwargs):
            in_steps.append((torch.get_num_threads(), threading.current_thread().name))
            return steps(*args, **kwargs)

        monkeypatch.setattr(trainer, "_steps", recording)
        rngs = RngFactory(seed=1)
        at_yield = [
            torch.get_num_threads()
            for _ in trainer.train(w, [0, 1, 2, 3, 4], round_num=1, config=cfg, rngs=rngs)
        ]
        # chunks of 2, 2 and 1 users (CPU_CHUNKS), each stepped with one thread
        assert [n for n, _ in in_steps] == [1, 1, 1]
        names = {name for _, name in in_steps}
        if workers == 1:  # in the caller's thread, whose setting holds everywhere else
            assert names == {threading.current_thread().name} and at_yield == [2] * 5
        else:  # in the workers' threads; the caller runs with one while chunks are pending
            assert all(n.startswith("fedprivopt-chunk") for n in names) and at_yield == [1] * 5
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match=r"cpu_threads must be an integer in \[1, 1024\] or None"):
        task.cohort_trainer(device="cpu").__class__(task, cpu_threads=0)


def test_batches_hold_the_updates_of_train_and_live_until_the_next_chunk(synth_dir):
    task = _task(synth_dir)
    w = initial_flat(task)
    cfg = LocalConfig(learning_rate=2.0, epochs=2, batch_size=4, max_examples=9, clip_norm=0.5)
    users = list(range(0, 40, 3))
    trainer = task.cohort_trainer(device="cpu", chunk_users=4)
    pairs = list(trainer.train(w, users, round_num=2, config=cfg, rngs=RngFactory(seed=5)))
    kept, clones = [], []
    for batch in trainer.train_batches(w, users, round_num=2, config=cfg, rngs=RngFactory(seed=5)):
        assert batch.problem(w.numel(), torch.float32) is None
        kept.append(batch)
        clones.append(batch.clone())
    assert [u for b in clones for u in b.users] == users
    got = [pair for b in clones for pair in b.split()]
    for (u, a), (v, b) in zip(got, pairs, strict=True):
        assert u == v and torch.equal(a.rows, b.rows) and torch.equal(a.values, b.values)
    # the first batch's values were the workspace the later chunks trained in
    assert not torch.equal(kept[0].values, clones[0].values[: kept[0].values.shape[0]])


@pytest.mark.parametrize("single_label", [False, True])
def test_examples_of_many_users_read_at_once_equal_their_own(synth_dir, tmp_path, single_label):
    from fedprivopt.models.tag_prediction_encoding import ragged_take

    plain = _task(synth_dir, single_label=single_label)
    cached = _task(synth_dir, single_label=single_label, token_cache=True, cache_dir=str(tmp_path))
    users = [9, 2, 40, 2, 77]
    gen = torch.Generator().manual_seed(0)
    picks = [torch.randperm(plain.user_size(u), generator=gen)[:5] for u in users]
    sizes = [plain.user_size(u) for u in users]
    assert plain.user_sizes(users) == cached.user_sizes(users) == sizes
    for task in (plain, cached):
        got = task.examples_csr(users, picks)
        for field in range(4):
            parts = []
            for u, p in zip(users, picks, strict=True):
                data = plain.user_csr(u)
                if field < 2:
                    parts.append(ragged_take(data.tokens, data.lengths, p)[field])
                elif single_label:
                    parts.append(data.labels[p] if field == 2 else None)
                else:
                    parts.append(ragged_take(data.labels, data.label_lengths, p)[field - 2])
            if parts[0] is None:
                assert got[field] is None
            else:
                assert torch.equal(got[field], torch.cat(parts))
    with pytest.raises(ValueError, match="one tensor of picks per user"):
        plain.examples_csr([1, 2], picks[:1])


@pytest.mark.parametrize("single_label", [False, True])
@pytest.mark.parametrize("preconditioned", [False, True])
def test_chunks_trained_at_once_give_the_same_updates_to_the_bit(
    synth_dir, single_label, preconditioned
):
    task = _task(synth_dir, single_label=single_label)
    w = initial_flat(task)
    gen = torch.Generator().manual_seed(4)
    w = w + 0.01 * torch.randn(w.numel(), generator=gen)
    precond = torch.rand(w.numel(), generator=gen) + 0.5 if preconditioned else None
    cfg = LocalConfig(learning_rate=1.5, epochs=2, batch_size=3, max_examples=11, clip_norm=0.3)
    users = [0, 3, 4, 9, 17, 18, 30, 41, 55, 56, 70, 79]

    def run(workers, chunk_users):
        trainer = TagCohortTrainer(task, device="cpu", chunk_users=chunk_users, cpu_workers=workers)
        trainer.min_parallel_users = 1
        return list(trainer.train(
            w, users, round_num=4, config=cfg, rngs=RngFactory(seed=9), preconditioner=precond
        ))  # fmt: skip

    for chunk_users in (256, 2):
        alone = run(1, chunk_users)
        for workers in (2, 3):
            got = run(workers, chunk_users)
            assert [u for u, _ in got] == users
            for (u, a), (v, b) in zip(got, alone, strict=True):
                assert u == v and torch.equal(a.rows, b.rows)
                assert torch.equal(a.values, b.values)


def test_a_round_of_few_users_trains_in_the_callers_thread(synth_dir):
    task = _task(synth_dir)
    w = initial_flat(task)
    cfg = LocalConfig(learning_rate=1.0, epochs=1, batch_size=4, clip_norm=1.0)
    trainer = TagCohortTrainer(task, device="cpu", cpu_workers=2)
    names, steps = [], trainer._steps

    def recording(*args, **kwargs):
        names.append(threading.current_thread().name)
        return steps(*args, **kwargs)

    trainer._steps = recording
    few = list(range(trainer.min_parallel_users - 1))
    got = dict(trainer.train(w, few, round_num=1, config=cfg, rngs=RngFactory(seed=3)))
    assert set(names) == {threading.current_thread().name} and len(names) == 4  # CPU_CHUNKS
    trainer.min_parallel_users = 1  # the same users in the workers' threads: the same updates
    names.clear()
    threaded = dict(trainer.train(w, few, round_num=1, config=cfg, rngs=RngFactory(seed=3)))
    assert all(n.startswith("fedprivopt-chunk") for n in names)
    for u in few:
        assert torch.equal(got[u].values, threaded[u].values)
