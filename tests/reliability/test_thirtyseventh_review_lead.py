"""Issue 15, thirty-seventh review: the lead's findings (from the reviewers' reports).

1. (the adaptive reviewer's open report) ``simulate toy.toml --rounds 2 --set population=1000
   --set task-params.num-users=1000 --set clients-per-round=500 --set noise-mode=distributed --set
   min-shares=1 --set noise-multiplier=1 --set clip-norm=5e36`` (no adaptive clipping) ended rc 0
   with an infinite model and the advice to lower the learning rates: the bound on ``σ C`` (the
   dtype's largest number over the headroom) ignored that the sum of ``n`` distributed shares
   has noise std ``σ C √(n/m_min)``; the same config in server mode stays finite. DP2's
   ``clip-norm-adaptive`` and ``ServerAlgorithm.aggregate(clip_norm=…)`` had the same gap. Now
   the bound is divided by ``strategies.clipping.sum_noise_growth`` (the adaptive reviewer's
   growth, at the most shares a round can accept) in every check: rc 2, one line naming
   ``clip-norm`` and ``min-shares``.
2. (the cli reviewer's open report) ``ulimit -v 7500000; simulate toy.toml --engine flower
   --rounds 1`` hung inside ``ray.init`` and ignored SIGTERM (9 minutes, only SIGKILL ended it);
   at 6000000 it printed 137 lines, rc 1 (Ray's object store maps 30% of the available memory in
   one process). ``ray_processes.enough_address_space`` raises the soft limit to the hard one and
   refuses a limit below the object store plus 2 GiB before anything is written: rc 2, one line
   naming ``ulimit -v`` and the limit needed (measured: 7500000 refused, 9500000 ran).
3. (the cli reviewer's report) a task by reference whose factory hits torch's allocator
   (``torch.empty`` beyond the memory: a ``RuntimeError``, "DefaultCPUAllocator: can't allocate
   memory") was reported as ``the factory raised RuntimeError …`` (rc 2, blaming the task's code)
   where every other such failure gives the out-of-memory line; ``registry.build_task`` lets it
   through as it lets ``MemoryError`` through (``task_calls.out_of_memory``): the line, rc 1.
4. (the deploy reviewer's note) ``simulate toy.toml --engine flower --rounds 2 --quiet`` printed
   the strategy's three-line summary and ``INFO : round 1: epsilon=7.551 cohort=9`` for every
   round, where ``--quiet`` means "no per-round progress on stderr": the run set Flower's logger
   to ``WARNING`` before the Flower engine first imported Flower, whose logger module sets it to
   ``DEBUG``. ``core.logs.quiet_flower`` imports that module first: no ``INFO`` line.
"""

from __future__ import annotations

import logging
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedprivopt.simulation import ray_processes
from fedprivopt.strategies import StrategyConfig, build_algorithm
from tests.reliability.test_thirtyseventh_review_cli import _limits
from tests.reliability.test_twentyninth_review_cli import _cli, _one_line

TOY = str(Path(__file__).resolve().parents[2] / "simulations" / "toy.toml")


def _config(**changes) -> StrategyConfig:
    values = {"strategy": "dp-fedavg", "population": 1000, "clients-per-round": 500,
              "num-server-rounds": 4, "noise-multiplier": 1.0, "seed": 1,
              "noise-mode": "distributed", "min-shares": 1, **changes}  # fmt: skip
    return StrategyConfig.from_mapping(values)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"clip-norm": 5e36}, "clip-norm"),
        ({"strategy": "dp2", "clip-norm-adaptive": 5e36}, "clip-norm-adaptive"),
    ],
)
def test_1_a_fixed_clip_norm_counts_the_distributed_shares_growth(changes, key):
    with pytest.raises(ValueError, match=rf"{key} must be at most .*min-shares"):
        build_algorithm(_config(**changes), torch.zeros(4))
    # server noise at the same norm fits, as does min-shares at the cohort under fixed sampling
    build_algorithm(_config(**changes, **{"noise-mode": "server", "min-shares": 0}), torch.zeros(4))
    fixed = {"sampling": "fixed", "min-shares": 500}
    build_algorithm(_config(**changes, **fixed), torch.zeros(4))


def test_1_an_explicit_round_clip_norm_counts_the_growth():
    alg = build_algorithm(_config(), torch.zeros(4))
    with pytest.raises(ValueError, match="clip_norm must be at most"):
        alg.aggregate(1, {0: torch.zeros(4)}, clip_norm=5e36)
    alg.aggregate(1, {0: torch.zeros(4)}, clip_norm=1e35)


def _address_space(monkeypatch, soft: int, hard: int, available: int) -> list:
    """``getrlimit`` of the address space answering (soft, hard); ``setrlimit`` recorded."""
    monkeypatch.setattr(ray_processes, "available_memory", lambda: available)
    return _limits(monkeypatch, soft, hard, resource.RLIMIT_AS)


def test_2_a_flower_run_under_too_small_an_address_space_is_refused_before_ray(
    tmp_path, monkeypatch
):
    limit = 7_500_000 * 1024
    made = _address_space(monkeypatch, limit, limit, available=20_878_128 * 1024)
    out = tmp_path / "R"
    argv = ["simulate", TOY, "--engine", "flower", "--rounds", "1", "--out", str(out), "--quiet"]
    line = _one_line(_cli(tmp_path, *argv))  # before: Ray started, and hung under a real limit
    assert line.startswith('fedprivopt simulate: error: engine = "flower" starts Ray'), line
    assert "7500000 KiB of address space (ulimit -v)" in line, line
    assert "at least 8360591 KiB" in line, line  # 30% of 20878128 KiB + 2 GiB
    assert not out.exists() and made == []


def test_2_the_soft_address_space_is_raised_and_enough_passes(monkeypatch):
    gib = 1024**3
    made = _address_space(monkeypatch, 4 * gib, resource.RLIM_INFINITY, available=20 * gib)
    ray_processes.enough_address_space("fast-actors")  # raised to unlimited: no refusal
    assert made == [(resource.RLIM_INFINITY, resource.RLIM_INFINITY)]
    made = _address_space(monkeypatch, 9 * gib, 9 * gib, available=20 * gib)
    ray_processes.enough_address_space("fast-actors")  # 6 GiB + 2 GiB fit in 9 GiB
    with pytest.raises(ValueError, match=r"ulimit -v"):
        _address_space(monkeypatch, 7 * gib, 7 * gib, available=20 * gib)
        ray_processes.enough_address_space("fast-actors")


def test_3_a_factory_out_of_torchs_memory_is_the_out_of_memory_line(tmp_path, monkeypatch):
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "review37_huge.py").write_text(
        "import torch\n\n\ndef make(num_users=40, seed=0):\n"
        "    return torch.empty(2**60, dtype=torch.uint8)\n"
    )
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "review37_huge", raising=False)
    out = tmp_path / "R"
    argv = ["simulate", TOY, "--rounds", "1", "--out", str(out), "--quiet"]
    proc = _cli(tmp_path, *argv, "--set", "task=review37_huge:make")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and len(lines) == 1, (proc.returncode, proc.stderr)
    assert "ran out of memory" in lines[0] and "factory raised" not in lines[0], lines
    assert not out.exists()


QUIET_PROBE = """
import logging
from fedprivopt.core.logs import quiet_flower
quiet_flower()  # before any Flower module is imported, as in a fresh `simulate`
import flwr.app, flwr.serverapp, flwr.simulation  # what the Flower engine imports
print(logging.getLogger("flwr").getEffectiveLevel())
"""


def test_4_flowers_logger_stays_quiet_after_flower_is_imported(tmp_path):
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "FLWR_HOME": str(tmp_path)}  # fmt: skip
    env.pop("FLWR_LOG_LEVEL", None)
    done = subprocess.run(
        [sys.executable, "-c", QUIET_PROBE], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(logging.WARNING)], done.stdout  # before: 10 (DEBUG)
