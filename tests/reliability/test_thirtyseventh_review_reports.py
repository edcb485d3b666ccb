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
2. Seeds of one row that evaluated different rounds: ``write_report(out, load_runs(F))`` of
   two 4-round dp-fedavg runs, seed 0 with ``eval-every`` 1 and seed 1 with 4 (also
   ``compare-tuned T1 T2`` of two tunings made with different ``--set eval-every``; the key is
   how a run is recorded, so the row's runs are not noted as differing): ``metric_vs_round.png``
   drew rounds 1-3 as the row's "mean ± 1 std over seeds", seed 0's values alone (a peak of
   0.607 beside the two seeds' 0.560 at round 4), under a legend ``dp-fedavg, σ=0.5``. The
   legend now says ``dp-fedavg, σ=0.5 (some rounds evaluated by fewer seeds)``, as it says
   ``(rounds 1–2: later rounds over fewer seeds)`` for seeds that completed different rounds
   (thirty-third review, results 8).
3. Rows whose ε are of different neighbouring relations: ``compare toy.toml --strategies
   dp-fedavg,dp-fedadam --rounds 2`` with ``sampling = "fixed"`` in the preset's
   ``[strategies.dp-fedadam]``: rc 0, dp-fedadam at ε 35.67 (replace-one neighbours) beside
   dp-fedavg at 10.28 (add/remove ones), the report saying only "added or removed (Poisson
   sampling); or replaced (fixed-size sampling)" and "sampling: varies", not which row is
   which. Now as in finding 1: ``35.67 (replace-one)``, ``10.28 (add/remove)``, a warning, and
   the plot's ε axis.
4. ``write_report(out, load_runs(R))`` of a run whose ``config.toml`` was deleted and whose
   ``summary.json`` states δ 0.5 (the ledger's 1e-4): ε is composed at the δ shown, as
   documented, but the warning said ``its privacy_ledger.jsonl states delta 0.0001, its
   config.toml 0.5``, naming a file the run does not have. It names ``summary.json`` now, the
   file δ came from.
5. ``write_report(out, load_runs(R))`` of a 2-round run whose ``summary.json`` was edited to
   ``rounds_completed`` 1: the Summary said rounds ``1`` beside the final accuracy of round 2
   (reports take the final metrics from ``metrics.jsonl``, whose rows a summary edited alone
   does not change; ``compare`` audits and rewrites such a summary). The rounds are now never
   fewer than the rows' last round: ``2``.
"""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from fedprivopt.simulation.report import (
    aggregate_runs,
    plot_metric_vs_round,
    write_report,
    write_summary_csv,
)
from fedprivopt.simulation.run import simulate
from fedprivopt.simulation.rundata import RunWarning, load_run
from tests.reliability.test_thirtythird_review_results import _drawn_labels
from tests.simulation.test_run import small_config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """2-round runs: dp-fedavg seeds 0, 1 (eval-every 1, 2); dp-fedadam under pld (σ 2), fixed."""
    root = tmp_path_factory.mktemp("runs")
    two = {"num-server-rounds": 2}
    simulate(small_config(**two), root / "rdp")
    simulate(small_config(**two, seed=1, **{"eval-every": 2}), root / "sparse")
    pld = {"strategy": "dp-fedadam", "accountant": "pld", "noise-multiplier": 2.0}  # σ 2: fast
    simulate(small_config(**two, **pld), root / "pld")
    simulate(small_config(**two, strategy="dp-fedadam", sampling="fixed"), root / "fixed")
    return {name: load_run(root / name) for name in ("rdp", "sparse", "pld", "fixed")}


# -- 1: rows of different accountants -------------------------------------------------------------
def test_1_rows_of_different_accountants_say_their_epsilons_are_not_comparable(runs, tmp_path):
    runs = [runs["rdp"], runs["pld"]]
    with pytest.warns(RunWarning, match="different accountants"):
        report = write_report(tmp_path / "r", runs, title="t")
    text = report.read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if "| 0." in line}
    assert " (pld) |" in rows["dp-fedadam"] and " (rdp) |" in rows["dp-fedavg"], text
    assert "different accountants (pld: dp-fedadam σ=" in text
    assert "not comparable" in text.split("## Warnings", 1)[1]


# -- 2: seeds of one row that evaluated different rounds ------------------------------------------
def test_2_metric_by_round_names_rounds_evaluated_by_fewer_seeds(runs, tmp_path, monkeypatch):
    drawn = _drawn_labels(
        monkeypatch, lambda: plot_metric_vs_round([runs["rdp"], runs["sparse"]], tmp_path / "m.png")
    )
    assert drawn == ["dp-fedavg, σ=0.5 (some rounds evaluated by fewer seeds)"]
    drawn = _drawn_labels(  # seeds that evaluated the same rounds: as before
        monkeypatch, lambda: plot_metric_vs_round([runs["rdp"]], tmp_path / "one.png")
    )
    assert drawn == ["dp-fedavg, σ=0.5"]


# -- 3: rows of different neighbouring relations --------------------------------------------------
def test_3_rows_of_different_neighbouring_relations_say_so(runs, tmp_path, monkeypatch):
    def write():
        with pytest.warns(RunWarning, match="different neighbouring relations"):
            return write_report(tmp_path / "r", [runs["rdp"], runs["fixed"]], title="t")

    drawn = []
    from fedprivopt.simulation import report_plots

    finish = report_plots._finish
    monkeypatch.setattr(report_plots, "_finish", lambda fig, ax, path, n: drawn.append(
        ax.get_xlabel()) or finish(fig, ax, path, n))  # fmt: skip
    text = write().read_text(encoding="utf-8")
    assert " (add/remove) | 0.0001 |" in text and " (replace-one) | 0.0001 |" in text, text
    assert "neighbouring relations differ between runs, not comparable" in drawn[-1]


# -- 4: the δ note names the file δ came from -----------------------------------------------------
def test_4_the_delta_note_names_summary_json_when_there_is_no_config_toml(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["rdp"].path, run)
    (run / "config.toml").unlink()
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    (run / "summary.json").write_text(json.dumps({**summary, "delta": 0.5}), encoding="utf-8")
    note = load_run(run).warnings[0]
    assert note.endswith("states delta 0.0001, its summary.json 0.5; epsilon is composed at 0.5")


# -- 5: rounds never fewer than the rows show -----------------------------------------------------
def test_5_rounds_are_never_fewer_than_the_rows_show(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["rdp"].path, run)
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    (run / "summary.json").write_text(json.dumps({**summary, "rounds_completed": 1}), "utf-8")
    assert load_run(run).rounds_completed == 2


# -- 6 (the open row, fixed by the lead, lead 5): summary.csv says what each row's ε is of -------
def test_6_summary_csv_names_each_rows_accountant_and_neighbouring_relation(runs, tmp_path):
    picked = [runs["rdp"], runs["pld"], runs["fixed"]]
    with pytest.warns(RunWarning):  # the accountants and relations differ (findings 1 and 3)
        rows = aggregate_runs(picked)
    path = write_summary_csv(rows, tmp_path / "summary.csv")
    with path.open(newline="", encoding="utf-8") as fh:
        table = list(csv.DictReader(fh))
    basis = {(t["strategy"], t["accountant"], t["neighbouring_relation"]) for t in table}
    assert basis == {("dp-fedavg", "rdp", "add/remove"), ("dp-fedadam", "pld", "add/remove"),
                     ("dp-fedadam", "rdp", "replace-one")}, table  # fmt: skip
