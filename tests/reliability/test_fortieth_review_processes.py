"""Issue 15, fortieth hostile review (processes: locks, signals, deployment): tests.

1. A dataset directory copied with ``cp -al dA dB`` (as snapshot backups make), whose
   ``.stackoverflow.lock`` then shares one inode with ``dA``'s, while a process holds ``dA``'s
   lock (``data synth --out dA``, or a task generating there). Before: ``data synth --out dB
   --overwrite`` was refused, ``dataset directory dB is in use by process N`` (N the process
   working on ``dA``), and a task on ``dB`` waited for it (a ``flock`` is its inode's). Now a
   lock file hard-linked from another directory is detached from its name under an exclusive
   ``flock`` on its directory, which every holder of a lock file there shares while it holds
   it (``data.locks._DirectoryShare``, in ``exclusive_lock`` and ``file_lock``): ``dB`` gets a
   lock of its own, ``dA``'s file is untouched, and a second claim of ``dB`` (or of a directory
   whose held lock file was linked elsewhere) is refused as before.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from fedprivopt.data.locks import DATA_LOCK, LockHeldError, exclusive_lock, file_lock


def _linked_copy(tmp_path: Path) -> tuple[Path, Path]:
    """``dA`` with its lock file, and ``dB`` holding a hard link of it (``cp -al dA dB``)."""
    a, b = tmp_path / "dA", tmp_path / "dB"
    a.mkdir()
    b.mkdir()
    (a / DATA_LOCK).write_text("")
    os.link(a / DATA_LOCK, b / DATA_LOCK)
    return a, b


def test_hard_linked_data_lock_is_not_another_directorys(tmp_path):
    """Finding 1: ``dB``'s claim is not refused because ``dA``'s holder holds the inode."""
    a, b = _linked_copy(tmp_path)
    with exclusive_lock(a / DATA_LOCK, what=f"dataset directory {a}"):
        with exclusive_lock(b / DATA_LOCK, what=f"dataset directory {b}"):
            assert (b / DATA_LOCK).stat().st_ino != (a / DATA_LOCK).stat().st_ino
            assert (a / DATA_LOCK).read_text() == f"{os.getpid()}\n"  # dA's: its holder's
            with pytest.raises(LockHeldError, match="dB is in use by process"):
                with exclusive_lock(b / DATA_LOCK, what=f"dataset directory {b}"):
                    pass  # pragma: no cover
        with pytest.raises(LockHeldError, match="dA is in use by process"):
            with exclusive_lock(a / DATA_LOCK, what=f"dataset directory {a}"):
                pass  # pragma: no cover


def test_held_lock_linked_elsewhere_still_refuses_its_own_directory(tmp_path):
    """Finding 1: a held lock file hard-linked into another directory is never detached from
    the holder's own directory (the holder shares that directory's lock)."""
    _, b = _linked_copy(tmp_path)
    with exclusive_lock(b / DATA_LOCK, what=f"dataset directory {b}"):
        with pytest.raises(LockHeldError, match="dB is in use by process"):
            with exclusive_lock(b / DATA_LOCK, what=f"dataset directory {b}"):
                pass  # pragma: no cover
        assert (b / DATA_LOCK).stat().st_nlink == 2  # still dA's inode: nothing detached


def test_task_waiting_on_hard_linked_data_lock_takes_its_own(tmp_path):
    """Finding 1: ``file_lock`` (a task generating its files) on ``dB`` does not wait for the
    process holding ``dA``'s lock."""
    a, b = _linked_copy(tmp_path)
    entered = threading.Event()

    def task() -> None:
        with file_lock(b / DATA_LOCK):
            entered.set()

    with exclusive_lock(a / DATA_LOCK, what=f"dataset directory {a}"):
        thread = threading.Thread(target=task, daemon=True)
        thread.start()
        got = entered.wait(10)
    thread.join(10)  # released above: a waiting task gets in now
    assert got, "the task on dB waited for the holder of dA's lock"
    assert (a / DATA_LOCK).stat().st_nlink == 1 and (b / DATA_LOCK).stat().st_nlink == 1
