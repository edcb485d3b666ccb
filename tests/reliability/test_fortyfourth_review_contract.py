"""Issue 15, forty-fourth hostile review (contract: the privacy contract, measured): tests.

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
"""

from __future__ import annotations

import json
from pathlib import Path

from fedprivopt.cli import main

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


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
