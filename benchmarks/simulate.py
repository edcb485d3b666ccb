"""Benchmark S1: the round a user sees, ``fedprivopt simulate`` end to end (issue 19).

Runs the command a user runs, ``fedprivopt simulate simulations/stackoverflow-tp.toml`` with 20
clients per round and every round evaluated on 5 users, in its own process, and times it from
start to exit; each round's seconds are the ``seconds`` of its ``metrics.jsonl`` row (from the
end of the previous round to the end of this one: training, aggregation, the server step, the
evaluation, the ledger line and the row). Then the harness of B1 (``benchmarks/engines.py``: the
same preset, data and cohort, no evaluation and no files) runs the same rounds; the two
alternate (three times by default), so their difference is what the run's writer costs. Run by
``benchmarks/run.py`` (group ``simulate``), which imports it from its own directory.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PRESET = "simulations/stackoverflow-tp.toml"
CLIENTS = 20
EVAL_USERS = 5


def _command() -> list[str]:
    """The ``fedprivopt`` console script of this interpreter's environment (else ``-m``)."""
    script = Path(sys.executable).parent / "fedprivopt"
    return [str(script)] if script.exists() else [sys.executable, "-m", "fedprivopt.cli"]


def _run_simulate(rounds: int, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    argv = [
        *_command(), "simulate", PRESET, "--rounds", str(rounds), "--out", str(out), "--quiet",
        "--set", f"clients-per-round={CLIENTS}", "--set", "eval-every=1",
        "--set", f"task-params.eval-users={EVAL_USERS}",
    ]  # fmt: skip
    print(f"[bench] s1: {' '.join(argv[1:])}", flush=True)
    start = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    seconds = [float(r["seconds"]) for r in rows]
    return {
        "wall_seconds": wall,
        "round_seconds": seconds,
        "outside_rounds_seconds": wall - sum(seconds[1:]),
        "cohort_sizes": [r["cohort_size"] for r in rows],
    }


def _run_harness(rounds: int, target: Path) -> dict:
    argv = [
        sys.executable, str(HERE / "engines.py"), "--engine", "fast", "--clients", str(CLIENTS),
        "--rounds", str(rounds), "--json", str(target),
    ]  # fmt: skip
    print(f"[bench] s1: {' '.join(argv[1:])}", flush=True)
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    result = json.loads(target.read_text())
    return {k: result[k] for k in ("round_seconds", "cohort_sizes")}


def bench_simulate(rounds: int, machine: dict, repeat: int = 3) -> dict:
    """``fedprivopt simulate`` and the B1 harness, ``rounds`` rounds each, ``repeat`` times.

    ``machine`` describes this machine (recorded with the block). Each side's seconds per round
    is the median of rounds 2..``rounds`` over all its runs (the runs alternate, so a stretch of
    load from another process falls on both sides).
    """
    cases = HERE / "cases"
    cases.mkdir(exist_ok=True)
    sims, harnesses = [], []
    load = os.getloadavg()[0]  # other processes' load moves these numbers: say how much
    for _ in range(repeat):
        sims.append(_run_simulate(rounds, cases / "s1-simulate"))
        harnesses.append(_run_harness(rounds, cases / "s1-harness.json"))
    sim_s = statistics.median(s for run in sims for s in run["round_seconds"][1:])
    har_s = statistics.median(s for run in harnesses for s in run["round_seconds"][1:])
    simulate = {
        "runs": sims,
        "seconds_per_round": sim_s,
        "wall_seconds": statistics.median(run["wall_seconds"] for run in sims),
        "outside_rounds_seconds": statistics.median(run["outside_rounds_seconds"] for run in sims),
    }
    print(
        f"[bench] s1: simulate {simulate['wall_seconds']:.1f} s end to end, {sim_s:.3f} s/round;"
        f" harness {har_s:.3f} s/round",
        flush=True,
    )
    return {
        "device": "cpu",
        "rounds": rounds,
        "repeat": repeat,
        "clients_per_round": CLIENTS,
        "eval_users": EVAL_USERS,
        "load_average": [load, os.getloadavg()[0]],
        "machine": machine,
        "simulate": simulate,
        "harness": {"runs": harnesses, "seconds_per_round": har_s},
    }


def _load(block: dict) -> str:
    load = block.get("load_average")
    return " and ".join(f"{x:.1f}" for x in load) if load else "not recorded"


def simulate_lines(block: dict) -> list[str]:
    """The RESULTS.md section of an S1 block."""
    sim, har = block["simulate"], block["harness"]
    rounds = block["rounds"]
    return [
        "",
        f"## S1: the round a user sees (`fedprivopt simulate`, {block['clients_per_round']} "
        f"clients per round, median of rounds 2..{rounds} of {block['repeat']} runs each)",
        "",
        f"`fedprivopt simulate {PRESET} --rounds {rounds} --set "
        f"clients-per-round={block['clients_per_round']} --set eval-every=1 --set "
        f"task-params.eval-users={block['eval_users']}` timed end to end in its own process, "
        "and the B1 harness (no evaluation, ledger or files) on the same rounds, alternated "
        f"{block['repeat']} times. End to end and outside the rounds: the median run. Load "
        f"average (1 min) before and after: {_load(block)}. "
        f"Code: {block.get('code', 'not recorded')}.",
        "",
        f"Machine: {', '.join(f'{k} = {v}' for k, v in block.get('machine', {}).items())}",
        "",
        "| what | s/round | end to end s | outside the rounds s |",
        "|---|---:|---:|---:|",
        f"| `fedprivopt simulate` (each round evaluated on {block['eval_users']} users, "
        f"ledger line, metrics row) | {sim['seconds_per_round']:.3f} | "
        f"{sim['wall_seconds']:.1f} | {sim['outside_rounds_seconds']:.1f} |",
        f"| harness (`benchmarks/engines.py`) | {har['seconds_per_round']:.3f} | | |",
        f"| difference (the writer) | {sim['seconds_per_round'] - har['seconds_per_round']:.3f} "
        "| | |",
        "",
        "Outside the rounds: start-up (imports, the data and token store, the model), round 1 "
        "(warm-up) and the final checkpoint and summary.",
    ]
