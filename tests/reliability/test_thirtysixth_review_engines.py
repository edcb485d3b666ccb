"""Thirty-sixth review of issue 15, area "engines": the fast engine's cuts of a cohort.

Each test failed before its fix (checked against the code before it) and passes after.

1. The vectorized tag trainer's updates depended, in their last bits, on where the cohort was
   cut into chunks: ``simulate stackoverflow-tp-mini.toml --rounds 2 --set max-examples=0 --set
   local-epochs=2 --set clients-per-round=40`` with ``cohort-chunk = 1`` (or ``fast-actors = 2``
   with ``cohort-chunk = 7``; also ``ema-decay = 0.5``, fixed sampling, adaptive clipping,
   ``batch-size = 1``, ``max-examples = 9`` with ``cohort-chunk = 3`` or ``fast-actors = 3``)
   released another model than the default cut (parameters 1e-9 apart, the ledger's digests
   differ), and a seeded run of 3 rounds whose newest checkpoint was lost, resumed with
   ``cohort-chunk = 3`` in its ``config.toml`` (a memory setting, the kind one changes after
   running out of memory), was refused, rc 2: ``round 3, redone from the checkpoint, came out
   other than its first release … another device, another engine or vectorize setting … or
   edited code changes a redone round``, none of which had changed. The cause: torch's CPU
   ``sigmoid_`` computes the last ``numel % 32`` entries of a tensor (AVX-512) with scalar code
   whose results differ in the last bit from its SIMD body, so an entry's logistic depended on
   how many visits of other users preceded it in its local step. Now the step's logistic is
   computed over a buffer padded to a multiple of 64 entries (``_sigmoid``): every user's update
   is the same to the bit whatever the cut (chunks of 1, 3, 7 and the default; shards), and the
   resume above finishes, rc 0. (The single-label softmax is computed row by row: it never
   depended on the cut.)
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.clients import LocalConfig
from fedprivopt.models import initial_flat
from fedprivopt.models.tag_prediction_cohort import TagCohortTrainer
from fedprivopt.privacy import RngFactory
from tests.tag_synth import make_synth_dir, tag_task


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return make_synth_dir(tmp_path_factory, "engines36-synth")


# -- finding 1: a user's update does not depend on the cut of its cohort -------------------------


def _updates(task, w, users, cfg, chunk_users):
    trainer = TagCohortTrainer(task, device="cpu", chunk_users=chunk_users)
    got = trainer.train(w, users, round_num=2, config=cfg, rngs=RngFactory(seed=5))
    return {u: update.to_dense() for u, update in got}


def test_1_a_users_update_is_the_same_to_the_bit_whatever_the_chunks(synth_dir):
    task = tag_task(synth_dir)  # multi-label: the logistic of every tag
    gen = torch.Generator().manual_seed(2)
    w = initial_flat(task) + 0.05 * torch.randn(initial_flat(task).numel(), generator=gen)
    # users of very different sizes (no cap), two epochs: many visits of others in each step
    cfg = LocalConfig(learning_rate=5.0, epochs=2, batch_size=5, clip_norm=1.0)
    users = list(range(40))
    whole = _updates(task, w, users, cfg, 256)
    for chunk_users in (1, 3, 7):
        cut = _updates(task, w, users, cfg, chunk_users)
        differ = [u for u in users if not torch.equal(cut[u], whole[u])]
        assert not differ, (chunk_users, differ)  # before: users differing in the last bits
