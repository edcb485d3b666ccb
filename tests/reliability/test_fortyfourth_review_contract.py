"""Issue 15, forty-fourth hostile review (contract: the privacy contract, measured): tests.

1. ``simulate stackoverflow-tp-mini.toml --rounds 2`` twice, on copies of its dataset that
   differ in one example of one user neither run sampled (user 399: one example deleted, its
   ``client_metadata`` count 26 to 25). The models are bit-identical, but the privacy ledger's
   header and every checkpoint (``ledger_header``) record the task's data identity (``data``:
   the SQLite file's size and ``users_sha256``, a SHA-256 of the users' ids and of every
   user's example count in every split), and those differ: trying counts 0, 1, ... against
   ``users_sha256`` with the other users' counts known gives user 399's count (25) in 26
   tries. Before: ``summary.json``'s ``not_covered`` named the round metrics and the
   evaluations only and said to publish "the models", where ``checkpoint.pt``, the file that
   carries the model, carries the digest too. Now ``not_covered`` says that the ledger's
   header and every checkpoint record the data identity, outside epsilon, and to publish the
   model's parameters, not those files (``writer._not_covered``); a task without a data
   identity (the toy task) has no such clause.
2. ``simulate toy.toml --set noise-mechanism=tree --set secure=true --rounds 3 --set
   server-learning-rate=1`` (dp-fedavg, no momentum). Round 3's release carries the noise of
   tree node (0, 2), which ``checkpoint.pt`` holds to continue the period
   (``algorithm.tree.noise.nodes``): m times the difference of ``checkpoint.pt``'s and
   ``checkpoint.prev.pt``'s models, minus that node, is round 3's exact clipped sum (to
   1.6e-7, where the release is 1.48 away), in secure mode, where no seed regenerates the
   noise. Before: nothing said so (``not_covered``: "publish the models, epsilon and
   evaluations"). Now ``not_covered`` of a tree run says that every checkpoint holds the
   tree's live nodes, the noise of the period's releases, and to publish the model's
   parameters, not the checkpoint files (``writer._not_covered``); Gaussian runs unchanged.
3. ``tune toy.toml --strategy adadps --set side-information.kind=public-users --set
   side-information.users=4 --set sampling=fixed --grid server-learning-rate=0.5,1
   --mean-trials 1 --rounds 1``. The released trial's ``summary.json`` says that 4 public
   users' data built its side information outside the guarantee (36 private users) and that
   neighbouring datasets differ in one user replaced (fixed-size sampling: the tuning's
   epsilon 24.53, one run's 21.96, are under replace-one), and ``compare``/``compare-tuned``
   reports say both. Before: the tuning's own ``summary.json`` (``privacy``) and
   ``report.md`` said neither ("epsilon covers ... the release of the best trial only (its
   model, hyperparameters and score)"). Now the privacy text names the neighbouring relation
   of the single run's ledger and the released trial's public users
   (``tune_notes.privacy_note``, ``tune_notes.public_users_note``).
4. ``compare stackoverflow-tp-mini.toml --strategies dp-fedavg,fedavg --rounds 1`` (the
   test split: 91 of the 100 evaluation users are training users), ``summary.csv`` read alone
   (``report.md`` links it as "Full-precision numbers"). Before: it gave ``epsilon`` 3.304
   beside ``eval_recall_at_5_mean`` 0.3727 with ``accountant`` and ``neighbouring_relation``
   columns but nothing on the evaluations; only ``report.md``'s "Evaluations:" line (forty-third
   review, contract 1) said epsilon does not cover them. Now its last column,
   ``evaluations_covered``, is ``no`` for such a row (a private run's ``not_covered`` says its
   evaluations are outside epsilon), ``yes`` for runs evaluating users outside the private
   population, empty for a non-private row (``rundata_aggregate._evaluations_covered``,
   ``report.write_summary_csv``). ``tests/simulation/test_report.py``'s header test is edited
   on purpose (the new column).
5. ``compare toy.toml --strategies dp-fedavg --seeds 2 --rounds 1`` (both seeds' runs on the
   same 40 users). Before: the row "dp-fedavg, 0.5, 2 seeds, ε 7.551" published the mean and
   std over both runs (and the plots their mean), which releases both, their composition being
   10.28 (dp-accounting: two rounds), while "Privacy parameters" said only that ε is each
   run's; ``compare-tuned`` says so of tunings (thirty-first review, compare 4). Now
   ``summary.csv`` has ``epsilon_seeds_composed`` (the row's runs' ledgers composed,
   ``rundata_aggregate.seeds_composed_epsilon``) and ``report.md`` a "seeds composed" line
   under "Privacy parameters" naming each such row's composed ε
   (``report_markdown._seeds_composed``).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch

from fedprivopt.cli import main
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.report import load_run, write_report
from fedprivopt.simulation.run import simulate

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


class _WithDataIdentity(ToyClassificationTask):
    """The toy task with a data identity of its files, as the StackOverflow tasks have."""

    def data_identity(self) -> dict:
        return {"sqlite_bytes": 5427200, "users_sha256": "d2c05154db30f07f"}


def test_1_not_covered_names_the_data_identity_of_the_ledger_and_checkpoints(
    tmp_path: Path,
) -> None:
    config = load_config(TOY, {"num-server-rounds": 1})
    simulate(config, tmp_path / "files", task=_WithDataIdentity(num_users=40, seed=0))
    summary = json.loads((tmp_path / "files" / "summary.json").read_text())
    checkpoint = torch.load(tmp_path / "files" / "checkpoint.pt", weights_only=False)
    assert checkpoint["ledger_header"]["data"]["users_sha256"] == "d2c05154db30f07f"
    text = summary["not_covered"]
    assert "data identity" in text and "checkpoint" in text and "privacy_ledger.jsonl" in text
    assert "sqlite_bytes, users_sha256" in text
    simulate(config, tmp_path / "toy", task=ToyClassificationTask(num_users=40, seed=0))
    plain = json.loads((tmp_path / "toy" / "summary.json").read_text())["not_covered"]
    assert "data identity" not in plain and "tree" not in plain
    assert plain.endswith("so publish the models, epsilon and evaluations, not these rows")


def test_2_not_covered_names_the_tree_noise_of_the_checkpoints(tmp_path: Path) -> None:
    config = load_config(TOY, {"num-server-rounds": 1, "noise-mechanism": "tree"})
    simulate(config, tmp_path / "tree", task=ToyClassificationTask(num_users=40, seed=0))
    text = json.loads((tmp_path / "tree" / "summary.json").read_text())["not_covered"]
    assert "every checkpoint of a tree run holds the tree's live nodes" in text
    assert "not checkpoint.pt, checkpoint.prev.pt" in text
    assert "data identity" not in text


def test_3_a_tuning_names_its_neighbouring_relation_and_public_users(tmp_path: Path) -> None:
    out = tmp_path / "tune"
    rc = main([
        "tune", str(TOY), "--strategy", "adadps", "--set", "side-information.kind=public-users",
        "--set", "side-information.users=4", "--set", "sampling=fixed", "--grid",
        "server-learning-rate=0.5,1", "--mean-trials", "1", "--rounds", "1", "--seed", "1",
        "--out", str(out), "--quiet",
    ])  # fmt: skip
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    report = (out / "report.md").read_text()
    for text in (summary["privacy"], report):
        assert "neighbouring datasets differ in one user, replaced (fixed-size sampling)" in text
        assert "4 public users' data built the released trial's side information" in text
        assert "(36 private users)" in text


class _EvaluatesTrainingUsers(ToyClassificationTask):
    """The toy task reporting 3 of its 5 evaluation users as training users (as the test split)."""

    def private_evaluation_users(self) -> tuple[int, int]:
        return 3, 5


def test_4_summary_csv_says_whether_epsilon_covers_the_evaluations(tmp_path: Path) -> None:
    runs = []
    for name, cls, overrides in (
        ("private", _EvaluatesTrainingUsers, {}),
        ("apart", ToyClassificationTask, {"noise-multiplier": 1.0}),
        ("plain", ToyClassificationTask, {"strategy": "fedavg"}),
    ):
        config = load_config(TOY, {"num-server-rounds": 1, **overrides})
        simulate(config, tmp_path / name, task=cls(num_users=40, seed=0))
        runs.append(load_run(tmp_path / name))
    write_report(tmp_path / "report", runs, title="t")
    with (tmp_path / "report" / "summary.csv").open(encoding="utf-8") as fh:
        table = {(r["strategy"], r["noise_multiplier"]): r for r in csv.DictReader(fh)}
    assert table[("dp-fedavg", "0.5")]["evaluations_covered"] == "no"
    assert table[("dp-fedavg", "1.0")]["evaluations_covered"] == "yes"
    assert table[("fedavg", "0.0")]["evaluations_covered"] == ""


def test_5_a_row_over_seeds_states_their_composition(tmp_path: Path) -> None:
    import dp_accounting as dpa

    out = tmp_path / "cmp"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--seeds", "2", "--rounds", "1",
            "--out", str(out), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    accountant = dpa.rdp.RdpAccountant()
    accountant.compose(dpa.PoissonSampledDpEvent(0.25, dpa.GaussianDpEvent(0.5)), 2)
    both = accountant.get_epsilon(1e-4)  # 10.28, where one run's is 7.551
    with (out / "summary.csv").open(encoding="utf-8") as fh:
        (row,) = list(csv.DictReader(fh))
    assert float(row["epsilon"]) < both
    assert float(row["epsilon_seeds_composed"]) >= both * (1 - 1e-12)
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "- seeds composed: " in report and "dp-fedavg σ=0.5, 2 runs: 10.28" in report
