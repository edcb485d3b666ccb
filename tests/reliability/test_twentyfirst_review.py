"""Issue 15, twenty-first hostile review: regression tests of its findings.

1. ``compare toy.toml --strategies dp-fedavg --rounds 1 --set target-epsilon=0.1`` (a budget
   below one round's ε in every cell; also with ``--metric eval_loss``): every run stopped at its
   budget before its first round, and ``compare`` ended with rc 2 and ``runs: none reports a task
   metric (one of ['eval_accuracy', 'eval_recall_at_5', 'eval_accuracy'])``: a line about the
   metric (listing one twice) for a call whose only problem is ``target-epsilon``. Now the line
   says that every run stopped at its privacy budget before its first round and names
   ``target-epsilon``; the metric's list names each metric once.
"""

from __future__ import annotations

from pathlib import Path

from tests.reliability.test_fuzz_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"


def last_line_error(code: int, err: str, *parts: str) -> str:
    """rc 2, no traceback, and the last stderr line (after progress lines) holding ``parts``."""
    assert code == 2, err
    assert "Traceback" not in err and err.endswith("\n"), err
    line = err.splitlines()[-1]
    for part in parts:
        assert part in line, line
    return line


# -- finding 1: a comparison whose every run stopped at the budget before its first round -------
def test_1_compare_under_a_budget_below_one_round_names_target_epsilon(tmp_path):
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--quiet",
            "--set", "target-epsilon=0.1", "--out", str(out)]  # fmt: skip
    code, _, err = run_cli(argv)
    line = last_line_error(code, err, "target-epsilon", "before its first round")
    assert "none reports" not in line, line
    assert not (out / "summary.csv").exists()


def test_1_the_same_with_a_metric_given(tmp_path):
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--quiet",
            "--set", "target-epsilon=0.1", "--metric", "eval_loss", "--out", str(out)]  # fmt: skip
    code, _, err = run_cli(argv)
    line = last_line_error(code, err, "target-epsilon", "before its first round")
    assert "no run reports" not in line, line


def test_1_a_metric_no_run_reports_is_listed_once(tmp_path):
    from fedprivopt.simulation.rundata import RunData, choose_metric

    run = RunData(
        summary={"strategy": "dp-fedavg", "noise_multiplier": 0.5, "seed": 0, "epsilon": 1.0,
                 "delta": 1e-5, "primary_metric": "eval_accuracy", "rounds_completed": 1},
        rows=[{"round": 1, "epsilon": 1.0}],
        path=tmp_path,
    )  # fmt: skip
    try:
        choose_metric([run])
    except ValueError as exc:
        assert str(exc).count("'eval_accuracy'") == 1, exc
    else:
        raise AssertionError("a run without a task metric was accepted")
