"""Issue 15, forty-seventh hostile review (ledger: the ledger, checkpoints, every reader): tests.

1. A finished secure toy run of 2 rounds (checkpoints of rounds 1 and 2), ``num-server-rounds``
   raised to 3, then ``simulate --resume R`` whose load of the intact ``checkpoint.pt`` meets
   torch's CPU allocator's failure (``RuntimeError: DefaultCPUAllocator: can't allocate
   memory``: ``ulimit -v``, or memory another process held a moment). Before: taken for a torn
   file (a warning), the checkpoint was set aside as ``checkpoint.pt.bad`` and the run went on
   from ``checkpoint.prev.pt``, releasing round 2 again with new noise, rc 0 (the 3-round run
   of the review resumed to 4: epsilon 15.03 where the intact checkpoint resumes at 13.70),
   where a ``MemoryError`` was raised as it is. Now ``checkpoint.newest_checkpoint`` raises it
   as it is (``task_calls.out_of_memory``): the command line's one line "this machine ran out
   of memory", rc 1, nothing written.
2. The same finished run whose ``checkpoint.prev.pt`` was made immutable (``chattr +i``, to keep
   it from being removed; or append-only, ``chattr +a``; or ``checkpoint.pt`` so), rounds
   raised, ``simulate --resume R``. Before: round 3 was released (its ledger line and row), then
   saving its checkpoint failed (``checkpoint.pt -> checkpoint.prev.pt: Operation not
   permitted``, rc 2), and the next resume released round 3 again with new noise (the review's
   run: epsilon 15.03 where 13.70), as the forty-first review's directory at
   ``checkpoint.pt.tmp`` did. Now ``files.check_replaced`` (``_pinned``) refuses it before
   anything is written, naming the file and ``chattr -i``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

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

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = {"population": 12, "task-params.num-users": 12}
ALLOCATOR = (
    "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you "
    "tried to allocate 4000000 bytes. Error code 12 (Cannot allocate memory)"
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished secure toy run of 2 rounds (checkpoints of rounds 1 and 2)."""
    run = tmp_path_factory.mktemp("r47ledger") / "run"
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


def test_1_a_checkpoint_load_out_of_memory_is_not_a_torn_file(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _copy(finished, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    real = torch.load

    def load(path, *args, **kwargs):
        if Path(path).name == CHECKPOINT:  # the intact newest checkpoint; memory is short
            raise RuntimeError(ALLOCATOR)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        newest_checkpoint(run, problems={})
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        resume(run)
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert after == before  # no round released again, checkpoint.pt not set aside
    assert not (run / (CHECKPOINT + ".bad")).exists()
    monkeypatch.setattr(torch, "load", real)
    assert newest_checkpoint(run)[1] == CHECKPOINT  # read as before once memory is there
    assert (run / SUMMARY_FILE).exists() and (run / LEDGER_FILE).exists()


def _chattr(flag: str, path: Path) -> bool:
    """``chattr flag path``; whether it took (root, or CAP_LINUX_IMMUTABLE, on ext4 or xfs)."""
    if shutil.which("chattr") is None:
        return False
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False)
    return done.returncode == 0


@pytest.mark.parametrize(("name", "flag"), [(PREVIOUS_CHECKPOINT, "i"), (CHECKPOINT, "a")])
def test_2_a_pinned_checkpoint_is_refused_before_a_round_is_released(
    finished: Path, tmp_path: Path, name: str, flag: str
) -> None:
    run = _copy(finished, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    if not _chattr(f"+{flag}", run / name):
        pytest.skip("chattr cannot set file attributes here")
    try:
        with pytest.raises(ValueError, match=rf"{name}: the file is .*chattr -{flag}"):
            resume(run)
    finally:
        assert _chattr(f"-{flag}", run / name)
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert after == before  # nothing released, the summary kept
