"""Issue 15, forty-first hostile review (api: the documented Python API): tests.

1. A ``drive_round`` train callback (or a task's own ``cohort_trainer`` on the fast engine)
   returning its updates as instances of a ``torch.Tensor`` subclass with a
   ``__torch_function__`` of its own (a tracking or wrapper tensor; here one whose norm reads
   0.001), every entry 100 (norm 200, C = 1). Before: the server measured the norm through the
   subclass and summed the updates unclipped: the model moved by 90 (dp-fedavg, 9 users over a
   fixed denominator of 10: at most 0.9 is possible), 100 under tree aggregation and on the fast
   engine, charged as a sum of sensitivity C (epsilon 7.55). Now an update of a tensor subclass
   (also in a ``RowSparse`` update or batch) is rejected alone, as a malformed one
   (``aggregation.foreign_tensor``), and a streamed cohort holding one is refused before its
   noise is drawn; ``torch.nn.Parameter`` is taken as before.
2. ``agg = alg.aggregate(1, updates, cohort=alg.sample(1))`` (a caller's own aggregation: the
   noised mean released and charged, the round not finished), ``state = alg.state_dict()``,
   then ``other.load_state_dict(state)`` in a fresh algorithm of the same configuration and
   ``other.aggregate(1, ...)`` without the cohort's first user (dp-fedavg and ADADP, seeded).
   Before: taken; the same seeded noise, so the two released means differed by that user's
   clipped update over the denominator exactly (0.01 in every entry), charged as two
   independent releases. Now the state carries the noised sums of unfinished rounds
   (``state_dict()["begun"]``, ``AlgorithmState._begun_state``) and the loaded algorithm
   refuses them again (``round 1 was begun already``), as the algorithm that computed them
   does; round 2 runs; states saved between rounds are unchanged.
3. A task whose float32 model holds an ``int64`` buffer beyond float32's exact integers (a
   hashing seed ``2**40 + 1`` its forward reads). Before: the float32 flat vector rounded it,
   so every user's model and the evaluated one held ``2**40`` (rc 0) where buffers keep their
   ``build_model()`` values. Now ``task.refuse_inexact_entries`` (called by ``model_spec``,
   ``initial_flat`` and ``LocalTrainer``) refuses it naming the entry (``TaskError``; from the
   command line rc 2, one line); small integer buffers (a batch norm's counter) pass.
4. ``drive_round(alg, r, train)`` called inside ``torch.inference_mode()`` (server code that
   needs no gradients; dp-fedavg, ADADP, DP2, DP-FedAdam). Before: every round ended in torch's
   ``RuntimeError: Inference tensors do not track version counter`` (the request's copies were
   inference tensors). Now the copies are made outside inference mode
   (``core.new_request``): the rounds give the model and epsilon of the same rounds driven
   outside it, and a callback that writes ``request.params`` in place and puts it back is
   still refused.
5. ``alg.aggregate(1, updates, cohort=c)`` (or a ``drive_round`` callback) with a mapping of
   one's own whose ``items()`` yields a user twice, or with a key that is no user id
   (``{3: u, "a": v}``, ``None``, a tuple). Before: ``sorted(updates.items())`` compared the two
   updates of the user (torch's ``RuntimeError: Boolean value of Tensor with more than one
   value is ambiguous``) or keys of two types (``'<' not supported between instances of 'str'
   and 'int'``), and with ``cohort=`` ``int('a')`` raised ``invalid literal for int()``. Now the
   pairs are sorted by user only (``aggregation._user_order``): a user twice gets the
   aggregator's ``user 0 appears twice``, an odd key ``updates key (a user id) must be an
   integer``; nothing released or charged.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch

from fedprivopt.clients import LocalTrainer
from fedprivopt.models import build_task, initial_flat, model_spec
from fedprivopt.models.task import TaskError
from fedprivopt.simulation.fast import make_cohort_train
from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_fortieth_review_api import _Pairs
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
    _train,
)

# -- finding 1: an update of a tensor subclass that measures its own norm ---------------------


class _Lying(torch.Tensor):
    """A tensor subclass whose norm reads 0.001 whatever it holds."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        if func in (torch.linalg.vector_norm, torch.Tensor.norm, torch.norm):
            return out * 0 + 0.001
        return out


def _large(request):
    return {u: torch.full((4,), 100.0).as_subclass(_Lying) for u in request.users}


@pytest.mark.parametrize(
    "changes", [{}, {"noise-mechanism": "tree"}, {"strategy": "dp-fedavg-adadp"}]
)
def test_1_an_update_of_a_tensor_subclass_is_not_summed_unclipped(changes):
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    result = drive_round(alg, 1, _large)
    assert float(alg.params.abs().max()) < 1.0  # was 90 (tree 100)
    metrics = result.metrics
    assert metrics.get("accepted", metrics.get("accepted_1")) == 0.0
    honest = build_algorithm(_config(**changes), torch.zeros(4))
    drive_round(honest, 1, lambda r: {u: torch.nn.Parameter(x) for u, x in _train(r).items()})
    assert result.metrics.get("rejected", result.metrics.get("rejected_1")) > 0
    assert float(honest.params.abs().max()) > 0.0


class _LyingTrainer:
    def __init__(self, task):
        self.local = LocalTrainer(task, device="cpu")

    def train_batches(self, params, users, *, round_num, config, rngs, preconditioner, stream):
        for user in users:
            delta = self.local.train(
                params, user_id=user, round_num=round_num, config=config, rngs=rngs, stream=stream
            ).delta
            yield _Pairs([(user, (delta * 0 + 100).as_subclass(_Lying))])


def test_1_a_cohort_trainer_yielding_a_tensor_subclass_is_refused():
    task = build_task("toy", num_users=12)
    task.cohort_trainer = lambda device, chunk_users: _LyingTrainer(task)
    alg = build_algorithm(_config(population=12, sampling="fixed", **{"clients-per-round": 12}),
                          initial_flat(task))  # fmt: skip
    with pytest.raises(ValueError, match=r"user 0 is a _Lying \(a torch.Tensor subclass"):
        drive_round(alg, 1, make_cohort_train(task, device="cpu"))  # was released: 100
    assert alg.accountant.num_events == 0 and alg.round_num == 0


# -- finding 2: a state saved after a caller's aggregate, loaded into another algorithm ------


@pytest.mark.parametrize("changes", [{}, {"strategy": "dp-fedavg-adadp"}])
def test_2_a_sum_released_before_the_state_was_saved_is_not_computed_again(changes):
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    cohort = alg.sample(1)
    alg.aggregate(1, {u: torch.full((4,), 0.1) for u in cohort}, cohort=cohort)
    state = alg.state_dict()
    assert state["begun"] == [[1, ""]]
    other = build_algorithm(_config(**changes), torch.zeros(4))
    other.load_state_dict(state)
    events = other.accountant.num_events
    fewer = {u: torch.full((4,), 0.1) for u in cohort[1:]}
    with pytest.raises(ValueError, match=r"round 1 was begun already"):
        other.aggregate(1, fewer, cohort=cohort)  # was taken: the difference 0.01 unnoised
    assert other.accountant.num_events == events
    drive_round(other, 2, _train)
    assert "begun" not in other.state_dict()
    with pytest.raises(ValueError, match=r"checkpoint's begun"):
        build_algorithm(_config(**changes), torch.zeros(4)).load_state_dict(
            {**state, "begun": [[0, ""]]}
        )


# -- finding 3: an integer buffer the float32 flat vector cannot hold ------------------------


class _Hashing(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
        self.register_buffer("seed", torch.tensor(seed, dtype=torch.int64))
        self.norm = torch.nn.BatchNorm1d(2)  # an int64 counter of small values

    def forward(self, x):
        return self.norm(self.lin(x)) * float(self.seed % 7)


def _hashing_task(seed):
    task = build_task("toy", num_users=4)
    task.build_model = lambda: _Hashing(seed)
    return task


def test_3_an_integer_buffer_the_flat_dtype_rounds_is_refused():
    task = _hashing_task(2**40 + 1)
    for call in (model_spec, initial_flat, lambda t: LocalTrainer(t, device="cpu")):
        with pytest.raises(
            TaskError, match=r"entry 'seed' holding 1099511627777,.*would be 1099511627776"
        ):
            call(task)  # was taken: the buffer 2**40 in every model
    assert model_spec(_hashing_task(2**24)).numel == 20  # 2**24 and the counter pass


# -- finding 4: rounds driven inside torch.inference_mode ------------------------------------


def _writes_and_restores(request):
    start = request.params.clone()
    request.params.add_(1.0)
    out = _train(request)
    request.params.copy_(start)
    return out


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp", "dp2", "dp-fedadam"])
def test_4_rounds_driven_in_inference_mode(strategy):
    alg = build_algorithm(_config(strategy=strategy), torch.zeros(4))
    plain = build_algorithm(_config(strategy=strategy), torch.zeros(4))
    with torch.inference_mode():
        for r in (1, 2):
            drive_round(alg, r, _train)  # was RuntimeError: ... do not track version counter
    for r in (1, 2, 3):
        drive_round(plain, r, _train)
    drive_round(alg, 3, _train)
    assert torch.equal(alg.params, plain.params) and alg.epsilon() == plain.epsilon()
    with torch.inference_mode(), pytest.raises(ValueError, match=r"changed request.params"):
        drive_round(alg, 4, _writes_and_restores)


# -- finding 5: a mapping yielding a user twice, keys that are no user ids -------------------


class _Pairs5(Mapping):
    """A mapping of one's own whose ``items()`` gives its pairs as they are (a user twice)."""

    def __init__(self, pairs):
        self.pairs = pairs

    def __getitem__(self, key):
        return dict(self.pairs)[key]

    def __iter__(self):
        return iter([u for u, _ in self.pairs])

    def __len__(self):
        return len(self.pairs)

    def items(self):
        return list(self.pairs)


def test_5_a_user_twice_or_an_odd_key_is_refused_naming_it():
    alg = build_algorithm(_config(), torch.zeros(4))
    cohort = alg.sample(1)
    twice = _Pairs5([(cohort[0], torch.full((4,), 0.5)), (cohort[0], torch.full((4,), 0.5))])
    for kwargs in ({}, {"cohort": cohort}):
        with pytest.raises(ValueError, match=r"user \d+ appears twice"):
            alg.aggregate(1, twice, **kwargs)  # was RuntimeError: Boolean value of Tensor ...
    for odd in ("a", None, (1, 2)):
        updates = {cohort[0]: torch.ones(4), odd: torch.ones(4)}
        with pytest.raises(ValueError, match=r"updates key \(a user id\) must be an integer"):
            alg.aggregate(1, updates, cohort=cohort)  # was '<' not supported ...
    assert alg.accountant.num_events == 0
    alg.aggregate(1, {u: torch.full((4,), 0.1) for u in cohort}, cohort=cohort)
    assert alg.accountant.num_events == 1
