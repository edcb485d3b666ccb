"""Issue 15, thirty-fourth hostile review (the deployment): regression tests.

1. ``deploy local toy.toml --nodes 1 --insecure --rounds 1 --out 'runs/x-{run_id}'`` (the app's
   default ``out`` in ``pyproject.toml`` is ``runs/deploy/{run_id}``, docs/DEPLOYMENT.md): the
   ServerApp replaced the placeholder and wrote the whole run into ``runs/x-<Flower's run id>``
   while the deployment waited for ``runs/x-{run_id}/summary.json``; when the run ended it said
   ``fedprivopt deploy local: failed: run N ended (finished:completed: N/A) without writing
   .../runs/x-{run_id}/summary.json; ServerApp log:`` and 40 lines of log, rc 1, for a run
   that had finished (ε 8.607) in another directory, and left ``runs/x-{run_id}/deploy``. Now
   rc 2 before anything is written or started, one line naming ``--out`` and the placeholder
   (``deploy.local.check_out``, also in the Python API's ``deploy_local``).
2. The thirty-third review's open item: ``deploy local --set vectorize=false`` (also
   ``engine=fast``, ``client-cpus=3``, ``client-gpus``, ``ray-cpus``, ``cohort-chunk``,
   ``fast-actors=2``) was accepted and ignored without a word, and ``--set
   ray-address=127.0.0.1:6379`` was refused with the fast engine's advice ``(set fast-actors,
   or leave ray-address unset)``, after which (``--set fast-actors=1``) it was accepted and
   ignored too. Decided per key: given with ``--set``, every simulation-only key is refused
   (rc 2, one line naming the keys: a deployment has no Ray and no fast engine), except
   ``engine=flower`` (what a deployment is); a preset's own values (a cluster's preset with
   ``ray-address`` and ``fast-actors``; every preset's ``engine``, left out) are said to be
   ignored in one ``note:`` line, as ``simulate`` notes keys its strategy does not use.
3. Files of ``OUT/deploy`` (kept from a failed deployment and appended to) read whole:
   ``deploy local toy.toml --out D`` where ``D/deploy/processes.json`` is a sparse 20 GB file
   (``truncate -s 20G``): a ``MemoryError`` traceback, rc 1, after 15 s under a 4 GB address
   space limit (the whole file read to check it is an earlier deployment's record); the
   SuperLink's log was read whole every 0.3 s while the SuperNodes came up, an earlier
   deployment's activations counted as this one's; a failing process's last 40 lines were taken
   from its whole log; and the run's ``metrics.jsonl`` was read whole every 0.25 s for the
   progress lines (up to 10**6 rounds). Now ``processes.json`` is read up to 16 MiB (a larger
   one is not ours: rc 2, one line naming it), a log's tail from its last 64 kB, and the
   SuperLink's log (from where this deployment's part begins) and ``metrics.jsonl`` line by
   line as they grow, each part once (``session._NewLines``).
4. (Left to the lead, whose file holds the fix: see the report.) ``deploy local toy.toml --set
   tau=0.1 --set side-information.kind=public-users`` (dp-fedavg uses neither) deploys without a
   word, where ``simulate`` says ``note: dp-fedavg does not use side-information, tau (...)``;
   ``cli_runs._note_unused`` is private to its module (``tests/test_layers.py``).
5. Two ``deploy local toy.toml --nodes 1 --out D`` at once, the second started when the first
   said ``run N started``: the second passed every check (``D`` held only the first's
   ``deploy/`` logs), started its own SuperLink and SuperNode and submitted its run, whose
   ServerApp was refused by the first's run lock; it ended rc 1 with 40 lines of the shared
   ServerApp log (the first's rounds among them) and the advice ``every process was stopped;
   the run can be continued with fedprivopt simulate --resume D`` while the first was still
   writing that run (both wrote the same logs and ``processes.json``). Started once the first's
   ``config.toml`` is written, the claim check called it a run to resume. Now a deployment
   holds ``D/deploy/deploy.lock`` (``rundir.lock_directory``, with its PID) until every process
   is stopped, and ``deploy local`` (and ``deploy_local``) asks it first, before anything is
   written: rc 2, ``argument --out: 'D' is in use by process N, a deployment into it (lock
   file ...); wait for it to finish or stop it first``. The lock file left behind (empty) is one
   of the deployment's files; a user's ``deploy.lock`` with other text is refused as before.
6. ``https_proxy=http://proxy:3128 fedprivopt deploy local toy.toml --nodes 1`` (any of
   ``http_proxy``, ``https_proxy``, ``ALL_PROXY`` set, as behind a proxy; here
   ``http://127.0.0.1:9``): Flower's processes sent their connections to 127.0.0.1 through the
   proxy, and ``flwr supernode register`` failed: rc 1, ``Connection to the SuperLink is
   unavailable. Please check your network connection and 'address' in the SuperLink connection
   configuration`` (a real proxy would have been handed the deployment's traffic). Now every
   process of the deployment gets ``NO_PROXY`` and ``no_proxy`` (and ``no_grpc_proxy`` when
   set) with 127.0.0.1 and ``localhost`` added to what they held; the same command ran to
   rc 0.
7. ``deploy local toy.toml --nodes 2 --timeout 259200`` (3 days; ``--timeout`` takes up to
   30): the deployment's CA and SuperLink certificate were made valid for 2 days whatever the
   timeout, so a longer deployment's TLS handshakes (the SuperNodes' connections to the
   SuperLink, each ClientApp's to its node, which uses the same certificate) would fail midway
   on an expired certificate (read from the code; not waited for). Now they are valid until the
   deadline and a day more (``local._tls_days``).
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from fedprivopt.deploy import local as deploy_module
from fedprivopt.deploy import local_checks
from fedprivopt.deploy.cli import _check_log_dir
from fedprivopt.deploy.local import REPO_ROOT, deploy_local, resolve_deployment
from fedprivopt.deploy.runconfig import SIMULATION_ONLY_KEYS
from fedprivopt.deploy.session import Deployment, _tail, wait_nodes
from fedprivopt.simulation.rundir import lock_directory
from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_misuse_cli import TOY, usage_error

SMALL = ["--set", "population=6", "--set", "task-params.num-users=6",
         "--set", "clients-per-round=3"]  # fmt: skip


def _deploy(out: Path, *extra: str, preset: Path | str = TOY) -> tuple[int, str, str]:
    return run_cli(["deploy", "local", "--nodes", "1", "--insecure", str(preset), "--rounds",
                    "1", "--out", str(out), "--quiet", *extra])  # fmt: skip


@pytest.fixture
def no_deployment(monkeypatch):
    """``deploy_local`` replaced by a failure: what the command says before it starts anything."""
    calls = []

    def refuse(**kwargs):
        calls.append(kwargs)
        raise RuntimeError("not started (test)")

    monkeypatch.setattr(deploy_module, "deploy_local", refuse)
    return calls


def test_1_an_out_with_the_run_id_placeholder_is_refused_before_anything(tmp_path, no_deployment):
    out = tmp_path / "x-{run_id}"
    line = usage_error(_deploy(out, *SMALL), "argument --out", "{run_id}")
    assert "x-{run_id}" in line, line
    assert not no_deployment and list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match=r"\{run_id\}"):  # the Python API too, first
        deploy_local(nodes=1, tls=False, out=str(out), app_dir=tmp_path)
    _deploy(tmp_path / "plain", *SMALL)  # the same without it reaches the deployment
    assert len(no_deployment) == 1


SIMULATION_SETTINGS = ("engine=fast", "client-cpus=3", "client-gpus=0.5", "ray-cpus=2",
                       "vectorize=false", "cohort-chunk=4", "fast-actors=2",
                       "ray-address=127.0.0.1:6379")  # fmt: skip


@pytest.mark.parametrize("setting", SIMULATION_SETTINGS)
def test_2_a_simulation_only_key_given_with_set_is_refused(tmp_path, no_deployment, setting):
    key = setting.split("=")[0]
    line = usage_error(_deploy(tmp_path / "d", *SMALL, "--set", setting), "argument --set", key)
    assert "deployment" in line and "fast-actors >= 1" not in line, line
    assert not no_deployment and not (tmp_path / "d").exists()


def test_2_engine_flower_is_taken_and_a_presets_own_keys_are_noted(tmp_path, no_deployment):
    config, _, _ = resolve_deployment(str(TOY), {"engine": "flower"}, REPO_ROOT)
    assert config.engine == "flower"
    preset = tmp_path / "cluster.toml"
    preset.write_text(
        TOY.read_text().replace('engine = "fast"', 'engine = "fast"\nvectorize = false\n'
                                'fast-actors = 2\nray-address = "127.0.0.1:6379"')
    )  # fmt: skip
    code, _, err = _deploy(tmp_path / "d", *SMALL, preset=preset)
    assert code == 1 and len(no_deployment) == 1, err
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1, err
    assert all(key in notes[0] for key in ("ray-address", "vectorize", "fast-actors")), notes
    assert "engine" not in notes[0].split("(")[0], notes
    code, _, err = _deploy(tmp_path / "d", *SMALL)  # toy.toml's engine = "fast": no note
    assert code == 1 and "note:" not in err, err
    assert set(SIMULATION_ONLY_KEYS) >= {"ray-address", "vectorize", "fast-actors", "engine"}


def _peak(call) -> tuple[int, object]:
    """The peak of memory traced while ``call()`` ran, and its result or ``ValueError``."""
    tracemalloc.start()
    try:
        try:
            result = call()
        except ValueError as exc:
            result = exc
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def _sparse(path: Path, size: int, tail: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        fh.truncate(size)
        fh.seek(size)
        fh.write(tail)
    return path


def test_3_a_huge_processes_json_and_logs_are_not_read_whole(tmp_path):
    record = _sparse(tmp_path / "D" / "deploy" / "processes.json", 64 * 2**20)
    usage_error(_deploy(tmp_path / "D", *SMALL), "processes.json", "choose another --out")
    peak, refused = _peak(lambda: _check_log_dir(record.parent))
    assert isinstance(refused, ValueError) and "processes.json" in str(refused), refused
    assert peak < 32 * 2**20, peak  # 64 MiB read whole before (a 20 GB one a MemoryError)
    log = _sparse(tmp_path / "big.log", 64 * 2**20, b"\n".join(b"line %d" % i for i in range(50)))
    peak, tail = _peak(lambda: _tail(log))
    assert peak < 8 * 2**20, peak
    assert tail.splitlines() == [f"line {i}" for i in range(10, 50)]


class _Deployment:
    """What ``wait_nodes`` uses of a deployment; each check appends a line to the link's log."""

    def __init__(self, log: Path, lines: list[bytes]) -> None:
        self.log, self.lines, self.asked_after = log, lines, []
        self.procs = self
        self.started = []  # no SuperNode whose port to check (fortieth review, processes 2)

    def log_path(self, name: str) -> Path:
        return self.log

    def check_alive(self) -> None:
        if self.lines:
            with self.log.open("ab") as fh:
                fh.write(self.lines.pop(0))

    def flwr(self, *args, **kwargs):
        self.asked_after.append(len(self.lines))
        return {"nodes": [{"status": "online"}] * 2}


def test_3_the_superlinks_log_is_read_from_this_deployments_part(tmp_path):
    log = tmp_path / "superlink.log"
    log.write_bytes(b"INFO: Activated node_id=1\nINFO: Activated node_id=2\n")  # a failed one's
    start = os.path.getsize(log)
    lines = [b"INFO: starting\n", b"INFO: Activ", b"ated node_id=7\nINFO: x\n",
             b"INFO: Activated node_id=8\n", b"INFO: more\n"]  # fmt: skip
    dep = _Deployment(log, lines)
    wait_nodes(dep, 2, deadline=float("inf"), log_start=start)
    assert dep.asked_after == [1], dep.asked_after  # asked once both activations were written


def test_5_a_second_deployment_into_a_running_ones_out_is_refused_first(tmp_path, no_deployment):
    out = tmp_path / "D"
    (out / "deploy").mkdir(parents=True)
    with lock_directory(out / "deploy", "deploy.lock", what="the first deployment"):
        (out / "config.toml").write_text("")  # its ServerApp has begun the run
        line = usage_error(_deploy(out, *SMALL), "argument --out", f"process {os.getpid()}")
        assert "deployment into it" in line and "--resume" not in line, line
        with pytest.raises(ValueError, match=f"in use by process {os.getpid()}"):
            deploy_local(nodes=1, tls=False, out=str(out), app_dir=REPO_ROOT)
    (out / "config.toml").unlink()
    assert (out / "deploy" / "deploy.lock").read_text() == ""  # left by the deployment: ours
    _deploy(out, *SMALL)
    assert len(no_deployment) == 1
    (out / "deploy" / "deploy.lock").write_text("my notes\n")  # a user's file is not
    usage_error(_deploy(out, *SMALL), "deploy.lock, which deploy local did not write")


def test_5_and_7_deploy_local_holds_the_lock_and_certifies_its_whole_timeout(tmp_path, monkeypatch):
    out = tmp_path / "D"
    seen = []

    def tls_files(directory, *, days=2, **kwargs):  # the first step after the app is staged
        with pytest.raises(ValueError, match=f"in use by process {os.getpid()}") as refused:
            local_checks.check_not_deploying(out)  # finding 5: held while it runs
        seen.append((str(refused.value), days))
        raise RuntimeError("stopped here (test)")

    monkeypatch.setattr(deploy_module, "stage_app", lambda src, dst: Path(dst))
    monkeypatch.setattr(deploy_module, "make_tls_files", tls_files)
    overrides = {"population": 6, "task-params.num-users": 6, "clients-per-round": 3}
    three_days = 3 * 86400.0
    with pytest.raises(RuntimeError, match="stopped here"):
        deploy_local(nodes=1, config_path=str(TOY), overrides=overrides, out=str(out),
                     timeout=three_days)  # fmt: skip
    assert len(seen) == 1, seen
    assert seen[0][1] * 86400 > three_days, seen  # finding 7: valid 2 days before
    local_checks.check_not_deploying(out)  # released


def test_6_a_deployment_behind_a_proxy_talks_to_127_0_0_1_directly(tmp_path, monkeypatch):
    import urllib.request

    for key in ("http_proxy", "https_proxy", "ALL_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(key, "http://127.0.0.1:9")
    monkeypatch.setenv("no_proxy", "intranet.example, localhost")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_grpc_proxy", raising=False)
    env = Deployment(tmp_path / "work", tmp_path / "logs", None).procs.env
    assert env["no_proxy"] == "intranet.example,localhost,127.0.0.1", env.get("no_proxy")
    assert env["NO_PROXY"] == "127.0.0.1,localhost" and "no_grpc_proxy" not in env
    monkeypatch.setattr(os, "environ", dict(env))  # as its processes see it
    assert urllib.request.proxy_bypass_environment("127.0.0.1")
    monkeypatch.undo()
    monkeypatch.setenv("no_grpc_proxy", "grpc.example")  # gRPC reads it first when set
    env = Deployment(tmp_path / "work", tmp_path / "logs", None).procs.env
    assert env["no_grpc_proxy"] == "grpc.example,127.0.0.1,localhost"
