"""Issue 15, thirty-ninth hostile review, follow-up (privacy: today's fixes of what is released).

1. A nested tensor (``torch.nested.nested_tensor([...])``, whose layout is ``torch.strided``) as
   an update, as a ``RowSparse``'s rows or values, or as adaptive clipping's one-element clip
   report, through ``NoisyMeanAggregator.aggregate``, ``NoisyCountAggregator.aggregate`` and a
   ``drive_round`` train callback (dp-fedavg server and distributed mode, ADADP): the close
   variant of the thirty-ninth review's mechanisms 1 and 2 (meta and sparse tensors). Before:
   ``sparse.dense_problem`` and ``adaptive_clip._scalar`` looked at the layout only, so torch's
   ``RuntimeError`` ("NestedTensorImpl doesn't support sizes") came out of the whole
   aggregation (the round failed for one malformed entry). Now the entry is rejected alone
   ("a dense (strided) tensor is needed, got a nested tensor", "clip bit must be one finite
   number") and the honest ones summed as before (the same noised mean as without it).
2. A task's own ``cohort_trainer`` on the fast engine (``make_cohort_train``, the command line
   alike) whose ``train_batches`` yields batches with ``split()`` only (the protocol
   ``CohortTrainer.train_batches`` documents; ``users`` and ``norms`` are needed for clip reports
   only), or entries that are no batch (a ``(user, update)`` pair, ``None``). Before: the
   thirty-ninth review's per-entry check (api 1) read ``batch.users`` of every batch, so the
   split-only trainer, which trained before (toy rc 0), ended in an ``AttributeError``
   traceback (rc 1); a pair or ``None`` did before and after (``no attribute 'split'``), and so
   did a split-only batch with adaptive clipping. Now the split-only batch trains as before
   (the same model as one user at a time), and the others are refused in one line naming
   ``cohort_trainer().train_batches()`` (``UserTrainer._batch_users``, a ``TaskError``: rc 2).
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.clients import LocalTrainer
from fedprivopt.models import build_task, initial_flat
from fedprivopt.models.task import TaskError
from fedprivopt.privacy.adaptive_clip import NoisyCountAggregator
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.sparse import RowSparse
from fedprivopt.simulation.fast import make_cohort_train
from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
)

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")

# -- finding 1: a nested tensor is rejected alone ---------------------------------------------

_HONEST = [0.6, 0.0, 0.8, 0.0]


def _nested(**kw):
    return torch.nested.nested_tensor([torch.tensor(_HONEST)], **kw)


def _nested_entries():
    return {
        "nested": _nested(),
        "nested jagged": _nested(layout=torch.jagged),
        "row-sparse nested values": RowSparse(torch.tensor([0]), _nested(), 4),
        "row-sparse nested rows": RowSparse(
            torch.nested.nested_tensor([torch.tensor([0])]), torch.tensor([_HONEST]), 4
        ),
    }


def _mean(entries):
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1.0, expected_cohort_size=2)
    return agg.aggregate(entries, dim=4, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    "case",
    ["nested", "nested jagged", "row-sparse nested values", "row-sparse nested rows"],
)  # names: built in the test, after the filter of their warning
def test_1_a_nested_update_is_rejected_alone(case):
    honest = torch.tensor(_HONEST)
    result = _mean([(0, honest), (1, _nested_entries()[case])])  # RuntimeError before
    assert result.metrics["accepted"] == 1.0 and set(result.rejected) == {1}
    assert "nested tensor" in result.rejected[1]
    assert torch.equal(result.delta_tilde, _mean([(0, honest)]).delta_tilde)


@pytest.mark.parametrize("mode", ["server", "distributed"])
def test_1_a_nested_clip_report_is_rejected_alone(mode):
    counter = NoisyCountAggregator(
        count_stddev=1.0,
        expected_cohort_size=4,
        noise_mode=mode,
        min_shares=2 if mode == "distributed" else None,
    )
    report = torch.nested.nested_tensor([torch.ones(1)])
    honest = 1.0 if mode == "server" else 0.73  # a share, not an exact bit (47th, mechanisms 2)
    result = counter.aggregate(
        [(0, report), (1, honest)], generator=torch.Generator().manual_seed(0)
    )
    assert result.counted == 1
    assert result.rejected == {0: "clip bit must be one finite number"}


@pytest.mark.parametrize(
    "strategy,changes",
    [("dp-fedavg", {}), ("dp-fedavg", {"noise-mode": "distributed"}), ("dp-fedavg-adadp", {})],
)
def test_1_a_callback_sending_a_nested_update_has_it_rejected(strategy, changes):
    def train(request):
        out = {u: torch.full((4,), 0.1) for u in request.users}
        out[request.users[0]] = torch.nested.nested_tensor([torch.full((4,), 0.1)])
        return out

    alg = build_algorithm(_config(strategy=strategy, **changes), torch.zeros(4))
    result = drive_round(alg, 1, train)  # RuntimeError out of the round before
    assert result.rejected and all("nested tensor" in why for why in result.rejected.values())


# -- finding 2: what a task's cohort trainer yields ---------------------------------------------


class _SplitOnly:
    """A batch with ``split()`` alone (no ``users``, no ``norms``)."""

    def __init__(self, pairs):
        self.pairs = pairs

    def split(self):
        return self.pairs


class _Yielding:
    """A task's cohort trainer yielding each user's update in the form ``how`` names."""

    def __init__(self, task, how):
        self.local, self.how = LocalTrainer(task, device="cpu"), how

    def train_batches(self, params, users, *, round_num, config, rngs, preconditioner, stream):
        keys = {"round_num": round_num, "config": config, "rngs": rngs, "stream": stream}
        for user in users:
            delta = self.local.train(params, user_id=user, **keys).delta
            yield {"split": _SplitOnly([(user, delta)]), "pair": (user, delta), "none": None}[
                self.how
            ]


def _run(how, **changes):
    task = build_task("toy", num_users=6)
    if how is not None:
        trainer = _Yielding(task, how)
        task.cohort_trainer = lambda device, chunk_users: trainer
    config = _config(population=6, sampling="fixed", **{"clients-per-round": 6, **changes})
    alg = build_algorithm(config, initial_flat(task))
    drive_round(alg, 1, make_cohort_train(task, device="cpu"))
    return alg


def test_2_a_batch_with_split_alone_trains_as_before():
    alg = _run("split")  # AttributeError: '_SplitOnly' object has no attribute 'users' before
    assert alg.round_num == 1 and torch.equal(alg.params, _run(None).params)


@pytest.mark.parametrize(
    "how,changes",
    [("pair", {}), ("none", {}), ("split", {"adaptive-clipping": True})],
)
def test_2_an_entry_that_is_no_batch_is_refused_naming_train_batches(how, changes):
    with pytest.raises(TaskError, match=r"cohort_trainer\(\).train_batches\(\) must yield"):
        _run(how, **changes)  # AttributeError before
