"""Issue 15, twenty-ninth hostile review, the ledger: regression tests of its findings.

1. A checkpoint whose model parameters were edited, its digest recomputed with the project's
   own ``state_digest``, was resumed (seeded and secure mode): nothing compared the model with
   the digest the ledger's line of its round records. The rounds it redid were new releases.
   Now ``--resume`` refuses it (exit 2, one line naming the checkpoint, the round and the
   ledger's line). Both engines' unedited checkpoints pass the check (their resumes in
   ``tests/reliability/test_signals.py``).
2. A seeded tree run (``noise-mechanism = tree``) whose replayed round, inside a restart
   period, came out other than its first release (another engine's summation order, GPU
   nondeterminism, or finding 1's edit): the redo was appended to the ledger with no event and
   the log said "both are charged". The period's event covers one release of each of its
   rounds; the redone rest of the period is one more, now charged a period's event.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.simulation.checkpoint import state_digest
from fedprivopt.simulation.files import CHECKPOINT, LEDGER_FILE, PREVIOUS_CHECKPOINT, read_rows
from fedprivopt.simulation.run import resume, simulate
from tests.reliability.test_ledger import _ledger_epsilon, differing_replays
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


# -- 2: a tree round that differs from its first release -------------------------------------------
def test_2_a_tree_round_redone_differently_inside_its_period_is_charged(tmp_path, monkeypatch):
    config = small_config(**{**TREE, "num-server-rounds": 6})
    ref = simulate(config, tmp_path / "ref")
    killed = tmp_path / "killed"
    _as_killed(ref.out_dir, killed, 5)
    changed = differing_replays(monkeypatch)
    outcome = resume(killed)
    assert changed == [4]
    lines = read_rows(killed / LEDGER_FILE)[1:]
    assert [line["round"] for line in lines] == [1, 2, 3, 4, 5, 4, 5, 6]
    period_event = lines[0]["released"]
    assert lines[5]["released"] == period_event  # round 4 redone: a period's event
    assert lines[6]["released"] == []  # round 5 redone: covered by the redo's event
    assert lines[7]["released"] == period_event  # round 6 starts the next period
    assert outcome.epsilon > ref.epsilon
    assert outcome.epsilon == _ledger_epsilon(killed, 1e-4)
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["epsilon"] == outcome.epsilon


def test_2_a_tree_replay_identical_to_its_first_release_is_not_charged_again(tmp_path):
    config = small_config(**{**TREE, "num-server-rounds": 6})
    ref = simulate(config, tmp_path / "ref")
    killed = tmp_path / "killed"
    _as_killed(ref.out_dir, killed, 5)
    outcome = resume(killed)
    assert outcome.epsilon == ref.epsilon
    assert [line["round"] for line in read_rows(killed / LEDGER_FILE)[1:]] == [1, 2, 3, 4, 5, 6]
