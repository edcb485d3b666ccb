"""Issue 15, forty-sixth hostile review (reports: compare, tune, compare-tuned, reports): tests.

1. ``compare toy.toml --strategies dp-fedavg,fedavg --rounds 2 --metric eval_loss --set
   strategies.dp-fedavg.server-learning-rate=1e39`` (the private row diverged: its final loss
   NaN; also ``write_report`` of such runs, and ``compare --strategies fedavg`` alone).
   Before: ``privacy_utility.png`` drew the baseline alone and wrote "no private runs" under
   an ε axis saying "δ differs between runs; see the table" (every run at δ 1e-4; the axis
   took δ from the drawn points only, none): read alone, a comparison without the private run
   it holds. Now ``report_plots.draw_privacy_utility`` names the rows it cannot draw ("not
   drawn (no finite final value or ε; see the table): dp-fedavg σ=0.5") and takes δ from
   every row with a finite ε; with no private row at all the axis says so ("no private run:
   the non-private baselines' ε is ∞").
2. ``metric_vs_round.png`` of finding 1's comparison. Before: the dp-fedavg row, with no
   finite loss in any round, was left out without a word (no line, no legend entry: the plot
   of a comparison of fedavg alone). Now ``report_plots.draw_metric_vs_round`` names such rows
   ("not drawn (no finite value in any round; see the table): dp-fedavg σ=0.5").
3. ``write_report(out, load_runs(D))`` (the documented API) of a diverged run whose directory
   is named ``a<CR>## Fake heading`` (a carriage return: a line ending of Markdown; the CLI
   refuses such paths, the Python API took them). Before: ``report_format.table_cell``
   (the Warnings' items, the Runs table's and the tunings' cells) turned ``\\n`` alone into a
   space, so each of the run's warnings became a heading ``## Fake heading: diverged at
   round 1 ...`` of its own under "Warnings". Now every other control character is escaped as
   ``report_format.one_line`` does (``a\\r## Fake heading``): one item, one cell.
4. ``write_report(out, load_runs(F))`` of a dp-fedavg run at σ 0.5 (RDP) whose ``config.toml``
   was edited afterwards to ``noise-multiplier = 5.0`` and ``accountant = "pld"`` (``compare``,
   ``compare-tuned --untuned`` and ``--resume`` refuse such a run; the thirty-ninth review's
   reports 4 is the same with ``config.toml`` deleted). Before: reported as σ 5 with the
   ledger's RDP ε labelled ``pld`` (``summary.csv``: ``dp-fedavg,5.0,...,pld``), the only
   warning that ``summary.json`` says σ 0.5 ("reported as configured"). Now
   ``rundata_summary.recorded_summary`` reads the ledger's header for a configured run too:
   reported as the ledger records (σ 0.5, rdp), with a warning naming both files.
5. Finding 4's run with ``config.toml`` edited to ``secure = true`` instead (a seeded run:
   its noise regenerated from seed 0, which the report names). Before: the report said
   "secure: true" and left out the line that the seeds regenerate the run's noise, without a
   warning (``secure`` and ``noise-mode`` were not among the ledger's settings a report
   reads). Now ``rundata_summary.LEDGER_KEYS`` holds them: "secure: false", the seeded-runs
   line, and the warning of finding 4.
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pytest

from fedprivopt.simulation import report_plots
from fedprivopt.simulation.report import aggregate_runs, write_report
from fedprivopt.simulation.report_format import table_cell
from fedprivopt.simulation.run import simulate
from fedprivopt.simulation.rundata import RunData, load_run, load_runs
from fedprivopt.simulation.rundata_aggregate import Selection
from tests.simulation.test_run import small_config


def _run(tmp_path, strategy: str, sigma: float, loss: float, name: str = "") -> RunData:
    """A finished 2-round toy run (dp-fedavg at ε 10.28, or a non-private baseline)."""
    private = sigma > 0
    config = {"strategy": strategy, "noise-multiplier": sigma, "sampling": "poisson",
              "accountant": "rdp", "delta": 1e-4, "seed": 0}  # fmt: skip
    summary = {"strategy": strategy, "noise_multiplier": sigma, "seed": 0,
               "epsilon": 10.28 if private else math.inf, "delta": 1e-4,
               "rounds_completed": 2, "config": config}  # fmt: skip
    rows = [{"round": r, "eval_accuracy": 0.5, "eval_loss": loss} for r in (1, 2)]
    return RunData(summary, rows, tmp_path / (name or f"{strategy}__sigma{sigma:g}__seed0"),
                   ledger_epsilon=10.28 if private else None)  # fmt: skip


def _drawn(monkeypatch, tmp_path, runs, metric: str) -> tuple[str, list[str]]:
    """The ε axis' label and the texts of the privacy-utility plot of ``runs``."""
    seen = []
    monkeypatch.setattr(report_plots, "_finish", lambda fig, ax, path, n: seen.append(
        (ax.get_xlabel(), [t.get_text() for t in ax.texts])))  # fmt: skip
    report_plots.draw_privacy_utility(aggregate_runs(runs, metric=metric), tmp_path / "p.png")
    return seen[0]


def test_1_a_private_row_without_a_finite_value_is_named_not_hidden(monkeypatch, tmp_path):
    runs = [_run(tmp_path, "dp-fedavg", 0.5, math.nan), _run(tmp_path, "fedavg", 0.0, 0.85)]
    label, texts = _drawn(monkeypatch, tmp_path, runs, "eval_loss")
    assert "no private runs" not in texts, texts
    assert any("not drawn" in t and "dp-fedavg σ=0.5" in t for t in texts), texts
    assert label == "ε (at δ=0.0001)", label
    baseline = _drawn(monkeypatch, tmp_path, runs[1:], "eval_loss")
    assert "δ differs" not in baseline[0] and "no private run" in baseline[0], baseline
    assert baseline[1] == ["no private runs"], baseline
    both = _drawn(monkeypatch, tmp_path, runs, "eval_accuracy")  # every row drawn: as before
    assert both[0] == "ε (at δ=0.0001)" and not any("drawn" in t for t in both[1]), both


def test_2_a_row_without_a_finite_value_in_any_round_is_named(monkeypatch, tmp_path):
    runs = [_run(tmp_path, "dp-fedavg", 0.5, math.nan), _run(tmp_path, "fedavg", 0.0, 0.85)]
    seen = []
    monkeypatch.setattr(report_plots, "_finish", lambda fig, ax, path, n: seen.append(
        [t.get_text() for t in ax.texts]))  # fmt: skip
    for metric in ("eval_loss", "eval_accuracy"):
        report_plots.draw_metric_vs_round(Selection(metric, runs), tmp_path / "m.png")
    assert any("not drawn" in t and "dp-fedavg σ=0.5" in t for t in seen[0]), seen
    assert seen[1] == [], seen  # every row drawn: as before


def test_3_a_carriage_return_in_a_run_name_makes_no_heading(tmp_path):
    bad = _run(tmp_path, "dp-fedavg", 0.5, math.nan, name="a\r## Fake heading")
    fine = _run(tmp_path, "fedavg", 0.0, 0.85)
    text = write_report(tmp_path / "out", [bad, fine], title="t", metric="eval_loss").read_text(
        encoding="utf-8"
    )
    assert "\r" not in text and "a\\r## Fake heading" in text, text
    assert not [line for line in text.splitlines() if line.startswith("## Fake")], text
    assert table_cell("p(y|x)\nz") == "p(y\\|x) z"  # as before


@pytest.fixture(scope="module")
def one_round(tmp_path_factory):
    """A finished 1-round seeded dp-fedavg run (σ 0.5, RDP, secure = false)."""
    run = tmp_path_factory.mktemp("r46") / "r"
    return simulate(small_config(**{"num-server-rounds": 1}), run).out_dir


def _edited(one_round, tmp_path, pattern: str, line: str) -> Path:
    run = tmp_path / "r"
    shutil.copytree(one_round, run)
    config = (run / "config.toml").read_text(encoding="utf-8")
    edited = re.sub(pattern, line, config)
    assert edited != config
    (run / "config.toml").write_text(edited, encoding="utf-8")
    return run


def test_4_a_config_toml_edited_after_the_run_is_not_what_is_reported(one_round, tmp_path):
    run = _edited(one_round, tmp_path, r"(?m)^noise-multiplier = .*$", "noise-multiplier = 5.0")
    config = (run / "config.toml").read_text(encoding="utf-8")
    edited = re.sub(r"(?m)^accountant = .*$", 'accountant = "pld"', config)
    assert edited != config
    (run / "config.toml").write_text(edited, encoding="utf-8")
    loaded = load_run(run)
    assert loaded.noise_multiplier == 0.5, loaded.noise_multiplier
    assert loaded.summary["config"]["accountant"] == "rdp"
    assert any("config.toml disagrees with its privacy_ledger.jsonl" in w
               for w in loaded.warnings), loaded.warnings  # fmt: skip
    assert not any("reported as configured" in w for w in loaded.warnings), loaded.warnings


def test_5_a_seeded_run_edited_to_secure_is_reported_as_seeded(one_round, tmp_path):
    run = _edited(one_round, tmp_path, r"(?m)^secure = false$", "secure = true")
    loaded = load_run(run)
    assert loaded.summary["config"]["secure"] is False
    assert any("(secure; secure: True in config.toml, False in the ledger)" in w
               for w in loaded.warnings), loaded.warnings  # fmt: skip
    with pytest.warns(UserWarning):
        text = write_report(tmp_path / "out", load_runs(run), title="t").read_text("utf-8")
    assert "- secure: false" in text and "- seeded runs: 1 of the 1 private runs" in text, text
