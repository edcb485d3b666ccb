"""Issue 15, thirty-eighth hostile review, the ledger: regression tests of its findings.

1. A seeded run killed after round 5's ledger line with its newest checkpoint of round 3, the
   ledger's lines of rounds 4 and 5 swapped (their cumulative ``events`` still add up: each
   round released one event), then ``simulate --resume``: the lines after the checkpoint were
   no longer "rounds 4, 5, … in order", so ``RunLedger.restore`` took the run as one whose
   redone rounds are new releases, and nothing compared a redone round with its first
   release. A redo that came out otherwise (a Flower client that failed in one of the two,
   another engine or device; made to differ in the test) was released with the seed's noise
   of its first release, rc 0: the two models' difference is that of the clipped sums
   without noise, which the second charge does not cover (the twenty-ninth review's finding
   2, reached again by one ledger edit that keeps ε growing). The same with a line of round 4
   duplicated (events adjusted). Now a seeded redo of a round is compared with every
   recorded release of that round, in replay order or not (``RunLedger.record``,
   ``record_partial``): unlike any of them, nothing of it is released (exit 2, one line naming
   the round and the ledger's line); like them, it is charged again as before.
2. A seeded ``dp-fedavg-adadp`` run killed as in 1, its ledger's ``partial`` line of round 4
   (the half-step point's release) removed and its event merged into round 4's ``round`` line
   (count 2: what a ledger written before partial lines holds), then ``simulate --resume``
   whose redo of round 4's point came out otherwise: ``record_partial`` took the line as an
   earlier version's and sent the point to the second cohort without comparing it with its
   first release (rc 0). Now a whole-round line of a two-part round after ``partial`` lines is
   refused before anything runs (``LedgerChecks._check_partial_kept``: exit 2, one line naming
   the line); a ledger of the earlier version (no partial line before it) still replays.
3. A finished secure tree run (``tree-restart-rounds = 5``, 2 rounds) whose checkpoint's
   participation ledger had one drawn user exchanged for one the period had not drawn (digest
   recomputed) and whose last ledger line lost its ``participants_sha256`` field, then
   extended and resumed: the line's digest of the participants, which refused the checkpoint
   (fourteenth review), was taken as absent (a line of an earlier version), the counts
   matched the rows, and the secure shuffle cannot be replayed: rc 0, the exchanged user
   free to be drawn again within the period under its one tree event. Now a tree round's line
   that records its model's digest must record its participants' (every writer since the
   fourteenth review does): ``LedgerChecks.check_participants`` refuses it, exit 2, one line
   naming the line.
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
from fedprivopt.simulation.ledger import RunLedger
from fedprivopt.simulation.run import simulate
from tests.reliability.test_ledger import kept_files
from tests.reliability.test_twentyninth_review_ledger import TREE
from tests.simulation.test_run import small_config


def _killed(tmp_path: Path, extra: dict) -> Path:
    """A 6-round run as SIGKILLed after round 5's ledger line (newest checkpoint: round 3)."""
    config = small_config(**{"checkpoint-every": 3, **extra, "num-server-rounds": 6})
    ref = simulate(config, tmp_path / "ref").out_dir
    killed = tmp_path / "killed"
    shutil.copytree(ref, killed)
    (killed / CHECKPOINT).unlink()
    (killed / PREVIOUS_CHECKPOINT).rename(killed / CHECKPOINT)
    (killed / "summary.json").unlink()
    lines = (killed / LEDGER_FILE).read_text().splitlines(keepends=True)
    (killed / LEDGER_FILE).write_text("".join(lines[:6]))
    rows = (killed / "metrics.jsonl").read_text().splitlines(keepends=True)
    (killed / "metrics.jsonl").write_text("".join(rows[:5]))
    return killed


def _swapped(lines: list[str]) -> list[str]:
    """Rounds 4 and 5 swapped (one event each: the cumulative counts still add up)."""
    four, five = json.loads(lines[4]), json.loads(lines[5])
    four["events"], five["events"] = five["events"], four["events"]
    return [*lines[:4], json.dumps(five) + "\n", json.dumps(four) + "\n"]


def _duplicated(lines: list[str]) -> list[str]:
    """Round 4's line twice, the later counts raised by its events."""
    rows = [json.loads(x) for x in lines]
    out = [*rows[:5], dict(rows[4]), *rows[5:]]
    total = 0
    for row in out[1:]:
        total += sum(item["count"] for item in row["released"])
        row["events"] = total
    return [json.dumps(row) + "\n" for row in out]


def _differing(monkeypatch) -> list[int]:
    """Every round after the checkpoint's comes out other than its first release."""
    from fedprivopt.simulation.ledger import RunLedger

    record, changed = RunLedger.record, []

    def differing(self, round_num, events, params, *args, **kwargs):
        if round_num > 3:
            changed.append(round_num)
            params = params + 1e-6
        return record(self, round_num, events, params, *args, **kwargs)

    monkeypatch.setattr(RunLedger, "record", differing)
    return changed


# -- 1: a seeded redo compared with its first release, in replay order or not -------------------
@pytest.mark.parametrize(
    ("extra", "edit"),
    [({}, _swapped), ({}, _duplicated), (TREE, _swapped)],
    ids=["gaussian-swapped", "gaussian-duplicated", "tree-swapped"],
)
def test_1_a_redo_unlike_its_first_release_is_not_released_after_a_reordered_ledger(
    tmp_path, capsys, monkeypatch, extra, edit
):
    killed = _killed(tmp_path, extra)
    path = killed / LEDGER_FILE
    path.write_text("".join(edit(path.read_text().splitlines(keepends=True))))
    files = kept_files(killed)
    with monkeypatch.context() as patch:
        changed = _differing(patch)
        capsys.readouterr()
        rc = main(["simulate", "--resume", str(killed), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, (rc, err)  # was 0: rounds 4-6 released, 4 and 5 with their first noise
    assert changed == [4]
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "round 4, redone from the checkpoint, came out other than its first release" in err
    assert "nothing of it was released" in err
    assert kept_files(killed) == files
    assert max(row["round"] for row in read_rows(killed / "metrics.jsonl")) <= 3
    # resumable: a redo like its first release is charged again (the lines are out of order)
    assert main(["simulate", "--resume", str(killed), "--quiet"]) == 0
    rounds = [line["round"] for line in read_rows(killed / LEDGER_FILE)[1:]]
    edited = files[LEDGER_FILE].decode().splitlines()[1:]
    assert rounds == [json.loads(x)["round"] for x in edited] + [4, 5, 6]


# -- 2: an ADADP round's partial line removed after partial lines -----------------------------
def test_2_a_partial_line_removed_after_partial_lines_is_refused(tmp_path, capsys, monkeypatch):
    killed = _killed(tmp_path, {"strategy": "dp-fedavg-adadp"})
    path = killed / LEDGER_FILE  # header, then partial and round lines: through round 5's
    rows = read_rows(tmp_path / "ref" / LEDGER_FILE)[:11]
    four = rows[8]  # round 4's round line; rows[7] is its partial line
    assert (rows[7]["kind"], four["kind"], four["round"]) == ("partial", "round", 4)
    merged = {**four, "released": [{**four["released"][0], "count": 2}]}
    rows = [*rows[:7], merged, *rows[9:]]  # its half step's line removed, its events merged in
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    record, points = RunLedger.record_partial, []

    def differing(self, round_num, events, point):
        points.append(round_num)  # the point is sent to the second cohort after this returns
        return record(self, round_num, events, point + 1e-6 if round_num == 4 else point)

    files = kept_files(killed)
    monkeypatch.setattr(RunLedger, "record_partial", differing)
    capsys.readouterr()
    rc = main(["simulate", "--resume", str(killed), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, (rc, points, err)  # was 0: round 4's half step sent out unchecked
    assert points == []
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "line 8: round 4 released its whole round" in err, err
    assert kept_files(killed) == files


# -- 3: a tree round's participants digest removed from its line ------------------------------
def test_3_a_tree_line_without_its_participants_digest_is_refused(tmp_path, capsys):
    config = small_config(**{**TREE, "secure": True, "num-server-rounds": 2})
    out = simulate(config, tmp_path / "run").out_dir
    state = torch.load(out / CHECKPOINT, map_location="cpu", weights_only=True)
    cohorts = state["algorithm"]["tree"]["cohorts"]
    used = set(cohorts["users"].tolist())
    other = min(set(range(40)) - used)  # a user the period has not drawn, for one it has
    cohorts["users"] = torch.tensor(sorted([*sorted(used)[1:], other]), dtype=torch.int64)
    state["sha256"] = state_digest(state)
    torch.save(state, out / CHECKPOINT)
    rows = read_rows(out / LEDGER_FILE)
    del rows[-1]["participants_sha256"]
    (out / LEDGER_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    text = (out / "config.toml").read_text()
    (out / "config.toml").write_text(text.replace("num-server-rounds = 2", "num-server-rounds = 4"))
    files = kept_files(out)
    capsys.readouterr()
    rc = main(["simulate", "--resume", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, (rc, err)  # was 0: the drawn user could be drawn again in the period
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "line 3: a tree round's line without participants_sha256" in err, err
    assert kept_files(out) == files
