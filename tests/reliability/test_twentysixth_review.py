"""Issue 15, twenty-sixth hostile review: regression tests of its findings.

1. A command started with standard output or standard error closed (``>&-``, ``2>&-``, as a
   daemon, a cron line or a supervisor may start it): ``fedprivopt epsilon … >&-`` ended in an
   ``AttributeError: 'NoneType' object has no attribute 'write'`` traceback (rc 1; the guard of
   standard output added by the twenty-fifth review wrapped ``None``: before it, the line was
   silently lost and rc was 0), ``simulate toy.toml --out R >&-`` the same after writing the
   run, and ``simulate toy.toml --out R 2>&-`` stopped at its first progress line
   (``sys.stderr.isatty()`` of ``None``: rc 1, no run). Now closed descriptors 0-2 get the null
   device (a file the run opens cannot take them) and a closed standard output is reported as
   any failure of standard output (rc 2, one line naming it, the run kept); a closed standard
   error drops the diagnostics and the command completes (rc 0).
2. ``simulate stackoverflow-tp-mini.toml --rounds 20 --set engine=flower --set
   clients-per-round=3``, SIGTERM 4 s after the start (while Ray was starting): still running
   10 minutes later, no round written, killed by SIGKILL. ``ray.init`` replaces the SIGTERM
   handler in the main thread (``sys.exit(15)``), so the signal did not set the engine's stop
   event: it raised ``SystemExit`` where the main thread was, here inside ``logging``'s
   ``_releaseLock`` ("Exception ignored ... SystemExit: 15"), which left logging's lock held,
   and the next log line of any thread waited for ever. Now Ray's calls to install a SIGTERM
   handler do nothing during the Flower simulation (and when joining a ``ray-address``
   cluster): the first SIGTERM sets the stop event, as SIGINT did, and the run ends with 143.
   Once the rounds ran, a SIGTERM of the Flower engine (toy preset, any moment after the first
   checkpoint, 3 of 3 tries) ended with rc 134: Ray's core worker installs absl's
   failure-signal handler over the driver's SIGTERM handler when it connects, which printed
   ``*** SIGTERM received ...`` with a stack dump, Flower's tracebacks of dead actors, and
   aborted (the interruption line was printed before the abort). The driver's failure-signal
   handler is now off during the simulation (``RAY_DISABLE_FAILURE_SIGNAL_HANDLER``): rc 143,
   the one line, the run resumable, Ray's processes gone.
3. ``simulate toy.toml --set noise-multiplier=1e38`` (also ``4e37``, or ``clip-norm=1e38``)
   drew infinite noise and ended rc 0 as a divergence advising lower learning rates, the case
   the twenty-fifth review refused only above float32's largest number (3.4e38): a Gaussian
   draw reaches 4-6 standard deviations (78 of 100,000 float32 draws of std 1e38 are
   infinite), secure mode sums four draws before halving, and a tree sums up to ~20 nodes. The
   noise std ``sigma * C`` of a round's sum is now at most the dtype's largest number over 64
   (5.3e36 for float32): rc 2, one line naming noise-multiplier and clip-norm, nothing written.
4. ``simulate adadps-paper.toml --out R --set clients-per-round=3`` (40 rounds, finished), then
   ``metrics.jsonl`` cut to its first 37 rows and ``--resume R``: rc 0, and the new
   ``summary.json`` (and any report of the run) gave round 37's metrics as the final ones of
   the 40 rounds (eval_accuracy 0.2821 for 0.2836); ``compare`` reused such a cell. The
   checkpoint records how many rows were written before it; fewer rows up to its round are now
   refused: rc 2, one line naming ``metrics.jsonl``, the counts and the checkpoint.
5. ``ServerAlgorithm.run_round`` (Python API) sent a ``simulation.fast.StreamedUpdates`` of 5
   users the round did not sample (cohort of 3): accepted 5, none rejected, every one summed
   without the subsampling the accountant assumes. The twenty-fifth review's check of the
   cohort (``aggregate(cohort=)``) skipped streamed updates. Their users are known before
   anything trains: a stream holding a user outside the cohort is now a ``ValueError`` naming
   the users (the fast engine streams exactly the cohort and still runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.test_twentythird_review import one_line_error

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"
EPSILON = ["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--rounds", "10",
           "--delta", "1e-5"]  # fmt: skip


def _env(tmp_path) -> dict[str, str]:
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    env["FLWR_HOME"] = str(tmp_path / "flwr")
    env.pop("FEDPRIVOPT_DEBUG", None)
    return env


def _console_closed(argv: list[str], tmp_path, close: tuple[int, ...]) -> tuple[int, str, str]:
    """The ``fedprivopt`` program with descriptors ``close`` closed: code, stdout, stderr.

    A closed descriptor's output is read back from nowhere: "" is returned for it.
    """
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    code = "from fedprivopt.cli import console; console()"

    def closing() -> None:
        for fd in close:
            os.close(fd)

    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *argv], stdout=out, stderr=err, env=_env(tmp_path),
            cwd=ROOT, preexec_fn=closing,
        )  # fmt: skip
        try:
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()  # by its PID, even when the test fails
                proc.wait()
    return rc, out_path.read_text(), err_path.read_text()


def test_1_closed_stdout_is_one_line(tmp_path):
    rc, _, err = _console_closed(EPSILON, tmp_path, (1,))
    one_line_error(rc, err, "fedprivopt epsilon: error: cannot write standard output")


def test_1_closed_stdout_keeps_the_run(tmp_path):
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "2", "--out", str(out), "--quiet"]
    rc, _, err = _console_closed(argv, tmp_path, (1,))
    one_line_error(rc, err, "cannot write standard output: Bad file descriptor")
    assert json.loads((out / "summary.json").read_text())["rounds_completed"] == 2


@pytest.mark.parametrize("argv", [EPSILON, ["simulate", str(TOY), "--rounds", "2"]],
                         ids=["epsilon", "simulate"])  # fmt: skip
def test_1_closed_stderr_completes(tmp_path, argv):
    if argv[0] == "simulate":
        argv = [*argv, "--out", str(tmp_path / "run")]
    rc, out, _ = _console_closed(argv, tmp_path, (2,))
    assert rc == 0
    assert out.count("\n") == 1 and ("epsilon = " in out or "results in" in out), out
    if argv[0] == "simulate":
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["rounds_completed"] == 2


def test_2_ray_does_not_replace_the_sigterm_handler(monkeypatch):
    """What ``ray.init`` does in the driver, then a SIGTERM: the engine stops, no SystemExit."""
    import signal
    import threading
    from types import SimpleNamespace

    import flwr.simulation
    import ray._private.utils as ray_utils

    import fedprivopt.clients.client_app as client_app
    from fedprivopt.simulation import engines, interrupt

    def fake_run_simulation(**kwargs):
        ray_utils.set_sigterm_handler(lambda signum, frame: sys.exit(signum))  # as ray.init
        signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(flwr.simulation, "run_simulation", fake_run_simulation)
    monkeypatch.setattr(client_app, "make_client_app", lambda **kwargs: None)
    config = SimpleNamespace(client_cpus=1.0, client_gpus=0.0, task="toy", task_params={},
                             device="cpu")  # fmt: skip
    stop = threading.Event()
    before = signal.getsignal(signal.SIGTERM)
    try:
        engines._simulate(config, SimpleNamespace(num_users=4), None, {}, stop, [])
    except BaseException as exc:  # SystemExit before the fix
        raised = exc
    else:
        raised = None
    assert isinstance(raised, interrupt.Interrupted), repr(raised)
    assert raised.signum == signal.SIGTERM and stop.is_set()
    assert signal.getsignal(signal.SIGTERM) is before
    assert ray_utils.set_sigterm_handler.__name__ == "set_sigterm_handler"


def test_2_sigterm_of_the_flower_engine_is_143(tmp_path):
    import signal
    import time

    from tests.reliability.test_signals import SETTINGS, start_simulate, wait_for, wait_gone

    run, out = start_simulate(tmp_path, "flower", {**SETTINGS, "num-server-rounds": 15})
    try:
        wait_for(lambda: (out / "checkpoint.pt").exists(), 240, "the first checkpoint", run.proc)
        run.remember()
        time.sleep(0.5)  # the rounds are running
        run.proc.send_signal(signal.SIGTERM)
        code = run.proc.wait(timeout=60)
        wait_gone(run.seen, 15)
    finally:
        run.cleanup()
    err = run.stderr()
    assert code == 143, err[-3000:]
    assert "SIGTERM received" not in err and "Traceback" not in err, err[-3000:]
    line = f"fedprivopt simulate: interrupted; the run can be continued with --resume {out}"
    assert err.strip().splitlines()[-1] == line, err[-3000:]
    assert (out / "checkpoint.pt").exists() and not (out / "summary.json").exists()


@pytest.mark.parametrize("setting", ["noise-multiplier=1e38", "noise-multiplier=4e37",
                                     "clip-norm=1e38"])  # fmt: skip
def test_3_a_noise_std_whose_draws_overflow_is_refused(tmp_path, setting):
    from tests.reliability.test_fuzz_cli import run_cli

    out = tmp_path / "r"
    code, _, err = run_cli(["simulate", str(TOY), "--out", str(out), "--rounds", "1",
                            "--set", setting])  # fmt: skip
    one_line_error(code, err, "noise-multiplier * clip-norm must be at most 5.31691e+36")
    assert not out.exists()


@pytest.mark.parametrize("secure", [False, True])
def test_3_draws_at_the_bound_are_finite(secure):
    import torch

    from fedprivopt.privacy.noise import gaussian_noise
    from fedprivopt.strategies.aggregation import NOISE_HEADROOM

    std = torch.finfo(torch.float32).max / NOISE_HEADROOM
    gen = torch.Generator().manual_seed(3)
    draws = gaussian_noise(2_000_000, std, generator=gen, secure=secure)
    assert bool(torch.isfinite(draws).all())


def test_4_resume_refuses_removed_metrics_rows(tmp_path):
    from tests.reliability.test_fuzz_cli import run_cli

    out = tmp_path / "r"
    code, _, err = run_cli(["simulate", str(TOY), "--out", str(out), "--rounds", "4", "--quiet"])
    assert code == 0, err
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    assert len(lines) == 4
    metrics.write_text("".join(lines[:2]))
    summary = (out / "summary.json").read_text()
    code, _, err = run_cli(["simulate", "--resume", str(out), "--quiet"])
    one_line_error(code, err, "metrics.jsonl holds 2 rows up to round 4", "checkpoint.pt")
    assert (out / "summary.json").read_text() == summary  # nothing changed
    metrics.write_text("".join(lines))  # restored: the finished run is taken as it is
    code, _, err = run_cli(["simulate", "--resume", str(out), "--quiet"])
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["rounds_completed"] == 4


def test_5_streamed_updates_outside_the_cohort_are_refused():
    import torch

    from fedprivopt.simulation.fast import StreamedUpdates
    from fedprivopt.strategies import StrategyConfig, build_algorithm

    config = StrategyConfig(population=20, clients_per_round=3.0, noise_multiplier=0.5,
                            clip_norm=1.0, seed=1)  # fmt: skip
    alg = build_algorithm(config, torch.zeros(4))
    rounds = alg.run_round(1)
    request = next(rounds)
    others = [u for u in range(20) if u not in request.users][:5]
    stream = StreamedUpdates(
        others, lambda users: iter([(u, torch.full((4,), 0.1)) for u in users])
    )
    with pytest.raises(ValueError, match="not in round 1's cohort"):
        rounds.send(stream)
    alg = build_algorithm(config, torch.zeros(4))  # the cohort itself is still summed
    rounds = alg.run_round(1)
    request = next(rounds)
    cohort = StreamedUpdates(
        request.users, lambda users: iter([(u, torch.full((4,), 0.1)) for u in users])
    )
    with pytest.raises(StopIteration) as done:
        rounds.send(cohort)
    assert done.value.value.metrics["accepted"] == len(request.users)
