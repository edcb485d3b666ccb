"""Issue 15, twenty-first hostile review: regression tests of its findings.

1. ``compare toy.toml --strategies dp-fedavg --rounds 1 --set target-epsilon=0.1`` (a budget
   below one round's ε in every cell; also with ``--metric eval_loss``): every run stopped at its
   budget before its first round, and ``compare`` ended with rc 2 and ``runs: none reports a task
   metric (one of ['eval_accuracy', 'eval_recall_at_5', 'eval_accuracy'])``: a line about the
   metric (listing one twice) for a call whose only problem is ``target-epsilon``. Now the line
   says that every run stopped at its privacy budget before its first round and names
   ``target-epsilon``; the metric's list names each metric once.
2. ``simulate toy.toml --engine flower --set ray-address=127.0.0.1:PORT`` where PORT accepts
   connections but is no Ray head's GCS (a silent listener; an HTTP server such as the Ray
   dashboard's port 8265, a common slip for the GCS port 6379): the start check only connected,
   and ``ray.init`` then retried for minutes (killed after 3 minutes, no line printed; Ray's 20
   retries of its key-value reads). Now the port must also answer an HTTP/2 preface as a gRPC
   server does (a SETTINGS frame) within 5 s: otherwise rc 2 before anything is written, one
   line naming ``ray-address`` and the GCS port (``simulation.cluster.check_reachable``). A real
   head is still joined (``tests/simulation/test_cluster.py``).
3. ``tune toy.toml --grid server-learning-rate=0.5,1 --mean-trials 1 --engine flower --set
   ray-address=127.0.0.1:1`` (no Ray head answers there; also a port that is no head, as in 2):
   every trial "failed" on the cluster check, and ``tune`` ended with rc 0, ``no trial
   released; epsilon = 8.278 for the tuning``: a tuning that trained nothing, with an ε, for a
   setting that fails every trial alike (the trial never started, so its failure says nothing
   about the data). ``compare`` printed its first cell's progress line and started the cell
   before the same refusal. Now every cell of a grid (``compare``, ``tune``, ``compare
   --tune-grid``) that would join a cluster has its address checked once before anything runs
   (``cells.plan_cells``, before a report is removed or a plan written): rc 2, one line naming
   the cell and ``ray-address``.
4. ``simulate stackoverflow-tp-mini.toml --set task-params.data-dir=D`` while ``data synth
   --out D --clients 300000`` writes D (or after it was suspended with Ctrl-Z): the task waits
   for the data directory's lock to generate or find the files, and waited without a word, for
   as long as the writer took, and forever for a suspended one (killed after 30 s, nothing on
   stderr). Now ``data.locks.file_lock`` says once on stderr that it waits, naming the holder's
   PID and the lock file, before it waits.
5. ``data synth --out D --clients 600000 --workers 2`` whose parent is killed with SIGKILL (the
   out-of-memory killer, ``kill -9``): its two forked workers (300 MB each) lived on for ever,
   blocked writing into a pipe whose read end they hold themselves, and kept the inherited
   descriptor of ``D/.stackoverflow.lock``: the next ``data synth --out D --overwrite`` was
   refused "in use by process N" (the dead parent), and a task generating into D waited for
   ever. Now such pool workers (the generator's and the token cache's) are killed by the
   kernel when their parent dies (``core.orphans.die_with_parent``, ``PR_SET_PDEATHSIG``).
6. A run's ``checkpoint.pt`` and ``checkpoint.prev.pt`` replaced by those of a run of another
   configuration (``local-learning-rate`` 0.4 against 0.5; a copy of the wrong directory's
   files), then ``simulate --resume``: rc 2, but ``checkpoint was written with a different
   configuration``, naming neither the file nor the key. Now ``R/checkpoint.pt: checkpoint was
   written with a different configuration (local-learning-rate = 0.4, this run has 0.5);
   refusing to resume`` (``ServerAlgorithm.load_state_dict`` names the first differing key,
   ``audit`` the file).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.reliability.test_fuzz_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"


def last_line_error(code: int, err: str, *parts: str) -> str:
    """rc 2, no traceback, and the last stderr line (after progress lines) holding ``parts``."""
    assert code == 2, err
    assert "Traceback" not in err and err.endswith("\n"), err
    line = err.splitlines()[-1]
    for part in parts:
        assert part in line, line
    return line


# -- finding 1: a comparison whose every run stopped at the budget before its first round -------
def test_1_compare_under_a_budget_below_one_round_names_target_epsilon(tmp_path):
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--quiet",
            "--set", "target-epsilon=0.1", "--out", str(out)]  # fmt: skip
    code, _, err = run_cli(argv)
    line = last_line_error(code, err, "target-epsilon", "before its first round")
    assert "none reports" not in line, line
    assert not (out / "summary.csv").exists()


def test_1_the_same_with_a_metric_given(tmp_path):
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--quiet",
            "--set", "target-epsilon=0.1", "--metric", "eval_loss", "--out", str(out)]  # fmt: skip
    code, _, err = run_cli(argv)
    line = last_line_error(code, err, "target-epsilon", "before its first round")
    assert "no run reports" not in line, line


def test_1_a_metric_no_run_reports_is_listed_once(tmp_path):
    from fedprivopt.simulation.rundata import RunData
    from fedprivopt.simulation.rundata_aggregate import choose_metric

    run = RunData(
        summary={"strategy": "dp-fedavg", "noise_multiplier": 0.5, "seed": 0, "epsilon": 1.0,
                 "delta": 1e-5, "primary_metric": "eval_accuracy", "rounds_completed": 1},
        rows=[{"round": 1, "epsilon": 1.0}],
        path=tmp_path,
    )  # fmt: skip
    try:
        choose_metric([run])
    except ValueError as exc:
        assert str(exc).count("'eval_accuracy'") == 1, exc
    else:
        raise AssertionError("a run without a task metric was accepted")


# -- finding 2: a ray-address whose port accepts but is no Ray head ----------------------------
@contextlib.contextmanager
def listener(reply: bytes | None):
    """A server on 127.0.0.1 that accepts and sends ``reply`` (``None``: says nothing)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop, held = threading.Event(), []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            if reply is not None:
                with contextlib.suppress(OSError):
                    conn.recv(4096)
                    conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


HTTP_400 = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize("reply", [None, HTTP_400], ids=["silent", "http"])
def test_2_a_port_that_is_no_ray_head_is_refused_at_once(reply):
    from fedprivopt.simulation.cluster import check_reachable

    with listener(reply) as port, pytest.raises(ValueError) as caught:
        check_reachable(f"127.0.0.1:{port}", "ray-address")
    assert "ray-address" in str(caught.value) and "GCS" in str(caught.value), caught.value


def test_2_simulate_joining_an_http_port_ends_in_one_line(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1",
               FLWR_HOME=str(tmp_path / "flwr"))  # fmt: skip
    env.pop("RAY_ADDRESS", None)
    with listener(HTTP_400) as port:
        argv = [sys.executable, "-m", "fedprivopt.cli", "simulate", str(TOY), "--engine",
                "flower", "--rounds", "1", "--quiet", "--out", str(out),
                "--set", f"ray-address=127.0.0.1:{port}"]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-2000:]
    assert "ray-address" in err and "GCS" in err, err
    assert not out.exists()


# -- finding 3: a tuning or comparison whose cluster does not answer ---------------------------
@pytest.mark.parametrize("reply", ["refused", HTTP_400], ids=["refused", "http"])
def test_3_a_tuning_whose_cluster_does_not_answer_is_refused_before_a_trial(tmp_path, reply):
    out = tmp_path / "t"
    with contextlib.ExitStack() as stack:
        if reply == "refused":
            probe = socket.create_server(("127.0.0.1", 0))
            port = probe.getsockname()[1]
            probe.close()  # a port where nothing listens now
        else:
            port = stack.enter_context(listener(reply))
        argv = ["tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "1",
                "--rounds", "1", "--seed", "1", "--quiet", "--engine", "flower", "--out", str(out),
                "--set", f"ray-address=127.0.0.1:{port}"]  # fmt: skip
        code, stdout, err = run_cli(argv)
    assert code == 2, (stdout, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "ray-address" in err and "trial-001" in err, err
    assert "no trial released" not in stdout, stdout
    assert not (out / "summary.json").exists()


def test_3_a_comparison_whose_cluster_does_not_answer_writes_nothing(tmp_path):
    out = tmp_path / "c"
    with listener(HTTP_400) as port:
        argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--quiet",
                "--out", str(out), "--set", "fast-actors=1",
                "--set", f"ray-address=127.0.0.1:{port}"]  # fmt: skip
        code, _, err = run_cli(argv)
    assert code == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "ray-address" in err and "dp-fedavg__sigma0.5__seed0" in err, err
    assert not out.exists()  # no cell started, and the empty runs/ is gone (twenty-third review)


# -- finding 4: a wait for a data directory's lock, said -------------------------------------
def test_4_a_wait_for_a_held_data_lock_is_said_once_naming_the_holder(tmp_path, capsys):
    from fedprivopt.data.locks import DATA_LOCK, exclusive_lock, file_lock

    path = tmp_path / DATA_LOCK
    entered = threading.Event()

    def wait_for_it() -> None:
        with file_lock(path):
            entered.set()

    err = ""
    with exclusive_lock(path):  # as data synth holds it: its PID is in the file
        waiter = threading.Thread(target=wait_for_it, daemon=True)
        waiter.start()
        for _ in range(100):  # the line comes before the wait
            err += capsys.readouterr().err
            if err:
                break
            threading.Event().wait(0.05)
        assert not entered.is_set()  # it still waits while the lock is held
    waiter.join(10)
    assert entered.is_set()
    assert f"waiting for process {os.getpid()}" in err and DATA_LOCK in err, err
    assert len(err.splitlines()) == 1, err


# -- finding 5: data synth's workers outliving a killed parent --------------------------------
def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_5_data_synth_workers_die_with_their_killed_parent(tmp_path):
    import signal

    from fedprivopt.data.locks import DATA_LOCK, exclusive_lock

    out = tmp_path / "d"
    argv = [sys.executable, "-m", "fedprivopt.cli", "data", "synth", "--out", str(out),
            "--clients", "600000", "--workers", "2"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            workers = _children(proc.pid)
        assert len(workers) == 2, "the workers did not start"
        time.sleep(0.5)  # past the pool's initializer
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(w) for w in workers), "workers outlived their killed parent"
        with exclusive_lock(out / DATA_LOCK):  # nobody holds the directory's lock any more
            pass
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# -- finding 6: a checkpoint of another configuration, named -----------------------------------
def test_6_a_checkpoint_of_another_run_is_refused_naming_file_and_key(tmp_path):
    import shutil

    runs = {}
    for name, rate in (("a", "0.5"), ("b", "0.4")):
        runs[name] = tmp_path / name
        argv = ["simulate", str(TOY), "--rounds", "2", "--quiet", "--out", str(runs[name]),
                "--set", f"local-learning-rate={rate}"]  # fmt: skip
        code, _, err = run_cli(argv)
        assert code == 0, err
    for file in ("checkpoint.pt", "checkpoint.prev.pt"):
        shutil.copyfile(runs["b"] / file, runs["a"] / file)
    config = runs["a"] / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 2", "num-server-rounds = 3"))
    code, _, err = run_cli(["simulate", "--resume", str(runs["a"]), "--quiet"])
    assert code == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "checkpoint.pt" in err and "local-learning-rate = 0.4" in err, err
