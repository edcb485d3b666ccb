"""Issue 15, follow-up of the forty-first hostile review (privacy: today's api and wire fixes).

1. Variants of api 1 (``aggregation.foreign_tensor``, which rejects an update of a
   ``torch.Tensor`` subclass): a ``drive_round`` train callback (or a task's ``cohort_trainer``
   on the fast engine) returning a ``RowSparse`` subclass of its own that applies a scale in
   its ``add_to`` (values 0.01, scale 10,000), a plain ``RowSparse`` whose instance carries
   its own ``to`` and ``add_to``, or a plain tensor (every entry 100, C = 1) whose instance
   carries its own ``to`` returning a subclass that reads its norm as 0.001. Before: each was
   measured as one vector and summed as another: the dp-fedavg model at 90 where 0.9 is the
   most (tree aggregation 100), charged as a sum of sensitivity C; a streamed cohort of such
   updates alike. Now ``aggregation.own_update`` gives the aggregator a fresh ``RowSparse``,
   ``RowSparseBatch`` or tensor of the parts read once (``torch.Tensor.detach`` itself), and
   refuses a subclass of the first two (rejected alone; a streamed cohort refused before its
   noise). Plain tensors, ``torch.nn.Parameter`` and plain row-sparse updates give the model
   they gave before, bit for bit.
2. Api 4's twin: ``LocalTrainer.train`` (what a ``drive_round`` callback trains users with)
   called inside ``torch.no_grad()`` or ``torch.inference_mode()`` (server code that needs no
   gradients, where api 4 lets ``drive_round`` run). Before: every user ended in a
   ``TaskError`` blaming the task: ``ToyClassificationTask.loss() must return ... that does
   not require grad (not computed from the model parameters)``. Now the trainer takes its
   gradients whatever the caller's mode (``LocalTrainer.train`` runs with grad enabled,
   outside inference mode): the update equals the one trained outside, bit for bit, and
   rounds driven inside ``torch.inference_mode()`` give the model and epsilon of rounds driven
   outside.
3. Api 5's variant (the keys of the updates): a ``drive_round`` train callback (or a caller of
   ``alg.aggregate(1, updates, cohort=c)``) keying each update by an ``int`` subclass whose
   value is a user the round did not sample, but which compares and hashes as a sampled one
   (dp-fedavg, secure, tree aggregation, ADADP). Before: the cohort check (``u in asked``)
   took it as the sampled user and the aggregator summed it under its int value: 9 (tree and
   secure: 10) unsampled users accepted, outside the sampling the accountant charges. Now the
   keys are their ``int`` values (``check_int``) before any check: each is rejected as not in
   the round's cohort.
4. Wire 1's twin of 3: ``clients.reply_updates(message, updates)`` (a ClientApp of one's own;
   the message asks for user 1) with the update keyed by an ``int`` subclass of value 5 that
   compares and hashes as user 1. Before: it passed wire 1's check of the asked users and was
   sent as ``update/5``, an unsampled user's update leaving the node. Now the check reads the
   key's ``int`` value, which the reply's key holds (``messages._Asked.check``): ``ValueError``
   naming ``updates[5]``.
5. Api 1's refusal of a streamed cohort, for a batch of no users: a task's ``cohort_trainer``
   yielding a ``RowSparseBatch`` of no users (a chunk where nobody had examples) whose empty
   values are a tensor subclass. Before: ``IndexError: tuple index out of range`` from the
   refusal's own message (``users[0]``), a traceback. Now ``ValueError`` naming the batch of no
   users and its reason; nothing released or charged.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from fedprivopt import wire as P
from fedprivopt.clients import LocalTrainer
from fedprivopt.clients.messages import reply_updates
from fedprivopt.core.local import LocalConfig
from fedprivopt.models import build_task, initial_flat
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.privacy.sparse import RowSparse, RowSparseBatch
from fedprivopt.simulation.fast import make_cohort_train
from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.config import StrategyConfig
from fedprivopt.strategies.core import drive_round
from tests.messages import delivered
from tests.reliability.test_fortyfirst_review_api import _Lying


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)  # absl's RDP warnings at q = 0.25
    yield
    logging.disable(logging.NOTSET)


def _config(**changes) -> StrategyConfig:
    values = {"strategy": "dp-fedavg", "population": 40, "clients-per-round": 10,
              "num-server-rounds": 5, "noise-multiplier": 0.5, "delta": 1e-4, "seed": 0,
              **changes}  # fmt: skip
    return StrategyConfig.from_mapping(values)


# -- finding 1: an update measured as one vector and summed as another ----------------------


@dataclasses.dataclass(frozen=True)
class _Scaled(RowSparse):
    """A row-sparse update of one's own: ``scale`` times its values."""

    scale: float = 1.0

    def to(self, device):
        return _Scaled(self.rows.to(device), self.values.to(device), self.length, self.scale)

    def add_to(self, total, alpha=1.0):
        super().add_to(total, alpha * self.scale)


def _scaled(user):
    return _Scaled(torch.tensor([0]), torch.full((1, 4), 0.01), 4, 10_000.0)


def _own_methods(user):
    update = RowSparse(torch.tensor([0]), torch.full((1, 4), 0.01), 4)
    object.__setattr__(update, "to", lambda device: update)
    object.__setattr__(update, "add_to", lambda total, alpha=1.0: total.add_(100.0))
    return update


def _own_to(user):
    update = torch.full((4,), 100.0)
    update.to = lambda *args, **kwargs: update.as_subclass(_Lying)
    return update


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("make", [_scaled, _own_methods, _own_to])
def test_1_an_update_summed_otherwise_than_measured_is_not_summed_unclipped(make, tree):
    changes = {"noise-mechanism": "tree"} if tree else {}
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    result = drive_round(alg, 1, lambda request: {u: make(u) for u in request.users})
    assert float(alg.params.abs().max()) < 1.0  # was 90 (tree 100)
    if make is _scaled:  # the others are rebuilt of their parts: clipped as measured
        assert result.metrics["accepted"] == 0.0


def _plain_updates(request, kind):
    if kind == "dense":
        return {u: torch.full((4,), 0.1 + u / 100) for u in request.users}
    if kind == "parameter":
        return {u: torch.nn.Parameter(torch.full((4,), 0.1 + u / 100)) for u in request.users}
    return {
        u: RowSparse(torch.tensor([0, 1]), torch.full((2, 2), 0.1 + u / 100), 4)
        for u in request.users
    }


@pytest.mark.parametrize("kind", ["parameter", "sparse"])
def test_1_plain_updates_give_the_model_they_gave(kind):
    dense = build_algorithm(_config(), torch.zeros(4))
    other = build_algorithm(_config(), torch.zeros(4))
    for r in (1, 2):
        drive_round(dense, r, lambda request: _plain_updates(request, "dense"))
        drive_round(other, r, lambda request: _plain_updates(request, kind))
    assert torch.equal(dense.params, other.params) and dense.epsilon() == other.epsilon()


class _Batches:
    """A task's own cohort trainer yielding what ``make(user, delta)`` makes of each update."""

    def __init__(self, task, make):
        self.local, self.make = LocalTrainer(task, device="cpu"), make

    def train_batches(self, params, users, *, round_num, config, rngs, preconditioner, stream):
        for user in users:
            delta = self.local.train(
                params, user_id=user, round_num=round_num, config=config, rngs=rngs, stream=stream
            ).delta
            yield self.make(user, delta)


class _Pairs:
    def __init__(self, pairs):
        self.pairs, self.users, self.norms = pairs, [u for u, _ in pairs], [0.0] * len(pairs)

    def split(self):
        return self.pairs


class _SameRow(RowSparseBatch):
    """A batch of one's own that finds no fault in its rows (row 0, 1,000 times over)."""

    def user_problems(self, dim):
        return [None] * len(self.users)


def _sparse_batch(user, delta, kind):
    if kind == "batch subclass":  # measured as 1,000 rows of norm 0.001: 0.03; summed as 1.0
        rows, values = torch.zeros(1000, dtype=torch.int64), torch.full((1000, 3), 0.001)
        return _SameRow((user,), rows, values, torch.tensor([0, 1000]), delta.numel())
    rows = torch.arange(delta.numel() // 3)
    return _Pairs([(user, _Scaled(rows, torch.full((rows.numel(), 3), 1e-4), 33, 1e6))])


@pytest.mark.parametrize("kind", ["RowSparse subclass", "batch subclass"])
def test_1_a_cohort_trainer_yielding_a_row_sparse_subclass_is_refused(kind):
    task = build_task("toy", num_users=12)
    task.cohort_trainer = lambda device, chunk_users: _Batches(
        task, lambda u, d: _sparse_batch(u, d, kind)
    )
    config = _config(population=12, sampling="fixed", **{"clients-per-round": 12})
    alg = build_algorithm(config, initial_flat(task))
    with pytest.raises(
        ValueError, match=r"streamed update of user 0 is a _(Scaled|SameRow) \(a subclass"
    ):
        drive_round(alg, 1, make_cohort_train(task, device="cpu"))
    assert alg.accountant.num_events == 0 and alg.round_num == 0


# -- finding 2: the trainer called inside torch.no_grad() or torch.inference_mode() ---------


def _local_train(trainer, request):
    local = request.settings.local
    rngs = RngFactory(seed=request.settings.seed)
    return {
        u: trainer.train(request.params, user_id=u, round_num=request.round_num, config=local,
                         rngs=rngs, stream=request.stream).delta
        for u in request.users
    }  # fmt: skip


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_2_the_trainer_takes_its_gradients_in_any_mode(mode):
    task = build_task("toy", num_users=12)
    trainer = LocalTrainer(task, device="cpu")
    config = LocalConfig(learning_rate=0.1, epochs=1, batch_size=8, clip_norm=1.0)
    kwargs = {"user_id": 3, "round_num": 1, "config": config, "stream": "train"}
    plain = trainer.train(initial_flat(task), rngs=RngFactory(seed=0), **kwargs).delta
    with mode():
        inside = trainer.train(initial_flat(task), rngs=RngFactory(seed=0), **kwargs).delta
    assert torch.equal(inside, plain)  # was TaskError: ... loss() ... does not require grad
    strategy = _config(population=12, **{"clients-per-round": 4, "local-learning-rate": 0.1})
    inside_alg = build_algorithm(strategy, initial_flat(task))
    outside_alg = build_algorithm(strategy, initial_flat(task))
    with mode():
        drive_round(inside_alg, 1, lambda request: _local_train(trainer, request))
    drive_round(outside_alg, 1, lambda request: _local_train(trainer, request))
    assert torch.equal(inside_alg.params, outside_alg.params)
    assert inside_alg.epsilon() == outside_alg.epsilon()


# -- finding 3: a user id of an int subclass that compares as a sampled user ----------------


class _AsUser(int):
    """A user id whose value is one user and whose comparisons are another's."""

    def __new__(cls, value, as_user):
        made = super().__new__(cls, value)
        made.as_user = as_user
        return made

    def __eq__(self, other):
        return other == self.as_user

    def __hash__(self):
        return hash(self.as_user)


def _unsampled(request):
    outside = [u for u in range(40) if u not in request.users]
    pairs = zip(outside[: len(request.users)], request.users, strict=True)
    return {_AsUser(o, s): torch.full((4,), 0.1) for o, s in pairs}


@pytest.mark.parametrize(
    "changes",
    [{}, {"secure": True}, {"noise-mechanism": "tree"}, {"strategy": "dp-fedavg-adadp"}],
)
def test_3_a_key_that_compares_as_a_sampled_user_is_not_summed(changes):
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    result = drive_round(alg, 1, _unsampled)
    metrics = result.metrics
    assert metrics.get("accepted", metrics.get("accepted_1")) == 0.0  # was 9 (tree, secure 10)
    assert set(result.rejected.values()) == {"not in the round's cohort"}
    other = build_algorithm(_config(**changes), torch.zeros(4))
    cohort = other.sample(1)
    request = type("R", (), {"users": cohort})
    agg = other.aggregate(1, _unsampled(request), cohort=cohort)
    assert agg.metrics["accepted"] == 0.0


# -- finding 4: a reply's user id of an int subclass that compares as an asked user ---------


def test_4_a_reply_key_that_compares_as_an_asked_user_is_refused():
    from flwr.app import ArrayRecord

    settings = P.ClientSettings(LocalConfig(learning_rate=0.1, clip_norm=1.0), seed=0)
    config = P.encode_train_config(users=[1], round_num=1, settings=settings)
    arrays = ArrayRecord({"w": torch.zeros(5)})
    message = delivered({P.CONFIG_RECORD: config, P.ARRAYS_RECORD: arrays}, "train")
    with pytest.raises(ValueError, match=r"updates\[5\]: the message did not ask for user 5"):
        reply_updates(message, {_AsUser(5, 1): torch.zeros(5)})  # was sent as update/5
    assert "update/1" in reply_updates(message, {1: torch.zeros(5)}).content


# -- finding 5: a streamed batch of no users holding a tensor subclass ----------------------


def test_5_a_streamed_batch_of_no_users_is_refused_in_one_line():
    def empty(user, delta):
        values = torch.zeros(0, 3).as_subclass(_Lying)
        return RowSparseBatch((), torch.zeros(0, dtype=torch.int64), values, torch.tensor([0]), 33)

    task = build_task("toy", num_users=12)
    task.cohort_trainer = lambda device, chunk_users: _Batches(task, empty)
    config = _config(population=12, sampling="fixed", **{"clients-per-round": 12})
    alg = build_algorithm(config, initial_flat(task))
    with pytest.raises(ValueError, match=r"streamed batch \(of no users\) is a _Lying"):
        drive_round(alg, 1, make_cohort_train(task, device="cpu"))  # was IndexError
    assert alg.accountant.num_events == 0 and alg.round_num == 0
