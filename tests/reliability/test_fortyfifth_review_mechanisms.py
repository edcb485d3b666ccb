"""Issue 15, forty-fifth hostile review (mechanisms: the mechanisms and epsilon): tests.

1. The documented mechanism called directly: ``NoisyMeanAggregator.aggregate`` of a list whose
   users' updates share memory: ``[(u, work) for u in users]`` (a loop of one's own that trains
   each user into one workspace; the api reviewer's cases 1 and 3 of this review at the
   mechanism), ``list(task.cohort_trainer().train_batches(...))`` of the tag task's cohort
   trainer (whose batches reuse two workspaces: 6 users in chunks of 2), and a
   ``RowSparseBatch`` whose values are one row expanded over its users. Before: summed: 3 users
   holding one tensor at C gave a sum of norm 3C, the listed batches a sum of norm 0.349 where
   the users' own updates sum to 0.483 (users 2 and 3 summed with users 4 and 5's values), a
   sensitivity of several C under a charge of C. Now
   ``privacy.aggregate_checks.refuse_shared_updates`` (from ``aggregate`` given a list or
   tuple) raises ``ValueError`` naming two users before anything is summed; a stream (one entry
   read at a time, as the fast engine's) may reuse memory as before, and views of distinct rows
   of one matrix are distinct updates.
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.core.local import LocalConfig
from fedprivopt.models import initial_flat
from fedprivopt.privacy import RngFactory
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.sparse import RowSparseBatch
from tests.tag_synth import make_synth_dir, tag_task

SHARED = "are held in the same memory"


def _agg(users: float = 3.0) -> NoisyMeanAggregator:
    return NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=0.5, expected_cohort_size=users)


def test_1_users_holding_one_workspace_are_refused():
    work = torch.full((4,), 0.5)  # norm 1 = C: three users of it summed to norm 3
    stacked = torch.full((3, 4), 0.5)
    for entries in (
        [(0, work), (1, work), (2, work)],
        ((0, work[:2]), (1, work[1:3])),  # views of overlapping entries
        [(0, stacked[0]), (1, stacked[0].view(2, 2).flatten())],
    ):
        with pytest.raises(ValueError, match=SHARED):
            _agg().aggregate(entries, dim=len(entries[0][1]), generator=torch.Generator())
    # each user a tensor of its own, or distinct rows of one matrix: summed as before
    own = _agg().aggregate(
        [(u, work.clone()) for u in range(3)], dim=4, generator=torch.Generator()
    )
    rows = _agg().aggregate(list(enumerate(stacked)), dim=4, generator=torch.Generator())
    assert own.metrics["accepted"] == rows.metrics["accepted"] == 3.0
    # a stream read one entry at a time may reuse its memory (the fast engine's trainers)
    stream = _agg().aggregate(((u, work) for u in range(3)), dim=4, generator=torch.Generator())
    assert stream.metrics["accepted"] == 3.0


def test_1_listed_batches_of_the_tag_cohort_trainer_are_refused(tmp_path_factory):
    task = tag_task(make_synth_dir(tmp_path_factory, "r45-mechanisms-tag"))
    trainer = task.cohort_trainer(device="cpu")
    trainer.chunk_users = 2
    w = initial_flat(task)
    config = LocalConfig(learning_rate=0.5, batch_size=8, clip_norm=0.1)

    def batches():
        return trainer.train_batches(
            w, list(range(6)), round_num=1, config=config, rngs=RngFactory(seed=0)
        )

    agg = NoisyMeanAggregator(clip_norm=0.1, noise_multiplier=1e-300, expected_cohort_size=6)
    with pytest.raises(ValueError, match=SHARED):  # before: users 2, 3 summed with 4, 5's rows
        agg.aggregate(list(batches()), dim=w.numel(), generator=torch.Generator())
    kept = agg.aggregate([b.clone() for b in batches()], dim=w.numel(), generator=torch.Generator())
    streamed = agg.aggregate(batches(), dim=w.numel(), generator=torch.Generator())
    assert kept.metrics["accepted"] == streamed.metrics["accepted"] == 6.0
    assert torch.equal(kept.delta_tilde, streamed.delta_tilde)


def test_1_a_batch_of_one_expanded_row_is_refused():
    values = torch.full((1, 4), 0.5).expand(3, 4)  # every user's row the same entries
    batch = RowSparseBatch((0, 1, 2), torch.zeros(3, dtype=torch.int64), values,
                           torch.arange(4), 4)  # fmt: skip
    with pytest.raises(ValueError, match=SHARED):
        _agg().aggregate([batch], dim=4, generator=torch.Generator())
    own = RowSparseBatch((0, 1, 2), batch.rows, values.clone(), batch.row_ptr, 4)
    assert _agg().aggregate([own], dim=4, generator=torch.Generator()).metrics["accepted"] == 3
