"""Issue 15, forty-fifth hostile review (api: the documented Python API): tests.

1. A ``drive_round`` train callback (or ``aggregate``'s caller) returning a mapping of its own
   (a ``collections.abc.Mapping``) whose ``items()`` trains each user when it reaches it, into
   one workspace it reuses (a lazy view; the fast engine's cohort trainers reuse theirs so):
   the last user's update 1.0 in every entry, the others 0 (dp-fedavg and ADADP, population
   40, q 0.25, sigma 1e-6). Before: the aggregation read all pairs first, so every user's pair
   held the same tensor, the last user's update when they were summed: that user's clipped
   update was summed once for every user of the cohort (the model at 0.45 where that user
   alone moves it 0.05 over m 10), a sensitivity of 9C under a charge of C. Now
   ``strategies.cohorts.read_now`` copies the values of a mapping whose ``items()`` is not
   a plain ``dict``'s as they are read: the model of the honest callback.
2. ``privatize_update(delta, clip_norm=1.0)`` (a user's own ClientApp's step, docs/FLOWER.md,
   server-noise mode) called for each user on a ``delta`` computed into one workspace the loop
   reuses (``torch.sub(local, request.global_flat, out=work)``), ``updates[user] =
   private.vector``. Before: an update within C came back as the caller's tensor itself, so
   every unclipped user's vector held the last user's update when ``reply_updates`` sent them
   (users 0.1, 0.2, 0.3 all sent 0.3: the last user summed three times by the server). Now
   ``clients.privatize.privatize_update`` returns memory of its own (``_shares_memory``).
3. A ``drive_round`` train callback (or ``aggregate``'s caller) that trains each user into
   one workspace and returns a plain ``dict`` ``{user: work}`` (finding 1 through a ``dict``,
   whose values are one tensor). Before: the last user's update was summed once for every
   user of the cohort (the model at 0.45 where 0.05), a sensitivity of 9C under a charge of
   C. Now ``strategies.cohorts.refuse_shared_memory`` refuses a cohort whose updates share
   memory (one tensor, or views of the same entries) before its noise is drawn (``the updates
   of users 3 and 5 are held in the same memory``); nothing is charged, the round runs again;
   rows or columns of one stacked tensor are distinct updates and are summed.
4. A task whose ``private_evaluation_users()`` returns NumPy's counts (``(np.int64(0),
   np.int64(10))``, as a task computing them with ``np.isin(...).sum()`` does; a task's hook
   returning NumPy scalars, as ``num_users`` may). Before: refused as ``must return (private,
   evaluated) with 0 <= private <= evaluated, got (np.int64(0), np.int64(10))``, so ``tune``
   ended rc 2 on valid counts. Now ``models.task.private_evaluation_users`` takes integral
   values as plain ints (``operator.index``: an int subclass' stored value); a list, bools and
   negative counts are refused as before.
5. A task's own ``cohort_trainer`` on the fast engine (``UserTrainer``, in process) that trains
   a chunk's users one by one into one vector it reuses and gives ``split()`` as a list of
   ``(user, work)`` pairs (api 3 through a cohort trainer). Before: every pair of the list
   held the one vector, which held the chunk's last user's update when each was summed: that
   update was summed once for every user of the chunk (a sensitivity of chunk x C under a
   charge of C). Now
   ``simulation.fast_trainer._refuse_one_workspace`` refuses a listed batch whose pairs share
   memory (``strategies.cohorts.refuse_shared_memory``); a generator ``split()`` reusing
   its memory from one pair to the next, and rows of one workspace, are summed as before.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
import torch

from fedprivopt.clients import LocalTrainer, noise_generator, privatize_update
from fedprivopt.models import build_task, initial_flat
from fedprivopt.models.task import TaskError, private_evaluation_users
from fedprivopt.privacy import RngFactory
from fedprivopt.simulation.fast_trainer import UserTrainer
from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
)

# -- finding 1: a mapping of one's own whose items() reuses one workspace ---------------------


class _Workspace(Mapping):
    """Trains a user when it is read, into one tensor it reuses: the last user moves by 1."""

    def __init__(self, users):
        self.users = list(users)
        self.work = torch.zeros(4)

    def __getitem__(self, user):
        self.work.fill_(1.0 if user == self.users[-1] else 0.0)
        return self.work

    def __iter__(self):
        return iter(self.users)

    def __len__(self):
        return len(self.users)


def _honest(request):
    last = request.users[-1]
    return {u: torch.full((4,), 1.0 if u == last else 0.0) for u in request.users}


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp"])
def test_1_a_mapping_reusing_its_workspace_sums_each_user_once(strategy):
    config = _config(strategy=strategy, **{"noise-multiplier": 1e-6})
    honest = drive_round(build_algorithm(config, torch.zeros(4)), 1, _honest)
    lazy = drive_round(build_algorithm(config, torch.zeros(4)), 1, lambda r: _Workspace(r.users))
    assert torch.equal(lazy.params, honest.params)
    assert float(lazy.params.max()) < 0.1  # 0.45 before: the last user summed nine times


def test_1_aggregate_of_a_mapping_reusing_its_workspace():
    config = _config(**{"noise-multiplier": 1e-6})
    alg, other = build_algorithm(config, torch.zeros(4)), build_algorithm(config, torch.zeros(4))
    users = alg.sample(1)
    lazy = alg.aggregate(1, _Workspace(users), cohort=users)
    last = users[-1]
    plain = {u: torch.full((4,), 1.0 if u == last else 0.0) for u in users}
    honest = other.aggregate(1, plain, cohort=users)
    assert torch.equal(lazy.delta_tilde, honest.delta_tilde)


# -- finding 2: privatize_update returned the caller's own tensor -----------------------------


@pytest.mark.parametrize("clip_norm", [1.0, None])
def test_2_privatize_update_sends_memory_of_its_own(clip_norm):
    work = torch.zeros(3)  # the loop's workspace, reused for every user's delta
    sent = {}
    for user, local in enumerate([0.1, 0.2, 0.3]):
        torch.sub(torch.full((3,), local), torch.zeros(3), out=work)
        sent[user] = privatize_update(work, clip_norm=clip_norm).vector
    assert [round(float(v[0]), 6) for v in sent.values()] == [0.1, 0.2, 0.3]


def test_2_privatize_update_with_a_share_and_a_clipped_update_unchanged():
    update = torch.full((4,), 3.0)
    out = privatize_update(update, clip_norm=1.0)
    assert out.clipped and abs(float(out.vector.norm()) - 1.0) < 1e-6
    gen = noise_generator(seed=1, secure=False, round_num=1, user_id=0)
    noised = privatize_update(torch.full((4,), 0.1), clip_norm=1.0, noise_std=0.5, generator=gen)
    again = noise_generator(seed=1, secure=False, round_num=1, user_id=0)
    expected = torch.full((4,), 0.1) + 0.5 * torch.randn(4, generator=again)
    assert torch.allclose(noised.vector, expected)


# -- finding 3: a plain dict whose values are one reused workspace ----------------------------


def _one_workspace(request):
    work, out = torch.zeros(4), {}
    for user in request.users:
        work.fill_(1.0 if user == request.users[-1] else 0.0)  # this user's training
        out[user] = work
    return out


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp"])
def test_3_a_dict_of_one_workspace_is_refused_and_the_round_runs_again(strategy):
    config = _config(strategy=strategy, **{"noise-multiplier": 1e-6})
    alg = build_algorithm(config, torch.zeros(4))
    with pytest.raises(ValueError, match="held in the same memory"):
        drive_round(alg, 1, _one_workspace)
    assert alg.epsilon() == 0.0 and alg.round_num == 0
    again = drive_round(alg, 1, _honest)
    honest = drive_round(build_algorithm(config, torch.zeros(4)), 1, _honest)
    assert torch.equal(again.params, honest.params)


def test_3_aggregate_of_one_workspace_is_refused_uncharged():
    alg = build_algorithm(_config(), torch.zeros(4))
    users = alg.sample(1)
    work = torch.full((4,), 0.1)
    with pytest.raises(ValueError, match="held in the same memory"):
        alg.aggregate(1, {u: work for u in users}, cohort=users)
    views = {u: work.view(2, 2).view(-1) for u in users}  # views of the same entries
    with pytest.raises(ValueError, match="held in the same memory"):
        alg.aggregate(1, views, cohort=users)
    assert alg.epsilon() == 0.0


def test_3_rows_and_columns_of_one_tensor_are_distinct_updates():
    config = _config(**{"noise-multiplier": 1e-6})
    alg, other = build_algorithm(config, torch.zeros(4)), build_algorithm(config, torch.zeros(4))
    users = alg.sample(1)
    rows = torch.full((len(users), 4), 0.1)
    by_rows = alg.aggregate(1, {u: rows[i] for i, u in enumerate(users)}, cohort=users)
    cols = torch.full((4, len(users)), 0.1)
    by_cols = other.aggregate(1, {u: cols[:, i] for i, u in enumerate(users)}, cohort=users)
    assert by_rows.metrics["accepted"] == by_cols.metrics["accepted"] == len(users)
    assert torch.equal(by_rows.delta_tilde, by_cols.delta_tilde)


# -- finding 4: NumPy counts from private_evaluation_users() ----------------------------------


class _Counts:
    def __init__(self, value):
        self.value = value

    def private_evaluation_users(self):
        return self.value


def test_4_numpy_counts_of_evaluation_users_are_taken_as_ints():
    got = private_evaluation_users(_Counts((np.int64(0), np.int64(10))))
    assert got == (0, 10) and all(type(v) is int for v in got)
    assert private_evaluation_users(_Counts((np.int32(3), 5))) == (3, 5)


@pytest.mark.parametrize(
    "value", [[0, 10], (True, 10), (np.int64(-1), np.int64(3)), (5, np.int64(3)), (0.0, 10)]
)
def test_4_other_answers_stay_refused(value):
    with pytest.raises(TaskError, match="must return"):
        private_evaluation_users(_Counts(value))


# -- finding 5: a cohort trainer listing pairs of one reused vector ---------------------------


class _Listed:
    def __init__(self, pairs):
        self.pairs = pairs

    def split(self):
        return self.pairs


class _Yielded(_Listed):
    def split(self):
        yield from self.pairs()


class _OneVector:
    """A task's own cohort trainer training a chunk's users one by one into one vector."""

    def __init__(self, task, lazily=False):
        self.local, self.lazily = LocalTrainer(task, device="cpu"), lazily

    def train_batches(self, params, users, *, round_num, config, rngs, preconditioner, stream):
        work = torch.empty(params.numel(), dtype=params.dtype)

        def each():
            for user in users:
                work.copy_(
                    self.local.train(
                        params,
                        user_id=user,
                        round_num=round_num,
                        config=config,
                        rngs=rngs,
                        stream=stream,
                    ).delta
                )
                yield user, work  # fmt: skip

        yield _Yielded(each) if self.lazily else _Listed(list(each()))


def _fast_round(lazily):
    task = build_task("toy", num_users=6)
    task.cohort_trainer = lambda device, chunk_users: _OneVector(task, lazily)
    config = _config(population=6, sampling="fixed", **{"clients-per-round": 6})
    alg = build_algorithm(config, initial_flat(task))
    request = next(alg.run_round(1))
    trainer = UserTrainer(task, device="cpu", vectorize=True, chunk_users=6, secure=False)
    args = (request.users, 1, request.params, None, request.settings, "train")
    return task, request, [(u, x.clone()) for u, x in trainer.train(*args)]


def test_5_a_listed_batch_of_one_reused_vector_is_refused():
    with pytest.raises(ValueError, match="held in the same memory"):
        _fast_round(lazily=False)


def test_5_a_generator_split_reusing_its_vector_is_summed_right():
    task, request, pairs = _fast_round(lazily=True)
    local = LocalTrainer(task, device="cpu")
    rngs = RngFactory(seed=request.settings.seed)
    for user, update in pairs:
        own = local.train(
            request.params, user_id=user, round_num=1, config=request.settings.local, rngs=rngs
        ).delta
        assert torch.equal(update, own), user
