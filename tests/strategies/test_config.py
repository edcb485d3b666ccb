"""Bounds of :class:`StrategyConfig` (issue 15): every count has an upper bound from memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.core.local import MAX_EPOCHS
from fedprivopt.privacy.sampling import MAX_POPULATION
from fedprivopt.strategies import StrategyConfig

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("local-epochs", 10**13, "local-epochs must be an integer in [1, 10000]"),
        ("local-epochs", 0, "local-epochs must be an integer in [1, 10000]"),
        ("population", 10**9, "population must be an integer in [1, 100000000]"),
        # a later review: sigma 1e300 ran, but its checkpoint's accountant state could not load
        ("noise-multiplier", 1e300, "noise-multiplier must be a number in [0, 1e+100]"),
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
