"""Acceptance: on synthetic StackOverflow, side information recovers most of Adam's advantage.

AdaDPS (Li et al., ICML 2022) reports, for single-label tag prediction on 400 real StackOverflow
users, top-1 accuracy 0.64 with Adam against 0.38 with SGD, and shows that SGD preconditioned by
public token frequencies closes most of that gap. We check the same ordering on the synthetic
generator, its knobs at their defaults except the size (400 users, 2,000 words, 50 tags; the
model uses all of them, single-label), training centrally on the pooled training examples.

Protocol (the same for the three methods): one epoch of minibatches of 64 in one seeded order,
constant learning rate (as in AdaDPS' code), the task's model, initialization and loss. Each
method's learning rate is chosen on a grid of factor ~3 by top-1 accuracy on a validation set,
the ``heldout`` users (never trained on); at these seeds every choice lies inside its grid. The
reported number is top-1 accuracy on the ``test`` split (later posts of the training users).

Measured (this protocol, generator seed 0, order seed 0): SGD 0.389 (lr 10), Adam 0.668 (lr 3),
SGD + side information 0.706 (lr 1000), closing 114 % of the gap. Over generator seeds {0, 1} x
order seeds {0, 1}: SGD 0.39-0.54, Adam 0.67-0.69, SGD + side information 0.68-0.71, closing
94-114 % of a gap of 0.15-0.28. Two caveats the numbers depend on:

* plain SGD is limited by oscillation, not by slow progress: its bias (a feature of value 1 in
  every example) caps the stable constant learning rate far below what the rare words need.
  With a linearly decaying learning rate SGD reaches 0.67-0.68 in one epoch and the gap nearly
  closes; the synthetic data reproduces AdaDPS' gap under AdaDPS' constant-rate protocol only.
* the side information must scale the bias up (``bias_scale``, default 20; 50 and 200 give the
  same): at ``bias_scale = 1`` (the bias as the most frequent word, as in AdaDPS' code)
  preconditioned SGD oscillates too: 0.48-0.61, closing between -22 % and 77 % of the gap.
"""

import math

import pytest
import torch

from fedprivopt.models import StackOverflowTagTask

SYNTH = dict(synth_clients=400, synth_vocab=2000, synth_tags=50, synth_seed=0)
GRIDS = {
    "sgd": (1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0),
    "adam": (0.03, 0.1, 0.3, 1.0, 3.0, 10.0),
    "sgd+side": (30.0, 100.0, 300.0, 1000.0, 3000.0),
}
BATCH = 64


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    common = dict(
        data_dir=str(tmp_path_factory.mktemp("realism")),
        vocab_size=2000,
        num_tags=50,
        single_label=True,
        eval_users=10_000,  # every user of the evaluation split
        **SYNTH,
    )
    task = StackOverflowTagTask(**common)
    validation = StackOverflowTagTask(**common, eval_split="heldout")
    xs, ys = zip(*(task.user_data(u) for u in range(task.num_users)), strict=True)
    width = max(x.shape[1] for x in xs)
    pad = task.num_features + 1
    x = torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1]), value=pad) for x in xs])
    return task, validation, x, torch.cat(ys)


def _train(task, x, y, method, lr):
    model = task.build_model()
    params = list(model.parameters())
    if method == "adam":
        opt = torch.optim.Adam(params, lr=lr)
    else:
        opt = torch.optim.SGD(params, lr=lr)
    side = task.side_information() if method == "sgd+side" else None
    if side is not None:
        v, k = task.num_features, task.num_tags
        side_w, side_b = side[: v * k].view(v, k), side[v * k :]
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    for start in range(0, x.shape[0], BATCH):
        batch = order[start : start + BATCH]
        opt.zero_grad()
        task.loss(model, x[batch], y[batch]).backward()
        if side is not None:  # AdaDPS: divide the gradient by the public side information
            model.weight.grad /= side_w
            model.bias.grad /= side_b
        opt.step()
    return model


def test_side_information_closes_most_of_the_gap_between_sgd_and_adam(data):
    task, validation, x, y = data
    assert task.num_users >= 300 and x.shape[0] > 10_000
    test, chosen = {}, {}
    for method, grid in GRIDS.items():
        best = (-1.0, None, None)
        for lr in grid:
            model = _train(task, x, y, method, lr)
            acc = validation.evaluate(model)["accuracy"]
            if acc > best[0]:
                best = (acc, lr, model)
        chosen[method] = best[1]
        test[method] = task.evaluate(best[2])["accuracy"]
        assert math.isfinite(test[method])
    print(f"\ntest top-1 {test}, learning rates {chosen}")
    gap = test["adam"] - test["sgd"]
    assert gap >= 0.12, (test, chosen)  # Adam beats SGD by a wide margin (measured 0.28)
    closed = (test["sgd+side"] - test["sgd"]) / gap
    assert closed >= 0.6, (test, chosen, closed)  # side information recovers most (measured 1.14)
