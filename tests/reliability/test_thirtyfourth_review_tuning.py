"""Issue 15, thirty-fourth review (tuning): regression tests of its findings.

1. ``compare toy.toml --strategies dp-fedavg,dp-fedadam --tune-grid server-learning-rate=0.5,1
   --tune-grid dp-fedadam:server-learning-rate=0.01,0.03,0.1 --mean-trials 1`` (dp-fedavg
   tuned over 2 points, dp-fedadam over 3): ``report.md`` set the two rows side by side with no
   word that their searches differ in size (only the tunings' commands, at the end, showed the
   grids), where ``compare-tuned`` of the same tunings says "The strategies were not tuned
   alike: their grid sizes (dp-fedavg: 2, dp-fedadam: 3 points) differ" (the thirty-third
   review's results finding 5, left open for ``compare --tune-grid``). Now the notes of a tuned
   comparison have the same table of how each strategy was tuned (grid, grid points, trials
   per tuning, selection) and the same sentence (``tune_report.procedure_lines``, shared).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.cli import main

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


@pytest.fixture(scope="module")
def unequal_grids(tmp_path_factory) -> Path:
    """A tuned comparison: dp-fedavg over 2 grid points, dp-fedadam over 3 (one round)."""
    out = tmp_path_factory.mktemp("r34t") / "c"
    code = main([
        "compare", str(TOY), "--strategies", "dp-fedavg,dp-fedadam",
        "--tune-grid", "server-learning-rate=0.5,1",
        "--tune-grid", "dp-fedadam:server-learning-rate=0.01,0.03,0.1",
        "--mean-trials", "1", "--rounds", "1", "--out", str(out), "--quiet",
    ])  # fmt: skip
    assert code == 0
    return out


# -- finding 1: compare --tune-grid states per-strategy grids of different sizes ------------


def test_1_tuned_compare_states_the_grid_size_of_each_strategy(unequal_grids, capsys):
    capsys.readouterr()
    notes = (unequal_grids / "report.md").read_text(encoding="utf-8").split("## Notes", 1)[1]
    assert "| dp-fedavg (tuned) | 1 | server-learning-rate in [0.5, 1] | 2 |" in notes, notes
    assert "| dp-fedadam (tuned) | 1 | server-learning-rate in [0.01, 0.03, 0.1] | 3 |" in notes
    assert (
        "not tuned alike:** their grid sizes (dp-fedavg: 2, dp-fedadam: 3 points) differ"
    ) in notes, notes
