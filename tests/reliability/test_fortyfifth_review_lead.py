"""Forty-fifth review of issue 15: the lead's findings (rows the reviewers left open).

1. ``deploy local toy.toml --nodes 1 --seed 99999999999999999999`` (the docs reviewer's open
   row on ``deploy local --help``, whose ``--seed`` named no range where ``simulate``'s does).
   Before: ``seed: integers must fit in 64 bits (as in TOML)``, naming a key and not the flag.
   Now: ``--seed must be an integer in [0, 9223372036854775807]`` (``deploy.cli``), the range
   ``--help`` now gives too; ``--timeout`` says its default (900), ``data synth``'s ``--vocab``
   and ``--tags`` theirs (20000, 500).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.cli import main

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


@pytest.mark.parametrize("seed", ["99999999999999999999", "9223372036854775808", "-1"])
def test_1_deploy_local_names_seed_and_its_range(tmp_path, capsys, seed):
    out = tmp_path / "d"
    code = main(["deploy", "local", str(TOY), "--nodes", "1", "--seed", seed, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert "--seed must be an integer in [0, 9223372036854775807]" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    "command, words",
    [
        (["deploy", "local", "--help"], ["in [0, 9223372036854775807]", "(default: 900)"]),
        (["data", "synth", "--help"], ["(default: 20000)", "(default: 500)"]),
    ],
)
def test_1_help_names_the_defaults_and_the_range(capsys, command, words):
    with pytest.raises(SystemExit) as stop:
        main(command)
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for word in words:
        assert word in text, text
