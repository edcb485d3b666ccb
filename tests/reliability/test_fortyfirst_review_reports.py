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
   noise-multiplier`` still set every cell's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.test_misuse_cli import SMALL, TOY


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
