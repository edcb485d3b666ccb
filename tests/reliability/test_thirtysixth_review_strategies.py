"""Issue 15, thirty-sixth hostile review (strategies: the server side): regression tests.

1. ``ServerAlgorithm.load_state_dict`` with ``ema-decay > 0`` (Python API). A state refused
   after its model was taken (its accountant invalid) rolled the algorithm back to round 0 but
   kept the refused state's moving average: ``output_params()``, the model a run evaluates and
   reports, was that other run's average before any round (``[-0.0056, 0.0131, 0.2394,
   0.2710]`` where the initial model is zeros), and the next round folded it into its average.
   A round-0 state loaded into an algorithm that had run rounds likewise kept that algorithm's
   average. A state without an average now clears it: the contract "all of it or nothing".
2. ``DPStrategy.start(grid, initial_arrays, ...)`` (the Flower strategy, Python API) compared
   only the flat length of ``initial_arrays`` with the model's. A record of the model's tensors
   in another order (``{"b": arange(4), "a": [10, 11]}`` for a model ``a`` (2), ``b`` (4))
   trained and released a model whose ``a`` began ``[0, 1]`` and whose ``b`` held ``a``'s
   values; other names or float64 tensors were taken as well. And an algorithm restored from
   a checkpoint at round 2, started with the record of the freshly built model (as a Flower
   program passes ``ArrayRecord(model.state_dict())``), went on from the initial model beside
   the checkpoint's optimizer state and ε. Now ``check_initial_arrays`` refuses both, naming
   the first differing tensor, or the round and ``flat_to_arrays(algorithm.params, spec)``.
3. A DP2 checkpoint (``dp2-s1 = dp2-s2 = 2``, ``clip-norm-adaptive = 0.5``) at round 2 whose
   optimizer state's ``adaptive`` was set to false and ``phase_step`` to 1 (digest recomputed,
   as the thirty-fifth review's forged ``count``): accepted (only ``count`` was compared with
   the round), so round 3 ran as an SGD round at ``clip-norm`` 1 where the run was to begin
   its adaptive phase at 0.5, and every later phase was shifted. ``load_state_dict`` now
   refuses a phase other than the one the round leaves DP2 at (``checkpoint's optimizer state
   is at step 1 of an SGD phase, but its round 2 leaves dp2 (dp2-s1 = 2, dp2-s2 = 2) at step 0
   of an adaptive phase``); every phase position of 1,316 resumed rounds (8 strategies × 6
   settings) still resumes bit for bit.
4. ``simulate --engine flower`` of ``dp2`` (``dp2-s1 = 1``, ``dp2-s2 = 2``, 3 rounds) on a task
   by reference whose model is float64: rc 0 on both engines, but the Flower engine's model
   differed from the fast engine's from round 2, the first adaptive round (ledger digests
   ``2acc0e91…``, ``7b63ad6f…`` against ``46cde4b3…``, ``4a200b7b…``): ``DPStrategy`` sent the
   preconditioner as float32 always, so the clients divided by a rounded ``P`` (AdaDPS's side
   information alike). It is sent in its own dtype now (bfloat16 as float32, which holds it):
   the two engines' digests are equal.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from fedprivopt import wire as P
from fedprivopt.privacy.flat import flatten
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from fedprivopt.strategies.flower import DPStrategy
from fedprivopt.strategies.flower_arrays import flat_to_arrays
from tests.strategies.test_flower_faults import ScriptedGrid


def _train(request):
    """Every user of a request sends the same small update (clipped already)."""
    return {u: torch.full((4,), 0.1 * (1 + u % 3)) for u in request.users}


def _config(**changes) -> StrategyConfig:
    values = {"strategy": "dp-fedavg", "population": 20, "clients-per-round": 5,
              "num-server-rounds": 8, "noise-multiplier": 1.0, "seed": 1, **changes}  # fmt: skip
    return StrategyConfig.from_mapping(values)


# -- finding 1: a state without a moving average clears the algorithm's ---------------------


@pytest.fixture(scope="module")
def ema_state():
    """The state of an ``ema-decay = 0.5`` algorithm after two rounds."""
    alg = build_algorithm(_config(**{"ema-decay": 0.5}), torch.zeros(4))
    for r in (1, 2):
        drive_round(alg, r, _train)
    assert not torch.equal(alg.output_params(), alg.params)  # an average of two iterates
    return alg.state_dict()


def test_1_a_refused_state_leaves_no_moving_average_behind(ema_state):
    fresh = build_algorithm(_config(**{"ema-decay": 0.5}), torch.zeros(4))
    refused = {**copy.deepcopy(ema_state), "accountant": {"x": 1}}
    with pytest.raises(ValueError, match="accountant"):
        fresh.load_state_dict(refused)
    assert fresh.round_num == 0 and fresh.averaged is None  # before: the refused state's
    assert torch.equal(fresh.output_params(), torch.zeros(4))
    reference = build_algorithm(_config(**{"ema-decay": 0.5}), torch.zeros(4))
    drive_round(fresh, 1, _train)
    drive_round(reference, 1, _train)
    assert torch.equal(fresh.output_params(), reference.output_params())


def test_1_a_round_0_state_clears_the_average_of_an_algorithm_that_ran(ema_state):
    used = build_algorithm(_config(**{"ema-decay": 0.5}), torch.zeros(4))
    used.load_state_dict(copy.deepcopy(ema_state))
    assert used.averaged is not None
    averaged = used.averaged.clone()
    # fortieth review (api 2): a round-0 state's accountant drops the rounds' events; refused
    with pytest.raises(ValueError, match=r"records 2 privacy events of its rounds"):
        used.load_state_dict(build_algorithm(used.config, torch.zeros(4)).state_dict())
    assert used.round_num == 2 and torch.equal(used.averaged, averaged)
    # a non-private algorithm (no events) takes it, and the average is cleared
    plain = build_algorithm(_config(**{"ema-decay": 0.5, "strategy": "fedavg"}), torch.zeros(4))
    for r in (1, 2):
        drive_round(plain, r, _train)
    assert plain.averaged is not None
    plain.load_state_dict(build_algorithm(plain.config, torch.zeros(4)).state_dict())
    assert plain.round_num == 0 and plain.averaged is None  # before: the round-2 average kept
    assert torch.equal(plain.output_params(), torch.zeros(4))


# -- finding 2: DPStrategy.start's initial arrays must be the model's, in its layout ----------


def _strategy(config: StrategyConfig) -> tuple[DPStrategy, torch.Tensor]:
    """A Flower strategy of a model ``a`` (2 entries), ``b`` (4), whose users are on 6 nodes."""
    flat, spec = flatten({"a": torch.zeros(2), "b": torch.zeros(4)})
    return DPStrategy(build_algorithm(config, flat), spec, node_wait=0.3), flat


def test_2_initial_arrays_of_another_layout_are_refused(server_side):
    config = _config(population=12, **{"clients-per-round": 12, "num-server-rounds": 1})
    others = {
        "order": ({"b": torch.arange(4.0), "a": torch.tensor([10.0, 11.0])}, "'b' of shape"),
        "names": ({"x": torch.zeros(2), "y": torch.zeros(4)}, "'x' of shape"),
        "dtype": ({"a": torch.zeros(2).double(), "b": torch.zeros(4).double()}, "float64"),
    }
    for record, named in others.values():
        strategy, _ = _strategy(config)
        with pytest.raises(
            ValueError, match=f"initial_arrays must hold the model's tensors .*{named}"
        ):
            strategy.start(ScriptedGrid({}), ArrayRecord(record), 1, timeout=1.0)  # before: ran
        assert strategy.algorithm.round_num == 0  # nothing was sent
    strategy, flat = _strategy(config)
    strategy.start(ScriptedGrid({}), flat_to_arrays(flat, strategy.spec), 1, timeout=1.0)
    assert strategy.algorithm.round_num == 1


def test_2_a_restored_algorithm_starts_from_its_own_parameters(server_side):
    config = _config(population=12, **{"clients-per-round": 12, "num-server-rounds": 3})
    strategy, flat = _strategy(config)
    strategy.start(ScriptedGrid({}), flat_to_arrays(flat, strategy.spec), 2, timeout=1.0)
    restored, _ = _strategy(config)
    restored.algorithm.load_state_dict(strategy.algorithm.state_dict())
    with pytest.raises(ValueError, match="must be the parameters of the algorithm, which is at "
                       r"round 2 .*flat_to_arrays\(algorithm.params, spec\)"):  # fmt: skip
        restored.start(ScriptedGrid({}), flat_to_arrays(flat, restored.spec), 3, timeout=1.0)
    assert restored.algorithm.round_num == 2
    params = restored.algorithm.params
    restored.start(ScriptedGrid({}), flat_to_arrays(params, restored.spec), 3, timeout=1.0)
    assert restored.algorithm.round_num == 3


# -- finding 3: a DP2 state's phase is the one its round leaves it at -------------------------


@pytest.mark.parametrize(("rounds", "forged"), [(2, (False, 1)), (3, (False, 0)), (4, (True, 1))])
def test_3_a_dp2_phase_other_than_its_round_s_is_refused(rounds, forged):
    config = _config(strategy="dp2", **{"dp2-s1": 2, "dp2-s2": 2, "clip-norm-adaptive": 0.5})
    alg = build_algorithm(config, torch.zeros(4))
    for r in range(1, rounds + 1):
        drive_round(alg, r, _train)
    state = alg.state_dict()
    adaptive, step = forged
    edited = {
        **state,
        "opt_state": {**state["opt_state"], "adaptive": adaptive, "phase_step": step},
    }
    restored = build_algorithm(config, torch.zeros(4))
    with pytest.raises(ValueError, match=rf"state is at step {step} of an? \w+ phase, but its "
                       rf"round {rounds} leaves dp2 \(dp2-s1 = 2, dp2-s2 = 2\)"):  # fmt: skip
        restored.load_state_dict(edited)  # before: resumed in the forged phase
    restored.load_state_dict(state)
    assert restored.current_clip_norm() == alg.current_clip_norm()


# -- finding 4: the preconditioner is sent in the model's dtype --------------------------------


class _Recording(ScriptedGrid):
    """A scripted grid that keeps the preconditioner of every train message."""

    def __init__(self):
        super().__init__({})
        self.sent = []

    def send_and_receive(self, messages, *, timeout=None):
        for msg in messages:
            if msg.metadata.message_type == "train":
                record = msg.content.array_records[P.PRECONDITIONER_RECORD]
                self.sent.append(record[P.PRECONDITIONER_ARRAY].numpy())
        return super().send_and_receive(messages, timeout=timeout)


def test_4_a_float64_preconditioner_reaches_the_clients_exactly(server_side):
    config = _config(strategy="adadps", population=12,
                     **{"clients-per-round": 12, "num-server-rounds": 1})  # fmt: skip
    flat, spec = flatten({"w": torch.zeros(6, dtype=torch.float64)})
    side = torch.full((6,), 1.0 / 3.0, dtype=torch.float64)  # not a float32 number
    strategy = DPStrategy(build_algorithm(config, flat, preconditioner=side), spec, node_wait=0.3)
    grid = _Recording()
    strategy.start(grid, flat_to_arrays(flat, spec), 1, timeout=1.0)
    assert len(grid.sent) == 6  # one message a node
    for sent in grid.sent:
        assert sent.dtype == np.float64  # before: float32, 0.3333333432674408
        assert np.array_equal(sent, side.numpy())
