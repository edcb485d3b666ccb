"""Follow-up (privacy) of the forty-third hostile review of issue 15: today's api, mechanisms
and wire fixes, looked at for bypasses, regressions and twin paths.

Findings
--------
1. api 8's one secure draw a round, by purpose, kept the draw of the last round sampled only:
   ``alg.sample(1)``, then ``alg.sample(2)``, then ``alg.sample(1)`` drew round 1 anew, so a
   caller could still draw round 1 until a chosen user was in it (interleaving another round)
   and ``aggregate(1, updates, cohort=users)`` summed that cohort, charged as a Poisson sample
   of rate q. Before: the third call gave another cohort. Now every unreleased round keeps its
   draw (``ServerAlgorithm.sample``, by purpose and round; a finished round's are forgotten in
   ``_finish``).
2. The sending side of mechanisms 2 (its open row for wire): ``clients.reply_updates(message,
   {1: u})`` (a ClientApp of one's own) with ``u`` a plain tensor of norm 0.004 whose instance
   carries ``u.detach = lambda: torch.full((18,), 100.)``, and a ``torch.Tensor`` subclass whose
   own operations read norms as 0.001. Before: the reply carried what the instance's own
   ``detach`` returned (18 entries of 100, norm 424 where C = 1; in distributed-noise mode the
   server accepts a share up to C + s(sqrt(d) + 10) without knowing), and the subclass was sent
   as it was. Now the update is read through ``torch.Tensor.detach`` (the entries measured are
   the entries sent) and a subclass but ``Parameter`` is refused naming ``updates[1]``
   (``clients.messages.reply_updates``, as ``privatize_update`` and ``clip_l2`` refuse it).
3. Mechanisms 1's twin in the noise function: ``add_gaussian_noise(v, 1.0, generator=g)`` of a
   nested tensor (``torch.nested.nested_tensor``) or a sparse COO vector. Before: torch's
   ``RuntimeError`` ("NestedTensorImpl doesn't support sizes", "add(sparse, dense) is not
   supported") after the noise was drawn, naming no parameter, where ``clip_l2`` and ``l2_norm``
   name ``vector``. Now ``ValueError: vector must be a dense (strided) tensor, got a nested
   tensor`` (or ``layout torch.sparse_coo``) before anything is drawn
   (``privacy.noise.add_gaussian_noise``).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig
from fedprivopt.clients.messages import reply_updates
from fedprivopt.models import build_task
from fedprivopt.privacy import add_gaussian_noise
from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.messages import delivered
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
    _train,
)

# -- finding 1: a secure round drawn again after another round was drawn -----------------------


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp"])
def test_1_a_secure_rounds_draw_survives_a_draw_of_another_round(strategy):
    alg = build_algorithm(_config(secure=True, strategy=strategy), torch.zeros(4))
    first = alg.sample(1)
    draws = []
    for _ in range(10):
        # forty-fourth review of issue 15 (api 2): another round is not drawn while round 1's
        # draw is unreleased (it was, and round 1 then drawn anew each time)
        with pytest.raises(ValueError, match=r"round 2 cannot be drawn while round 1's cohort"):
            alg.sample(2)
        draws.append(alg.sample(1))  # was a new draw of round 1 each time
    assert all(d == first for d in draws)
    drive_round(alg, 1, _train)
    later = alg.sample(3)
    assert alg.sample(3) == later  # an unreleased round keeps its draw


# -- finding 2: reply_updates read an update through the instance's own detach -----------------


TOY = {"num_users": 10, "dim": 5, "num_classes": 3, "seed": 2}


def _train_message():
    """A toy train message of user 1 (clip-norm 1, no noise; the model has 18 entries)."""
    local = LocalConfig(learning_rate=0.5, clip_norm=1.0)
    config = P.encode_train_config(users=[1], round_num=2, settings=P.ClientSettings(local, seed=5))
    state = build_task("toy", **TOY).build_model().state_dict()
    content = {P.CONFIG_RECORD: ConfigRecord(dict(config)), P.ARRAYS_RECORD: ArrayRecord(state)}
    return delivered(content, "train")


class _ReadsSmall(torch.Tensor):
    """A subclass whose own operations read every norm as 0.001."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("vector_norm", "norm"):
            return torch.tensor(0.001)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_2_reply_updates_sends_the_entries_that_were_measured():
    u = torch.full((18,), 0.001)  # norm 0.004, within C = 1
    u.detach = lambda: torch.full((18,), 100.0)  # its own detach: what reply_updates read
    sent = P.read_updates(reply_updates(_train_message(), {1: u}).content)[1]
    assert torch.equal(torch.as_tensor(sent), torch.full((18,), 0.001))  # was 100s: norm 424


def test_2_reply_updates_refuses_a_subclass():
    u = torch.full((18,), 100.0).as_subclass(_ReadsSmall)
    with pytest.raises(ValueError, match=r"updates\[1\] .*plain torch\.Tensor"):
        reply_updates(_train_message(), {1: u})  # was sent as it was
    p = torch.nn.Parameter(torch.full((18,), 0.01))  # a Parameter is sent as before
    assert "update/1" in reply_updates(_train_message(), {1: p}).content


# -- finding 3: add_gaussian_noise of a nested or sparse vector ----------------------------------


@pytest.mark.parametrize("form", ["nested", "sparse"])
def test_3_add_gaussian_noise_names_a_vector_without_dense_entries(form):
    vector = torch.ones(4).to_sparse()
    if form == "nested":
        with warnings.catch_warnings():  # torch's note that nested tensors are a prototype
            warnings.simplefilter("ignore")
            vector = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match=r"^vector must be a dense \(strided\) tensor, got"):
        add_gaussian_noise(vector, 1.0, generator=generator)  # was torch's RuntimeError
    dense = add_gaussian_noise(torch.ones(4), 1.0, generator=generator)  # as before
    assert dense.shape == (4,) and not torch.equal(dense, torch.ones(4))
