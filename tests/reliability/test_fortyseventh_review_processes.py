"""Issue 15, forty-seventh hostile review (processes: signals, locks and processes): tests.

1. A token store's build killed (SIGKILL, the out-of-memory killer) before its store existed,
   then its source file replaced (``fedprivopt data synth --out D --overwrite``, or
   ``data.generate(D, config, overwrite=True)``: both call ``token_cache.remove_stores`` with
   the replaced file's key). Before: the part ``<digest>.tmp-<pid>`` (20 % of a build: 42 MB at
   80,000 users, the twenty-second review's measure) and its lock file stayed for ever: only a
   later build of the same key removed it, and a replaced file's key is never built again.
   Now ``remove_stores`` also removes every part whose key's lock is free (no build holds it);
   one being built is left alone.
2. A lock holder suspended (``data synth --out D`` stopped with Ctrl-Z, or SIGSTOP), then
   ``data synth --out D --overwrite`` (or ``simulate --resume R`` of a suspended run, every
   command's claim of a held directory). Before: ``dataset directory D is in use by process N
   (lock file ...); wait for it to finish or stop it first``: a suspended process never
   finishes until resumed; a task that waits for the lock said only that "a suspended process"
   must be resumed. Now the refusal and the wait say that process N is suspended (Ctrl-Z or
   SIGSTOP) and how to resume it (``fg``, or ``kill -CONT N``) or stop it
   (``lock_holders.suspended``, read from ``/proc/N/stat``).
3. The deployment ServerApp reached by ``flwr run`` without ``deploy local`` (the forty-third
   review follow-up's open row), run config ``out`` inside what another process writes:
   ``C/runs/<cell>`` while ``compare --out C`` runs, ``R/sub`` while ``R`` holds only
   ``run.lock``. Before: ``run_deployment`` claimed it (it made ``C/runs/cell`` and went on to
   the grid). Now ``ValueError`` naming ``out`` and the holder, as ``simulate`` and ``deploy
   local`` refuse it (``run_places.refuse_inside_held``, ``refuse_inside_writing``; strict
   ancestors, so a deployment's own ``OUT/deploy`` passes).
4. Processes 3's twin: the task's ``data-dir`` (or ``cache-dir``) inside that ``out``. Before:
   the task was built first and generated its dataset into ``OUT/data``, then ``OUT`` was
   refused as not empty (the dataset left there). Now ``check_task_dirs_outside`` refuses it
   before the task is built, as ``simulate`` and ``deploy local`` do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from fedprivopt.data.lock_holders import suspended
from fedprivopt.data.locks import LockHeldError, exclusive_lock
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


_HOLD = (
    "import sys\n"
    "from fedprivopt.data.locks import exclusive_lock\n"
    "with exclusive_lock(sys.argv[1], what='dataset directory'):\n"
    "    print('held', flush=True)\n"
    "    sys.stdin.read()\n"
)


def test_2_a_suspended_holder_is_named_so_with_how_to_resume_it(tmp_path) -> None:
    lock = tmp_path / ".stackoverflow.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(LockHeldError, match="wait for it to finish") as running:
            with exclusive_lock(lock, what=f"dataset directory {tmp_path}"):
                pass
        assert "which is suspended" not in str(running.value)
        os.kill(holder.pid, signal.SIGSTOP)  # Ctrl-Z of data synth --out D
        while not suspended(holder.pid):  # the kernel stops it at once; poll the state
            time.sleep(0.001)
        with pytest.raises(LockHeldError) as refused:
            with exclusive_lock(lock, what=f"dataset directory {tmp_path}"):
                pass
        assert refused.value.pid == holder.pid
        text = str(refused.value)
        assert f"process {holder.pid}, which is suspended (Ctrl-Z or SIGSTOP)" in text, text
        assert f"kill -CONT {holder.pid}" in text and "wait for it to finish" not in text
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)


def test_3_the_server_app_refuses_an_out_inside_what_another_process_writes(tmp_path) -> None:
    import types

    from fedprivopt.deploy.local import REPO_ROOT
    from fedprivopt.deploy.runconfig import app_config_defaults
    from fedprivopt.deploy.server_app import run_deployment
    from fedprivopt.simulation.cells import lock_compare_dir
    from fedprivopt.simulation.rundir import NewRunDir

    def serve(out) -> None:  # a ServerApp reached by flwr run, run config out = ...
        run_config = {**app_config_defaults(REPO_ROOT), "out": str(out)}
        run_deployment(None, types.SimpleNamespace(run_config=run_config, run_id=7))

    comparison = tmp_path / "C"
    comparison.mkdir()
    with lock_compare_dir(comparison):  # compare --out C running
        with pytest.raises(ValueError, match=r"argument out: .*/C/runs/cell is inside the comp"):
            serve(comparison / "runs" / "cell")  # refused before the grid is used
    assert not (comparison / "runs").exists()
    with NewRunDir(tmp_path / "R"):  # a run another process is starting (run.lock alone)
        with pytest.raises(ValueError, match=r"argument out: .*/R/sub"):
            serve(tmp_path / "R" / "sub")
    assert not (tmp_path / "R" / "sub").exists()


def test_4_the_server_app_refuses_a_task_directory_inside_its_out(tmp_path) -> None:
    import json
    import types

    from fedprivopt.deploy.local import REPO_ROOT
    from fedprivopt.deploy.runconfig import app_config_defaults
    from fedprivopt.deploy.server_app import run_deployment

    out = tmp_path / "out"
    params = {"data-dir": str(out / "data"), "synthetic": True, "synth-clients": 60}
    params.update({"num-users": 40, "eval-users": 10, "vocab-size": 200, "num-tags": 10})
    run_config = {
        **{k: v for k, v in app_config_defaults(REPO_ROOT).items() if "task-params." not in k},
        "task": "stackoverflow-tp",
        "population": 40,
        "task-params-json": json.dumps(params),
        "out": str(out),
    }
    context = types.SimpleNamespace(run_config=run_config, run_id=7)
    with pytest.raises(ValueError, match=r"task-params\.data-dir = .* is inside .*/out"):
        run_deployment(None, context)  # before the task is built (it would generate there)
    assert not out.exists()
