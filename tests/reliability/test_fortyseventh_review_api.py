"""Issue 15, forty-seventh hostile review (api: the documented Python API): tests.

1. A replacement ``add_noise`` (a ``LocalTrainer`` subclass overriding it, its documented
   extension point, or ``privatize_update(..., add_noise=...)`` in a ClientApp of one's own)
   that leaves out the noise share: ``out + noise`` whose sum is dropped, or the vector it was
   given returned as it is. Before: the clipped update was sent without its share (toy, 33
   entries, C = 1, share std 0.3: norm 1.0 sent, equal to the clipped update), and the
   server's own check (``NoisyMeanAggregator.share_floor``) cannot tell for ``d <= 200``: in
   distributed-noise mode a round of such updates was released with no noise, charged as
   noised. Now ``clients.privatize._refuse_missing_noise`` refuses a share whose norm is below
   the chi-square's e^-50 quantile (less the rounding of the sum), naming ``add_noise``; honest
   replacements (in place or not, float16 to float64) pass.
2. A ClientApp of one's own (docs/FLOWER.md's loop) that loads each user's model with
   ``model.load_state_dict(request.state, assign=True)`` (torch's way for a model built on
   the meta device), makes its parameters views of ``request.global_flat``
   (``vector_to_parameters``), or updates ``request.preconditioner`` in place, users [1, 2].
   Before: the message's tensors were trained in place: user 2 started from user 1's local
   model (its update 0.305 apart from user 2 trained alone: user 1's data in user 2's update)
   and user 1's update was 0 (``global_flat`` first read after its training). Now
   ``TrainMessage.privatize`` refuses (``TrainMessage._refuse_changed``, against a copy taken
   when the message is read) naming ``request.state``, ``global_flat`` or ``preconditioner``;
   the documented loop (``load_state_dict`` without ``assign``) gives its bytes as before.
3. ``register_task("sweep", functools.partial(ToyClassificationTask, seed=seed),
   replace=True)`` in a loop over seeds 3 and 4 in one module (a data-seed sweep), or a name
   moved to another factory of the same module. Before: the data identity was the module's
   digest alone, equal for both, so ``resume()`` of a run started with seed 3 went on with
   round 2 on seed 4's data (``eval_accuracy`` 0.6133, epsilon 10.28), and ``compare``'s reuse
   alike. Now ``registry.factory_text`` records which factory (its qualified name and a
   partial's JSON arguments) beside the digest: ``resume()`` is refused naming both factories.
4. A task whose ``build_model()`` raises (or calls ``sys.exit()``) at a later call than the
   run's first (a weights file moved away after the start), given to ``LocalTrainer`` (which
   calls it twice), ``simulate toy.toml --set task=secondcall47:make``. Before: the trainer
   called it unchecked: a 60-line traceback, rc 1 (the first call gives one line, rc 2), and a
   ClientApp sent the exception's text to the server. Now ``LocalTrainer._build_model`` makes
   it the task's error: ``Once.build_model() raised RuntimeError at ...``, rc 2. So do
   ``model_spec``, ``initial_flat``, ``frozen_mask`` and AdaDPS' public users
   (``side_information.gradient_second_moment``; ``--set strategy=adadps --set
   side-information.kind=public-users``: a traceback, rc 1, before) through
   ``models.task.built_model``.
5. ``fedprivopt tune toy.toml --grid server-learning-rate=0.5,1 --set task=evalraise47:make``
   with a task whose ``evaluate()`` raises its own exception (a held-out file gone). Before:
   ``tune.check_metric`` called it unchecked: a traceback, rc 1, where ``simulate`` gives one
   line. Now it is the task's error (``EvalRaise.evaluate() raised OSError at ...``), rc 2.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

import pytest
import torch

from fedprivopt.clients import LocalTrainer, TrainMessage, noise_generator, privatize_update
from fedprivopt.core.local import LocalConfig
from fedprivopt.models import build_task, initial_flat
from fedprivopt.models import registry as registry_module
from fedprivopt.models.task import TaskError, data_identity
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.privacy import RngFactory
from fedprivopt.privacy.noise import add_gaussian_noise
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.simulation.tune import check_metric
from tests.clients.test_messages import PARAMS, _message

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"

# -- finding 1: a replacement add_noise that leaves out the share -------------------------------


def _dropped(vector, std, generator):
    out = vector.clone()
    out + torch.randn(vector.shape, generator=generator, dtype=vector.dtype) * std
    return out


def _given(vector, std, generator):
    return vector


def _in_place(vector, std, generator):
    noise = torch.randn(vector.shape, generator=generator, dtype=torch.float32) * std
    return vector.add_(noise.to(vector.dtype))


@pytest.mark.parametrize("add_noise", [_dropped, _given])
def test_1_a_replacement_add_noise_without_the_share_is_refused(add_noise):
    gen = noise_generator(seed=0, secure=False, round_num=1, user_id=1)
    with pytest.raises(ValueError, match="add_noise returned an update without its noise share"):
        privatize_update(torch.full((33,), 0.5), clip_norm=1.0, noise_std=0.3, generator=gen,
                         add_noise=add_noise)  # fmt: skip


class _Dropped(LocalTrainer):
    def add_noise(self, delta, std, generator):
        return _dropped(delta, std, generator)


def test_1_a_trainer_whose_add_noise_drops_the_share_sends_nothing():
    task = build_task("toy", num_users=5, examples_per_user=(20, 20))
    config = LocalConfig(learning_rate=5.0, epochs=1, batch_size=4, clip_norm=1.0,
                         noise_std=0.075)  # fmt: skip
    call = {"user_id": 1, "round_num": 1, "config": config, "rngs": RngFactory(0)}
    with pytest.raises(ValueError, match="add_noise returned an update without its noise"):
        _Dropped(task, device="cpu").train(initial_flat(task), **call)
    assert LocalTrainer(task, device="cpu").train(initial_flat(task), **call).delta.numel() == 33


def test_1_honest_replacements_pass():
    gen = torch.Generator().manual_seed(0)
    steps = [_in_place, lambda v, s, g: add_gaussian_noise(v, s, generator=g)]
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        for size in (1, 2, 33, 500):
            for std, scale in ((1e-9, 1.0), (0.3, 0.01), (0.3, 10.0), (2.0, 1.0)):
                for step in steps:
                    update = (torch.randn(size, generator=gen) * scale).to(dtype)
                    privatize_update(update, clip_norm=1.0, noise_std=std, generator=gen,
                                     add_noise=step)  # fmt: skip


# -- finding 2: a ClientApp of one's own that trains the message's tensors in place -----------


def _own_loop(request, task, how):
    out = {}
    for user in request.users:
        model = task.build_model()
        if how == "views":
            torch.nn.utils.vector_to_parameters(request.global_flat, model.parameters())
        else:
            model.load_state_dict(request.state, assign=how == "assign")
        x, y = task.user_data(user)
        for _ in range(3):  # plain SGD steps in place, as torch.optim.SGD takes them
            grads = torch.autograd.grad(task.loss(model, x, y), list(model.parameters()))
            with torch.no_grad():
                for param, grad in zip(model.parameters(), grads, strict=True):
                    param.sub_(0.5 * grad)
        if how == "preconditioner":
            request.preconditioner.add_(1.0)  # an Adagrad-like accumulation
        delta = request.flatten(model.state_dict()) - request.global_flat
        out[user] = request.privatize(delta, user).vector
    return out


@pytest.mark.parametrize(
    "how, changed",
    [
        ("assign", "state"),
        ("views", "global_flat"),
        ("preconditioner", "preconditioner"),
    ],
)
def test_2_a_loop_training_the_message_in_place_is_refused(how, changed):
    task = build_task("toy", **PARAMS)
    local = LocalConfig(learning_rate=0.5, epochs=1, batch_size=4, clip_norm=10.0)
    precond = torch.ones(18).numpy() if how == "preconditioner" else None
    request = TrainMessage.read(_message(task, [1, 2], local, precond=precond))
    with pytest.raises(ValueError, match=rf"request.{changed} changed in place"):
        _own_loop(request, task, how)


def test_2_the_documented_loop_sends_each_user_its_own_update():
    task = build_task("toy", **PARAMS)
    local = LocalConfig(learning_rate=0.5, epochs=1, batch_size=4, clip_norm=10.0)
    both = _own_loop(TrainMessage.read(_message(task, [1, 2], local)), task, "copy")
    alone = _own_loop(TrainMessage.read(_message(task, [2], local)), task, "copy")
    assert torch.equal(both[2], alone[2]) and float(both[1].norm()) > 0.5


# -- finding 3: a registered name moved to another factory of the same module ------------------


def _module(tmp_path, monkeypatch, text):
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    monkeypatch.setattr(registry_module, "_REGISTERED_BY", dict(registry_module._REGISTERED_BY))
    name = f"sweep47_{abs(hash(str(tmp_path)))}"
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)


def test_3_a_registered_name_records_which_factory(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, (
        "import functools\nfrom fedprivopt.models import register_task\n"
        "from fedprivopt.models.toy import ToyClassificationTask\n"
        "def small(**p):\n    return ToyClassificationTask(seed=3, **p)\n"
        "def large(**p):\n    return ToyClassificationTask(seed=4, **p)\n"
        "def sweep(seed):\n    register_task('sweep47', functools.partial("
        "ToyClassificationTask, seed=seed), replace=True)\n"
    ))  # fmt: skip
    ids = []
    for seed in (3, 4, 3):
        mod.sweep(seed)
        ids.append(data_identity(build_task("sweep47", num_users=4)))
    assert ids[0] != ids[1] and ids[0] == ids[2]  # was equal for seeds 3 and 4
    registry_module.register_task("t47", mod.small)
    small = data_identity(build_task("t47", num_users=4))
    registry_module.register_task("t47", mod.large, replace=True)
    assert data_identity(build_task("t47", num_users=4)) != small
    assert data_identity(build_task("toy", num_users=4)) is None  # packaged: unchanged


def test_3_resume_under_another_registration_is_refused(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, (
        "import functools\nfrom fedprivopt.models import register_task\n"
        "from fedprivopt.models.toy import ToyClassificationTask\n"
        "def sweep(seed):\n    register_task('sweep47r', functools.partial("
        "ToyClassificationTask, seed=seed), replace=True)\n"
    ))  # fmt: skip
    mod.sweep(3)
    out = tmp_path / "run"
    logging.disable(logging.WARNING)  # absl's RDP warnings
    try:
        simulate(load_config(TOY, {"task": "sweep47r", "num-server-rounds": 1}), out)
    finally:
        logging.disable(logging.NOTSET)
    config = out / "config.toml"
    text = config.read_text()
    config.write_text(text.replace("num-server-rounds = 1", "num-server-rounds = 2"))
    mod.sweep(4)
    with pytest.raises(ValueError, match=r"task's code changed .*factory .*seed.*: 4"):
        resume(out)  # was: round 2 on seed 4's data, eval_accuracy 0.6133


# -- finding 4: build_model() raising at a later call, inside LocalTrainer ---------------------


class _Once(ToyClassificationTask):
    def __init__(self, limit, how, **params):
        super().__init__(**params)
        self.calls, self.limit, self.how = 0, limit, how

    def build_model(self):
        self.calls += 1
        if self.calls > self.limit:
            if self.how == "exit":
                raise SystemExit(0)
            raise RuntimeError("weights file already consumed")
        return super().build_model()


@pytest.mark.parametrize("how", ["raise", "exit"])
@pytest.mark.parametrize("limit", [0, 1])
def test_4_build_model_raising_in_the_trainer_is_the_tasks_error(limit, how):
    with pytest.raises(TaskError, match=r"_Once.build_model\(\)"):
        LocalTrainer(_Once(limit, how, num_users=4), device="cpu")


# -- finding 5: tune's check of the metric calls evaluate() unchecked --------------------------


class _EvalRaise(ToyClassificationTask):
    def evaluate(self, model):
        raise OSError("held-out file gone")


def test_5_tunes_metric_check_gives_the_tasks_error():
    with pytest.raises(TaskError, match=r"_EvalRaise.evaluate\(\) raised OSError at .*gone"):
        check_metric(None, [_EvalRaise(num_users=4)])
    check_metric("eval_accuracy", [ToyClassificationTask(num_users=4)])


@pytest.mark.parametrize("call", ["model_spec", "initial_flat", "frozen_mask", "public_users"])
def test_4_every_build_model_call_gives_the_tasks_error(call):
    from fedprivopt.models import task as task_module
    from fedprivopt.models.side_information import gradient_second_moment

    task = _Once(0, "raise", num_users=4)
    calls = {
        "public_users": lambda t: gradient_second_moment(t, [0], batch_size=4),
        **{name: getattr(task_module, name) for name in ("model_spec", "initial_flat",
                                                         "frozen_mask")},
    }  # fmt: skip
    with pytest.raises(TaskError, match=r"_Once.build_model\(\) raised RuntimeError"):
        calls[call](task)
