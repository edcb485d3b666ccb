"""Issue 15, forty-seventh hostile review (input: bad input and the data readers): tests.

1. Python API settings given as subclasses of ``int``, ``float`` or ``str`` (an ``IntEnum``
   task seed, ``load_config(P, {"task-params.seed": Seeds.BASE})``; ``eval-every`` alike; a
   ``(str, Enum)`` member for ``task``, ``device`` or ``engine``; a float subclass for
   ``round-timeout``). Before: the run went on (the values equal the plain ones), rc 0, and its
   ``config.toml`` recorded ``seed = <Seeds.BASE: 0>`` (``repr``, no TOML) or ``task =
   "T.TOY"`` (``str``), so ``simulate --resume`` was refused for ever (``config.toml is not
   valid TOML``), where the ledger had recorded ``0`` and ``"toy"``. Now
   ``core.checks.plain_scalar`` (called on every run setting and task parameter) gives the
   plain ``int``, ``float`` or ``str`` of such a value, as it gives NumPy scalars'.
2. ``simulate toy.toml --strategy adadps --set side-information=ones --set
   strategies.adadps.side-information.kind=public-users`` (the string form of the table beside
   the dotted kind; also the two spellings the other way round). Before: rc 0, the run's table
   silently won: public users (user 0's data as side information, outside the guarantee) where
   ``ones`` was asked, as ``cli_runs.refuse_table_against_flags`` compared the spellings as two
   keys (the same kind in one spelling is refused). Now the string form is read as its kind:
   rc 2, ``strategies.adadps.side-information.kind='public-users' contradicts --set
   side-information='ones', ...``.
3. ``deploy local --nodes 1 --seed 1 --set seed=true`` (also ``--set seed=true --set seed=1``).
   Before: no contradiction, since ``True == 1`` in Python: the value the key refuses was
   dropped silently and seed 1 used, where ``simulate`` refuses both (forty-third review,
   input 6). Now ``deploy.cli._differ`` tells a boolean from a number: rc 2, ``argument --seed:
   1 contradicts --set seed=True; give one of them``.
4. ``simulate toy.toml --set seed=true --set strategies.dp-fedavg.seed=1`` (a boolean beside
   the run's strategy table's number; tune and deploy local alike). Before: rc 0 with seed 1,
   the refused ``seed=true`` dropped silently (``True == 1``), where ``--set seed=true`` alone
   is refused. Now ``cli_runs.refuse_table_against_flags`` compares with ``_differ``: rc 2,
   ``strategies.dp-fedavg.seed=1 contradicts --set seed=True, ...``.
"""

from __future__ import annotations

import enum
import sys
from pathlib import Path

import pytest

from fedprivopt.simulation.config import config_to_toml, load_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


class _Seeds(enum.IntEnum):
    BASE = 0
    EVERY = 2


class _Names(str, enum.Enum):
    TOY = "toy"
    AUTO = "auto"
    FAST = "fast"


class _Seconds(float):
    def __repr__(self) -> str:
        return f"_Seconds({float(self)})"


def test_1_subclassed_settings_are_recorded_as_plain_toml():
    overrides = {
        "task-params.seed": _Seeds.BASE,
        "eval-every": _Seeds.EVERY,
        "task": _Names.TOY,
        "device": _Names.AUTO,
        "engine": _Names.FAST,
        "round-timeout": _Seconds(60.0),
    }
    config = load_config(TOY, overrides)
    data = tomllib.loads(config_to_toml(config))  # readable back, as --resume reads it
    assert data["task-params"]["seed"] == 0 and type(data["task-params"]["seed"]) is int
    assert data["eval-every"] == 2 and data["round-timeout"] == 60.0
    assert (data["task"], data["device"], data["engine"]) == ("toy", "auto", "fast")
    assert type(config.task) is str and type(config.task_params["seed"]) is int
    plain = {"task-params.seed": 0, "eval-every": 2, "task": "toy", "device": "auto"}
    plain |= {"engine": "fast", "round-timeout": 60.0}
    assert config == load_config(TOY, plain)


def test_2_side_information_string_form_against_the_strategy_table(capsys, tmp_path):
    """``--set side-information=ones`` beside the table's ``side-information.kind`` (input 2)."""
    from fedprivopt.cli import main

    pairs = [
        ("side-information=ones", "strategies.adadps.side-information.kind=public-users"),
        ("side-information.kind=public-users", "strategies.adadps.side-information=ones"),
    ]
    for plain, table in pairs:
        argv = ["simulate", str(TOY), "--strategy", "adadps", "--rounds", "1", "--set", plain]
        code = main([*argv, "--set", table, "--out", str(tmp_path / "r")])
        err = capsys.readouterr().err
        assert code == 2 and "contradicts --set side-information" in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "r").exists()


def test_3_deploy_local_boolean_against_a_number_is_a_contradiction(capsys, tmp_path):
    """``deploy local --seed 1 --set seed=true`` is refused as ``simulate`` refuses it (input 3)."""
    from fedprivopt.cli import main
    from fedprivopt.deploy.cli import _overrides

    with pytest.raises(ValueError, match="contradicts an earlier --set seed=True"):
        _overrides(["seed=true", "seed=1"])
    out = tmp_path / "r"
    # population=0 is refused later, by the configuration: nothing starts either way
    argv = ["deploy", "local", "--nodes", "1", "--insecure", "--seed", "1", "--out", str(out)]
    code = main([*argv, "--set", "seed=true", "--set", "population=0"])
    err = capsys.readouterr().err
    assert code == 2 and "argument --seed: 1 contradicts --set seed=True" in err, err
    assert not out.exists()


def test_4_a_boolean_against_the_strategy_tables_number(capsys, tmp_path):
    """``--set seed=true`` beside ``strategies.dp-fedavg.seed=1`` is refused (input 4)."""
    from fedprivopt.cli import main

    out = tmp_path / "r"
    argv = ["simulate", str(TOY), "--rounds", "1", "--set", "seed=true"]
    code = main([*argv, "--set", "strategies.dp-fedavg.seed=1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "contradicts --set seed=True" in err, err
    assert not out.exists()
