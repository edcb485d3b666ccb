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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fedprivopt.core.threads import passive_openmp_wait  # noqa: E402

passive_openmp_wait()  # as the command line does, before torch loads (NOTES.md, entry 13)

import torch  # noqa: E402
from data_generation import bench_data_generation, data_lines  # noqa: E402
from next_word import bench_next_word, next_word_lines  # noqa: E402
from simulate import bench_simulate, simulate_lines  # noqa: E402

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


def code_version() -> str:
    """The commit the benchmarks ran (``git rev-parse --short HEAD``), marked if files differ."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent, capture_output=True,
            text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(  # the results files this script writes do not count
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
             ":!benchmarks/results.json", ":!benchmarks/RESULTS.md"],
            cwd=HERE.parent, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "not recorded (no git)"
    return f"{head} + uncommitted changes" if dirty else head


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
# B1 on users of real size (data synth --user-sizes real: at least 100 examples, mean 443)
REAL_DATA = ("data/stackoverflow-synthetic-real", 10_000, 8_000)
USER_SIZES = {FULL_DATA: "small", SO_DATA: "small", REAL_DATA: "real"}


def bandwidth(device: str = "cpu") -> dict:
    """Memory bandwidth of ``device``: bytes read + written by a 256 MB tensor copy."""
    src = torch.ones(64 * 1024 * 1024, device=device)
    dst = torch.empty_like(src)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def copy() -> None:
        dst.copy_(src)
        sync()

    def draw() -> None:
        torch.randn(DIM, device=device)
        sync()

    best = {}
    for threads in sorted({1, torch.get_num_threads()}) if device == "cpu" else [0]:
        before = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        seconds = timed(copy, 7)
        torch.set_num_threads(before)
        best[threads] = 2 * src.numel() * 4 / seconds
    return {
        "device": device,
        "bytes_per_second": max(best.values()),
        "by_threads": best,
        "gaussian_seconds": timed(draw, 5),
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
             "--clients", str(clients), "--seed", "0", "--user-sizes", USER_SIZES[data]],
            check=True, cwd=HERE.parent,
        )  # fmt: skip


B1_VARIANTS = {
    # name: (what it is, extra arguments of benchmarks/engines.py)
    "fast": ("users read from the token store each round", {}),
    "sqlite": ("users decoded from SQLite each round", {"token_cache": 0}),
    "preloaded": ("users preloaded as tensors", {"preload": 1}),
    "sequential": ("LocalTrainer one user at a time", {"vectorize": 0}),
}


def bench_engines(
    rounds: int, flower_clients: list[int], device: str, flower: bool, data=FULL_DATA
) -> dict:
    """B1: the Flower engine and the fast engine on the same runs; the same final model."""
    ensure_data(data)
    root, synth, population = data
    sizes = USER_SIZES[data]
    common = dict(
        rounds=rounds, population=population, data=root, synth_clients=synth,
        synth_user_sizes=sizes,
    )  # fmt: skip
    tag = "b1" if sizes == "small" else f"b1-{sizes}"
    cases = []
    for clients in flower_clients:
        results = {}
        params = {}
        for name in (["flower"] if flower else []) + list(B1_VARIANTS):
            extra = B1_VARIANTS.get(name, ("", {}))[1]
            engine = "flower" if name == "flower" else "fast"
            if name in ("flower", "fast"):
                params[name] = HERE / "cases" / f"{tag}-{name}-{clients}-{device}.pt"
                extra = {**extra, "save_params": params[name]}
            results[name] = run_case(
                f"{tag}-{name}-{clients}-{device}", engine=engine, clients=clients, device=device,
                **common, **extra,
            )  # fmt: skip
        case = {"clients": clients, **results}
        if flower:
            a, b = (torch.load(params[e], weights_only=True) for e in ("flower", "fast"))
            case["max_abs_param_diff"] = float((a - b).abs().max())
            flower_s = results["flower"]["seconds_per_round"]
            case["speedups"] = {
                name: flower_s / results[name]["seconds_per_round"] for name in B1_VARIANTS
            }
        cases.append(case)
    return {
        "device": device, "machine": machine(), "code": code_version(), "cases": cases,
        "user_sizes": sizes,
    }  # fmt: skip


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
    return {
        "device": device,
        "machine": machine(),
        "code": code_version(),
        "bandwidth": machine_bw,
        "cases": cases,
    }


def _machine_line(info: dict) -> str:
    return ", ".join(f"{k} = {v}" for k, v in info.items())


def _b1_lines(block: dict) -> list[str]:
    flower = "flower" in block["cases"][0]
    head = ["clients/round"] + (["flower s/round"] if flower else [])
    for name, (what, _) in B1_VARIANTS.items():
        head.append(f"{name}: {what}, s/round")
        if flower and name != "sequential":
            head.append("speedup")
    if flower:
        head += ["flower round 1 s (start-up)", "flower peak RSS MB", "fast peak RSS MB"]
        head.append("max abs difference of final models (flower vs fast)")
    lines = [
        "",
        f"## B1: Flower engine vs fast engine ({block['device']}, population 8,000"
        + (", users of real size)" if block.get("user_sizes") == "real" else ")"),
        "",
        f"Machine: {_machine_line(block['machine'])}",
        "",
        f"Code: {block.get('code', 'not recorded')}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for c in block["cases"]:
        row = [str(c["clients"])]
        if flower:
            row.append(f"{c['flower']['seconds_per_round']:.2f}")
        for name in B1_VARIANTS:
            row.append(f"{c[name]['seconds_per_round']:.3f}")
            if flower and name != "sequential":
                row.append(f"{c['speedups'][name]:.0f}x")
        if flower:
            row += [
                f"{c['flower']['round_seconds'][0]:.0f}",
                f"{c['flower']['peak_rss_mb']:.0f}",
                f"{c['fast']['peak_rss_mb']:.0f}",
                f"{c['max_abs_param_diff']:.1e}",
            ]
        lines.append("| " + " | ".join(row) + " |")
    build = max(c[name].get("cache_seconds", 0.0) for c in block["cases"] for name in B1_VARIANTS)
    lines += [
        "",
        "The token store (`task-params.token-cache`: every user encoded once, then reused) was "
        f"opened, or built if it did not exist yet, in {build:.1f} s, before the timed rounds of "
        "the case that first needed it.",
    ]
    return lines


def _b2_lines(block: dict) -> list[str]:
    bw = block["bandwidth"]
    lines = [
        "",
        f"## B2/B3: fast engine scaling and floor ({block['device']}, population 342,477, "
        f"median of rounds 2..{block['cases'][0]['rounds']})",
        "",
        f"Machine: {_machine_line(block['machine'])}",
        "",
        f"Code: {block.get('code', 'not recorded')}",
        "",
        f"Memory bandwidth ({block['device']}, 256 MB tensor copy, read + write): "
        f"{bw['bytes_per_second'] / 1e9:.1f} GB/s; drawing {DIM:,} Gaussians: "
        f"{bw['gaussian_seconds']:.4f} s.",
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
            f"{f['seconds']:.3g} | {c['seconds_per_round'] / f['seconds']:.1f}x | "
            f"{f['compute_seconds']:.3g} | "
            f"{c['seconds_per_round'] / f['compute_seconds']:.1f}x |"
        )
    build = [c.get("cache_seconds", 0.0) for c in block["cases"]]
    lines += [
        "",
        f"Token store: opened, or built if it did not exist yet, in {max(build):.0f} s (once, "
        "before the first case).",
    ]
    return lines


def write(results: dict, root: Path) -> None:
    """``results.json`` and ``RESULTS.md`` under ``root`` from ``results``."""
    (root / "results.json").write_text(json.dumps(results, indent=2))
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
        f"Machine: {_machine_line(results['machine'])}",
        "",
        f"Code: {results.get('code', 'not recorded')} (each block below names its own)",
        "",
        "## Micro-benchmarks",
        "",
        "| case | device | seconds | code |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['case']} | {r['device']} | {r['seconds']:.3g} | {r.get('code', 'not recorded')} |"
        for r in results["micro"]
    ]
    for block in results["engines"] + results.get("engines_real", []):
        lines += _b1_lines(block)
    for block in results["scaling"]:
        lines += _b2_lines(block)
    for block in results.get("data", []):
        lines += data_lines(block)
    for block in results.get("nextword", []):
        lines += next_word_lines(block)
    for block in results.get("simulate", []):
        lines += simulate_lines(block)
    (root / "RESULTS.md").write_text("\n".join(lines) + "\n")


def _replace_devices(old: list[dict], new: list[dict]) -> list[dict]:
    """``old``'s entries of the devices ``new`` has none of, then ``new``'s; the CPU's first."""
    ran = {e.get("device", "cpu") for e in new}
    out = [e for e in old if e.get("device", "cpu") not in ran] + list(new)
    return sorted(out, key=lambda e: e.get("device", "cpu") != "cpu")  # stable


def merge(results: dict, other: dict, code: str = "") -> dict:
    """``results`` with the rows and blocks of ``other`` (another machine's run) added.

    Per group, ``other``'s entries replace those of ``results`` for the same device. Each added
    block keeps the code it ran (its own record, else ``other``'s, else ``code``).
    """
    out = dict(results)
    stamp = other.get("code") or code or "not recorded"
    for group in ("micro", "engines", "engines_real", "scaling", "data", "nextword", "simulate"):
        added = [dict(e, code=e.get("code") or stamp) for e in other.get(group, [])]
        if group == "micro":
            added = [dict(r, machine=other["machine"]) for r in added]
        out[group] = _replace_devices(results.get(group, []), added)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and rounds")
    parser.add_argument(
        "--only", action="append",
        choices=["micro", "engines", "engines-real", "scaling", "data", "nextword", "simulate"],
        help="run only these groups (repeatable; default: all; the others are kept from the "
        "previous results.json)",
    )  # fmt: skip
    parser.add_argument(
        "--devices", default="",
        help="comma-separated devices (default: cpu, and cuda when available)",
    )  # fmt: skip
    parser.add_argument(
        "--no-flower", action="store_true",
        help="B1 without the Flower engine (a machine without Flower and Ray)",
    )  # fmt: skip
    parser.add_argument("--out", default=str(HERE), help="where results.json/RESULTS.md go")
    parser.add_argument(
        "--code", default="",
        help="with --merge: the code the merged run used, when its results do not record it",
    )  # fmt: skip
    parser.add_argument(
        "--merge", default="",
        help="add the devices of another machine's results.json (e.g. a GPU run) and exit",
    )  # fmt: skip
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    empty = {
        "machine": machine(), "micro": [], "engines": [], "scaling": [], "data": [],
        "nextword": [], "simulate": [], "engines_real": [],
    }  # fmt: skip
    previous = empty
    if (out / "results.json").exists():
        loaded = json.loads((out / "results.json").read_text())
        previous = loaded if "micro" in loaded else empty  # older layouts are not reused
    if args.merge:
        write(merge(previous, json.loads(Path(args.merge).read_text()), args.code), out)
        print(f"wrote {out / 'RESULTS.md'}")
        return 0
    groups = set(
        args.only or ["micro", "engines", "engines-real", "scaling", "data", "nextword", "simulate"]
    )
    repeat = 3 if args.quick else 7
    rounds = 3 if args.quick else 5
    devices = args.devices.split(",") if args.devices else (
        ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    )  # fmt: skip
    results = dict(previous, machine=machine(), code=code_version())
    if "micro" not in groups and "machine" in previous:  # the line above the micro-benchmarks
        results["machine"] = previous["machine"]  # names their machine (blocks name their own)
    if "micro" in groups:
        rows = []
        for device in devices:
            rows += bench_privacy_core(repeat, device)
        if "cpu" in devices:  # accounting runs on the CPU only
            rows += bench_accounting(repeat)
        for r in rows:
            print(f"{r['seconds']:9.4f} s  [{r['device']}]  {r['case']}")
        results["micro"] = [dict(r, code=results["code"]) for r in rows]
    if "engines" in groups:
        flower = not args.no_flower
        results["engines"] = [bench_engines(rounds, [20, 100], d, flower) for d in devices]
    if "engines-real" in groups:
        # issue 19: the engines at 100 clients on users of real size (rounds of tens of seconds
        # in the Flower engine on 2 cores)
        results["engines_real"] = [
            bench_engines(rounds, [100], d, not args.no_flower, REAL_DATA) for d in devices
        ]
    if "scaling" in groups:
        # B2 rounds are short (the Flower engine is not run): twice as many, so that a stretch
        # of noise from the machine (seconds long, measured here) moves the median less
        results["scaling"] = [
            bench_scaling(2 * rounds, [10, 100, 1000], d, bandwidth(d)) for d in devices
        ]
    if "data" in groups:
        results["data"] = [dict(bench_data_generation(), code=results["code"])]
    if "nextword" in groups:
        # compute-bound: one round of 50 real-size users is minutes on 2 cores
        results["nextword"] = [
            dict(bench_next_word(rounds=1, device=d), code=results["code"]) for d in devices
        ]
    if "simulate" in groups:
        # S1: the command a user runs, end to end, beside the harness's round (CPU only)
        ensure_data(FULL_DATA)
        block = bench_simulate(2 * rounds + 2, machine())
        results["simulate"] = [dict(block, code=results["code"])]
    for group in groups:  # a group run on some devices keeps the other devices' blocks
        key = group.replace("-", "_")
        results[key] = _replace_devices(previous.get(key, []), results[key])
    write(results, out)
    print(f"wrote {out / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
