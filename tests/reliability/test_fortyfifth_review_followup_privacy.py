"""Issue 15, forty-fifth hostile review, follow-up (privacy: today's fixes of the Python API,
the mechanisms and the Flower messages): tests.

1. Mechanisms 1 through the fast engine: a task's own ``cohort_trainer`` whose
   ``train_batches`` returns a list (``list(inner.train_batches(...))`` of a trainer that keeps
   its batches in reused workspaces, as the tag task's does), trained by
   ``UserTrainer.train`` (the fast engine's trainer, seeded or secure) into the aggregator:
   row-sparse batches of one reused values tensor, and dense batches whose ``split()`` lists
   views of one reused matrix. Before: streamed and summed (the aggregator sees a stream and
   cannot tell): the earlier chunks' users summed with the last chunk's values (a sum of norm
   0.248 where the users' own updates sum to 0.483 in the mechanisms reviewer's measure), a
   sensitivity of several C under a charge of C. Now ``fast_trainer._Listed`` refuses a list's
   row-sparse batches that share memory before the first is summed and its dense pairs that
   do after the last (before the noise is drawn): ``ValueError`` naming the round and two
   users; the same batches made by a generator, or a list owning its memory, summed as before.
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.core.local import LocalConfig
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.sparse import RowSparseBatch
from fedprivopt.simulation.fast_trainer import UserTrainer
from fedprivopt.wire import ClientSettings

SHARED = "are held in the same memory"


# -- finding 1: a cohort trainer listing batches kept in reused workspaces -------------------


class _Task:
    """A task whose cohort trainer is set on the fast engine's trainer itself."""


class _Dense:
    def __init__(self, users, deltas):
        self.users, self.deltas = tuple(users), deltas

    def split(self):
        return [(u, self.deltas[i]) for i, u in enumerate(self.users)]


class _Reusing:
    """Chunks of 2 users, each user's update ``0.01 * (user + 1)`` in every entry.

    ``listed``: return the batches as a list; ``reuse``: one workspace for every chunk (each
    batch valid until the next is made); ``sparse``: row-sparse batches, else dense ones.
    """

    noise_shares = False

    def __init__(self, *, listed, reuse, sparse):
        self.listed, self.reuse, self.sparse = listed, reuse, sparse

    def _batches(self, params, users):
        work = torch.empty(2, params.numel())
        for start in range(0, len(users), 2):
            chunk = users[start : start + 2]
            values = work if self.reuse else torch.empty(2, params.numel())
            for i, u in enumerate(chunk):
                values[i].fill_(0.01 * (u + 1))
            if self.sparse:
                yield RowSparseBatch(
                    users=tuple(chunk),
                    rows=torch.zeros(len(chunk), dtype=torch.int64),
                    values=values,
                    row_ptr=torch.arange(len(chunk) + 1, dtype=torch.int64),
                    length=params.numel(),
                )
            else:
                yield _Dense(chunk, values)

    def train_batches(self, params, users, **_):
        batches = self._batches(params, list(users))
        return list(batches) if self.listed else batches


def _round(cohort, secure=False):
    trainer = UserTrainer(_Task(), device="cpu", vectorize=False, chunk_users=2, secure=secure)
    trainer.cohort = cohort
    w = torch.zeros(4) if cohort.sparse else torch.zeros(8)
    settings = ClientSettings(
        local=LocalConfig(learning_rate=0.5, batch_size=8, clip_norm=1.0), seed=0
    )
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1e-300, expected_cohort_size=6)
    stream = trainer.train(list(range(6)), 1, w, None, settings, "train")
    result = agg.aggregate(stream, dim=w.numel(), generator=torch.Generator())
    return result.metrics["accepted"], result.delta_tilde * 6


@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("sparse", [True, False])
def test_1_listed_batches_in_reused_workspaces_are_refused(sparse, secure):
    said = f"round 1: the batches the task.s cohort_trainer listed: updates: users 0 and 2 {SHARED}"
    with pytest.raises(ValueError, match=said):
        _round(_Reusing(listed=True, reuse=True, sparse=sparse), secure)


@pytest.mark.parametrize("sparse", [True, False])
def test_1_a_generator_or_a_list_owning_its_memory_is_summed_as_before(sparse):
    streamed = _round(_Reusing(listed=False, reuse=True, sparse=sparse))
    owned = _round(_Reusing(listed=True, reuse=False, sparse=sparse))
    assert streamed[0] == owned[0] == 6.0
    assert torch.allclose(streamed[1], owned[1])
    # every user's own update summed once: the first entry holds 0.01 * (1 + ... + 6)
    assert float(streamed[1][0]) == pytest.approx(0.21)
