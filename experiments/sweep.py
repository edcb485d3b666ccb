"""Equal-effort hyperparameter sweeps for a preset: every strategy gets the same number of points.

A sweep file (TOML) names the preset, the tuning seeds, the metric, overrides for every tuning run
(e.g. evaluating on the ``heldout`` split so that the test split stays for the report) and one grid
per strategy::

    preset = "simulations/adadps-paper.toml"
    seeds = [0, 1]
    metric = "eval_accuracy"      # the point with the best mean is selected
    mode = "max"                  # "min" for losses, "max" for accuracies
    report = "eval_loss"          # shown beside it, and breaks ties of the metric (lower wins)
    [set]
    "task-params.eval-split" = "heldout"
    [grid.dp-fedavg]
    server-learning-rate = [0.5, 1.0, 2.0, 4.0]

A grid named ``"<strategy>:<variant>"`` runs ``<strategy>`` with the grid's ``fixed`` table
added to the overrides (e.g. ``[grid."adadps:two-level".fixed]`` with
``"side-information.kind" = "two-level"``), so that variants of one strategy can be compared.

Every grid must have the same number of points (the product of its value lists), so that no
strategy is tuned harder than another. Each point runs :func:`fedprivopt.simulation.run.simulate`
once per seed (in parallel worker processes, one CPU thread each), finished runs are reused, and
the result is
written as ``OUT/sweep.md`` (mean ± std of the metric and of the reported metric per point, the
selected point per strategy marked) and ``OUT/sweep.json``.

Usage::

    python experiments/sweep.py experiments/adadps-paper.sweep.toml --out runs/sweep --jobs 2
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import shutil
import statistics
import sys
from pathlib import Path

import tomllib


def _points(grid: dict[str, list]) -> list[dict[str, object]]:
    keys = sorted(k for k in grid if k != "fixed")
    return [
        dict(zip(keys, values, strict=True))
        for values in itertools.product(*(grid[k] for k in keys))
    ]


def _label(strategy: str, point: dict[str, object], seed: int) -> str:
    parts = [strategy] + [f"{k}={v}" for k, v in point.items()] + [f"seed{seed}"]
    return "__".join(parts).replace("/", "_")


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _simulate(preset: str, strategy: str, seed: int, overrides: dict, run_dir: str) -> None:
    """One run, in a worker process (imports once per worker, one CPU thread)."""
    import torch

    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import simulate

    torch.set_num_threads(1)
    config = load_config(preset, {**overrides, "strategy": strategy, "seed": seed})
    simulate(config, run_dir, progress=False)


def _run(
    pool: concurrent.futures.Executor,
    preset: str,
    name: str,
    grid: dict,
    point: dict,
    seed: int,
    sets: dict,
    out: Path,
) -> concurrent.futures.Future:
    run_dir = out / "runs" / _label(name, point, seed)
    if (run_dir / "summary.json").exists():
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(None)
        return done
    if run_dir.exists():  # a run killed mid-way: start it again
        shutil.rmtree(run_dir)
    overrides = {**sets, **grid.get("fixed", {}), **point}
    return pool.submit(_simulate, preset, name.split(":")[0], seed, overrides, str(run_dir))


def main(argv: list[str] | None = None) -> int:
    """Run the sweep and write the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", help="sweep file (TOML)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--jobs", type=int, default=2, help="parallel runs")
    parser.add_argument("--strategies", help="only these strategies (comma-separated)")
    args = parser.parse_args(argv)
    spec = tomllib.loads(Path(args.sweep).read_text())
    grids: dict[str, dict[str, list]] = spec["grid"]
    if args.strategies:
        grids = {k: v for k, v in grids.items() if k in args.strategies.split(",")}
    sizes = {name: len(_points(g)) for name, g in spec["grid"].items()}
    if len(set(sizes.values())) != 1:
        raise SystemExit(f"unequal tuning effort: grid points per strategy {sizes}")
    out = Path(args.out)
    metric, seeds, sets = spec["metric"], spec["seeds"], spec.get("set", {})
    mode, report = spec.get("mode", "max"), spec.get("report", "eval_accuracy")
    if mode not in ("min", "max"):
        raise SystemExit(f"mode must be 'min' or 'max', got {mode!r}")
    jobs = [
        (name, point, seed)
        for name, grid in grids.items()
        for point in _points(grid)
        for seed in seeds
    ]
    results: dict[tuple, dict] = {}
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        futures = {
            _run(pool, spec["preset"], name, grids[name], point, seed, sets, out): (
                name,
                point,
                seed,
            )
            for name, point, seed in jobs
        }
        for i, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            name, point, seed = futures[fut]
            fut.result()
            run_dir = out / "runs" / _label(name, point, seed)
            summary = json.loads((run_dir / "summary.json").read_text())
            results[(name, json.dumps(point, sort_keys=True), seed)] = summary
            print(
                f"[{i}/{len(jobs)}] {_label(name, point, seed)}: "
                f"{metric} {summary['final'].get(metric, float('nan')):.4f}",
                file=sys.stderr,
                flush=True,
            )
    rows = []
    for name, grid in grids.items():
        for point in _points(grid):
            key = json.dumps(point, sort_keys=True)
            finals = [results[(name, key, s)]["final"] for s in seeds]
            values = [f.get(metric, float("nan")) for f in finals]
            shown = [f.get(report, float("nan")) for f in finals]
            rows.append(
                {
                    "strategy": name,
                    "point": point,
                    "seeds": seeds,
                    "values": values,
                    "mean": statistics.fmean(values),
                    "std": _std(values),
                    "report_mean": statistics.fmean(shown),
                    "report_std": _std(shown),
                    "epsilon": results[(name, key, seeds[0])]["epsilon"],
                }
            )
    sign = 1.0 if mode == "max" else -1.0
    tie = -1.0 if report == "eval_loss" else 1.0  # a tie of the metric: the better report wins

    def key(row: dict) -> tuple[float, float]:
        return (round(sign * row["mean"], 9), tie * row["report_mean"])

    best = {}
    for row in rows:
        old = best.get(row["strategy"])
        if old is None or key(row) > key(old):
            best[row["strategy"]] = row
    lines = [
        f"# Sweep of {spec['preset']}",
        "",
        f"Selected by the {mode} mean of {metric} over seeds {seeds}; overrides {sets}.",
        "",
        f"| strategy | point | {metric} | {report} | ε | selected |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        point = ", ".join(f"{k} = {v}" for k, v in row["point"].items())
        mark = "**yes**" if best[row["strategy"]] is row else ""
        lines.append(
            f"| {row['strategy']} | {point} | {row['mean']:.4f} ± {row['std']:.4f} | "
            f"{row['report_mean']:.4f} ± {row['report_std']:.4f} | "
            f"{row['epsilon']:.4g} | {mark} |"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.md").write_text("\n".join(lines) + "\n")
    (out / "sweep.json").write_text(json.dumps({"rows": rows, "spec": spec}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
