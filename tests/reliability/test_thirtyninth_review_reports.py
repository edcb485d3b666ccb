"""Issue 15, thirty-ninth hostile review (reports: compare, tune, compare-tuned, reports): tests.

1. ``tune toy.toml --grid server-learning-rate=0.5,1 --rounds 2 --seed 3 --set accountant=pld``
   then ``compare-tuned T --untuned C`` of ``compare toy.toml --strategies dp-fedavg --rounds 2
   --set accountant=pld`` (also ``compare --tune-grid`` with ``accountant = "pld"``). Before:
   ``summary.csv``'s ``accountant`` column said ``pld`` for the tuned row, whose ε 13.86 is the
   tuning's RDP bound (``RepeatAndSelectDpEvent``), beside the untuned row's PLD 8.961, and no
   note said their ε came from different accountants; a PLD tuning beside an RDP untuned run was
   noted as "pld" against "rdp", the wrong way round. Now a tuned run carries the accountant its
   ε is of (``tune_report.load_tuned``: ``epsilon_accountant`` ``rdp``), which
   ``rundata_aggregate._bases`` reads before the run's configured one: the tuned row says
   ``rdp`` and the rows' ε are noted as from different accountants.
2. ``write_report(out, load_runs(F))`` of a finished dp-fedavg run whose ``config.toml`` was
   deleted and whose ``summary.json`` states ``delta`` 0 (also ``0.0``, ``-1e-4``, ``1``,
   ``"0.0001"``, ``null``). Before: ε 10.28 (composed at its ledger's δ 1e-4) shown beside δ
   ``0`` (the Summary, "- δ: 0", summary.csv): a claim of pure DP, without a warning; ``-1e-4``,
   ``1`` and ``n/a`` alike. Now ``rundata.load_run`` reports the δ the ε is composed at (the
   ledger's, or without one the newest checkpoint's configuration), noting the summary's value;
   a private run with neither, whose summary's δ is no number in (0, 1), is refused naming
   ``summary.json``.
3. ``write_report(out, load_runs(F))`` of a finished dp-fedavg run whose ``summary.json`` was
   edited to ``"epsilon": Infinity`` (its ledger and rows 10.28; the largest ε its files state is
   reported, with a warning). Before: the Summary said ``∞ (non-private)`` and both plots drew
   the private run as a non-private baseline (dashed line, legend ``dp-fedavg (non-private)``).
   Now a row is non-private only when none of its runs is configured private
   (``rundata_aggregate``'s ``private``): ``∞ (private: its files state an unbounded epsilon)``,
   the legend ``dp-fedavg, σ=0.5``, no baseline line.
4. ``write_report(out, load_runs(F))`` of a dp-fedavg run at σ 0.5 (seed 0, ``rdp``) whose
   ``config.toml`` was deleted and whose ``summary.json`` states ``noise_multiplier`` 5, seed
   3 and ``config.accountant`` ``pld``. Before: reported as "σ 5, seed 3", its ledger's ε 10.28
   labelled ``pld``, without a warning. Now a run without a readable ``config.toml`` takes its
   strategy, σ, seed and settings from its privacy ledger's header
   (``rundata_summary.recorded_summary``),
   noting that its summary disagrees; δ stays the summary's (thirty-seventh review, finding 4).
"""

from __future__ import annotations

import csv
import json
import shutil
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedprivopt.simulation.report import aggregate_runs, write_summary_csv
from fedprivopt.simulation.rundata import RunData, load_run
from fedprivopt.simulation.tune_report import load_tuned


def _run(path: Path, accountant: str, epsilon: float, accuracy: float) -> RunData:
    """A finished 2-round dp-fedavg run at σ 0.5 whose configuration names ``accountant``."""
    config = {"strategy": "dp-fedavg", "noise-multiplier": 0.5, "sampling": "poisson",
              "accountant": accountant, "delta": 1e-4, "seed": 0}  # fmt: skip
    summary = {"strategy": "dp-fedavg", "noise_multiplier": 0.5, "seed": 0, "epsilon": epsilon,
               "delta": 1e-4, "rounds_completed": 2, "config": config}  # fmt: skip
    rows = [{"round": r, "eval_accuracy": accuracy, "eval_loss": 0.9} for r in (1, 2)]
    return RunData(summary, rows, path, ledger_epsilon=epsilon)


def _rows(runs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = aggregate_runs(runs)
    return {r["strategy"]: r for r in rows}, [str(w.message) for w in caught]


def test_a_tuned_row_names_the_accountant_of_its_tuning_epsilon(tmp_path):
    trial = _run(tmp_path / "T" / "runs" / "trial-001", "pld", 8.961, 0.6267)
    tuned = load_tuned(tmp_path / "T", SimpleNamespace(run=trial, epsilon=13.86))
    untuned = _run(tmp_path / "C" / "runs" / "dp-fedavg__sigma0.5__seed0", "pld", 8.961, 0.6133)
    rows, notes = _rows([tuned, untuned])
    assert rows["dp-fedavg (tuned)"]["accountants"] == ["rdp"]  # RepeatAndSelectDpEvent, RDP
    assert rows["dp-fedavg"]["accountants"] == ["pld"]
    assert any("different accountants" in n and "rdp: dp-fedavg (tuned)" in n for n in notes)
    write_summary_csv(list(rows.values()), tmp_path / "summary.csv")
    with (tmp_path / "summary.csv").open(encoding="utf-8") as fh:
        by = {line["strategy"]: line["accountant"] for line in csv.DictReader(fh)}
    assert by == {"dp-fedavg (tuned)": "rdp", "dp-fedavg": "pld"}
    # a PLD tuning beside an RDP run: both epsilons are RDP bounds, no note claims otherwise
    rdp_run = _run(tmp_path / "C" / "runs" / "x", "rdp", 10.28, 0.6133)
    rows, notes = _rows([tuned, rdp_run])
    assert rows["dp-fedavg (tuned)"]["accountants"] == rows["dp-fedavg"]["accountants"] == ["rdp"]
    assert not any("different accountants" in n for n in notes)
    assert trial.summary["config"]["accountant"] == "pld"  # the run's own record is unchanged


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 1-round toy run (dp-fedavg, σ 0.5, δ 1e-4)."""
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import simulate

    root = Path(__file__).resolve().parents[2]
    config = load_config(root / "simulations" / "toy.toml", {"num-server-rounds": 1})
    out = tmp_path_factory.mktemp("r39reports") / "run"
    simulate(config, out)
    return out


@pytest.mark.parametrize("stated", [0, 0.0, -1e-4, 1, "0.0001", None])
def test_a_summary_delta_that_is_no_delta_is_not_shown_beside_the_ledger_epsilon(
    finished_run, tmp_path, stated
):
    run_dir = tmp_path / "r"
    shutil.copytree(finished_run, run_dir)
    (run_dir / "config.toml").unlink()
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    summary["delta"] = stated
    (run_dir / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    run = load_run(run_dir)
    assert run.delta == 1e-4  # the delta the ledger's epsilon is composed at
    assert run.epsilon == pytest.approx(7.5508, rel=1e-4)
    assert any("summary.json states delta" in w and "0.0001" in w for w in run.warnings)
    # without a ledger: the newest checkpoint's accountant, at its configuration's delta
    (run_dir / "privacy_ledger.jsonl").unlink()
    run = load_run(run_dir)
    assert run.delta == 1e-4 and run.epsilon == pytest.approx(7.5508, rel=1e-4)
    # with neither, the epsilon the files state has no delta to stand beside: refused
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        (run_dir / name).unlink(missing_ok=True)
    with pytest.raises(ValueError, match=r"summary\.json.*delta"):
        load_run(run_dir)


def test_a_private_run_whose_files_state_an_infinite_epsilon_is_not_shown_non_private(tmp_path):
    from fedprivopt.simulation.report import write_report
    from fedprivopt.simulation.report_plots import _label

    run = _run(tmp_path / "F" / "r0", "rdp", float("inf"), 0.6133)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows, _ = _rows([run])
        text = write_report(tmp_path / "out", [run], title="t").read_text(encoding="utf-8")
    assert rows["dp-fedavg"]["private"] is True
    assert "non-private" not in text.split("## Plots")[0]
    assert "∞ (private" in text
    assert _label("dp-fedavg", 0.5, float("inf"), private=True) == "dp-fedavg, σ=0.5"
    assert _label("fedavg", 0.0, float("inf")) == "fedavg (non-private)"


def test_a_run_without_its_config_is_reported_as_its_ledger_records(finished_run, tmp_path):
    run_dir = tmp_path / "r"
    shutil.copytree(finished_run, run_dir)
    (run_dir / "config.toml").unlink()
    plain = load_run(run_dir)  # the files as the run wrote them: nothing to note
    assert (plain.noise_multiplier, plain.seed) == (0.5, 0) and not plain.warnings
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    summary.update(noise_multiplier=5.0, seed=3)
    summary["config"].update({"accountant": "pld", "noise-multiplier": 5.0, "seed": 3})
    (run_dir / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    run = load_run(run_dir)
    assert (run.strategy, run.noise_multiplier, run.seed) == ("dp-fedavg", 0.5, 0)
    assert run.summary["config"]["accountant"] == "rdp"
    assert any("disagrees with its privacy_ledger.jsonl" in w for w in run.warnings)
    rows, _ = _rows([run])
    assert rows["dp-fedavg"]["accountants"] == ["rdp"]
    assert rows["dp-fedavg"]["noise_multiplier"] == 0.5
