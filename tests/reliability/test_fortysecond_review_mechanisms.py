"""Issue 15, forty-second hostile review (mechanisms: clipping, noise, accounting): tests.

1. The next-word task's vectorized cohort trainer (``NextWordCohortTrainer``, the fast
   engine's default for ``stackoverflow-nwp``) given a float64 ``global_flat`` (the Python API;
   the tag trainer's twin was the forty-first review's observation), ``clip_norm`` 0.05 to 0.9.
   Before: the stack trained in float64, each update was clipped in float64 and cast to
   float32 afterwards, whose rounding left updates above C at each of 8 clip norms
   tried (exact norm up to 1.0000000221 C). Now the update is made float32
   before it is checked and clipped (``NextWordCohortTrainer._finish``): exact norm at most C;
   a float32 ``global_flat`` (what the engines pass) gives the same bits as before.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from fedprivopt.clients import LocalConfig
from fedprivopt.models import build_task, initial_flat
from fedprivopt.models.next_word_cohort import NextWordCohortTrainer
from fedprivopt.privacy import RngFactory


def _exact_sq(vector: torch.Tensor) -> Fraction:
    return sum((Fraction(x) ** 2 for x in vector.double().tolist() if x), Fraction(0))


@pytest.fixture(scope="module")
def nwp_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("r42-mechanisms-nwp")
    return build_task(
        "stackoverflow-nwp", data_dir=str(root), num_users=20, eval_users=2, vocab_size=100,
        embedding_dim=4, hidden_size=4, synth_clients=40, synth_vocab=200, synth_tags=5,
        synth_seed=3,
    )  # fmt: skip


@pytest.mark.parametrize("clip_norm", [0.05, 0.2, 0.9])
def test_1_next_word_cohort_clips_a_float64_model_in_float32(nwp_task, clip_norm):
    w = initial_flat(nwp_task)
    cfg = LocalConfig(learning_rate=1.0, epochs=1, batch_size=4, clip_norm=clip_norm)
    rngs = RngFactory(seed=11)
    users = list(range(12))
    trainer = NextWordCohortTrainer(nwp_task, device="cpu", chunk_users=12, stacked=True)
    got = [
        pair
        for batch in trainer.train_batches(w.double(), users, round_num=3, config=cfg, rngs=rngs)
        for pair in batch.split()
    ]
    assert [u for u, _ in got] == users
    limit = Fraction(clip_norm) ** 2
    above = [u for u, d in got if d.dtype != torch.float32 or _exact_sq(d) > limit]
    assert above == []
    # the engines' float32 model: the same clipped updates as before, each within C
    same = [
        pair
        for batch in trainer.train_batches(w, users, round_num=3, config=cfg, rngs=rngs)
        for pair in batch.split()
    ]
    assert all(_exact_sq(d) <= limit for _, d in same)
