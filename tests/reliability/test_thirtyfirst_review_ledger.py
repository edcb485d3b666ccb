"""Issue 15, thirty-first hostile review (the ledger and run directories): regression tests.

1. A privacy ledger whose last line lacks only its newline (a script that rewrote the file with
   ``"\\n".join(lines)``, an editor that drops the final newline) had that whole line taken for
   a torn write and dropped, then cut off the file by the next append. A secure run
   (``secure = true``, ``checkpoint-every = 2``, ``eval-every = 2``) killed after round 3 was
   released, its checkpoint of round 2, resumed after that one-character edit: rc 0, ε 13.70 for
   the 5 releases whose ε is 15.03 (round 3's first release no longer in the ledger, its redo
   charged once). A finished run so edited was refused as ``the ledger was edited (what was
   released cannot have shrunk)``. A line is written in one piece, so a whole JSON object
   without its newline is an edit, not a torn write: it is now read as the release it records
   (the next append ends it first); a cut line is still dropped as before.
2. A run copied with ``cp -al A B`` (hard links, as snapshot backups make; the sixteenth review
   gave such a copy's ledger and rows their own files on resume) shares ``run.lock``'s inode
   with ``A``, and the lock file's ``flock`` is the inode's: ``simulate --resume B`` while ``A``
   ran was refused, ``run directory 'B' is in use by process <A's PID>`` (and ``A`` while ``B``
   ran), each writing its PID into the other's file. The holder of a directory's lock now
   gives a hard-linked lock file its own before locking it (a link or FIFO is still refused).
3. A checkpoint whose accountant was set from ``"rdp"`` to ``"pld"`` (or another
   ``prv_eps_error``), its digest recomputed with ``state_digest``, was resumed with rc 0: the
   events were checked against the ledger, not the accountant that composes them. The resumed
   rows then stated PLD's ε (12.91 at round 5 beside the ledger's 15.03), and a run with
   ``target-epsilon = 16`` went on to round 8, ``stopped_reason`` "budget" with the ledger's ε
   18.41 (an unedited one stops at round 5, 15.03). Now refused, one line naming the
   checkpoint, the field and the ledger's value. With the ledger deleted too it was refused
   already, as an ε below the rows' (PLD's is lower); now as the accountant, naming
   ``config.toml``'s.
4. A ledger line's round set to ``10**20`` (its events left to add up): ``--resume`` said
   ``config.toml: its files show rounds up to 100000000000000000000 released, more than the
   num-server-rounds = 5 of its config.toml; set it to at least 100000000000000000000``,
   advice no configuration can follow (at most 10**6 rounds), where the ledger was edited.
   A line's round beyond ``MAX_ROUNDS`` is now refused as damaged or edited, naming the line
   (``compare`` and the reports read the ledger alike).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.simulation.checkpoint import state_digest
from fedprivopt.simulation.files import CHECKPOINT, LEDGER_FILE, PREVIOUS_CHECKPOINT, read_rows
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.simulation.rundir import lock_run_dir
from tests.reliability.test_ledger import _ledger_epsilon, _set
from tests.simulation.test_run import small_config


def _killed_after_round_3(ref: Path, killed: Path) -> None:
    """``ref`` (4 rounds, checkpoints and rows every 2) as killed after round 3 was released."""
    shutil.copytree(ref, killed)
    (killed / CHECKPOINT).unlink()
    (killed / PREVIOUS_CHECKPOINT).rename(killed / CHECKPOINT)
    (killed / "summary.json").unlink()
    lines = (killed / LEDGER_FILE).read_text().splitlines(keepends=True)
    (killed / LEDGER_FILE).write_text("".join(lines[:4]))
    rows = [r for r in read_rows(killed / "metrics.jsonl") if r["round"] <= 3]
    (killed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _strip_final_newline(out: Path) -> None:
    text = (out / LEDGER_FILE).read_text()
    assert text.endswith("}\n")
    (out / LEDGER_FILE).write_text(text[:-1])


# -- 1: a whole last line without its newline ------------------------------------------------------
def test_1_a_secure_runs_last_ledger_line_without_its_newline_stays_charged(tmp_path):
    config = small_config(
        **{"secure": True, "num-server-rounds": 4, "checkpoint-every": 2, "eval-every": 2}
    )
    ref = simulate(config, tmp_path / "ref").out_dir
    as_is, edited = tmp_path / "as_is", tmp_path / "edited"
    _killed_after_round_3(ref, as_is)
    _killed_after_round_3(ref, edited)
    _strip_final_newline(edited)
    expected = resume(as_is).epsilon  # round 3 released twice: 5 events
    outcome = resume(edited)
    assert outcome.epsilon == expected == _ledger_epsilon(edited, 1e-4)
    rounds = [(line["round"], line["events"]) for line in read_rows(edited / LEDGER_FILE)[1:]]
    assert rounds == [(1, 1), (2, 2), (3, 3), (3, 4), (4, 5)]


def test_1_a_finished_runs_last_ledger_line_without_its_newline_resumes(tmp_path):
    out = simulate(small_config(**{"num-server-rounds": 3}), tmp_path / "run").out_dir
    _strip_final_newline(out)
    _set(out, "num-server-rounds", "4")
    outcome = resume(out)  # was refused: "the ledger was edited (... cannot have shrunk)"
    assert outcome.rounds_completed == 4
    assert outcome.epsilon == _ledger_epsilon(out, small_config().strategy.delta)
    assert [line["round"] for line in read_rows(out / LEDGER_FILE)[1:]] == [1, 2, 3, 4]


# -- 2: a hard-linked copy's run.lock --------------------------------------------------------------
def test_2_a_hard_linked_copys_lock_file_is_its_own(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "run.lock").write_text("")
    os.link(a / "run.lock", b / "run.lock")
    with lock_run_dir(a), lock_run_dir(b):  # was: 'b' is in use by process <this one>
        assert (a / "run.lock").read_text() == (b / "run.lock").read_text() == f"{os.getpid()}\n"
        assert not os.path.samefile(a / "run.lock", b / "run.lock")


def test_2_a_cp_al_copy_of_a_running_run_resumes(tmp_path, capsys):
    a = simulate(small_config(**{"num-server-rounds": 2}), tmp_path / "a").out_dir
    b = tmp_path / "b"
    shutil.copytree(a, b, copy_function=os.link)
    text = (b / "config.toml").read_text()
    (b / "config.toml").unlink()  # as an editor that writes a new file does
    (b / "config.toml").write_text(text)
    _set(b, "num-server-rounds", "3")
    with lock_run_dir(a):  # a runs (here: held by this process)
        assert main(["simulate", "--resume", str(b), "--quiet"]) == 0, capsys.readouterr().err
        assert (a / "run.lock").read_text() == f"{os.getpid()}\n"
    assert resume(a).rounds_completed == 2  # a is as it was


# -- 3: a checkpoint's accountant edited -----------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "value", "ledger"),
    [("accountant", "pld", True), ("prv_eps_error", 0.5, True), ("accountant", "pld", False)],
    ids=["pld", "prv-error", "pld-no-ledger"],
)
def test_3_a_checkpoint_whose_accountant_was_edited_is_refused(
    tmp_path, capsys, key, value, ledger
):
    config = small_config(**{"num-server-rounds": 2, "target-epsilon": 16.0})
    out = simulate(config, tmp_path / "run").out_dir
    state = torch.load(out / CHECKPOINT, map_location="cpu", weights_only=True)
    state["algorithm"]["accountant"][key] = value
    state["sha256"] = state_digest(state)
    torch.save(state, out / CHECKPOINT)
    if not ledger:
        (out / LEDGER_FILE).unlink()
    _set(out, "num-server-rounds", "20")
    capsys.readouterr()
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    source = LEDGER_FILE if ledger else "config.toml"
    assert f"checkpoint.pt's privacy accountant has {key} = " in err, err
    assert f"but {source} records" in err and "the checkpoint was edited" in err, err


# -- 4: a ledger line's round beyond what a run may have -------------------------------------------
def test_4_a_ledger_round_beyond_max_rounds_is_refused_as_edited(tmp_path, capsys):
    out = simulate(small_config(**{"num-server-rounds": 2}), tmp_path / "run").out_dir
    lines = (out / LEDGER_FILE).read_text().splitlines(keepends=True)
    last = json.loads(lines[-1])
    last["round"] = 10**20
    (out / LEDGER_FILE).write_text("".join(lines[:-1]) + json.dumps(last) + "\n")
    _set(out, "num-server-rounds", "3")
    capsys.readouterr()
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{LEDGER_FILE}: line 3: round 100000000000000000000 is beyond the 1,000,000" in err
    assert "set it to at least" not in err, err
