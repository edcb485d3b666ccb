"""Issue 15, forty-fifth hostile review (contract: the privacy contract, measured): tests.

1. ``deploy local --nodes 2 toy.toml --rounds 2`` (also the Flower engine of ``simulate``).
   Before: ``summary.json``'s ``not_covered`` named the round metrics of ``metrics.jsonl``
   and TensorBoard only, while the run's ``deploy/serverapp.log`` logs every round's cohort
   size (``round 1: epsilon=7.551 cohort=9``) and its ``superlink.log`` and
   ``supernode-N.log`` which nodes were sent each round's training (with a node per user,
   the sampled users themselves). Now ``not_covered`` of a Flower-engine run names those
   logs (``summary_privacy.not_covered``); fast-engine runs unchanged.
2. ``write_report(out, load_runs(A) + load_runs(B))`` of two ``stackoverflow-tp-mini`` runs on
   copies of its dataset that differ in one example of user 399, whom neither run sampled (its
   count 26 to 25; the forty-fourth review's contract 1 pair; also ``compare`` with
   ``strategies.fedavg.task-params.data-dir`` another copy). Before: the warning on the runs'
   task settings, in ``report.md`` and on standard error, named each run's data as
   ``"sha256:<12 hex>"``, the first 48 bits of a SHA-256 of the data record its ledger's
   header holds (``users_sha256``, ``sqlite_bytes``): with the other users' data known, trying
   counts 0, 1, ... against them gave user 399's count (25) in 26 tries, from the report,
   which ``not_covered`` does not say is secret. Now ``report._task_differences`` numbers each
   distinct data record and names the first run that holds it (``"data 1, as in A/dp"``: two
   comparisons' runs share their names), no digest.
3. ``compare toy.toml --strategies dp-fedavg,dp-fedadam,fedavg --rounds 1`` (three rows on the
   same 40 users; also ``write_report`` of such runs and ``compare-tuned``). Before: the
   report gave each row at its own run's ε (7.551, 7.551, ∞) and nothing said that
   publishing the report, ``summary.csv`` or the plots releases every row's run, whose
   composition is 10.28 (dp-accounting), nor that its non-private row releases its users'
   data without noise (ε ∞ for the whole report); the forty-fourth review (contract 5) said
   so of a row's seeds only. Now a "report composed" line under "Privacy parameters" says so
   and gives the composition of the private runs' ledgers
   (``report_markdown._report_composed``, ``rundata_aggregate.seeds_composed_epsilon``).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.report import load_run, write_report
from fedprivopt.simulation.run import simulate
from fedprivopt.simulation.rundata import RunData
from fedprivopt.simulation.summary_privacy import not_covered

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
_TASK = {"task": "stackoverflow-tp", "task-params": {"data-dir": "/d", "num-users": 40}}


def _fabricated(path: Path, strategy: str, data: dict) -> RunData:
    """A finished 1-round run of ``strategy`` whose ledger header records ``data``."""
    path.mkdir(parents=True)
    header = {"ledger": 2, "kind": "header", "round": 0, "events": 0, "private": True,
              "data": data}  # fmt: skip
    (path / "privacy_ledger.jsonl").write_text(json.dumps(header) + "\n", encoding="utf-8")
    config = {"strategy": strategy, "noise-multiplier": 0.5, "sampling": "poisson",
              "accountant": "rdp", "delta": 1e-4, "seed": 0, **_TASK}  # fmt: skip
    summary = {"strategy": strategy, "noise_multiplier": 0.5, "seed": 0, "epsilon": 7.55,
               "delta": 1e-4, "rounds_completed": 1, "config": config}  # fmt: skip
    rows = [{"round": r, "eval_accuracy": 0.5, "eval_loss": 0.9} for r in (0, 1)]
    return RunData(summary, rows, path, ledger_epsilon=7.55)


def test_1_not_covered_of_a_flower_run_names_its_logs() -> None:
    task = ToyClassificationTask(num_users=40, seed=0)
    flower = not_covered(load_config(TOY, {"engine": "flower"}), task)
    assert "deploy/serverapp.log" in flower and "cohort=" in flower
    assert "superlink.log" in flower and "supernode-N.log" in flower
    assert flower.endswith("so publish the models, epsilon and evaluations, not these rows")
    fast = not_covered(load_config(TOY, {}), task)
    assert "serverapp.log" not in fast


def test_2_a_report_of_runs_on_other_data_shows_no_digest_of_it(tmp_path: Path) -> None:
    a = {"sqlite_bytes": 987136, "users_sha256": "83df" * 16}
    b = {"sqlite_bytes": 987136, "users_sha256": "1a2b" * 16}
    runs = [_fabricated(tmp_path / "A" / "dp", "dp-fedavg", a),  # one name: two comparisons
            _fabricated(tmp_path / "B" / "dp", "dp-fedadam", b)]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = write_report(tmp_path / "out", runs, title="t").read_text("utf-8")
    notes = [str(w.message) for w in caught]
    note = [n for n in notes if "data (as each run's privacy ledger records it)" in n]
    assert note and note[0] in text and "not over the same data" in note[0], notes
    assert "data 1, as in A/dp" in note[0] and "data 2, as in B/dp" in note[0]
    for record in (a, b):
        whole = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
        for shown in [text, *notes]:
            assert whole[:8] not in shown and record["users_sha256"][:8] not in shown


def test_3_a_report_of_several_rows_states_their_composition(tmp_path: Path) -> None:
    import dp_accounting as dpa

    runs = []
    for strategy in ("dp-fedavg", "dp-fedadam", "fedavg"):
        config = load_config(TOY, {"num-server-rounds": 1, "strategy": strategy})
        simulate(config, tmp_path / strategy, task=ToyClassificationTask(num_users=40, seed=0))
        runs.append(load_run(tmp_path / strategy))
    accountant = dpa.rdp.RdpAccountant()
    accountant.compose(dpa.PoissonSampledDpEvent(0.25, dpa.GaussianDpEvent(0.5)), 2)
    both = accountant.get_epsilon(1e-4)  # 10.28, where each private row's is 7.551
    text = write_report(tmp_path / "all", runs, title="t").read_text("utf-8")
    (line,) = [x for x in text.splitlines() if x.startswith("- report composed: ")]
    assert "2 private runs: ε 10.28" in line and round(both, 2) == 10.28
    assert "1 non-private run" in line and "ε = ∞" in line
    text = write_report(tmp_path / "one", runs[:1], title="t").read_text("utf-8")
    assert "- report composed: " not in text
