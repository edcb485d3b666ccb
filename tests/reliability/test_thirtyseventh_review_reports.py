"""Issue 15, thirty-seventh hostile review (reports: what ``compare`` and ``write_report`` report).

1. Rows whose ε come from different accountants: ``compare toy.toml --strategies
   dp-fedavg,dp-fedadam --rounds 2`` with ``accountant = "pld"`` in the preset's
   ``[strategies.dp-fedadam]`` (or ``--set strategies.dp-fedadam.accountant=pld``, or
   ``write_report(out, load_runs(F))`` of such runs): rc 0, the Summary set dp-fedadam at ε
   8.961 beside dp-fedavg at 10.28, the same σ, sampling and rounds (one privacy loss, bounded
   by two accountants), and ``privacy_utility.png`` drew dp-fedadam to the left of dp-fedavg
   as if it had spent less; only "accountant: varies (see the runs)" under the privacy
   parameters said anything. Now each ε cell names its accountant (``8.961 (pld)``,
   ``10.28 (rdp)``) when the rows' accountants differ, a warning (stderr and the report's
   Warnings) says their epsilons are not comparable, and the plot's ε axis says so.
"""

from __future__ import annotations

import pytest

from fedprivopt.simulation.report import write_report
from fedprivopt.simulation.run import simulate
from fedprivopt.simulation.rundata import RunWarning, load_runs
from tests.simulation.test_run import small_config


@pytest.fixture(scope="module")
def two_accountants(tmp_path_factory):
    """A folder of two 1-round runs, dp-fedavg under rdp and dp-fedadam under pld."""
    root = tmp_path_factory.mktemp("accountants")
    simulate(small_config(**{"num-server-rounds": 1}), root / "rdp")
    simulate(small_config(**{"num-server-rounds": 1, "strategy": "dp-fedadam",
                             "accountant": "pld"}), root / "pld")  # fmt: skip
    return root


# -- 1: rows of different accountants -------------------------------------------------------------
def test_1_rows_of_different_accountants_say_their_epsilons_are_not_comparable(
    two_accountants, tmp_path
):
    runs = load_runs(two_accountants)
    with pytest.warns(RunWarning, match="different accountants"):
        report = write_report(tmp_path / "r", runs, title="t")
    text = report.read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if "| 0." in line}
    assert " (pld) |" in rows["dp-fedadam"] and " (rdp) |" in rows["dp-fedavg"], text
    assert "different accountants (pld: dp-fedadam σ=" in text
    assert "not comparable" in text.split("## Warnings", 1)[1]
