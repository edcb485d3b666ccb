"""A real Flower deployment on loopback: SuperLink + SuperNodes as processes, TLS, node keys.

These tests start Flower's own processes (``flower-superlink``, ``flower-supernode``, the
SuperExecs and the ServerApp/ClientApp processes they launch), so they take tens of seconds each
on a 2-core machine. Every process is found and stopped by PID; the tests check none is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedprivopt.deploy import deploy_local
from fedprivopt.deploy.local import REPO_ROOT
from fedprivopt.models import build_task, initial_flat
from fedprivopt.privacy import compose_epsilon, make_round_event
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import read_rows
from fedprivopt.simulation.run import simulate
from tests.deploy.faulty_app import faulty_app_dir
from tests.deploy.task_app import REF, app_with_task
from tests.procs import default_sigint

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(
    not (BIN / "flower-superlink").exists() or not (BIN / "flower-supernode").exists(),
    reason="Flower's deployment commands are not installed next to this interpreter",
)

USERS = 6
RUN = {
    "strategy": "dp-fedadam",
    "population": USERS,
    "clients-per-round": 3,
    "num-server-rounds": 2,
    "noise-multiplier": 1.0,
    "clip-norm": 1.0,
    "delta": 1e-3,
    "seed": 0,
    "server-learning-rate": 0.1,
    "local-learning-rate": 0.5,
    "local-epochs": 1,
    "batch-size": 16,
    "eval-every": 1,
    "task": "toy",
    "task-params.num-users": USERS,
    "task-params.seed": 0,
}


@pytest.fixture(autouse=True)
def _small_processes(monkeypatch):
    """Tiny models: one torch thread per Flower process is faster on a busy 2-core machine."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _assert_nothing_left(out: Path) -> list[dict]:
    records = json.loads((out / "deploy" / "processes.json").read_text())
    assert {"superlink", "supernode"} <= {r["role"] for r in records}
    left = [r for r in records if not _gone(int(r["pid"]))]
    assert not left, f"processes left behind: {left}"
    return records


# A task referenced by module path (issue 18), carried in the app's FAB: the minimal task
# implements exactly the documented Task protocol. The same deployment runs adaptive clipping: the
# clip bits travel on the wire, and round 2 runs at the clip norm round 1's noised count chose.
# (The referenced task and adaptive clipping each had a deployment test of their own, about 60 s
# of the suite apiece; each round costs about 10 s of SuperNode polling and ClientApp start.)
TASK_RUN = {
    **RUN,
    "population": 4,
    "clients-per-round": 2,
    "num-server-rounds": 2,
    "batch-size": 4,
    "task": REF,
    "task-params.num-users": 4,
    "task-params.seed": 3,
    "clip-norm": 0.05,
    "adaptive-clipping": True,
    "clip-count-stddev": 1.0,
    "clip-learning-rate": 0.5,
}


def test_tls_deployment_of_a_referenced_task_with_adaptive_clipping_matches_the_simulation(
    tmp_path, monkeypatch
):
    app = app_with_task(tmp_path / "app")
    monkeypatch.chdir(tmp_path)  # the module is importable only from the FAB, not from here
    t0 = time.perf_counter()
    out = deploy_local(
        nodes=2,
        tls=True,
        overrides=TASK_RUN,
        out=str(tmp_path / "deploy"),
        timeout=420,
        app_dir=app,
    )
    seconds = time.perf_counter() - t0
    assert out == (tmp_path / "deploy").resolve()

    # everything it started (and what Flower started under it) is gone
    records = _assert_nothing_left(out)
    link = next(r for r in records if r["role"] == "superlink")["cmd"]
    assert (
        "--ssl-certfile" in link and "--enable-supernode-auth" in link and "--insecure" not in link
    )
    nodes = [r["cmd"] for r in records if r["role"] == "supernode"]
    assert len(nodes) == 2
    assert all("--root-certificates" in c and "--auth-supernode-private-key" in c for c in nodes)
    assert {c.split("--node-config ")[1].split(" --")[0] for c in nodes} == {
        f"partition-id={i} num-partitions=2" for i in range(2)
    }

    # the same files as `fedprivopt simulate`; the round moved the model (one noised round of
    # this task need not lower its loss: the simulation below trained the same model)
    summary = json.loads((out / "summary.json").read_text())
    rows = read_rows(out / "metrics.jsonl")
    assert summary["task"] == REF
    assert summary["rounds_completed"] == 2 and summary["stopped_reason"] == "rounds"
    assert summary["runtime"] == "flower-deployment"
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["rejected"] == 0 and r["node_errors"] == 0 for r in rows)
    assert rows[0]["clip_norm"] == 0.05 and rows[-1]["clip_norm"] != 0.05

    # epsilon is what `fedprivopt epsilon` computes for the same q, sigma, rounds, delta
    expected = compose_epsilon([(make_round_event(1.0, sample_rate=2 / 4), 2)], RUN["delta"])
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert rows[-1]["epsilon"] == pytest.approx(expected, rel=1e-9)

    # the same configuration simulated in process ends with the same model
    monkeypatch.chdir(REPO_ROOT)
    config = load_config(out / "config.toml", {"engine": "fast"})
    sim = simulate(config, tmp_path / "sim")
    deployed_state = torch.load(out / "checkpoint.pt", weights_only=True)["algorithm"]
    deployed = deployed_state["params"]
    simulated = torch.load(tmp_path / "sim" / "checkpoint.pt", weights_only=True)["algorithm"]
    assert deployed.shape == simulated["params"].shape
    assert not torch.equal(deployed, initial_flat(build_task(REF, num_users=4, seed=3)))
    torch.testing.assert_close(deployed, simulated["params"], rtol=0, atol=1e-6)
    assert sim.epsilon == pytest.approx(summary["epsilon"], rel=1e-12)
    assert deployed_state["clip_states"] == simulated["clip_states"]
    for mine, theirs in zip(rows, sim.rows, strict=True):
        assert mine["eval_loss"] == pytest.approx(theirs["eval_loss"], abs=1e-5)
        assert mine["cohort_size"] == theirs["cohort_size"]
        assert mine["clip_norm"] == theirs["clip_norm"]
    print(f"TLS deployment, 2 SuperNodes, 2 rounds: {seconds:.1f} s")


def test_crashing_and_slow_nodes_do_not_stop_the_server(tmp_path):
    # every user is sampled (q = 1); with 3 SuperNodes node i hosts users i and i + 3. Node 0
    # crashes when asked to train user 0; node 1 sleeps 120 s before answering (fault "slow"),
    # longer than round-timeout = 20 s (a healthy node's first reply takes several seconds: its
    # ClientApp process starts). The round completes with node 2's two users, the others are
    # counted by cause, and the accounting of the sampling is unchanged. The faults come from the
    # tests' own Flower app, whose ClientApp component wraps the deployment ClientApp.
    run = {**RUN, "clients-per-round": USERS, "num-server-rounds": 1, "round-timeout": 20.0}
    app = faulty_app_dir(tmp_path / "app", "0:raise,1:slow")
    out = deploy_local(
        nodes=3, tls=False, overrides=run, out=str(tmp_path / "d"), timeout=420, app_dir=app
    )
    records = _assert_nothing_left(out)
    assert all("--insecure" in r["cmd"] for r in records if r["role"] in ("superlink", "supernode"))
    summary = json.loads((out / "summary.json").read_text())
    (row,) = read_rows(out / "metrics.jsonl")
    assert summary["rounds_completed"] == 1
    assert row["cohort_size"] == USERS
    assert row["node_errors"] == 1 and row["failed"] == 2  # node 0: users 0 and 3
    assert row["timed_out"] == 2  # node 1: users 1 and 4
    assert row["received"] == 2  # node 2: users 2 and 5
    assert summary["epsilon"] == pytest.approx(
        compose_epsilon([(make_round_event(1.0, sample_rate=1.0), 1)], RUN["delta"]), rel=1e-9
    )


def test_ctrl_c_stops_every_process(tmp_path):
    out = tmp_path / "interrupted"
    script = (
        "import sys\n"
        "from fedprivopt.deploy import deploy_local\n"
        "try:\n"
        f"    deploy_local(nodes=1, tls=False, overrides={{'population': {USERS}, "
        f"'task-params.num-users': {USERS}, 'clients-per-round': 3}}, out={str(out)!r}, "
        "timeout=300, progress=lambda s: print(s, flush=True))\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "    sys.exit(130)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO_ROOT,
        preexec_fn=default_sigint,
    )
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "SuperNodes" in line:  # the SuperLink and the SuperNode are running
                proc.send_signal(signal.SIGINT)
                break
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, "".join(lines) + rest
    _assert_nothing_left(out)
    assert not (out / "summary.json").exists()
