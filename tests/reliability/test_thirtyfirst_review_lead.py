"""Issue 15, thirty-first hostile review: what the reviewers found in files they did not own.

1. (found by the ledger's reviewer) ``summary.json``'s ``rounds_completed`` edited to
   ``Infinity`` (also ``-Infinity``, ``1e400``; Python's ``json`` reads all three as floats):
   ``simulate --resume R`` ended in an ``OverflowError`` traceback, rc 1, from
   ``audit.read_summary``'s ``int()`` (``compare`` and ``compare-tuned --untuned`` reach it too).
   Now the summary is refused as unreadable, one line naming it, rc 2.
"""

from __future__ import annotations

import json

import pytest

from fedprivopt.cli import main
from fedprivopt.simulation.run import simulate
from tests.simulation.test_run import small_config


@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "1e400", "NaN", "2.5", "true"])
def test_1_a_summary_with_a_non_integer_round_count_is_one_line(tmp_path, capsys, value):
    out = simulate(small_config(**{"num-server-rounds": 2}), tmp_path / "run").out_dir
    summary = out / "summary.json"
    data = json.loads(summary.read_text())
    text = json.dumps(data).replace(
        f'"rounds_completed": {data["rounds_completed"]}', f'"rounds_completed": {value}'
    )
    assert value in text
    summary.write_text(text)
    capsys.readouterr()
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "summary.json is unreadable (rounds_completed must be an integer >= 0" in err, err
