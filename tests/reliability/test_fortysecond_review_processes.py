"""Issue 15, forty-second hostile review (processes: signals, locks and processes): tests.

1. A stale PID in a data lock file. ``fedprivopt data synth --out D --clients 20000`` killed
   with SIGKILL (its ``D/.stackoverflow.lock`` keeps its PID: nothing empties it), that PID
   given to another process (a ``sleep`` in the reproducer, written into the file), then a run
   whose task generates its dataset into ``D`` (``simulate stackoverflow-tp-mini.toml --set
   task-params.data-dir=D``), which holds the lock with ``data.locks.file_lock``, and while it
   generates ``data synth --out D --clients 300 --overwrite``. Before: rc 2, ``dataset directory
   D is in use by process 2204 ...; wait for it to finish or stop it first``, 2204 the
   ``sleep``, not the run (2205): the user was told to stop an unrelated process (``file_lock``
   wrote no PID; a waiting task's line named the same stale PID). Now ``file_lock`` writes its
   holder's PID into a lock file of its own and empties it on release, as ``exclusive_lock``
   does (``locks._name_holder``); a user's file hard-linked in its place is still never
   written. (In-process: a second claim of a held lock is refused in the same process too.)
2. The Python API ``deploy_local(nodes=1, config_path="simulations/toy.toml", out=A/plots/sub)``
   with ``A`` a finished run (docs/DEPLOYMENT.md: "It validates everything first"), also
   ``out=L/sub`` with ``L`` a symbolic link to ``A/plots``; and the held-start twin (``A`` held
   with only ``run.lock`` written, ``--out L/sub``, which ``simulate`` and ``deploy local`` check
   with ``out_checks.refuse_inside_held``). Before: ``deploy.out_checks.check_out_claimable``
   (the API's gate) accepted both (the command line refuses them: ``is inside the run directory
   A``), so the deployment would start and its ServerApp write a run among ``A``'s files; the
   held check walked the parents as written only, so a link into the held run passed. Now
   ``ValueError``, ``argument --out: ... is inside the run directory A (it holds
   privacy_ledger.jsonl): ...``, before anything is written (``out_checks.refuse_inside_a_run``),
   and the held one names the holder; both look at the parents as written and as resolved
   (``run_places.ancestors``). (No Flower process is started.)
3. A Flower-engine run stopped after its last round and before its ``summary.json`` (``compare
   toy.toml --noise-multipliers 0.5,1 --engine flower --rounds 3 --tensorboard``, its process
   group sent SIGHUP as cell 2 wrote its rows: rc 129, cell 2 with 3 of 3 rounds and no
   summary), then the same command (``--quiet``), or ``simulate --resume X`` of such a run.
   Before: ``engines.run_flower`` started Flower and Ray for no round (37-41 s each), and once
   Ray's shutdown met a worker still starting: 6 lines of ``Fatal Python error: Aborted`` (a
   C++ mutex check) on the ``--quiet`` rerun's stderr. Now it returns ``rounds`` at once, as
   the fast engine does (measured: the resume 6.6 s, the summary as before); ``run_fast`` too,
   which started its ``fast-actors`` shards (Ray) for no round. (Flower's ``run_simulation``
   and the shards' start are replaced by ones that fail: nothing is started.)
4. A lock holder in another PID namespace (a container sharing the directory; ``unshare --pid
   --fork --mount-proc python -c "with exclusive_lock('D/.stackoverflow.lock'): sleep"``), then
   ``fedprivopt data synth --out D --clients 300`` outside it; and the reverse (the holder
   outside, ``data synth`` inside). Before: ``in use by process 1`` (the holder's own
   namespace's PID, written into the lock file: init here, which the user was told to stop);
   inside, the outer holder's PID, a process it cannot see. Now the PID is named only if
   ``/proc/locks`` shows it holding the file's ``flock`` (``locks.lock_holders``), else the holder
   it shows (the real one, 1784 in the reproducer), or, when it shows none and the file's PID
   names no process here, ``a process of another PID namespace (a container sharing this
   directory)``; ``deploy local``'s ``deploy.lock`` alike
   (``local_checks._pid_in``). (In-process: the lock file rewritten with ``1``, as such a holder
   writes it; ``/proc/locks`` replaced by a file for the hidden holder.)
"""

from __future__ import annotations

import os

import pytest

from fedprivopt.data import lock_holders
from fedprivopt.data.locks import DATA_LOCK, LockHeldError, exclusive_lock, file_lock
from fedprivopt.deploy.local_checks import DEPLOY_LOCK, LOG_DIR, check_not_deploying
from fedprivopt.deploy.out_checks import check_out_claimable, refuse_inside_held
from fedprivopt.simulation import engines
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.engines import run_fast, run_flower
from fedprivopt.simulation.run import build_run
from fedprivopt.simulation.rundir import NewRunDir, lock_directory

TOY = os.path.join(os.path.dirname(__file__), "..", "..", "simulations", "toy.toml")


def test_1_a_waiting_lock_names_its_holder_not_a_stale_pid(tmp_path):
    lock = tmp_path / DATA_LOCK
    stale = os.getppid()  # a live process that is not the holder: a dead holder's PID, reused
    assert stale != os.getpid()
    lock.write_text(f"{stale}\n")
    with file_lock(lock):
        assert lock.read_text().strip() == str(os.getpid())
        with pytest.raises(LockHeldError) as info:
            with exclusive_lock(lock, what="dataset directory D"):
                pass  # pragma: no cover - refused
        assert info.value.pid == os.getpid()
        assert f"in use by process {os.getpid()} " in str(info.value)
    assert lock.read_text() == ""  # emptied on release: no stale PID for the next refusal


def test_1_a_user_file_linked_as_the_lock_is_not_written(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    lock = tmp_path / DATA_LOCK
    os.link(notes, lock)
    with file_lock(lock):
        assert notes.read_text() == "my notes\n"
    assert notes.read_text() == "my notes\n"


def test_2_deploy_local_into_a_finished_run_is_refused(tmp_path):
    config = load_config(TOY)
    run = tmp_path / "A"
    (run / "plots").mkdir(parents=True)
    for name in ("privacy_ledger.jsonl", "config.toml", "run.lock"):
        (run / name).write_text("")
    link = tmp_path / "L"
    link.symlink_to(run / "plots")
    for out in (run / "plots" / "sub", link / "sub"):
        with pytest.raises(ValueError, match="is inside the run directory") as info:
            check_out_claimable(out, config)
        assert str(run) in str(info.value) and "\n" not in str(info.value)
        assert not out.exists()
    check_out_claimable(tmp_path / "elsewhere" / "sub", config)  # outside: as before


def test_2_a_link_into_a_held_start_is_inside_it(tmp_path):
    run = tmp_path / "A"
    run.mkdir()
    with NewRunDir(run):
        (run / "deep").mkdir()
        link = tmp_path / "L"
        link.symlink_to(run / "deep")
        with pytest.raises(LockHeldError, match=f"which process {os.getpid()} holds"):
            refuse_inside_held(link / "sub")


def test_3_a_flower_run_with_no_round_left_starts_nothing(monkeypatch):
    import flwr.simulation

    def started(*args, **kwargs):
        raise AssertionError("Flower's simulation (and Ray) started for a run with no round left")

    monkeypatch.setattr(flwr.simulation, "run_simulation", started)
    config = load_config(TOY, {"engine": "flower", "num-server-rounds": 2})
    task, alg = build_run(config)
    alg.round_num = 2  # as a resume finds a run stopped after its last round
    assert run_flower(config, task, alg, writer=None) == "rounds"


def test_3_a_fast_actors_run_with_no_round_left_starts_no_shard(monkeypatch):
    def started(*args, **kwargs):
        raise AssertionError("shards (and Ray) started for a run with no round left")

    monkeypatch.setattr(engines, "make_cohort_train", started)
    config = load_config(TOY, {"fast-actors": 1, "num-server-rounds": 2})
    task, alg = build_run(config)
    alg.round_num = 2
    assert run_fast(config, task, alg, writer=None) == "rounds"


def test_4_a_pid_of_another_namespace_is_not_named(tmp_path, monkeypatch):
    lock = tmp_path / DATA_LOCK
    with exclusive_lock(lock):
        lock.write_text("1\n")  # what a holder in a PID namespace of its own writes
        with pytest.raises(LockHeldError) as info:
            with exclusive_lock(lock, what="dataset directory D"):
                pass  # pragma: no cover - refused
        assert info.value.pid == os.getpid()  # the holder /proc/locks shows, not init
        # a holder this process cannot see: /proc/locks does not list it, and its PID (beyond
        # pid_max: no process here) names none of this namespace
        empty = tmp_path / "locks"
        empty.write_text("")
        monkeypatch.setattr(lock_holders, "_PROC_LOCKS", str(empty))
        lock.write_text(f"{2**22 + 1}\n")
        with pytest.raises(LockHeldError, match="a process of another PID namespace") as info:
            with exclusive_lock(lock, what="dataset directory D"):
                pass  # pragma: no cover - refused
        assert info.value.pid is None and str(2**22 + 1) not in str(info.value)


def test_4_a_deployments_pid_of_another_namespace_is_not_named(tmp_path):
    logs = tmp_path / "OUT" / LOG_DIR
    logs.mkdir(parents=True)
    with lock_directory(logs, DEPLOY_LOCK, what="--out OUT"):
        (logs / DEPLOY_LOCK).write_text("1\n")
        with pytest.raises(ValueError, match=f"in use by process {os.getpid()}, a deployment"):
            check_not_deploying(tmp_path / "OUT")
