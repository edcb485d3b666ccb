"""Issue 15, forty-sixth hostile review (api: the documented Python API): tests.

1. ``privatize_update(delta, clip_norm=C, clip=my_clip)`` (a user's own ClientApp step,
   docs/FLOWER.md), or a ``LocalTrainer`` subclass overriding ``clip`` (its documented
   extension point), whose replacement clips each layer to ``C`` (two layers: norm 1.41 C) or
   forgets to scale (norm 10 C), returns a vector of another shape, dtype or a plain tuple;
   an ``add_noise`` returning float64 for a float32 update. Before: the replacement's result
   was sent as it was (norm 1.41 and 10 where C = 1; shape (3,) for (100,); float64;
   ``AttributeError: 'Tensor' object has no attribute 'vector'``); in distributed-noise mode
   the server keeps updates up to ``C + s (sqrt(d) + 10)`` (it cannot re-clip a noised
   share), so they reached the sum above C under a charge of C. Now
   ``clients.privatize._checked_clip`` refuses a result above C (or not a ``ClipResult`` of
   a plain tensor like the update) naming ``clip``, and ``_refuse_other_tensor`` an
   ``add_noise`` result of another shape, dtype or kind naming ``add_noise``; ``clip_l2``
   given as ``clip`` gives the default's bytes.
2. ``register_task("mytoy46", functools.partial(helper.make, seed=SEED))`` in a module of
   one's own, where ``make`` is a factory of one's own kept in another module (a helper) and
   ``SEED`` is set in the registering module (also ``task = "regmod:made"`` with ``made``
   such a partial). Before: only the helper's module was recorded (``task_source`` named
   ``helper46``), so an edit of ``SEED`` (3 to 4) went unseen by ``resume()`` and
   ``compare``'s reuse, where docs/TASKS.md says a partial is recorded by the module that made
   it (the forty-second review's api 6 and 8 and the forty-third's api 2 through a partial of a
   helper). Now ``models.registry._partial_modules`` records both modules
   (``note_factory`` takes a tuple, ``helper46... and regmod46...``); a partial of a packaged
   class or of a function of the same module keeps its one module.
3. A task whose ``build_model()`` has a lazy module (``torch.nn.LazyLinear``) or is built on
   the ``meta`` device, given to ``LocalTrainer(task)`` (a ClientApp's trainer, docs/FLOWER.md),
   ``initial_flat(task)`` or ``model_spec(task)`` (the 44th review's api 4 through unbuilt
   tensors). Before: torch's errors naming neither the task nor the entry (``ValueError:
   Attempted to use an uninitialized parameter ...``, ``RuntimeError: Can't access the shape of
   an uninitialized parameter``, ``NotImplementedError: Cannot copy out of meta tensor``),
   where ``simulate`` refuses it in one line. Now ``models.task.refuse_unbuilt_model`` raises
   that line as a ``TaskError`` naming the task and the entry.
4. A ``LocalTrainer`` subclass overriding ``precondition`` (a documented step) that updates
   the preconditioner it is given in place (an Adagrad-like accumulation of squared
   gradients, ``p.add_(grad.pow(2))``), training users 1 then 2 with one preconditioner (a
   node's ``request.preconditioner`` is one tensor for all its users; fedprivopt's ClientApp
   passes it so). Before: ``train`` handed the override the caller's tensor itself
   (``Tensor.to`` of the same device and dtype), so user 2 trained with user 1's gradients in
   its preconditioner: its update depended on user 1's data (0.0073 apart from user 2 alone),
   and the caller's preconditioner moved by 0.78. Now ``LocalTrainer._check_preconditioner``
   gives each call a copy of its own: user 2's update equals user 2's alone.
5. A task's own cohort trainer (a ``CohortTrainer`` subclass) that writes ``noise_shares`` as
   a method (``def noise_shares(self): return False``), run in distributed-noise mode on the
   fast engine (``simulate toy.toml --set noise-mode=distributed``). Before: the fast engine
   read it by its truth (a bound method is true) and trusted the cohort trainer to add the
   shares it does not add; with the toy's 33 entries ``_refuse_missing_share`` cannot tell,
   so the round was released bit for bit as the noiseless one (noise-multiplier 1e-9), charged
   and reported as noised (epsilon 7.551, ``noise_std`` 0.075). Now
   ``UserTrainer._declares_shares`` refuses a ``noise_shares`` that is not a bool, naming it
   (rc 2, one line); True and False (and NumPy's bools) as before.
6. A ``drive_round`` callback (or ``aggregate``'s caller) returning a ``dict`` subclass of
   one's own that has a method named ``sorted_by_user`` (``return sorted(self.items())``),
   holding one workspace reused for every user (the forty-fifth review's api 3 through that
   name; dp-fedavg and ADADP). Before: the aggregation read ``sorted_by_user`` by its truth
   (a bound method is true) and took the fast engine's streamed path, where the shared
   memory is not refused: the last user's update summed once for every user (model 0.45
   where 0.05), a sensitivity of 9C under a charge of C. Now only the bool ``True``
   declares a streamed cohort (``AlgorithmAggregation._aggregate_in_round``): refused as
   ``the updates of users 0 and 1 are held in the same memory``; distinct updates in such a
   mapping are summed as before.
7. ``build_algorithm(config, initial)`` (a ServerApp, docs/FLOWER.md) with ``initial`` a NumPy
   array (the model as NumPy) or a list. Before: ``AttributeError: 'numpy.ndarray' object has
   no attribute 'dim'`` naming nothing. Now ``ServerAlgorithm.__init__`` raises a
   ``TypeError`` naming ``initial_params``.
8. ``alg.broadcast_preconditioner()`` of an ``adadps`` algorithm edited in place by the caller
   (``A = alg.broadcast_preconditioner(); A.mul_(5)``, say to normalize it for a plot) after
   round 1, then round 2 (the thirty-seventh review's edit of the constructor's A through
   this method). Before: it was the algorithm's own A, so round 2 broadcast 5 where 1, while
   ``state_dict()`` kept the digest of the A the run began with (a fresh algorithm built with
   the original A loaded it). Now ``AdaDPS.broadcast_preconditioner`` returns a copy: round 2
   broadcasts the A of the build. DP2's (its adaptive rounds' ``P``) was the optimizer state's
   own: ``mul_(7)`` moved the server's ``P`` from 0.058 to 0.406; a copy too.
"""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
import torch

from fedprivopt.clients import LocalTrainer, privatize_update
from fedprivopt.core.local import LocalConfig
from fedprivopt.models import build_task, initial_flat
from fedprivopt.models import registry as registry_module
from fedprivopt.models.cohort import CohortTrainer
from fedprivopt.models.task import TASK_SOURCE, TaskError, data_identity, model_spec
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.privacy import RngFactory
from fedprivopt.privacy.clip import ClipResult, clip_l2
from fedprivopt.simulation.fast_trainer import UserTrainer
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
)

# -- finding 1: a replacement clip (or add_noise) was trusted --------------------------------


def _per_layer(delta, clip_norm):
    """Clips each half to C (a per-layer clip without sharing C between the layers)."""
    half = delta.numel() // 2
    parts = [clip_l2(delta[:half], clip_norm).vector, clip_l2(delta[half:], clip_norm).vector]
    return ClipResult(torch.cat(parts), float(delta.norm()), True)


def _unscaled(delta, clip_norm):
    return ClipResult(delta * 1.0, float(delta.norm()), False)


@pytest.mark.parametrize("clip", [_per_layer, _unscaled])
def test_1_a_replacement_clip_above_c_is_refused(clip):
    with pytest.raises(ValueError, match=r"clip returned an update of L2 norm above clip_norm"):
        privatize_update(torch.full((100,), 1.0), clip_norm=1.0, clip=clip)


@pytest.mark.parametrize(
    "clip, words",
    [
        (lambda d, c: ClipResult(d[:3] * 0, 0.0, False), "shape"),
        (lambda d, c: ClipResult(d.double() * 0, 0.0, False), "dtype"),
        (lambda d, c: d * 0, "ClipResult"),
    ],
)
def test_1_a_replacement_clip_of_another_kind_is_refused(clip, words):
    with pytest.raises(ValueError, match=rf"clip must return .*{words}"):
        privatize_update(torch.full((100,), 1.0), clip_norm=1.0, clip=clip)


def test_1_a_replacement_add_noise_of_another_dtype_is_refused():
    def wider(vector, std, generator):
        return vector.double()

    with pytest.raises(ValueError, match=r"add_noise must return .*dtype torch.float32"):
        privatize_update(torch.full((4,), 0.1), clip_norm=1.0, noise_std=0.1,
                         generator=torch.Generator(), add_noise=wider)  # fmt: skip


def test_1_clip_l2_as_the_replacement_gives_the_default_bytes():
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        gen = torch.Generator().manual_seed(0)
        update = (torch.randn(5000, generator=gen, dtype=torch.float64) * 0.03).to(dtype)
        for clip_norm in (1.0, 0.1, 3e-3):
            got = privatize_update(update, clip_norm=clip_norm, clip=clip_l2).vector
            assert torch.equal(got, privatize_update(update, clip_norm=clip_norm).vector)


class _PerLayerTrainer(LocalTrainer):
    def clip(self, delta, clip_norm):
        return _per_layer(delta, clip_norm)


def test_1_a_trainer_overriding_clip_in_distributed_mode_sends_nothing_above_c():
    task = build_task("toy", num_users=5, examples_per_user=(20, 20))
    config = LocalConfig(learning_rate=5.0, epochs=2, batch_size=4, clip_norm=0.05,
                         noise_std=0.01)  # fmt: skip
    # the server of this setting would keep it: C + s (sqrt(d) + 10) is above its norm
    strategy = StrategyConfig.from_mapping({"population": 5, "clients-per-round": 4,
                                           "noise-mode": "distributed", "clip-norm": 0.05,
                                           "noise-multiplier": 0.5})  # fmt: skip
    server = build_algorithm(strategy, initial_flat(task))
    assert server.aggregator.accept_norm(33) > 0.05 * 1.5
    with pytest.raises(ValueError, match="clip returned an update of L2 norm"):
        _PerLayerTrainer(task, device="cpu").train(
            initial_flat(task), user_id=1, round_num=1, config=config, rngs=RngFactory(0)
        )
    honest = LocalTrainer(task, device="cpu").train(
        initial_flat(task), user_id=1, round_num=1, config=config, rngs=RngFactory(0)
    )
    assert honest.clipped


# -- finding 2: a registered partial of a helper's factory, made in another module ------------


def _import_fresh(monkeypatch, name):
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)


@pytest.mark.parametrize("registered", [True, False])
def test_2_a_partial_of_a_helper_factory_is_recorded_by_the_module_that_made_it(
    tmp_path, monkeypatch, registered
):
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    monkeypatch.setattr(registry_module, "_REGISTERED_BY", dict(registry_module._REGISTERED_BY))
    tag = abs(hash(str(tmp_path)))
    helper, maker = f"helper46_{tag}", f"regmod46_{tag}"
    (tmp_path / f"{helper}.py").write_text(
        "from fedprivopt.models.toy import ToyClassificationTask\n"
        "def make(seed=0, **params):\n    return ToyClassificationTask(seed=seed, **params)\n"
    )
    source = tmp_path / f"{maker}.py"
    text = (
        f"import functools\nimport {helper}\nfrom fedprivopt.models import register_task\n"
        f"SEED = {{}}\nmade = functools.partial({helper}.make, seed=SEED)\n"
        "register_task('mytoy46', made, replace=True)\n"
    )
    source.write_text(text.format(3))
    monkeypatch.syspath_prepend(str(tmp_path))
    _import_fresh(monkeypatch, helper)
    _import_fresh(monkeypatch, maker)
    name = "mytoy46" if registered else f"{maker}:made"
    before = data_identity(build_task(name, num_users=4))[TASK_SOURCE]
    assert before["module"] == f"{helper} and {maker}"  # the helper alone before
    source.write_text(text.format(4))
    _import_fresh(monkeypatch, maker)
    after = data_identity(build_task(name, num_users=4))[TASK_SOURCE]
    assert after["sha256"] != before["sha256"]  # equal before (registered): the edit unseen


# -- finding 3: a lazy or meta model given to the trainer of a ClientApp ----------------------


class _LazyToy(ToyClassificationTask):
    def build_model(self):
        return torch.nn.Sequential(torch.nn.LazyLinear(self.num_classes))


class _MetaToy(ToyClassificationTask):
    def build_model(self):
        return torch.nn.Linear(self.dim, self.num_classes, device="meta")


@pytest.mark.parametrize("build", [LocalTrainer, initial_flat, model_spec])
@pytest.mark.parametrize(
    "task, words",
    [(_LazyToy, r"_LazyToy.build_model\(\) .*'0.weight' is uninitialized \(a lazy module"),
     (_MetaToy, r"_MetaToy.build_model\(\) .*'weight' is on device meta")],
)  # fmt: skip
def test_3_a_lazy_or_meta_model_is_refused_naming_the_task(build, task, words):
    with pytest.raises(TaskError, match=words):
        build(task(num_users=3))


# -- finding 4: a precondition override updating its preconditioner in place ----------------


class _Accumulating(LocalTrainer):
    def precondition(self, grad_flat, preconditioner):
        preconditioner.add_(grad_flat.pow(2))  # Adagrad-like, within one user's training
        return grad_flat / preconditioner.sqrt()


def test_4_a_preconditioner_updated_by_one_user_does_not_reach_the_next():
    task = build_task("toy", num_users=5, examples_per_user=(10, 10))
    config = LocalConfig(learning_rate=0.1, epochs=1, batch_size=5, clip_norm=10.0)
    flat = initial_flat(task)

    def train(trainer, user, shared):
        return trainer.train(flat, user_id=user, round_num=1, config=config, rngs=RngFactory(0),
                             preconditioner=shared).delta  # fmt: skip

    alone = train(_Accumulating(task, device="cpu"), 2, torch.ones_like(flat))
    trainer, shared = _Accumulating(task, device="cpu"), torch.ones_like(flat)
    train(trainer, 1, shared)
    assert torch.equal(train(trainer, 2, shared), alone)  # 0.0073 apart before
    assert torch.equal(shared, torch.ones_like(flat))  # the caller's moved by 0.78


# -- finding 5: a cohort trainer whose noise_shares is no bool ---------------------------------


class _MethodShares(CohortTrainer):
    def noise_shares(self):  # meant as "no": a bound method is true
        return False

    def train_batches(self, *args, **kwargs):
        raise AssertionError("not reached in distributed-noise mode")


@pytest.mark.parametrize("shares, mode", [(None, "refused"), (False, "sequential"),
                                          (True, "vectorized")])  # fmt: skip
def test_5_noise_shares_must_be_a_bool(shares, mode):
    task = build_task("toy", num_users=5)
    trainer = _MethodShares(task, device="cpu", chunk_users=4)
    if shares is not None:
        trainer.noise_shares = shares
    task.cohort_trainer = lambda device, chunk_users: trainer
    users = UserTrainer(task, device="cpu", vectorize=True, chunk_users=4, secure=False)
    config = StrategyConfig.from_mapping({"population": 5, "clients-per-round": 4,
                                         "noise-mode": "distributed"})  # fmt: skip
    settings = build_algorithm(config, initial_flat(task)).client_settings(clip_norm=1.0)
    assert settings.local.noise_std > 0
    if mode == "refused":
        with pytest.raises(TaskError, match=r"noise_shares must be True or False"):
            users.mode(settings)  # "vectorized" before: no shares added, no noise released
    else:
        assert users.mode(settings) == mode


# -- finding 6: a dict subclass with a method named sorted_by_user ---------------------------


class _Sorting(dict):
    def sorted_by_user(self):
        return sorted(self.items())


def _one_workspace(request):
    work, out = torch.zeros(4), _Sorting()
    for user in request.users:
        work.fill_(1.0 if user == request.users[-1] else 0.0)
        out[user] = work
    return out


def _own_memory(request):
    last = request.users[-1]
    return _Sorting({u: torch.full((4,), 1.0 if u == last else 0.0) for u in request.users})


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp"])
def test_6_a_method_named_sorted_by_user_declares_no_streamed_cohort(strategy):
    config = _config(strategy=strategy, **{"noise-multiplier": 1e-6})
    with pytest.raises(ValueError, match=r"users 0 and 1 are held in the same memory"):
        drive_round(build_algorithm(config, torch.zeros(4)), 1, _one_workspace)  # 0.45 before
    honest = drive_round(build_algorithm(config, torch.zeros(4)), 1, _own_memory)
    assert float(honest.params.max()) < 0.1


# -- finding 7: initial parameters that are no tensor ----------------------------------------


@pytest.mark.parametrize("initial", [np.zeros(4, dtype=np.float32), [0.0] * 4])
def test_7_initial_params_that_are_no_tensor_are_refused_naming_them(initial):
    with pytest.raises(TypeError, match=r"initial_params must be a flat floating-point torch"):
        build_algorithm(_config(), initial)  # AttributeError ('dim') before


# -- finding 8: the side information returned to the caller was the algorithm's own ----------


def test_8_an_edit_of_the_broadcast_side_information_does_not_reach_later_rounds():
    alg = build_algorithm(_config(strategy="adadps"), torch.zeros(4), preconditioner=torch.ones(4))
    sent = []

    def train(request):
        sent.append(request.preconditioner.clone())
        return {u: torch.full((4,), 0.1) for u in request.users}

    drive_round(alg, 1, train)
    alg.broadcast_preconditioner().mul_(5)
    drive_round(alg, 2, train)
    assert torch.equal(sent[-1], torch.ones(4))  # 5 before


def test_8_an_edit_of_dp2s_broadcast_preconditioner_leaves_its_state():
    alg = build_algorithm(_config(strategy="dp2", **{"dp2-s1": 1, "dp2-s2": 1}), torch.zeros(4))
    drive_round(alg, 1, lambda request: {u: torch.full((4,), 0.1) for u in request.users})
    sent = alg.broadcast_preconditioner()
    before = sent.clone()
    sent.mul_(7)
    assert torch.equal(alg.broadcast_preconditioner(), before)  # 7 times it before
