"""Issue 15, forty-fourth hostile review (api: the documented Python API): tests.

1. A single-cohort strategy (dp-fedavg, secure mode): ``a = alg.sample(1)`` and
   ``b = alg.sample(1, "sampling-2")`` (ADADP's purpose of its second cohort), then
   ``alg.aggregate(1, updates, cohort=b, stream="train-2")`` when ``b`` held a chosen user and
   ``a`` did not (the forty-third review's api 8 through the second purpose). Before: the
   stream ``"train-2"`` took the cohort of the ``"sampling-2"`` draw, a second independent draw
   of the round, so the caller chose between two draws: user 7 was in the released cohort in
   44.5% of 200 runs where q is 0.25, charged as one Poisson sample of rate q (epsilon 7.55).
   Now ``AlgorithmCohorts._stream_purpose`` gives ``"sampling-2"`` only to a strategy with two
   cohorts a round (ADADP): ``b`` is refused as users round 1 did not sample; ADADP's second
   cohort is summed by ``aggregate`` only after its first (``stream="train"``), as
   ``run_round`` does.
2. Secure mode: a round's draw seen and the round left unreleased (``alg.sample(1)`` without
   the chosen user, or a ``drive_round`` callback that raises when the user is not in
   ``request.users``), then another round drawn and released (``aggregate(2, ...)``,
   ``drive_round(alg, 2, train)``; also rounds taken downwards: 6 released, 5 seen, 4). Before:
   taken, so the caller released only rounds whose draw held the chosen user (in every
   released round, charged as a Poisson sample of rate q: epsilon 7.55 after one). Now
   ``AlgorithmCohorts._refuse_unreleased_draw`` (from ``sample`` and ``_refuse_spent_round``)
   refuses to draw or release another round while a secure round's draw is unreleased, naming
   it; that round runs again with the same draw, and then the next one runs.
3. ``StrategyConfig.from_mapping`` (the ServerApp's config, docs/FLOWER.md) given a ``str``
   subclass for a choice setting whose ``==`` says yes to every string (the forty-second
   review's lying ``int`` through the strings): ``sampling``, ``noise-mode``, ``accountant``,
   ``strategy``, ``noise-mechanism``. Before: kept as the setting, so the run was another one
   than the configuration named: sampling ``'fixed'`` recorded while a Poisson sampler drew
   (cohorts 9, 13, 10), ``noise-mode 'distributed'`` run with server noise, ``strategy
   'dp-fedavg'`` run without noise (``private`` false), ``noise-mechanism 'gaussian'`` run as a
   tree. Now ``options.Rule.check`` keeps the plain string of its characters (NumPy's
   ``str_`` alike); a non-string is refused naming the key.
4. A task whose model has a module with ``get_extra_state()`` returning a dict (torch's way to
   save a module's settings), given to ``LocalTrainer(task)`` (a ClientApp's trainer),
   ``initial_flat(task)`` or ``model_spec(task)``. Before: ``AttributeError: 'dict' object has
   no attribute 'detach'`` from the trainer, and a ``ValueError`` naming
   ``state['0._extra_state']`` but not the task from the other two. Now
   ``models.task.refuse_tensorless_entries`` raises a ``TaskError`` naming the task and the
   entry (a tensor extra state is taken, as a buffer). From the command line the run's own
   check of the model (``simulation/run.py``) still ends in a traceback: open for its owner.
5. ``adaptive-clipping = true``: a ``drive_round`` callback (or ``aggregate``'s caller) returning
   a mapping of its own (a ``ReportedUpdates`` subclass) whose ``keys()`` names every user of
   the population while its ``items()`` gives the cohort's updates, with clip bits for all 40
   (the forty-first review's api 5 through ``keys()``). Before: the sum read ``items()`` and the
   noised count ``keys()``: 40 users' bits counted (``clip_count_fraction`` 2.46 where the
   honest round has 0.91, ``next_clip_norm`` 0.68 where 0.92), 31 of them unsampled, under the
   charge of a sampled cohort. Now ``_aggregate_in_round`` hands the count the users (and the
   bits) of its one reading of ``items()``.
6. A task whose ``loss`` keeps the model it is given (``self.net = model``, as Flower's
   ``task.py`` keeps its net) and whose ``evaluate`` evaluates that one (``simulate toy.toml
   --rounds 2 --set task=keeptask:make``; ``LocalTrainer.train`` through the Python API).
   Before: after ``train`` the trainer's model held the last user's local model, unclipped and
   without noise, and its batch statistics, so the run reported that user's model
   (``eval_accuracy`` 0.5900 where the released model has 0.6133). Now ``LocalTrainer.train``
   leaves its model holding (a copy of) the global model it was given: a released model.
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.strategies import build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_thirtyeighth_review_api import (
    _config,
    _quiet,  # noqa: F401
    _train,
)


def _updates(users):
    return {u: torch.full((4,), 0.1) for u in users}


def _absent(alg, r: int = 1) -> int:
    """A user that round ``r``'s draw of ``alg`` lacks (the one a chooser wants released)."""
    return min(set(range(40)) - set(alg.sample(r)))


# -- finding 1: the second purpose's draw summed by a single-cohort strategy ------------------


@pytest.mark.parametrize("secure", [False, True])
def test_1_a_single_cohort_strategy_sums_no_second_draw(secure):
    alg = build_algorithm(_config(secure=secure), torch.zeros(4))
    first, second = alg.sample(1), alg.sample(1, "sampling-2")
    extra = sorted(set(second) - set(first))
    assert extra  # another draw of the round
    with pytest.raises(ValueError, match=r"cohort holds users round 1 did not sample"):
        alg.aggregate(1, _updates(second), cohort=second, stream="train-2")  # was summed
    assert alg.accountant.num_events == 0
    agg = alg.aggregate(1, _updates(first), cohort=first)
    assert agg.metrics["accepted"] == len(first)


def test_1_adadp_sums_its_second_cohort_after_its_first():
    alg = build_algorithm(_config(secure=True, strategy="dp-fedavg-adadp"), torch.zeros(4))
    first, second = alg.sample(1), alg.sample(1, "sampling-2")
    with pytest.raises(ValueError, match=r"second cohort \(stream 'train-2'\) follows its first"):
        alg.aggregate(1, _updates(second), cohort=second, stream="train-2")  # a choice of two
    alg.aggregate(1, _updates(first), cohort=first, stream="train")
    agg = alg.aggregate(1, _updates(second), cohort=second, stream="train-2")
    assert agg.metrics["accepted"] == len(second)


# -- finding 2: a secure round's draw seen, the round skipped -----------------------------------


def test_2_a_drawn_secure_round_is_released_before_another():
    alg = build_algorithm(_config(secure=True), torch.zeros(4))
    _absent(alg)  # round 1 drawn without the chosen user: skipped
    with pytest.raises(ValueError, match=r"round 2 cannot be drawn while round 1's cohort"):
        alg.sample(2)  # was drawn, and round 2 released if it held the chosen user
    with pytest.raises(ValueError, match=r"round 2 cannot be released while round 1's cohort"):
        drive_round(alg, 2, _train)
    assert alg.accountant.num_events == 0
    drive_round(alg, 1, _train)  # the same draw, released
    drive_round(alg, 2, _train)
    assert alg.round_num == 2 and alg.accountant.num_events == 2


def test_2_a_round_refused_by_its_callback_runs_again_before_the_next():
    alg = build_algorithm(_config(secure=True), torch.zeros(4))
    chosen = _absent(alg)

    def chooser(request):
        if chosen not in request.users:
            raise RuntimeError("skip")
        return _updates(request.users)

    r = 1
    with pytest.raises(RuntimeError, match="skip"):
        drive_round(alg, r, chooser)
    with pytest.raises(ValueError, match=rf"round {r + 1} cannot be released while round {r}'s"):
        drive_round(alg, r + 1, chooser)
    drive_round(alg, r, _train)
    assert alg.round_num == r and alg.accountant.num_events == 1


def test_2_rounds_taken_downwards_are_refused_too():
    alg = build_algorithm(_config(secure=True), torch.zeros(4))
    users = alg.sample(6)
    alg.aggregate(6, _updates(users), cohort=users)
    alg.sample(5)  # seen, not released
    with pytest.raises(ValueError, match=r"round 4 cannot be drawn while round 5's cohort"):
        alg.sample(4)
    assert alg.accountant.num_events == 1


def test_2_seeded_mode_and_adadp_rounds_run_as_before():
    for changes in ({}, {"strategy": "dp-fedavg-adadp", "secure": True}, {"secure": True}):
        alg = build_algorithm(_config(**changes), torch.zeros(4))
        if not changes:
            alg.sample(2)  # a peek at the next round (seeded: the same draw anyway)
        for r in (1, 2, 3):
            drive_round(alg, r, _train)
        assert alg.round_num == 3


# -- finding 3: a str subclass that equals every string as a choice setting ---------------------


class _Lying(str):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = str.__hash__


@pytest.mark.parametrize(
    ("key", "value"),
    [("sampling", "fixed"), ("noise-mode", "distributed"), ("strategy", "dp-fedavg"),
     ("noise-mechanism", "gaussian"), ("accountant", "rdp")],
)  # fmt: skip
def test_3_a_choice_setting_is_the_plain_string_it_spells(key, value):
    config = _config(**{key: _Lying(value)})
    held = getattr(config, key.replace("-", "_"))
    assert type(held) is str and held == value  # was the subclass
    assert config == _config(**{key: value})
    alg = build_algorithm(config, torch.zeros(4))
    if key == "sampling":
        assert [len(alg.sample(r)) for r in (1, 2, 3)] == [10, 10, 10]  # was 9, 13, 10
    assert config.private and not config.tree  # strategy: not private; gaussian: a tree


def test_3_numpy_strings_are_taken_and_other_types_refused():
    np = pytest.importorskip("numpy")
    assert type(_config(sampling=np.str_("fixed")).sampling) is str
    with pytest.raises(ValueError, match=r"sampling must be one of"):
        _config(sampling=b"fixed")


# -- finding 4: a model whose state dict holds a module's extra state that is no tensor ---------


class _WithExtra(torch.nn.Module):
    def __init__(self, extra):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.extra = extra

    def forward(self, x):
        return self.lin(x)

    def get_extra_state(self):
        return self.extra

    def set_extra_state(self, state):
        self.extra = state


class _ExtraTask:
    name, num_users = "extra", 2

    def __init__(self, extra):
        self.extra = extra

    def build_model(self):
        torch.manual_seed(0)
        return _WithExtra(self.extra)

    def user_data(self, user_id):
        x = torch.arange(12.0).reshape(4, 3) * (user_id + 1)
        return x, torch.tensor([0, 1, 0, 1])

    def loss(self, model, x, y):
        return torch.nn.functional.cross_entropy(model(x), y)

    def evaluate_data(self, model, x, y):
        return {"loss": 0.0, "accuracy": 0.0}

    def evaluate(self, model):
        return {"loss": 0.0, "accuracy": 0.0}


def test_4_a_state_entry_that_is_no_tensor_is_refused_naming_it():
    from fedprivopt.clients import LocalTrainer
    from fedprivopt.models.task import TaskError, initial_flat, model_spec

    task = _ExtraTask({"version": 2})
    for call in (LocalTrainer, initial_flat, model_spec):
        with pytest.raises(TaskError, match=r"_ExtraTask.build_model\(\) has state dict entry "
                                            r"'_extra_state' holding a dict"):  # fmt: skip
            call(task)  # LocalTrainer: AttributeError ('dict' object has no attribute 'detach')
    tensor = _ExtraTask(torch.tensor([2.0]))
    assert initial_flat(tensor).numel() == 9 and LocalTrainer(tensor, device="cpu").spec


# -- finding 5: the count of adaptive clipping read the users again, from keys() ----------------


def test_5_the_clip_count_counts_the_users_the_sum_read():
    from fedprivopt.strategies.requests import ReportedUpdates

    class Wide(ReportedUpdates):
        def keys(self):
            return list(range(40))

    def reply(kind):
        return lambda r: kind(_updates(r.users), clip_bits=dict.fromkeys(range(40), 1.0))

    fractions = []
    for kind in (ReportedUpdates, Wide):
        alg = build_algorithm(_config(**{"adaptive-clipping": True}), torch.zeros(4))
        metrics = drive_round(alg, 1, reply(kind)).metrics
        fractions.append(metrics["clip_count_fraction"])
        assert metrics["accepted"] == len(alg.sample(1))
    assert fractions[1] == fractions[0] < 1.5  # was 2.4587 (40 users counted) and 0.9087


# -- finding 6: the trainer's model after train held the last user's local model ----------------


class _KeepingTask(_ExtraTask):
    """A task whose model has batch statistics and whose loss keeps the model it is given."""

    kept = None

    def build_model(self):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))

    def loss(self, model, x, y):
        self.kept = model
        return super().loss(model, x, y)


def test_6_the_trainer_leaves_its_model_at_the_global_model():
    from fedprivopt.clients import LocalTrainer
    from fedprivopt.core.local import LocalConfig
    from fedprivopt.models.task import initial_flat
    from fedprivopt.privacy import flatten
    from fedprivopt.privacy.rng import RngFactory

    task = _KeepingTask(None)
    trainer = LocalTrainer(task, device="cpu")
    start = initial_flat(task)
    start[:-1] += 0.25  # the last entry is the integer num_batches_tracked
    result = trainer.train(start, user_id=1, round_num=1,
                           config=LocalConfig(learning_rate=0.5, clip_norm=10.0),
                           rngs=RngFactory(0))  # fmt: skip
    assert float(result.delta.norm()) > 0.01  # it trained
    held = flatten(task.kept.state_dict())[0]
    assert torch.equal(held, start)  # was the user's local model and its batch statistics
