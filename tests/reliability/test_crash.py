"""Crash safety: kill -9 at random points, corrupt checkpoints, and a privacy ledger that resuming
can never reset or shrink.

The kill trials run ``fedprivopt simulate`` in child processes forked from a *fork server*: one
Python process that imports torch, dp-accounting and fedprivopt once (about 6 s on a loaded
2-core machine) and forks a child per run, which then executes the CLI's ``main`` from argument
parsing on. A child is an ordinary process: the test kills it with SIGKILL by its PID. One
further trial kills a freshly exec'd ``python -m fedprivopt.cli`` during interpreter startup.
"""

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.privacy import compose_epsilon, make_round_event
from fedprivopt.simulation.checkpoint import load_checkpoint
from fedprivopt.simulation.files import CHECKPOINT, LEDGER_FILE, PREVIOUS_CHECKPOINT, read_rows
from fedprivopt.simulation.run import resume, simulate
from tests.simulation.test_run import PRESET, SMALL, small_config

ROUNDS = 10
SETTINGS = {**SMALL, "num-server-rounds": ROUNDS, "checkpoint-every": 1, "eval-every": 1}
SETS = [f"--set={k}={v}" for k, v in SETTINGS.items()]

_SERVER = r"""
import json, os, sys
import torch, dp_accounting  # noqa: F401  (the slow imports, done once)
import fedprivopt.cli as cli
import fedprivopt.simulation.run  # noqa: F401
import fedprivopt.models.toy  # noqa: F401

for line in sys.stdin:
    cmd, arg = json.loads(line)
    if cmd == "run":
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 1)
                os.dup2(null, 2)
                code = cli.main(arg)
            finally:
                os._exit(code)
        print(json.dumps(pid), flush=True)
    elif cmd == "wait":
        _, status = os.waitpid(arg, 0)
        print(json.dumps(os.waitstatus_to_exitcode(status)), flush=True)
"""


class ForkServer:
    """Forks ``fedprivopt`` CLI runs from a process that has already imported everything."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.live: set[int] = set()  # forked, not yet reaped
        self.replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.replies.put(json.loads(line))

    def _call(self, cmd: str, arg, timeout: float = 120.0):
        self.proc.stdin.write(json.dumps([cmd, arg]) + "\n")
        self.proc.stdin.flush()
        return self.replies.get(timeout=timeout)

    def run(self, argv: list[str]) -> int:
        pid = self._call("run", argv)
        self.live.add(pid)
        return pid

    def wait(self, pid: int, timeout: float = 120.0) -> int:
        code = self._call("wait", pid, timeout)
        self.live.discard(pid)
        return code

    def close(self) -> None:
        for pid in list(self.live):  # unreaped children: their PIDs cannot have been reused
            try:
                os.kill(pid, signal.SIGKILL)
                self.wait(pid, timeout=30)
            except (ProcessLookupError, queue.Empty):
                pass
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def fork_server():
    server = ForkServer()
    try:
        yield server
    finally:
        server.close()


def _final(out: Path) -> tuple[torch.Tensor, float]:
    params = torch.load(out / CHECKPOINT, map_location="cpu", weights_only=True)["algorithm"]
    return params["params"], json.loads((out / "summary.json").read_text())["epsilon"]


def _state_after_kill(out: Path, code: int) -> str:
    if code == 0:
        return "finished before the kill"
    if not (out / "config.toml").exists():
        return "startup: nothing written"
    if (out / (CHECKPOINT + ".tmp")).exists():
        return "during a checkpoint write"
    if not (out / CHECKPOINT).exists() and not (out / PREVIOUS_CHECKPOINT).exists():
        return "before the first checkpoint"
    return f"between checkpoints (after {len(read_rows(out / 'metrics.jsonl'))} rows)"


def _kill_real_process_during_startup(out: Path, delay: float) -> int:
    cli = [sys.executable, "-m", "fedprivopt.cli", "simulate", str(PRESET)]
    proc = subprocess.Popen(
        [*cli, "--out", str(out), "--quiet", *SETS],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    return proc.returncode


def test_kill_9_at_random_points_then_resume_gives_the_uninterrupted_run(tmp_path, fork_server):
    argv = ["simulate", str(PRESET), "--quiet", *SETS]
    for ref in ("ref0", "ref"):  # the first child after the fork server starts is slower
        start = time.monotonic()
        ref_pid = fork_server.run([*argv, "--out", str(tmp_path / ref)])
        try:
            while not (tmp_path / ref / "config.toml").exists() and time.monotonic() < start + 60:
                time.sleep(0.005)
            startup = time.monotonic() - start  # until the run directory exists
        finally:
            assert fork_server.wait(ref_pid) == 0
    ref_params, ref_eps = _final(tmp_path / "ref")
    assert torch.equal(_final(tmp_path / "ref0")[0], ref_params)

    rng = random.Random(20240611)
    modes = ["exec-startup"] + ["startup"] * 3 + ["rounds"] * 3 + ["checkpoint"] * 3
    rng.shuffle(modes)
    outcomes = []
    for trial, mode in enumerate(modes):
        out = tmp_path / f"trial{trial}"
        if mode == "exec-startup":
            delay = rng.uniform(0.2, 4.0)
            code = _kill_real_process_during_startup(out, delay)
        else:
            pid = fork_server.run([*argv, "--out", str(out)])
            try:
                deadline = time.monotonic() + 60
                if mode == "startup":  # from the fork to about when the run directory exists
                    delay = rng.uniform(0.0, startup)
                    time.sleep(delay)
                elif mode == "rounds":  # after a random number of rows, at a random moment
                    rows, delay = rng.randint(0, ROUNDS - 1), rng.uniform(0.0, 0.03)
                    while len(read_rows(out / "metrics.jsonl")) < rows:
                        if time.monotonic() > deadline or (out / "summary.json").exists():
                            break
                        time.sleep(0.001)
                    time.sleep(delay)
                    delay += rows
                else:  # as soon as a checkpoint is being written, after a random number of rows
                    delay = float(rng.randint(1, ROUNDS - 1))  # rows to wait for
                    while len(read_rows(out / "metrics.jsonl")) < delay:
                        if time.monotonic() > deadline or (out / "summary.json").exists():
                            break
                        time.sleep(0.001)
                    tmp = out / (CHECKPOINT + ".tmp")
                    while not tmp.exists() and time.monotonic() < deadline:
                        pass  # a tight loop: the write (an fsync) lasts milliseconds
                os.kill(pid, signal.SIGKILL)
            finally:
                code = fork_server.wait(pid)
        state = _state_after_kill(out, code)
        assert code in (0, -signal.SIGKILL)
        resumed = main(["simulate", "--resume", str(out), "--quiet"])
        if state == "startup: nothing written":
            assert resumed == 2  # nothing to resume: a clear error, then a fresh start
            assert main([*argv, "--out", str(out)]) == 0
        else:
            assert resumed == 0
        params, eps = _final(out)
        assert torch.equal(params, ref_params) and eps == ref_eps
        rows = read_rows(out / "metrics.jsonl")
        assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1))
        outcomes.append((mode, round(delay, 3), code, state))
    print("\nkill -9 trials (mode, rows waited for + delay s, exit code, state when killed):")
    for item in outcomes:
        print("  ", item)
    assert sum(code == -signal.SIGKILL for _, _, code, _ in outcomes) >= 8


# -- corrupt checkpoints -------------------------------------------------------------------------


def _extend(out: Path, rounds: int) -> None:
    text = (out / "config.toml").read_text()
    old = next(line for line in text.splitlines() if line.startswith("num-server-rounds"))
    (out / "config.toml").write_text(text.replace(old, f"num-server-rounds = {rounds}"))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    state = torch.load(path, weights_only=True)
    needle = state["algorithm"]["params"].numpy().tobytes()[:16]
    data[data.find(needle) + 5] ^= 0x10  # inside the tensor data: torch.load does not notice
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    return simulate(small_config(), tmp_path_factory.mktemp("full") / "run")


@pytest.mark.parametrize("damage", [_truncate, _flip_a_bit], ids=["truncated", "bit-flip"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, full_run, damage):
    out = simulate(small_config(**{"num-server-rounds": 4}), tmp_path / "p").out_dir
    damage(out / CHECKPOINT)
    assert load_checkpoint(out)["algorithm"]["round"] == 3
    _extend(out, 6)
    outcome = resume(out)
    assert outcome.rounds_completed == 6
    assert torch.equal(outcome.params, full_run.params) and outcome.epsilon == full_run.epsilon


def test_both_checkpoints_bad_is_a_clear_error_not_a_restart(tmp_path, capsys, caplog):
    out = simulate(small_config(**{"num-server-rounds": 4}), tmp_path / "b").out_dir
    _truncate(out / CHECKPOINT)
    _flip_a_bit(out / PREVIOUS_CHECKPOINT)
    metrics = (out / "metrics.jsonl").read_bytes()
    with pytest.raises(ValueError, match=r"unreadable.*reset the privacy accountant"):
        resume(out)
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "reset the privacy accountant" in err and len(err.strip().splitlines()) == 1
    assert "SHA-256" in err  # the reasons are in the line (a later review saw 2 log lines more)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert (out / "metrics.jsonl").read_bytes() == metrics  # nothing was touched


# -- resuming can never reset or shrink the accountant -------------------------------------------


def test_no_checkpoint_left_after_released_rounds_is_refused(tmp_path):
    out = simulate(small_config(**{"num-server-rounds": 4}), tmp_path / "gone").out_dir
    (out / CHECKPOINT).unlink()
    (out / PREVIOUS_CHECKPOINT).unlink()
    with pytest.raises(ValueError, match="rounds up to 4 were released"):
        resume(out)
    (out / "summary.json").unlink()  # the rows alone are evidence enough
    (out / LEDGER_FILE).unlink()
    with pytest.raises(ValueError, match="reset the privacy accountant"):
        resume(out)


def test_crash_before_the_first_checkpoint_restarts_from_round_0(tmp_path, full_run):
    out = simulate(small_config(**{"num-server-rounds": 1}), tmp_path / "early").out_dir
    # the state of a kill after round 1's row (and ledger line) but before its checkpoint
    (out / CHECKPOINT).unlink()
    (out / "summary.json").unlink()
    _extend(out, 6)
    outcome = resume(out)
    assert torch.equal(outcome.params, full_run.params) and outcome.epsilon == full_run.epsilon


def _events(out: Path) -> int:
    ledger = load_checkpoint(out)["algorithm"]["accountant"]["ledger"]
    return sum(item["count"] for item in ledger)


SECURE = {"secure": True, "num-server-rounds": 5}


def _secure_epsilon(events: int) -> float:
    cfg = small_config(**SECURE).strategy
    event = make_round_event(cfg.noise_multiplier, sample_rate=cfg.sample_rate)
    return compose_epsilon([(event, events)], cfg.delta)


@pytest.mark.parametrize("evidence", ["ledger", "rows", "summary"])
def test_secure_mode_resume_keeps_lost_releases_accounted(tmp_path, evidence):
    out = simulate(small_config(**SECURE), tmp_path / "s").out_dir
    assert _events(out) == 5
    # lose the round-5 checkpoint: round 5 was released (row, summary, ledger) with noise that a
    # redo cannot reproduce, so the redo is a new release and both must stay accounted
    (out / CHECKPOINT).unlink()
    if evidence != "ledger":
        (out / LEDGER_FILE).unlink()
    if evidence == "summary":
        (out / "metrics.jsonl").write_text("")
    else:
        (out / "summary.json").unlink()
    outcome = resume(out)
    assert outcome.rounds_completed == 5
    assert _events(out) == 6 and outcome.epsilon == _secure_epsilon(6)


def test_secure_mode_repeated_crashes_only_ever_add_events(tmp_path):
    out = simulate(small_config(**SECURE), tmp_path / "r").out_dir
    releases = 5  # every round execution whose row was written released a fresh noise draw
    for crash in range(1, 4):
        _truncate(out / CHECKPOINT)  # the newest checkpoint is lost: one round is redone
        before = _events(out)
        outcome = resume(out)
        releases += 1
        assert _events(out) == releases == 5 + crash
        assert _events(out) > before and outcome.epsilon == _secure_epsilon(releases)
    lines = read_rows(out / LEDGER_FILE)
    assert [x["events"] for x in lines] == sorted(x["events"] for x in lines)  # monotone


def test_seeded_mode_redo_is_the_same_release_and_not_charged(tmp_path, full_run):
    out = simulate(small_config(), tmp_path / "seeded").out_dir
    _truncate(out / CHECKPOINT)
    outcome = resume(out)
    assert _events(out) == 6  # round 6 was redone bit for bit: counted once
    assert torch.equal(outcome.params, full_run.params) and outcome.epsilon == full_run.epsilon
