"""Issue 15, thirty-fifth review (tuning): regression tests of its findings.

1. ``tune toy.toml --grid server-learning-rate=0.5,1 --grid local-learning-rate=0.1,0.05
   --mean-trials 1 --seed 1 --out O``, then the same command with the two ``--grid`` flags in the
   other order (to continue it, or to add trials): rc 2, ``--out 'O' holds a tuning of another
   plan (the drawn trials differ (the tuning was made by another version))``, though the same
   version made both; the grids compare equal as JSON objects, but a trial's values are drawn
   from the seed key by key in the grid's order, so the trials differ. ``compare --tune-grid``
   with its ``--tune-grid`` flags reordered said the same. Now the refusal names the cause:
   ``--grid differs: the earlier tuning gave its keys in the order server-learning-rate,
   local-learning-rate, this call local-learning-rate, server-learning-rate; … give the --grid
   flags in the earlier order to continue it`` (``tune_replan.plan_difference``).
"""

from __future__ import annotations

from pathlib import Path

from fedprivopt.cli import main
from tests.reliability.test_thirtyfourth_review_tuning import TOY, _error

SLR, LLR = "server-learning-rate=0.5,1", "local-learning-rate=0.1,0.05"


def _tune(out: Path, *flags: str) -> list[str]:
    """A one-round toy tuning of mean 1 trial into ``out``, with ``flags``."""
    return ["tune", str(TOY), *flags, "--mean-trials", "1", "--seed", "1", "--rounds", "1",
            "--out", str(out), "--quiet"]  # fmt: skip


# -- finding 1: --grid flags in another order are named as such ------------------------------


def test_1_grid_flags_in_another_order_are_named(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(_tune(out, "--grid", SLR, "--grid", LLR)) == 0
    capsys.readouterr()
    assert main(_tune(out, "--grid", LLR, "--grid", SLR)) == 2
    err = _error(capsys)
    assert "another version" not in err, err
    assert (
        "--grid differs: the earlier tuning gave its keys in the order server-learning-rate, "
        "local-learning-rate, this call local-learning-rate, server-learning-rate"
    ) in err, err
    assert main(_tune(out, "--grid", SLR, "--grid", LLR)) == 0  # the earlier order continues
