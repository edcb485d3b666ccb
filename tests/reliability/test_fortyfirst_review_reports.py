"""Issue 15, forty-first hostile review (reports: compare, tune, their reports): tests.

1. ``compare P --strategies dp-fedavg,dp-fedadam --rounds 1`` without ``--noise-multipliers``,
   the preset ``P`` (toy, strategy ``dp-fedavg``, σ 0.5) with ``[strategies.dp-fedavg]
   noise-multiplier = 1.0``, or with ``[strategies.dp-fedadam] noise-multiplier = 2.0`` (a
   per-strategy calibration to equal ε). Before: every cell ran at the noise multiplier of the
   preset's own strategy, its table included: dp-fedadam at σ 1.0 (ε 2.53) where its preset and
   ``simulate --strategy dp-fedadam`` say 0.5 (ε 7.55), and dp-fedadam's own 2.0 silently
   replaced by 0.5 (``--help``: "noise multipliers (default: the preset's)"). Now each strategy's
   default is its own, as ``simulate`` and ``tune`` read it (``cli_compare._preset_sigma``), in
   ``compare`` and ``compare --tune-grid``; ``--noise-multipliers`` and ``--set
   noise-multiplier`` still set every cell's. The report's first line named "2 strategies × 2
   noise multipliers (0.5, 2)", a grid of four, for two runs; it now says "noise multipliers by
   strategy (dp-fedadam 2; dp-fedavg 0.5)" when the strategies ran at different sets of σ.
2. ``compare toy.toml --strategies dp-fedavg,dp-fedavg-adadp,fedavg --rounds 2`` (ADADP spends
   two privacy events a round; a per-strategy ``clients-per-round`` or ``num-server-rounds``
   alike). Before: dp-fedavg-adadp at ε 13.71 beside dp-fedavg at 10.28, both σ 0.5, without a
   word (a report warned only when the accountants or neighbouring relations differ), where a
   comparison of strategies is one at equal privacy. Now ``rundata_aggregate.
   unequal_epsilon_notes`` warns (report.md's Warnings, stderr) naming each strategy's ε; a σ
   grid every strategy runs at equal ε, and tuned rows beside untuned ones, give no note.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.simulation.run import simulate
from fedprivopt.simulation.rundata import load_run
from fedprivopt.simulation.rundata_aggregate import aggregate_with_notes
from tests.reliability.test_misuse_cli import SMALL, TOY
from tests.simulation.test_run import small_config


def _preset(tmp_path: Path, strategy: str, sigma: float) -> Path:
    text = TOY.read_text()
    table = f"[strategies.{strategy}]\n"
    if table in text:
        text = text.replace(table, f"{table}noise-multiplier = {sigma}\n")
    else:
        text += f"\n{table}noise-multiplier = {sigma}\n"
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


def _sigmas(argv: list[str]) -> dict[str, float]:
    """Each cell's noise multiplier, as ``compare`` resolves its grid (nothing is run)."""
    from fedprivopt.cli import build_parser
    from fedprivopt.cli_compare import compare_cells, compare_overrides
    from fedprivopt.cli_runs import load_preset

    args = build_parser().parse_args(["compare", *argv, *SMALL])
    cells = compare_cells(args, load_preset(args.config, compare_overrides(args)))
    return {cell.label: cell.config.strategy.noise_multiplier for cell in cells}


# -- finding 1: compare's default noise multiplier is each strategy's own ----------------------


@pytest.mark.parametrize(
    "strategy, sigma, expected",
    [("dp-fedavg", 1.0, {"dp-fedavg": 1.0, "dp-fedadam": 0.5}),
     ("dp-fedadam", 2.0, {"dp-fedavg": 0.5, "dp-fedadam": 2.0})],
)  # fmt: skip
def test_1_compare_runs_each_strategy_at_its_preset_sigma(tmp_path, strategy, sigma, expected):
    argv = [str(_preset(tmp_path, strategy, sigma)), "--strategies", "dp-fedavg,dp-fedadam"]
    found = _sigmas(argv)
    assert found == {f"{s}__sigma{v:g}__seed0": v for s, v in expected.items()}
    found = _sigmas([*argv, "--tune-grid", "server-learning-rate=0.5,1", "--mean-trials", "1"])
    assert found == {f"{s}__sigma{v:g}__seed0": v for s, v in expected.items()}


def test_1_the_flags_still_set_every_cells_sigma(tmp_path):
    argv = [str(_preset(tmp_path, "dp-fedadam", 2.0)), "--strategies", "dp-fedavg,dp-fedadam"]
    for extra, sigma in (
        (["--noise-multipliers", "1"], 1.0),
        (["--set", "noise-multiplier=3"], 3.0),
    ):
        assert set(_sigmas([*argv, *extra]).values()) == {sigma}


# -- finding 2: a report says when its strategies ran at unequal epsilon -----------------------


@pytest.fixture(scope="module")
def one_round_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("r41reports")
    runs = {}
    for name, extra in (("dp-fedavg", {}), ("dp-fedadam", {}), ("dp-fedavg-adadp", {}),
                        ("fedavg", {}), ("dp-fedadam-1", {"noise-multiplier": 1.0})):  # fmt: skip
        config = small_config(**{"num-server-rounds": 1, "strategy": name.removesuffix("-1")},
                              **extra)  # fmt: skip
        simulate(config, root / name)
        runs[name] = load_run(root / name)
    return runs


def _unequal(runs) -> list[str]:
    _, notes = aggregate_with_notes(runs, None)
    return [n for n in notes if "unequal epsilon" in n]


def test_2_strategies_at_unequal_epsilon_are_noted(one_round_runs):
    runs = one_round_runs
    (note,) = _unequal([runs["dp-fedavg"], runs["dp-fedavg-adadp"], runs["fedavg"]])
    eps = (runs["dp-fedavg"].epsilon, runs["dp-fedavg-adadp"].epsilon)
    assert eps[0] < eps[1]
    assert "dp-fedavg 7.99; dp-fedavg-adadp 11.25)" in note and "not at equal privacy" in note
    # strategies at sigma 0.5 and 1 each: equal epsilon at each point, no note
    grid = [runs["dp-fedavg"], runs["dp-fedadam"], runs["fedavg"]]
    assert _unequal(grid) == []
    assert len(_unequal([runs["dp-fedavg"], runs["dp-fedadam-1"]])) == 1
    # one strategy at more points of the same epsilon grid: no note
    assert _unequal([runs["dp-fedavg"], runs["dp-fedadam"], runs["dp-fedadam-1"]]) == []


def test_2_tuned_rows_are_compared_with_tuned_rows_only():
    from fedprivopt.simulation.rundata_aggregate import unequal_epsilon_notes

    rows = [{"strategy": "dp-fedavg (tuned)", "epsilon": 13.09, "private": True},
            {"strategy": "dp-fedadam (tuned)", "epsilon": 13.09, "private": True},
            {"strategy": "dp-fedavg", "epsilon": 10.28, "private": True},
            {"strategy": "fedavg", "epsilon": float("inf"), "private": False}]  # fmt: skip
    assert unequal_epsilon_notes(rows) == []
    rows[1]["epsilon"] = 20.0
    assert len(unequal_epsilon_notes(rows)) == 1


def test_1_a_report_names_each_strategys_noise_multipliers(one_round_runs, tmp_path):
    from fedprivopt.simulation.report import write_report

    runs = [one_round_runs["dp-fedavg"], one_round_runs["dp-fedadam-1"], one_round_runs["fedavg"]]
    header = write_report(tmp_path / "r", runs, title="t").read_text().splitlines()[2]
    assert "noise multipliers by strategy (dp-fedadam 1; dp-fedavg 0.5) plus non-private" in header
