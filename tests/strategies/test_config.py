"""Bounds of :class:`StrategyConfig` (issue 15): every count has an upper bound from memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.core.local import MAX_EPOCHS
from fedprivopt.privacy.sampling import MAX_POPULATION
from fedprivopt.strategies import ALGORITHMS, STRATEGIES, StrategyConfig
from fedprivopt.strategies.options import BLOCKS, DP2Options, MomentumOptions

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("local-epochs", 10**13, "local-epochs must be an integer in [1, 10000]"),
        ("local-epochs", 0, "local-epochs must be an integer in [1, 10000]"),
        ("population", 10**9, "population must be an integer in [1, 100000000]"),
        # a later review: sigma 1e300 ran, but its checkpoint's accountant state could not load
        ("noise-multiplier", 1e300, "noise-multiplier must be a finite number in [0, 1e+100]"),
    ],
)
def test_counts_have_upper_bounds(key, value, message):
    with pytest.raises(ValueError) as info:
        StrategyConfig.from_mapping({key: value})
    assert message in str(info.value) and len(str(info.value).splitlines()) == 1


def test_the_bounds_themselves_are_accepted():
    cfg = StrategyConfig.from_mapping(
        {"local-epochs": MAX_EPOCHS, "population": MAX_POPULATION, "clients-per-round": 10}
    )
    assert (cfg.local_epochs, cfg.population) == (10_000, 100_000_000)


def _usage_line(capsys, argv):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.splitlines()[0]


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        # grew to 7 GB building 10**13 epoch orders
        (["local-epochs=10000000000000"], "local-epochs must be an integer in [1, 10000]"),
        # RuntimeError traceback: an 8 GB allocation in the sampler's first round
        (
            ["task-params.num-users=1000000000", "population=1000000000"],
            "population must be an integer in [1, 100000000]",
        ),
    ],
)
def test_simulate_refuses_unbounded_counts_before_the_run(tmp_path, capsys, sets, needle):
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--quiet", "--out", str(out)]
    for s in sets:
        argv += ["--set", s]
    assert needle in _usage_line(capsys, argv)
    assert not out.exists() or not any(out.iterdir())


def test_each_key_goes_to_the_shared_settings_or_the_strategys_own_block():
    cfg = StrategyConfig.from_mapping(
        {"strategy": "dp2", "dp2-s1": 3, "server-momentum": 0.9, "beta1": 0.5, "seed": 4}
    )
    assert type(cfg.options) is DP2Options and cfg.options.dp2_s1 == 3 and cfg.seed == 4
    # knobs of other strategies (a preset shared by compare) are set aside, not applied
    assert cfg.unused == ("beta1", "server-momentum")
    assert "server-momentum" not in cfg.to_mapping() and cfg.to_mapping()["dp2-s1"] == 3
    assert StrategyConfig.from_mapping(cfg.to_mapping()) == cfg
    with pytest.raises(ValueError, match="unknown key 'dp2-s3'"):
        StrategyConfig.from_mapping({"strategy": "dp2", "dp2-s3": 1})
    # a block checks its own keys with their names and ranges
    with pytest.raises(ValueError, match=r"dp2-beta must be a finite number in \[0, 1\)"):
        StrategyConfig.from_mapping({"strategy": "dp2", "dp2-beta": 1.0})
    with pytest.raises(ValueError, match="strategy must be one of"):
        StrategyConfig.from_mapping({"strategy": ["dp2"]})
    with pytest.raises(ValueError, match="must be a DP2Options"):
        StrategyConfig(strategy="dp2", options=MomentumOptions())


def test_every_strategy_has_a_block_and_an_algorithm():
    assert set(BLOCKS) == set(ALGORITHMS) == set(STRATEGIES)
    keys = StrategyConfig.keys()
    for block in BLOCKS.values():
        assert block.keys() <= keys and not block.keys() & StrategyConfig.shared_keys()


def test_simulate_says_which_options_the_strategy_does_not_use(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--quiet", "--out", str(out), "--rounds", "1"]
    assert main([*argv, "--set", "dp2-s1=3"]) == 0
    assert "note: dp-fedavg does not use dp2-s1" in capsys.readouterr().err
