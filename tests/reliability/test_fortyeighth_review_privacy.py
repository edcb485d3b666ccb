"""Issue 15, forty-eighth review: the privacy contract on the Flower messages and a user's code.

Privacy 1: a ClientApp of one's own (docs/FLOWER.md) that kept the last user's ``private`` past
its training loop and sent it for every user as copies (``updates[u] = private.vector.clone()``,
as the shared-memory refusal advises ``.clone()``), or reported every user's clip bit from it,
had that user's update (or bit) summed once for each user: a sensitivity of k C (a count change
of k) under a charge of C (one).

Privacy 2: a ``LocalTrainer`` subclass whose override kept its state in a ``torch.nn.Module`` on
the trainer (an Adagrad-like buffer, a ``BatchNorm1d`` of the gradients) carried earlier users'
gradients into a later user's update: the trainer set back its tensors and containers, not a
module's buffers and parameters.
"""

from __future__ import annotations

import pytest
import torch
from flwr.app import Array, ArrayRecord

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig, LocalTrainer, reply_updates
from fedprivopt.clients.messages import TrainMessage
from fedprivopt.models import build_task
from fedprivopt.models.task import initial_flat
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.privacy.rng import RngFactory
from tests.messages import delivered

USERS = (1, 2, 3)


def _message(noise_std: float, count_std: float | None):
    local = LocalConfig(
        learning_rate=0.1,
        clip_norm=1.0,
        noise_std=noise_std,
        clip_bit=count_std is not None,
        count_noise_std=count_std or 0.0,
    )
    settings = P.ClientSettings(local, seed=0)
    config = P.encode_train_config(users=list(USERS), round_num=1, settings=settings)
    arrays = ArrayRecord({"w": Array(torch.zeros(3).numpy())})
    return delivered({P.CONFIG_RECORD: config, P.ARRAYS_RECORD: arrays}, "train")


def _privatized(message):
    request = TrainMessage.read(message)
    deltas = {u: torch.tensor([0.5 * u, 0.2, -0.1]) for u in USERS}
    return request, {u: request.privatize(deltas[u], u) for u in USERS}


@pytest.mark.parametrize(("noise_std", "count_std"), [(0.0, None), (0.3, None), (0.3, 0.1)])
def test_1_a_copy_of_another_user_s_update_is_not_sent(noise_std, count_std):
    message = _message(noise_std, count_std)
    request, private = _privatized(message)
    last = private[3]
    bits = None
    if count_std is not None:
        bits = {u: request.clip_bit(private[u], u) for u in USERS}
    # before: sent; the server summed user 3's update three times (3 C where C is charged)
    with pytest.raises(ValueError, match=r"updates\[1\] is \(a copy of\) the update .* user 3"):
        reply_updates(message, {u: last.vector.clone() for u in USERS}, clip_bits=bits)
    with pytest.raises(ValueError, match=r"updates\[1\] .* user 3"):  # moved to float64
        reply_updates(message, {1: last.vector.double(), 3: last.vector}, clip_bits=bits and {
            1: bits[1], 3: bits[3]})  # fmt: skip
    reply = reply_updates(message, {u: private[u].vector for u in USERS}, clip_bits=bits)
    assert sorted(P.read_updates(reply.content)) == list(USERS)
    # a user's own update copied (moved) is its own
    reply = reply_updates(message, {u: private[u].vector.clone() for u in USERS}, clip_bits=bits)
    assert sorted(P.read_updates(reply.content)) == list(USERS)


def test_1_a_clip_bit_of_another_user_s_update_is_not_sent():
    message = _message(0.3, 0.1)
    request, private = _privatized(message)
    updates = {u: private[u].vector for u in USERS}
    # before: each user's bit reported from user 3's update (user 3 counted three times)
    with pytest.raises(ValueError, match=r"made for user 3, not user 1"):
        request.clip_bit(private[3], 1)
    one = request.clip_bit(private[3], 3)
    with pytest.raises(ValueError, match=r"clip_bits\[1\] and clip_bits\[2\] are one report"):
        reply_updates(message, updates, clip_bits=dict.fromkeys(USERS, one))
    bits = {u: request.clip_bit(private[u], u) for u in USERS}
    reply = reply_updates(message, updates, clip_bits=bits)
    assert sorted(P.read_updates(reply.content)) == list(USERS)


# -- 2: a LocalTrainer subclass keeping a module of its own on the trainer ------------------------

TASK = build_task("toy", num_users=10, dim=5, num_classes=3, seed=2)
LOCAL = LocalConfig(learning_rate=0.1, epochs=1, batch_size=4, clip_norm=10.0, max_examples=8)


class _Adagrad(torch.nn.Module):  # a preconditioner written as a module, its state a buffer
    def __init__(self, n):
        super().__init__()
        self.register_buffer("acc", torch.zeros(n))

    def forward(self, grad):
        self.acc += grad * grad
        return grad / (self.acc.sqrt() + 1e-3)


class _ModuleState(LocalTrainer):
    def __init__(self, task, **kwargs):
        super().__init__(task, **kwargs)
        self.pre = _Adagrad(self.spec.numel)
        self.norm = torch.nn.BatchNorm1d(self.spec.numel, affine=False)
        self.scale = torch.nn.Linear(1, self.spec.numel, bias=False)
        torch.nn.init.zeros_(self.scale.weight)

    def precondition(self, grad, preconditioner):
        self.norm(torch.stack([grad, 0.5 * grad]))  # running statistics of the gradients
        self.scale.weight.data[:, 0] += grad.abs()  # a parameter written through .data
        out = self.pre(grad) / (self.norm.running_var.sqrt() + 1e-3)
        return out / (1.0 + self.scale.weight[:, 0].detach())


def _last_update(users):
    trainer = _ModuleState(TASK, device="cpu")
    for user in users:
        result = trainer.train(
            initial_flat(TASK), user_id=user, round_num=1, config=LOCAL, rngs=RngFactory(seed=0)
        )
    return trainer, result.delta


def test_2_a_module_of_the_trainer_carries_nothing_to_the_next_user():
    _, alone = _last_update([3])
    trainer, after = _last_update([0, 1, 2, 3])
    # before: 0.137 apart in an entry (the module's buffer: users 0-2's gradients)
    assert torch.equal(after, alone)
    assert float(trainer.pre.acc.abs().sum()) == 0.0
    assert float(trainer.scale.weight.detach().abs().sum()) == 0.0


# -- 3: privacy 1 through privatize_update called directly (distributed noise) -----------------


def test_3_one_noised_update_sent_for_several_users_is_refused():
    from fedprivopt.clients import noise_generator, privatize_update

    message = _message(0.3, None)
    request = TrainMessage.read(message)
    own = {}
    for user in USERS:
        generator = noise_generator(
            seed=request.seed,
            secure=request.secure,
            round_num=request.round_num,
            user_id=user,
            stream=request.stream,
            device="cpu",
        )
        own[user] = privatize_update(
            torch.tensor([0.5 * user, 0.2, -0.1]),
            clip_norm=request.local.clip_norm,
            noise_std=request.local.noise_std,
            generator=generator,
        ).vector
    # before: sent, the last user's update (its share too) under every user's key
    with pytest.raises(ValueError, match=r"updates\[1\] and updates\[2\] hold the same values"):
        reply_updates(message, {u: own[3].clone() for u in USERS})
    reply = reply_updates(message, own)
    assert sorted(P.read_updates(reply.content)) == list(USERS)


# -- 4: an override's accumulator on the trainer written through .data or NumPy ---------------


class _DataWrite(LocalTrainer):
    way = "data"

    def __init__(self, task, **kwargs):
        super().__init__(task, **kwargs)
        self.acc = torch.zeros(self.spec.numel)
        self.box = [torch.zeros(self.spec.numel)]

    def precondition(self, grad, preconditioner):
        if self.way == "data":
            self.acc.data.add_(grad * grad)  # not counted by self.acc's version
        elif self.way == "numpy":
            self.acc.numpy()[:] += (grad * grad).numpy()
        else:
            self.box[0].data.add_(grad * grad)
            return grad / (self.box[0].sqrt() + 1e-3)
        return grad / (self.acc.sqrt() + 1e-3)


@pytest.mark.parametrize("way", ["data", "numpy", "inner"])
def test_4_a_write_through_data_or_numpy_is_set_back_too(way, monkeypatch):
    monkeypatch.setattr(_DataWrite, "way", way)

    def last(users):
        trainer = _DataWrite(TASK, device="cpu")
        for user in users:
            result = trainer.train(
                initial_flat(TASK), user_id=user, round_num=1, config=LOCAL, rngs=RngFactory(0)
            )
        return result.delta

    # before: 0.137 apart in an entry (users 0-2's gradients kept in the accumulator)
    assert torch.equal(last([0, 1, 2, 3]), last([3]))


# -- 5: a task's forward keeping a running mean on its model through .data or NumPy ------------


class _RunningNet(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.running = torch.zeros(5)
        self.box = [torch.zeros(5)]

    def forward(self, x):
        self.running.data.add_(x.mean(0))  # a running mean through .data
        self.box[0].numpy()[:] += x.mean(0).numpy()  # and one through NumPy
        return self.inner(x + 0.1 * self.running + 0.1 * self.box[0])


class _RunningTask(ToyClassificationTask):
    def build_model(self):
        return _RunningNet(super().build_model())


def test_5_a_forward_s_write_through_data_or_numpy_is_set_back_for_every_user():
    task = _RunningTask(num_users=10, dim=5, num_classes=3, seed=2)

    def last(users):
        trainer = LocalTrainer(task, device="cpu")
        for user in users:
            result = trainer.train(
                initial_flat(task), user_id=user, round_num=1, config=LOCAL, rngs=RngFactory(0)
            )
        return result.delta

    # before: 0.016 apart in an entry after user 0 (0.024 after users 0-2): set back after the
    # first user only, then read as unwritten by its version
    alone = last([3])
    assert torch.equal(last([0, 3]), alone)
    assert torch.equal(last([0, 1, 2, 3]), alone)


def test_2_the_trainer_s_model_under_another_name_holds_the_global_model_after_train():
    class Alias(LocalTrainer):
        def __init__(self, task, **kwargs):
            super().__init__(task, **kwargs)
            self.net = self.model  # the trainer's model under a name of the subclass

    trainer = Alias(TASK, device="cpu")
    first = initial_flat(TASK)
    second = first + 0.5
    for user, start in ((1, first), (2, second)):
        trainer.train(start, user_id=user, round_num=user, config=LOCAL, rngs=RngFactory(0))
    held = torch.cat([t.detach().reshape(-1) for t in trainer.model.state_dict().values()])
    # with privacy 2 alone: set back to the first global model (as module attributes are)
    assert torch.equal(held, second)
