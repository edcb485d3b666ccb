"""Issue 15, forty-eighth hostile review (ledger: the ledger, checkpoints, resume, their readers).

1. A finished secure toy run (2 rounds, ``checkpoint-every = 1``), ``num-server-rounds`` raised
   to 3, ``simulate --resume R`` whose read of its intact ``checkpoint.pt`` fails with an errno
   outside the set the forty-sixth and thirty-seventh reviews named (``ENOTCONN``: a FUSE mount
   such as sshfs or s3fs whose daemon stopped; ``ECONNRESET``, ``EHOSTDOWN`` of an SMB share;
   ``EKEYEXPIRED``; ``ENXIO``/``ENODEV`` of a removed disk; ``EINVAL``, reproduced with
   ``ln -s /proc/self/clear_refs R/checkpoint.pt``). Before: taken for a torn file, the intact
   checkpoint set aside as ``checkpoint.pt.bad``, the run went on from ``checkpoint.prev.pt``
   and released round 2 again with new noise (rc 0; ledger rounds 1, 2, 2, 3). Now
   ``checkpoint._not_its_content``: every ``OSError`` with an errno but ``ENOENT`` is refused,
   naming the file (a torn or corrupt checkpoint never raises one), nothing written.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from fedprivopt.simulation.checkpoint import newest_checkpoint
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import CHECKPOINT, CONFIG_FILE, LEDGER_FILE, PREVIOUS_CHECKPOINT
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.simulation.rundata import load_run

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = {"population": 12, "task-params.num-users": 12}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished secure toy run of 2 rounds (checkpoints of rounds 1 and 2)."""
    run = tmp_path_factory.mktemp("r48ledger") / "run"
    settings = {**SMALL, "num-server-rounds": 2, "secure": True, "checkpoint-every": 1}
    simulate(load_config(TOY, settings), run)
    return run


def _copy(run: Path, to: Path, rounds: int = 3) -> Path:
    shutil.copytree(run, to)
    config = to / CONFIG_FILE
    text = config.read_text(encoding="utf-8")
    config.write_text(text.replace("num-server-rounds = 2", f"num-server-rounds = {rounds}"))
    return to


def _released(run: Path) -> list[int]:
    lines = (run / LEDGER_FILE).read_text(encoding="utf-8").splitlines()[1:]
    return [json.loads(line)["round"] for line in lines]


@pytest.mark.parametrize(
    "code", [errno.ENOTCONN, errno.ECONNRESET, errno.EKEYEXPIRED, errno.ENODEV, errno.EINVAL]
)
def test_1_a_checkpoint_read_failing_in_the_storage_is_not_a_torn_file(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    run = _copy(finished, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    real = torch.load

    def load(path, *args, **kwargs):
        if Path(path).name == CHECKPOINT:  # the intact newest checkpoint; its storage fails
            raise OSError(code, os.strerror(code), str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    with pytest.raises(ValueError, match=r"checkpoint\.pt: cannot be read .*says nothing of its"):
        newest_checkpoint(run, problems={})
    with pytest.raises(ValueError, match=r"checkpoint\.pt: cannot be read"):
        resume(run)
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert after == before  # no round released again, checkpoint.pt not set aside
    assert not (run / (CHECKPOINT + ".bad")).exists()
    monkeypatch.setattr(torch, "load", real)
    assert newest_checkpoint(run)[1] == CHECKPOINT  # read as before once the storage answers
    assert _released(run) == [1, 2]


@pytest.fixture(scope="module")
def restored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A backup of a secure run after round 1 (``checkpoint.pt`` alone), the run after round 3."""
    root = tmp_path_factory.mktemp("r48ledger2")
    settings = {**SMALL, "num-server-rounds": 1, "secure": True, "checkpoint-every": 1}
    simulate(load_config(TOY, settings), root / "backup")
    run = _copy(root / "backup", root / "run", rounds=3)
    config = run / CONFIG_FILE
    config.write_text(
        config.read_text(encoding="utf-8").replace("num-server-rounds = 1", "num-server-rounds = 3")
    )
    resume(run)
    return root / "backup", run


@pytest.mark.parametrize("newer", ["prev", "tmp", "both"])
def test_2_an_older_copy_put_back_beside_a_newer_checkpoint_is_refused(
    restored: tuple[Path, Path], tmp_path: Path, newer: str
) -> None:
    backup, finished_run = restored
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    if newer != "prev":  # the save of round 3 stopped between its renames
        os.replace(run / CHECKPOINT, run / (CHECKPOINT + ".tmp"))
    if newer == "tmp":
        (run / PREVIOUS_CHECKPOINT).unlink()
    for path in backup.iterdir():  # the backup put back over the run (cp -a B/. R/)
        shutil.copy2(path, run / path.name)
    config = run / CONFIG_FILE
    config.write_text(
        config.read_text(encoding="utf-8").replace("num-server-rounds = 1", "num-server-rounds = 4")
    )
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(ValueError, match=r"is a checkpoint of round [23], but privacy_ledger"):
        resume(run)
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert after == before  # nothing released again, the newer checkpoint kept
    assert _released(run) == [1]


def test_3_a_report_of_an_older_copy_beside_a_newer_checkpoint_shows_its_epsilon(
    restored: tuple[Path, Path], tmp_path: Path
) -> None:
    backup, finished_run = restored
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    for path in backup.iterdir():  # the backup put back over the run (cp -a B/. R/)
        shutil.copy2(path, run / path.name)
    data = load_run(run)
    first = load_run(backup).epsilon  # round 1's, what every restored file states
    assert data.epsilon > first * 1.2  # checkpoint.prev.pt's: round 2's
    assert any("checkpoint.prev.pt (its accountant)" in w for w in data.warnings)
    assert load_run(finished_run).warnings == ()  # an older previous checkpoint: no note
