import pickle
import random

import numpy as np
import pytest
import torch

from fedprivopt.models import Task, ToyClassificationTask


def _all_data(task):
    xs, ys = zip(*(task.user_data(u) for u in range(task.num_users)), strict=True)
    return torch.cat(xs), torch.cat(ys)


def test_is_a_task_with_the_documented_shapes():
    task = ToyClassificationTask(num_users=7, dim=4, num_classes=5, seed=3)
    assert isinstance(task, Task)
    assert task.name == "toy"
    for u in range(task.num_users):
        x, y = task.user_data(u)
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        assert x.shape == (y.shape[0], 4) and x.device.type == "cpu"
        assert 5 <= y.shape[0] <= 40
        assert int(y.min()) >= 0 and int(y.max()) < 5
        assert task.user_size(u) == y.shape[0]
    model = task.build_model()
    assert isinstance(model, torch.nn.Linear)
    assert (model.in_features, model.out_features) == (4, 5)
    metrics = task.evaluate(model)
    assert set(metrics) >= {"loss", "accuracy"}
    assert task.test_x.shape == (300, 4)


def test_deterministic_by_seed_and_independent_of_global_rng():
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    state = torch.get_rng_state().clone()
    a = ToyClassificationTask(seed=11)
    xa, ya = a.user_data(4)
    wa = a.build_model().state_dict()
    assert torch.equal(torch.get_rng_state(), state)  # nothing read from the global generator

    torch.manual_seed(999)
    b = ToyClassificationTask(seed=11)
    b.user_data(7)  # another user first: order does not matter
    xb, yb = b.user_data(4)
    wb = b.build_model().state_dict()
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert torch.equal(a.test_x, b.test_x) and torch.equal(a.test_y, b.test_y)

    c = ToyClassificationTask(seed=12)
    assert not torch.equal(c.build_model().weight, a.build_model().weight)
    assert not torch.equal(c.test_x, a.test_x)


def test_users_are_non_iid_and_sizes_skewed():
    task = ToyClassificationTask(num_users=200, heterogeneity=1.0, seed=0)
    sizes = torch.tensor([task.user_size(u) for u in range(200)], dtype=torch.float64)
    assert int(sizes.min()) == 5 and int(sizes.max()) >= 35
    assert float(sizes.median()) < float(sizes.mean())  # right-skewed
    assert abs(float(sizes.mean()) - (5 + 35 / 4)) < 2.5
    # per-user feature means spread much more than under IID sampling
    het = torch.stack([task.user_data(u)[0].mean(0) for u in range(50)]).std(0).mean()
    iid_task = ToyClassificationTask(num_users=50, heterogeneity=0.0, seed=0)
    iid = torch.stack([iid_task.user_data(u)[0].mean(0) for u in range(50)]).std(0).mean()
    assert float(het) > 2 * float(iid)


def test_examples_per_user_fixed_and_mean():
    fixed = ToyClassificationTask(num_users=10, examples_per_user=(7, 7))
    assert {fixed.user_data(u)[0].shape[0] for u in range(10)} == {7}
    empty = ToyClassificationTask(num_users=3, examples_per_user=(0, 0))
    x, y = empty.user_data(1)
    assert x.shape == (0, 10) and y.shape == (0,)
    mean = ToyClassificationTask(num_users=400, examples_per_user=20)
    sizes = [mean.user_size(u) for u in range(400)]
    assert min(sizes) >= 1 and max(sizes) <= 200
    assert 16 < np.mean(sizes) < 24


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_users": 0}, "num_users"),
        ({"dim": 0}, "dim"),
        ({"num_classes": 1}, "num_classes"),
        ({"test_examples": 0}, "test_examples"),
        ({"seed": -1}, "seed"),
        ({"heterogeneity": -0.1}, "heterogeneity"),
        ({"heterogeneity": float("nan")}, "heterogeneity"),
        ({"examples_per_user": (5, 2)}, "examples_per_user"),
        ({"examples_per_user": 0}, "examples_per_user"),
        ({"examples_per_user": "many"}, "examples_per_user"),
        ({"num_users": True}, "num_users"),
    ],
)
def test_bad_parameters_raise_value_error_naming_them(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ToyClassificationTask(**kwargs)


def test_user_id_out_of_range():
    task = ToyClassificationTask(num_users=3)
    for bad in (-1, 3):
        with pytest.raises(ValueError, match="user_id"):
            task.user_data(bad)


def test_picklable_and_cheap():
    task = ToyClassificationTask(num_users=50, seed=5)
    clone = pickle.loads(pickle.dumps(task))
    assert torch.equal(clone.user_data(9)[0], task.user_data(9)[0])
    assert len(pickle.dumps(task)) < 50_000  # user data is generated on demand, not stored


def test_learnable_by_centralized_sgd():
    task = ToyClassificationTask(seed=0)
    model = task.build_model()
    before = task.evaluate(model)
    x, y = _all_data(task)
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(10):
        order = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), 16):
            batch = order[i : i + 16]
            opt.zero_grad()
            task.loss(model, x[batch], y[batch]).backward()
            opt.step()
    after = task.evaluate(model)
    assert after["loss"] < 0.7 * before["loss"]
    assert after["accuracy"] > before["accuracy"] + 0.2


def test_evaluate_data_on_empty_and_restores_mode():
    task = ToyClassificationTask()
    model = task.build_model().train()
    out = task.evaluate_data(model, torch.zeros(0, 10), torch.zeros(0, dtype=torch.long))
    assert np.isnan(out["loss"]) and np.isnan(out["accuracy"])
    task.evaluate(model)
    assert model.training


@pytest.mark.parametrize(
    "kwargs",
    [
        {"examples_per_user": (1, 100_000_000_000)},
        {"examples_per_user": 10**12},
        {"examples_per_user": (1, 2**24), "dim": 100},
        {"test_examples": 10**11},
        {"dim": 2**20, "num_classes": 2**10},
    ],
)
def test_sizes_beyond_the_memory_bound_are_refused_at_construction(kwargs):
    from fedprivopt.models.toy import MAX_TENSOR_VALUES

    assert MAX_TENSOR_VALUES == 2**28  # 1 GiB of float32, documented in the class docstring
    key = next(iter(kwargs))
    with pytest.raises(ValueError, match=key):
        ToyClassificationTask(**kwargs)


def test_the_largest_sizes_within_the_bound_are_accepted():
    task = ToyClassificationTask(examples_per_user=(0, 2**28 // 13), dim=10, num_classes=3)
    assert task.examples_per_user == (0, 2**28 // 13)


def test_num_users_is_bounded_like_the_population():
    """Issue 15: a run samples the task's users; the sampler bounds their number."""
    with pytest.raises(ValueError, match=r"num_users must be an integer in \[1, 100000000\]"):
        ToyClassificationTask(num_users=10**9)
    assert ToyClassificationTask(num_users=10**8).num_users == 10**8
