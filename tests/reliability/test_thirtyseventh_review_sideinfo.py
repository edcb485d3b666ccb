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
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn.functional as F

from fedprivopt.models.side_information import (
    gradient_second_moment,
    public_users_preconditioner,
)
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
