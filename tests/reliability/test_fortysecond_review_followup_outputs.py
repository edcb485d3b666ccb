"""Issue 15, forty-second hostile review, follow-up (outputs: today's fixes of bad input, the
data readers, locks, signals, processes and deployment): tests.

1. Input 5's variant through the Python API of a deployment:
   ``deploy_local(nodes=1, config_path=toy.toml, out="~nosuchuser/x")`` (a ``~user`` of no user
   of the machine; also a ``pathlib.Path``). Input 5 refused it on the command line
   (``cli_args.check_path_text``) and as a task's directory, but the API took it to
   ``local_checks.check_not_deploying``. Before: pathlib's ``RuntimeError: Could not determine
   home directory.`` (the documented ``ValueError`` naming the argument is what every other
   bad ``out`` gets). Now ``local_checks.check_out`` refuses it naming ``--out``, as the command
   line does, before anything is written or started (no Flower, no Ray).
2. Processes 4's case between two sibling PID namespaces (two containers sharing a directory,
   neither seeing the other; here ``unshare --pid --fork --mount-proc`` twice): one holds
   ``exclusive_lock(D/.stackoverflow.lock)`` and writes its PID there, 1 (its namespace's init),
   the other runs ``data synth --out D``. Processes 4 named the holder only where
   ``/proc/locks`` shows it, but its follow-up (bb4da9e: for a sandbox whose ``/proc/locks``
   lists nothing) named the file's PID again whenever ``/proc/locks`` lists no holder and the
   PID is alive here, which PID 1 always is. ``/proc/locks`` hides the other namespace's lock.
   Before: rc 2 ``dataset directory D is in use by process 1``, the refused process itself
   (init of its namespace); the same in a task's ``waiting for process 1`` and deploy local's
   ``deploy.lock``. Now ``locks.named_holder`` names the file's PID without a listed holder only
   where ``/proc/locks`` does not list this process's own ``flock`` either (a probe on an
   anonymous file, ``_lists_own_locks``): ``a process of another PID namespace (a container
   sharing this directory)``; a /proc/locks that lists nothing still names it (as bb4da9e).
   Needs ``unshare`` (root); skipped elsewhere.
3. Processes 3's case by the budget: a run whose target epsilon allows no further round
   (``simulate toy.toml --rounds 3 --set target-epsilon=0.01 --set engine=flower``: one round
   costs 6.19; also such a run stopped after its last allowed round and before its summary, then
   ``--resume``; the fast engine with ``fast-actors``). Processes 3 returned at once only when
   no round was left by ``num-server-rounds``. Before: ``run_flower`` started Flower and Ray to
   release nothing (``0 rounds (budget)`` after 36.6 s) and ``run_fast`` joined a cluster and
   started its actor shards for none. Now both return ``budget`` before anything starts
   (``engines._nothing_left``), as the loops would at their first round. Here ``join_cluster``
   is replaced by one that fails, so neither Ray nor Flower is started by the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedprivopt.data import lock_holders
from fedprivopt.data.locks import DATA_LOCK, LockHeldError, exclusive_lock
from fedprivopt.deploy.local import deploy_local
from fedprivopt.simulation import engines
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import simulate

REPO = Path(__file__).resolve().parents[2]
TOY = str(REPO / "simulations" / "toy.toml")
NO_USER = "~fedprivopt-no-such-user-42"


@pytest.mark.parametrize("kind", [str, Path])
def test_1_deploy_local_out_of_a_user_of_none(tmp_path, monkeypatch, kind):
    assert os.path.expanduser(NO_USER) == NO_USER  # no such user here
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setenv("FLWR_DISABLE_UPDATE_CHECK", "1")
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))
    with pytest.raises(ValueError, match=r"argument --out: .*starts with ~, but names no user"):
        deploy_local(nodes=1, config_path=TOY, out=kind(f"{NO_USER}/x"))
    assert os.listdir(tmp_path) == []  # nothing written, nothing started


_UNSHARE = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
_HOLD = (
    "import sys\nfrom fedprivopt.data.locks import exclusive_lock\n"
    "with exclusive_lock(sys.argv[1]):\n    print('held', flush=True)\n    sys.stdin.read()\n"
)
_CLAIM = (
    "import sys\nfrom fedprivopt.data.locks import exclusive_lock\n"
    "try:\n    with exclusive_lock(sys.argv[1], what='dataset directory D'):\n"
    "        print('taken')\nexcept ValueError as exc:\n    print(exc)\n"
)


def _namespaces() -> bool:
    try:
        done = subprocess.run([*_UNSHARE, "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def test_2_a_holder_in_a_sibling_pid_namespace_is_not_init(tmp_path):
    if not _namespaces():
        pytest.skip("unshare --pid --mount-proc is not permitted here")
    lock = str(tmp_path / DATA_LOCK)
    holder = subprocess.Popen(
        [*_UNSHARE, sys.executable, "-c", _HOLD, lock],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert Path(lock).read_text().strip() == "1"  # its own namespace's PID
        claim = subprocess.run(
            [*_UNSHARE, sys.executable, "-c", _CLAIM, lock],
            capture_output=True,
            text=True,
            timeout=60,
        )
        said = claim.stdout.strip()
        assert "in use by" in said and "process 1 " not in said, said
        assert "a process of another PID namespace" in said
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=20)
        except subprocess.TimeoutExpired:  # pragma: no cover - stopped by its PID
            holder.kill()
            holder.wait()


def test_2_a_proc_locks_listing_nothing_still_names_the_files_pid(tmp_path, monkeypatch):
    """A sandbox whose /proc/locks lists nothing (bb4da9e): the live PID in the file is named."""
    empty = tmp_path / "locks"
    empty.write_text("")
    monkeypatch.setattr(lock_holders, "_PROC_LOCKS", str(empty))
    lock = tmp_path / DATA_LOCK
    with exclusive_lock(lock):
        with pytest.raises(LockHeldError, match=f"in use by process {os.getpid()} ") as info:
            with exclusive_lock(lock, what="dataset directory D"):
                pass  # pragma: no cover - refused
    assert info.value.pid == os.getpid()


@pytest.mark.parametrize(
    "overrides",
    [{"engine": "flower"}, {"engine": "fast", "fast-actors": 2}],
    ids=["flower", "fast-actors"],
)
def test_3_no_engine_is_started_when_the_budget_allows_no_round(tmp_path, monkeypatch, overrides):
    def started(config):
        raise AssertionError("Ray or Flower was started for no round")

    monkeypatch.setattr(engines, "join_cluster", started)
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setenv("FLWR_DISABLE_UPDATE_CHECK", "1")
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))
    config = load_config(TOY, {"num-server-rounds": 3, "target-epsilon": 0.01, **overrides})
    outcome = simulate(config, tmp_path / "run")
    assert (outcome.rounds_completed, outcome.stopped_reason) == (0, "budget")
    assert outcome.epsilon == 0
