"""Issue 15, twenty-ninth hostile review, the ledger: regression tests of its findings.

1. A checkpoint whose model parameters were edited, its digest recomputed with the project's
   own ``state_digest``, was resumed (seeded and secure mode): nothing compared the model with
   the digest the ledger's line of its round records. The rounds it redid were new releases.
   Now ``--resume`` refuses it (exit 2, one line naming the checkpoint, the round and the
   ledger's line). Both engines' unedited checkpoints pass the check (their resumes in
   ``tests/reliability/test_signals.py``).
2. A seeded run's round redone from a checkpoint that came out other than its first release
   (a Flower client that failed in one of the two, another device, edited code; made to differ
   in the test) was released and charged as a second release: the log said "both are
   charged". It drew the same cohort and noise as the first (the seed's), so the two released
   models reveal their difference without noise, which no charge covers (found by the privacy
   area of this review at the Python API: the difference times m̄ was the dropped user's
   clipped update). Under tree aggregation, inside a restart period, it was not even charged.
   Now ``--resume`` stops before anything of that round is released or written (exit 2, one
   line naming the round and the ledger's line); the run stays resumable.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.simulation.checkpoint import state_digest
from fedprivopt.simulation.files import CHECKPOINT, LEDGER_FILE, PREVIOUS_CHECKPOINT, read_rows
from fedprivopt.simulation.run import resume, simulate
from tests.reliability.test_ledger import _ledger_epsilon, differing_replays, kept_files
from tests.simulation.test_run import small_config

TREE = {
    "noise-mechanism": "tree",
    "tree-restart-rounds": 5,
    "checkpoint-every": 3,
    "population": 40,
    "task-params.num-users": 40,
    "clients-per-round": 5,
}


def _as_killed(ref: Path, killed: Path, ledger_rounds: int) -> None:
    """``ref`` as SIGKILLed after round ``ledger_rounds`` was released (checkpoint of round 3)."""
    shutil.copytree(ref, killed)
    (killed / CHECKPOINT).unlink()
    (killed / PREVIOUS_CHECKPOINT).rename(killed / CHECKPOINT)
    (killed / "summary.json").unlink()
    lines = (killed / LEDGER_FILE).read_text().splitlines(keepends=True)
    (killed / LEDGER_FILE).write_text("".join(lines[: 1 + ledger_rounds]))
    rows = (killed / "metrics.jsonl").read_text().splitlines(keepends=True)
    (killed / "metrics.jsonl").write_text("".join(rows[:ledger_rounds]))


# -- 1: a checkpoint's model edited, its digest recomputed -----------------------------------------
@pytest.mark.parametrize("extra", [{}, TREE, {"secure": True}], ids=["gaussian", "tree", "secure"])
def test_1_a_checkpoint_whose_model_was_edited_is_refused_naming_it(tmp_path, capsys, extra):
    config = small_config(**{"checkpoint-every": 3, **extra})
    out = simulate(config, tmp_path / "run").out_dir
    (out / CHECKPOINT).unlink()  # resume from round 3's checkpoint
    state = torch.load(out / PREVIOUS_CHECKPOINT, map_location="cpu", weights_only=True)
    state["algorithm"]["params"] = state["algorithm"]["params"] + 1e-3
    state["sha256"] = state_digest(state)
    torch.save(state, out / PREVIOUS_CHECKPOINT)
    ledger_before = (out / LEDGER_FILE).read_bytes()
    capsys.readouterr()
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "checkpoint.prev.pt's model is not the one privacy_ledger.jsonl recorded" in err, err
    assert "round 3 (line 4)" in err, err
    assert (out / LEDGER_FILE).read_bytes() == ledger_before


# -- 2: a redone round that differs from its first release -----------------------------------------
@pytest.mark.parametrize("extra", [{}, TREE], ids=["gaussian", "tree"])
def test_2_a_redone_round_unlike_its_first_release_is_not_released(
    tmp_path, capsys, monkeypatch, extra
):
    config = small_config(**{"checkpoint-every": 3, **extra, "num-server-rounds": 6})
    ref = simulate(config, tmp_path / "ref")
    killed = tmp_path / "killed"
    _as_killed(ref.out_dir, killed, 5)
    files = kept_files(killed)
    with monkeypatch.context() as patch:
        changed = differing_replays(patch)
        capsys.readouterr()
        assert main(["simulate", "--resume", str(killed), "--quiet"]) == 2
    assert changed == [4]
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "round 4, redone from the checkpoint, came out other than its first release" in err
    assert "(line 5 of privacy_ledger.jsonl)" in err and "nothing of it was released" in err
    assert kept_files(killed) == files  # the rows are cut back to the checkpoint
    assert max(row["round"] for row in read_rows(killed / "metrics.jsonl")) < 4
    outcome = resume(killed)  # resumable: the replay as it was is identical, not charged again
    assert torch.equal(outcome.params, ref.params)
    assert outcome.epsilon == ref.epsilon == _ledger_epsilon(killed, 1e-4)
    assert [line["round"] for line in read_rows(killed / LEDGER_FILE)[1:]] == [1, 2, 3, 4, 5, 6]
