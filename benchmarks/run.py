"""Run the benchmarks and write ``benchmarks/RESULTS.md`` and ``benchmarks/results.json``.

Usage: ``make bench`` (or ``python benchmarks/run.py [--quick]``). Each case reports the median of
several repetitions. The machine (CPU, cores, torch build, device) is recorded with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fedprivopt.privacy import (  # noqa: E402
    PrivacyAccountant,
    RngFactory,
    SubsampledGaussianEvent,
    clip_l2,
    gaussian_noise,
)
from fedprivopt.privacy.aggregate import NoisyMeanAggregator  # noqa: E402

DIM = 5_000_500  # full-size StackOverflow tag prediction (10,000 words x 500 tags + bias)


def timed(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
    }


def bench_privacy_core(repeat: int, device: str) -> list[dict]:
    rows = []
    gen = RngFactory(seed=0).generator(1, "bench", device=device)
    vec = torch.randn(DIM, generator=gen, device=device)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def noise():
        gaussian_noise(DIM, 1.0, generator=gen, device=device)
        sync()

    def clip():
        clip_l2(vec, 1.0)
        sync()

    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1.0, expected_cohort_size=20.0)
    updates = [(u, vec * 0.1) for u in range(20)]

    def aggregate():
        agg.aggregate(updates, dim=DIM, generator=gen, device=device)
        sync()

    for name, fn in [
        (f"gaussian noise, {DIM:,} draws", noise),
        (f"L2 clip of a {DIM:,} vector", clip),
        (f"aggregate 20 updates of {DIM:,} (check, clip, sum, noise)", aggregate),
    ]:
        rows.append({"case": name, "device": device, "seconds": timed(fn, repeat)})
    return rows


def bench_accounting(repeat: int) -> list[dict]:
    rows = []
    ev = SubsampledGaussianEvent.poisson(sample_rate=100 / 342_477, noise_multiplier=1.0)
    for accountant in ("rdp", "pld"):
        acc = PrivacyAccountant(accountant=accountant)
        acc.step(ev, count=1499)

        def check(acc=acc):
            acc._cache.clear()  # measure the real computation, not the cache
            acc.would_exceed(8.0, 1e-6, ev)

        rows.append(
            {
                "case": f"budget check before round 1500 ({accountant})",
                "device": "cpu",
                "seconds": timed(check, max(1, repeat // 2)),
            }
        )
    return rows


def write(rows: list[dict], info: dict) -> None:
    (HERE / "results.json").write_text(json.dumps({"machine": info, "results": rows}, indent=2))
    lines = [
        "# Benchmark results",
        "",
        "Written by `make bench` (`benchmarks/run.py`); medians of repeated runs.",
        "",
        "Machine: " + ", ".join(f"{k} = {v}" for k, v in info.items()),
        "",
        "| case | device | seconds |",
        "|---|---|---|",
    ]
    lines += [f"| {r['case']} | {r['device']} | {r['seconds']:.4f} |" for r in rows]
    (HERE / "RESULTS.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    repeat = 3 if args.quick else 7
    info = machine()
    rows = []
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        rows += bench_privacy_core(repeat, device)
    rows += bench_accounting(repeat)
    for r in rows:
        print(f"{r['seconds']:9.4f} s  [{r['device']}]  {r['case']}")
    write(rows, info)
    print(f"wrote {HERE / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
