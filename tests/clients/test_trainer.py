import random

import numpy as np
import pytest
import torch

from fedprivopt.clients import LocalConfig, LocalResult, LocalTrainer, epoch_orders
from fedprivopt.models import ToyClassificationTask, initial_flat, model_spec
from fedprivopt.privacy import RngFactory, flatten

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def task():
    return ToyClassificationTask(num_users=12, dim=6, num_classes=3, seed=4)


def _train(trainer, flat, **kw):
    args = {"user_id": 2, "round_num": 3, "rngs": RngFactory(seed=7)}
    args.update(kw)
    return trainer.train(flat, **args)


def _hand_rolled_sgd(
    task,
    flat,
    *,
    user_id,
    round_num,
    stream,
    seed,
    lr,
    epochs,
    batch_size,
    max_examples=None,
    divide_by=None,
):
    """Plain torch SGD replaying the documented shuffle draws."""
    model = task.build_model()
    model.load_state_dict(
        {
            k: v
            for k, v in zip(
                ("weight", "bias"),
                (flat[: model.weight.numel()].view_as(model.weight), flat[model.weight.numel() :]),
                strict=True,
            )
        }
    )
    x, y = task.user_data(user_id)
    gen = RngFactory(seed=seed).generator(round_num, "shuffle", stream, user_id)
    subset = torch.randperm(x.shape[0], generator=gen)
    if max_examples is not None:
        subset = subset[:max_examples]
    x, y = x[subset], y[subset]
    for _ in range(epochs):
        order = torch.randperm(len(subset), generator=gen)
        for i in range(0, len(subset), batch_size):
            batch = order[i : i + batch_size]
            model.zero_grad()
            task.loss(model, x[batch], y[batch]).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * (p.grad if divide_by is None else p.grad / divide_by)
    return flatten(model.state_dict())[0] - flat


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("epochs", "batch_size", "max_examples"), [(1, 4, None), (3, 5, 9)])
def test_non_private_limit_is_plain_sgd(task, device, epochs, batch_size, max_examples):
    trainer = LocalTrainer(task, device=device)
    flat = initial_flat(task)
    cfg = LocalConfig(
        learning_rate=0.3, epochs=epochs, batch_size=batch_size, max_examples=max_examples
    )
    for user in (0, 2, 5):
        res = _train(trainer, flat, user_id=user, config=cfg, stream="s")
        want = _hand_rolled_sgd(
            task,
            flat,
            user_id=user,
            round_num=3,
            stream="s",
            seed=7,
            lr=0.3,
            epochs=epochs,
            batch_size=batch_size,
            max_examples=max_examples,
        )
        assert isinstance(res, LocalResult)
        assert res.delta.dtype == torch.float32 and res.delta.device.type == "cpu"
        torch.testing.assert_close(res.delta, want, rtol=1e-5, atol=1e-6)
        assert not res.clipped
        assert res.norm == pytest.approx(float(want.norm()), rel=1e-5)
        n = task.user_size(user)
        assert res.num_examples == (n if max_examples is None else min(n, max_examples))
        assert res.loss > 0


def test_epoch_orders_cover_the_subset():
    gen = torch.Generator().manual_seed(0)
    subset, orders = epoch_orders(10, epochs=3, max_examples=4, generator=gen)
    assert subset.shape == (4,) and len(set(subset.tolist())) == 4
    assert all(sorted(o.tolist()) == [0, 1, 2, 3] for o in orders) and len(orders) == 3
    subset, orders = epoch_orders(3, epochs=1, max_examples=10, generator=gen)
    assert sorted(subset.tolist()) == [0, 1, 2]


def test_reported_loss_is_mean_first_epoch_loss(task):
    trainer = LocalTrainer(task, device="cpu")
    flat = initial_flat(task)
    res = _train(trainer, flat, config=LocalConfig(learning_rate=1e-12, batch_size=3, epochs=2))
    x, y = task.user_data(2)
    assert res.loss == pytest.approx(float(task.loss(task.build_model(), x, y).detach()), rel=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_constant_preconditioner_two_is_half_the_learning_rate(task, device):
    trainer = LocalTrainer(task, device=device)
    flat = initial_flat(task)
    two = torch.full_like(flat, 2.0)
    a = _train(
        trainer,
        flat,
        config=LocalConfig(learning_rate=0.4, batch_size=3, epochs=2),
        preconditioner=two,
    )
    b = _train(trainer, flat, config=LocalConfig(learning_rate=0.2, batch_size=3, epochs=2))
    torch.testing.assert_close(a.delta, b.delta, rtol=1e-5, atol=1e-7)


def test_preconditioner_divides_the_gradient_elementwise(task):
    trainer = LocalTrainer(task, device="cpu")
    flat = initial_flat(task)
    p = torch.linspace(0.5, 4.0, flat.numel())
    cfg = LocalConfig(learning_rate=0.1, batch_size=1000)  # one full-batch step
    res = _train(trainer, flat, config=cfg, preconditioner=p)
    x, y = task.user_data(2)
    model = task.build_model()
    task.loss(model, x, y).backward()
    grad = torch.cat([model.weight.grad.reshape(-1), model.bias.grad])
    torch.testing.assert_close(res.delta, -0.1 * grad / p, rtol=1e-5, atol=1e-7)


def test_bad_preconditioner(task):
    trainer = LocalTrainer(task, device="cpu")
    flat = initial_flat(task)
    cfg = LocalConfig(learning_rate=0.1)
    for bad in (torch.zeros_like(flat), torch.full_like(flat, float("inf")), torch.ones(3)):
        with pytest.raises(ValueError, match="preconditioner"):
            _train(trainer, flat, config=cfg, preconditioner=bad)


def test_overriding_one_step():
    class Doubling(LocalTrainer):
        def precondition(self, grad_flat, preconditioner):
            return 2 * grad_flat

    task = ToyClassificationTask(num_users=3, seed=1)
    flat = initial_flat(task)
    a = _train(Doubling(task, device="cpu"), flat, config=LocalConfig(learning_rate=0.1))
    b = _train(LocalTrainer(task, device="cpu"), flat, config=LocalConfig(learning_rate=0.2))
    torch.testing.assert_close(a.delta, b.delta)


@pytest.mark.parametrize("device", DEVICES)
def test_clipping_bounds_the_norm_and_keeps_the_direction(task, device):
    trainer = LocalTrainer(task, device=device)
    flat = initial_flat(task)
    free = _train(trainer, flat, config=LocalConfig(learning_rate=0.5, epochs=3))
    for c in (0.01, 0.1, 0.5 * free.norm):
        res = _train(trainer, flat, config=LocalConfig(learning_rate=0.5, epochs=3, clip_norm=c))
        assert res.clipped
        assert float(res.delta.norm()) <= c * (1 + 1e-6)
        assert res.norm == pytest.approx(free.norm, rel=1e-6)
        cos = torch.nn.functional.cosine_similarity(res.delta, free.delta, dim=0)
        assert float(cos) == pytest.approx(1.0, abs=1e-6)
    big = _train(trainer, flat, config=LocalConfig(learning_rate=0.5, epochs=3, clip_norm=1e6))
    assert not big.clipped and torch.equal(big.delta, free.delta)


@pytest.mark.parametrize("device", DEVICES)
def test_noise_share_has_the_requested_std(device):
    task = ToyClassificationTask(num_users=25, dim=100, num_classes=10, seed=0)
    trainer = LocalTrainer(task, device=device)
    flat = initial_flat(task)
    std = 0.3
    noises = []
    for user in range(25):
        clean = _train(
            trainer, flat, user_id=user, config=LocalConfig(learning_rate=0.1, clip_norm=1.0)
        )
        noisy = _train(
            trainer,
            flat,
            user_id=user,
            config=LocalConfig(learning_rate=0.1, clip_norm=1.0, noise_std=std),
        )
        noises.append(noisy.delta - clean.delta)
        assert noisy.norm == clean.norm and noisy.clipped == clean.clipped
    noise = torch.stack(noises).double()  # 25 users x 1010 coordinates
    assert abs(float(noise.std()) / std - 1) < 0.05
    assert abs(float(noise.mean())) < 5 * std / noise.numel() ** 0.5
    corr = torch.corrcoef(noise[:2])[0, 1]
    assert abs(float(corr)) < 5 / 1010**0.5  # users draw independent shares


@pytest.mark.parametrize("device", DEVICES)
def test_bit_identical_by_seed_round_user_stream(task, device):
    cfg = LocalConfig(learning_rate=0.3, epochs=2, batch_size=4, clip_norm=0.05, noise_std=0.1)
    flat = initial_flat(task)
    trainer = LocalTrainer(task, device=device)
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    rng_state = torch.get_rng_state().clone()
    first = _train(trainer, flat, config=cfg, stream="a")
    assert torch.equal(torch.get_rng_state(), rng_state)  # the global generator is restored
    # other users, rounds and global seeds in between change nothing; nor does a new trainer
    _train(trainer, flat, config=cfg, user_id=5)
    random.seed(2)
    np.random.seed(2)
    torch.manual_seed(2)
    again = _train(LocalTrainer(task, device=device), flat, config=cfg, stream="a")
    assert torch.equal(first.delta, again.delta)
    assert (first.norm, first.loss, first.num_examples) == (
        again.norm,
        again.loss,
        again.num_examples,
    )
    # every key matters
    for kw in ({"stream": "b"}, {"round_num": 4}, {"rngs": RngFactory(seed=8)}):
        assert not torch.equal(
            first.delta, _train(trainer, flat, config=cfg, **{"stream": "a", **kw}).delta
        )


def test_streams_draw_independent_noise():
    task = ToyClassificationTask(num_users=2, dim=200, num_classes=20, seed=0)
    trainer = LocalTrainer(task, device="cpu")
    flat = initial_flat(task)
    cfg = LocalConfig(learning_rate=1e-12, clip_norm=1.0, noise_std=1.0)  # ~pure noise
    a = _train(trainer, flat, user_id=0, config=cfg, stream="cohort-1").delta
    b = _train(trainer, flat, user_id=0, config=cfg, stream="cohort-2").delta
    corr = torch.corrcoef(torch.stack([a, b]))[0, 1]
    assert abs(float(corr)) < 5 / a.numel() ** 0.5


def test_secure_mode_is_not_reproducible(task):
    trainer = LocalTrainer(task, device="cpu")
    flat = initial_flat(task)
    cfg = LocalConfig(learning_rate=0.1, clip_norm=1.0, noise_std=0.1)
    rngs = RngFactory(seed=None, secure=True)
    a = _train(trainer, flat, config=cfg, rngs=rngs).delta
    b = _train(trainer, flat, config=cfg, rngs=rngs).delta
    assert not torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_user_without_examples(device):
    task = ToyClassificationTask(num_users=2, examples_per_user=(0, 0), dim=50, num_classes=4)
    trainer = LocalTrainer(task, device=device)
    flat = initial_flat(task)
    res = _train(trainer, flat, user_id=1, config=LocalConfig(learning_rate=0.1, clip_norm=1.0))
    assert torch.equal(res.delta, torch.zeros_like(flat))
    assert (res.norm, res.clipped, res.num_examples, res.loss) == (0.0, False, 0, 0.0)
    noisy = _train(
        trainer,
        flat,
        user_id=1,
        config=LocalConfig(learning_rate=0.1, clip_norm=1.0, noise_std=2.0),
    )
    assert 1.6 < float(noisy.delta.std()) < 2.4


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"learning_rate": float("inf")}, "learning_rate"),
        ({"learning_rate": "0.1"}, "learning_rate"),
        ({"epochs": 0}, "epochs"),
        ({"epochs": 1.5}, "epochs"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"max_examples": 0}, "max_examples"),
        ({"clip_norm": 0.0}, "clip_norm"),
        ({"clip_norm": -1.0}, "clip_norm"),
        ({"noise_std": -0.1}, "noise_std"),
        ({"noise_std": float("nan")}, "noise_std"),
    ],
)
def test_bad_config_raises_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LocalConfig(**{"learning_rate": 0.1, **kwargs})


def test_config_is_keyword_only_and_normalized():
    with pytest.raises(TypeError):
        LocalConfig(0.1)  # type: ignore[misc]
    cfg = LocalConfig(learning_rate=1, clip_norm=2, noise_std=0)
    assert isinstance(cfg.learning_rate, float) and isinstance(cfg.clip_norm, float)


def test_bad_train_arguments(task):
    trainer = LocalTrainer(task, device="cpu")
    flat = initial_flat(task)
    cfg = LocalConfig(learning_rate=0.1)
    with pytest.raises(ValueError, match="global_flat"):
        _train(trainer, flat[:-1], config=cfg)
    with pytest.raises(ValueError, match="stream"):
        _train(trainer, flat, config=cfg, stream="")
    with pytest.raises(ValueError, match="config"):
        _train(trainer, flat, config={"learning_rate": 0.1})
    with pytest.raises(ValueError, match="rngs"):
        _train(trainer, flat, config=cfg, rngs=7)
    with pytest.raises(ValueError, match="user_id"):
        _train(trainer, flat, config=cfg, user_id=99)
    with pytest.raises(ValueError, match="task"):
        LocalTrainer(object())


class _NanTask(ToyClassificationTask):
    def loss(self, model, x, y):
        return super().loss(model, x, y) * float("nan")


def test_diverged_training_returns_a_zero_update():
    task = _NanTask(num_users=2)
    trainer = LocalTrainer(task, device="cpu")
    res = _train(
        trainer, initial_flat(task), user_id=0, config=LocalConfig(learning_rate=0.1, clip_norm=1.0)
    )
    assert torch.equal(res.delta, torch.zeros(model_spec(task).numel))
    assert res.norm == float("inf") and res.clipped


class _BatchNormTask(ToyClassificationTask):
    def build_model(self):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return torch.nn.Sequential(
                torch.nn.BatchNorm1d(self.dim), torch.nn.Linear(self.dim, self.num_classes)
            )


def test_buffers_are_loaded_but_not_trained():
    task = _BatchNormTask(num_users=3, dim=4, examples_per_user=(8, 8), seed=0)
    trainer = LocalTrainer(task, device="cpu")
    spec = trainer.spec
    assert spec == model_spec(task)
    flat = initial_flat(task)
    res = _train(trainer, flat, user_id=1, config=LocalConfig(learning_rate=0.1, batch_size=4))
    parts = dict(zip(spec.names, torch.split(res.delta, spec.sizes), strict=True))
    for name in ("0.running_mean", "0.running_var", "0.num_batches_tracked"):
        assert torch.equal(parts[name], torch.zeros_like(parts[name]))
    for name in ("0.weight", "0.bias", "1.weight", "1.bias"):
        assert parts[name].abs().sum() > 0


class _TiedTask(ToyClassificationTask):
    def build_model(self):
        a = torch.nn.Linear(self.dim, self.dim)
        b = torch.nn.Linear(self.dim, self.dim)
        b.weight = a.weight
        return torch.nn.Sequential(a, b)


def test_tied_parameters_are_rejected():
    with pytest.raises(ValueError, match="tied"):
        LocalTrainer(_TiedTask(num_users=2, dim=3), device="cpu")


def test_load_global(task):
    trainer = LocalTrainer(task, device="cpu")
    flat = torch.arange(model_spec(task).numel, dtype=torch.float32)
    model = trainer.load_global(flat)
    assert torch.equal(flatten(model.state_dict())[0], flat)
    flat.add_(1)  # the trainer holds its own copy
    assert not torch.equal(flatten(model.state_dict())[0], flat)


def test_epochs_are_bounded_before_the_orders_are_drawn():
    """Issue 15: epochs=10**13 was accepted and epoch_orders grew a list of 10**13 tensors."""
    from fedprivopt.core.local import MAX_EPOCHS, MAX_ORDER_ENTRIES

    with pytest.raises(ValueError, match=r"epochs must be an integer in \[1, 10000\]"):
        LocalConfig(learning_rate=0.1, epochs=10**13)
    assert LocalConfig(learning_rate=0.1, epochs=MAX_EPOCHS).epochs == 10_000
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match=r"epochs must be an integer in \[1, 10000\]"):
        epoch_orders(10, epochs=10**13, max_examples=None, generator=gen)
    with pytest.raises(ValueError, match=r"epochs \* examples must be at most"):
        epoch_orders(MAX_ORDER_ENTRIES, epochs=2, max_examples=None, generator=gen)
    subset, orders = epoch_orders(10, epochs=3, max_examples=4, generator=gen)
    assert subset.numel() == 4 and len(orders) == 3
