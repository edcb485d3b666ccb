"""The report of ``compare --tune-grid``: compare's report over the cells' tunings.

:func:`report` writes ``compare``'s report (``summary.csv``, ``report.md``, the plots) over each
tuning's released trial at the ε of the whole tuning, a row over n tunings at their composition,
with ``epsilon_single_run`` and ``epsilon_tunings_composed`` beside ``epsilon`` in
``summary.csv``; its notes say what that ε covers, list every tuning and give the equivalent
``fedprivopt tune`` commands. :func:`composition_lines` is ``compare-tuned``'s note too
(:mod:`fedprivopt.cli_compare_tuned`).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

from fedprivopt.cli_args import UsageError
from fedprivopt.core.text import epsilon_text

__all__ = ["composition_lines", "report"]


def report(args: argparse.Namespace, out: Path, tunings: list) -> int:
    """``compare``'s report over the released trials, at the ε that includes their tuning."""
    from fedprivopt.simulation.cells import leftover_note
    from fedprivopt.simulation.report import insert_summary_column, write_report
    from fedprivopt.simulation.tune_check import check_tunings, composed_epsilon
    from fedprivopt.simulation.tune_notes import TUNED_SUFFIX, selection_lines
    from fedprivopt.simulation.tune_report import load_tuned
    from fedprivopt.strategies.config import NON_PRIVATE

    groups: dict[tuple, list] = {}  # the seeds of one strategy and sigma: tunings of one base
    summaries, empty, ran = {}, [], {}
    for cell, ns, argv in tunings:
        summary = json.loads((Path(ns.out) / "summary.json").read_text(encoding="utf-8"))
        summaries[cell.label] = (summary, argv)
        s = cell.config.strategy
        # a baseline runs at sigma 0 whatever the preset's noise multiplier (thirty-second
        # review of issue 15, reports finding 3: its composition row said sigma 0.5)
        key = (s.strategy, 0.0 if s.strategy in NON_PRIVATE else s.noise_multiplier)
        ran.setdefault(key, []).append(cell.label)
        if summary["best"] is None:
            empty.append(cell.label)
            continue
        groups.setdefault(key, []).append(ns.out)
    runs, single, checks = [], {}, {}
    try:
        for key, paths in groups.items():
            checks[key] = check_tunings(paths)
            for checked in checks[key]:
                run = load_tuned(checked.path, checked)
                runs.append(run)
                eps1 = float(summaries[checked.path.name][0]["epsilon_single_run"])
                # the costliest of the row's tunings, as its epsilon: thirty-eighth review of
                # issue 15 (reports, finding 3): the last tuning's, 17.27 beside a row epsilon
                # 25.05 of a tuning whose resumed secure trial spent one run's 18.81
                row = (run.strategy, run.noise_multiplier)
                single[row] = max(single.get(row, eps1), eps1)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not runs:
        print(f"no tuning released a trial ({', '.join(empty)}); no report", file=sys.stderr)
        return 0
    # a row publishes its tunings together: their composition (issue 20 review, finding 4);
    # a tuning that released nothing counts too: its outcome shows in the row's seeds
    # (thirty-first review of issue 15, compare finding 3)
    rows = {key: (len(ran[key]), composed_epsilon(checks[key], len(ran[key]))) for key in groups}
    notes = _notes(summaries, empty, rows)
    # thirty-fifth review of issue 15 (lead 12; the tuning reviewer's report): a grid run with
    # --selection-on-private-users said nothing of the selection ε does not cover, where
    # compare-tuned names each such tuning
    notes += "\n".join(["", *selection_lines([c for group in checks.values() for c in group])])
    # forty-fifth review of issue 15 (reports, finding 2): tunings of earlier calls in OUT/tune
    left = leftover_note(out, [cell.label for cell, _, _ in tunings], "tune")
    report = write_report(out, runs, title=f"fedprivopt compare: {args.config} (tuned)",
                          metric=args.metric, notes=notes, epsilon_text=_TUNED_EPSILON,
                          issues=[left] if left else [])  # fmt: skip
    # thirty-third review of issue 15 (lead, found by the results reviewer): a row of n
    # tunings showed one tuning's epsilon in summary.csv (11.73 for 3 tunings composed to
    # 20.65), only report.md's notes had their composition; as compare-tuned's summary.csv
    composed = {(k[0] + TUNED_SUFFIX, float(k[1])): eps for k, (_, eps) in rows.items()}
    insert_summary_column(out / "summary.csv", "epsilon_single_run", "epsilon",
                          lambda line: repr(_by_row(single, line)))  # fmt: skip
    insert_summary_column(out / "summary.csv", "epsilon_tunings_composed", "epsilon",
                          lambda line: repr(_by_row(composed, line)))  # fmt: skip
    reused = sum(_earlier(s) for s, _ in summaries.values())
    note = f" ({reused} trials from an earlier call)" if reused else ""
    print(f"report: {report}{note}")
    return 0


def _earlier(summary: dict) -> int:
    """The trials of a tuning's ``summary`` that an earlier call ran: reused or resumed.

    Thirty-first review of issue 15 (compare, finding 13): a resumed trial was counted as run
    in this call ("trials reused" 0, no "trials from an earlier call" on stdout), where
    ``compare`` counts a resumed cell as from an earlier call.
    """
    return sum(
        str(t.get("origin", "")).startswith(("reused", "resumed")) for t in summary["trials"]
    )


def _fmt(x: Any) -> str:
    """An ε of the tables: rounded up (:func:`~fedprivopt.core.text.epsilon_text`)."""
    return "∞" if isinstance(x, float) and math.isinf(x) else epsilon_text(x)


_TUNED_EPSILON = (
    "ε of every row here is its tuning's (the whole tuning procedure: RDP, "
    "RepeatAndSelectDpEvent; one run's ε is epsilon_single_run), for one tuning, at the δ "
    "shown; a row over n seeds is n tunings on the same users, whose publication costs their "
    "composition (see Notes); "
)
"""report.md's "Privacy parameters" sentence as it holds for tuned rows (finding 4)."""


def _notes(
    summaries: dict[str, tuple[dict, list]],
    empty: list[str],
    rows: dict[tuple, tuple[int, float]] | None = None,
) -> str:
    """The report's notes: what ε means here, one row per tuning, the equivalent commands.

    ``rows`` maps (strategy, σ) to the number of tunings in its row and their composed ε.
    """
    from fedprivopt.simulation.tune_report import procedure_lines

    first = next(iter(summaries.values()))[0]
    tc = first["trial_count"]
    dist = (
        f"Poisson with mean {tc['mean']:g}"
        if tc["distribution"] == "poisson"
        else f"truncated negative binomial with mean {tc['mean']:g} (eta {tc['shape']:g})"
    )
    lines = [
        "**Every row is tuned, and its epsilon includes the tuning.** Each cell (strategy, "
        "noise multiplier, seed) is one private tuning (`fedprivopt tune`, Papernot & Steinke, "
        "ICLR 2022; its directory `tune/<cell>/`, its tuning seed drawn from OS entropy): K "
        f"trials with K drawn from the {dist}, hyperparameters drawn from the grid, only the best "
        "trial released. A row's runs are those released trials, one per cell seed (the cell "
        "seed only names the cell; the trials' own run seeds, drawn from the tuning seed, are in "
        "each tuning's report and files, not in the header), and the epsilon in the summary is "
        "that of the **whole tuning procedure** (RDP, RepeatAndSelectDpEvent), "
        "not of the run alone; `epsilon_single_run` (one run's epsilon, RDP) stands beside it "
        "below and in summary.csv. Strategies are named '<strategy> (tuned)'.",
        "",
        "**This report is the operator's view, not a release.** It shows each tuning's number "
        "of trials K and the released trials' numbers; each tuning seed is secret, drawn from OS "
        "entropy as `fedprivopt tune` without --seed draws it and kept only in "
        "`tune/<cell>/tune.json` (a later call reuses it). The tuning epsilon assumes K, the "
        "tuning seed and the other trials stay secret: publishing this report, summary.csv or "
        "tune/ is NOT covered by it. Publish only each tuning's released trial (its model, "
        "hyperparameters and score).",
        "",
        "| cell | trials run | released trial | hyperparameters | epsilon (tuning) | "
        "epsilon_single_run | trials from an earlier call |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    for label, (s, _) in summaries.items():
        best = s["best"]
        hp = (
            ""
            if best is None
            else ", ".join(f"{k} = {v!r}" for k, v in best["hyperparameters"].items())
        )
        reused = _earlier(s)
        lines.append(
            f"| [{label}](tune/{label}/report.md) | {s['trials_run']} | "
            f"{'none' if best is None else best['trial']} | {hp} | {_fmt(s['epsilon'])} | "
            f"{_fmt(s['epsilon_single_run'])} | {reused} |"
        )  # fmt: skip
    # thirty-fourth review of issue 15 (tuning, finding 1): per-strategy grids of different
    # sizes went unsaid here, where compare-tuned of the same tunings says so
    by_strategy: dict[str, list[dict]] = {}
    for s, _ in summaries.values():
        by_strategy.setdefault(s["strategy"], []).append(s)
    lines += procedure_lines({k: (len(v), v[0]) for k, v in by_strategy.items()},
                             differ_in="the noise multiplier and the tuning seed")  # fmt: skip
    lines += composition_lines(rows or {})
    if empty:
        lines += [
            "",
            f"Released nothing (no trial drawn, or none finished), so left out of the means "
            f"(over fewer seeds): {', '.join(empty)}.",
        ]
    lines += [
        "",
        "Each tuning is the output of (the same files, `compare-tuned` reads them; run in its "
        "directory, the command continues that tuning with the secret seed of its tune.json):",
        "",
        "```",
    ] + [shlex.join(["fedprivopt", *argv]) for _, argv in summaries.values()]
    return "\n".join([*lines, "```"])  # fmt: skip


def composition_lines(rows: dict[tuple, tuple[int, float]], *, empty: bool = True) -> list[str]:
    """The report's note on rows over several tunings: their composed ε, one line per row.

    ``rows`` maps (strategy, σ) to the number of tunings in its row and their composed ε
    (:func:`~fedprivopt.simulation.tune_check.composed_epsilon`); nothing when empty. σ may be
    a tuple: the noise multipliers of the report rows one plan's tunings released.
    ``empty``: n counts tunings that released nothing (``compare --tune-grid``).
    """
    if not rows:
        return []
    counted = (" n counts every tuning of the row, also one that released nothing (its "
               "outcome shows in the row's seeds).") if empty else ""  # fmt: skip
    return [
        "",
        "A row's mean and std are over several tunings (one per seed) on the **same "
        "users**; publishing a row releases all of them, which costs their composition "
        "(RDP, the costliest tuning's RepeatAndSelectDpEvent self-composed n times), not "
        f"one tuning's epsilon.{counted}{_split(rows)}",
        "",
        "| strategy | noise multiplier | tunings n | epsilon (row: n tunings composed) |",
        "|---|---:|---:|---:|",
        *(
            f"| {st} | {_sigmas(sigma)} | {n} | {_fmt(eps)} |"
            for (st, sigma), (n, eps) in rows.items()
        ),
    ]


def _split(rows: dict[tuple, tuple[int, float]]) -> str:
    """The note on one strategy's tunings that released trials of several noise multipliers."""
    if not any(isinstance(sigma, tuple) and len(sigma) > 1 for _, sigma in rows):
        return ""
    return (" Tunings of one strategy whose released trials have different noise multipliers "
            "(a grid over noise-multiplier) are in several rows of the summary, and are "
            "composed together here: publishing those rows releases all of them.")  # fmt: skip


def _sigmas(sigma: float | tuple[float, ...]) -> str:
    """``0.5``, or ``0.5, 1`` for tunings that released several noise multipliers."""
    values = sigma if isinstance(sigma, tuple) else (sigma,)
    return ", ".join(f"{v:g}" for v in values)


def _by_row(values: dict[tuple, float], line: dict[str, str]) -> float:
    """The value of a ``summary.csv`` line's (strategy, σ) in ``values`` (NaN if none)."""
    return values.get((line["strategy"], float(line["noise_multiplier"])), math.nan)
