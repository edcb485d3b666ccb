"""Issue 15, thirty-third hostile review (area optim: server optimizers, AdaDPS' side information).

1. ``simulate toy.toml --strategy dp-fedavg-adadp --set server-learning-rate=5e-324`` (or
   ``1e308`` at ``noise-multiplier=100``): rc 2, ``config: tolerance must be a finite number in
   (0, inf), got 0.0`` (``got inf``), a name no configuration has (``adadp-tolerance`` unset):
   the noise-calibrated tolerance ``1.5·η₀·σC/m̄·√(d/2)``, a product of checked reals, under-
   or overflowed, and ``noise_calibrated_tolerance`` returned 0 or inf against its own
   "``τ > 0``". Every other strategy runs such a rate (the twelfth and twenty-seventh reviews:
   rc 0, the divergence reported). Now the tolerance is kept within the floats: rc 0, the
   5e-324 run does not move, the 1e308 one reports its divergence.
2. ``simulate toy.toml --strategy dp2 --set dp2-epsilon=1e300`` (also ``tune --grid
   dp2-epsilon=0.1,1e300``): rc 2, ``config: epsilon must be at most 3.40282e+38 for
   torch.float32 parameters ...``: the optimizer's argument, which in this tool reads as the
   privacy budget, not the key. ``dp2-epsilon`` is now checked with its key, in ``(0,
   3.40282e+38]`` (``P = √v + ε`` is held in the model's float32).
3. ``simulate adadps-paper.toml --strategy dp2 --set dp2-epsilon=1e-50 --set dp2-s1=1`` (any
   ε that is 0 in float32): rc 2 after round 1 was released, ``preconditioner must be finite and
   > 0 everywhere``, naming nothing: ``P = √v + ε`` was 0 wherever ``v`` is (the preset's
   frozen bias), and the clients refused it. ``dp2-noise-first`` stepped by 0/0 there (the
   model NaN, "diverged at round 2", where ``dp2-epsilon=1e-40`` trains); with
   ``dp2-scale-by-preconditioner`` a round whose ``v`` was 0 everywhere (toy, ``noise-multiplier
   =1e-30``, ``local-learning-rate=1e-30``) raised ``ZeroDivisionError`` at the Python API. ε is
   now at least the dtype's smallest normal number, as DP-FedAdam's τ and DP-AdamBC's floor
   (eighteenth review): rc 0.
4. ``simulate stackoverflow-tp-mini.toml --strategy adadps --set clients-per-round=400`` (no
   side information set: ``auto``, whose default is public users), also ``--set
   side-information.kind=public-users`` on toy with ``clients-per-round=40``: rc 2,
   ``side-information.users must be an integer in [1, population - clients-per-round = 0] ...,
   got 4``: a key and a value the user never gave, and a range without an integer. Now the line
   says the default (or ``public-users`` with ``users`` unset) takes 4 public users, 1 % of the
   population, and what to change (``clients-per-round`` at most population - 1, or the kind).
5. At the Python API, ``adam(...).update(delta, state)`` given ``None``, the dict of
   ``state_to_dict`` (a checkpoint's ``opt_state`` not rebuilt with ``from_dict``) or another
   transform's state: ``AttributeError: 'dict' object has no attribute 'mu'`` (every transform,
   ``ADADPController.update``/``half_step``/``full_step``, ``phase``, ``preconditioner``,
   ``noise_corrected_second_moment``), and ``adam`` took a DP-AdamBC state and stepped from its
   moments. Now one ``ValueError``: ``state must be an AdamState (from init() or
   AdamState.from_dict()), got dict: rebuild it with AdamState.from_dict``.
6. At the Python API of AdaDPS' side information: ``token_frequency_preconditioner`` flattened a
   2-D array of counts and used it (a preconditioner of the wrong words, silently), dropped
   complex counts' imaginary part (a ``ComplexWarning``), called ``None`` "1 entries" and raised
   ``TypeError`` for a dict or a generator; ``two_level_preconditioner(factor=np.float32(2))``
   was refused as ``factor must be a real number, got np.float32(2.0)`` (NumPy integers as
   sizes alike). Now counts of another form are one ``ValueError`` naming what was given, and
   NumPy's numbers are numbers, as in :mod:`fedprivopt.core.checks`.
7. ``public_users_preconditioner(task, users, batch_size=16)`` (and
   ``gradient_second_moment``) took ``users="01"`` as users 0 and 1, ``[1.5]`` and ``[True]`` as
   user 1, a repeated user twice (its minibatches counted twice in ``v``), and ``None`` raised
   ``TypeError``. Now ``users must be a sequence of distinct integer user ids, got '01'``;
   lists, tuples, ranges and NumPy arrays of ids give the vector as before.
8. A DP2 state resumed under changed options at the Python API: the state of a ``dp2(s1=5)``
   three rounds into its SGD phase (``DP2State.from_dict(state.to_dict())``) given to a
   ``dp2(s1=2)`` never reached ``phase_step + 1 == s1``, so every later round was an SGD round,
   silently (an adaptive phase past ``s2`` alike). Now ``state.phase_step must be in [0, s1 = 2)
   in its sgd phase, got 3 (a state of a dp2 with another s1?)``. (The CLI refuses a changed
   ``dp2-s1`` on ``--resume`` by the ledger header.)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedprivopt import optim
from fedprivopt.cli import main
from fedprivopt.models import build_task
from fedprivopt.models.side_information import (
    public_users_preconditioner,
    token_frequency_preconditioner,
    two_level_preconditioner,
)
from fedprivopt.models.side_information_config import resolve_side_information
from fedprivopt.strategies.config import StrategyConfig

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def _simulate(tmp_path: Path, capsys, *sets: str, strategy: str, rounds: int = 1):
    """In-process ``simulate toy.toml``: (rc, stderr, run directory)."""
    out = tmp_path / f"run-{strategy}"
    args = ["simulate", str(TOY), "--strategy", strategy, "--rounds", str(rounds)]
    args += ["--out", str(out)]
    for item in sets:
        args += ["--set", item]
    code = main(args)
    return code, capsys.readouterr().err, out


def _one_line(code: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- finding 1: ADADP's calibrated tolerance under- or overflowing ----------------------------


@pytest.mark.parametrize(
    ("rate", "noise_std", "dim"), [(5e-324, 0.05, 10), (1e308, 10.0, 10**6), (1e-300, 1e-300, 1)]
)
def test_1_the_calibrated_tolerance_is_a_positive_float(rate, noise_std, dim):
    tolerance = optim.noise_calibrated_tolerance(learning_rate=rate, noise_std=noise_std, dim=dim)
    assert 0.0 < tolerance <= sys.float_info.max  # was 0.0, inf, 0.0
    optim.adadp(learning_rate=rate, tolerance=tolerance)  # the controller takes it


def test_1_a_calibrated_tolerance_within_the_floats_is_unchanged():
    got = optim.noise_calibrated_tolerance(learning_rate=2.0, noise_std=0.1, dim=8)
    assert got == 1.5 * 2.0 * 0.1 * math.sqrt(4.0)


@pytest.mark.parametrize(
    ("sets", "diverged"),
    [
        (["server-learning-rate=5e-324"], False),
        (["server-learning-rate=1e308", "noise-multiplier=100"], True),
    ],
)
def test_1_adadp_runs_extreme_rates_as_the_other_strategies(tmp_path, capsys, sets, diverged):
    code, err, out = _simulate(tmp_path, capsys, *sets, strategy="dp-fedavg-adadp")
    assert code == 0, err  # was rc 2: 'tolerance must be a finite number in (0, inf)'
    assert "tolerance must be" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert bool(summary["diverged"]) is diverged, summary["diverged"]


# -- finding 2: dp2-epsilon beyond float32, named by its key ----------------------------------


def test_2_dp2_epsilon_beyond_float32_is_refused_naming_its_key(tmp_path, capsys):
    code, err, out = _simulate(tmp_path, capsys, "dp2-epsilon=1e300", strategy="dp2")
    line = _one_line(code, err)
    assert "dp2-epsilon must be a finite number in (0, 3.40282e+38], got 1e+300" in line, line
    assert not out.exists()
    with pytest.raises(ValueError, match=r"^dp2-epsilon must be"):
        StrategyConfig.from_mapping({"strategy": "dp2-noise-first", "dp2-epsilon": 1e39})


def test_2_dp2_epsilon_at_float32s_largest_is_accepted():
    config = StrategyConfig.from_mapping({"strategy": "dp2", "dp2-epsilon": 3.4028234663852886e38})
    assert config.options.dp2_epsilon == 3.4028234663852886e38


# -- finding 3: a DP2 epsilon that is 0 in the parameters' dtype --------------------------------


def _dp2(**kw) -> optim.ServerTransform:
    args = dict(sgd_learning_rate=0.1, adaptive_learning_rate=0.1, s1=1, s2=1, epsilon=1e-50)
    return optim.dp2(**{**args, **kw})


@pytest.mark.parametrize("kw", [{}, {"noise_first": True}, {"scale_by_preconditioner": True}])
def test_3_a_tiny_dp2_epsilon_keeps_the_preconditioner_positive(kw):
    transform, params = _dp2(**kw), torch.zeros(3)
    state = transform.init(params)
    assert bool((state.preconditioner > 0).all())  # was 0 everywhere
    delta = torch.tensor([0.0, 1e-30, 1.0])  # a frozen coordinate; a square that underflows
    _, state = transform.update(delta, state, params)  # the SGD round: the switch forms P
    assert bool((optim.preconditioner(state) > 0).all())  # was [0, 0, 0.32]
    assert optim.preconditioner_mean(state) > 0.0
    step, _ = transform.update(delta, state, params)  # was NaN / ZeroDivisionError below
    assert bool(torch.isfinite(step).all()), step
    zero_v = transform.update(torch.zeros(3), transform.init(params), params)[1]
    step, _ = transform.update(delta, zero_v, params)  # v = 0 everywhere
    assert bool(torch.isfinite(step).all()), step


def test_3_a_representable_dp2_epsilon_is_unchanged():
    transform, params = _dp2(epsilon=1e-3), torch.zeros(2)
    _, state = transform.update(torch.tensor([0.0, 0.5]), transform.init(params), params)
    expected = torch.tensor([0.0, 0.5]).square().mul(0.1).sqrt().add(1e-3)
    assert torch.equal(optim.preconditioner(state), expected)


def test_3_dp2_with_a_tiny_epsilon_runs_its_adaptive_rounds(tmp_path, capsys):
    sets = ["dp2-epsilon=1e-50", "dp2-s1=1", "dp2-scale-by-preconditioner=true"]
    sets += ["noise-multiplier=1e-30", "local-learning-rate=1e-30"]  # v = 0 everywhere
    code, err, out = _simulate(tmp_path, capsys, *sets, strategy="dp2", rounds=2)
    assert code == 0, err  # was rc 2 after round 1: 'preconditioner must be finite and > 0'
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["adaptive_round"] for row in rows] == [0.0, 1.0]
    assert rows[-1]["dp2_preconditioner_mean"] > 0


# -- finding 4: too many default public users, said as a default --------------------------------


class _BagOfWords:
    """Just enough of a bag-of-words tag task (3 words, 2 tags) for the side information."""

    name = "stub-tags"
    word_count_path = "unused"
    num_features, num_tags, num_users = 3, 2, 400

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Linear(3, 2)


@pytest.mark.parametrize(
    ("cohort", "advice"),
    [
        (400, "clients-per-round to at most population - 1 = 399"),
        (397, "side-information.users in [1, 3]"),
    ],
)
def test_4_the_default_public_users_are_named_as_the_default(cohort, advice):
    with pytest.raises(ValueError) as info:
        resolve_side_information("auto", _BagOfWords(), population=400, clients_per_round=cohort)
    line = str(info.value)
    assert line.startswith("the default side information (auto: public-users) takes 4 "), line
    assert "side-information.users unset" in line and advice in line, line
    assert "got 4" not in line, line  # a value the user never gave


def test_4_public_users_unset_on_the_command_line(tmp_path, capsys):
    sets = ["side-information.kind=public-users", "clients-per-round=40"]
    code, err, out = _simulate(tmp_path, capsys, *sets, strategy="adadps")
    line = _one_line(code, err)
    assert "side-information.kind = 'public-users' takes 1 public user (" in line, line
    assert "lower clients-per-round to at most population - 1 = 39" in line, line
    assert not out.exists()


def test_4_a_given_users_count_is_still_named_as_given():
    with pytest.raises(ValueError, match=r"side-information.users must be an integer in \[1, "
                       r"population - clients-per-round = 30\] .*got 31$"):  # fmt: skip
        resolve_side_information(
            {"kind": "public-users", "users": 31}, _BagOfWords(), population=40,
            clients_per_round=10,
        )  # fmt: skip


# -- finding 5: a state of another kind given to a transform -----------------------------------

_TRANSFORMS = {
    "MomentumState": lambda: optim.momentum_sgd(learning_rate=1.0),
    "AdamState": lambda: optim.adam(learning_rate=0.1),
    "AdamBCState": lambda: optim.adam_bc(learning_rate=0.1, gamma=None, noise_variance=0.01),
    "DP2State": lambda: _dp2(epsilon=1e-3),
}


@pytest.mark.parametrize("name", sorted(_TRANSFORMS))
def test_5_update_refuses_a_state_of_another_kind_by_name(name):
    transform, params, delta = _TRANSFORMS[name](), torch.zeros(3), torch.ones(3)
    state = transform.init(params)
    other = "AdamState" if name == "AdamBCState" else "AdamBCState"
    for wrong, got in [(None, "NoneType"), (state.to_dict(), "dict")]:
        with pytest.raises(ValueError, match=rf"^state must be an? {name} .*got {got}"):
            transform.update(delta, wrong, params, noise_variance=0.01)
    if name != "AdamBCState":  # an AdamBCState has Adam's fields: adam went on from its moments
        wrong = _TRANSFORMS[other]().init(params)
        with pytest.raises(ValueError, match=rf"state must be an? {name} .*got {other}$"):
            transform.update(delta, wrong, params, noise_variance=0.01)
    rebuilt = type(state).from_dict(state.to_dict())  # what the message advises
    transform.update(delta, rebuilt, params, noise_variance=0.01)


def test_5_the_state_readers_refuse_another_kind_by_name():
    params = torch.zeros(2)
    controller = optim.adadp(learning_rate=1.0, tolerance=1.0)
    with pytest.raises(ValueError, match=r"an ADADPState .*got dict: rebuild it with ADADP"):
        controller.update(controller.init().to_dict(), params, params, params)
    for call in (controller.half_step, controller.full_step):
        with pytest.raises(ValueError, match=r"an ADADPState .*got NoneType$"):
            call(None, params, params)
    for read in (optim.phase, optim.preconditioner):
        with pytest.raises(ValueError, match=r"a DP2State .*got dict"):
            read({})
    with pytest.raises(ValueError, match=r"an AdamBCState .*got NoneType"):
        optim.noise_corrected_second_moment(None, beta2=0.9)


# -- finding 6: side-information vectors from NumPy numbers and counts of another form ----------


def test_6_numpy_numbers_build_the_same_side_information():
    plain = two_level_preconditioner(vocab_size=10, num_tags=2, top_k=5, factor=2.0)
    numpy = two_level_preconditioner(
        vocab_size=np.int64(10), num_tags=np.int32(2), top_k=np.int64(5), factor=np.float32(2)
    )  # was: 'vocab_size must be an integer >= 1, got np.int64(10)'
    assert torch.equal(numpy, plain)
    counts = [5, 3, 1]
    tf = token_frequency_preconditioner(counts, vocab_size=3, num_tags=2, floor=np.float32(1))
    assert torch.equal(tf, token_frequency_preconditioner(counts, vocab_size=3, num_tags=2))


@pytest.mark.parametrize(
    ("counts", "got"),
    [
        (np.ones((3, 2)), "float64 values of shape (3, 2)"),  # was used, flattened
        (np.ones(3) * 1j, "complex128 values"),  # was its real part, with a ComplexWarning
        (None, "got None"),  # was 'word_counts has 1 entries, fewer than vocab_size=3'
        ({"a": 1, "b": 2, "c": 3}, "got {'a': 1"),  # was TypeError
        ((c for c in [1, 2, 3]), "got <generator"),  # was TypeError
        ([[1], [1, 2], [3]], "got [[1], [1, 2], [3]]"),  # was numpy's 'inhomogeneous shape'
    ],
)
def test_6_counts_of_another_form_are_refused_naming_them(counts, got):
    with pytest.raises(ValueError, match=r"^word_counts must be a Vocabulary or a 1-D") as info:
        token_frequency_preconditioner(counts, vocab_size=3, num_tags=2)
    assert got in str(info.value), info.value


def test_6_counts_as_lists_tensors_and_arrays_agree():
    expected = token_frequency_preconditioner(np.array([5.0, 3.0, 1.0]), vocab_size=3, num_tags=2)
    for counts in ([5, 3, 1], (5, 3.0, np.int64(1)), torch.tensor([5, 3, 1]), range(5, 0, -2)):
        got = token_frequency_preconditioner(counts, vocab_size=3, num_tags=2)
        assert torch.equal(got, expected), counts


# -- finding 7: public users that are not distinct integer ids -----------------------------------


@pytest.fixture(scope="module")
def toy_task():
    return build_task("toy", num_users=6, seed=0)


@pytest.mark.parametrize("users", ["01", [1.5], [True], [0, 0], None, {0, 1}])
def test_7_public_users_must_be_distinct_integer_ids(toy_task, users):
    with pytest.raises(ValueError, match=r"^users must be a sequence of distinct integer user"):
        public_users_preconditioner(toy_task, users, batch_size=16)


def test_7_public_users_as_lists_ranges_and_arrays_agree(toy_task):
    expected = public_users_preconditioner(toy_task, [0, 1, 2], batch_size=16)
    for users in ((0, 1, 2), range(3), np.arange(3), [np.int64(0), 1, 2]):
        assert torch.equal(public_users_preconditioner(toy_task, users, batch_size=16), expected)


# -- finding 8: a DP2 state of a longer phase --------------------------------------------------


@pytest.mark.parametrize(("adaptive", "key"), [(False, "s1"), (True, "s2")])
def test_8_a_dp2_state_of_a_longer_phase_is_refused(adaptive, key):
    longer = _dp2(epsilon=1e-3, s1=5 if not adaptive else 1, s2=5)
    params, state = torch.zeros(3), longer.init(torch.zeros(3))
    for _ in range(3 + adaptive):  # 3 rounds into the SGD phase, or the adaptive one
        _, state = longer.update(torch.ones(3), state, params)
    assert state.adaptive is adaptive and state.phase_step == 3
    shorter = _dp2(epsilon=1e-3, s1=2, s2=2)
    rebuilt = optim.DP2State.from_dict(state.to_dict())
    with pytest.raises(ValueError, match=rf"phase_step must be in \[0, {key} = 2\) .*got 3"):
        shorter.update(torch.ones(3), rebuilt, params)  # was: that phase forever
    longer.update(torch.ones(3), rebuilt, params)  # its own transform goes on
