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
With ``select = "strategy"`` (default ``"grid"``) the grids of one strategy are its stages: their
points are pooled, one point is selected per strategy and equal effort counts a strategy's points
over all its stages (a strategy may then have stages over different hyperparameters).

Defaults must work beyond the one setting they were tuned in, so a sweep may name
**conditions**: each adds its own overrides (another noise level, another synthetic dataset), and
every point runs under each of them::

    report-limit = 6.2146         # a point whose mean report exceeds it anywhere loses
    [conditions]
    "sigma 0.3" = {}              # the preset as it is (its runs keep their unsuffixed names)
    "sigma 0.5" = {noise-multiplier = 0.5}

With conditions, a point's score is its **worst** condition: the smallest (``max`` mode) mean
margin of the metric over the task's public reference model (``summary.json``'s ``reference``;
the metric itself where there is none), so that a point is chosen for clearing the bias-only
level everywhere, not for being best on average. Points whose mean ``report`` exceeds
``report-limit`` in some condition rank below all others.

Every grid must have the same number of points (the product of its value lists), so that no
strategy is tuned harder than another. Each point runs :func:`fedprivopt.simulation.run.simulate`
once per seed (in parallel worker processes, one CPU thread each), finished runs are reused, and
the result is
written as ``OUT/sweep.md`` (mean ± std of the metric and of the reported metric per point, the
selected point per strategy marked) and ``OUT/sweep.json``. A run that fails is reported at once and
the others finish; the sweep then exits naming the failed runs, without tables (running it again
reuses every finished run).

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


def _label(strategy: str, point: dict[str, object], seed: int, condition: str = "") -> str:
    parts = [strategy] + [f"{k}={v}" for k, v in point.items()] + [f"seed{seed}"]
    if condition:
        parts.append(condition.replace(" ", "-"))
    return "__".join(parts).replace("/", "_")


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def rank_key(
    cells: dict[str, dict], mode: str, report: str, limit: float | None
) -> tuple[bool, float, float]:
    """The ordering key of a grid point (larger is better) from its per-condition cells.

    Each cell has the seeds' ``mean`` of the metric, its ``margin`` over the task's reference
    and ``report_mean``. Feasible points (``report_mean <= limit`` in every condition) come
    first; then the score: the mean itself with one condition, the worst margin with several;
    ties go to the better worst report (lower for a loss, higher otherwise).
    """
    sign = 1.0 if mode == "max" else -1.0
    values = list(cells.values())
    field = "mean" if len(values) == 1 else "margin"
    score = min(sign * c[field] for c in values)
    feasible = limit is None or all(c["report_mean"] <= limit for c in values)
    lower_better = report.endswith("loss")
    reports = [c["report_mean"] for c in values]
    worst = max(reports) if lower_better else min(reports)
    return (feasible, round(score, 9), -worst if lower_better else worst)


def _simulate(preset: str, strategy: str, seed: int, overrides: dict, run_dir: str) -> None:
    """One run, in a worker process (imports once per worker, one CPU thread)."""
    import torch

    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import simulate

    torch.set_num_threads(1)
    config = load_config(preset, {**overrides, "strategy": strategy, "seed": seed})
    simulate(config, run_dir, progress=False)
    # a sweep reads summary.json only; the paper preset's checkpoints are tens of MB each, and
    # the sweeps and comparisons of one session (about 2,100 runs) kept them all (46 GB) until
    # the disk was full
    for ckpt in Path(run_dir).glob("checkpoint*.pt*"):
        ckpt.unlink()


def _check_reused(run_dir: Path, preset: str, strategy: str, seed: int, overrides: dict) -> None:
    """Refuse to reuse a finished run whose stored configuration is not the one asked for.

    Forty-eighth review of issue 15 (input 2): a run's name holds its strategy, point, seed
    and condition only, so a sweep whose preset, ``[set]`` or condition table had changed
    reported the earlier runs (``num-server-rounds`` 1 where 3 was asked) as its own.
    """
    from fedprivopt.simulation.config import config_to_toml, load_config

    wanted = config_to_toml(load_config(preset, {**overrides, "strategy": strategy, "seed": seed}))
    stored = run_dir / "config.toml"
    if not stored.is_file() or stored.read_text(encoding="utf-8") != wanted:
        raise SystemExit(
            f"{run_dir}: a finished run whose config.toml is not this sweep's configuration for "
            "it (the preset, [set] or a condition changed since it ran); remove it or choose "
            "another --out"
        )


def _run(
    pool: concurrent.futures.Executor,
    preset: str,
    name: str,
    grid: dict,
    point: dict,
    seed: int,
    condition: tuple[str, dict],
    sets: dict,
    out: Path,
) -> concurrent.futures.Future:
    run_dir = out / "runs" / _label(name, point, seed, condition[0] if condition[1] else "")
    overrides = {**sets, **condition[1], **grid.get("fixed", {}), **point}
    if (run_dir / "summary.json").exists():
        _check_reused(run_dir, preset, name.split(":")[0], seed, overrides)
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(None)
        return done
    if run_dir.exists():  # a run killed mid-way: start it again
        shutil.rmtree(run_dir)
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
    select = spec.get("select", "grid")
    if select not in ("grid", "strategy"):
        raise SystemExit(f"select must be 'grid' or 'strategy', got {select!r}")

    def owner(name: str) -> str:
        return name.split(":")[0] if select == "strategy" else name

    sizes: dict[str, int] = {}
    for name, g in spec["grid"].items():
        sizes[owner(name)] = sizes.get(owner(name), 0) + len(_points(g))
    if len(set(sizes.values())) != 1:
        raise SystemExit(f"unequal tuning effort: grid points per strategy {sizes}")
    out = Path(args.out)
    metric, seeds, sets = spec["metric"], spec["seeds"], spec.get("set", {})
    mode, report = spec.get("mode", "max"), spec.get("report", "eval_accuracy")
    if mode not in ("min", "max"):
        raise SystemExit(f"mode must be 'min' or 'max', got {mode!r}")
    conditions: dict[str, dict] = spec.get("conditions", {"": {}})
    limit = spec.get("report-limit")
    jobs = [
        (name, point, cond, seed)
        for name, grid in grids.items()
        for point in _points(grid)
        for cond in conditions
        for seed in seeds
    ]
    results: dict[tuple, dict] = {}
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        futures = {
            _run(
                pool,
                spec["preset"],
                name,
                grids[name],
                point,
                seed,
                (cond, conditions[cond]),
                sets,
                out,
            ): (name, point, cond, seed)
            for name, point, cond, seed in jobs
        }
        failed = []
        for i, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            name, point, cond, seed = futures[fut]
            run_dir = out / "runs" / _label(name, point, seed, cond if conditions[cond] else "")
            try:
                fut.result()
            except Exception as exc:  # one failed run must not stop the others
                failed.append(f"{run_dir.name}: {type(exc).__name__}: {exc}")
                print(f"[{i}/{len(jobs)}] FAILED {failed[-1]}", file=sys.stderr, flush=True)
                continue
            summary = json.loads((run_dir / "summary.json").read_text())
            results[(name, json.dumps(point, sort_keys=True), cond, seed)] = summary
            print(
                f"[{i}/{len(jobs)}] {_label(name, point, seed, cond)}: "
                f"{metric} {summary['final'].get(metric, float('nan')):.4f}",
                file=sys.stderr,
                flush=True,
            )
    if failed:
        raise SystemExit(
            f"{len(failed)} of {len(jobs)} runs failed (the others are kept and reused when the "
            f"sweep is run again): " + "; ".join(failed[:5])
        )
    rows = []
    for name, grid in grids.items():
        for point in _points(grid):
            key = json.dumps(point, sort_keys=True)
            row = {"strategy": name, "point": point, "seeds": seeds, "conditions": {}}
            for cond in conditions:
                summaries = [results[(name, key, cond, s)] for s in seeds]
                values = [x["final"].get(metric, float("nan")) for x in summaries]
                shown = [x["final"].get(report, float("nan")) for x in summaries]
                ref = ((summaries[0].get("reference") or {}).get("metrics") or {}).get(metric)
                row["conditions"][cond] = {
                    "values": values,
                    "mean": statistics.fmean(values),
                    "std": _std(values),
                    "report_mean": statistics.fmean(shown),
                    "report_std": _std(shown),
                    "reference": ref,
                    "margin": statistics.fmean(values) - (ref or 0.0),
                    "epsilon": summaries[0]["epsilon"],
                }
            row["key"] = rank_key(row["conditions"], mode, report, limit)
            rows.append(row)
    best = {}
    for row in rows:
        old = best.get(owner(row["strategy"]))
        if old is None or row["key"] > old["key"]:
            best[owner(row["strategy"])] = row
    best_word = "largest" if mode == "max" else "smallest"
    if len(conditions) == 1:
        rule = f"whose mean {metric} over seeds {seeds} is {best_word}"
    else:
        rule = (
            f"whose worst margin over the conditions (the mean {metric} over seeds {seeds} "
            f"minus the task's reference model's) is {best_word}"
        )
    lines = [
        f"# Sweep of {spec['preset']}",
        "",
        f"Selected per strategy: the point {rule}"
        + (f"; points with a mean {report} above {limit} anywhere rank last" if limit else "")
        + f". Overrides of every run: {sets}.",
        "",
    ]
    if len(conditions) > 1:
        lines += [f"Conditions: {json.dumps(conditions)}.", ""]
    header = "| strategy | point |" + ("" if len(conditions) == 1 else " condition |")
    lines += [
        f"{header} {metric} | {report} | ε | selected |",
        "|---|---|" + ("" if len(conditions) == 1 else "---|") + "---|---|---|---|",
    ]
    for row in rows:
        point = ", ".join(f"{k} = {v}" for k, v in row["point"].items())
        mark = "**yes**" if best[owner(row["strategy"])] is row else ""
        for cond, c in row["conditions"].items():
            where = "" if len(conditions) == 1 else f" {cond} |"
            lines.append(
                f"| {row['strategy']} | {point} |{where} {c['mean']:.4f} ± {c['std']:.4f} | "
                f"{c['report_mean']:.4f} ± {c['report_std']:.4f} | {c['epsilon']:.4g} | {mark} |"
            )
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.md").write_text("\n".join(lines) + "\n")
    (out / "sweep.json").write_text(json.dumps({"rows": rows, "spec": spec}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
