"""Issue 15, forty-second hostile review (api: the documented Python API): tests.

1. ``drive_round(alg, r, train)`` given a round that is no plain ``int``: a NumPy integer
   (``for r in np.arange(1, 4)``) or an ``int`` subclass whose comparisons lie (dp-fedavg and
   ADADP, seeded). Before: ``run_round`` kept it as the algorithm's round. With NumPy rounds
   ``state_dict()["round"]`` was ``np.int64(3)``, which the algorithm's own ``load_state_dict``
   refused (``checkpoint's round must be an integer >= 0, got np.int64(3)``) and JSON cannot
   write; with the subclass, ``drive_round(alg, 1, train)`` after it was not refused as
   released already: round 1 ran again with the same seeded noise, so the two released means
   differed by the left-out user's clipped update without noise (0.01 in every entry), charged
   as two independent releases (epsilon 10.28). A state whose round was such a subclass was
   kept alike. Now ``core.round_number`` makes the round a plain ``int`` (``run_round`` of
   every strategy, ``_finish``), and ``load_state_dict`` takes an integral round as an ``int``:
   the rerun is refused (``round 1 was released already``), the NumPy state loads.
2. A task whose ``build_model()`` returns a model it keeps (built at its first call), with a
   non-persistent buffer its forward sets from the minibatch (a feature mean) and its eval
   reads (``simulate toy.toml --rounds 2 --set task=cachedtask42:cached``). Before: the trainer
   and the run's evaluation held the same model, and the evaluation's state of it was taken
   after round 1's training, so every evaluation read the last trained user's feature mean:
   ``eval_accuracy`` 0.4567 where a fresh model gives 0.5967 for the same released model
   (ledger digests equal), rc 0: a reported number that depends on one user's data without
   noise. Now ``LocalTrainer`` builds the model a second time and refuses a module shared by
   the two builds (``LocalTrainer._refuse_shared_model``: ``build_model() returned the same
   model at two calls ...``, from the command line rc 2, one line); fresh models train as
   before.
3. ``other.load_state_dict(state)`` of a state whose ``params`` (or ``averaged`` with
   ``ema-decay``, or ADADP's half-step point ``partial``) has the model's shape and dtype but
   is sparse (``state["params"].to_sparse()``) or on the meta device (dp-fedavg, DP-FedAdam,
   ADADP). Before: taken; the next round ended in torch's ``NotImplementedError`` (``Could not
   run 'aten::equal' with arguments from the 'SparseCPU' backend``) or a ``RuntimeError`` naming
   no key (``Tensor on device cpu is not on the expected device meta!``), the algorithm left at
   the state's round. Now ``AlgorithmState._refuse_without_data`` refuses it naming the key
   (``checkpoint's params must be a dense tensor with values: ...``), the algorithm as it was;
   a state's tensors are copied to the model's device.
4. ``privatize_update(update, clip_norm=1.0, noise_std=0.5, generator=g)`` (what a user's own
   ClientApp calls after its training loop) given an update of a ``torch.Tensor`` subclass whose
   own norm reads 0.001 (the forty-first review's api 1, on the client's side), every entry 100.
   Before: returned unclipped: ``norm`` 0.001, ``clipped`` False, the vector of norm 199.9 (of
   the subclass); in distributed-noise mode the server sums an update up to ``C + s (sqrt(d) +
   10)`` (the share's room), above C. Now refused (``update is a _Lying (a torch.Tensor
   subclass, ...``, ``privacy.plain.foreign_tensor``); ``torch.nn.Parameter`` taken.
5. ``alg.aggregate(1, updates, cohort=iter(users))`` (or a generator) with ``users =
   alg.sample(1)`` (dp-fedavg, seeded and secure). Before: the check against the round's sample
   read the iterator and the aggregation found it empty: all 9 updates rejected as not in the
   round's cohort, a round of noise alone released and charged (epsilon 7.55, accepted 0);
   ``cohort=[True]`` summed user 1, and 0-d tensors were refused as users the round did not
   sample. Now ``core._cohort_users`` reads the cohort once into plain user ids: the iterator's
   users are summed (accepted 9, the mean of the list's cohort), a float, bool, string or
   tensor entry is refused naming it (``cohort entry (a user id) must be an integer >= 0``),
   nothing charged.
6. ``register_task("mytoy42", make)`` with ``make`` in a module of one's own that builds the
   packaged toy task with its own data seed (``params["seed"] = SEED``), a run of it through
   the Python API (``simulation.run.simulate``, stopped after round 1), the module's ``SEED``
   edited (3 to 4), then ``resume(out)``. Before: the factory of a registered name was not
   recorded (only a reference's was, thirty-sixth review's tasks 4), so the ledger held no
   ``task_source`` and the resume went on with rounds 2-3 on other data (``eval_accuracy`` 0.67
   where the unedited run gives 0.69). Now ``registry.build_task`` records the module of a
   registered factory of one's own too (``note_factory``): the resume is refused (``the
   task's code changed since the run started (module "regtask42", ...)``); packaged tasks
   unchanged.
7. ``LocalTrainer(task).train(global_flat, ...)`` with a ``global_flat`` (or ``preconditioner``)
   of the layout's length and dtype but on the meta device or sparse (``to_sparse()``). Before:
   torch's ``NotImplementedError`` (``Cannot copy out of meta tensor; no data!``, ``Could not
   run 'aten::as_strided' with arguments from the 'SparseCPU' backend``) where a ``ValueError``
   naming the argument is documented. Now ``trainer._refuse_without_data`` refuses it naming
   the argument (``global_flat must be a dense tensor with values: ...``).
8. A task factory that is a ``functools.partial``: ``task = "regmod:made"`` with ``made =
   functools.partial(ToyClassificationTask, heterogeneity=0.5)`` in a module of one's own (also
   one registered under a name). Before: a partial's ``__module__`` is ``functools``, so the
   ledger's ``task_source`` was the digest of ``functools.py``, not of the module that made the
   partial: an edit of its arguments went unseen by ``--resume`` and ``compare``'s reuse (the
   thirty-sixth review's tasks 4 through a partial). Now ``build_task`` records the reference's
   module (a registered partial: its function's).
"""

from __future__ import annotations

import functools
import importlib
import json
import sys

import numpy as np
import pytest
import torch

from fedprivopt.clients import LocalTrainer, privatize_update
from fedprivopt.core.local import LocalConfig
from fedprivopt.models import build_task, initial_flat, register_task
from fedprivopt.models import registry as registry_module
from fedprivopt.models.task import TASK_SOURCE, TaskError, data_identity
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_fortyfirst_review_api import _Lying
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
    _train,
)

# -- finding 1: a round that is no plain int -----------------------------------------------


class _LyingInt(int):
    """An int whose order comparisons all say no (so a round never reads as released)."""

    def __lt__(self, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__


@pytest.mark.parametrize("changes", [{}, {"strategy": "dp-fedavg-adadp"}])
def test_1_a_round_given_as_an_int_subclass_is_not_run_again(changes):
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    drive_round(alg, _LyingInt(1), _train)
    assert type(alg.round_num) is int
    events = alg.accountant.num_events
    fewer = lambda r: {u: torch.full((4,), 0.1) for u in r.users[1:]}  # noqa: E731
    with pytest.raises(ValueError, match=r"round 1 was released already"):
        drive_round(alg, 1, fewer)  # was run again: the same noise, the difference unnoised
    assert alg.accountant.num_events == events


def test_1_a_state_whose_round_is_an_int_subclass_cannot_rewind_the_algorithm():
    alg = build_algorithm(_config(), torch.zeros(4))
    drive_round(alg, 1, _train)
    first = alg.state_dict()
    for r in (2, 3):
        drive_round(alg, r, _train)
    state = {**first, "accountant": alg.state_dict()["accountant"], "round": _LyingInt(1)}
    with pytest.raises(ValueError, match=r"released rounds up to 3, the state is of round 1"):
        alg.load_state_dict(state)  # was taken: round 2 then ran again with its noise
    assert alg.round_num == 3


@pytest.mark.parametrize("changes", [{}, {"strategy": "dp-fedavg-adadp"}])
def test_1_an_algorithm_driven_with_numpy_rounds_loads_its_own_state(changes):
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    for r in np.arange(1, 3):
        drive_round(alg, r, _train)
    state = alg.state_dict()
    assert type(state["round"]) is int and json.dumps(state["round"]) == "2"
    other = build_algorithm(_config(**changes), torch.zeros(4))
    other.load_state_dict(state)  # was refused: "round must be an integer >= 0, got 2"
    assert other.round_num == 2 and other.epsilon() == alg.epsilon()
    legacy = {**state, "round": np.int64(2)}  # a state saved so before
    other = build_algorithm(_config(**changes), torch.zeros(4))
    other.load_state_dict(legacy)
    assert type(other.round_num) is int


# -- finding 2: a build_model() that returns a model it keeps ----------------------------------


class _KeptModelTask(ToyClassificationTask):
    """The toy task whose build_model() returns one model (or one head) it keeps."""

    def __init__(self, share: str, **params):
        super().__init__(**params)
        self.share, self.kept = share, None

    def build_model(self):
        if self.kept is None:
            self.kept = super().build_model()
        if self.share == "model":
            return self.kept
        return torch.nn.Sequential(torch.nn.Identity(), self.kept)  # a fresh wrapper


@pytest.mark.parametrize("share", ["model", "submodule"])
def test_2_a_model_kept_by_the_task_is_refused_before_training(share):
    task = _KeptModelTask(share, num_users=4)
    with pytest.raises(TaskError, match=r"_KeptModelTask.build_model\(\) returned (the same "
                       r"model|a model sharing its submodule '1') at two calls"):  # fmt: skip
        LocalTrainer(task, device="cpu")  # was taken: the evaluated model was the trained one
    LocalTrainer(build_task("toy", num_users=4), device="cpu")  # a fresh model every call


# -- finding 3: a state's model-sized tensors without dense values -----------------------------


def _edited(state, key, tensor):
    if key == "partial":
        return {**state, "partial": {**state["partial"], "point": tensor}}
    return {**state, key: tensor}


@pytest.mark.parametrize(
    ("changes", "key"),
    [({}, "params"), ({"strategy": "dp-fedadam"}, "params"), ({"ema-decay": 0.5}, "averaged"),
     ({"strategy": "dp-fedavg-adadp"}, "partial")],
)  # fmt: skip
@pytest.mark.parametrize("form", ["sparse", "meta"])
def test_3_a_state_tensor_without_dense_values_is_refused_naming_it(changes, key, form):
    alg = build_algorithm(_config(**changes), torch.zeros(4))
    if key == "partial":  # saved between ADADP's two cohorts
        rounds = alg.run_round(1)
        rounds.send(_train(next(rounds)))  # cohort 1 summed, the half-step point sent
    else:
        drive_round(alg, 1, _train)
    state = alg.state_dict()
    good = state[key]["point"] if key == "partial" else state[key]
    bad = good.to_sparse() if form == "sparse" else torch.empty(4, device="meta")
    other = build_algorithm(_config(**changes), torch.zeros(4))
    with pytest.raises(ValueError, match=rf"checkpoint's {key} must be a dense tensor"):
        other.load_state_dict(_edited(state, key, bad))  # was taken; round 2 then raised
    assert other.round_num == 0 and other.accountant.num_events == 0
    other.load_state_dict(state)
    assert other.round_num == (0 if key == "partial" else 1)


# -- finding 4: privatize_update given a tensor subclass -----------------------------------------


def test_4_privatize_update_refuses_a_tensor_subclass():
    lying = torch.full((4,), 100.0).as_subclass(_Lying)
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match=r"update is a _Lying \(a torch.Tensor subclass"):
        privatize_update(lying, clip_norm=1.0, noise_std=0.5, generator=generator)  # unclipped
    out = privatize_update(torch.nn.Parameter(torch.full((4,), 100.0)), clip_norm=1.0)
    assert out.clipped and float(out.vector.norm()) <= 1.0


# -- finding 5: aggregate's cohort given as an iterator, or of entries that are no user ids -----


@pytest.mark.parametrize("secure", [False, True])
def test_5_a_cohort_given_as_an_iterator_is_read_once(secure):
    alg = build_algorithm(_config(secure=secure), torch.zeros(4))
    users = alg.sample(1)
    updates = {u: torch.full((4,), 0.1) for u in users}
    agg = alg.aggregate(1, updates, cohort=iter(users))
    assert agg.metrics["accepted"] == len(users)  # was 0: a round of noise alone, charged
    assert agg.metrics["rejected"] == 0


@pytest.mark.parametrize("entry", [True, 1.0, "1", torch.tensor(1)])
def test_5_a_cohort_entry_that_is_no_user_id_is_refused(entry):
    alg = build_algorithm(_config(), torch.zeros(4))
    updates = {u: torch.full((4,), 0.1) for u in alg.sample(1)}
    with pytest.raises(ValueError, match=r"cohort entry \(a user id\) must be an integer"):
        alg.aggregate(1, updates, cohort=[entry])
    assert alg.accountant.num_events == 0


# -- finding 6: a factory registered under a name, from a module of one's own -------------------


def test_6_a_registered_factory_of_ones_own_is_part_of_the_data_identity(tmp_path, monkeypatch):
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    name = f"regtask42_{abs(hash(str(tmp_path)))}"
    source = tmp_path / f"{name}.py"
    text = (
        "from fedprivopt.models.toy import ToyClassificationTask\nSEED = {}\n"
        "def make(**params):\n    return ToyClassificationTask(seed=SEED, **params)\n"
    )
    source.write_text(text.format(3))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)
    register_task("mytoy42", module.make)
    register_task("mytoy42p", functools.partial(module.make, num_users=4))  # of functools
    before = data_identity(build_task("mytoy42", num_users=4))
    assert before is not None and before[TASK_SOURCE]["module"] == name  # was None: not recorded
    # a partial made here of that module's make: recorded by both modules (forty-sixth review,
    # api 2: the module that made the partial sets its arguments; it was make's module alone)
    assert data_identity(build_task("mytoy42p"))[TASK_SOURCE]["module"].startswith(f"{name} and ")
    source.write_text(text.format(4))
    after = data_identity(build_task("mytoy42", num_users=4))
    assert after[TASK_SOURCE]["sha256"] != before[TASK_SOURCE]["sha256"]
    assert data_identity(build_task("toy", num_users=4)) is None  # packaged: unchanged
    source.write_text(
        "import functools\nfrom fedprivopt.models.toy import ToyClassificationTask\n"
        "made = functools.partial(ToyClassificationTask, heterogeneity=0.5)\n"
    )
    monkeypatch.delitem(sys.modules, name, raising=False)
    made = data_identity(build_task(f"{name}:made", num_users=4))  # a reference to a partial
    assert made[TASK_SOURCE]["module"] == name  # was functools' source, not the module's


# -- finding 7: LocalTrainer.train given a model vector without dense values --------------------


@pytest.mark.parametrize("name", ["global_flat", "preconditioner"])
@pytest.mark.parametrize("form", ["sparse", "meta"])
def test_7_a_train_argument_without_dense_values_is_refused_naming_it(name, form):
    task = build_task("toy", num_users=4)
    trainer, flat = LocalTrainer(task, device="cpu"), initial_flat(task)
    args = {"global_flat": flat, "preconditioner": torch.ones_like(flat)}
    meta = torch.empty_like(flat, device="meta")
    args[name] = args[name].to_sparse() if form == "sparse" else meta
    config = LocalConfig(learning_rate=0.5, epochs=1, batch_size=16, clip_norm=1.0)
    with pytest.raises(ValueError, match=rf"^{name} must be a dense tensor with values"):
        trainer.train(**args, user_id=0, round_num=1, config=config, rngs=RngFactory(0))
