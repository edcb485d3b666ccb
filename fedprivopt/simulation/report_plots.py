"""The two plots of a report: the task metric by round, and the privacy–utility trade-off.

Plots are drawn on :class:`matplotlib.figure.Figure` objects rendered by the Agg canvas: pyplot's
global state and the interactive backends are never touched. :mod:`fedprivopt.simulation.report`
writes them with the rest of a report.

Because no backend is used, the ``MPLBACKEND`` environment variable is ignored when it names no
backend matplotlib knows (:func:`import_matplotlib`).

Names a user chooses (a task's metric, its reference model's) are drawn as written: a ``$`` in
them is not matplotlib's mathtext (:func:`plot_text`).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedprivopt.simulation.rundata import RunData
from fedprivopt.simulation.rundata_aggregate import (
    BASIS_WORDS,
    Selection,
    aggregate_with_notes,
    differing_bases,
    group_runs,
    mean_std,
    mechanism,
    select_runs,
    warn_all,
)

__all__ = [
    "draw_metric_vs_round",
    "draw_privacy_utility",
    "import_matplotlib",
    "plot_metric_vs_round",
    "plot_privacy_utility",
    "plot_text",
    "pretty_metric",
]

_PRETTY = {
    "eval_recall_at_5": "recall@5 (eval)",
    "eval_accuracy": "accuracy (eval)",
    "eval_loss": "loss (eval)",
}
_LINESTYLES = ("-", "--", "-.", ":")
_MARKERS = (None, "o", "s", "^", "v", "D", "x", "+")
"""Markers of the metric-by-round lines beyond 40 (10 colors × 4 line styles; :func:`_styles`)."""
_POINT_MARKERS = ("o", "s", "^", "D", "v", "x", "+", "*")
"""Markers of the privacy–utility lines, one per 10 strategies (:func:`_strategy_colors`)."""
_FIGSIZE = (8.0, 5.0)
_DPI = 120
_LINEWIDTH = 1.8


def plot_metric_vs_round(
    runs: Sequence[RunData], path: str | Path, *, metric: str | None = None
) -> Path:
    """Plot the task metric against the round: mean over seeds with a ±1 std band per group."""
    sel, notes = select_runs(runs, metric)
    warn_all(notes)
    return draw_metric_vs_round(sel, path)


def plot_privacy_utility(
    runs: Sequence[RunData], path: str | Path, *, metric: str | None = None
) -> Path:
    """Plot the final task metric against ε, one line per strategy, error bars over seeds.

    Non-private groups (ε = ∞) are horizontal dashed reference lines. The ε axis is logarithmic
    when the finite ε span more than a decade.
    """
    rows, notes = aggregate_with_notes(runs, metric)
    warn_all(notes)
    return draw_privacy_utility(rows, path)


def import_matplotlib() -> None:
    """Import matplotlib, ignoring an ``MPLBACKEND`` that names no backend it knows.

    matplotlib's import sets its ``backend`` setting from ``MPLBACKEND`` and raises
    ``ValueError`` for an unknown name, although these plots use no backend (Agg canvas,
    module docstring). Thirty-fourth review of issue 15 (outputs, finding 2): ``MPLBACKEND=bogus
    fedprivopt compare …`` (a misspelt backend, a value left from another tool) ran every cell,
    then ended rc 2 with ``error: Key backend: 'bogus' is not a valid value for backend;
    supported values are [...]``, naming no variable, and wrote no ``report.md`` or plots. The
    import is retried without the variable (the half-imported modules forgotten first), which
    is then put back as it was.
    """
    if "matplotlib" in sys.modules:
        return
    try:
        import matplotlib
    except ValueError:
        backend = os.environ.pop("MPLBACKEND", None)
        if backend is None:
            raise
        for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
            del sys.modules[name]
        try:
            import matplotlib  # noqa: F401
        finally:
            os.environ["MPLBACKEND"] = backend


def pretty_metric(metric: str) -> str:
    """How ``metric`` is named on an axis or in a report."""
    return _PRETTY.get(metric, metric)


def plot_text(text: str) -> str:
    r"""``text`` as matplotlib draws it literally: every ``$`` escaped (``\$``), so no mathtext.

    Thirty-fifth review of issue 15 (outputs, finding 1): a task by reference whose metric is
    named ``cost_$_per_$_user`` (or whose ``reference()`` model is named ``prior $\hat{p}_$``)
    ran every cell of ``compare``, then ended rc 2 with matplotlib's 5-line ``ParseSyntaxException``
    (the text between two ``$`` read as TeX), naming nothing, no ``report.md`` written; a name
    whose ``$`` pair parsed was drawn as a formula (``usd$ and $x`` as ``usd and x`` in italics).
    """
    return str(text).replace("$", r"\$")


def _label(strategy: str, sigma: float, epsilon: float, private: bool = False) -> str:
    """A line's legend: ``dp-fedavg, σ=0.5``, or ``fedavg (non-private)`` (finding 3)."""
    if math.isinf(epsilon) and not private:
        return f"{strategy} (non-private)"
    return f"{strategy}, σ={sigma:g}"


def _styles(keys: Sequence[tuple[str, float]]) -> dict[tuple[str, float], tuple[Any, str, Any]]:
    """(color, linestyle, marker) per series.

    Color by strategy and line style by σ when that fits (≤ 10 strategies, ≤ 4 σ each); else
    10 colors × 4 styles by position, and from the 41st series on a marker too
    (:data:`_MARKERS`), so that up to 320 series stay distinct. Thirty-fifth review of issue 15
    (outputs, finding 4): ``compare toy.toml --noise-multipliers 0.3,0.5,0.7,1,1.5,2`` (every
    strategy: 44 series) drew ``adadps, σ=1`` and ``fedavg (non-private)`` with one color and
    line style, and three more pairs alike.
    """
    import_matplotlib()
    from matplotlib import colormaps

    colors = colormaps["tab10"].colors
    strategies = sorted({s for s, _ in keys})
    per_strategy = max(sum(1 for s, _ in keys if s == name) for name in strategies)
    if len(strategies) <= len(colors) and per_strategy <= len(_LINESTYLES):
        out = {}
        for s, sigma in keys:
            sigmas = sorted(x for t, x in keys if t == s)
            out[(s, sigma)] = (colors[strategies.index(s)], _LINESTYLES[sigmas.index(sigma)], None)
        return out
    n, n_styles = len(colors), len(_LINESTYLES)
    return {
        k: (colors[i % n], _LINESTYLES[(i // n) % n_styles], _MARKERS[i // (n * n_styles) % 8])
        for i, k in enumerate(keys)
    }


def _strategy_colors(strategies: Sequence[str]) -> dict[str, tuple[Any, str]]:
    """(color, marker) per strategy: 10 colors, then each again with another marker.

    Thirty-fifth review of issue 15 (outputs, finding 4): ``compare-tuned`` of tunings beside an
    untuned comparison of every strategy (more than 10 strategy names, ``dp-fedavg (tuned)``
    beside ``dp-fedavg``) drew the 11th strategy's line in the first one's color and marker.
    """
    import_matplotlib()
    from matplotlib import colormaps

    colors = colormaps["tab10"].colors
    names = sorted(set(strategies))
    n = len(colors)
    return {s: (colors[i % n], _POINT_MARKERS[i // n % len(_POINT_MARKERS)])
            for i, s in enumerate(names)}  # fmt: skip


def _new_axes():
    import_matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=_FIGSIZE, dpi=_DPI)
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.3)
    return fig, ax


def _reference_line(ax, ref: tuple[str, dict[str, float]] | None, metric: str) -> int:
    if ref is None:
        return 0
    ax.axhline(ref[1][metric], color="0.35", linestyle=":", linewidth=_LINEWIDTH,
               label=plot_text(f"{ref[0]}, no training"))  # fmt: skip
    return 1


def _finish(fig, ax, path: str | Path, n_series: int) -> Path:
    if not ax.get_legend_handles_labels()[0]:  # nothing drawn with a label (e.g. no values yet)
        n_series = 0
    if n_series > 6:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
                  ncol=2 if n_series > 20 else 1, frameon=False)  # fmt: skip
    elif n_series:
        ax.legend(loc="best", fontsize="small")
    path = Path(path)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    return path


def draw_metric_vs_round(
    sel: Selection, path: str | Path, ref: tuple[str, dict[str, float]] | None = None
) -> Path:
    """:func:`plot_metric_vs_round` of selected runs, with the untrained model's line ``ref``."""
    fig, ax = _new_axes()
    groups = group_runs(sel.runs)
    styles = _styles(list(groups))
    skipped = []
    for key, group in groups.items():
        per_round: dict[int, list[float]] = {}
        for run in group:
            for rnd, value in run.curve(sel.metric).items():
                if math.isfinite(value):
                    per_round.setdefault(rnd, []).append(value)
        if not per_round:
            skipped.append(key)
            continue
        x = np.array(sorted(per_round))
        stats = np.array([mean_std(per_round[r]) for r in x])
        stats[:, 1] = [_spread(s) for s in stats[:, 1]]
        color, style, marker = styles[key]
        private = any(mechanism(run.summary.get("config") or {}) is not None for run in group)
        label = _label(key[0], key[1], max(run.epsilon for run in group), private)
        diverged = sum(run.diverged(sel.metric) is not None for run in group)
        label += f" ({diverged} of {len(group)} diverged)" if diverged else ""
        budget = sum(run.summary.get("stopped_reason") == "budget" for run in group)
        label += f" ({budget} of {len(group)} stopped at the budget)" if budget else ""
        label += _fewer_seeds_text(group, sel.metric)
        ax.plot(x, stats[:, 0], color=color, linestyle=style, linewidth=_LINEWIDTH, label=label,
                marker=marker or ("o" if len(x) == 1 else None),
                markevery=max(1, len(x) // 10))  # fmt: skip
        ax.fill_between(x, stats[:, 0] - stats[:, 1], stats[:, 0] + stats[:, 1], color=color,
                        alpha=0.15, linewidth=0)  # fmt: skip
    from matplotlib.ticker import MaxNLocator

    # min_n_ticks=1: one round (compare --rounds 1) is ticked as it is, not as 0.945 ... 1.065
    # (thirty-fifth review of issue 15, outputs finding 6: whole rounds only, fractions else)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_xlabel("communication round")
    shown = plot_text(pretty_metric(sel.metric))
    ax.set_ylabel(shown)
    ax.set_title(f"{shown} by round (mean ± 1 std over seeds)")
    if skipped:  # forty-sixth review of issue 15 (reports, finding 2): named, not left out
        ax.text(0.5, 0.05, f"not drawn (no finite value in any round; see the table): "
                f"{_row_names(skipped)}", transform=ax.transAxes, ha="center", alpha=0.6,
                wrap=True)  # fmt: skip
    return _finish(fig, ax, path, len(groups) + _reference_line(ax, ref, sel.metric))


def _row_names(keys: Sequence[tuple[str, float]]) -> str:
    """``dp-fedavg σ=0.5, ...`` of (strategy, noise multiplier) rows, the first three named."""
    names = ", ".join(plot_text(f"{strategy} σ={sigma:g}") for strategy, sigma in keys[:3])
    return names + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def _diverged_text(row: dict[str, Any]) -> str:
    """``, 2 of 3 diverged`` for a row some of whose seeds diverged (else empty).

    Thirty-third review of issue 15 (results, finding 6): the privacy–utility plot drew a row
    whose every seed's model overflowed (its accuracy that of an overflowed model) as a point
    like any other, and the metric-by-round plot its line, where ``report.md`` and
    ``summary.csv`` mark it; the point's label and the line's legend now say so. Thirty-fifth
    review (outputs, finding 5): also the seeds that their privacy budget stopped early, whose
    point sat on one line with runs of every round (``, 2 of 2 stopped at the budget``).
    """
    k, n = len(row["diverged"]), row["n_seeds"]
    budget = row.get("n_budget", 0)
    stopped = f", {budget} of {n} stopped at the budget" if budget else ""
    return (f", {k} of {n} diverged" if k else "") + stopped


def _fewer_seeds_text(group: Sequence[RunData], metric: str) -> str:
    """`` (rounds 1–2: later rounds over fewer seeds)`` when the runs completed different numbers.

    Thirty-third review of issue 15 (results, finding 8): ``compare-tuned`` of a 1-round and a
    2-round released trial drew round 2 as the row's mean (one seed's value, no band) under the
    title "mean ± 1 std over seeds", a step that looked like training. Thirty-seventh review
    (reports, finding 2): seeds that completed the same rounds but evaluated different ones
    (``eval-every`` 1 and 4, e.g. ``compare-tuned`` of two tunings, or ``write_report`` of a
    folder of runs) drew rounds 1-3 as the row's mean, one seed's values, a peak of 0.607 beside
    the two seeds' 0.560 at round 4, without a word: `` (some rounds evaluated by fewer seeds)``.
    """
    done = [run.rounds_completed for run in group]
    lo, hi = min(done), max(done)
    if lo != hi:
        return f" (rounds {lo}–{hi}: later rounds over fewer seeds)"
    evaluated: dict[int, int] = {}
    for run in group:
        for rnd in run.curve(metric):
            evaluated[rnd] = evaluated.get(rnd, 0) + 1
    fewer = any(n < len(group) for n in evaluated.values())
    return " (some rounds evaluated by fewer seeds)" if fewer else ""


def _spread(std: float) -> float:
    """A std to draw: NaN (fewer than two finite values, :func:`mean_std`) draws no spread."""
    return 0.0 if math.isnan(std) else float(std)


def _tunings_text(private: Sequence[dict[str, Any]]) -> str:
    """The ε axis' words for tuned rows over several tunings (``""``: none).

    Fortieth review of issue 15 (reports, finding 4): ``compare toy.toml --strategies dp-fedavg
    --tune-grid server-learning-rate=0.5,1 --mean-trials 1 --seeds 2`` drew the tuned row's mean
    over its 2 tunings at ε 11.74, one tuning's, under "ε (at δ=0.0001)", while publishing that
    mean costs their composition, 16.62 (``summary.csv``'s ``epsilon_tunings_composed``; the
    report's text says so, the plot read alone did not).
    """
    from fedprivopt.simulation.tune_notes import TUNED_SUFFIX

    several = [r for r in private if r["strategy"].endswith(TUNED_SUFFIX) and r["n_seeds"] > 1]
    if not several:
        return ""
    return (
        "; a tuned row over n tunings is drawn at one tuning's ε, their composition is what "
        "publishing it costs (see the report)"
    )


def _composition_text(private: Sequence[dict[str, Any]]) -> str:
    """The ε axis' words for drawn private runs whose publication composes (``""``: one run).

    Forty-seventh review of issue 15 (reports, finding 1): ``compare toy.toml --strategies
    dp-fedavg,fedavg --rounds 3 --seeds 2`` drew dp-fedavg's mean over its 2 seeds at one run's
    ε, 12.17, under "ε (at δ=0.0001)", while publishing that mean costs their composition,
    16.29 (``summary.csv``'s ``epsilon_seeds_composed``; the report's "seeds composed" line),
    and two private rows of one run each (7.551 each, 10.28 together: "report composed") alike;
    the plot read alone said nothing. Tuned rows: :func:`_tunings_text`.
    """
    from fedprivopt.simulation.tune_notes import TUNED_SUFFIX

    text = ""
    if any(r["n_seeds"] > 1 and not r["strategy"].endswith(TUNED_SUFFIX) for r in private):
        text += "; a row over n seeds is drawn at one run's ε, their composition is what "
        text += "publishing it costs"
    if len(private) > 1:
        text += "; publishing the plot releases every row's runs, which costs their composition"
    return text + " (see the report)" if text else ""


def _undrawn_text(rows: Sequence[dict[str, Any]], mean_key: str) -> str:
    """The plot's words for rows it cannot draw (``""``: it draws them all).

    Forty-sixth review of issue 15 (reports, finding 1): ``compare toy.toml --strategies
    dp-fedavg,fedavg --metric eval_loss --set strategies.dp-fedavg.server-learning-rate=1e39``
    (the private row diverged: its final loss NaN) drew the baseline alone and wrote "no
    private runs" under an axis saying "δ differs between runs", a plot read alone as a
    comparison without the private run it holds. A row is drawn when its final metric is
    finite and its ε finite (a point) or infinite for a non-private baseline (a line).
    """
    missing = [r for r in rows if not _drawn(r, mean_key)]
    if not missing:
        return ""
    names = _row_names([(r["strategy"], r["noise_multiplier"]) for r in missing])
    return f"not drawn (no finite final value or ε; see the table): {names}"


def _drawn(row: dict[str, Any], mean_key: str) -> bool:
    """Whether :func:`draw_privacy_utility` draws ``row`` (a point or a baseline's line)."""
    if not math.isfinite(row[mean_key]):
        return False
    return math.isfinite(row["epsilon"]) or (math.isinf(row["epsilon"]) and not row.get("private"))


def _delta_text(rows: Sequence[dict[str, Any]]) -> str:
    """The ε axis' δ words, from every row with a finite ε (drawn or not: finding 1)."""
    deltas = sorted({r["delta"] for r in rows if math.isfinite(r["epsilon"])})
    if not deltas:
        return "no private run: the non-private baselines' ε is ∞"
    return f"at δ={deltas[0]:g}" if len(deltas) == 1 else "δ differs between runs; see the table"


def draw_privacy_utility(
    rows: Sequence[dict[str, Any]],
    path: str | Path,
    ref: tuple[str, dict[str, float]] | None = None,
) -> Path:
    """:func:`plot_privacy_utility` of aggregated rows, with the untrained model's line ``ref``."""
    rows = list(rows)  # read more than once (forty-third review of issue 15, reports 1)
    metric = rows[0]["metric"]
    mean_key, std_key = f"{metric}_mean", f"{metric}_std"
    colors = _strategy_colors([r["strategy"] for r in rows])
    fig, ax = _new_axes()
    n_series = 0
    private = [r for r in rows if math.isfinite(r["epsilon"]) and math.isfinite(r[mean_key])]
    for strategy in sorted({r["strategy"] for r in private}):
        pts = sorted((r for r in private if r["strategy"] == strategy), key=lambda r: r["epsilon"])
        color, marker = colors[strategy]
        ax.errorbar([r["epsilon"] for r in pts], [r[mean_key] for r in pts],
                    yerr=[_spread(r[std_key]) for r in pts], color=color, marker=marker,
                    linewidth=_LINEWIDTH, capsize=3, label=strategy)  # fmt: skip
        for r in pts:
            ax.annotate(f"σ={r['noise_multiplier']:g}{_diverged_text(r)}",
                        (r["epsilon"], r[mean_key]), textcoords="offset points", xytext=(4, 4),
                        fontsize=7, color=color)  # fmt: skip
        n_series += 1
    for r in rows:
        if math.isinf(r["epsilon"]) and math.isfinite(r[mean_key]) and not r.get("private"):
            color, marker = colors[r["strategy"]]
            ax.axhline(r[mean_key], color=color, linestyle="--", linewidth=_LINEWIDTH,
                       marker=None if marker == _POINT_MARKERS[0] else marker, markevery=0.1,
                       label=f"{r['strategy']} (non-private{_diverged_text(r)})")  # fmt: skip
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
    undrawn = _undrawn_text(rows, mean_key)
    if not eps:
        ax.set_xlim(0.0, 1.0)
    if undrawn or not eps:
        ax.text(0.5, 0.05, undrawn or "no private runs", transform=ax.transAxes, ha="center",
                alpha=0.6, wrap=True)  # fmt: skip
    at = _delta_text(rows)
    for key in differing_bases(private):  # thirty-seventh review (reports, findings 1 and 3)
        at += f"; {BASIS_WORDS[key]} differ between runs, not comparable; see the table"
    at += _tunings_text(private)
    at += _composition_text(private)
    ax.set_xlabel(f"ε ({at})")
    shown = plot_text(pretty_metric(metric))
    ax.set_ylabel(f"final {shown}")
    ax.set_title(f"Privacy–utility trade-off: final {shown} (mean ± 1 std over seeds)")
    return _finish(fig, ax, path, n_series)
