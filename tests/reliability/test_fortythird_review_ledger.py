"""Issue 15, forty-third hostile review (ledger: the ledger, checkpoints, resume and every other
reader of a run's files): tests.

1. ``write_report(out, load_runs(R))`` (``load_run``) of a secure toy run of 2 rounds (summary
   and rows at epsilon 10.28, its checkpoint of round 2) whose ``privacy_ledger.jsonl`` is an
   earlier version's (event counts only) counting 3 events: what a resume of that version
   killed after round 3's line leaves. Before: ``rundata_epsilon.accounted_epsilon`` dropped
   the old ledger and composed the checkpoint's accountant alone: epsilon 10.28, with the note
   ``no privacy_ledger.jsonl``, where ``--resume`` converts the same ledger charging the 3
   events (12.17). Now the events it counts beyond the checkpoint are charged, each as the
   costliest of the accountant's events (``checkpoint_epsilon_header(..., old)``), and the
   note says the ledger is an earlier version's.
2. ``simulate(config, R, overwrite=True)`` (``compare --overwrite`` alike) over a run whose
   earlier version's ledger a resume had converted, leaving ``privacy_ledger.jsonl.v1`` (5
   events). Before: ``rundir.remove_run_files`` removed every other run file but kept it: the
   new 1-round run's directory held a ledger of releases it never made (nothing removes it
   later). Now it goes with the run's other files, before the ledger and ``config.toml``.
3. ``write_report(out, load_runs(R))`` (``load_run``) of a finished secure run whose
   ``privacy_ledger.jsonl``, ``checkpoint.pt`` and ``checkpoint.prev.pt`` were deleted and whose
   rows' and summary's epsilon were divided by 100 (a 6-round toy run: 16.29 to 0.163). Before:
   reported at 0.163 with no note (the rows' digest noted only when ``summary.json`` keeps
   one); ``compare``, ``compare-tuned --untuned`` and ``--resume`` refuse such a run (rounds
   released, no ledger, no checkpoint). Now ``accounted_epsilon`` notes that
   nothing of the run confirms the epsilon its files state.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from fedprivopt.privacy.accounting import PrivacyAccountant
from fedprivopt.privacy.accounting_state import merge_ledger
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import simulate
from fedprivopt.simulation.rundata import load_run

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


@pytest.fixture(scope="module")
def secure_two_rounds(tmp_path_factory):
    """A finished secure toy run of 2 rounds (checkpoint of round 2)."""
    out = tmp_path_factory.mktemp("r43ledger") / "run"
    config = load_config(TOY, {"num-server-rounds": 2, "secure": True, "population": 12,
                               "task-params.num-users": 12, "clients-per-round": 4})  # fmt: skip
    simulate(config, out)
    return out


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_old_ledger_counting_beyond_the_checkpoint_is_charged_by_load_run(
    secure_two_rounds, tmp_path
):
    run = _copy(secure_two_rounds, tmp_path / "old")
    stated = json.loads((run / "summary.json").read_text())["epsilon"]
    lines = [{"round": r, "events": r} for r in range(4)]  # an earlier version's counts: 3
    (run / "privacy_ledger.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    accountant = PrivacyAccountant()
    accountant.load_state_dict(state["algorithm"]["accountant"])
    assert accountant.num_events == 2
    event = accountant.ledger[-1][0]
    accountant.set_ledger(merge_ledger([*accountant.ledger, (event, 1)]))
    spent = accountant.epsilon(1e-4)
    assert spent > stated * 1.05
    loaded = load_run(run)
    assert math.isclose(loaded.epsilon, spent, rel_tol=1e-9)
    assert any("an earlier version's" in note for note in loaded.warnings)
    assert not any("no privacy_ledger.jsonl" in note for note in loaded.warnings)


def test_old_ledger_within_the_checkpoint_is_reported_as_before(secure_two_rounds, tmp_path):
    run = _copy(secure_two_rounds, tmp_path / "old")
    stated = json.loads((run / "summary.json").read_text())["epsilon"]
    lines = [{"round": r, "events": r} for r in range(3)]
    (run / "privacy_ledger.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert math.isclose(load_run(run).epsilon, stated, rel_tol=1e-9)


def test_overwrite_removes_the_old_ledger_set_aside(secure_two_rounds, tmp_path):
    run = _copy(secure_two_rounds, tmp_path / "converted")
    aside = run / "privacy_ledger.jsonl.v1"  # what a resume converting an old ledger leaves
    aside.write_text("".join(json.dumps({"round": r, "events": r}) + "\n" for r in range(6)))
    config = load_config(TOY, {"num-server-rounds": 1, "population": 12,
                               "task-params.num-users": 12, "clients-per-round": 4})  # fmt: skip
    simulate(config, run, overwrite=True)
    assert not aside.exists()
    assert json.loads((run / "summary.json").read_text())["rounds_completed"] == 1


def test_a_run_without_ledger_or_checkpoint_is_reported_with_a_note(secure_two_rounds, tmp_path):
    run = _copy(secure_two_rounds, tmp_path / "bare")
    for name in ("privacy_ledger.jsonl", "checkpoint.pt", "checkpoint.prev.pt"):
        (run / name).unlink(missing_ok=True)
    summary = json.loads((run / "summary.json").read_text())
    summary["epsilon"] /= 100
    (run / "summary.json").write_text(json.dumps(summary))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row["epsilon"] /= 100
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    loaded = load_run(run)
    assert math.isclose(loaded.epsilon, summary["epsilon"])
    assert any("no privacy_ledger.jsonl and no readable checkpoint" in n for n in loaded.warnings)
