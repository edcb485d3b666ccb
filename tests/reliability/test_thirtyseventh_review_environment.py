"""Issue 15, thirty-seventh hostile review (environment: limits, permissions, links, locales).

1. A checkpoint this process may not read taken for a damaged one: a secure run
   (``simulate toy.toml --rounds 2 --set secure=true --set checkpoint-every=1``) raised to 4
   rounds in its ``config.toml``, its ``checkpoint.pt`` made unreadable to its user (``chmod
   000``, as a run directory restored by another account leaves it; ``ulimit -n`` exhausted
   alike), then ``simulate --resume``: rc 0, one warning ``checkpoint checkpoint.pt is
   unreadable ("[Errno 13] Permission denied …"); continuing from checkpoint.prev.pt``, and
   round 2 was released again with new noise: ε 15.03 where the intact checkpoint resumes at
   13.70 (a seeded run replays it, at no cost). An ``OSError`` of the file's access
   (EACCES, EPERM, EMFILE, ENFILE, ENOMEM; ``checkpoint.NOT_ITS_CONTENT``) or a
   ``MemoryError`` says nothing of its content: rc 2, one line naming the file and what to do,
   nothing written; a damaged file still falls back to the previous one.
2. A umask that takes the owner's permissions away, run as a user (not root): under ``umask
   0444`` ``simulate toy.toml --out D`` (``D`` an empty directory) said ``out directory 'D' is
   not empty: it holds run.lock but no config.toml, so it is not recognisably a run; … choose
   another --out`` (its own lock file, which it could not read back); under ``umask 0777``
   ``D/run.lock: Permission denied``, leaving ``D`` created with mode ``000``; under ``0222``
   ``privacy_ledger.jsonl: Permission denied`` (its header written, the first append refused).
   As root every such run went on and wrote its files with modes like ``000``. Now a umask with
   any of the owner's bits (``& 0o700``) is refused before anything is created by every
   command that claims or locks a directory (``core.files.check_umask`` in ``NewRunDir`` and
   ``rundir.lock_directory``): rc 2, one line naming the umask and ``umask 022``/``077``.
3. A run's temporary file that is a link: ``checkpoint.pt.tmp`` (left by a checkpoint write
   that failed: ``ulimit -f``, a full disk) made a symbolic link to a user's file, as ``cp -rs
   A B`` makes one to ``A``'s (the ledger and rows then copied in place of their links, as the
   sixteenth review's refusal says), then ``simulate --resume B``: rc 0, the user's file
   replaced by the checkpoint and the link renamed into ``B/checkpoint.pt``;
   ``summary.json.tmp`` and ``config.toml.tmp`` alike, and a hard-linked one (``cp -al``)
   shared its inode. Whatever is left under a ``.tmp`` name is removed before it is written
   (``files.temporary``): the linked file unchanged, the checkpoint a file of its own.
4. A file system that keeps no locks: ``simulate toy.toml --out D`` (``compare``, ``data
   synth``, ``--resume`` alike) with ``D`` on an NFS mount whose lock service does not answer
   (``flock`` fails with ``ENOLCK``, "No locks available"; ``ENOSYS``/``EOPNOTSUPP`` on some
   FUSE file systems; simulated here by ``fcntl.flock``): ``OSError: [Errno 37] No locks
   available`` naming no file, a traceback, rc 1. Now rc 2, one line naming the directory or
   lock file, that it cannot be locked and to use a local disk (``locks.unlockable``);
   nothing left.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.simulation import checkpoint
from fedprivopt.simulation.files import CHECKPOINT, CONFIG_FILE, LEDGER_FILE
from fedprivopt.simulation.run import simulate
from tests.reliability.test_fuzz_cli import PRESET
from tests.reliability.test_ledger import kept_files
from tests.simulation.test_run import small_config


def _one_line(err: str) -> str:
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def secure_run(tmp_path_factory):
    """A finished secure run of 2 rounds, checkpointed every round, set to 3 rounds."""
    out = tmp_path_factory.mktemp("secure") / "run"
    simulate(small_config(**{"num-server-rounds": 2, "secure": True, "checkpoint-every": 1}), out)
    config = out / CONFIG_FILE
    config.write_text(config.read_text().replace("num-server-rounds = 2", "num-server-rounds = 3"))
    return out


def _load_failing(monkeypatch, code: int) -> None:
    """``torch.load`` of a ``checkpoint.pt`` fails with ``code`` (root reads any file)."""
    load = torch.load

    def failing(path, *args, **kwargs):
        if Path(path).name == CHECKPOINT:
            if code == errno.ENOMEM:
                raise MemoryError
            raise OSError(code, os.strerror(code), str(path))
        return load(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "load", failing)


# -- 1: a checkpoint this process may not read -----------------------------------------------------
@pytest.mark.parametrize(
    ("code", "said"),
    [(errno.EACCES, "give this user read access"), (errno.EMFILE, "ulimit -n")],
)
def test_1_an_unreadable_checkpoint_is_not_replaced_by_the_previous_one(
    secure_run, monkeypatch, capsys, code, said
):
    files = kept_files(secure_run)
    _load_failing(monkeypatch, code)
    capsys.readouterr()
    assert main(["simulate", "--resume", str(secure_run), "--quiet"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{secure_run / CHECKPOINT}: cannot be read ({os.strerror(code)})" in err, err
    assert said in err and "previous checkpoint was not used" in err, err
    assert kept_files(secure_run) == files  # round 2 not released again


def test_1_out_of_memory_while_loading_it_is_not_a_damaged_checkpoint(secure_run, monkeypatch):
    _load_failing(monkeypatch, errno.ENOMEM)
    with pytest.raises(MemoryError):
        checkpoint.newest_checkpoint(secure_run, {})


def test_1_a_damaged_checkpoint_still_falls_back(secure_run, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for path in secure_run.iterdir():
        (run / path.name).write_bytes(path.read_bytes())
    (run / CHECKPOINT).write_bytes(b"damaged")
    problems: dict[str, str] = {}
    state, name = checkpoint.newest_checkpoint(run, problems)
    assert name == "checkpoint.prev.pt" and state is not None
    assert list(problems) == [CHECKPOINT]
    assert (run / LEDGER_FILE).exists()


# -- 2: a umask that takes the owner's permissions away ----------------------------------------
@pytest.fixture
def umask():
    """Set the process's umask for the test (set back after it)."""
    before = os.umask(0o022)
    os.umask(before)
    yield os.umask
    os.umask(before)


@pytest.mark.parametrize("mask", [0o444, 0o777, 0o222, 0o100])
def test_2_a_umask_without_the_owners_permissions_is_refused(tmp_path, capsys, umask, mask):
    out = tmp_path / "new" / "run"
    umask(mask)
    assert main(["simulate", str(PRESET), "--rounds", "1", "--out", str(out), "--quiet"]) == 2
    umask(0o022)
    err = _one_line(capsys.readouterr().err)
    assert f"the umask is {mask:04o}" in err and "umask 022" in err, err
    assert not (tmp_path / "new").exists()  # nothing created


def test_2_resume_under_such_a_umask_is_refused_and_077_is_not(secure_run, capsys, umask):
    files = kept_files(secure_run)
    umask(0o377)
    assert main(["simulate", "--resume", str(secure_run), "--quiet"]) == 2
    umask(0o022)
    assert "the umask is 0377" in _one_line(capsys.readouterr().err)
    assert kept_files(secure_run) == files
    from fedprivopt.core.files import check_umask

    umask(0o077)
    check_umask(secure_run)  # a private umask is fine


# -- 3: a run's temporary file that is a link ------------------------------------------------------
def test_3_a_temporary_file_left_as_a_link_is_not_written_through(secure_run, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    for path in secure_run.iterdir():
        (run / path.name).write_bytes(path.read_bytes())
    victim, shared = tmp_path / "notes.txt", tmp_path / "shared"
    victim.write_text("mine")
    shared.write_text("also mine")
    (run / "checkpoint.pt.tmp").symlink_to(victim)
    (run / "summary.json.tmp").symlink_to(victim)
    os.link(shared, run / "config.toml.tmp")
    assert main(["simulate", "--resume", str(run), "--quiet"]) == 0, capsys.readouterr().err
    assert victim.read_text() == "mine" and shared.read_text() == "also mine"
    assert not (run / CHECKPOINT).is_symlink()
    assert checkpoint.load_checkpoint(run)["algorithm"]["round"] == 3


# -- 4: a file system that keeps no locks ----------------------------------------------------------
@pytest.mark.parametrize("where", ["dir", "file"])
def test_4_a_file_system_without_locks_is_one_line(tmp_path, capsys, monkeypatch, where):
    import fcntl

    flock = fcntl.flock

    def no_locks(fd, op):
        if where == "file" and stat.S_ISDIR(
            os.fstat(fd if isinstance(fd, int) else fd.fileno()).st_mode
        ):
            return flock(fd, op)
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    out = tmp_path / "nfs" / "run"
    assert main(["simulate", str(PRESET), "--rounds", "1", "--out", str(out), "--quiet"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "cannot be locked (No locks available)" in err and "local disk" in err, err
    assert str(out) in err and not (tmp_path / "nfs").exists()
