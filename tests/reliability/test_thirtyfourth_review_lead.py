"""Thirty-fourth review of issue 15 (the lead's part).

1. A joined Ray cluster's node that declares GPUs its torch cannot use: see
   ``tests/simulation/test_cluster.py`` (it needs the three-node test cluster there).
2. ``simulate toy.toml --set strategy=dp-fedavg --set side-information.kind=public-users --set
   side-information.users=3``: rc 0 without a word, and ``summary.json`` showed the
   ``[side-information]`` table that the run never used (only ``adadps`` reads it; the public
   users stayed in the private population). A ``--set side-information.*`` in ``compare`` for a
   strategy that is not ``adadps`` was as silent. Now both say, as for other strategies'
   options: ``note: dp-fedavg does not use side-information (…)``.
"""

from pathlib import Path

from fedprivopt.cli import main
from fedprivopt.cli_runs import _note_unused, load_preset

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
PUBLIC = {"side-information.kind": "public-users", "side-information.users": 3}


def _sets(*pairs: str) -> list[str]:
    return [word for pair in pairs for word in ("--set", pair)]


def test_2_simulate_says_a_strategy_does_not_use_side_information(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(out),
               *_sets("strategy=dp-fedavg", *(f"{k}={v}" for k, v in PUBLIC.items()))])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0
    assert "note: dp-fedavg does not use side-information" in err
    # adadps reads it: no note
    _note_unused([load_preset(TOY, {"strategy": "adadps", **PUBLIC})])
    assert "side-information" not in capsys.readouterr().err


def test_2_compare_notes_its_side_information_sets_per_strategy(capsys):
    sets = {"side-information.kind": "ones"}
    configs = [load_preset(TOY, {**sets, "strategy": name}) for name in ("dp-fedavg", "adadps")]
    _note_unused(configs, sets)
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "side-information" in line] == [
        "note: dp-fedavg does not use side-information (other strategies' options, or ones it "
        "ignores)"
    ]
    _note_unused(configs, {"clip-norm": 1.0})  # a preset's table that compare did not set
    assert "side-information" not in capsys.readouterr().err
