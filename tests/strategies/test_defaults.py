"""The defaults that depend on the noise: DP-FedAdam's τ, DP-AdamBC's floor, ADADP's tolerance."""

import dataclasses
from pathlib import Path

import pytest
import torch

from fedprivopt.optim import noise_calibrated_tolerance
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import read_rows
from fedprivopt.simulation.run import simulate
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from fedprivopt.strategies.options import ADADPOptions

from .test_core import DIM, fixed_updates

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def _alg(strategy, **kw):
    import torch

    cfg = StrategyConfig.from_mapping(
        dict(
            strategy=strategy,
            population=40,
            clients_per_round=8.0,
            noise_multiplier=1.5,
            clip_norm=2.0,
            **kw,
        )
    )
    return build_algorithm(cfg, torch.zeros(DIM))


def test_bc_floor_defaults_to_the_noise_variance():
    alg = _alg("dp-fedadam-bc")
    assert StrategyConfig(strategy="dp-fedadam-bc").options.gamma is None
    assert alg.transform.hparams["gamma"] is None  # the floor follows the round's Phi
    assert _alg("dp-fedadam-bc", gamma=1e-3).transform.hparams["gamma"] == 1e-3
    # with a fixed clip norm the floor is Phi = (sigma C / m)^2: the same model as gamma = Phi
    explicit = _alg("dp-fedadam-bc", gamma=(1.5 * 2.0 / 8.0) ** 2)
    for a in (alg, explicit):
        drive_round(a, 1, fixed_updates())
    torch.testing.assert_close(alg.params, explicit.params, rtol=1e-12, atol=0.0)


def test_fedadam_tau_defaults_to_the_noise_std():
    assert StrategyConfig(strategy="dp-fedadam").options.tau is None
    alg = _alg("dp-fedadam")
    assert alg.transform.hparams["tau"] is None  # follows the round's sqrt(Phi)
    # with a fixed clip norm tau is sigma C / m = 1.5 * 2 / 8: the same model as that fixed tau
    explicit = _alg("dp-fedadam", tau=1.5 * 2.0 / 8.0)
    small = _alg("dp-fedadam", tau=1e-3)
    for a in (alg, explicit, small):
        drive_round(a, 1, fixed_updates())
    torch.testing.assert_close(alg.params, explicit.params, rtol=1e-12, atol=0.0)
    assert not torch.allclose(alg.params, small.params)
    # without noise (non-private fedadam) and in Flower's flavour: Flower's 1e-3
    for name, kw in (("fedadam", {}), ("dp-fedadam", {"adam_flavor": "flower"})):
        assert _alg(name, **kw).transform.hparams["tau"] == 1e-3


@pytest.mark.parametrize("unset", ["", "strategies.dp-fedadam."])
def test_an_empty_value_gives_a_pinned_option_back_to_its_default(unset):
    # toy.toml pins tau = 0.001; `--set tau=` (or its strategy table's key) unsets it, so the
    # code default (tau following the noise) can be had without editing the preset. A key with
    # a real default keeps refusing "" (naming the key).
    assert load_config(TOY, {"strategy": "dp-fedadam"}).strategy.options.tau == 1e-3
    config = load_config(TOY, {"strategy": "dp-fedadam", f"{unset}tau": ""})
    assert config.strategy.options.tau is None
    with pytest.raises(ValueError, match="clip-norm must be a real number"):
        load_config(TOY, {"strategy": "dp-fedadam", "clip-norm": ""})


def test_adadp_tolerance_defaults_to_the_noise_calibrated_one():
    alg = _alg("dp-fedavg-adadp", server_learning_rate=0.7)
    expected = noise_calibrated_tolerance(learning_rate=0.7, noise_std=1.5 * 2.0 / 8.0, dim=DIM)
    assert alg.controller.tolerance == pytest.approx(expected)
    assert alg.controller.safety == ADADPOptions().adadp_safety == 0.9
    fixed = _alg("dp-fedavg-adadp", adadp_tolerance=0.25)
    assert fixed.controller.tolerance == 0.25
    res = drive_round(alg, 1, fixed_updates())
    assert 0.9 * expected <= res.metrics["adadp_tolerance"] <= expected * (1 + 1e-12)
    w1 = torch.linspace(-3.0, 3.0, DIM, dtype=alg.params.dtype)
    assert alg.round_tolerance(0.375, 0.375, w1) == pytest.approx(
        noise_calibrated_tolerance(learning_rate=0.7, noise_std=0.375, dim=DIM, full_step_point=w1)
    )
    assert fixed.round_tolerance(0.375, 0.375, w1) is None  # a set tolerance stays as set
    assert res.metrics["adadp_accept_rate"] == res.metrics["adadp_step_accepted"]


def test_adadp_tolerance_follows_the_noise_under_adaptive_clipping():
    """The noise moves with C: the default tolerance is recalibrated every round."""
    import math

    alg = _alg(
        "dp-fedavg-adadp", server_learning_rate=0.7, adaptive_clipping=True, clip_count_stddev=2.0
    )
    tolerances = []
    for r in (1, 2, 3):
        m = drive_round(alg, r, fixed_updates()).metrics
        s = math.sqrt((m["noise_std_1"] ** 2 + m["noise_std_2"] ** 2) / 2)
        expected = noise_calibrated_tolerance(learning_rate=0.7, noise_std=s, dim=DIM)
        # on d_eff <= d: the error's division by max(1, |w1|) (test_adadp_defaults)
        assert 0.9 * expected <= m["adadp_tolerance"] <= expected * (1 + 1e-12)
        tolerances.append(m["adadp_tolerance"])
    assert len(set(tolerances)) == 3  # C, hence the noise and the tolerance, moved
    # a tolerance that was set stays as set
    fixed = _alg(
        "dp-fedavg-adadp", adaptive_clipping=True, clip_count_stddev=2.0, adadp_tolerance=0.25
    )
    assert drive_round(fixed, 1, fixed_updates()).metrics["adadp_tolerance"] == 0.25


def test_adadp_error_exponent_reaches_the_controller():
    assert _alg("dp-fedavg-adadp").controller.error_exponent == 0.5  # the authors' rule
    assert _alg("dp-fedavg-adadp", adadp_error_exponent=1.0).controller.error_exponent == 1.0
    with pytest.raises(
        ValueError, match=r"adadp-error-exponent must be a finite number in \(0, 1\]"
    ):
        _alg("dp-fedavg-adadp", adadp_error_exponent=2.0)


def _accept_rates(out, **strategy_kw):
    config = load_config(TOY, {"strategy": "dp-fedavg-adadp", "num-server-rounds": 20})
    strategy = StrategyConfig.from_mapping({**config.strategy.to_mapping(), **strategy_kw})
    config = dataclasses.replace(config, strategy=strategy)
    simulate(config, out, progress=False)
    rows = read_rows(out / "metrics.jsonl")
    return [r["adadp_step_accepted"] for r in rows]


def test_adadp_at_its_default_tolerance_accepts_most_rounds(tmp_path):
    default = _accept_rates(tmp_path / "default", adadp_tolerance=None)
    assert sum(default[5:]) >= 0.8 * len(default[5:])
    # the old fixed default (0.1) is far below the noise-only error of this preset
    fixed = _accept_rates(tmp_path / "fixed", adadp_tolerance=0.1, adadp_safety=1.0)
    assert sum(fixed[5:]) < 0.5 * len(fixed[5:])


def test_dp_fedavg_max_noise_step_caps_the_server_rate():
    """σC/m̄ = 1.5 · 2 / 8 = 0.375: lr 4 with κ 0.75 steps at 0.75 / 0.375 = 2, as lr 2 does."""
    assert StrategyConfig(strategy="dp-fedavg").options.max_noise_step is None  # off in code
    capped = _alg("dp-fedavg", server_learning_rate=4.0, max_noise_step=0.75)
    same = _alg("dp-fedavg", server_learning_rate=2.0)
    loose = _alg("dp-fedavg", server_learning_rate=4.0, max_noise_step=10.0)  # 4·0.375 < 10
    plain = _alg("dp-fedavg", server_learning_rate=4.0)
    results = [drive_round(a, 1, fixed_updates()) for a in (capped, same, loose, plain)]
    assert results[0].metrics["server_learning_rate"] == pytest.approx(2.0)
    assert results[2].metrics["server_learning_rate"] == 4.0
    assert "server_learning_rate" not in results[1].metrics  # no bound: the rate is the setting
    torch.testing.assert_close(capped.params, same.params, rtol=1e-12, atol=0.0)
    torch.testing.assert_close(loose.params, plain.params, rtol=0.0, atol=0.0)
    assert not torch.allclose(capped.params, plain.params)


def test_the_paper_preset_caps_the_strategies_stages_11_and_12_selected():
    """Stages 10-11b: κ 0.5 for DP-FedAvg, AdaDPS, DP2 and ADADP; stage 12: 0.6 for
    DP2-noise-first; none for FedAvg (the Adam flavors have no such option)."""
    preset = Path(__file__).resolve().parents[2] / "simulations" / "adadps-paper.toml"
    for name in ("dp-fedavg", "adadps", "dp2", "dp-fedavg-adadp"):
        assert load_config(preset, {"strategy": name}).strategy.options.max_noise_step == 0.5
    kappa = load_config(preset, {"strategy": "dp2-noise-first"}).strategy.options.max_noise_step
    assert kappa == 0.6
    assert load_config(preset, {"strategy": "fedavg"}).strategy.options.max_noise_step is None
    unset = {"strategy": "dp2", "strategies.dp2.max-noise-step": ""}
    assert load_config(preset, unset).strategy.options.max_noise_step is None


def test_adadp_max_noise_step_lowers_the_initial_rate_and_its_tolerance():
    """σC/m̄ = 0.375: κ 0.75 lowers η₀ 4 to 2, and the calibrated τ is that of η₀ = 2."""
    alg = _alg("dp-fedavg-adadp", server_learning_rate=4.0, max_noise_step=0.75)
    assert alg.initial_rate == pytest.approx(2.0)
    assert alg.opt_state.learning_rate == pytest.approx(2.0)
    expected = noise_calibrated_tolerance(learning_rate=2.0, noise_std=0.375, dim=DIM)
    assert alg.controller.tolerance == pytest.approx(expected)
    assert (
        _alg("dp-fedavg-adadp", server_learning_rate=1.0, max_noise_step=0.75).initial_rate == 1.0
    )
    assert _alg("dp-fedavg-adadp", server_learning_rate=4.0).initial_rate == 4.0
    res = drive_round(alg, 1, fixed_updates())
    assert res.metrics["server_learning_rate"] == pytest.approx(2.0)


def test_max_noise_step_with_server_momentum_reports_the_lowered_rate():
    """β 0.5: κ 0.75 bounds rate·σC/m̄/(1 - β), so the rate is 0.75 · 0.5 / 0.375 = 1."""
    alg = _alg("dp-fedavg", server_learning_rate=4.0, server_momentum=0.5, max_noise_step=0.75)
    result = drive_round(alg, 1, fixed_updates())
    assert result.metrics["server_learning_rate"] == pytest.approx(1.0)


@pytest.mark.parametrize("strategy", ["dp2", "dp2-noise-first"])
def test_dp2_max_noise_step_reports_each_rounds_bounded_rate(strategy):
    """σC/m̄ = 0.375; κ 0.75 bounds a rate at 2: the SGD round's 4 and dp2's adaptive 3."""
    alg = _alg(strategy, server_learning_rate=4.0, dp2_learning_rate=3.0, dp2_s1=1, dp2_s2=1,
               max_noise_step=0.75)  # fmt: skip
    sgd = drive_round(alg, 1, fixed_updates())
    adaptive = drive_round(alg, 2, fixed_updates())
    assert sgd.metrics["adaptive_round"] == 0.0 and adaptive.metrics["adaptive_round"] == 1.0
    assert sgd.metrics["server_learning_rate"] == pytest.approx(2.0)
    if strategy == "dp2":
        assert adaptive.metrics["server_learning_rate"] == pytest.approx(2.0)
    else:  # noise-first adaptive rounds divide by P and are not bounded
        assert "server_learning_rate" not in adaptive.metrics
