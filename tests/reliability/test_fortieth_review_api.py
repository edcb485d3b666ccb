"""Issue 15, fortieth hostile review (api: the documented Python API): tests.

1. An algorithm that went on to round 2 after round 1 was refused (a ``drive_round`` train
   callback that changed ``request.params`` in place: nothing of round 1 released), then
   ``load_state_dict`` of a state that is refused after its accountant was read (another
   run's round-1 state whose accountant holds no event). Before: the rollback to the
   algorithm's own state ran every check again, and that state's round checks fail (1 update
   and 1 round's events at round 2), so the rollback raised half done: the refused state's
   accountant was kept, ``epsilon()`` 0.0 where 7.55 was spent, and the error named the
   optimizer's count (``count = 1 updates, its model is at round 2``) instead of what was
   refused. Now the rollback puts the algorithm's own state back without those checks
   (``AlgorithmState._load_state(verify=False)``): the error is the accountant's and epsilon
   stays 7.55.
2. ``s0 = alg.state_dict()``, three rounds driven (dp-fedavg, sigma 0.5, q 0.25; also secure
   mode, ADADP and tree aggregation), then ``alg.load_state_dict(s0)`` into the same
   algorithm and the rounds driven again. Before: taken; ``epsilon()`` fell from 12.17 to 0.0,
   and after the three rounds again it said 12.17 where six noised sums were released (seeded,
   with other updates: the first releases' noise again, their difference without noise). Now
   a state whose accountant holds fewer of an event than the algorithm's is refused, the
   algorithm left as it was (``AlgorithmState._refuse_fewer_events``: ``this algorithm's
   accountant records 3 privacy events of its rounds, the state's (round 0) 0 ...``); a state
   of as many events or more (a resumed copy, a later round) is taken as before.
3. A task's own ``cohort_trainer`` whose batches' ``split()`` give views of a workspace it
   reuses for the next chunk (the fast engine documents a batch as valid until the next entry
   is requested; the tag trainer reuses its memory so) run with ``fast-actors``, whose shards
   return ``UserTrainer.train_list``. Before: in process the round was right, but the list
   held each dense update as a view, so the users of every chunk but the last got the last
   chunk's updates (toy, 6 users in chunks of 2: users 4 and 5 summed three times each, a
   sensitivity of 3C under a charge of C, users 0-3 not summed). Now ``train_list`` gives
   every update its own copy (``fast_trainer._owned``), as it did for row-sparse batches.
   (In process, without Ray: ``train_list`` is what a shard returns.)
4. ``alg.aggregate_in_round(r, updates, cohort=users)`` for rounds 1-5, the public method
   DESIGN.md names as a round's aggregation step (the thirty-ninth review's api 2 through its
   other entry point). Before: five noised means returned, ``epsilon()`` 0.0. Now the
   uncharged aggregation is private (``_aggregate_in_round``, what ``run_round`` charges when
   the round finishes); every public method that returns a cohort's noised mean charges it.
5. A ``drive_round`` train callback (or ``aggregate``'s caller) returning no mapping: ``None``
   (a callback that forgot its ``return``), a list of ``(user, update)`` pairs, a generator,
   a tensor, a set (dp-fedavg, ADADP). Before: ``AttributeError: 'NoneType' object has no
   attribute 'items'`` from inside the aggregation. Now ``TypeError`` naming ``updates`` and
   what it got; nothing released, and the round runs again.
6. ``alg.aggregate(1, {u: update for u in range(40)})`` without ``cohort`` (dp-fedavg,
   population 40, q = 0.25). Before: all 40 users summed (accepted 40) under the charge of a
   round that samples a quarter of them (epsilon 7.55 reported). Now a seeded sampled round's
   ``aggregate`` without ``cohort`` takes the round's own sample (``alg.sample(r)``, the same
   at every call): 9 accepted, 31 rejected as not in the cohort, and a ``cohort=`` with users
   the round did not sample (``cohort=list(range(40))``, summed too) is refused; in secure
   mode and under tree
   aggregation, where another draw is another cohort, ``cohort=`` is required
   (``ServerAlgorithm._round_cohort``).
7. ``build_algorithm(config, params, frozen=mask)``, then the caller's ``mask`` edited in
   place (reused for another model: ``mask[3] = False``). Before: the algorithm kept the
   caller's tensor, so round 1 left the noise on the frozen coordinate (0.059 where the
   parameter keeps its initial 0.0; DP2's mean of P reads it too). Now the algorithm keeps a
   copy, as it does of the model and the side information.
8. A task's own ``cohort_trainer`` that declares ``noise_shares = True`` (it adds the
   distributed-noise shares itself) and does not add them (toy, ``dim = 200``, 603 entries,
   40 users, ``noise-mode = "distributed"``, sigma 1). Before: trusted; the round's sum was
   released with no noise (shares none, top-up none, mean norm 0.16 where honest updates have
   0.94 on the small toy), charged and reported as noised (epsilon 9.65, ``noise_std``
   0.025). Now the fast engine refuses a dense update whose norm is below what an update with
   its share has except with probability e^-50 (``fast_trainer._refuse_missing_share``,
   Laurent-Massart's chi-square bound minus C); an honest trainer adding its shares gives the
   sequential trainer's model. The same for a trainer yielding row-sparse batches
   (``RowSparseBatch``, whose rows carry no share at all).
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.clients import LocalTrainer
from fedprivopt.models import build_task, initial_flat
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.privacy.sparse import RowSparseBatch
from fedprivopt.simulation.fast import make_cohort_train
from fedprivopt.simulation.fast_trainer import UserTrainer
from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
    _train,
)


def _changes_request(request):
    """A train callback that trains on ``request.params`` in place (its round is refused)."""
    request.params.add_(1.0)
    return _train(request)


def _after_a_refused_round(**changes):
    """An algorithm whose round 1 was refused and whose round 2 was released."""
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    with pytest.raises(ValueError, match=r"round 1: the train callback"):
        drive_round(alg, 1, _changes_request)
    drive_round(alg, 2, _train)
    return alg


# -- finding 1: a refused load whose rollback could not complete ------------------------------


@pytest.mark.parametrize("changes", [{}, {"ema-decay": 0.5}, {"strategy": "dp-fedadam"}])
def test_1_a_refused_load_keeps_the_accountant_of_a_run_that_skipped_a_round(changes):
    alg = _after_a_refused_round(**changes)
    spent, params = alg.epsilon(), alg.params.clone()
    assert alg.accountant.num_events == 1 and spent > 7
    other = build_algorithm(_config(**changes), torch.zeros(4))
    drive_round(other, 1, _train)
    state = other.state_dict()
    fresh = build_algorithm(_config(**changes), torch.zeros(4))
    state["accountant"] = fresh.accountant.state_dict()
    with pytest.raises(ValueError, match=r"accountant records 0 privacy events"):
        alg.load_state_dict(state)  # the rollback raised 'count = 1 updates ...'
    assert alg.accountant.num_events == 1 and alg.epsilon() == spent  # was 0.0
    assert alg.round_num == 2 and torch.equal(alg.params, params)
    drive_round(alg, 3, _train)  # goes on from its own state
    assert alg.accountant.num_events == 2


# -- finding 2: an older state loaded into the algorithm that released the rounds after it ---


@pytest.mark.parametrize(
    "changes",
    [{}, {"secure": True}, {"strategy": "dp-fedavg-adadp"}, {"noise-mechanism": "tree"}],
)
def test_2_an_older_state_cannot_lower_what_the_algorithm_spent(changes):
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    s0 = alg.state_dict()
    for r in (1, 2, 3):
        drive_round(alg, r, _train)
    s3, spent, events = alg.state_dict(), alg.epsilon(), alg.accountant.num_events
    with pytest.raises(ValueError, match=r"accountant records \d+ privacy events of its rounds"):
        alg.load_state_dict(s0)  # was taken: epsilon 0.0
    assert alg.round_num == 3 and alg.epsilon() == spent
    assert alg.accountant.num_events == events
    alg.load_state_dict(s3)  # as many events: taken
    drive_round(alg, 4, _train)
    later = alg.state_dict()
    fresh = build_algorithm(_config(**changes), torch.zeros(4))
    fresh.load_state_dict(s3)  # into a new algorithm: taken (a documented limit, DESIGN.md)
    fresh.load_state_dict(later)  # more events: taken
    assert fresh.round_num == 4


# -- finding 3: a cohort trainer reusing its workspace, on fast-actors ------------------------


class _Views:
    """A chunk's dense updates as views of the trainer's workspace (``split()``)."""

    def __init__(self, users, workspace):
        self.users, self.workspace = users, workspace

    def split(self):
        return [(u, self.workspace[i]) for i, u in enumerate(self.users)]


class _Reusing:
    """A task's own cohort trainer that trains each chunk into the same workspace."""

    def __init__(self, task, chunk):
        self.local, self.chunk, self.workspace = LocalTrainer(task, device="cpu"), chunk, None

    def train_batches(self, params, users, *, round_num, config, rngs, preconditioner, stream):
        if self.workspace is None:
            self.workspace = torch.empty(self.chunk, params.numel(), dtype=params.dtype)
        for i in range(0, len(users), self.chunk):
            part = users[i : i + self.chunk]
            for j, user in enumerate(part):
                self.workspace[j] = self.local.train(
                    params, user_id=user, round_num=round_num, config=config, rngs=rngs,
                    stream=stream,
                ).delta  # fmt: skip
            yield _Views(part, self.workspace)


def test_3_a_shard_returns_each_user_its_own_update():
    task = build_task("toy", num_users=6)
    task.cohort_trainer = lambda device, chunk_users: _Reusing(task, 2)
    config = _config(population=6, sampling="fixed", **{"clients-per-round": 6})
    request = next(build_algorithm(config, initial_flat(task)).run_round(1))
    trainer = UserTrainer(task, device="cpu", vectorize=True, chunk_users=2, secure=False)
    args = (request.users, 1, request.params, None, request.settings, "train")
    listed, _ = trainer.train_list(*args)  # what a fast-actors shard returns
    local = LocalTrainer(task, device="cpu")
    rngs = RngFactory(seed=request.settings.seed)
    for user, update in listed:
        own = local.train(
            request.params, user_id=user, round_num=1, config=request.settings.local, rngs=rngs
        ).delta
        assert torch.equal(update, own), user  # users 0-3 had user 4's and 5's updates
    assert [u for u, _ in listed] == list(range(6))


# -- finding 4: every public aggregation charges --------------------------------------------


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp"])
def test_4_every_public_method_returning_a_noised_mean_charges_it(strategy):
    names = [n for n in dir(build_algorithm(_config(strategy=strategy), torch.zeros(4)))
             if "aggregate" in n and not n.startswith("_")]  # fmt: skip
    assert names  # ``aggregate``
    for name in names:
        alg = build_algorithm(_config(strategy=strategy), torch.zeros(4))
        users = alg.sample(1)
        agg = getattr(alg, name)(1, {u: torch.full((4,), 0.1) for u in users}, cohort=users)
        assert agg.delta_tilde.shape == (4,)
        assert alg.accountant.num_events >= 1, name  # aggregate_in_round: 0, epsilon 0.0


# -- finding 5: a train callback that returns no mapping ------------------------------------


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp"])
@pytest.mark.parametrize(
    "returned",
    [
        lambda r: None,
        lambda r: [(u, torch.full((4,), 0.1)) for u in r.users],
        lambda r: ((u, torch.full((4,), 0.1)) for u in r.users),
        lambda r: torch.zeros(4),
        lambda r: set(r.users),
    ],
)
def test_5_updates_that_are_no_mapping_are_a_type_error(strategy, returned):
    alg = build_algorithm(_config(strategy=strategy), torch.zeros(4))
    with pytest.raises(TypeError, match=r"updates must be a mapping \{user: update\}"):
        drive_round(alg, 1, returned)  # AttributeError: ... has no attribute 'items'
    assert alg.accountant.num_events == 0
    assert drive_round(alg, 1, _train).round_num == 1


# -- finding 6: aggregate without a cohort sums only the round's sample ----------------------


def test_6_aggregate_without_cohort_sums_only_the_sampled_users():
    alg = build_algorithm(_config(), torch.zeros(4))
    agg = alg.aggregate(1, {u: torch.full((4,), 0.1) for u in range(40)})
    sampled = alg.sample(1)
    assert agg.metrics["accepted"] == len(sampled) < 40  # was 40: every user summed
    assert set(agg.rejected) == set(range(40)) - set(sampled)
    ours = build_algorithm(_config(), torch.zeros(4))
    want = ours.aggregate(1, {u: torch.full((4,), 0.1) for u in sampled}, cohort=sampled)
    assert torch.equal(agg.delta_tilde, want.delta_tilde)
    every = build_algorithm(_config(), torch.zeros(4))
    with pytest.raises(ValueError, match=r"cohort holds users round 1 did not sample"):
        every.aggregate(1, {u: torch.full((4,), 0.1) for u in range(40)}, cohort=list(range(40)))
    assert every.accountant.num_events == 0


@pytest.mark.parametrize("changes", [{"secure": True}, {"noise-mechanism": "tree"}])
def test_6_aggregate_needs_the_cohort_where_a_draw_differs(changes):
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    with pytest.raises(ValueError, match=r"aggregate needs cohort="):
        alg.aggregate(1, {u: torch.full((4,), 0.1) for u in range(40)})
    assert alg.accountant.num_events == 0
    users = alg.sample(1)
    alg.aggregate(1, {u: torch.full((4,), 0.1) for u in users}, cohort=users)
    assert alg.accountant.num_events == 1


# -- finding 7: the frozen mask is the algorithm's own --------------------------------------


def test_7_editing_the_frozen_mask_after_the_build_changes_nothing():
    mask = torch.tensor([False, False, False, True])
    alg = build_algorithm(_config(), torch.zeros(4), frozen=mask)
    mask[3] = False  # the caller reuses its mask
    assert float(drive_round(alg, 1, _train).params[3]) == 0.0  # was 0.059: noise released


# -- finding 8: a cohort trainer that declares noise shares it does not add -----------------


class _Pairs:
    def __init__(self, pairs):
        self.pairs, self.users, self.norms = pairs, [u for u, _ in pairs], [0.0] * len(pairs)

    def split(self):
        return self.pairs


class _Shares:
    """A cohort trainer that declares ``noise_shares``; ``honest``: it adds them."""

    noise_shares = True

    def __init__(self, task, honest):
        self.local, self.honest = LocalTrainer(task, device="cpu"), honest

    def train_batches(self, params, users, *, round_num, config, rngs, preconditioner, stream):
        import dataclasses

        used = config if self.honest is True else dataclasses.replace(config, noise_std=0.0)
        for user in users:
            delta = self.local.train(
                params, user_id=user, round_num=round_num, config=used, rngs=rngs, stream=stream
            ).delta
            if self.honest == "sparse":  # every row of the model, without a share
                rows, ptr = torch.arange(3), torch.tensor([0, 3])
                yield RowSparseBatch([user], rows, delta.reshape(3, -1), ptr, delta.numel())
            else:
                yield _Pairs([(user, delta)])


def _distributed_round(honest):
    task = build_task("toy", num_users=12, dim=200)
    if honest is not None:
        task.cohort_trainer = lambda device, chunk_users: _Shares(task, honest)
    config = _config(population=12, sampling="fixed", **{
        "clients-per-round": 12, "noise-mode": "distributed", "noise-multiplier": 1.0})  # fmt: skip
    alg = build_algorithm(config, initial_flat(task))
    return alg, lambda: drive_round(alg, 1, make_cohort_train(task, device="cpu"))


def test_8_a_cohort_trainer_that_does_not_add_its_declared_shares_is_refused():
    alg, run = _distributed_round(honest=False)
    with pytest.raises(ValueError, match=r"declares noise_shares but user 0's update has norm"):
        run()  # was released without noise, epsilon 9.65
    assert alg.accountant.num_events == 0 and alg.round_num == 0
    _, honest = _distributed_round(honest=True)
    _, sequential = _distributed_round(honest=None)
    assert torch.equal(honest().params, sequential().params)


def test_8_a_row_sparse_cohort_trainer_that_declares_shares_is_refused():
    alg, run = _distributed_round(honest="sparse")
    with pytest.raises(ValueError, match=r"declares noise_shares but user 0's update has norm"):
        run()  # was released without noise
    assert alg.accountant.num_events == 0
