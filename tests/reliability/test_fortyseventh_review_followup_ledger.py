"""Issue 15, forty-seventh hostile review, follow-up (ledger: the first wave's fixes, open rows).

1. A finished secure toy run of 2 rounds (``checkpoint-every = 1``) stopped inside
   ``save_checkpoint`` of round 2 after ``checkpoint.pt.tmp`` was written and fsynced: between
   its two renames (``checkpoint.pt`` already ``checkpoint.prev.pt``: a kill or a power loss),
   or before the first (``os.replace`` failing with ``EIO``), then ``simulate --resume R``
   (the first wave's open row ledger 3). Before: the complete checkpoint of round 2, whose
   model the ledger records, was ignored and later removed; the run went on from round 1 and
   released round 2 again with new noise (ledger rounds 1, 2, 2; epsilon 18.62 where 14.39).
   Now ``checkpoint.finish_save`` (called by ``run._resume_locked`` under the lock, before the
   audit) puts it in place as the save would have; a ``.tmp`` of an earlier round, a torn one,
   or one whose model is not the ledger's last release of its round is left to be removed.
2. The first wave's ledger 2 (a pinned checkpoint refused before a round is released) got
   around by pinning another file a resume replaces or removes: the same finished run, rounds
   raised to 3, ``chattr +i R/metrics.jsonl`` (or ``summary.json``; or ``chattr +a R``, where
   no file can be renamed or removed), ``simulate --resume R``. Before: ``summary.json`` was
   removed (a finished run's summary lost), then ``metrics.jsonl.tmp -> metrics.jsonl:
   Operation not permitted``, framed as a bad ``--resume``, ``metrics.jsonl.tmp`` left.
   Now ``files.check_replaced`` refuses ``metrics.jsonl``, ``summary.json`` and the directory
   so marked before anything is written, naming it and ``chattr -i`` (``-a``).
3. The first wave's open row ledger 4: ``simulate toy.toml --out R`` whose disk fills while it
   writes (the 8th fsync failing with ENOSPC; EIO alike). Before: ``error: argument --out:
   R/privacy_ledger.jsonl: No space left on device``, a bad argument, where the argument was
   fine. Now ``cli._storage_failed``: ``R/privacy_ledger.jsonl: No space left on device (the
   disk or file server under --out failed, not the argument); free space or check the disk,
   then resume the run (fedprivopt simulate --resume R)``, rc 2 as before.
4. The first wave's api 3 (a registered name's factory recorded in the ledger's
   ``data.task_source``) broke the resume of a valid run: a run of a registered task of one's
   own started by a version before it (no ``factory`` recorded), its module unchanged,
   ``num-server-rounds`` raised, ``resume(R)``. Before: refused, "the task's code changed since
   the run started (module ..., source SHA-256 6fe75c7ffa19…; the run's privacy ledger records
   ..., 6fe75c7ffa19…; factory "reg.make", the ledger's null)" (compare's reuse alike). Now
   ``LedgerChecks.check_data`` checks such a ledger by what it records, the module's digest.
5. A way around api 3: the data-seed sweep's factory made in a loop over ``numpy.arange``
   (``partial(ToyClassificationTask, seed=seed)`` with numpy integers, recorded ``<int64>``),
   as a lambda closing over the seed, or as ``def make(seed=seed, **p)``. Before: one data
   identity for seeds 3 and 4 (``resume()`` went on with the other seed's data, as api 3's
   case did). Now ``registry.factory_text`` records a repr without an address
   (``np.int64(3)``), a function's defaults and its closure's values (``_captured``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from fedprivopt.simulation.checkpoint import state_digest
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import (
    CHECKPOINT,
    CONFIG_FILE,
    LEDGER_FILE,
    METRICS_FILE,
    PREVIOUS_CHECKPOINT,
    SUMMARY_FILE,
)
from fedprivopt.simulation.run import resume, simulate

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = {"population": 12, "task-params.num-users": 12}
TMP = CHECKPOINT + ".tmp"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished secure toy run of 2 rounds (checkpoints of rounds 1 and 2)."""
    run = tmp_path_factory.mktemp("r47fuledger") / "run"
    settings = {**SMALL, "num-server-rounds": 2, "secure": True, "checkpoint-every": 1}
    simulate(load_config(TOY, settings), run)
    return run


def _released(run: Path) -> list[int]:
    """The rounds of the ledger's lines, in order."""
    lines = (run / LEDGER_FILE).read_text(encoding="utf-8").splitlines()[1:]
    return [json.loads(line)["round"] for line in lines]


def _epsilon(run: Path) -> float:
    return json.loads((run / SUMMARY_FILE).read_text(encoding="utf-8"))["epsilon"]


def _stopped_save(finished: Path, at: Path, where: str) -> Path:
    """A copy of ``finished`` whose save of round 2 stopped at ``where`` (no summary yet)."""
    shutil.copytree(finished, at)
    os.replace(at / CHECKPOINT, at / TMP)  # round 2's, written and fsynced
    if where == "before the first rename":  # checkpoint.pt still round 1's
        shutil.copyfile(at / PREVIOUS_CHECKPOINT, at / CHECKPOINT)
    (at / SUMMARY_FILE).unlink()
    return at


@pytest.mark.parametrize("where", ["between the renames", "before the first rename"])
def test_1_a_save_stopped_after_its_tmp_is_finished_not_released_again(
    finished: Path, tmp_path: Path, where: str
) -> None:
    run = _stopped_save(finished, tmp_path / "run", where)
    resume(run)
    assert _released(run) == [1, 2]  # round 2 not released again (before: [1, 2, 2])
    assert _epsilon(run) == pytest.approx(_epsilon(finished))  # before: 18.62 where 14.39
    assert not (run / TMP).exists()
    assert torch.load(run / CHECKPOINT, weights_only=True)["algorithm"]["round"] == 2
    assert torch.load(run / PREVIOUS_CHECKPOINT, weights_only=True)["algorithm"]["round"] == 1


def test_1_a_tmp_the_ledger_does_not_record_is_not_taken(finished: Path, tmp_path: Path) -> None:
    run = _stopped_save(finished, tmp_path / "run", "between the renames")
    state = torch.load(run / TMP, weights_only=True)
    state["algorithm"]["params"] = state["algorithm"]["params"] + 1.0  # another model of round 2
    state["sha256"] = state_digest(state)
    torch.save(state, run / TMP)
    resume(run)
    assert _released(run) == [1, 2, 2]  # redone from round 1's checkpoint, as before
    assert not (run / TMP).exists()


def _chattr(flag: str, path: Path) -> bool:
    """``chattr flag path``; whether it took (root, or CAP_LINUX_IMMUTABLE, on ext4 or xfs)."""
    if shutil.which("chattr") is None:
        return False
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False)
    return done.returncode == 0


@pytest.mark.parametrize(
    ("name", "flag"), [(METRICS_FILE, "i"), (SUMMARY_FILE, "i"), (METRICS_FILE, "a"), ("", "a")]
)
def test_2_a_pinned_rows_summary_or_directory_is_refused_before_anything_is_written(
    finished: Path, tmp_path: Path, name: str, flag: str
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    config = (run / CONFIG_FILE).read_text(encoding="utf-8")
    (run / CONFIG_FILE).write_text(
        config.replace("num-server-rounds = 2\n", "num-server-rounds = 3\n"), encoding="utf-8"
    )
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    pinned = run / name
    if not _chattr(f"+{flag}", pinned):
        pytest.skip("chattr cannot set file attributes here")
    try:
        with pytest.raises(ValueError, match=rf"{pinned}: the .* is .*chattr -{flag}"):
            resume(run)
    finally:
        assert _chattr(f"-{flag}", pinned)
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert after == before  # the summary kept, no metrics.jsonl.tmp left


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_3_a_disk_failing_mid_run_is_not_a_bad_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, code: int
) -> None:
    from fedprivopt.cli import main

    run, real, calls = tmp_path / "run", os.fsync, []

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 8:  # the ledger's line of round 2, after round 1's checkpoint
            raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    argv = ["simulate", str(TOY), "--out", str(run), "--rounds", "2", "--set", "secure=true"]
    argv += [f"--set={key}={value}" for key, value in SMALL.items()]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --out" not in err, err
    assert f"{run / LEDGER_FILE}: {os.strerror(code)} (the disk or file server under --out" in err
    assert f"then resume the run (fedprivopt simulate --resume {run})" in err


def test_4_a_run_recorded_before_the_factory_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib
    import sys

    import fedprivopt.models.registry as registry

    (tmp_path / "fuledger47reg.py").write_text(
        "from fedprivopt.models import register_task\n"
        "from fedprivopt.models.toy import ToyClassificationTask\n"
        "def make(**p):\n    return ToyClassificationTask(**{**p, 'seed': 3})\n"
        "register_task('fuledger47', make, replace=True)\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fuledger47reg", raising=False)
    importlib.import_module("fuledger47reg")
    run = tmp_path / "run"
    with monkeypatch.context() as earlier:  # a version before the factory was recorded
        earlier.setattr(registry, "factory_text", lambda factory: None)
        settings = {**SMALL, "task": "fuledger47", "num-server-rounds": 1}
        simulate(load_config(TOY, settings), run)
    assert '"factory"' not in (run / LEDGER_FILE).read_text(encoding="utf-8")
    config = (run / CONFIG_FILE).read_text(encoding="utf-8")
    (run / CONFIG_FILE).write_text(
        config.replace("num-server-rounds = 1\n", "num-server-rounds = 2\n"), encoding="utf-8"
    )
    resume(run)  # before: ValueError "the task's code changed" (the same SHA-256)
    assert _released(run) == [1, 2]


def test_5_a_factory_of_a_loop_is_told_by_its_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib
    import sys

    from fedprivopt.models.registry import build_task
    from fedprivopt.models.task import data_identity

    (tmp_path / "fuledger47sweep.py").write_text(
        "import functools\nimport numpy as np\n"
        "from fedprivopt.models import register_task\n"
        "from fedprivopt.models.toy import ToyClassificationTask as T\n"
        "def numpy(seed):\n"
        "    register_task('fu47np', functools.partial(T, seed=np.int64(seed)), replace=True)\n"
        "def closure(seed):\n"
        "    register_task('fu47cl', lambda **p: T(seed=seed, **p), replace=True)\n"
        "def default(seed):\n"
        "    def make(seed=seed, **p):\n        return T(seed=seed, **p)\n"
        "    register_task('fu47df', make, replace=True)\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fuledger47sweep", raising=False)
    mod = importlib.import_module("fuledger47sweep")
    alike = []
    for sweep, name in ((mod.numpy, "fu47np"), (mod.closure, "fu47cl"), (mod.default, "fu47df")):
        ids = []
        for seed in (3, 4, 3):
            sweep(seed)
            ids.append(data_identity(build_task(name, num_users=4)))
        assert ids[0] == ids[2], name  # the same seed: the same identity
        if ids[0] == ids[1]:
            alike.append(name)
    assert alike == []  # before: all three equal for seeds 3 and 4
