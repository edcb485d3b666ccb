"""Issue 15, thirty-seventh hostile review (AdaDPS' side information, the server optimizers'
hyperparameters at their bounds, the strategy configuration).

1. AdaDPS' ``public-users`` side information of a task whose ``loss`` draws from a global
   generator (dropout in the model, ``np.random`` augmentation; ``docs/TASKS.md`` says a
   seeded run is reproducible even then): ``simulate d.toml`` twice (``strategy = "adadps"``,
   ``side-information.kind = "public-users"``, ``users = 2``, a task by reference whose model
   starts with ``torch.nn.Dropout(0.5)``) released different models (ledger digests
   ``...e739660e`` and ``...50c0e9b4``, eval_accuracy 0.58 and 0.62; 0.665 and 0.65 for the
   ``np.random`` task), and ``simulate --resume`` after raising the rounds was refused for
   ever: ``checkpoint was written with different side information``. The public users'
   gradients (``side_information.gradient_second_moment``) ran with the process's global
   generators as they were, and left them advanced. Now each public user's minibatches run with
   torch's, NumPy's and Python's global generators seeded from a fixed key of that user
   (``"side-information"``, user id: the side information is a function of public data and
   constants only, the same for every run seed) and restored afterwards, as the trainer does for
   every private user: the two runs release the same models and the resume goes on.
2. The Python API of the side information's resolution took what the command line checks first:
   ``resolve_side_information({"kind": "public-users"}, task, population=0,
   clients_per_round=-1)`` resolved public user 0 and a private population of -1 (population 40
   with ``clients_per_round`` 0 or -1: accepted as a cohort; NaN: ``cannot convert float NaN to
   integer``), ``inf`` raised
   ``OverflowError``, ``None`` or ``"3"`` a ``TypeError``; and ``ResolvedSideInformation(...,
   population=40, public_users=(5, 7))`` was taken: its summary said ``users 0..1 (2 of 40)
   opted out of privacy`` while :func:`build_side_information` built ``A`` from users 5 and 7,
   whom ``build_run``'s offset of 2 leaves in the private population. Now each argument is
   checked (``ValueError`` naming it and its range), and a record's public users must be those
   of its kind (``0 .. users-1`` for ``public-users``, none otherwise).
3. AdaDPS' preconditioner at the Python API (``build_algorithm(config, init,
   preconditioner=A)``): the algorithm kept the caller's tensor, so an in-place edit after
   building it (``A.mul_(2)``, a second run's normalization of the same vector) changed what the
   later rounds broadcast, while ``state_dict()``'s side-information digest stayed the one of
   the ``A`` the run started with (a resume checked against a vector the run no longer
   broadcast); a list raised ``AttributeError``, a complex tensor ``NotImplementedError``, a meta
   one ``RuntimeError``, a bool one was taken. Now ``A`` is copied (detached) when the algorithm
   is built, and anything but a finite, positive real tensor of the model's shape is a
   ``ValueError`` naming its dtype, shape and device.
4. The strategy configuration's mappings at the Python API: ``MomentumOptions.from_mapping({"beta1":
   0.9})`` (a key of another block, or ``{1: 2}``) raised the constructor's ``TypeError``
   (``unexpected keyword argument 'beta1'``), and ``MomentumOptions.from_mapping(None)`` or
   ``StrategyConfig.from_mapping(None)`` (or a list of pairs) an ``AttributeError``. Now one
   ``ValueError``: ``unknown key 'beta1' for MomentumOptions (its keys: max-noise-step,
   server-momentum)``, ``... must be built from a mapping of keys, got None``.

What held is listed in the report (RELIABILITY §7's rows of this review).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedprivopt.models.side_information import (
    gradient_second_moment,
    public_users_preconditioner,
)
from fedprivopt.models.side_information_config import (
    ResolvedSideInformation,
    resolve_side_information,
)
from fedprivopt.strategies import StrategyConfig
from fedprivopt.strategies.algorithms import build_algorithm
from fedprivopt.strategies.options import DP2Options, MomentumOptions
from tests.models.minimal_task import MinimalTask


class _Dropout(MinimalTask):
    """The minimal task with a dropout layer before its linear model."""

    def build_model(self) -> torch.nn.Module:
        gen = torch.Generator().manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(4, 2))
        with torch.no_grad():
            model[1].weight.copy_(torch.randn(2, 4, generator=gen) * 0.01)
            model[1].bias.zero_()
        return model


class _Augments(MinimalTask):
    """The minimal task whose loss adds ``np.random`` and ``random`` noise to its inputs."""

    def loss(self, model, x, y):
        noise = np.random.normal(size=tuple(x.shape)).astype("float32")
        x = x + torch.from_numpy(noise) * random.random()
        return F.cross_entropy(model(x), y)


def _global_states():
    # not torch's: building a torch.nn.Linear draws its (then overwritten) initial weights
    return np.random.get_state()[1].copy(), random.getstate()


def test_1_public_users_side_information_is_reproducible_and_leaves_global_generators():
    for task in (_Dropout(), _Augments()):
        before = _global_states()
        first = public_users_preconditioner(task, [0, 1], batch_size=4)
        after = _global_states()
        assert np.array_equal(before[0], after[0]) and before[1] == after[1]
        torch.manual_seed(123)  # another global state: the same side information
        np.random.seed(5)
        random.seed(7)
        assert torch.equal(first, public_users_preconditioner(task, [0, 1], batch_size=4))
        moment = gradient_second_moment(task, [1], batch_size=4)
        assert torch.equal(moment, gradient_second_moment(task, [1], batch_size=4))


@pytest.mark.parametrize(
    ("population", "cohort", "named"),
    [
        (0, -1, "population"),
        (40, 0, "clients_per_round"),
        (40, -1, "clients_per_round"),
        (40, float("inf"), "clients_per_round"),
        (40, float("nan"), "clients_per_round"),
        (40, None, "clients_per_round"),
        (40, "3", "clients_per_round"),
        (None, 10, "population"),
        (1.5, 1, "population"),
    ],
)
def test_2_resolve_checks_population_and_cohort(population, cohort, named):
    task = MinimalTask(num_users=40)
    with pytest.raises(ValueError, match=named):
        resolve_side_information(
            {"kind": "public-users"}, task, population=population, clients_per_round=cohort
        )


def test_2_a_resolved_record_holds_its_kinds_public_users():
    params = {"users": 2, "eps": 1e-5, "max-ratio": 200.0}
    with pytest.raises(
        ValueError, match=r"public_users of kind 'public-users' must be users 0\.\.1"
    ):
        ResolvedSideInformation(
            "public-users", "public-users", params, population=40, public_users=(5, 7)
        )
    with pytest.raises(ValueError, match="public_users of kind 'ones' must be empty"):
        ResolvedSideInformation("ones", "ones", {}, population=40, public_users=(0,))
    with pytest.raises(ValueError, match="population"):
        ResolvedSideInformation("ones", "ones", {}, population=0)
    record = ResolvedSideInformation(
        "public-users", "public-users", params, population=40, public_users=[0, 1]
    )
    assert record.public_users == (0, 1) and record.private_population == 38
    resolved = resolve_side_information(
        {"kind": "public-users", "users": 3},
        MinimalTask(num_users=40),
        population=40,
        clients_per_round=10,
    )
    assert resolved.public_users == (0, 1, 2) and "users 0..2 (3 of 40)" in resolved.exclusion()


def test_3_adadps_keeps_its_own_copy_of_a_checked_preconditioner():
    config = StrategyConfig.from_mapping(
        {"strategy": "adadps", "population": 4, "clients-per-round": 2, "noise-multiplier": 1.0}
    )
    side = torch.ones(6)
    alg = build_algorithm(config, torch.zeros(6), preconditioner=side)
    digest = alg.state_dict()["side_information"]
    side.mul_(2.0)
    assert torch.equal(alg.broadcast_preconditioner(), torch.ones(6))
    assert alg.state_dict()["side_information"] == digest
    for bad in (
        [1.0] * 6,
        torch.ones(6, dtype=torch.complex64),
        torch.ones(6, device="meta"),
        torch.ones(6, dtype=torch.bool),
    ):
        with pytest.raises(ValueError, match="preconditioner must be a finite, positive real"):
            build_algorithm(config, torch.zeros(6), preconditioner=bad)


def test_4_option_blocks_and_configs_from_mappings_refuse_in_one_value_error():
    with pytest.raises(ValueError, match=r"unknown key 'beta1' for MomentumOptions \(its keys: "):
        MomentumOptions.from_mapping({"beta1": 0.9})
    with pytest.raises(ValueError, match="unknown key 1 for DP2Options"):
        DP2Options.from_mapping({1: 2})
    for bad in (None, [("strategy", "adadps")]):
        with pytest.raises(ValueError, match="mapping of keys"):
            MomentumOptions.from_mapping(bad)
        with pytest.raises(ValueError, match="mapping of keys"):
            StrategyConfig.from_mapping(bad)
    assert MomentumOptions.from_mapping({"server_momentum": 0.5}).server_momentum == 0.5
