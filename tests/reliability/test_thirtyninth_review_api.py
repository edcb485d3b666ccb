"""Issue 15, thirty-ninth hostile review (api: the documented Python API): tests.

1. A trainer that trains on the global model it is given in place and puts it back before the
   thirty-eighth review's check: a task's own ``cohort_trainer`` on the fast engine
   (``make_cohort_train``, in process or on ``fast-actors``) training each user on its
   ``global_flat`` in place (``global_flat.add_``, or ``global_flat.data.add_``) and restoring it
   after its last user (``global_flat.copy_(saved)``); a ``drive_round`` train callback that
   trains a model whose parameters are views of ``request.params`` and then does
   ``request.params.copy_(start)``. Before: the check compared the request's copy after the
   whole cohort, so the round was released (toy, 6 users: rc 0, epsilon 23.8), and each user
   after the first started from the others' training (user 5's update [0.0057, 0.0100, ...]
   with user 0 in the cohort, [0.0109, 0.0256, ...] without it: the sum's sensitivity to user
   0 is no longer C). Now the fast engine's trainer trains from its own copy, compared with the
   request's before each entry reaches the aggregator (``fast_trainer._refuse_changed``: ``round
   1: the task's cohort_trainer (or its trainer) changed the global model it was given ...
   after users 0..0``), and a write put back within one entry, or by a callback, is seen by the
   tensors' version counters (``TrainRequest.changed_in``); nothing of the round is released
   and it may run again.
2. ``ServerAlgorithm.aggregate(r, updates, cohort=users)`` called by the caller itself (DESIGN.md
   names it as a round's aggregation step): it returns the noised mean of the cohort. Before:
   the accountant was not charged, so five noised sums of rounds 1-5 left ``epsilon()`` 0.0
   (dp-fedavg, sigma 0.5, q 0.25), and ``drive_round`` of a round so begun was refused without
   a charge (``round 1 was begun already``): round 2 after it gave 7.55 where the two released
   sums are 10.28. Now ``aggregate`` charges the round's events before returning (15.03 after
   five; 10.28 after round 1's sum and round 2); ``run_round`` aggregates with
   ``aggregate_in_round`` and charges when the round finishes, as before (a run's epsilon and
   model the same to the bit).
3. The same as 1 for the side information: a task's ``cohort_trainer`` under AdaDPS (DP2's
   adaptive rounds alike) that scales the ``preconditioner`` it is given by each user's
   training in place through ``.data`` (which no version counter sees) and puts it back after
   its last user. Before: released, every user after the first dividing its gradients by a
   preconditioner that held the others' training. Now the fast engine's trainer gets its own
   copy of the preconditioner too, compared before each entry (``fast_trainer._refuse_changed``:
   ``changed the preconditioner it was given``).
4. ``dp-fedavg-adadp`` (seeded): ``state = alg.state_dict()`` between the two cohorts of round 1
   (``run_round``'s second request, the half-step point, received), loaded into another
   algorithm, and round 1 driven there with one user of cohort 1 left out. Before: cohort 1's
   noise repeated, so the two released points differed by that user's clipped update without
   noise (-0.005 in every entry: lr x 0.1 / 10). Now the state carries the point
   (``state_dict()["partial"]``, ``ServerAlgorithm.partial_point``) and the redo is refused
   when its point differs (``ADADP._refuse_other_point``: ``round 1: its half-step point was
   released before this state was saved ...``); the same updates give the same point and go on.
5. A ``drive_round`` train callback that adds a user to ``request.users`` (``request.users.
   append(u)``, a user the round did not sample) and returns its update too (dp-fedavg, ADADP).
   Before: the request's list was the round's own cohort, which the aggregation accepts
   updates from (the twenty-fifth review's check), so the unsampled user was summed (accepted
   10 of a cohort of 9; model 0.1901 where 0.1801), outside the sampling the accountant
   assumes. Now a request holds a copy of the list (``TrainRequest.__post_init__``): the
   user's update is rejected as one the round did not ask for, and the model is the honest one.
6. ``dp-fedavg-adadp``: ``alg.load_state_dict(start)`` (a state of round 0) called by the train
   callback of round 1's second cohort, after the half-step point was sent. Before: the loaded
   accountant dropped the charge of that point (``charge_partial``), and round 1 ended with 1
   event charged, epsilon 2.53 where its two releases are 3.19. Now ``load_state_dict``
   refuses while a round's half-step point is charged and the round not finished (``round 1
   is in progress: its half-step point was released and charged ...``).
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.clients import LocalTrainer
from fedprivopt.models import build_task, initial_flat
from fedprivopt.simulation.fast import make_cohort_train
from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_thirtyeighth_review_api import (
    _Batch,
    _config,
    _in_place,
    _quiet,  # noqa: F401
    _train,
)

# -- finding 1: a trainer that changes the global model in place and puts it back -------------


class _Restoring:
    """A task's cohort trainer going on from each user's training in place, then restoring it.

    ``how``: ``"op"`` (``global_flat.add_``), ``"data"`` (``global_flat.data.add_``, which
    torch's version counter does not see) or ``"one-entry"`` (the whole cohort in one entry,
    put back with ``copy_`` before it is yielded).
    """

    def __init__(self, task, how):
        self.local, self.how, self.updates = LocalTrainer(task, device="cpu"), how, {}

    def train_batches(self, params, users, *, round_num, config, rngs, preconditioner, stream):
        saved, pairs = params.clone(), []
        keys = {"round_num": round_num, "config": config, "rngs": rngs, "stream": stream}
        for user in users:
            delta = self.local.train(params, user_id=user, **keys).delta
            self.updates[user] = delta
            (params.data if self.how == "data" else params).add_(delta * 50)
            if self.how != "one-entry":
                yield _Batch([(user, delta)])
            else:
                pairs.append((user, delta))
        (params.data if self.how == "data" else params).copy_(saved)
        if pairs:
            yield _Batch(pairs)


def _toy(how):
    task = build_task("toy", num_users=6)
    trainer = _Restoring(task, how)
    task.cohort_trainer = lambda device, chunk_users: trainer
    return task, trainer


def _fixed(**changes):
    return _config(population=6, sampling="fixed", **{"clients-per-round": 6, **changes})


@pytest.mark.parametrize("how", ["op", "data", "one-entry"])
def test_1_a_cohort_trainer_that_puts_its_global_model_back_is_refused(how):
    task, _ = _toy(how)
    init = initial_flat(task)
    alg = build_algorithm(_fixed(), init)
    train = make_cohort_train(task, device="cpu")  # the fast engine's, in process
    with pytest.raises(ValueError, match=r"round 1: the task's cohort_trainer .* changed the "
                       r"global model it was given .* in place"):  # fmt: skip
        drive_round(alg, 1, train)  # released (epsilon 23.8), users from the others' training
    assert torch.equal(alg.params, init) and alg.accountant.num_events == 0
    task.cohort_trainer = None  # the round runs again (here one user at a time)
    assert drive_round(alg, 1, make_cohort_train(task, device="cpu")).round_num == 1


def test_1_users_of_the_cohort_trainer_start_from_the_model_they_were_sent():
    """What the refusal prevents: user 5's update depends on user 0's data."""
    task, _ = _toy("op")
    request = next(build_algorithm(_fixed(), initial_flat(task)).run_round(1))
    updates = {}
    for users in ([0, 5], [5]):
        trainer = _Restoring(task, "op")
        params = request.params.clone()
        for _ in trainer.train_batches(
            params,
            users,
            round_num=1,
            config=request.settings.local,
            rngs=_rngs(request),
            preconditioner=None,
            stream="train",
        ):
            pass  # fmt: skip
        updates[len(users)] = trainer.updates[5]
    assert float((updates[2] - updates[1]).norm()) > 0.01  # the leak the engine now refuses


def _rngs(request):
    from fedprivopt.privacy.rng import RngFactory

    return RngFactory(seed=request.settings.seed)


def _restoring_callback(request):
    """Trains every user on views of ``request.params``, each from the last, then puts it back."""
    start = request.params.clone()
    out = {user: delta.clamp(-0.1, 0.1) for user, delta in _in_place(request).items()}
    request.params.copy_(start)
    return out


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp"])
def test_1_a_callback_that_puts_request_params_back_is_refused(strategy):
    alg = build_algorithm(_config(strategy=strategy), torch.zeros(4))
    with pytest.raises(ValueError, match=r"round 1: the train callback .* changed request.params"):
        drive_round(alg, 1, _restoring_callback)  # released
    assert alg.round_num == 0 and torch.equal(alg.params, torch.zeros(4))
    assert alg.accountant.num_events == 0
    assert drive_round(alg, 1, _train).round_num == 1


# -- finding 2: a noised mean the caller asks of aggregate() itself is charged ---------------


def test_2_aggregate_called_by_the_caller_charges_the_round():
    alg = build_algorithm(_config(), torch.zeros(4))
    users = alg.sample(1)
    alg.aggregate(1, {u: torch.full((4,), 0.1) for u in users}, cohort=users)
    assert alg.accountant.num_events == 1  # was 0: epsilon() 0.0 with the noised mean out
    with pytest.raises(ValueError, match=r"round 1 was begun already"):
        drive_round(alg, 1, _train)
    drive_round(alg, 2, _train)
    both = build_algorithm(_config(), torch.zeros(4))
    for r in (1, 2):
        drive_round(both, r, _train)
    assert alg.epsilon() == pytest.approx(both.epsilon())  # was 7.55 where 10.28
    assert both.accountant.num_events == 2  # a round the engine drives is charged once


def test_2_every_noised_mean_of_aggregate_is_charged():
    alg = build_algorithm(_config(), torch.zeros(4))
    for r in range(1, 6):
        users = alg.sample(r)
        alg.aggregate(r, {u: torch.full((4,), 0.1) for u in users}, cohort=users)
    assert alg.accountant.num_events == 5 and alg.epsilon() > 10.0  # was 0 and 0.0


# -- finding 3: the preconditioner a cohort trainer is given, changed and put back -----------


class _PreconditionerRestoring(_Restoring):
    """Scales the preconditioner by each user's update (through ``.data``), then puts it back."""

    def train_batches(self, params, users, *, round_num, config, rngs, preconditioner, stream):
        saved = preconditioner.clone()
        keys = {"round_num": round_num, "config": config, "rngs": rngs, "stream": stream}
        for user in users:
            delta = self.local.train(params, user_id=user, preconditioner=preconditioner, **keys)
            preconditioner.data.mul_(1.0 + delta.delta.abs())
            yield _Batch([(user, delta.delta)])
        preconditioner.data.copy_(saved)


def test_3_a_cohort_trainer_that_puts_the_preconditioner_back_is_refused():
    task = build_task("toy", num_users=6)
    trainer = _PreconditionerRestoring(task, "data")
    task.cohort_trainer = lambda device, chunk_users: trainer
    init = initial_flat(task)
    side = torch.ones_like(init)
    alg = build_algorithm(_fixed(strategy="adadps"), init, preconditioner=side)
    with pytest.raises(ValueError, match=r"round 1: .* changed the preconditioner it was given"):
        drive_round(alg, 1, make_cohort_train(task, device="cpu"))  # was released
    assert torch.equal(alg.params, init) and alg.accountant.num_events == 0


# -- finding 4: an ADADP state saved between the cohorts, the round redone elsewhere ---------


def _adadp():
    return build_algorithm(_config(strategy="dp-fedavg-adadp", **{"noise-multiplier": 1.0}),
                           torch.zeros(4))  # fmt: skip


def _mid_round_state():
    alg = _adadp()
    rounds = alg.run_round(1)
    first = next(rounds)
    point = rounds.send({u: torch.full((4,), 0.1) for u in first.users}).params
    return alg.state_dict(), point


def test_4_a_seeded_redo_of_a_released_half_step_point_must_release_the_same_point():
    state, point = _mid_round_state()
    assert torch.equal(state["partial"]["point"], point) and state["partial"]["round"] == 1
    alg = _adadp()
    alg.load_state_dict(state)
    rounds = alg.run_round(1)
    first = next(rounds)
    left_out = {u: torch.full((4,), 0.1) for u in first.users[1:]}
    with pytest.raises(ValueError, match=r"round 1: its half-step point was released before"):
        rounds.send(left_out)  # was released: the two points differed by -0.005 (no noise)
    same = _adadp()
    same.load_state_dict(state)
    rounds = same.run_round(1)
    first = next(rounds)
    again = rounds.send({u: torch.full((4,), 0.1) for u in first.users})
    assert torch.equal(again.params, point)  # the same release: the round goes on


def test_4_a_state_between_rounds_has_no_partial_point():
    alg = _adadp()
    drive_round(alg, 1, _train)
    assert "partial" not in alg.state_dict()
    state, _ = _mid_round_state()
    with pytest.raises(ValueError, match=r"checkpoint's partial .* must hold round 1"):
        _adadp().load_state_dict({**state, "partial": {"round": 2, "point": torch.zeros(4)}})


# -- finding 5: a user added to request.users is not summed ----------------------------------


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp"])
def test_5_a_user_added_to_request_users_is_not_summed(strategy):
    def adding(request):
        request.users.append(next(u for u in range(40) if u not in request.users))
        return _train(request)

    alg = build_algorithm(_config(strategy=strategy), torch.zeros(4))
    honest = drive_round(build_algorithm(_config(strategy=strategy), torch.zeros(4)), 1, _train)
    result = drive_round(alg, 1, adding)
    assert torch.equal(result.params, honest.params)  # was 0.1901 where 0.1801
    assert result.metrics["cohort_size"] == honest.metrics["cohort_size"]


# -- finding 6: a state loaded in the middle of an ADADP round -------------------------------


def test_6_a_state_loaded_between_the_cohorts_of_a_round_is_refused():
    alg = _adadp()
    start = alg.state_dict()

    def train(request):
        if request.stream == "train-2":
            alg.load_state_dict(start)  # dropped the half step's charge: 1 event, 2.53
        return _train(request)

    with pytest.raises(ValueError, match=r"round 1 is in progress: its half-step point"):
        drive_round(alg, 1, train)
    assert alg.accountant.num_events == 1  # the half step's charge is kept
    drive_round(alg, 2, _train)
    # between rounds, a state of round 0 would drop the 3 events charged (fortieth review, api 2)
    with pytest.raises(ValueError, match=r"records 3 privacy events of its rounds"):
        alg.load_state_dict(start)
    assert alg.round_num == 2 and alg.accountant.num_events == 3
