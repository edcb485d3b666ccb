"""Issue 15, forty-seventh hostile review (processes: signals, locks and processes): tests.

1. A token store's build killed (SIGKILL, the out-of-memory killer) before its store existed,
   then its source file replaced (``fedprivopt data synth --out D --overwrite``, or
   ``data.generate(D, config, overwrite=True)``: both call ``token_cache.remove_stores`` with
   the replaced file's key). Before: the part ``<digest>.tmp-<pid>`` (20 % of a build: 42 MB at
   80,000 users, the twenty-second review's measure) and its lock file stayed for ever: only a
   later build of the same key removed it, and a replaced file's key is never built again.
   Now ``remove_stores`` also removes every part whose key's lock is free (no build holds it);
   one being built is left alone.
"""

from __future__ import annotations

import os
import signal

from fedprivopt.data.locks import exclusive_lock
from fedprivopt.data.token_cache import file_key, open_or_build, remove_stores


def _killed_build(root, key) -> None:
    """A build of ``key`` under ``root`` SIGKILLed at its 30th user (in a forked child)."""

    def encode(user: int):
        if user == 30:
            os.kill(os.getpid(), signal.SIGKILL)
        return [[1, 2, 3]] * 3, [0, 1, 0]

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child is killed
        try:
            open_or_build(
                root, key, 100, encode, multi_label=False, token_bound=10, label_bound=5,
                workers=1,
            )  # fmt: skip
        finally:
            os._exit(3)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        if os.path.exists(f"/proc/{pid}"):  # pragma: no cover - only if waitpid was interrupted
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_1_a_killed_builds_part_goes_with_its_replaced_file(tmp_path) -> None:
    root = tmp_path / ".fedprivopt-cache"
    source = tmp_path / "stackoverflow.sqlite"
    source.write_bytes(b"old data")
    replaced = file_key(source)
    _killed_build(root, {"file": replaced, "encoding": 1})
    parts = list(root.glob("*.tmp-*"))
    assert len(parts) == 1  # what the kill left
    # another key's part being built (its lock held) is left alone
    building = root / ("ab" * 10 + ".tmp-1")
    building.mkdir()
    with exclusive_lock(root / ("ab" * 10 + ".lock"), what="a build"):
        assert remove_stores(root, replaced) == 0  # no store was complete
        assert building.is_dir()
    assert not parts[0].exists(), "a dead part of a replaced file's store was kept"
    assert not (root / (parts[0].name.split(".tmp-")[0] + ".lock")).exists()
