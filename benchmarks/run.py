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
import subprocess
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


# -- B1-B3: engines, scaling, floor (each case in its own process: benchmarks/engines.py) -------

FULL_DATA = ("data/stackoverflow-synthetic", 10_000, 8_000)  # dir, synth clients, population
SO_DATA = ("data/stackoverflow-synthetic-342k", 393_000, 342_477)  # 343,095 training users


def bandwidth() -> dict:
    """Memory bandwidth of this machine: bytes read + written by a 256 MB tensor copy."""
    src = torch.ones(64 * 1024 * 1024)
    dst = torch.empty_like(src)
    best = {}
    for threads in sorted({1, torch.get_num_threads()}):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        seconds = timed(lambda: dst.copy_(src), 7)
        torch.set_num_threads(before)
        best[threads] = 2 * src.numel() * 4 / seconds
    noise = timed(lambda: torch.randn(DIM), 5)
    return {
        "bytes_per_second": max(best.values()),
        "by_threads": best,
        "gaussian_seconds": noise,
    }


def floor(work: dict, machine_bw: dict, epochs: int = 1) -> dict:
    """Bytes a dp-fedadam round must move, and the time they take at the measured bandwidth.

    Server: the noise vector written once (4d) and one Adam pass (read the noised mean, read and
    write m, v and the parameters: 28d). Clients, per user of ``rows`` touched rows of width K:
    read the rows (4rK), write the update (4rK), and the server adds it to the sum (read 4rK,
    read and write the sum's rows 8rK); per word visit: forward gather (4K) and backward
    scatter-add (8K). Float32 throughout. ``compute floor`` adds the measured time of drawing
    d Gaussian numbers (compute-bound, not bandwidth-bound).
    """
    d, k = work["dim"], work["width"]
    server = 32 * d
    clients = 20 * work["rows_per_round"] * k + 12 * work["tokens_per_round"] * k
    seconds = (server + clients) / machine_bw["bytes_per_second"]
    return {
        "bytes": server + clients,
        "server_bytes": server,
        "client_bytes": clients,
        "seconds": seconds,
        "compute_seconds": seconds + machine_bw["gaussian_seconds"],
    }


def run_case(tag: str, **kw) -> dict:
    out = HERE / "cases"
    out.mkdir(exist_ok=True)
    target = out / f"{tag}.json"
    argv = [sys.executable, str(HERE / "engines.py"), "--json", str(target)]
    for key, value in kw.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    print(f"[bench] {tag}: {' '.join(argv[2:])}", flush=True)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, cwd=HERE.parent, stdout=subprocess.DEVNULL)
    result = json.loads(target.read_text())
    result["wall_seconds"] = time.perf_counter() - t0
    print(
        f"[bench] {tag}: {result['seconds_per_round']:.3f} s/round, "
        f"peak RSS {result['peak_rss_mb']:.0f} MB",
        flush=True,
    )
    return result


def ensure_data(data: tuple[str, int, int]) -> None:
    root, clients, _ = data
    if not (HERE.parent / root / "stackoverflow.sqlite").exists():
        print(f"[bench] generating {root} ({clients:,} synthetic users, once)", flush=True)
        subprocess.run(
            [sys.executable, "-m", "fedprivopt.cli", "data", "synth", "--out", root,
             "--clients", str(clients), "--seed", "0"],
            check=True, cwd=HERE.parent,
        )  # fmt: skip


def bench_engines(rounds: int, flower_clients: list[int], device: str) -> dict:
    """B1: the Flower engine and the fast engine on the same runs; the same final model."""
    ensure_data(FULL_DATA)
    root, synth, population = FULL_DATA
    common = dict(rounds=rounds, population=population, data=root, synth_clients=synth)
    cases = []
    for clients in flower_clients:
        params = {}
        results = {}
        for engine in ("flower", "fast"):
            path = HERE / "cases" / f"b1-{engine}-{clients}.pt"
            params[engine] = path
            results[engine] = run_case(
                f"b1-{engine}-{clients}-{device}", engine=engine, clients=clients,
                device=device, save_params=path, **common,
            )  # fmt: skip
        results["preloaded"] = run_case(
            f"b1-preloaded-{clients}-{device}", engine="fast", clients=clients, preload=1,
            device=device, **common,
        )  # fmt: skip
        results["sequential"] = run_case(
            f"b1-sequential-{clients}-{device}", engine="fast", clients=clients, vectorize=0,
            device=device, **common,
        )  # fmt: skip
        a, b = (torch.load(params[e], weights_only=True) for e in ("flower", "fast"))
        cases.append(
            {
                "clients": clients,
                "flower": results["flower"],
                "fast": results["fast"],
                "sequential": results["sequential"],
                "preloaded": results["preloaded"],
                "speedup": results["flower"]["seconds_per_round"]
                / results["fast"]["seconds_per_round"],
                "speedup_preloaded": results["flower"]["seconds_per_round"]
                / results["preloaded"]["seconds_per_round"],
                "max_abs_param_diff": float((a - b).abs().max()),
            }
        )
    return {"device": device, "cases": cases}


def bench_scaling(rounds: int, clients: list[int], device: str, machine_bw: dict) -> dict:
    """B2 + B3: the fast engine at growing cohorts, population 342,477; against the floor."""
    ensure_data(SO_DATA)
    root, synth, population = SO_DATA
    cases = []
    for n in clients:
        result = run_case(
            f"b2-fast-{n}-{device}", engine="fast", clients=n, rounds=rounds,
            population=population, data=root, synth_clients=synth, device=device,
        )  # fmt: skip
        result["floor"] = floor(result["work"], machine_bw)
        result["per_client_seconds"] = (
            result["seconds_per_round"] / result["work"]["users_per_round"]
        )
        cases.append(result)
    return {"device": device, "cases": cases}


def write(rows: list[dict], info: dict, engines: list[dict], scaling: list[dict], bw: dict):
    (HERE / "results.json").write_text(
        json.dumps(
            {
                "machine": info,
                "results": rows,
                "engines": engines,
                "scaling": scaling,
                "bandwidth": bw,
            },
            indent=2,
        )
    )
    lines = [
        "# Benchmark results",
        "",
        "Written by `make bench` (`benchmarks/run.py`). Micro-benchmarks: medians of repeated "
        "runs. Engine cases (`benchmarks/engines.py`, one process each): `dp-fedadam` on "
        "full-size StackOverflow tag prediction (10,000 words x 500 tags = 5,000,500 "
        "parameters) on synthetic data, seconds per round = median of rounds 2..R (round 1 "
        "holds start-up: Ray, the Flower engine's user discovery, warm-up). What each change "
        "did, and why: `benchmarks/NOTES.md`.",
        "",
        "Machine: " + ", ".join(f"{k} = {v}" for k, v in info.items()),
        "",
        "## Micro-benchmarks",
        "",
        "| case | device | seconds |",
        "|---|---|---|",
    ]
    lines += [f"| {r['case']} | {r['device']} | {r['seconds']:.4f} |" for r in rows]
    for block in engines:
        if any("preloaded" not in c for c in block["cases"]):
            continue  # written by an older version of this script: run `--only engines` again
        lines += [
            "",
            f"## B1: Flower engine vs fast engine ({block['device']}, population 8,000)",
            "",
            "| clients/round | flower s/round | fast s/round (data read each round) | speedup "
            "| fast s/round (data preloaded) | speedup | fast, LocalTrainer one user at a "
            "time | flower round 1 s (start-up) | flower peak RSS MB | fast peak RSS MB | max "
            "abs difference of final models |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c in block["cases"]:
            lines.append(
                f"| {c['clients']} | {c['flower']['seconds_per_round']:.2f} | "
                f"{c['fast']['seconds_per_round']:.3f} | {c['speedup']:.0f}x | "
                f"{c['preloaded']['seconds_per_round']:.3f} | {c['speedup_preloaded']:.0f}x | "
                f"{c['sequential']['seconds_per_round']:.2f} | "
                f"{c['flower']['round_seconds'][0]:.0f} | {c['flower']['peak_rss_mb']:.0f} | "
                f"{c['fast']['peak_rss_mb']:.0f} | {c['max_abs_param_diff']:.1e} |"
            )
    if bw:
        gbs = bw["bytes_per_second"] / 1e9
        lines += [
            "",
            f"Memory bandwidth (256 MB tensor copy, read + write): {gbs:.1f} GB/s; drawing "
            f"{DIM:,} Gaussians: {bw['gaussian_seconds']:.3f} s.",
        ]
    for block in scaling:
        lines += [
            "",
            f"## B2/B3: fast engine scaling and floor ({block['device']}, population 342,477)",
            "",
            "| clients/round | s/round | ms per client update | peak RSS MB | rows/round | "
            "word visits/round | floor s (bandwidth) | measured/floor | floor s (+ Gaussian "
            "draws) | measured/that floor |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c in block["cases"]:
            f, w = c["floor"], c["work"]
            lines.append(
                f"| {c['clients_per_round']} | {c['seconds_per_round']:.3f} | "
                f"{1000 * c['per_client_seconds']:.2f} | {c['peak_rss_mb']:.0f} | "
                f"{w['rows_per_round']:,.0f} | {w['tokens_per_round']:,.0f} | "
                f"{f['seconds']:.3f} | {c['seconds_per_round'] / f['seconds']:.1f}x | "
                f"{f['compute_seconds']:.3f} | "
                f"{c['seconds_per_round'] / f['compute_seconds']:.1f}x |"
            )
    (HERE / "RESULTS.md").write_text("\n".join(lines) + "\n")


def rebuild_from_cases() -> int:
    """B1-B3 tables from the case files of earlier runs (e.g. cases re-run one by one)."""
    cases = HERE / "cases"

    def load(tag: str) -> dict:
        return json.loads((cases / f"{tag}.json").read_text())

    engines = []
    block = []
    for clients in (20, 100):
        r = {
            k: load(f"b1-{k}-{clients}-cpu") for k in ("flower", "fast", "preloaded", "sequential")
        }
        a, b = (
            torch.load(cases / f"b1-{e}-{clients}.pt", weights_only=True)
            for e in ("flower", "fast")
        )
        block.append(
            {
                "clients": clients,
                **r,
                "speedup": r["flower"]["seconds_per_round"] / r["fast"]["seconds_per_round"],
                "speedup_preloaded": r["flower"]["seconds_per_round"]
                / r["preloaded"]["seconds_per_round"],
                "max_abs_param_diff": float((a - b).abs().max()),
            }
        )
    engines.append({"device": "cpu", "cases": block})
    bw = bandwidth()
    scaling_cases = []
    for n in (10, 100, 1000):
        result = load(f"b2-fast-{n}-cpu")
        result["floor"] = floor(result["work"], bw)
        result["per_client_seconds"] = (
            result["seconds_per_round"] / result["work"]["users_per_round"]
        )
        scaling_cases.append(result)
    previous = json.loads((HERE / "results.json").read_text())
    write(
        previous.get("results", []),
        machine(),
        engines,
        [{"device": "cpu", "cases": scaling_cases}],
        bw,
    )
    print(f"wrote {HERE / 'RESULTS.md'}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and rounds")
    parser.add_argument(
        "--only", choices=["micro", "engines", "scaling"], action="append",
        help="run only these groups (repeatable; default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--from-cases", action="store_true",
        help="rebuild B1-B3 from benchmarks/cases/*.json (re-measuring only the bandwidth)",
    )  # fmt: skip
    args = parser.parse_args()
    groups = set(args.only or ["micro", "engines", "scaling"])
    if args.from_cases:
        return rebuild_from_cases()
    repeat = 3 if args.quick else 7
    rounds = 3 if args.quick else 5
    info = machine()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    previous = {}
    if (HERE / "results.json").exists():
        previous = json.loads((HERE / "results.json").read_text())
    rows = previous.get("results", [])
    engines, scaling = previous.get("engines", []), previous.get("scaling", [])
    bw = previous.get("bandwidth", {})
    if "micro" in groups:
        rows = []
        for device in devices:
            rows += bench_privacy_core(repeat, device)
        rows += bench_accounting(repeat)
        for r in rows:
            print(f"{r['seconds']:9.4f} s  [{r['device']}]  {r['case']}")
    if "engines" in groups:
        engines = [bench_engines(rounds, [20, 100], d) for d in devices]
    if "scaling" in groups:
        bw = bandwidth()
        scaling = [bench_scaling(rounds, [10, 100, 1000], d, bw) for d in devices]
    write(rows, info, engines, scaling, bw)
    print(f"wrote {HERE / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
