"""Issue 15, forty-sixth hostile review, follow-up (ledger: the ledger, resume and report fixes).

1. The first wave's open row (ledger, for the owner of ``simulation/tensorboard.py``):
   ``simulate toy.toml --rounds 1 --tensorboard --out R``, then ``touch
   'R/events.out.tfevents.²'`` (a name whose time field is a superscript digit, which
   ``str.isdigit`` takes for a digit and ``int`` refuses), ``num-server-rounds = 2`` in
   ``R/config.toml``, ``simulate --resume R``. Before: rc 2, one line naming nothing
   (``invalid literal for int() with base 10: '²'``), after ``summary.json`` was removed.
   Now ``tensorboard._newest_seconds`` reads only ASCII digits (such a name is not one
   TensorBoard writes, and is left as it is): the resume runs round 2, as without the file.
2. The first wave's open row (ledger, for tuning): ``tune toy.toml --grid
   server-learning-rate=0.5,1 --mean-trials 2 --rounds 1 --seed 3 --out T``, then
   ``T/runs/trial-001/privacy_ledger.jsonl`` replaced by a symbolic link that cannot be
   followed (its disk not mounted; or links that loop), ``compare-tuned T --out O``. Before:
   "missing or empty, but the trial ran ...; run the same tune command again, which rebuilds
   the ledger from the trial's checkpoint", where that command refuses the link ("a resume
   appends to it ..."): advice that cannot be followed, and no word of the link. Now
   ``tune_trials.check_trial`` names the link and its target and says to put its target back
   or a copy of the ledger in place of the link (rc 2, one line); a missing ledger is
   reported as before.
3. A bypass of the forty-sixth review's ledger 1 (its advice): a finished secure run of one
   round (one checkpoint, ``checkpoint.pt``; any run saved once) whose ``checkpoint.pt`` is a
   symbolic link that cannot be followed, ``num-server-rounds = 2``, ``simulate --resume R``.
   Before: refused, but advising to "remove the link to continue from the previous
   checkpoint", of which there is none: following it, ``--resume`` refused the run ("has no
   checkpoint, but ... rounds up to 1 were released"); alike for ``checkpoint.prev.pt`` the
   link beside a torn ``checkpoint.pt``. Now ``checkpoint._refuse_dangling`` says the run has
   no other readable checkpoint and to put the target back; with a previous checkpoint, the
   advice as before.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedprivopt.simulation.checkpoint import newest_checkpoint
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import (
    CHECKPOINT,
    CONFIG_FILE,
    LEDGER_FILE,
    PREVIOUS_CHECKPOINT,
    SUMMARY_FILE,
)
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.simulation.rundata import load_run

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = {"population": 12, "task-params.num-users": 12}


def test_1_an_event_file_named_with_another_digit_does_not_stop_a_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    simulate(load_config(TOY, {**SMALL, "num-server-rounds": 1, "tensorboard": True}), run)
    odd = run / "events.out.tfevents.\u00b2"
    odd.touch()
    config = (run / CONFIG_FILE).read_text(encoding="utf-8")
    assert "num-server-rounds = 1\n" in config
    (run / CONFIG_FILE).write_text(
        config.replace("num-server-rounds = 1\n", "num-server-rounds = 2\n"), encoding="utf-8"
    )
    resume(run)  # before: ValueError: invalid literal for int() with base 10: '²'
    assert (run / SUMMARY_FILE).is_file() and load_run(run).rounds_completed == 2
    assert odd.exists()  # not ours to remove
    ours = [p.name for p in run.iterdir() if p.name.startswith("events.out.tfevents.")]
    assert len(ours) == 3 and all(n.split(".")[3].isascii() for n in ours if n != odd.name)


def test_2_compare_tuned_names_a_trial_ledger_linked_to_nothing(tmp_path: Path, capsys) -> None:
    from fedprivopt.cli import main

    out = tmp_path / "t"
    argv = ["tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "2",
            "--rounds", "1", "--seed", "3", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    (trial,) = sorted((out / "runs").iterdir())
    ledger = trial / LEDGER_FILE
    kept = ledger.read_bytes()
    report = ["compare-tuned", str(out), "--out", str(tmp_path / "c")]
    gone = tmp_path / "disk" / LEDGER_FILE  # moved to another disk and linked back, unmounted
    loop = trial / "loop"
    loop.symlink_to(loop.name)
    for target in (gone, loop):
        ledger.unlink()
        ledger.symlink_to(target)
        capsys.readouterr()
        assert main(report) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "Traceback" not in err, err
        assert f"{ledger}: a symbolic link to {str(target)!r} that cannot be followed" in err, err
        assert "missing or empty" not in err and "run the same tune command" not in err, err
        assert not (tmp_path / "c").exists()
    loop.unlink()
    ledger.unlink()
    capsys.readouterr()
    assert main(report) == 2  # a missing ledger: as before
    assert "missing or empty, but the trial ran" in capsys.readouterr().err
    ledger.write_bytes(kept)
    assert main(report) == 0, capsys.readouterr().err
    assert os.path.isfile(tmp_path / "c" / "report.md")


def test_3_a_dangling_checkpoint_without_a_previous_one_gives_advice_that_holds(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    simulate(load_config(TOY, {**SMALL, "num-server-rounds": 1, "secure": True}), run)
    assert not os.path.lexists(run / PREVIOUS_CHECKPOINT)  # saved once
    config = (run / CONFIG_FILE).read_text(encoding="utf-8")
    (run / CONFIG_FILE).write_text(
        config.replace("num-server-rounds = 1\n", "num-server-rounds = 2\n"), encoding="utf-8"
    )
    kept = (run / CHECKPOINT).read_bytes()
    (run / CHECKPOINT).unlink()
    (run / CHECKPOINT).symlink_to(tmp_path / "disk" / CHECKPOINT)  # its disk not mounted
    ledger = (run / LEDGER_FILE).read_bytes()
    with pytest.raises(ValueError, match="that cannot be followed") as e:
        resume(run)
    assert "continue from the previous checkpoint" not in str(e.value)  # before: advised
    assert "no other readable checkpoint" in str(e.value) and "put its target back" in str(e.value)
    assert (run / LEDGER_FILE).read_bytes() == ledger and (run / SUMMARY_FILE).exists()
    (run / CHECKPOINT).unlink()  # checkpoint.prev.pt the link, beside a torn checkpoint.pt
    (run / CHECKPOINT).write_bytes(kept[: len(kept) // 2])
    (run / PREVIOUS_CHECKPOINT).symlink_to(tmp_path / "disk" / PREVIOUS_CHECKPOINT)
    with pytest.raises(ValueError, match="no other readable checkpoint") as e:
        newest_checkpoint(run, {})
    assert str(run / PREVIOUS_CHECKPOINT) in str(e.value)
    assert "continue from the previous checkpoint" not in str(e.value)
    (run / CHECKPOINT).write_bytes(kept)  # with a previous checkpoint: the advice as before
    (run / PREVIOUS_CHECKPOINT).unlink()
    (run / PREVIOUS_CHECKPOINT).write_bytes(kept)
    (run / CHECKPOINT).unlink()
    (run / CHECKPOINT).symlink_to(tmp_path / "disk" / CHECKPOINT)
    with pytest.raises(ValueError, match="remove the link to continue from the previous"):
        newest_checkpoint(run, {})
