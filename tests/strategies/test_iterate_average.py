"""The moving average of the released iterates (``ema-decay``): what it is, resume, validation."""

import json

import pytest
import torch

from fedprivopt.simulation.run import resume, simulate
from fedprivopt.strategies import STRATEGIES, StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.simulation.test_run import small_config
from tests.strategies.test_core import DIM, config, fixed_updates


def make(strategy, beta):
    side = torch.full((DIM,), 2.0) if strategy == "adadps" else None
    cfg = config(strategy=strategy, ema_decay=beta, dp2_s1=1, dp2_s2=1)
    return build_algorithm(cfg, torch.zeros(DIM), preconditioner=side)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_output_is_the_moving_average_of_the_released_iterates(strategy):
    beta = 0.7
    alg = make(strategy, beta)
    assert torch.equal(alg.output_params(), alg.params)  # before the first round: the init
    released = []
    for r in range(1, 5):
        released.append(drive_round(alg, r, fixed_updates()).params.clone())
    expected = released[0]
    for theta in released[1:]:
        expected = beta * expected + (1 - beta) * theta
    torch.testing.assert_close(alg.output_params(), expected, rtol=0, atol=1e-6)
    assert not torch.equal(alg.output_params(), alg.params)
    # the average is never broadcast: the next round starts from the last iterate (ADADP's
    # second cohort from its half step)
    seen, average = [], alg.output_params().clone()
    drive_round(alg, 5, lambda req: seen.append(req.params.clone()) or fixed_updates()(req))
    assert torch.equal(seen[0], released[-1])
    assert not any(torch.equal(p, average) for p in seen)


def test_decay_zero_reports_the_last_iterate_and_stores_nothing():
    alg = make("dp-fedadam", 0.0)
    res = drive_round(alg, 1, fixed_updates())
    assert torch.equal(alg.output_params(), alg.params) and torch.equal(res.params, alg.params)
    assert "averaged" not in alg.state_dict()


def test_the_average_survives_a_checkpoint_and_a_lost_one_is_refused():
    a, b = make("dp-fedavg", 0.9), make("dp-fedavg", 0.9)
    for r in (1, 2):
        drive_round(a, r, fixed_updates())
    b.load_state_dict(a.state_dict())
    for r in (3, 4):
        drive_round(a, r, fixed_updates())
        drive_round(b, r, fixed_updates())
    assert torch.equal(a.output_params(), b.output_params())
    state = make("dp-fedavg", 0.9)
    drive_round(state, 1, fixed_updates())
    good = state.state_dict()
    for broken in (
        {k: v for k, v in good.items() if k != "averaged"},
        {**good, "averaged": good["averaged"][:-1]},
        {**good, "averaged": good["averaged"].double()},
        {**good, "averaged": good["averaged"].tolist()},
    ):
        with pytest.raises(ValueError, match="moving average"):
            make("dp-fedavg", 0.9).load_state_dict(broken)


@pytest.mark.parametrize("bad", [1.0, -0.1, float("nan"), 2, True])
def test_ema_decay_must_be_in_zero_one(bad):
    with pytest.raises(ValueError, match=r"ema-decay must be a (finite|real) number in \[0, 1\)"):
        StrategyConfig(ema_decay=bad)


def test_a_run_evaluates_the_average_and_its_summary_says_so(tmp_path):
    extra = {"ema-decay": 0.8, "eval-every": 1, "num-server-rounds": 4}
    run = simulate(small_config(**extra), tmp_path / "ema")
    last = simulate(small_config(**{**extra, "ema-decay": 0.0}), tmp_path / "last")
    # the same released iterates (the average is post-processing), evaluated differently
    assert torch.equal(run.params, last.params) and run.epsilon == last.epsilon
    assert run.rows[0]["eval_loss"] == last.rows[0]["eval_loss"]  # a_1 = theta_1
    assert run.rows[-1]["eval_loss"] != last.rows[-1]["eval_loss"]
    summary = json.loads((run.out_dir / "summary.json").read_text())
    assert "moving average (decay 0.8)" in summary["evaluated_model"]
    assert "no privacy cost" in summary["evaluated_model"]
    assert json.loads((last.out_dir / "summary.json").read_text())["evaluated_model"] == (
        "the last iterate"
    )


def test_resume_continues_the_average(tmp_path):
    extra = {"ema-decay": 0.8, "eval-every": 1}
    full = simulate(small_config(**extra), tmp_path / "full")
    part = simulate(small_config(**{**extra, "num-server-rounds": 3}), tmp_path / "part")
    cfg = part.out_dir / "config.toml"
    cfg.write_text(cfg.read_text().replace("num-server-rounds = 3", "num-server-rounds = 6"))
    resumed = resume(part.out_dir)
    assert resumed.rows[-1]["eval_loss"] == full.rows[-1]["eval_loss"]
