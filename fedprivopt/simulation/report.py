"""Reports over simulation runs: ``summary.csv``, two plots and ``report.md``.

A run directory (written by ``fedprivopt simulate``) holds ``metrics.jsonl`` (one JSON object per
evaluated round), ``summary.json`` and its privacy ledger. A ``compare`` grid puts one run
directory per (strategy, noise multiplier, seed) under ``OUT/runs/``. Loading and aggregating
them over seeds is :mod:`fedprivopt.simulation.rundata` (its names are re-exported here); this
module writes what a reader looks at.

Plots are drawn on :class:`matplotlib.figure.Figure` objects rendered by the Agg canvas: pyplot's
global state and the interactive backends are never touched.

Examples
--------
>>> runs = load_runs("out/compare")  # doctest: +SKIP
>>> write_report("out/compare/report", runs, title="DP-FedAdam vs DP-FedAvg")  # doctest: +SKIP
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedprivopt.simulation.rundata import (
    RunData,
    Selection,
    aggregate_runs,
    aggregate_with_notes,
    choose_metric,
    group_runs,
    load_run,
    load_runs,
    mean_std,
    reference_model,
    select_runs,
    warn_all,
)

__all__ = [
    "RunData",
    "aggregate_runs",
    "choose_metric",
    "load_run",
    "load_runs",
    "plot_metric_vs_round",
    "plot_privacy_utility",
    "write_report",
    "write_summary_csv",
]

_PRETTY = {
    "eval_recall_at_5": "recall@5 (eval)",
    "eval_accuracy": "accuracy (eval)",
    "eval_loss": "loss (eval)",
}
_LINESTYLES = ("-", "--", "-.", ":")
_PRIVACY_CONFIG_WORDS = (
    "accountant", "clip", "sampling", "cohort", "users", "delta", "epsilon", "target", "secure",
    "noise", "rounds",
)  # fmt: skip
RUN_EPSILON = "ε is the accountant's value after each run's last completed round, at the δ shown; "
"""What ε means in a report of runs (the start of its "Privacy parameters")."""
_EARLIER = ("reused", "resumed")  # origins of runs made by an earlier call
_FIGSIZE = (8.0, 5.0)
_DPI = 120
_LINEWIDTH = 1.8


def write_summary_csv(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write :func:`aggregate_runs` rows as CSV (floats in full precision; ``inf`` for ∞ ε)."""
    if not rows:
        raise ValueError("rows: empty; nothing to write")
    metrics = {r["metric"] for r in rows}
    if len(metrics) != 1:
        raise ValueError(f"rows: mix metrics {sorted(metrics)}; aggregate with one metric")
    metric = metrics.pop()
    columns = ["strategy", "noise_multiplier", "seeds", "epsilon", "delta", "rounds",
               f"{metric}_mean", f"{metric}_std", "eval_loss_mean", "eval_loss_std",
               "seconds_per_round"]  # fmt: skip
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for r in rows:
            writer.writerow([r["n_seeds"] if c == "seeds" else r[c] for c in columns])
    return path


def plot_metric_vs_round(
    runs: Sequence[RunData], path: str | Path, *, metric: str | None = None
) -> Path:
    """Plot the task metric against the round: mean over seeds with a ±1 std band per group."""
    sel, notes = select_runs(runs, metric)
    warn_all(notes)
    return _plot_metric_vs_round(sel, path)


def plot_privacy_utility(
    runs: Sequence[RunData], path: str | Path, *, metric: str | None = None
) -> Path:
    """Plot the final task metric against ε, one line per strategy, error bars over seeds.

    Non-private groups (ε = ∞) are horizontal dashed reference lines. The ε axis is logarithmic
    when the finite ε span more than a decade.
    """
    rows, notes = aggregate_with_notes(runs, metric)
    warn_all(notes)
    return _plot_privacy_utility(rows, path)


def write_report(
    out_dir: str | Path,
    runs: Sequence[RunData],
    *,
    title: str,
    metric: str | None = None,
    notes: str | None = None,
    origins: Mapping[str, str] | None = None,
    epsilon_text: str = RUN_EPSILON,
) -> Path:
    """Write ``summary.csv``, ``metric_vs_round.png``, ``privacy_utility.png`` and ``report.md``.

    Parameters
    ----------
    out_dir : str or pathlib.Path
        Created if missing.
    runs : sequence of RunData
    title : str
        First heading of the report.
    metric : str, optional
        Task metric (``None``: see :func:`choose_metric`).
    notes : str, optional
        Free markdown appended under "Notes".
    origins : mapping of str to str, optional
        Where each run comes from, keyed by run directory name (e.g. ``compare``'s "reused:
        finished earlier with the same configuration"); listed under "Runs", with the number of
        runs reused from earlier calls in the first paragraph.
    epsilon_text : str, optional
        What ε means, the start of "Privacy parameters" (default :data:`RUN_EPSILON`; a tuned
        comparison states its tunings' ε).

    Returns
    -------
    pathlib.Path
        Path of ``report.md``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sel, issues = select_runs(runs, metric)
    rows, agg_issues = aggregate_with_notes(sel.runs, sel.metric)
    issues = list(dict.fromkeys([*issues, *agg_issues]))  # both hold the runs' own notes
    warn_all(issues)
    write_summary_csv(rows, out / "summary.csv")
    ref = reference_model(sel.runs, sel.metric)
    _plot_metric_vs_round(sel, out / "metric_vs_round.png", ref)
    _plot_privacy_utility(rows, out / "privacy_utility.png", ref)
    text = _markdown(title, sel, rows, issues, notes, ref, origins, epsilon_text)
    report = out / "report.md"
    report.write_text(text, encoding="utf-8")
    return report


# ---------------------------------------------------------------------------------------------
# internals


def _pretty(metric: str) -> str:
    return _PRETTY.get(metric, metric)


def _label(strategy: str, sigma: float, epsilon: float) -> str:
    return f"{strategy} (non-private)" if math.isinf(epsilon) else f"{strategy}, σ={sigma:g}"


def _styles(keys: Sequence[tuple[str, float]]) -> dict[tuple[str, float], tuple[Any, str]]:
    """(color, linestyle) per series.

    Color by strategy and line style by σ when that fits (≤ 10 strategies, ≤ 4 σ each); else
    10 colors × 4 styles by position, so that up to 40 series stay distinct.
    """
    from matplotlib import colormaps

    colors = colormaps["tab10"].colors
    strategies = sorted({s for s, _ in keys})
    per_strategy = max(sum(1 for s, _ in keys if s == name) for name in strategies)
    if len(strategies) <= len(colors) and per_strategy <= len(_LINESTYLES):
        out = {}
        for s, sigma in keys:
            sigmas = sorted(x for t, x in keys if t == s)
            out[(s, sigma)] = (colors[strategies.index(s)], _LINESTYLES[sigmas.index(sigma)])
        return out
    n, n_styles = len(colors), len(_LINESTYLES)
    return {k: (colors[i % n], _LINESTYLES[(i // n) % n_styles]) for i, k in enumerate(keys)}


def _strategy_colors(strategies: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    colors = colormaps["tab10"].colors
    names = sorted(set(strategies))
    return {s: colors[i % len(colors)] for i, s in enumerate(names)}


def _new_axes():
    from matplotlib.figure import Figure

    fig = Figure(figsize=_FIGSIZE, dpi=_DPI)
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.3)
    return fig, ax


def _reference_line(ax, ref: tuple[str, dict[str, float]] | None, metric: str) -> int:
    if ref is None:
        return 0
    ax.axhline(ref[1][metric], color="0.35", linestyle=":", linewidth=_LINEWIDTH,
               label=f"{ref[0]}, no training")  # fmt: skip
    return 1


def _finish(fig, ax, path: str | Path, n_series: int) -> Path:
    if n_series > 6:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
                  ncol=2 if n_series > 20 else 1, frameon=False)  # fmt: skip
    elif n_series:
        ax.legend(loc="best", fontsize="small")
    path = Path(path)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    return path


def _plot_metric_vs_round(
    sel: Selection, path: str | Path, ref: tuple[str, dict[str, float]] | None = None
) -> Path:
    fig, ax = _new_axes()
    groups = group_runs(sel.runs)
    styles = _styles(list(groups))
    for key, group in groups.items():
        per_round: dict[int, list[float]] = {}
        for run in group:
            for rnd, value in run.curve(sel.metric).items():
                if math.isfinite(value):
                    per_round.setdefault(rnd, []).append(value)
        if not per_round:
            continue
        x = np.array(sorted(per_round))
        stats = np.array([mean_std(per_round[r]) for r in x])
        color, style = styles[key]
        label = _label(key[0], key[1], max(run.epsilon for run in group))
        ax.plot(x, stats[:, 0], color=color, linestyle=style, linewidth=_LINEWIDTH, label=label,
                marker="o" if len(x) == 1 else None)  # fmt: skip
        ax.fill_between(x, stats[:, 0] - stats[:, 1], stats[:, 0] + stats[:, 1], color=color,
                        alpha=0.15, linewidth=0)  # fmt: skip
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("communication round")
    ax.set_ylabel(_pretty(sel.metric))
    ax.set_title(f"{_pretty(sel.metric)} by round (mean ± 1 std over seeds)")
    return _finish(fig, ax, path, len(groups) + _reference_line(ax, ref, sel.metric))


def _plot_privacy_utility(
    rows: Sequence[dict[str, Any]],
    path: str | Path,
    ref: tuple[str, dict[str, float]] | None = None,
) -> Path:
    metric = rows[0]["metric"]
    mean_key, std_key = f"{metric}_mean", f"{metric}_std"
    colors = _strategy_colors([r["strategy"] for r in rows])
    fig, ax = _new_axes()
    n_series = 0
    private = [r for r in rows if math.isfinite(r["epsilon"]) and math.isfinite(r[mean_key])]
    for strategy in sorted({r["strategy"] for r in private}):
        pts = sorted((r for r in private if r["strategy"] == strategy), key=lambda r: r["epsilon"])
        ax.errorbar([r["epsilon"] for r in pts], [r[mean_key] for r in pts],
                    yerr=[r[std_key] for r in pts], color=colors[strategy], marker="o",
                    linewidth=_LINEWIDTH, capsize=3, label=strategy)  # fmt: skip
        for r in pts:
            ax.annotate(f"σ={r['noise_multiplier']:g}", (r["epsilon"], r[mean_key]),
                        textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=colors[strategy])  # fmt: skip
        n_series += 1
    for r in rows:
        if math.isinf(r["epsilon"]) and math.isfinite(r[mean_key]):
            color = colors[r["strategy"]]
            ax.axhline(r[mean_key], color=color, linestyle="--", linewidth=_LINEWIDTH,
                       label=f"{r['strategy']} (non-private)")  # fmt: skip
            if r[std_key] > 0:
                ax.axhspan(r[mean_key] - r[std_key], r[mean_key] + r[std_key], color=color,
                           alpha=0.1, linewidth=0)  # fmt: skip
            n_series += 1
    n_series += _reference_line(ax, ref, metric)
    eps = [r["epsilon"] for r in private]
    if eps and min(eps) > 0 and max(eps) / min(eps) > 10:
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.margins(x=0.08)
    if not eps:
        ax.set_xlim(0.0, 1.0)
        ax.text(0.5, 0.05, "no private runs", transform=ax.transAxes, ha="center", alpha=0.6)
    deltas = sorted({r["delta"] for r in private})
    at = f"at δ={deltas[0]:g}" if len(deltas) == 1 else "δ differs between runs; see the table"
    ax.set_xlabel(f"ε ({at})")
    ax.set_ylabel(f"final {_pretty(metric)}")
    ax.set_title(f"Privacy–utility trade-off: final {_pretty(metric)} (mean ± 1 std over seeds)")
    return _finish(fig, ax, path, n_series)


def _fmt(x: float, digits: int = 4) -> str:
    return "n/a" if math.isnan(x) else f"{x:.{digits}g}"


def _fmt_pm(mean: float, std: float, n: int) -> str:
    """``mean ± std`` with the std to two significant digits and the mean to the same place."""
    if not math.isfinite(mean):
        return "n/a" if math.isnan(mean) else str(mean)
    if n <= 1:
        return _fmt(mean)
    if not (math.isfinite(std) and std > 0):
        return f"{_fmt(mean)} ± {_fmt(std)}"
    places = min(max(1 - math.floor(math.log10(std)), 0), 8)
    return f"{mean:.{places}f} ± {std:.{places}f}"


def _fmt_eps(eps: float) -> str:
    return "∞ (non-private)" if math.isinf(eps) else _fmt(eps)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _markdown(
    title: str,
    sel: Selection,
    rows: Sequence[dict[str, Any]],
    issues: Sequence[str],
    notes: str | None,
    ref: tuple[str, dict[str, float]] | None = None,
    origins: Mapping[str, str] | None = None,
    epsilon_text: str = "",
) -> str:
    m, pretty = sel.metric, _pretty(sel.metric)
    strategies = sorted({r.strategy for r in sel.runs})
    sigmas = sorted({r.noise_multiplier for r in sel.runs})
    seeds = sorted({r.seed for r in sel.runs})
    engines = sorted({str(r.summary.get("engine", "?")) for r in sel.runs})
    budget = sum(r.summary.get("stopped_reason") == "budget" for r in sel.runs)
    lines = [
        f"# {title}",
        "",
        f"{len(sel.runs)} runs in {len(rows)} groups: {len(strategies)} strategies "
        f"({', '.join(strategies)}) × {len(sigmas)} noise multipliers "
        f"({', '.join(f'{s:g}' for s in sigmas)}) × {len(seeds)} seeds "
        f"({', '.join(map(str, seeds))}); engine {', '.join(engines)}. "
        f"Task metric: `{m}`. Values are the final evaluation, mean ± sample std over seeds.",
    ]
    if budget:
        lines.append(f"{budget} runs stopped early at the privacy budget.")
    for key, what in (("evaluated_model", "Evaluated"), ("initial_model", "Initial model")):
        found = sorted({str(r.summary[key]) for r in sel.runs if r.summary.get(key)})
        if found:
            lines.append(f"{what}: {'; '.join(found)}.")
    if origins:
        earlier = sum(origins.get(r.path.name, "").startswith(_EARLIER) for r in sel.runs)
        lines.append(
            f"{earlier} of {len(sel.runs)} runs come from an earlier call (reused or resumed: "
            "their stored configuration equals this call's); see [Runs](#runs)."
        )
    lines += [
        "",
        "## Summary",
        "",
        f"| strategy | σ | seeds | ε | δ | rounds | {pretty} | eval loss | s/round |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        n, n_ok = r["n_seeds"], r["n_finite"]
        seeds_cell = str(n) if n_ok == n else f"{n} ({n - n_ok} non-finite)"
        cells = [
            r["strategy"], f"{r['noise_multiplier']:g}", seeds_cell, _fmt_eps(r["epsilon"]),
            _fmt(r["delta"], 3), r["rounds"], _fmt_pm(r[f"{m}_mean"], r[f"{m}_std"], n_ok),
            _fmt_pm(r["eval_loss_mean"], r["eval_loss_std"], n), _fmt(r["seconds_per_round"], 3),
        ]  # fmt: skip
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    ref_text = ""
    if ref is not None:
        loss = ref[1].get("loss")
        lines += [
            "",
            f"Reference: {ref[0]}, a model built from public information only and never trained: "
            f"{pretty} {_fmt(ref[1][m])}"
            + (f", eval loss {_fmt(loss)}." if loss is not None else ".")
            + " A strategy that does not beat it has learned nothing about the users.",
        ]
        ref_text = f" The dotted grey line is the {ref[0]}."
    lines += [
        "",
        "Full-precision numbers: [summary.csv](summary.csv).",
        "",
        "## Plots",
        "",
        f"![{pretty} by round](metric_vs_round.png)",
        "",
        f"How each strategy's {pretty} evolves over the rounds at each noise multiplier (mean "
        f"over seeds, ±1 std shaded): the gap between lines is what the method, not the noise, "
        f"decides.{ref_text}",
        "",
        "![Privacy–utility trade-off](privacy_utility.png)",
        "",
        f"The final {pretty} of each strategy against the ε it spent (one point per noise "
        f"multiplier; up and to the left is better): the slope of a line is the price of "
        f"privacy for that method, dashed lines are the non-private baselines.{ref_text}",
        "",
        "## Privacy parameters",
        "",
        epsilon_text + "non-private baselines have ε = ∞. The unit of privacy is the user"
        + _relations(sel.runs),
        "",
    ]
    deltas = sorted({r.delta for r in sel.runs if math.isfinite(r.epsilon)})
    if deltas:
        lines.append(f"- δ: {', '.join(_fmt(d, 3) for d in deltas)}")
    lines += [f"- {key}: {value}" for key, value in _shared_privacy_config(sel.runs)]
    if origins:
        lines += ["", "## Runs", "", "| run | origin |", "|---|---|"]
        lines += [
            f"| {_cell(r.path.name)} | {_cell(origins.get(r.path.name, 'not recorded'))} |"
            for r in sorted(sel.runs, key=lambda r: r.path.name)
        ]
    if issues:
        lines += ["", "## Warnings", ""] + [f"- {_cell(i)}" for i in issues]
    if notes:
        lines += ["", "## Notes", "", notes.strip()]
    return "\n".join(lines) + "\n"


_TREE_SAMPLING = "none (tree: cohorts from a seeded shuffle per restart period)"
_RELATIONS = {
    "poisson": "added or removed (Poisson sampling)",
    "fixed": "replaced (fixed-size sampling)",
    "tree": "replaced, dp-accounting's replace-special relation (tree aggregation)",
}


def _mechanism(config: dict) -> str | None:
    """``poisson``, ``fixed`` or ``tree`` for a private run's config; ``None`` otherwise."""
    from fedprivopt.strategies.config import NON_PRIVATE

    if config.get("strategy") in NON_PRIVATE or not config.get("noise-multiplier"):
        return None
    if config.get("noise-mechanism") == "tree":
        return "tree"
    return "fixed" if config.get("sampling") == "fixed" else "poisson"


def _relations(runs: Sequence[RunData]) -> str:
    """``": neighbouring datasets differ in one user, <how>."`` for the runs' mechanisms."""
    found = {_mechanism(r.summary.get("config") or {}) for r in runs} - {None}
    if not found:
        return "."
    hows = [_RELATIONS[m] for m in ("poisson", "fixed", "tree") if m in found]
    return "; neighbouring datasets differ in one user, " + "; or ".join(hows) + "."


def _shared_privacy_config(runs: Sequence[RunData]) -> list[tuple[str, str]]:
    """Privacy-related config keys, with their value when all runs agree, else "varies".

    A tree run does not sample (its ``sampling`` key is ignored): it shows as
    :data:`_TREE_SAMPLING` (issue 20 review, finding 5).
    """
    configs = [dict(r.summary.get("config") or {}) for r in runs]
    for c in configs:
        if c.get("noise-mechanism") == "tree" and "sampling" in c:
            c["sampling"] = _TREE_SAMPLING
    keys = sorted({k for c in configs for k in c if any(w in k for w in _PRIVACY_CONFIG_WORDS)})
    out = []
    for key in keys:
        values = {json.dumps(c.get(key), sort_keys=True) for c in configs}
        if len(values) > 1:
            out.append((key, "varies (see the runs)"))
            continue
        value = configs[0].get(key)
        out.append((key, _cell(value if isinstance(value, str) else values.pop())))
    return out
