"""Issue 15, thirty-seventh review (tune): regression tests of its findings.

1. ``tune simulations/toy.toml --strategy dp2 --grid dp2-learning-rate=0.01,5 --rounds 2
   --mean-trials 2 --seed 1``: rc 0, "best trial-001 (dp2-learning-rate=5)", though toy's
   ``dp2-s1 = 2`` means that no adaptive round runs within 2 rounds: the adaptive rounds' rate
   changed nothing, the trials differed only by their seeds, and the report named a "best"
   learning rate that was never used (``compare --strategies dp2,dp-fedavg --tune-grid
   dp2-learning-rate=0.01,5`` alike). Now a grid key that sets only DP2's adaptive-phase options
   (``dp2-s2``, ``dp2-beta``, ``dp2-epsilon``, ``dp2-learning-rate``, ``clip-norm-adaptive``,
   ``subtract-noise-variance``, ``dp2-scale-by-preconditioner``) when ``dp2-s1 >=
   num-server-rounds`` is refused: rc 2, "argument --grid: 'dp2-learning-rate' changes nothing
   in a run of dp2: with dp2-s1 = 2 and 2 rounds no adaptive round runs; raise --rounds above
   dp2-s1 or lower dp2-s1" (``tune_grid.idle_phase_keys``). With 3 rounds the grid runs.
   ``test_seventeenth_review.test_1_tune_grid_key_with_effect_still_runs`` (a grid over
   ``dp2-scale-by-preconditioner`` at 1 round, which changed nothing) now runs 2 rounds with
   ``dp2-s1 = 1``.
2. ``tune toy.toml --strategy dp-fedadam --grid beta2=0.5,0.99 --rounds 1 --mean-trials 1
   --seed 1`` (also ``beta1``, ``dp-fedadam-bc``, ``fedadam``): rc 0 and a "best" ``beta2``,
   though the first step of a bias-corrected Adam is ``m̂/(√v̂ + τ)`` with ``m̂ = Δ̃`` and
   ``v̂ = Δ̃²`` whatever the decays (``simulate --set beta2=0.5`` and ``0.99`` at one round:
   the same accuracy 0.4433 and eval loss 1.08508). Now refused in one round: "argument --grid:
   'beta2' changes nothing in a run of dp-fedadam: in one round the bias-corrected Adam step
   does not depend on beta1 or beta2 …; tune over more rounds". Flower's flavor (whose step
   keeps a ``√(1-β2)`` beside τ) and ``bias-correction = false`` still tune them.
3. ``tune toy.toml --strategy dp-fedavg-adadp --grid adadp-safety=0.1,0.9 --rounds 1`` (also
   ``adadp-alpha-min``, ``adadp-alpha-max``, ``adadp-error-exponent``): rc 0 and a "best"
   safety factor, though the rate rule only sets the next round's rate (``simulate --set
   adadp-safety=0.1`` and ``0.9``, ``adadp-alpha-max=1.01`` and ``3`` at one round: the same
   accuracy 0.5133 and eval loss 0.98036). Now refused in one round; ``adadp-tolerance``, which
   accepts or rejects the first round (accuracy 0.3733 at 1e-6, 0.5133 at 100), still tunes.
4. ``tune toy.toml --set adaptive-clipping=true --grid clip-quantile=0.1,0.9 --rounds 1`` (also
   ``clip-learning-rate``): rc 0 and a "best" quantile, though the first round clips at
   ``clip-norm`` and the rule only sets the next round's clip norm (``simulate`` at 0.1 and
   0.9, and ``clip-learning-rate`` 0.01 and 5: accuracy 0.5333, eval loss 0.96602 all four).
   Now refused in one round (``clip-count-stddev``, which splits the noise, still tunes).
   ``idle_phase_keys`` now maps each idle key to its reason.
5. ``tune toy.toml --grid server-momentum=0,0.9 --rounds 1`` (dp-fedavg; adadps and fedavg
   alike): rc 0 and a "best" momentum, though the first heavy-ball step is ``η_s Δ̃`` whatever
   ``β`` is (``simulate`` at 0 and 0.9: accuracy 0.5233, eval loss 0.96983 both). Now refused in
   one round unless ``max-noise-step`` is set (its rate bound ``κ(1-β)/√Φ`` reads ``β``).
"""

from __future__ import annotations

import pytest

from fedprivopt.cli import main
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.tune_grid import check_point_effect, idle_phase_keys
from tests.reliability.test_thirtyfourth_review_tuning import TOY, _error

# -- finding 1: DP2's adaptive-phase keys change nothing when no adaptive round runs ----------

IDLE = "changes nothing in a run of dp2: with dp2-s1 = 2 and 2 rounds no adaptive round runs"


@pytest.mark.parametrize(
    "grid",
    [
        "dp2-learning-rate=0.01,5",
        "strategies.dp2.dp2-beta=0.5,0.9",
        "subtract-noise-variance=true,false",
    ],
)
def test_1_dp2_adaptive_keys_without_adaptive_round_refused(tmp_path, capsys, grid):
    out = str(tmp_path / "t")
    argv = ["tune", str(TOY), "--strategy", "dp2", "--grid", grid, "--rounds", "2",
            "--mean-trials", "2", "--seed", "1", "--out", out, "--quiet"]  # fmt: skip
    assert main(argv) == 2
    err = _error(capsys)
    assert IDLE in err and "argument --grid:" in err, err
    assert not (tmp_path / "t").exists()


def test_1_compare_tune_grid_refuses_it_too(tmp_path, capsys):
    argv = ["compare", str(TOY), "--strategies", "dp2,dp-fedavg", "--tune-grid",
            "dp2-learning-rate=0.01,5", "--mean-trials", "1", "--rounds", "2",
            "--out", str(tmp_path / "c"), "--quiet"]  # fmt: skip
    assert main(argv) == 2
    assert IDLE in _error(capsys)


def test_1_adaptive_keys_count_once_an_adaptive_round_runs():
    three = load_config(TOY, {"strategy": "dp2", "num-server-rounds": 3}).strategy
    assert idle_phase_keys(three) == {}
    check_point_effect({"dp2-learning-rate": 5}, three)  # no refusal
    two = load_config(TOY, {"strategy": "dp2", "num-server-rounds": 2}).strategy
    check_point_effect({"dp2-s1": 1}, two)  # the phase length itself is tuned
    check_point_effect({"max-noise-step": 1.0}, two)  # SGD rounds use it
    with pytest.raises(ValueError, match="dp2-s2"):
        check_point_effect({"dp2-s2": 3}, two)


# -- finding 2: Adam's decays change nothing in one bias-corrected round ----------------------


def test_2_adam_decays_in_one_round_refused(tmp_path, capsys):
    argv = ["tune", str(TOY), "--strategy", "dp-fedadam", "--grid", "beta2=0.5,0.99",
            "--rounds", "1", "--mean-trials", "1", "--seed", "1", "--out",
            str(tmp_path / "t"), "--quiet"]  # fmt: skip
    assert main(argv) == 2
    err = _error(capsys)
    assert "'beta2' changes nothing in a run of dp-fedadam: in one round" in err, err
    assert not (tmp_path / "t").exists()


def test_2_adam_decays_count_where_they_act():
    def strategy(name, rounds, **more):
        overrides = {"strategy": name, "num-server-rounds": rounds, **more}
        return load_config(TOY, overrides).strategy

    with pytest.raises(ValueError, match="'beta1' changes nothing in a run of dp-fedadam-bc"):
        check_point_effect({"beta1": 0.5}, strategy("dp-fedadam-bc", 1))
    check_point_effect({"beta2": 0.5}, strategy("dp-fedadam", 2))
    check_point_effect({"beta2": 0.5}, strategy("dp-fedadam", 1, **{"adam-flavor": "flower"}))
    check_point_effect({"beta2": 0.5}, strategy("fedadam", 1, **{"bias-correction": False}))
    check_point_effect({"tau": 0.5}, strategy("dp-fedadam", 1))


# -- finding 3: ADADP's rate rule changes nothing in one round --------------------------------


def test_3_adadp_rate_rule_in_one_round_refused():
    one = load_config(TOY, {"strategy": "dp-fedavg-adadp", "num-server-rounds": 1}).strategy
    rule = {"adadp-safety": 0.5, "adadp-alpha-max": 2.0, "adadp-alpha-min": 0.5,
            "adadp-error-exponent": 0.25}  # fmt: skip
    for key, value in rule.items():
        with pytest.raises(ValueError, match=f"'{key}' changes nothing in a run of dp-fedavg"):
            check_point_effect({key: value}, one)
    check_point_effect({"adadp-tolerance": 0.5}, one)
    two = load_config(TOY, {"strategy": "dp-fedavg-adadp", "num-server-rounds": 2}).strategy
    check_point_effect({"adadp-safety": 0.5}, two)


# -- finding 4: adaptive clipping's rule changes nothing in one round -------------------------


def test_4_adaptive_clipping_rule_in_one_round_refused(tmp_path, capsys):
    argv = ["tune", str(TOY), "--set", "adaptive-clipping=true", "--grid",
            "clip-quantile=0.1,0.9", "--rounds", "1", "--mean-trials", "1", "--seed", "1",
            "--out", str(tmp_path / "t"), "--quiet"]  # fmt: skip
    assert main(argv) == 2
    err = _error(capsys)
    assert "'clip-quantile' changes nothing in a run of dp-fedavg: in one round adaptive" in err
    two = load_config(TOY, {"adaptive-clipping": True, "num-server-rounds": 2}).strategy
    check_point_effect({"clip-learning-rate": 1.0}, two)
    one = load_config(TOY, {"adaptive-clipping": True, "num-server-rounds": 1}).strategy
    check_point_effect({"clip-count-stddev": 1.0}, one)


# -- finding 5: server momentum changes nothing in one round ----------------------------------


def test_5_server_momentum_in_one_round_refused():
    one = load_config(TOY, {"num-server-rounds": 1}).strategy
    with pytest.raises(ValueError, match="'server-momentum' changes nothing in a run of dp-fedavg"):
        check_point_effect({"server-momentum": 0.9}, one)
    bounded = load_config(TOY, {"num-server-rounds": 1, "max-noise-step": 1.0}).strategy
    check_point_effect({"server-momentum": 0.9}, bounded)
    check_point_effect(
        {"server-momentum": 0.9}, load_config(TOY, {"num-server-rounds": 2}).strategy
    )
