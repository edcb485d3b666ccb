"""Issue 15, forty-sixth hostile review (ledger: the ledger, checkpoints, every reader): tests.

1. A finished secure toy run of 2 rounds (checkpoints of rounds 1 and 2), its
   ``checkpoint.pt`` moved to another disk and linked back (``ln -s /mnt/big/R/checkpoint.pt
   R/checkpoint.pt``), that disk then not mounted (the link's target gone),
   ``num-server-rounds`` raised to 3 in ``config.toml``, then ``simulate --resume R``. Before:
   the link was taken for no checkpoint at all (``Path.exists`` of a dangling link is false),
   without a warning, and the run went on from ``checkpoint.prev.pt``: round 2 was released
   again with new noise, rc 0 (the 3-round run of the review: epsilon 25.92 where the intact
   checkpoint resumes at 22.40), as the thirty-seventh review's unreadable checkpoint did.
   Now ``checkpoint.newest_checkpoint`` (``_refuse_dangling``) refuses it for every reader
   (``--resume``, ``compare``, ``load_run``, ``compare-tuned``), naming the link and its
   target, nothing written; a link to a readable checkpoint is read as before.
2. The same finished run whose ``checkpoint.pt`` was made a link to ``checkpoint.prev.pt``
   (``ln -s checkpoint.prev.pt checkpoint.pt``, to go on from the previous checkpoint), then
   ``simulate --resume R`` (round 2 redone, one checkpoint saved). Before: saving it renamed
   the link over ``checkpoint.prev.pt``, which became a link to itself: the previous
   checkpoint's file was lost, ``load_run(R)`` (what reports read) raised ``OSError: Too many
   levels of symbolic links`` and every later ``--resume`` was refused. Now
   ``checkpoint.save_checkpoint`` (``_rotate``) removes such a link instead, keeping
   ``checkpoint.prev.pt``.
3. The run of finding 1 whose ``checkpoint.pt`` fails to read with EIO (a failing disk, a file
   server that did not answer; here a link to ``/proc/self/mem``, a regular file that cannot
   be read), then ``simulate --resume R``. Before: taken for a damaged file (a warning), the
   run went on from ``checkpoint.prev.pt`` and released the next round again with new noise,
   rc 0 (25.92 where 22.40). Now EIO, ESTALE and ETIMEDOUT are in
   ``checkpoint.NOT_ITS_CONTENT``: refused, one line naming the file (``--resume``, ``compare``,
   reports), nothing written, as the thirty-seventh review refused an unreadable one.
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


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished secure toy run of 2 rounds (checkpoints of rounds 1 and 2)."""
    run = tmp_path_factory.mktemp("r46ledger") / "run"
    settings = {**SMALL, "num-server-rounds": 2, "secure": True, "checkpoint-every": 1}
    simulate(load_config(TOY, settings), run)
    return run


def _copy(finished: Path, at: Path) -> Path:
    """A copy of ``finished`` whose ``config.toml`` asks for one more round."""
    at.mkdir()
    for path in finished.iterdir():
        if path.is_file():
            (at / path.name).write_bytes(path.read_bytes())
    config = (at / CONFIG_FILE).read_text(encoding="utf-8")
    assert "num-server-rounds = 2\n" in config
    (at / CONFIG_FILE).write_text(
        config.replace("num-server-rounds = 2\n", "num-server-rounds = 3\n"), encoding="utf-8"
    )
    return at


def test_1_a_checkpoint_linked_to_nothing_is_refused_not_skipped(
    finished: Path, tmp_path: Path
) -> None:
    run = _copy(finished, tmp_path / "run")
    disk = tmp_path / "disk"
    disk.mkdir()
    (run / CHECKPOINT).rename(disk / CHECKPOINT)
    target = disk / CHECKPOINT
    (run / CHECKPOINT).symlink_to(target)
    (disk / CHECKPOINT).unlink()  # the disk not mounted
    ledger = (run / LEDGER_FILE).read_bytes()
    with pytest.raises(ValueError, match=r"a symbolic link to .* that cannot be followed") as e:
        resume(run)
    assert str(run / CHECKPOINT) in str(e.value) and str(target) in str(e.value)
    assert (run / LEDGER_FILE).read_bytes() == ledger  # round 2 not released again
    assert (run / SUMMARY_FILE).exists() and (run / CHECKPOINT).is_symlink()
    with pytest.raises(ValueError, match="that cannot be followed"):
        newest_checkpoint(run, {})  # every reader: compare, load_run, compare-tuned


def test_1_a_checkpoint_linked_to_a_readable_one_is_read_as_before(
    finished: Path, tmp_path: Path
) -> None:
    run = _copy(finished, tmp_path / "run")
    disk = tmp_path / "disk"
    disk.mkdir()
    (run / CHECKPOINT).rename(disk / CHECKPOINT)
    (run / CHECKPOINT).symlink_to(disk / CHECKPOINT)
    state, name = newest_checkpoint(run, {})
    assert name == CHECKPOINT and state["algorithm"]["round"] == 2
    (run / CHECKPOINT).unlink()  # no checkpoint.pt at all: the previous one, as before
    state, name = newest_checkpoint(run, {})
    assert name == PREVIOUS_CHECKPOINT and state["algorithm"]["round"] == 1
    assert not os.path.lexists(run / CHECKPOINT)


def test_2_a_checkpoint_linked_to_the_previous_one_does_not_replace_it(
    finished: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for path in finished.iterdir():
        if path.is_file():
            (run / path.name).write_bytes(path.read_bytes())
    (run / CHECKPOINT).unlink()
    (run / CHECKPOINT).symlink_to(PREVIOUS_CHECKPOINT)  # go on from round 1
    resume(run)  # round 2 redone (secure: charged again), one checkpoint saved
    assert not (run / PREVIOUS_CHECKPOINT).is_symlink()
    assert not (run / CHECKPOINT).is_symlink()
    state, name = newest_checkpoint(run, {})
    assert name == CHECKPOINT and state["algorithm"]["round"] == 2
    (run / CHECKPOINT).unlink()
    state, name = newest_checkpoint(run, {})
    assert name == PREVIOUS_CHECKPOINT and state["algorithm"]["round"] == 1
    assert load_run(run).rounds_completed == 2


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs /proc/self/mem (EIO)")
def test_3_a_checkpoint_whose_read_fails_in_the_storage_is_refused_not_skipped(
    finished: Path, tmp_path: Path
) -> None:
    run = _copy(finished, tmp_path / "run")
    (run / CHECKPOINT).unlink()
    (run / CHECKPOINT).symlink_to("/proc/self/mem")  # a regular file whose read fails: EIO
    ledger = (run / LEDGER_FILE).read_bytes()
    with pytest.raises(ValueError, match=r"cannot be read \(Input/output error\), which says") as e:
        resume(run)
    assert str(run / CHECKPOINT) in str(e.value) and "file server" in str(e.value)
    assert (run / LEDGER_FILE).read_bytes() == ledger  # round 2 not released again
    assert (run / SUMMARY_FILE).exists() and not (run / (CHECKPOINT + ".bad")).exists()
