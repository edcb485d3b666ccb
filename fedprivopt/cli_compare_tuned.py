"""The command line's ``compare-tuned``: compare's report over tunings, at their tuning's ε.

``fedprivopt compare-tuned TUNED... [--untuned DIR...] --out DIR`` writes ``compare``'s report
(``summary.csv``, ``report.md``, the plots) over the released trial of each ``fedprivopt tune``
directory, at the ε of its whole tuning (a row over n tunings at their composition), optionally
beside untuned runs at their own ε. Every tuning, untuned run and ``--out`` is checked before
anything is written (exit 2, one line); a report stopped while it is written leaves no files.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from fedprivopt.cli_args import HelpFormatter, UsageError, check_out_dir, check_path_text
from fedprivopt.cli_tune import METRICS

__all__ = ["add_compare_tuned", "cmd_compare_tuned"]


_COMPARE_TUNED_EPSILON = (
    "ε of a row whose strategy ends in '(tuned)' is its tuning's (the whole tuning procedure: "
    "RDP, RepeatAndSelectDpEvent), for one tuning, at the δ shown; a row over n tunings costs "
    "their composition (see Notes; epsilon_tunings_composed in summary.csv); ε of any other "
    "row is the accountant's value after each "
    "run's last completed round, at the δ shown; "
)
"""``compare-tuned``'s "Privacy parameters" sentence (it was the untuned runs' alone)."""


def cmd_compare_tuned(args: argparse.Namespace) -> int:
    """``fedprivopt compare-tuned``: compare's report at the ε that includes the tuning."""
    from fedprivopt.cli_compare_tune_report import composition_lines
    from fedprivopt.core.text import shown
    from fedprivopt.simulation.report import insert_summary_column, write_report
    from fedprivopt.simulation.rundata import load_runs
    from fedprivopt.simulation.tune_check import check_tunings, composed_epsilon
    from fedprivopt.simulation.tune_notes import TUNED_SUFFIX, selection_lines
    from fedprivopt.simulation.tune_report import load_tuned, tunings_lines
    from fedprivopt.simulation.tune_untuned import (
        REPORT_TITLE,
        check_out_outside,
        check_report_dir,
        check_untuned_copies,
        check_untuned_files,
        check_untuned_path,
        check_untuned_seeds,
        tuned_comparison_cells,
    )

    # sixteenth review of issue 15: an empty TUNED ("") was taken for the current directory
    # and the refusal named --out ("'X' is inside the tuning ''")
    tuned = [check_path_text(t, "TUNED") for t in args.tuned]
    out = check_out_dir(args.out)
    try:
        check_out_outside(out, args.tuned)
        check_report_dir(out)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for text in tuned:  # thirty-fourth review of issue 15 (tuning, finding 3)
        cells = tuned_comparison_cells(text)
        if cells and not (text / "summary.json").exists():
            raise UsageError(
                f"TUNED: {shown(str(text))} is a tuned comparison (compare --tune-grid), not one "
                f"tuning; give its {len(cells)} cells' tunings as TUNED "
                f"({shown(str(text / 'tune' / '*'))})"
            )
    runs, by_plan, sigmas = [], {}, {}
    try:
        checks = check_tunings(tuned)
        for checked in checks:  # a strategy's tunings are seeds of one plan
            runs.append(load_tuned(checked.path, checked))
            by_plan.setdefault(checked.plan["strategy"], []).append(checked)
            sigmas.setdefault(checked.plan["strategy"], set()).add(runs[-1].noise_multiplier)
        untuned = []
        for text in args.untuned or []:
            check_untuned_path(check_path_text(text, "--untuned"))
            loaded = load_runs(text)
            check_untuned_path(text, loaded)
            untuned.extend(loaded)
        check_untuned_seeds(untuned)
        check_untuned_copies(tuned, untuned)
        check_untuned_files(untuned)
        runs.extend(untuned)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.metric is not None and not any(run.has_metric(args.metric) for run in runs):
        raise UsageError(f"argument --metric: no run reports {args.metric!r}")
    _check_tuned_metric(args.metric, runs, [run.path for run in runs[: len(runs) - len(untuned)]])
    notes = (
        f"Rows whose strategy ends in '{TUNED_SUFFIX.strip()}' are the released (best) trial of "
        "a `fedprivopt tune`, one per tuning (several tunings of a strategy, e.g. with other "
        "--seed, are its seeds), and their epsilon is that of the **whole tuning procedure** "
        "(RDP, RepeatAndSelectDpEvent), not of the run alone. The other rows are untuned runs "
        "at their own run's epsilon; the hyperparameters they use were not chosen on private "
        "data by this procedure (if they were tuned on the same private data elsewhere, their "
        "epsilon understates what was spent)."
    )
    notes += "\n".join(["", *selection_lines(checks)])  # empty when every selection is covered
    # thirty-first review of issue 15, compare finding 4: a row of n tunings showed one
    # tuning's epsilon, and "Privacy parameters" called it each run's own
    # thirty-second review of issue 15, reports finding 6: tunings of a grid over
    # noise-multiplier that released different sigmas fell into rows of one tuning each (n 1)
    rows = {(s, tuple(sorted(sigmas[s]))): (len(c), composed_epsilon(c, len(c)))
            for s, c in by_plan.items()}  # fmt: skip
    notes += "\n" + "\n".join([*composition_lines(rows, empty=False), *tunings_lines(checks)])
    # thirty-third review of issue 15 (results, finding 7): a row's composed epsilon was in
    # report.md's notes alone; summary.csv has it beside each tuned row (empty: untuned)
    composed = {s + TUNED_SUFFIX: repr(eps) for (s, _), (_, eps) in rows.items()}

    def write() -> Path:
        written = write_report(out, runs, title=REPORT_TITLE, metric=args.metric, notes=notes,
                               epsilon_text=_COMPARE_TUNED_EPSILON)  # fmt: skip
        insert_summary_column(out / "summary.csv", "epsilon_tunings_composed", "epsilon",
                              lambda line: composed.get(line["strategy"], ""))  # fmt: skip
        return written

    report = _write_whole_report(out, write)
    print(f"report: {report}")
    return 0


def _check_tuned_metric(metric: str | None, runs: list, tunings: list[Path]) -> None:
    """Refuse a report metric a tuning's released trial (``runs[i]``, in ``tunings[i]``) lacks.

    Thirty-first review of issue 15 (compare, finding 7): ``compare-tuned T --untuned C``,
    ``C`` of another task, chose ``C``'s metric (or ``--metric`` named it) and skipped ``T``'s
    released trial with a warning: rc 0, a tuned comparison without a tuned row, whose notes
    still gave that tuning's ε.
    """
    from fedprivopt.core.text import shown
    from fedprivopt.simulation.rundata_aggregate import choose_metric

    try:
        chosen = choose_metric(runs) if metric is None else metric
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for path, run in zip(tunings, runs, strict=False):
        if not run.has_metric(chosen):
            how = "given" if metric is not None else "chosen for the runs; give --metric"
            raise UsageError(
                f"argument --metric: {chosen!r} ({how}) is not reported by the released trial "
                f"{shown(str(path))}; compare-tuned reports every tuning it is given"
            )


def _write_whole_report(out: Path, write):
    """``write()``'s report in ``out``, or, if it stops (Ctrl-C, a full disk), no report files.

    Twenty-eighth review of issue 15: Ctrl-C while ``compare-tuned`` wrote its report (2.8 s
    into a 3.3 s call) left ``summary.csv`` and ``metric_vs_round.png`` without ``report.md``,
    and the same command was then refused: "holds 'metric_vs_round.png', which compare-tuned
    did not write". An earlier report of ours in ``out`` (checked before) is removed first, so
    that none of its files is left beside the new ones; a stopped write removes what it wrote,
    and ``out`` itself if this call created it.
    """
    from fedprivopt.simulation.cells import REPORT_FILES

    created = not out.exists()
    # report.md last: it tells an earlier report as compare-tuned's (check_report_dir), so a stop
    # between two removals leaves a report the same command replaces (forty-second review
    # follow-up, ledger, open for the lead: report.md went second, and the plots left alone
    # were refused as files compare-tuned did not write)
    names = sorted(REPORT_FILES, key=lambda name: name == "report.md")
    for name in names:
        (out / name).unlink(missing_ok=True)
    try:
        return write()
    except BaseException:
        for name in names:
            with contextlib.suppress(OSError):
                (out / name).unlink(missing_ok=True)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise


def add_compare_tuned(sub) -> None:
    """Add ``compare-tuned`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "compare-tuned",
        help="compare tuned strategies at the epsilon that includes their tuning",
        description="Write compare's report (summary.csv, report.md, plots) over the released "
        "trial of each tuning directory, at the epsilon of its whole tuning, optionally beside "
        "untuned runs (a compare output or run directories) at their own epsilon.",
        epilog="example:\n  fedprivopt compare-tuned runs/tune-fedavg runs/tune-fedadam "
        "--untuned runs/compare --out runs/tuned-report",
        formatter_class=HelpFormatter,
    )
    p.add_argument("tuned", nargs="+", metavar="TUNED", help="directories written by tune")
    p.add_argument(
        "--untuned",
        action="append",
        metavar="DIR",
        help="a compare output or run directory to show beside (repeatable)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="report directory")
    p.add_argument("--metric", choices=METRICS, help="task metric of the report")
    p.set_defaults(func=cmd_compare_tuned)
