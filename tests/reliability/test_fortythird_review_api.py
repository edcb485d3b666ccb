"""Issue 15, forty-third hostile review (api: the documented Python API): tests.

1. ``alg.aggregate(3, updates, cohort=alg.sample(3))`` (a caller's release of round 3, charged)
   before rounds 1 and 2 were driven (``drive_round``), then ``drive_round(alg, 3, train)`` with
   one user of the cohort left out (dp-fedavg seeded; ADADP's first cohort alike). Before:
   finishing round 1 cleared every mark of a computed sum, round 3's too, so round 3 ran again
   with the same seeded noise: the released step differed from the first release by the left
   out user's clipped update over m without noise (0.01 in every entry: 0.0857 and 0.0757),
   charged as two independent releases (epsilon 13.70). Now ``ServerAlgorithm._finish`` keeps
   the marks of later rounds: ``round 3 was begun already``, nothing charged; round 4 runs.
2. ``register_task("mytoy43", functools.partial(ToyClassificationTask, seed=SEED))`` in a module of
   one's own (the packaged toy task with one's own data seed, made a factory without a function
   of one's own), a run of it through the Python API, ``SEED`` edited. Before: the partial's
   function is fedprivopt's, so nothing of the task's code was recorded (``data_identity`` None):
   ``resume()`` and ``compare``'s reuse could not see the edit, though docs/TASKS.md says a
   registered factory and a partial are recorded by the module that made them (the forty-second
   review's api 6 and 8 through a partial of a packaged class). Now ``register_task`` notes the
   module that called it, and ``build_task`` records it for such a partial.
3. ``build_algorithm(config, params, frozen=mask.to_sparse())`` (or a mask on the meta device), and
   ``adadps``' side information ``preconditioner=A.to_sparse()`` (the forty-second review's api 3
   and 7 through the constructors). Before: the first round ended in torch's
   ``NotImplementedError`` (``aten::masked_fill_`` on ``SparseCPU``, after the noise was drawn),
   the meta mask in ``Cannot copy out of meta tensor``, the sparse A in ``aten::ne.Scalar``, where
   a ``ValueError`` naming the argument is documented. Now ``ServerAlgorithm.__init__`` and
   ``AdaDPS.__init__`` refuse them naming ``frozen`` or ``preconditioner``.
4. ``adaptive-clipping = true``: ``drive_round(alg, 1, train)`` whose callback changed
   ``request.params`` in place (refused, the thirty-eighth review's api 1), then round 1 driven
   again by an honest callback (dp-fedavg, ADADP; seeded and secure). Before: the refused
   cohort's noised clip count was kept and averaged into round 1's step of ``C``: its
   ``clip_count_fraction`` and ``next_clip_norm`` were those of two noised counts (secure mode:
   0.9137, the mean of the refused cohort's 0.8391 and the rerun's; seeded, with the refused
   cohort's bits 0: 0.45 where the honest round has 0.91), one of them a cohort never released
   or charged, and in secure mode two independent noises averaged under one round's charge.
   Now the count of a round's cohort is released only after its trainer's copies were found
   unchanged (``AlgorithmAggregation._count_cohort``); a refused cohort's is dropped.
5. ``LocalTrainer(task, device=...)`` (a ClientApp's trainer, docs/FLOWER.md) given a device this
   machine does not have (``"cuda"`` without CUDA, ``5``, ``"xla"``) or ``"meta"``. Before:
   torch's ``AssertionError: Torch not compiled with CUDA enabled``, ``RuntimeError`` (``Cannot
   access accelerator device``, ``not linked with support for xla devices``), and for meta a
   line naming the model's ``state['weight']``, where the noise samplers and the aggregator
   name ``device`` (a short API review). Now ``LocalTrainer.__init__`` checks it with
   ``core.devices.check_device``.
6. Tree aggregation (``noise-mechanism = "tree"``, population 40, 10 a round, restart 4):
   ``drive_round(alg, 1, train)`` run again after round 1 (or a round over ``target-epsilon``),
   then round 2. Before: ``run_round`` sampled before the round was refused (``round 1 was
   released already``, at its aggregation), and a tree sample checks its cohort in to the
   period's participation ledger: 10 users were lost to the period (30 in the ledger after two
   rounds), and the algorithm's own ``state_dict()`` was refused by ``load_state_dict`` as
   edited (``holds 30 users ... at most 20``). Now ``run_round`` (core and ADADP) refuses a
   released, begun or over-budget round before it samples
   (``AlgorithmAggregation._refuse_spent_round``).
7. Tree aggregation as in 6: round 2 refused after its sum (its callback changed
   ``request.params`` in place; nothing released), or at its aggregation (a callback returning
   ``None``, the fortieth review's api 5), then run again. Before: the refused cohort
   stayed checked in to the period's participation ledger, so the rerun drew 10 other users
   (30 in the ledger), and the algorithm's own state was refused as edited. Now
   ``ServerAlgorithm._check_out`` takes exactly that cohort out (and forgets its draw, so
   ``aggregate`` cannot sum it unchecked in): the rerun draws the same cohort, 20 in the
   ledger, the state loads.
8. Secure mode (``secure = true``): ``users = alg.sample(1)`` called again until a chosen user is
   in the draw (user 7 at the second draw), then ``alg.aggregate(1, updates, cohort=users)``.
   Before: every call drew anew and ``aggregate`` took the last draw, so the caller chose the
   cohort (a chosen user's inclusion probability 1) while the release was charged as a Poisson
   sample of rate q (epsilon 7.55). Now a round's draw is given again for the same round and
   purpose (``ServerAlgorithm.sample``), as in seeded mode; the next round draws anew.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from fedprivopt.clients import LocalTrainer
from fedprivopt.models import build_task
from fedprivopt.models import registry as registry_module
from fedprivopt.models.task import TASK_SOURCE, data_identity
from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from fedprivopt.strategies.requests import ReportedUpdates
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
    _train,
)

# -- finding 1: a later round aggregated by the caller, then the rounds before it -------------


@pytest.mark.parametrize(
    ("changes", "stream"), [({}, ""), ({"secure": True}, ""),
                            ({"strategy": "dp-fedavg-adadp"}, "train")],
)  # fmt: skip
def test_1_a_round_aggregated_before_the_rounds_before_it_is_not_run_again(changes, stream):
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    users = alg.sample(3)
    alg.aggregate(3, {u: torch.full((4,), 0.1) for u in users}, cohort=users, stream=stream)
    for r in (1, 2):
        drive_round(alg, r, _train)
    assert alg.state_dict()["begun"] == [[3, stream]]
    events = alg.accountant.num_events
    fewer = lambda r: {u: torch.full((4,), 0.1) for u in r.users[1:]}  # noqa: E731
    with pytest.raises(ValueError, match=r"round 3 was begun already"):
        drive_round(alg, 3, fewer)  # ran: the same seeded noise, the difference unnoised
    assert alg.accountant.num_events == events and alg.round_num == 2
    drive_round(alg, 4, _train)
    assert alg.round_num == 4


# -- finding 2: a registered partial of a packaged task class ----------------------------------


def test_2_a_registered_partial_of_a_packaged_class_is_recorded_by_its_module(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    name = f"regtask43_{abs(hash(str(tmp_path)))}"
    source = tmp_path / f"{name}.py"
    text = (
        "import functools\nfrom fedprivopt.models import register_task\n"
        "from fedprivopt.models.toy import ToyClassificationTask\nSEED = {}\n"
        "register_task('mytoy43', functools.partial(ToyClassificationTask, seed=SEED), "
        "replace=True)\n"
    )
    source.write_text(text.format(3))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.import_module(name)
    before = data_identity(build_task("mytoy43", num_users=4))
    assert before is not None and before[TASK_SOURCE]["module"] == name  # was None
    source.write_text(text.format(4))
    monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.import_module(name)
    after = data_identity(build_task("mytoy43", num_users=4))
    assert after[TASK_SOURCE]["sha256"] != before[TASK_SOURCE]["sha256"]
    assert data_identity(build_task("toy", num_users=4)) is None  # packaged: unchanged


# -- finding 3: a frozen mask or side information without dense values ------------------------


@pytest.mark.parametrize("form", ["sparse", "meta"])
@pytest.mark.parametrize("name", ["frozen", "preconditioner"])
def test_3_a_mask_or_side_information_without_dense_values_is_refused(name, form):
    good = torch.tensor([True, False, False, False]) if name == "frozen" else torch.ones(4)
    bad = good.to_sparse() if form == "sparse" else torch.empty_like(good, device="meta")
    changes = {"strategy": "adadps"} if name == "preconditioner" else {}
    other = {"preconditioner": torch.ones(4)} if name == "frozen" else {}
    with pytest.raises(ValueError, match=rf"^{name} must be a (dense tensor|finite, positive)"):
        build_algorithm(_config(**changes), torch.zeros(4), **{name: bad}, **other)
    alg = build_algorithm(_config(**changes), torch.zeros(4), **{name: good}, **other)
    drive_round(alg, 1, _train)
    assert alg.round_num == 1


# -- finding 4: adaptive clipping's count of a refused cohort ----------------------------------


def _reported(bit: float, change: bool = False):
    def train(request):
        if change:
            request.params.add_(1.0)  # refused after the cohort's sum and count
        updates = {u: torch.full((4,), 0.1) for u in request.users}
        return ReportedUpdates(updates, clip_bits={u: bit for u in request.users})

    return train


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp"])
def test_4_a_refused_cohorts_clip_count_does_not_move_the_clip_norm(strategy):
    config = _config(strategy=strategy, **{"adaptive-clipping": True})
    honest = drive_round(build_algorithm(config, torch.zeros(4)), 1, _reported(1.0)).metrics
    alg = build_algorithm(config, torch.zeros(4))
    with pytest.raises(ValueError, match=r"changed request.params in place"):
        drive_round(alg, 1, _reported(0.0, change=True))
    again = drive_round(alg, 1, _reported(1.0)).metrics
    for key in ("clip_count_fraction", "next_clip_norm"):
        assert again[key] == honest[key]  # was the mean with the refused cohort's count
    assert again["epsilon"] == honest["epsilon"]


# -- finding 5: LocalTrainer given a device this machine does not have --------------------------


_NO_DEVICES = ["meta", "xla", True] + ([] if torch.cuda.is_available() else [5, "cuda"])


@pytest.mark.parametrize("device", _NO_DEVICES)
def test_5_local_trainer_refuses_a_device_it_cannot_train_on(device):
    task = build_task("toy", num_users=4)
    with pytest.raises(ValueError, match=r"^device "):
        LocalTrainer(task, device=device)  # was torch's AssertionError or RuntimeError
    assert LocalTrainer(task, device="cpu").device == torch.device("cpu")


# -- finding 6: a released round driven again under tree aggregation -----------------------------


def test_6_a_released_tree_round_is_refused_before_its_sample():
    config = _config(**{"noise-mechanism": "tree", "num-server-rounds": 8})
    alg = build_algorithm(config, torch.zeros(4))
    drive_round(alg, 1, _train)
    with pytest.raises(ValueError, match=r"round 1 was released already"):
        drive_round(alg, 1, _train)  # its sample checked 10 more users in first
    drive_round(alg, 2, _train)
    assert len(alg.tree_cohorts.state_dict()["users"]) == 20  # was 30
    other = build_algorithm(config, torch.zeros(4))
    other.load_state_dict(alg.state_dict())  # was refused: "the checkpoint was edited"
    assert other.round_num == 2


# -- finding 7: a refused tree round's cohort ---------------------------------------------------


def test_7_a_refused_tree_rounds_cohort_is_checked_out():
    config = _config(**{"noise-mechanism": "tree", "num-server-rounds": 8})
    alg = build_algorithm(config, torch.zeros(4))
    drive_round(alg, 1, _train)
    cohorts = []

    def changed(request):
        cohorts.append(list(request.users))
        request.params.add_(1.0)
        return _train(request)

    with pytest.raises(ValueError, match=r"changed request.params in place"):
        drive_round(alg, 2, changed)
    with pytest.raises(TypeError, match=r"updates must be a mapping"):
        drive_round(alg, 2, lambda request: None)  # a callback without its return: alike
    with pytest.raises(ValueError, match=r"drew none"):
        alg.aggregate(2, {u: torch.full((4,), 0.1) for u in cohorts[0]}, cohort=cohorts[0])
    drive_round(alg, 2, lambda request: cohorts.append(list(request.users)) or _train(request))
    assert cohorts[1] == cohorts[0]  # was 10 other users
    assert len(alg.tree_cohorts.state_dict()["users"]) == 20  # was 30
    build_algorithm(config, torch.zeros(4)).load_state_dict(alg.state_dict())  # was "edited"


# -- finding 8: a secure round drawn again until a chosen user is in it ---------------------------


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp"])
def test_8_a_secure_round_has_one_draw(strategy):
    alg = build_algorithm(_config(secure=True, strategy=strategy), torch.zeros(4))
    first = alg.sample(1)
    assert all(alg.sample(1) == first for _ in range(20))  # was a new draw every call
    second = alg.sample(1, "sampling-2")
    assert alg.sample(1, "sampling-2") == second
    drive_round(alg, 1, _train)
    later = [alg.sample(2) for _ in range(3)]
    assert later[0] == later[1] == later[2]
