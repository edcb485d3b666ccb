"""One engine benchmark case, run in its own process (clean peak RSS, its own Ray).

``python benchmarks/engines.py --engine fast --clients 100 --rounds 5 --json OUT.json`` runs
``dp-fedadam`` on full-size StackOverflow tag prediction (5,000,500 parameters, the shape of
``simulations/stackoverflow-tp.toml``) on a synthetic dataset, times every round and writes:

- ``round_seconds``: wall time of each round (round 1 includes start-up: Ray, data, warm-up);
- ``seconds_per_round``: median over rounds 2..R;
- ``peak_rss_mb``: peak resident memory of this process (``ru_maxrss``; Ray workers excluded);
- ``work``: what the rounds had to do, for the floor (:func:`round_work`);
- ``params``: where the final model was saved (to compare engines).

:mod:`benchmarks.run` calls it for B1 (Flower engine vs fast engine), B2 (scaling to 1,000 clients
per round with a population of 342,477) and B3 (the floor).
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from fedprivopt.core.threads import passive_openmp_wait  # noqa: E402

passive_openmp_wait()  # as the command line does, before torch loads (NOTES.md, entry 13)

import torch  # noqa: E402

from fedprivopt.clients.trainer import epoch_orders  # noqa: E402
from fedprivopt.privacy.rng import RngFactory  # noqa: E402
from fedprivopt.simulation.config import load_config  # noqa: E402
from fedprivopt.simulation.engines import run_fast, run_flower  # noqa: E402
from fedprivopt.simulation.run import build_run  # noqa: E402
from fedprivopt.simulation.writer import RunWriter  # noqa: E402

PRESET = ROOT / "simulations" / "stackoverflow-tp.toml"


class TimedWriter(RunWriter):
    """Records when each round ends; no evaluation, rows or checkpoints (pure round cost)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stamps: list[float] = []
        self.metrics: list[dict] = []

    def wants_eval(self, round_num: int) -> bool:
        return False

    def on_round(self, result, eval_metrics) -> None:
        self.stamps.append(time.perf_counter())
        self.metrics.append(dict(result.metrics))

    def save_checkpoint(self) -> None:
        pass


def round_work(task, alg, rounds: int) -> dict:
    """Per-round averages of what the cohort touched: users, rows, tokens x epochs.

    Replays each round's sampling and each user's example subset (the same keyed generators as
    the run), so the numbers are those of the rounds just timed.
    """
    c = alg.config
    V = task.num_features
    users = rows = tokens = 0
    client_seed = alg.client_settings().seed
    rngs = RngFactory(seed=client_seed)
    for r in range(1, rounds + 1):
        for u in alg.sampler.sample(r, "sampling"):
            u = int(u)
            x, _ = task.user_data(u)
            subset, _ = epoch_orders(
                int(x.shape[0]),
                epochs=c.local_epochs,
                max_examples=c.max_examples or None,
                generator=rngs.generator(r, "shuffle", "train", u),
            )
            x = x[subset]
            users += 1
            rows += int(torch.unique(x[x < V]).numel()) + 1  # + the bias row
            tokens += int((x < V).sum()) * c.local_epochs
    return {
        "users_per_round": users / rounds,
        "rows_per_round": rows / rounds,
        "tokens_per_round": tokens / rounds,
        "width": task.num_tags,
        "dim": int(alg.params.numel()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine", choices=["fast", "flower"], required=True)
    parser.add_argument("--clients", type=int, required=True, help="clients per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--population", type=int, default=8000)
    parser.add_argument("--data", default="data/stackoverflow-synthetic")
    parser.add_argument("--synth-clients", type=int, default=10000)
    parser.add_argument(
        "--synth-user-sizes", default="small", help="task parameter synth-user-sizes (small, real)"
    )
    parser.add_argument("--vectorize", type=int, default=1)
    parser.add_argument("--actors", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ray-cpus", type=int, default=0)
    parser.add_argument("--save-params", default="")
    parser.add_argument(
        "--preload", type=int, default=0, help="1: read every user into memory before timing"
    )
    parser.add_argument(
        "--token-cache", type=int, default=1,
        help="1: users read from the memory-mapped token store (built once, before timing)",
    )  # fmt: skip
    parser.add_argument("--json", required=True)
    args = parser.parse_args()

    overrides = {
        "strategy": "dp-fedadam",
        "engine": args.engine,
        "clients-per-round": args.clients,
        "num-server-rounds": args.rounds,
        "population": args.population,
        "device": args.device,
        "vectorize": bool(args.vectorize),
        "fast-actors": args.actors,
        "ray-cpus": args.ray_cpus,
        "task-params.data-dir": args.data,
        "task-params.synth-clients": args.synth_clients,
        "task-params.synth-user-sizes": args.synth_user_sizes,
        "task-params.num-users": args.population,
        "task-params.cache-users": args.population if args.preload else 0,
        "task-params.token-cache": bool(args.token_cache),
    }
    config = load_config(PRESET, overrides)
    t0 = time.perf_counter()
    task, alg = build_run(config)
    t_cache = time.perf_counter()
    task.encoded_users()  # the token store: opened, or built once (timed apart)
    cache_seconds = time.perf_counter() - t_cache
    if args.preload:  # the data in memory, as a simulator that preloads its dataset has it
        for u in range(task.num_users):
            task.user_data(u)
    setup = time.perf_counter() - t0
    out = Path(args.json).with_suffix(".run")
    out.mkdir(parents=True, exist_ok=True)
    writer = TimedWriter(out, config, alg, task)
    start = time.perf_counter()
    if args.engine == "flower":
        run_flower(config, task, alg, writer)
    else:
        run_fast(config, task, alg, writer)
    stamps = [start, *writer.stamps]
    seconds = [b - a for a, b in itertools.pairwise(stamps)]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    steady = sorted(seconds[1:]) or seconds
    result = {
        "engine": args.engine,
        "vectorize": bool(args.vectorize),
        "preload": bool(args.preload),
        "token_cache": bool(args.token_cache),
        "cache_seconds": cache_seconds,
        "actors": args.actors,
        "device": args.device,
        "clients_per_round": args.clients,
        "population": args.population,
        "synth_user_sizes": args.synth_user_sizes,
        "rounds": args.rounds,
        "setup_seconds": setup,
        "round_seconds": seconds,
        "seconds_per_round": steady[len(steady) // 2],
        "peak_rss_mb": peak_mb,
        "epsilon": alg.epsilon(),
        "cohort_sizes": [m["cohort_size"] for m in writer.metrics],
        "torch_threads": torch.get_num_threads(),
    }
    if args.save_params:
        torch.save(alg.params, args.save_params)
        result["params"] = args.save_params
    result["work"] = round_work(task, alg, args.rounds)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "work"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
