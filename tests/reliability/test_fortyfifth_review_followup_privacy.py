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
2. The api reviewer's row open for wire: a ClientApp of one's own (docs/FLOWER.md's loop) that
   trains every user into one workspace it reuses and stores it for each
   (``updates[user] = work``, no ``privatize_update``, or a ``clip`` of its own returning its
   buffer), then ``reply_updates(message, updates)`` (also an ``OrderedDict`` or a
   ``MappingProxyType`` of it, server or distributed noise, adaptive clipping's bits). Before:
   the reply sent the last user's update for every user (``update/1``, ``update/2``,
   ``update/3`` all 0.03): that user summed three times under a charge of C, which the server,
   decoding copies, cannot see. Now ``replies._ReadUpdates`` refuses updates read from one
   memory not written between their reads (``ValueError`` naming ``updates`` and two users,
   nothing sent); ``privatize_update``'s vectors, rows of one matrix and a mapping of one's own
   that writes each user into its workspace when read (each sent as read) as before.
3. Api 3 through another mapping: a ``drive_round`` callback (or ``aggregate``'s caller)
   training each user into one workspace and returning ``OrderedDict``, ``MappingProxyType``
   or ``UserDict`` of ``{user: work}``. Before: api 1 copied such a mapping's values as read,
   so api 3's check compared the copies: the last user's update summed once for every user
   (the model at 0.45 where 0.05; epsilon charged), where a plain ``dict`` of it is refused.
   Now ``strategies.cohorts.ReadOnce`` refuses updates read from one memory not written
   between their reads before the noise is drawn (nothing charged, the round runs again); api
   1's lazy mapping (writing its workspace before each read) summed as before.
4. The wire reviewer's row open for core/local.py: fedprivopt's ClientApp given a DP train
   message with ``local-epochs`` 10000 (``max-examples`` 0 or 20000) for a user holding more
   than 13,421 examples (toy, ``examples_per_user`` [14000, 20000]: user 0 holds 15,563).
   Before: ``epoch_orders`` raised ``... got 10000 * 15563; lower local-epochs or set
   max-examples``, which Flower sends to the server as the error reply's reason: the user's
   exact example count reached the server in a DP round, outside epsilon. Now the message
   names the limit the configuration sets alone (``at local-epochs 10000 a user may train on
   at most 13421 examples, and one holds more; ... set max-examples to at most 13421``); the
   refusal itself still says that some hosted user holds more than that.
5. Api 3's check (``strategies.cohorts.refuse_shared_memory``, every cohort read from a
   mapping and every listed batch of a cohort trainer) compared every pair of a storage's
   updates: a round of 10,000 users given as rows of one stacked matrix spent 4.9 s in it
   (0.68 s for 4,000), each round. Now one view twice by a dict and overlapping contiguous
   ranges by one sweep (0.06 s for 10,000), as the mechanisms' twin check does; the same
   refusals and acceptances (below; a mend, no test fails before).
6. Mechanisms 1's third case streamed: a ``RowSparseBatch`` whose values are one row expanded
   over its users (``row.expand(3, -1)``: a task's own cohort trainer giving the last user's
   row to the chunk), yielded by a generator (the fast engine's ``UserTrainer.train``, or a
   stream given to ``NoisyMeanAggregator.aggregate``). Before: accepted 6 of 6, each chunk's
   one row summed once for each of its 3 users (a sensitivity of 3C under a charge of C);
   only a list given to ``aggregate`` was refused. Now ``aggregate`` checks every batch it
   reads (``refuse_shared_updates([batch])``): ``ValueError`` naming two users, nothing
   released; the tag trainer's batches (rows of their own) as before.
7. Finding 6's dense twin: a dense batch whose ``split()`` is a generator giving one update
   expanded over the chunk's users (``delta.expand(3, -1)``, e.g. a chunk's mean given to
   each user). Before: accepted 6 of 6, each chunk's one update summed once for each of its
   users (api 5 let a generator ``split()`` reuse its memory between pairs, and a list of them
   only was refused). Now ``fast_trainer._Listed.refuse_shared`` refuses a batch's pairs read
   from one memory at the same version of it (not written between them), at the end of the
   batch, before the noise is drawn; a generator writing each user into its workspace before
   yielding it (api 5's) summed as before.
8. Findings 2 and 3 through a mapping of one's own whose ``__getitem__`` gives a fresh view of
   the one workspace it keeps for every user (``self.work.view(-1)``), to ``reply_updates``
   and to ``drive_round``. Before (findings 2 and 3 as first committed): a view of exactly
   its memory was kept by a weak reference, let go after its read, so the check saw one user:
   update/1, /2 and /3 all sent 0.03, the round's model 0.45 where 0.05. Now a view is kept
   (``tensor._base``): refused as finding 2 and 3 say.
"""

from __future__ import annotations

import collections
import json
import types
from collections.abc import Mapping

import pytest
import torch
from flwr.app import ArrayRecord, Context, RecordDict

from fedprivopt import wire as P
from fedprivopt.clients import TrainMessage, reply_updates
from fedprivopt.clients.client_app import app as fedprivopt_app
from fedprivopt.core.local import LocalConfig
from fedprivopt.models import build_task
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.sparse import RowSparseBatch
from fedprivopt.simulation.fast_trainer import UserTrainer
from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.cohorts import refuse_shared_memory
from fedprivopt.strategies.core import drive_round
from fedprivopt.wire import ClientSettings
from tests.messages import delivered
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
)

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


# -- finding 2: a reply of updates held in one reused workspace -------------------------------


def _train_message(users, clip_bit=False, noise_std=0.0):
    task = build_task("toy", num_users=10, dim=5, num_classes=3, seed=2)
    local = LocalConfig(learning_rate=0.1, batch_size=4, clip_norm=1.0, noise_std=noise_std,
                        clip_bit=clip_bit)  # fmt: skip
    settings = P.ClientSettings(local=local, seed=5)
    config = P.encode_train_config(users=users, round_num=2, settings=settings, stream="train")
    content = {P.ARRAYS_RECORD: ArrayRecord(task.build_model().state_dict()),
               P.CONFIG_RECORD: config}  # fmt: skip
    return delivered(content, "train")


def _sent(reply):
    content = reply.content
    return {k: float(content[k][P.DELTA_ARRAY].numpy()[0]) for k in content if k.startswith("upd")}


class _Lazy(Mapping):
    """Writes each user's update into one workspace when it is read (sent as read)."""

    def __init__(self, users, n):
        self.users, self.work = list(users), torch.zeros(n)

    def __getitem__(self, user):
        self.work.fill_(0.01 * user)
        return self.work

    def __iter__(self):
        return iter(self.users)

    def __len__(self):
        return len(self.users)


@pytest.mark.parametrize("wrap", [dict, collections.OrderedDict, types.MappingProxyType])
@pytest.mark.parametrize("noise_std", [0.0, 0.5])
def test_2_a_reply_of_one_reused_workspace_is_refused(wrap, noise_std):
    msg = _train_message([1, 2, 3], noise_std=noise_std)
    n = TrainMessage.read(msg).global_flat.numel()
    work, updates = torch.zeros(n), {}
    for user in (1, 2, 3):
        work.fill_(0.01 * user)  # this user's training, into the workspace
        updates[user] = work
    with pytest.raises(ValueError, match=f"updates: users 1 and 2 {SHARED}"):
        reply_updates(msg, wrap(updates))  # before: update/1, /2, /3 all 0.03
    views = {u: work.view(-1)[:] for u in (1, 2, 3)}  # views of the same entries
    with pytest.raises(ValueError, match=SHARED):
        reply_updates(msg, views)


def test_2_a_reply_with_clip_bits_of_one_workspace_is_refused():
    msg = _train_message([1, 2], clip_bit=True)
    work = torch.full((TrainMessage.read(msg).global_flat.numel(),), 0.02)
    with pytest.raises(ValueError, match=SHARED):
        reply_updates(msg, {1: work, 2: work}, clip_bits={1: 1.0, 2: 1.0})


def test_2_own_updates_rows_and_a_lazy_mapping_are_sent_as_before():
    msg = _train_message([1, 2, 3])
    request = TrainMessage.read(msg)
    n = request.global_flat.numel()
    work, own = torch.zeros(n), {}
    for user in (1, 2, 3):
        work.fill_(0.01 * user)
        own[user] = request.privatize(work, user).vector  # memory of its own
    rows = torch.stack([torch.full((n,), 0.01 * u) for u in (1, 2, 3)])
    for updates in (own, {u: rows[u - 1] for u in (1, 2, 3)}, _Lazy([1, 2, 3], n)):
        sent = _sent(reply_updates(msg, updates))
        assert [round(v, 6) for v in sent.values()] == [0.01, 0.02, 0.03]


# -- finding 3: api 3 through an OrderedDict (or another mapping) -----------------------------


def _one_workspace(request, wrap):
    work, out = torch.zeros(4), {}
    for user in request.users:
        work.fill_(1.0 if user == request.users[-1] else 0.0)  # this user's training
        out[user] = work
    return wrap(out)


def _honest(request):
    last = request.users[-1]
    return {u: torch.full((4,), 1.0 if u == last else 0.0) for u in request.users}


@pytest.mark.parametrize(
    "wrap", [collections.OrderedDict, types.MappingProxyType, collections.UserDict]
)
@pytest.mark.parametrize("secure", [False, True])
def test_3_another_mapping_of_one_workspace_is_refused_uncharged(wrap, secure):
    config = _config(**{"noise-multiplier": 1e-6, "secure": secure})
    alg = build_algorithm(config, torch.zeros(4))
    with pytest.raises(ValueError, match=f"round 1: .*{SHARED}"):
        drive_round(alg, 1, lambda r: _one_workspace(r, wrap))  # before: model 0.45
    assert alg.epsilon() == 0.0 and alg.round_num == 0
    again = drive_round(alg, 1, lambda r: wrap(_honest(r)))
    assert float(again.params.max()) < 0.1


def test_3_aggregate_of_an_ordered_dict_of_one_workspace_is_refused():
    alg = build_algorithm(_config(), torch.zeros(4))
    users = alg.sample(1)
    work = torch.full((4,), 0.1)
    with pytest.raises(ValueError, match=SHARED):
        alg.aggregate(1, collections.OrderedDict((u, work) for u in users), cohort=users)
    assert alg.epsilon() == 0.0
    rows = torch.full((len(users), 4), 0.1)  # rows of one matrix: distinct updates
    done = alg.aggregate(1, collections.OrderedDict(zip(users, rows, strict=True)), cohort=users)
    assert done.metrics["accepted"] == len(users)


# -- finding 4: a user's exact example count in a refusal a ClientApp sends --------------------

BIG = {"num_users": 3, "dim": 2, "num_classes": 2, "seed": 2, "examples_per_user": [14000, 20000]}


@pytest.mark.parametrize("max_examples", [None, 20000])
def test_4_the_epochs_refusal_names_no_user_s_count(max_examples):
    task = build_task("toy", **BIG)
    held = len(task.user_data(0)[0])
    assert held == 15563
    run = {P.RUN_TASK: "toy", P.RUN_TASK_PARAMS_JSON: json.dumps(BIG), P.RUN_DEVICE: "cpu"}
    node = {P.NODE_PARTITION_ID: 0, P.NODE_NUM_PARTITIONS: 1}
    context = Context(run_id=1, node_id=11, node_config=node, state=RecordDict(), run_config=run)
    local = LocalConfig(learning_rate=0.5, epochs=10000, clip_norm=1.0, noise_std=0.2,
                        max_examples=max_examples)  # fmt: skip
    config = P.encode_train_config(users=[0], round_num=1, settings=P.ClientSettings(local, seed=5))
    model = ArrayRecord(task.build_model().state_dict())
    content = {P.CONFIG_RECORD: config, P.ARRAYS_RECORD: model}
    with pytest.raises(ValueError, match="set max-examples to at most 13421") as said:
        fedprivopt_app(delivered(content, "train"), context)
    assert str(held) not in str(said.value)  # before: 'got 10000 * 15563'


# -- finding 5: the check of shared memory sweeps (the same refusals) -------------------------


def test_5_the_same_refusals_and_a_large_stacked_cohort():
    m = torch.zeros(4, 10)
    flat = m.view(-1)
    for entries in (
        [(0, m[0]), (1, m[0])],  # one tensor twice
        [(0, m[:, 0]), (1, m[:, 0])],  # one strided view twice
        [(0, flat[:5]), (1, flat[3:8])],  # overlapping contiguous ranges
        [(0, flat[:20]), (1, m[1]), (2, m[3])],  # one range holding another user's row
        [(3, m[3]), (0, flat[:40])],  # the whole matrix and a row, in either order
    ):
        with pytest.raises(ValueError, match=f"round 1: the updates of users .* {SHARED}"):
            refuse_shared_memory(1, entries)
    refuse_shared_memory(1, [(0, m[:, 0]), (1, m[:, 1])])  # interleaved columns: distinct
    refuse_shared_memory(1, [(0, m[0]), (1, m[1].clone()), (2, m[2])])
    rows = torch.zeros(10_000, 4)
    refuse_shared_memory(1, list(enumerate(rows)))  # 4.9 s before, each round


# -- finding 6: a streamed batch of one row expanded over its users ---------------------------


class _Expanded:
    noise_shares = False
    sparse = True

    def train_batches(self, params, users, **_):
        for start in range(0, len(users), 3):
            chunk = tuple(users[start : start + 3])
            row = torch.full((1, params.numel()), 0.3)  # one user's row, for the whole chunk
            yield RowSparseBatch(
                users=chunk,
                rows=torch.zeros(len(chunk), dtype=torch.int64),
                values=row.expand(len(chunk), -1),
                row_ptr=torch.arange(len(chunk) + 1, dtype=torch.int64),
                length=params.numel(),
            )


@pytest.mark.parametrize("secure", [False, True])
def test_6_a_streamed_batch_of_one_expanded_row_is_refused(secure):
    with pytest.raises(ValueError, match=f"users 0 and 1 {SHARED}"):
        _round(_Expanded(), secure)  # before: accepted 6, each row summed 3 times
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=0.5, expected_cohort_size=6)
    stream = _Expanded().train_batches(torch.zeros(4), list(range(6)))
    with pytest.raises(ValueError, match=SHARED):
        agg.aggregate(stream, dim=4, generator=torch.Generator())
    own = (b.clone() for b in _Expanded().train_batches(torch.zeros(4), list(range(6))))
    assert agg.aggregate(own, dim=4, generator=torch.Generator()).metrics["accepted"] == 6.0


# -- finding 7: a dense generator split() of one update expanded over its users ---------------


class _ExpandedDense:
    noise_shares = False
    sparse = False

    class _Batch:
        def __init__(self, users, deltas):
            self.users, self.deltas = users, deltas

        def split(self):
            return ((u, self.deltas[i]) for i, u in enumerate(self.users))

    def train_batches(self, params, users, **_):
        for start in range(0, len(users), 3):
            chunk = users[start : start + 3]
            mean = torch.full((params.numel(),), 0.1)  # one update for the whole chunk
            yield self._Batch(chunk, mean.expand(len(chunk), -1))


@pytest.mark.parametrize("secure", [False, True])
def test_7_a_generator_split_of_one_expanded_update_is_refused(secure):
    said = f"round 1: a batch of the task.s cohort_trainer: updates: users 0 and 1 {SHARED}"
    with pytest.raises(ValueError, match=said):
        _round(_ExpandedDense(), secure)  # before: accepted 6, each update summed 3 times


# -- finding 8: a mapping giving a fresh view of its one workspace ----------------------------


class _FreshViews(Mapping):
    """Keeps one workspace for every user (the last user's update); each read a fresh view."""

    def __init__(self, users, work):
        self.users, self.work = list(users), work

    def __getitem__(self, user):
        return self.work.view(-1)

    def __iter__(self):
        return iter(self.users)

    def __len__(self):
        return len(self.users)


def test_8_fresh_views_of_one_workspace_are_refused():
    msg = _train_message([1, 2, 3])
    work = torch.full((TrainMessage.read(msg).global_flat.numel(),), 0.03)
    with pytest.raises(ValueError, match=SHARED):
        reply_updates(msg, _FreshViews([1, 2, 3], work))  # before: all three sent 0.03
    alg = build_algorithm(_config(**{"noise-multiplier": 1e-6}), torch.zeros(4))

    def train(request):
        return _FreshViews(request.users, torch.full((4,), 0.5))

    with pytest.raises(ValueError, match=SHARED):
        drive_round(alg, 1, train)  # before: the one update summed for every user
    assert alg.epsilon() == 0.0
