"""Issue 15, thirty-eighth hostile review (api: the documented Python API): tests.

1. ``drive_round(alg, r, train)`` whose ``train`` trains on ``request.params`` in place (a
   model loaded with ``torch.nn.utils.vector_to_parameters(request.params, ...)``, whose
   parameters are then views of the request's vector; or ``request.params.add_(...)``): the
   request held the algorithm's own model, so the users' local training (+100 in every entry)
   reached the released model unclipped and without noise (dp-fedavg's model 100.18 where a
   callback that copies first gives 0.18; ADADP, DP2, DP-FedAdam alike), and every user after
   the first started from the others' training; AdaDPS' side information (DP2's preconditioner)
   likewise. A :class:`TrainRequest` now holds copies, and ``run_round`` refuses a cohort whose
   copies were changed (``ServerAlgorithm.refuse_changed_request``: ``round 1: the train
   callback changed request.params in place ...``) after summing it and before anything of it
   is released; the algorithm's model is untouched and the round may run again. From the
   command line: a task whose own ``cohort_trainer`` trained on its ``global_flat`` in place
   (``simulate toy.toml --set task=mutask:make``) ended rc 0 with the cohort's unnoised sum in
   the released model; now rc 2 with that line.
2. ``ServerAlgorithm.load_state_dict`` of a state at round 3 whose ``accountant`` is another
   one's: a fresh algorithm's (a state assembled from a new algorithm's ``state_dict()`` with
   the model and round of a run), or that of a run of ``noise-multiplier = 5`` beside this
   ``0.5`` (dp-fedavg, ADADP, DP2). Before: taken, ``epsilon()`` 0.0 (0.315) where the three
   released rounds spent 12.17 (ADADP 16.29), and a ``target-epsilon`` let further rounds run.
   Now ``AlgorithmState._check_charged`` refuses an accountant holding fewer of the
   configuration's round events than ``events_through(round)`` (``checkpoint's accountant
   records 0 privacy events of this configuration's rounds, but its round 3 released 3``); the
   algorithm is left as it was. More events (a round released twice) are still taken.
3. The server optimizers (``optim.adam``, ``adam_bc``, ``flower_fedadam``, ``dp2``,
   ``momentum_sgd``, ADADP's controller) fed a sparse ``delta_tilde`` (``Δ̃.to_sparse()``), and
   ``init`` given sparse or ``meta`` parameters. Before: torch's ``NotImplementedError``
   (``Could not run 'aten::lerp.Scalar' with arguments from the 'SparseCPU' backend``) where a
   ``ValueError`` naming the argument is documented; ``momentum_sgd`` without momentum returned
   a sparse step; ``init`` took both (a state without values). Now ``optim._checks.check_dense``
   refuses them: ``delta_tilde must be a dense tensor with values (torch.strided), got one of
   torch.sparse_coo``.
4. ``result = drive_round(alg, 1, train)``, then the released model evaluated in a model loaded
   with ``torch.nn.utils.vector_to_parameters(result.params, model.parameters())`` (or
   ``alg.output_params()``, as a run evaluates it) and that model fine-tuned (+50 in every
   entry: a personalization step on users' data), then round 2. Before: both were the
   algorithm's own tensor, so round 2 started from the fine-tuned model and released it (50.31
   where 0.31), the fine-tuning with no noise of its own. Now ``RoundResult.params`` and
   ``output_params()`` are copies (``ServerAlgorithm._finish``, ``output_params``).
5. ``state = alg.state_dict()`` after round 1, then ``state["params"] /= 2`` (Python's augmented
   division of a dict's tensor is in place; also ``state["averaged"]`` with ``ema-decay``)
   before saving an edited copy, then round 2. Before: the state held the algorithm's own
   tensors, so round 2 started from the halved model (0.21 where 0.31). Now ``state_dict()``
   gives copies of the model and of its average (``AlgorithmState.state_dict``).
"""

from __future__ import annotations

import logging

import pytest
import torch

from fedprivopt import optim
from fedprivopt.clients import LocalTrainer
from fedprivopt.models import build_task, initial_flat
from fedprivopt.simulation.fast import make_cohort_train
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round


def _config(**changes) -> StrategyConfig:
    values = {"strategy": "dp-fedavg", "population": 40, "clients-per-round": 10,
              "num-server-rounds": 5, "noise-multiplier": 0.5, "delta": 1e-4, "seed": 0,
              **changes}  # fmt: skip
    return StrategyConfig.from_mapping(values)


def _train(request):
    """Every user of a request sends the same small update (copies nothing it is given)."""
    return {u: torch.full((4,), 0.1) for u in request.users}


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)  # absl's RDP warnings at q = 0.25
    yield
    logging.disable(logging.NOTSET)


# -- finding 1: a train callback that trains on the request's model in place -----------------


def _in_place(request):
    """Train each user on a model whose parameters are views of ``request.params``."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 1))  # 4 parameters: the flat model's length
    torch.nn.utils.vector_to_parameters(request.params, model.parameters())
    start = request.params.clone()
    out = {}
    for user in request.users:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(100.0)  # the user's local steps, on the views
        out[user] = torch.nn.utils.parameters_to_vector(model.parameters()).detach() - start
    return out


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp", "dp2", "dp-fedadam"])
def test_1_a_callback_training_on_request_params_in_place_is_refused(strategy):
    alg = build_algorithm(_config(strategy=strategy), torch.zeros(4))
    with pytest.raises(ValueError, match=r"round 1: the train callback .* changed request.params"):
        drive_round(alg, 1, _in_place)  # released a model of about 100 (the training)
    assert torch.equal(alg.params, torch.zeros(4))
    assert alg.round_num == 0 and alg.accountant.num_events == 0
    # nothing was released: the round runs again with a callback that copies first
    result = drive_round(alg, 1, _train)
    reference = drive_round(build_algorithm(_config(strategy=strategy), torch.zeros(4)), 1, _train)
    assert torch.equal(result.params, reference.params)
    assert float(result.params.abs().max()) < 5.0


def test_1_the_request_holds_copies():
    alg = build_algorithm(_config(), torch.zeros(4))
    rounds = alg.run_round(1)
    request = next(rounds)
    assert request.params.data_ptr() != alg.params.data_ptr()
    request.params.fill_(7.0)  # changes the copy only
    assert torch.equal(alg.params, torch.zeros(4))


def test_1_a_callback_changing_the_side_information_is_refused():
    a = torch.ones(4)
    alg = build_algorithm(_config(strategy="adadps"), torch.zeros(4), preconditioner=a)

    def train(request):
        request.preconditioner.mul_(2.0)
        return _train(request)

    with pytest.raises(ValueError, match=r"changed request.preconditioner in place"):
        drive_round(alg, 1, train)
    assert torch.equal(alg.side_information, torch.ones(4)) and alg.round_num == 0
    assert drive_round(alg, 1, _train).round_num == 1


class _Batch:
    """A cohort trainer's chunk of dense updates (what ``train_batches`` yields)."""

    def __init__(self, pairs):
        self.pairs, self.users, self.norms = pairs, [u for u, _ in pairs], [0.0] * len(pairs)

    def split(self):
        return self.pairs


class _InPlaceCohort:
    """A task's own cohort trainer that goes on from each user's trained model, in place."""

    def __init__(self, task):
        self.local = LocalTrainer(task, device="cpu")

    def train_batches(self, params, users, *, round_num, config, rngs, preconditioner, stream):
        for user in users:
            keys = {"round_num": round_num, "config": config, "rngs": rngs, "stream": stream}
            result = self.local.train(params, user_id=user, preconditioner=preconditioner, **keys)
            params.add_(result.delta)
            yield _Batch([(user, result.delta)])


def test_1_a_cohort_trainer_training_on_its_global_model_in_place_is_refused():
    task = build_task("toy", num_users=6)
    task.cohort_trainer = lambda device, chunk_users: _InPlaceCohort(task)
    init = initial_flat(task)
    alg = build_algorithm(_config(population=6, **{"clients-per-round": 3}), init)
    train = make_cohort_train(task, device="cpu")  # the fast engine's, in process
    # thirty-ninth review (api 1): refused by the fast engine's trainer at the first user
    with pytest.raises(ValueError, match=r"the task's cohort_trainer .* changed the global model"):
        drive_round(alg, 1, train)  # released the cohort's unnoised sum in the model, rc 0
    assert torch.equal(alg.params, init) and alg.accountant.num_events == 0


def test_1_an_adadp_second_cohort_changing_its_point_is_refused_and_not_run_again():
    alg = build_algorithm(_config(strategy="dp-fedavg-adadp"), torch.zeros(4))

    def train(request):
        if request.stream == "train-2":
            request.params.add_(100.0)
        return _train(request)

    with pytest.raises(ValueError, match=r"round 1 \(train-2\): the train callback .* changed"):
        drive_round(alg, 1, train)
    assert alg.round_num == 0 and torch.equal(alg.params, torch.zeros(4))
    # cohort 1's noised sum left with the half-step point: the round is not run again
    with pytest.raises(ValueError, match=r"round 1 was begun already"):
        drive_round(alg, 1, _train)


# -- finding 2: a state's accountant must hold the events its rounds released -----------------


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedavg-adadp", "dp2"])
@pytest.mark.parametrize("other", ["fresh", "sigma-5"])
def test_2_a_state_whose_accountant_charged_less_than_its_rounds_is_refused(strategy, other):
    run = build_algorithm(_config(strategy=strategy), torch.zeros(4))
    for r in (1, 2, 3):
        drive_round(run, r, _train)
    if other == "fresh":
        accountant = build_algorithm(_config(strategy=strategy), torch.zeros(4)).state_dict()
    else:
        low = build_algorithm(_config(strategy=strategy, **{"noise-multiplier": 5.0}),
                              torch.zeros(4))  # fmt: skip
        for r in (1, 2, 3):
            drive_round(low, r, _train)
        accountant = low.state_dict()
    state = {**run.state_dict(), "accountant": accountant["accountant"]}
    alg = build_algorithm(_config(strategy=strategy), torch.zeros(4))
    with pytest.raises(ValueError, match=r"accountant records 0 privacy events .* its round 3"):
        alg.load_state_dict(state)  # taken: epsilon() 0.0 (0.315) where 12.17 was spent
    assert alg.round_num == 0 and alg.accountant.num_events == 0
    assert torch.equal(alg.params, torch.zeros(4))


def test_2_a_state_whose_accountant_holds_more_events_is_taken():
    run = build_algorithm(_config(), torch.zeros(4))
    drive_round(run, 1, _train)
    state = run.state_dict()
    run.accountant.step(run.round_events(2))  # a round released twice stays accounted
    more = {**state, "accountant": run.accountant.state_dict()}
    alg = build_algorithm(_config(), torch.zeros(4))
    alg.load_state_dict(more)
    assert alg.round_num == 1 and alg.accountant.num_events == 2
    # fortieth review (api 2): a state whose accountant holds fewer events is refused
    with pytest.raises(ValueError, match=r"records 2 privacy events of its rounds"):
        alg.load_state_dict(state)
    assert alg.accountant.num_events == 2


# -- finding 3: the server optimizers refuse a sparse or meta tensor --------------------------

_TRANSFORMS = {
    "momentum_sgd": lambda: optim.momentum_sgd(learning_rate=1.0, momentum=0.0),
    "adam": lambda: optim.adam(learning_rate=1.0),
    "flower_fedadam": lambda: optim.flower_fedadam(eta=1.0),
    "adam_bc": lambda: optim.adam_bc(learning_rate=1.0, gamma=None, noise_variance=None),
    "dp2": lambda: optim.dp2(
        sgd_learning_rate=1.0,
        adaptive_learning_rate=1.0,
        s1=1,
        s2=1,
        epsilon=1e-3,
        beta=0.9,
        noise_variance=None,
    ),
}


@pytest.mark.parametrize("name", sorted(_TRANSFORMS))
def test_3_a_sparse_delta_tilde_or_parameters_are_refused(name):
    transform = _TRANSFORMS[name]()
    state = transform.init(torch.zeros(4))
    with pytest.raises(ValueError, match=r"delta_tilde must be a dense tensor .*sparse_coo"):
        transform.update(torch.ones(4).to_sparse(), state, torch.zeros(4), noise_variance=0.01)
    for params in (torch.zeros(4).to_sparse(), torch.empty(4, device="meta")):
        with pytest.raises(ValueError, match=r"params must be a dense tensor"):
            transform.init(params)


def test_3_adadp_refuses_a_sparse_noised_mean():
    controller = optim.adadp(learning_rate=1.0, tolerance=0.1)
    state = controller.init()
    with pytest.raises(ValueError, match=r"delta_1 must be a dense tensor"):
        controller.half_step(state, torch.zeros(4), torch.ones(4).to_sparse())


# -- finding 4: the released model given to the caller is a copy ------------------------------


@pytest.mark.parametrize("ema", [0.0, 0.5])
@pytest.mark.parametrize("which", ["result", "output_params"])
def test_4_fine_tuning_the_released_model_does_not_reach_the_next_round(which, ema):
    def released(alg):
        result = drive_round(alg, 1, _train)
        return result.params if which == "result" else alg.output_params()

    reference = build_algorithm(_config(**{"ema-decay": ema}), torch.zeros(4))
    released(reference)
    expected = drive_round(reference, 2, _train).params, reference.output_params()
    alg = build_algorithm(_config(**{"ema-decay": ema}), torch.zeros(4))
    model = torch.nn.Linear(3, 1)
    torch.nn.utils.vector_to_parameters(released(alg), model.parameters())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(50.0)  # fine-tuned in place for an evaluation
    assert torch.equal(drive_round(alg, 2, _train).params, expected[0])  # 50.31 where 0.31
    assert torch.equal(alg.output_params(), expected[1])  # with ema-decay: the average


# -- finding 5: a state dict holds copies of the model ---------------------------------------


@pytest.mark.parametrize("ema", [0.0, 0.5])
def test_5_editing_a_state_dict_in_place_does_not_reach_the_algorithm(ema):
    reference = build_algorithm(_config(**{"ema-decay": ema}), torch.zeros(4))
    drive_round(reference, 1, _train)
    expected = drive_round(reference, 2, _train).params, reference.output_params()
    alg = build_algorithm(_config(**{"ema-decay": ema}), torch.zeros(4))
    drive_round(alg, 1, _train)
    state = alg.state_dict()
    state["params"] /= 2  # in place
    if "averaged" in state:
        state["averaged"] /= 2
    assert torch.equal(drive_round(alg, 2, _train).params, expected[0])
    assert torch.equal(alg.output_params(), expected[1])
