import json
from pathlib import Path

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.simulation.config import load_config
from fedprivopt.strategies import STRATEGIES, build_algorithm
from fedprivopt.strategies.core import drive_round

PRESETS = sorted((Path(__file__).resolve().parents[2] / "simulations").glob("*.toml"))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_preset_resolves_for_every_strategy(preset, strategy):
    config = load_config(preset, {"strategy": strategy})
    assert config.strategy.strategy == strategy
    assert config.strategy.population == config.task_params.get(
        "num_users", config.strategy.population
    )


def test_adadps_paper_epsilon_equals_the_cli(capsys):
    config = load_config(PRESETS[0].parent / "adadps-paper.toml")
    s = config.strategy
    assert (s.population, s.clients_per_round, s.noise_multiplier, s.clip_norm) == (
        400,
        20,
        0.3,
        2.0,
    )
    assert (s.num_server_rounds, s.delta, s.batch_size, s.server_momentum) == (40, 0.0025, 100, 0.9)
    alg = build_algorithm(s, torch.zeros(8), preconditioner=torch.ones(8))
    for r in range(1, s.num_server_rounds + 1):
        drive_round(alg, r, lambda req: {u: torch.zeros(8) for u in req.users})
    assert (
        main(
            [
                "epsilon",
                "--noise-multiplier",
                "0.3",
                "--sample-rate",
                "0.05",
                "--rounds",
                "40",
                "--delta",
                "0.0025",
                "--json",
            ]
        )
        == 0
    )
    cli = json.loads(capsys.readouterr().out)["epsilon"]
    assert alg.epsilon() == cli
    assert cli == pytest.approx(38.14, abs=0.01)  # dp-accounting RDP; the paper reports 34
