"""The base of the cohort trainers: settings, input checks and train() over train_batches()."""

from __future__ import annotations

import threading
import time

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
        ({"cpu_threads": 0}, "cpu_threads must be an integer in \\[1, 1024\\] or None"),
        ({"cpu_threads": False}, "cpu_threads must be an integer in \\[1, 1024\\] or None"),
        ({"cpu_workers": 0}, "cpu_workers must be an integer in \\[1, 1024\\] or None"),
        ({"cpu_workers": True}, "cpu_workers must be an integer in \\[1, 1024\\] or None"),
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


@pytest.mark.parametrize(
    ("users", "chunk_users", "device", "sizes"),
    [
        (list(range(10)), 256, "cpu", [3, 3, 3, 1]),  # at least CPU_CHUNKS on the CPU
        (list(range(3)), 256, "cpu", [1, 1, 1]),
        (list(range(20)), 3, "cpu", [3, 3, 3, 3, 3, 3, 2]),  # chunk_users still bounds them
        (list(range(10)), 256, "meta", [10]),  # elsewhere: chunk_users only
        ([], 256, "cpu", []),
    ],
)
def test_chunks_cut_the_cohort_the_same_way_for_any_number_of_workers(
    users, chunk_users, device, sizes
):
    for workers in (1, 2, 5):
        trainer = _Doubling(task=None, device="cpu", chunk_users=chunk_users, cpu_workers=workers)
        # any other device type (a trainer refuses to be built on "meta", which has no data:
        # forty-sixth review of issue 15, mechanisms 2; chunks() reads the type only)
        trainer.device = torch.device(device)
        chunks = trainer.chunks(users)
        assert [len(c) for c in chunks] == sizes
        assert [u for c in chunks for u in c] == users


def test_run_chunks_yields_in_order_and_reuses_a_slot_only_after_its_result_was_taken():
    trainer = _Doubling(task=None, device="cpu", cpu_workers=2)
    taken: set[int] = set()
    log = []

    def train(chunk, slot):
        # the chunk that used this slot before (four chunks back: 2 slots a worker) was taken
        assert chunk < 4 or chunk - 4 in taken
        log.append((chunk, slot, threading.current_thread().name))
        time.sleep(0.01 * (chunk % 3))  # finish out of order
        return chunk

    got = []
    for result in trainer.run_chunks(list(range(9)), train):
        got.append(result)
        taken.add(result)
    assert got == list(range(9))
    assert sorted((c, s) for c, s, _ in log) == [(c, c % 4) for c in range(9)]
    assert len({name for _, _, name in log}) == 2
    assert all(name.startswith("fedprivopt-chunk") for _, _, name in log)


def test_run_chunks_ahead_queues_every_chunk_before_the_first_is_taken():
    """``ahead = len(chunks)``: the other worker goes on while chunk 0 trains (next-word)."""
    trainer = _Doubling(task=None, device="cpu", cpu_workers=2)
    last_started = threading.Event()

    def train(chunk, slot):
        if chunk == 7:
            last_started.set()
        if chunk == 0:  # the long first chunk: ends only once the last one has started
            assert last_started.wait(10), "chunk 7 did not start while chunk 0 trained"
        return slot

    slots = list(trainer.run_chunks(list(range(8)), train, ahead=8))
    assert slots == list(range(8))  # a slot of its own each


def test_run_chunks_passes_a_workers_error_on_and_restores_the_threads():
    before = torch.get_num_threads()
    trainer = _Doubling(task=None, device="cpu", cpu_workers=2)

    def train(chunk, slot):
        if chunk == 3:
            raise RuntimeError("chunk 3 failed")
        return chunk

    got = []
    with pytest.raises(RuntimeError, match="chunk 3 failed"):
        for result in trainer.run_chunks(list(range(6)), train):
            got.append(result)
    assert got == [0, 1, 2] and torch.get_num_threads() == before
    # a consumer that stops early: the pending chunks end, the setting comes back
    results = trainer.run_chunks(list(range(6)), lambda chunk, slot: chunk)
    assert next(results) == 0
    results.close()
    assert torch.get_num_threads() == before


def test_one_worker_trains_in_the_callers_thread():
    trainer = _Doubling(task=None, device="cpu", cpu_workers=1)
    names = []
    out = list(
        trainer.run_chunks([0, 1], lambda c, s: names.append(threading.current_thread().name))
    )
    assert len(out) == 2 and set(names) == {threading.current_thread().name}
