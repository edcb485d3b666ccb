"""What ``fedprivopt tune`` writes, and the tuned comparison of ``fedprivopt compare-tuned``.

A tuning directory holds ``summary.json``, ``trials.csv``, ``trials.png`` and ``report.md``
beside ``runs/`` (one run directory per trial).

``summary.json`` states two numbers side by side: ``epsilon``, the whole tuning procedure's ε
(dp-accounting's RDP accountant on ``RepeatAndSelectDpEvent``), and ``epsilon_single_run``, one
run's ε by the same accountant (and, when the runs use PLD or PRV, by theirs as well). Only the
best trial is the release those numbers cover. What those numbers cover, in words (the privacy,
selection and seed notes): :mod:`fedprivopt.simulation.tune_notes`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedprivopt.core.files import unlink_links
from fedprivopt.core.text import epsilon_text
from fedprivopt.privacy.tuning import TrialCount
from fedprivopt.simulation.files import atomic_write
from fedprivopt.simulation.rundata_aggregate import EPSILON_ACCOUNTANT
from fedprivopt.simulation.tune import PrivacyPlan, TrialResult
from fedprivopt.simulation.tune_notes import (
    TUNED_SUFFIX,
    privacy_note,
    public_users_note,
    seed_note,
    selection_lines,  # also its public path here (docs/RELIABILITY.md names tune_report's)
    selection_note,
    selection_users,  # also its public path here (docs/RELIABILITY.md names tune_report's)
)

__all__ = [
    "TUNING_ACCOUNTANT",
    "costliest_text",
    "load_tuned",
    "procedure_lines",
    "selection_lines",
    "selection_users",
    "summary_of",
    "trial_count_text",
    "tunings_lines",
    "write_tune_outputs",
]

SUMMARY_VERSION = 1
TUNING_ACCOUNTANT = "rdp"
"""The accountant of a tuning's ε (dp-accounting's RDP on ``RepeatAndSelectDpEvent``), whatever
the accountant its runs are configured with."""


def _trial_row(result: TrialResult, metric: str) -> dict[str, Any]:
    run = result.run
    row: dict[str, Any] = {
        "trial": result.trial.label,
        "hyperparameters": result.trial.hyperparameters,
        "seed": result.trial.seed,
        "status": result.status,
        metric: result.score,
        "origin": result.origin,
    }
    if run is not None:
        row.update(
            epsilon=run.epsilon,
            rounds_completed=run.rounds_completed,
            stopped_reason=run.summary.get("stopped_reason"),
            eval_loss=run.final_value("eval_loss"),
        )
    if result.error:
        row["error"] = result.error
    return row


def summary_of(
    *,
    preset: str,
    strategy: str,
    metric: str,
    maximize: bool,
    grid: Mapping[str, Sequence[Any]],
    overrides: Mapping[str, Any],
    trials: TrialCount,
    seed: int,
    plan: PrivacyPlan,
    results: Sequence[TrialResult],
    best: TrialResult | None,
    notes: Sequence[str] = (),
    selection: Mapping[str, Any] | None = None,
    seed_secret: bool = False,
) -> dict[str, Any]:
    """The content of ``summary.json``.

    ``selection`` is :func:`selection_note`'s (``None``: not checked); with ``seed_secret`` (a
    seed drawn from OS entropy) ``seed`` is written as ``null`` (``tune.json`` keeps it).
    """
    eps_rdp = plan.epsilon_single_run("rdp")
    single: dict[str, Any] = {
        "accountant": plan.accountant,
        "epsilon": plan.epsilon_single_run(plan.accountant),
        "epsilon_rdp": eps_rdp,
        "target_epsilon": plan.target_epsilon,
        "grid_point": plan.point,
        "ledger": None
        if plan.ledger is None
        else [{"event": e.to_dict(), "count": c} for e, c in plan.ledger],
    }
    best_out = None
    if best is not None:
        best_out = {**_trial_row(best, metric), "run_dir": f"runs/{best.trial.label}"}
    return {
        "kind": "fedprivopt-tune",
        "version": SUMMARY_VERSION,
        "preset": preset,
        "strategy": strategy,
        "metric": metric,
        "mode": "max" if maximize else "min",
        "grid": {k: list(v) for k, v in grid.items()},
        "overrides": dict(overrides),
        "trial_count": trials.to_dict(),
        "seed": None if seed_secret else seed,
        "seed_source": "os-entropy" if seed_secret else "--seed",
        "trials_run": len(results),
        "best": best_out,
        "epsilon": plan.epsilon(trials),
        "epsilon_single_run": eps_rdp,
        "delta": plan.delta,
        "accountant": "rdp",
        "single_run": single,
        "selection_users": None if selection is None else dict(selection),
        "selection_covered": None if selection is None else selection["private"] == 0,
        "privacy": " ".join(
            [
                privacy_note(plan) + public_users_note(_released_summary(best)),
                selection_note(selection),
                seed_note(seed_secret),
            ]
        ),
        "notes": list(notes),
        "trials": [_trial_row(r, metric) for r in results],
    }


def _released_summary(best: TrialResult | None) -> Mapping[str, Any] | None:
    """The released trial's ``summary.json`` (``None`` when no trial was released)."""
    run = None if best is None else best.run
    summary = getattr(run, "summary", None)
    return summary if isinstance(summary, Mapping) else None


def _fmt(x: Any, digits: int = 4) -> str:
    if isinstance(x, float):
        return "∞" if math.isinf(x) else f"{x:.{digits}g}" if math.isfinite(x) else "nan"
    return str(x)


def _fmt_eps(x: Any) -> str:
    """An ε as :func:`_fmt` shows a number, but rounded up (:func:`.epsilon_text`)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return epsilon_text(x)
    return _fmt(x)


def _write_csv(path: Path, summary: dict[str, Any]) -> None:
    keys = list(summary["grid"])
    metric = summary["metric"]
    loss = [] if metric == "eval_loss" else ["eval_loss"]  # one column when tuned on it
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["trial", *keys, "seed", "status", metric, *loss, "epsilon",
                    "rounds_completed", "stopped_reason", "error"])  # fmt: skip
        for row in summary["trials"]:
            hp = row["hyperparameters"]
            w.writerow([row["trial"], *(hp[k] for k in keys), row["seed"], row["status"],
                        row[metric], *(row.get(k, "") for k in loss), row.get("epsilon", ""),
                        row.get("rounds_completed", ""), row.get("stopped_reason", ""),
                        row.get("error", "")])  # fmt: skip


def _plot(path: Path, summary: dict[str, Any]) -> None:
    from fedprivopt.simulation.report_plots import import_matplotlib, plot_text

    import_matplotlib()  # an MPLBACKEND naming no backend (these plots use none) is ignored
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metric, rows = summary["metric"], summary["trials"]
    fig = Figure(figsize=(8.0, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = [i + 1 for i, r in enumerate(rows) if math.isfinite(r[metric])]
    ys = [r[metric] for r in rows if math.isfinite(r[metric])]
    ax.plot(xs, ys, "o", color="tab:blue", label="trial")
    bad = [i + 1 for i, r in enumerate(rows) if not math.isfinite(r[metric])]
    if bad:  # at the worst finite score (thirty-second review of issue 15, reports finding 2)
        y0 = (max(ys) if summary["mode"] == "min" else min(ys)) if ys else 0.0
        ax.plot(bad, [y0] * len(bad), "x", color="tab:red", label="failed / diverged")
    best = summary["best"]
    if best is not None:
        i = next(i for i, r in enumerate(rows) if r["trial"] == best["trial"])
        ax.plot([i + 1], [best[metric]], "*", ms=16, color="tab:orange", label="released (best)")
    ax.set_xlabel("trial")
    ax.set_ylabel(plot_text(metric))  # a task's metric named cost_$_per_$_user: not TeX
    ax.set_title(
        f"{summary['strategy']}: {len(rows)} trials; epsilon {_fmt_eps(summary['epsilon'])} "
        f"(one run {_fmt_eps(summary['epsilon_single_run'])})"
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


RAN = "ran in this call"
"""A trial's origin when this call ran it (see ``cells.CellPlan.describe``)."""


def _trials_run(summary: dict[str, Any]) -> str:
    """How many trials the tuning drew, and how many of them an earlier call ran or began.

    Thirty-first review of issue 15 (compare, finding 11): a tuning run again whose trials
    were all reused said "this call ran 2". Thirty-fifth review (tuning, finding 3): a Poisson
    tuning that drew no trial said "this tuning drew 0, all run in this call".
    """
    count = summary["trials_run"]
    if not count:  # thirty-fifth review of issue 15 (tuning, finding 3): "drew 0, all run"
        return "this tuning drew 0 (K = 0), so no trial was run and none released"
    earlier = sum(
        str(t.get("origin", RAN)).startswith(("reused", "resumed")) for t in summary["trials"]
    )
    if not earlier:
        return f"this tuning drew {count}, all run in this call"
    return f"this tuning drew {count}, {earlier} of them run (or begun) in an earlier call"


def costliest_text(summary: dict[str, Any]) -> str:
    """``; a run at the costliest grid point, K = V`` when a trial's run spent another ε.

    Thirty-second review of issue 15 (reports, finding 7): ``tune --grid noise-multiplier=0.5,1``
    said "epsilon of one run: 10.28" beside a σ 1 trial whose run spent 3.19, without saying
    that the single run is one at the grid point that spends the most. Thirty-third review
    (results, finding 3): only trials that spent different ε among themselves were looked at,
    so ``tune --grid num-server-rounds=1,2 --mean-trials 1 --seed 0``, whose one trial ran 1
    round (7.551), still said "10.28 (RDP)", and ``tune``'s last line "(one run: 10.28)"
    beside that trial. The single run's ε is compared with each trial's, both by the runs' own
    accountant.
    """
    one = summary["single_run"].get("epsilon")
    spent = [t.get("epsilon") for t in summary["trials"]]
    finite = [e for e in spent if isinstance(e, float) and math.isfinite(e)]
    point = summary["single_run"].get("grid_point") or {}
    if not (point and isinstance(one, float)):
        return ""
    if all(math.isclose(e, one, rel_tol=1e-9) for e in finite):
        return ""
    return "; a run at the costliest grid point, " + ", ".join(
        f"{k} = {v!r}" for k, v in point.items()
    )


def trial_count_text(tc: Mapping[str, Any]) -> str:
    """A tuning's distribution of the number of trials in words (its ``trial_count``)."""
    if tc["distribution"] == "poisson":
        return f"Poisson with mean {tc['mean']:g}"
    return (
        f"truncated negative binomial, eta {tc['shape']:g}, gamma {tc['gamma']:.6g}, "
        f"mean {tc['mean']:g}"
    )


def _markdown(summary: dict[str, Any]) -> str:
    from fedprivopt.simulation.report_format import code_span, one_line
    from fedprivopt.simulation.report_markdown import table_cell

    metric, best, single = summary["metric"], summary["best"], summary["single_run"]
    keys = list(summary["grid"])
    dist = trial_count_text(summary["trial_count"])
    lines = [
        # forty-fifth review of issue 15 (reports, finding 1): a preset named with a line break
        # (``my\n## Notes.toml``) wrote a heading of its own, as compare's did (thirty-fifth)
        one_line(f"# fedprivopt tune: {summary['strategy']} on {summary['preset']}"),
        "",
        # forty-third review of issue 15 (contract 2): the report showed K and every trial with
        # that warning only inside its closing Privacy paragraph, where compare --tune-grid's
        # report of the same tunings says it in bold under its title
        "**This report is the operator's view, not a release.** It shows the number of trials "
        "K and every trial's hyperparameters, score and epsilon; the tuning epsilon assumes K, "
        "the tuning seed and the other trials stay secret: publishing this report, trials.csv, "
        "trials.png, summary.json or runs/ is NOT covered by it. Publish only the released "
        "trial (its model, hyperparameters and score).",
        "",
        f"- **epsilon of the tuning: {_fmt_eps(summary['epsilon'])}** at delta "
        f"{summary['delta']:g} (RDP, RepeatAndSelectDpEvent)",
        f"- epsilon of one run: {_fmt_eps(summary['epsilon_single_run'])} "
        f"(RDP{costliest_text(summary)})"
        + (
            f", {_fmt_eps(single['epsilon'])} by the runs' own accountant ({single['accountant']})"
            if single["accountant"] != "rdp"
            else ""
        ),
        f"- number of trials: drawn from the {dist}; {_trials_run(summary)}",
        f"- grid: {', '.join(f'{k} in {v}' for k, v in summary['grid'].items())} "
        "(each trial draws each key uniformly)",
        f"- selection: {summary['mode']} of {code_span(metric)} at the final evaluation",
        "- " + selection_note(summary.get("selection_users")),
        "- " + seed_note(summary.get("seed_source") == "os-entropy"),
    ]
    if single["target_epsilon"] is not None:
        lines.append(f"- target epsilon {single['target_epsilon']:g} per single run")
    lines += ["", "## Released", ""]
    if best is None:
        lines.append("Nothing: no trial finished with a finite metric (or none was drawn).")
    else:
        hp = ", ".join(f"{k} = {best['hyperparameters'][k]!r}" for k in keys)
        lines.append(
            f"{best['trial']} ({one_line(hp)}): {one_line(metric)} {_fmt(best[metric])}, run in "
            f"[{best['run_dir']}]({best['run_dir']})."
        )
    lines += ["", "## Trials", "", "![trials](trials.png)", "",
              f"| trial | {' | '.join(keys)} | status | {table_cell(metric)} | epsilon (run) |",
              "|---|" + "---|" * len(keys) + "---|---:|---:|"]  # fmt: skip
    for row in summary["trials"]:
        hp = [table_cell(repr(row["hyperparameters"][k])) for k in keys]
        lines.append(
            f"| {row['trial']} | {' | '.join(hp)} | {row['status']} | {_fmt(row[metric])} | "
            f"{_fmt_eps(row.get('epsilon', math.nan))} |"
        )
    earlier = [r for r in summary["trials"] if r.get("origin", RAN) != RAN]
    if earlier:  # ninth review of issue 15 (N5): reuse only under the same plan, and shown
        lines += ["", "From an earlier call of this same plan (`tune.json`): " + "; ".join(
            f"{r['trial']}: {r['origin']}" for r in earlier) + "."]  # fmt: skip
    lines += ["", "Full numbers: [trials.csv](trials.csv), [summary.json](summary.json).", "",
              "## Privacy", "", summary["privacy"]]  # fmt: skip
    if summary["notes"]:
        lines += ["", "## Notes", ""] + [f"- {one_line(n)}" for n in summary["notes"]]
    return "\n".join(lines) + "\n"


def write_tune_outputs(out: Path, summary: dict[str, Any]) -> Path:
    """Write ``trials.csv``, ``trials.png`` and ``report.md``, then ``summary.json`` (last)."""
    unlink_links(out, ("trials.csv", "trials.png", "report.md"))  # never written through a link
    _write_csv(out / "trials.csv", summary)
    if summary["trials"]:
        _plot(out / "trials.png", summary)
    report = out / "report.md"
    report.write_text(_markdown(summary), encoding="utf-8")
    atomic_write(out / "summary.json", json.dumps(summary, indent=2, allow_nan=True) + "\n")
    return report


# -- tuned comparison --------------------------------------------------------------------------


def load_tuned(path: str | Path, checked=None):
    """The released (best) run of a tuning directory, as ``RunData`` carrying the tuning ε.

    The directory is checked and its ε recomputed from the trials' own files by
    :func:`~fedprivopt.simulation.tune_check.check_tuning` (``checked``: its result, when the
    caller has it). The run's strategy is renamed ``"<strategy> (tuned)"`` so that it sits beside
    untuned runs.

    Raises
    ------
    ValueError
        Naming the directory or file: not a finished tuning, no released trial, or files that
        disagree (see :mod:`fedprivopt.simulation.tune_check`).
    """
    from fedprivopt.simulation.rundata import trial_note
    from fedprivopt.simulation.tune_check import check_tuning

    checked = check_tuning(path) if checked is None else checked
    run, eps = checked.run, checked.epsilon
    # thirty-ninth review of issue 15 (reports, finding 1): a tuning of runs configured with
    # accountant = "pld" was labelled pld in summary.csv, its epsilon being RDP's
    tuned = {**run.summary, "strategy": run.strategy + TUNED_SUFFIX, "epsilon": eps,
             EPSILON_ACCOUNTANT: TUNING_ACCOUNTANT}  # fmt: skip
    own = trial_note(run.path).split(" (its ")[0]  # its tuning's ε is shown (any source)
    kept = tuple(w for w in run.warnings if not w.startswith(f"{own} (its "))
    return dataclasses.replace(run, summary=tuned, ledger_epsilon=eps, warnings=kept)


def procedure_lines(
    plans: Mapping[str, tuple[int, Mapping[str, Any]]], differ_in: str = "the tuning seed"
) -> list[str]:
    """The note on how each strategy was tuned: a table, and whether they were tuned alike.

    ``plans`` maps each strategy to its number of tunings and one tuning's plan (``tune.json``,
    or its ``summary.json``: ``grid``, ``trial_count`` and ``metric`` are the same in both).
    When the strategies' grid sizes, trial distributions or selection metrics differ, a
    sentence says so, with each strategy's number of grid points. ``differ_in``: what a
    strategy's tunings differ in (``compare --tune-grid``'s also in the noise multiplier).

    Thirty-fourth review of issue 15 (tuning, finding 1): ``compare --tune-grid`` with
    ``--tune-grid server-learning-rate=0.5,1 --tune-grid
    dp-fedadam:server-learning-rate=0.01,0.03,0.1`` wrote no grid size per strategy (only the
    tunings' commands), where ``compare-tuned`` of the same tunings says they were not tuned
    alike (2 against 3 points).
    """
    from fedprivopt.simulation.report_markdown import table_cell

    lines = ["", f"How each strategy was tuned (its tunings differ in {differ_in} alone):", "",
             "| strategy | tunings | grid | grid points | trials per tuning | selection |",
             "|---|---:|---|---:|---|---|"]  # fmt: skip
    points, counts, metrics = {}, set(), set()
    for strategy, (n, plan) in plans.items():
        points[strategy] = math.prod(len(v) for v in plan["grid"].values())
        counts.add(json.dumps(plan["trial_count"], sort_keys=True))
        metrics.add(plan["metric"])
        grid = "; ".join(f"{k} in {v}" for k, v in plan["grid"].items())
        selection = f"{'min' if plan['metric'] == 'eval_loss' else 'max'} of `{plan['metric']}`"
        cells = [strategy + TUNED_SUFFIX, n, grid, points[strategy],
                 trial_count_text(plan["trial_count"]), selection]  # fmt: skip
        lines.append("| " + " | ".join(table_cell(c) for c in cells) + " |")
    differ = []
    if len(set(points.values())) > 1:
        differ.append(f"grid sizes ({', '.join(f'{s}: {n}' for s, n in points.items())} points)")
    if len(counts) > 1:
        differ.append("distributions of the number of trials")
    if len(metrics) > 1:
        differ.append(f"selection metrics ({', '.join(sorted(metrics))})")
    if differ:
        lines += ["", f"**The strategies were not tuned alike:** their {'; '.join(differ)} "
                  "differ, so the rows do not compare procedures of equal search or "
                  "criterion."]  # fmt: skip
    return lines


def tunings_lines(checks: Sequence[Any]) -> list[str]:
    """``compare-tuned``'s note on how each strategy was tuned, and what each tuning released.

    ``checks`` are :func:`~fedprivopt.simulation.tune_check.check_tunings`' results. One row per
    strategy (its tunings share grid, trial count and metric), a sentence when the strategies
    were not tuned alike (:func:`procedure_lines`), and each tuning's released hyperparameters.

    Thirty-third review of issue 15 (results, finding 5): ``compare-tuned`` of ``tune --strategy
    dp-fedavg --grid num-server-rounds=1,2`` (selected by accuracy) and ``tune --strategy
    dp-fedadam --grid server-learning-rate=0.01,0.03,0.1 --metric eval_loss`` recorded neither
    grid nor selection metric: the two rows read as equal procedures.
    """
    from fedprivopt.simulation.report_format import plain_text
    from fedprivopt.simulation.report_markdown import table_cell

    checks = list(checks)  # read twice: an iterator lost its table (forty-third review, 7)
    by_strategy: dict[str, list[Any]] = {}
    for check in checks:
        by_strategy.setdefault(check.plan["strategy"], []).append(check)
    lines = procedure_lines({s: (len(g), g[0].plan) for s, g in by_strategy.items()})
    # thirty-fifth review of issue 15 (tuning, finding 4): the released trial's number was a
    # column here, a lower bound on the number of trials K, which the tuning's epsilon assumes
    # secret (the tuning's own report.md, the operator's, shows it)
    lines += ["", "Each tuning's released hyperparameters (the released trial's number is not "
              "shown: trial-NNN means that at least NNN trials ran, and the tuning's epsilon "
              "assumes their number stays secret; the tuning's own report.md, the operator's, "
              "names it):", "",
              "| tuning | strategy | hyperparameters |", "|---|---|---|"]  # fmt: skip
    for check in checks:
        drawn = {t["trial"]: t["hyperparameters"] for t in check.plan["trials"]}
        hp = ", ".join(f"{k} = {v!r}" for k, v in drawn.get(check.best_dir.name, {}).items())
        cells = [check.path, check.plan["strategy"] + TUNED_SUFFIX, hp]
        # forty-seventh review of issue 15 (tuning, finding 5): a tuning directory named
        # '<img src=x onerror=alert(1)>' (or '![x](t.png)') was written as HTML (an image)
        lines.append("| " + " | ".join(table_cell(plain_text(c)) for c in cells) + " |")
    return lines
