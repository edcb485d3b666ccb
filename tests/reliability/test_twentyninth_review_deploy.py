"""Issue 15, twenty-ninth review: the command-line area's two findings in ``deploy local``.

1. ``deploy local --nodes 2 toy.toml --rounds 1 --set strategies.dp-fedavg.num-server-rounds=3``
   would have deployed 3 rounds: the run's strategy table was applied over the flag (as in
   ``simulate``, the command-line area's finding 2). Now rc 2 before anything starts, one line
   naming both.
2. The ``--set`` example of ``deploy local --help`` (``--set clip-norm=0.5 --set
   task-params.num-users=6``) was refused by the default preset (its population must equal the
   task's users), and so was the last command of its examples (``--set population=6 --set
   task-params.num-users=6``: clients-per-round 10 above the population). The flag's example
   now sets ``noise-multiplier=0.8``, and the command ``clients-per-round=3`` too.
"""

from __future__ import annotations

from fedprivopt.deploy.cli import _checked_config, _overrides
from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_misuse_cli import TOY, usage_error


def test_1_a_strategy_table_against_a_flag_is_refused_before_anything_starts(tmp_path):
    out = tmp_path / "d"
    line = usage_error(
        run_cli(["deploy", "local", "--nodes", "2", "--insecure", str(TOY), "--rounds", "1",
                 "--set", "strategies.dp-fedavg.num-server-rounds=3", "--out", str(out)]),
        "strategies.dp-fedavg.num-server-rounds=3 contradicts --rounds",
    )  # fmt: skip
    assert not out.exists(), line


def _sets(words: list[str]) -> list[str]:
    return [words[i + 1] for i, word in enumerate(words) if word == "--set"]


def test_2_every_example_of_set_in_the_help_gives_a_valid_configuration():
    help_text = run_cli(["deploy", "local", "--help"])[1]
    flag_example = help_text.split("e.g.", 1)[1].split("\n  --", 1)[0].split()
    config = _checked_config(None, _overrides(_sets(flag_example)))  # the default preset
    assert config.strategy.clip_norm == 0.5
    commands = help_text.split("examples:", 1)[1].replace("\\\n", " ").splitlines()
    commands = [line.split() for line in commands if "--set" in line]
    assert len(commands) == 2, help_text
    for words in commands:
        preset = next((w for w in words if w.endswith(".toml")), None)
        _checked_config(preset, _overrides(_sets(words)))  # raised ValueError for the last
