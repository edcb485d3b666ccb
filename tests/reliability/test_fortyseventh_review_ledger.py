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
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedprivopt.simulation.checkpoint import newest_checkpoint
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import CHECKPOINT, CONFIG_FILE, LEDGER_FILE, SUMMARY_FILE
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
