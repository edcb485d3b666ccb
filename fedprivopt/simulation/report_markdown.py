"""The text of ``report.md``: its header, Summary table, plots' captions and privacy parameters.

:func:`markdown` writes the report of :func:`~fedprivopt.simulation.report.write_report` from
the selected runs (:class:`~fedprivopt.simulation.rundata_aggregate.Selection`) and their rows
(:func:`~fedprivopt.simulation.rundata_aggregate.aggregate_runs`), with the privacy settings the
runs share. Its cells (numbers rounded to what the spread supports, ``mean ± std``; seeds listed
or as ranges; each cell escaped for a markdown table) are written by
:mod:`fedprivopt.simulation.report_format`, whose :func:`table_cell` (also used by the tuning's
reports) and :func:`rounds_text` (a row's completed rounds, as ``summary.csv`` writes them too)
this module re-exports.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from fedprivopt.core.text import epsilon_text
from fedprivopt.simulation.report_format import (
    LISTED,
    alt_text,
    code_span,
    fmt,
    fmt_eps,
    fmt_pm,
    one_line,
    plain_text,
    rounds_text,
    seed_list,
    seeds_cell,
    table_cell,
)
from fedprivopt.simulation.report_plots import pretty_metric
from fedprivopt.simulation.rundata import RunData
from fedprivopt.simulation.rundata_aggregate import (
    Selection,
    differing_bases,
    epsilon_basis,
    evaluations_outside,
    mechanism,
    seeds_composed_epsilon,
)

__all__ = ["markdown", "rounds_text", "table_cell"]

_PRIVACY_CONFIG_WORDS = (
    "accountant", "clip", "sampling", "cohort", "users", "delta", "epsilon", "target", "secure",
    "noise", "rounds", "population", "clients-per-round",
)  # fmt: skip
# Keys the words above match that mean nothing to privacy (a simulation's batching of a cohort),
# and ``delta``, which the "δ" line shows (thirtieth review of issue 15, privacy-report finding 4)
_NOT_PRIVACY_CONFIG = ("cohort-chunk", "delta")
_EARLIER = ("reused", "resumed")  # origins of runs made by an earlier call


def _seeds_text(rows: Sequence[dict[str, Any]], seeds: Sequence[int]) -> str:
    """The header's seeds: ``3 seeds (0, 1, 2)``, or the runs a group has when groups differ.

    Thirty-fourth review of issue 15 (the tuning reviewer's report): a tuned comparison's
    groups hold released trials, each with its own run seed, and the header said "2 strategies
    × 1 noise multipliers × 2 seeds (1356721935, 2138214908)" for 2 runs, not 4.
    """
    if len({tuple(sorted(r["seeds"])) for r in rows}) <= 1:
        return f"{len(seeds)} seeds ({seed_list(seeds)})"
    counts = sorted({len(r["seeds"]) for r in rows})
    each = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    runs = "run" if counts == [1] else "runs"
    return f"{each} {runs} per group (seeds differ between groups: {seed_list(seeds)})"


def _header_seeds(rows: Sequence[dict[str, Any]], runs: Sequence[RunData]) -> str:
    """The header's seeds (:func:`_seeds_text`), without the run seeds of tuned rows.

    Forty-seventh review of issue 15 (tuning, finding 2): ``compare-tuned T`` (the report one
    publishes beside the tunings' epsilon) said "1 seeds (248092671)", the released trial's
    run seed, ``derive_seed(tuning seed, "tune", "run", i)``: with a guessable ``--seed`` it
    gives the trial's number ``i`` (a lower bound on the number of trials K, which that
    epsilon assumes secret) and confirms the seed, and a seeded trial's seed regenerates its
    noise. A tuned row's released trials are counted, their seeds left to the tunings' files.
    """
    from fedprivopt.simulation.tune_notes import TUNED_SUFFIX

    tuned = [r for r in rows if str(r["strategy"]).endswith(TUNED_SUFFIX)]
    if not tuned:
        return _seeds_text(rows, sorted({r.seed for r in runs}))
    counts = sorted({len(r["seeds"]) for r in tuned})
    each = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    text = (f"{each} {'tuning' if counts == [1] else 'tunings'} per tuned group (the released "
            "trials' run seeds are not shown: with the tuning seed they give a trial's number, "
            "a lower bound on the number of trials, which the tuning's epsilon assumes "
            "secret)")  # fmt: skip
    untuned = [r for r in rows if r not in tuned]
    if untuned:
        seeds = sorted({s for r in untuned for s in r["seeds"]})
        text += f"; untuned groups: {_seeds_text(untuned, seeds)}"
    return text


def _noise_text(runs: Sequence[RunData]) -> str:
    """``2 noise multipliers (0.5, 1)``, with ``plus non-private baselines`` when there are any.

    Thirty-first review of issue 15 (compare, finding 6): a baseline's σ 0 was counted as one of
    the grid's noise multipliers (``2 strategies × 3 noise multipliers (0, 0.5, 1)`` for 3 runs).
    """
    private = [r for r in runs if mechanism(r.summary.get("config") or {}) is not None]
    sigmas = sorted({r.noise_multiplier for r in private})
    text = f"{len(sigmas)} noise multipliers ({', '.join(f'{s:g}' for s in sigmas)})"
    by: dict[str, set[float]] = {}
    for r in private:
        by.setdefault(r.strategy, set()).add(r.noise_multiplier)
    if len({frozenset(v) for v in by.values()}) > 1:
        # forty-first review of issue 15 (reports 1): strategies run at their own preset sigma
        # read "2 strategies × 2 noise multipliers (0.5, 2)", a grid of four, for two runs
        each = [(name, sorted(v)) for name, v in sorted(by.items())]
        text = "noise multipliers by strategy (" + "; ".join(
            f"{name} {', '.join(f'{s:g}' for s in v[:4])}{', ...' if len(v) > 4 else ''}"
            for name, v in each
        ) + ")"  # fmt: skip
    if len(private) == len(runs):
        return text
    return f"{text} plus non-private baselines" if private else "no noise (non-private)"


def _better(metric: str) -> str:
    """Where a better point lies on the privacy–utility plot: ``up``, or ``down`` for the loss.

    Thirty-second review of issue 15 (reports, finding 1): ``compare --metric eval_loss`` said
    "up and to the left is better" of a plot of the loss, whose better points lie down.
    """
    return "down" if metric == "eval_loss" else "up"


def markdown(
    title: str,
    sel: Selection,
    rows: Sequence[dict[str, Any]],
    issues: Sequence[str],
    notes: str | None,
    ref: tuple[str, dict[str, float]] | None = None,
    origins: Mapping[str, str] | None = None,
    epsilon_text: str = "",
) -> str:
    """The text of ``report.md`` (:func:`~fedprivopt.simulation.report.write_report`)."""
    # forty-fifth review of issue 15 (reports, finding 1): a task's metric name is its own text
    from fedprivopt.simulation.tune_notes import TUNED_SUFFIX

    m, pretty = sel.metric, one_line(pretty_metric(sel.metric))
    strategies = sorted({r.strategy for r in sel.runs})
    engines = sorted({str(r.summary.get("engine", "?")) for r in sel.runs})
    budget = sum(r.summary.get("stopped_reason") == "budget" for r in sel.runs)
    lines = [
        f"# {one_line(title)}",
        "",
        f"{len(sel.runs)} runs in {len(rows)} groups: {len(strategies)} strategies "
        f"({', '.join(strategies)}) × {_noise_text(sel.runs)} × {_header_seeds(rows, sel.runs)}; "
        f"engine {', '.join(engines)}. "
        f"Task metric: {code_span(m)}. Values are the final evaluation, mean ± sample std over "
        "seeds.",
    ]
    if budget:
        lines.append(f"{budget} runs stopped early at the privacy budget.")
    diverged = sum(len(r["diverged"]) for r in rows)
    if diverged:
        lines.append(
            f"{diverged} of {len(sel.runs)} runs diverged (an evaluation loss or the task metric, "
            "or the model, became non-finite): their final values describe an overflowed model, "
            "and the seeds column names the round each diverged from."
        )
    for key, what in (("evaluated_model", "Evaluated"), ("initial_model", "Initial model")):
        found: dict[str, set[str]] = {}
        shown_runs = [r for r in sel.runs if r.summary.get(key)]
        # forty-seventh review of issue 15 (reports, finding 2): a task's own text, whose
        # ``![x](http://...)`` was an image of another address: brackets and ``<`` escaped
        values = [plain_text(r.summary[key]) for r in shown_runs]
        for value, name in zip(values, _row_names(shown_runs, values), strict=True):
            found.setdefault(value, set()).add(name)
        # forty-fourth review of issue 15 (reports, finding 4): dp-fedadam evaluated at its
        # moving average beside dp-fedavg's last iterate read "Evaluated: the exponential
        # moving average ...; the last iterate.", not saying which row's metric is which
        text = "; ".join(
            value if len(found) == 1 else f"{value} ({', '.join(sorted(names))})"
            for value, names in sorted(found.items())
        )
        if found:
            lines.append(one_line(f"{what}: {text}."))  # a task's own text
    if origins:
        earlier = sum(origins.get(r.path.name, "").startswith(_EARLIER) for r in sel.runs)
        lines.append(
            f"{earlier} of {len(sel.runs)} runs come from an earlier call (reused or resumed: "
            "their stored configuration equals this call's); see [Runs](#runs)."
        )
    loss = m != "eval_loss"  # else the metric's column is the loss (one column, not two)
    lines += [
        "",
        "## Summary",
        "",
        f"| strategy | σ | seeds | ε | δ | rounds | {table_cell(pretty)} |{' eval loss |' * loss}"
        " s/round |",
        "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * loss + "---:|",
    ]
    named = differing_bases(rows)  # each ε cell names what it is (thirty-seventh review)
    for r in rows:
        n, n_ok = r["n_seeds"], r["n_finite"]
        seeds_column = seeds_cell(
            n,
            n_ok,
            r["diverged"],
            r.get("n_budget", 0),
            seeds_named=not str(r["strategy"]).endswith(TUNED_SUFFIX),
        )
        eps, basis = fmt_eps(r["epsilon"], r.get("private", False)), epsilon_basis(r, named)
        if basis and math.isfinite(r["epsilon"]):
            eps += f" ({basis})"
        cells = [
            r["strategy"], f"{r['noise_multiplier']:g}", seeds_column, eps,
            fmt(r["delta"], 3), rounds_text(r), fmt_pm(r[f"{m}_mean"], r[f"{m}_std"], n_ok),
            *[fmt_pm(r["eval_loss_mean"], r["eval_loss_std"], n)] * loss,
            fmt(r["seconds_per_round"], 3),
        ]  # fmt: skip
        lines.append("| " + " | ".join(table_cell(c) for c in cells) + " |")
    ref_text = ""
    if ref is not None:
        loss = ref[1].get("loss")
        name = plain_text(ref[0])  # a task's reference() text: one line (finding 2)
        lines += [
            "",
            f"Reference: {name}, a model built from public information only and never trained: "
            f"{pretty} {fmt(ref[1][m])}"
            + (f", eval loss {fmt(loss)}." if loss is not None else ".")
            + " A strategy that does not beat it has learned nothing about the users.",
        ]
        ref_text = f" The dotted grey line is the {name}."
    lines += ["", "Full-precision numbers: [summary.csv](summary.csv)."]
    if any(r.get("private", False) for r in rows):
        # forty-second review of issue 15 (contract 3): the column was published unqualified
        lines.append(
            "s/round is wall time: it follows the sizes of the sampled cohorts and their users' "
            "example counts without noise, so epsilon does not cover it (nor the round metrics "
            "of metrics.jsonl: summary.json's not_covered)."
        )
    lines += _private_evaluations(sel.runs, pretty, m != "eval_loss")
    lines += [
        "",
        "## Plots",
        "",
        f"![{alt_text(pretty)} by round](metric_vs_round.png)",
        "",
        f"How each strategy's {pretty} evolves over the rounds at each noise multiplier (mean "
        f"over seeds, ±1 std shaded): the gap between lines is what the method, not the noise, "
        f"decides.{ref_text}",
        "",
        "![Privacy–utility trade-off](privacy_utility.png)",
        "",
        f"The final {pretty} of each strategy against the ε it spent (one point per noise "
        f"multiplier; {_better(m)} and to the left is better): the slope of a line is the price of "
        f"privacy for that method, dashed lines are the non-private baselines.{ref_text}",
        "",
        "## Privacy parameters",
        "",
        epsilon_text
        + "non-private baselines have ε = ∞. The unit of privacy is the user"
        + _relations(sel.runs),
        "",
    ]
    deltas = sorted({r.delta for r in sel.runs if math.isfinite(r.epsilon)})
    if deltas:
        lines.append(f"- δ: {', '.join(fmt(d, 3) for d in deltas)}")
    lines += [f"- {key}: {value}" for key, value in _shared_privacy_config(sel.runs)]
    lines += _public_users(sel.runs) + _adaptive_clipping(sel.runs)
    lines += _seeded_runs(sel.runs) + _seeds_composed(rows) + _report_composed(sel.runs)
    if origins:
        lines += ["", "## Runs", "", "| run | origin |", "|---|---|"]
        lines += [
            f"| {table_cell(r.path.name)} | "
            f"{table_cell(origins.get(r.path.name, 'not recorded'))} |"
            for r in sorted(sel.runs, key=lambda r: (r.strategy, r.noise_multiplier, r.seed))
        ]
    if issues:
        # forty-seventh review of issue 15 (tuning, finding 3): an item quoting a task parameter
        # of one's own (``task-params.label = "![x](http://evil.example/t.png)"``) drew an image
        # of another address, fetched when the report is shown: written as plain text
        lines += ["", "## Warnings", ""] + [f"- {plain_text(i)}" for i in issues]
    if notes:
        lines += ["", "## Notes", "", notes.strip()]
    return "\n".join(lines) + "\n"


def _public_users(runs: Sequence[RunData]) -> list[str]:
    """A line per strategy whose runs took public users out of the population (AdaDPS).

    Thirty-third review of issue 15 (found by the optimizers' reviewer): ``compare
    stackoverflow-tp-mini.toml --strategies adadps,dp-fedavg`` said "population: 400" and
    nothing of the 4 users whose data built AdaDPS' side information outside the guarantee;
    only each run's ``summary.json`` did. Taken from that ``side_information`` entry.
    Forty-seventh review (reports, finding 3): an adadps run whose ``summary.json`` lost that
    entry (or lists no public users) while its configuration sets ``side-information.kind =
    "public-users"`` (or records no resolved kind) had no line, without a word; such a run's
    line now says what its configuration sets. An entry whose ``public_users`` is not a list
    (an edit) was a ``TypeError``.
    """
    found: dict[str, str] = {}
    for r in runs:
        if r.strategy in found:
            continue
        side = r.summary.get("side_information")
        users = _public_list(r)
        kind = _configured_kind(r)
        if users:
            found[r.strategy] = (
                f"- public users ({table_cell(r.strategy)}): {len(users)} users' "
                "data built the side information outside the guarantee; they are not in the "
                f"population ε covers ({table_cell(side.get('private_population'))} private "
                "users)"
            )
        elif kind == "public-users" or (
            kind is not None and not (isinstance(side, Mapping) and side.get("kind"))
        ):
            found[r.strategy] = (
                f"- public users ({table_cell(r.strategy)}): its summary.json lists none, but "
                f"its configuration sets side-information.kind = {table_cell(kind)}: public "
                "users' data may have built the side information outside the guarantee, and "
                "they would not be in the population ε covers (see its config.toml)"
            )
    return [found[s] for s in sorted(found)]


def _public_list(run: RunData) -> list[Any]:
    """The public users ``run``'s ``summary.json`` lists (``[]``: none, or not a list)."""
    side = run.summary.get("side_information")
    users = side.get("public_users") if isinstance(side, Mapping) else None
    return list(users) if isinstance(users, list) else []


def _configured_kind(run: RunData) -> str | None:
    """An adadps run's configured ``side-information.kind`` (``auto`` if unset), else ``None``."""
    config = run.summary.get("config") or {}
    if not isinstance(config, Mapping) or config.get("strategy") != "adadps":
        return None
    side = config.get("side-information")
    kind = side.get("kind") if isinstance(side, Mapping) else config.get("side-information.kind")
    return str(kind or "auto")


def _adaptive_clipping(runs: Sequence[RunData]) -> list[str]:
    """The line on private runs with adaptive clipping: their clip counts are accounted.

    Forty-sixth review of issue 15 (contract 3): ``compare toy.toml --strategies
    dp-fedavg,dp-fedadam --set adaptive-clipping=true`` said "adaptive-clipping: true" and
    nothing of the count each round reads from the sampled users (whether each update was
    clipped), which ε covers (the noised count is part of every round's event; each run's
    ``threat_model`` says so), where the report says of AdaDPS' public users and of the
    evaluations what ε does not cover.
    """
    names = sorted(
        {
            r.strategy
            for r in runs
            if math.isfinite(r.epsilon) and (r.summary.get("config") or {}).get("adaptive-clipping")
        }
    )
    if not names:
        return []
    return [
        f"- adaptive clipping ({table_cell(', '.join(names))}): each sampled user also reports "
        "whether its update was clipped; the count is noised and part of every round's privacy "
        "event, so ε covers it, and the clip norm follows from released counts only"
    ]


_TREE_SAMPLING = "none (tree: cohorts from a seeded shuffle per restart period)"
_RELATIONS = {
    "poisson": "added or removed (Poisson sampling)",
    "fixed": "replaced (fixed-size sampling)",
    "tree": "replaced, dp-accounting's replace-special relation (tree aggregation)",
}


def _relations(runs: Sequence[RunData]) -> str:
    """``": neighbouring datasets differ in one user, <how>."`` for the runs' mechanisms."""
    found = {mechanism(r.summary.get("config") or {}) for r in runs} - {None}
    if not found:
        return "."
    hows = [_RELATIONS[m] for m in ("poisson", "fixed", "tree") if m in found]
    return "; neighbouring datasets differ in one user, " + "; or ".join(hows) + "."


def _private_evaluations(runs: Sequence[RunData], pretty: str, loss: bool) -> list[str]:
    """The line on private runs whose evaluations ε does not cover (their ``not_covered``).

    Forty-third review of issue 15 (contract 1): ``compare stackoverflow-tp-mini.toml`` (the
    test split: 91 of the 100 evaluation users are training users) published the task metric
    and eval loss of each private run beside its ε, with the reference line and the
    privacy-utility plot, while each run's ``summary.json`` said to publish "the models and
    epsilon, not these rows".
    """
    private = [r for r in runs if math.isfinite(r.epsilon)]
    found = [r for r in private if evaluations_outside(r)]  # none said: outside (finding 4)
    if not found:
        return []
    columns = f"{pretty}{' and eval loss' if loss else ''}"
    return [
        f"Evaluations: {len(found)} of the {len(private)} private runs evaluated users of the "
        "private population without noise, or their task (or summary.json) does not say whether "
        f"it did (each run's summary.json, not_covered): epsilon does not cover their {columns} "
        "columns, the plots or the reference line; publish those only from evaluations of users "
        "outside the private population (for StackOverflow, task-params.eval-split = 'heldout')."
    ]


def _row_names(runs: Sequence[RunData], values: Sequence[Any]) -> list[str]:
    """Each run's row as the report names it beside its value: a strategy, with σ if needed.

    Forty-fourth review follow-up of issue 15 (ledger 3): the names of reports 4 and 5 were
    strategies, where a row is a strategy at a σ: runs at σ 0.5 (secure) and 1 (seeded) of
    dp-fedavg read "secure: varies (see the runs): false (dp-fedavg); true (dp-fedavg)". A
    strategy whose runs share their value (a σ grid) is still named alone.
    """
    of: dict[str, set[Any]] = {}
    for r, value in zip(runs, values, strict=True):
        of.setdefault(r.strategy, set()).add(value)
    return [r.strategy if len(of[r.strategy]) == 1 else f"{r.strategy} σ={r.noise_multiplier:g}"
            for r in runs]  # fmt: skip


def _seeded_runs(runs: Sequence[RunData]) -> list[str]:
    """The line on private runs whose noise their seeds regenerate (``secure = false``).

    Forty-second review of issue 15 (contract 5): a comparison of seeded runs (the default)
    listed their seeds (0, 1) and ``secure: false`` under "Privacy parameters" with ε beside
    them, and no word that each seed regenerates its run's noise and sampling.
    """
    from fedprivopt.simulation.tune_notes import TUNED_SUFFIX

    private = [r for r in runs if math.isfinite(r.epsilon)]
    seeded = [r for r in private if not (r.summary.get("config") or {}).get("secure", False)]
    if not seeded:
        return []
    secure = [bool((r.summary.get("config") or {}).get("secure", False)) for r in private]
    names = sorted({n for n, s in zip(_row_names(private, secure), secure, strict=True) if not s})
    of = "" if len(seeded) == len(private) else f", of {', '.join(names)},"
    # forty-seventh review (tuning, finding 2): a tuned run's seed is in its tuning's files only
    tuned = [r.strategy.endswith(TUNED_SUFFIX) for r in seeded]
    where = ("this report names" if not any(tuned) else "their tunings' files name (trials.csv, "
             "summary.json; not this report)" if all(tuned) else "this report names (a tuned "
             "row's: its tuning's files)")  # fmt: skip
    return [
        f"- seeded runs: {len(seeded)} of the {len(private)} private runs (secure = false){of} "
        f"derive their noise and sampling from their seeds, which {where}, so anyone "
        "who knows a seed can regenerate and subtract its run's noise: ε holds only while the "
        "seeds are secret, and not against a search either (each noise stream is one of 2**32: "
        "torch's CPU generator keeps 32 bits of its seed); secure = true draws them from the "
        "operating system's entropy"
    ]


def _seeds_composed(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The line on private rows over several seeds: publishing a row composes its runs.

    Forty-fourth review of issue 15 (contract 5): ``compare toy.toml --seeds 2`` showed the row
    over both seeds' runs (on the same users) at one run's ε, 7.551, where publishing its mean
    and std costs their composition, 10.28; ``compare-tuned`` says so of tunings.
    """
    from fedprivopt.simulation.tune_notes import TUNED_SUFFIX

    found = [r for r in rows if r.get("private") and r.get("n_seeds", 0) > 1
             and not str(r["strategy"]).endswith(TUNED_SUFFIX)]  # fmt: skip
    if not found:
        return []
    costs = "; ".join(
        f"{table_cell(r['strategy'])} σ={r['noise_multiplier']:g}, {r['n_seeds']} runs: "
        + (epsilon_text(r["epsilon_seeds_composed"])
           if math.isfinite(r.get("epsilon_seeds_composed", math.nan))
           else "not computed (a ledger could not be read or does not account for its run's "
                "ε, or the runs' accountants differ)")
        for r in found
    )  # fmt: skip
    return [
        "- seeds composed: a row's mean ± std (and the plots' means) are over its seeds' runs "
        "on the same users, so publishing it releases them all, which costs their composition, "
        f"not one run's ε (summary.csv: epsilon_seeds_composed): {costs}"
    ]


def _report_composed(runs: Sequence[RunData]) -> list[str]:
    """The line on a report of several rows: publishing it releases every run in it.

    Forty-fifth review of issue 15 (contract 3): ``compare toy.toml --strategies
    dp-fedavg,dp-fedadam,fedavg --rounds 1`` gave each row at its own run's ε (7.551, 7.551,
    ∞), with no word that publishing the report, summary.csv or the plots releases every row's
    run on the task's users (the private ones compose to 10.28) and the non-private row its
    users' data without noise; the seeds composed line (forty-fourth review, contract 5) is a
    row's. The private runs' ledgers are composed as a row's seeds are.
    """
    if len({(r.strategy, r.noise_multiplier) for r in runs}) < 2:
        return []
    private = [r for r in runs if math.isfinite(r.epsilon)]
    if not private:
        return []
    composed = seeds_composed_epsilon(private)
    cost = (
        f"ε {epsilon_text(composed)}"
        if math.isfinite(composed)
        else "ε not computed here (a tuned row, whose ε is its tuning's, a ledger that could not "
        "be read or does not account for its run's ε, or runs of other accountants, "
        "neighbouring relations or δ)"
    )
    plain = len(runs) - len(private)
    tail = (
        f"; {plain} non-private run{'s' if plain > 1 else ''} released "
        f"{'their' if plain > 1 else 'its'} users' data without noise, so the report as a "
        "whole has no guarantee (ε = ∞)"
        if plain
        else ""
    )
    many = "s" if len(private) > 1 else ""
    return [
        f"- report composed: its rows are {len(runs)} runs on the task's users, so publishing "
        "this report, summary.csv or the plots releases them all, which costs their "
        f"composition, not one row's ε: {len(private)} private run{many}: {cost}{tail}"
        + _public_elsewhere(private)
    ]


def _public_elsewhere(private: Sequence[RunData]) -> str:
    """The clause on AdaDPS public users that another private row trains as private users.

    Forty-sixth review of issue 15 (contract 4): ``compare toy.toml --strategies
    adadps,dp-fedavg-adadp --set side-information.kind=public-users --set
    side-information.users=4``: users 0-3 built AdaDPS' side information without noise and
    are private users of the other row, while the "report composed" line gave both rows'
    composition (12.34) as the report's cost, as if it covered them.
    """
    by: dict[tuple, set[str]] = {}
    for r in private:
        users = tuple(_public_list(r))  # a list, or none (an edit: finding 3)
        if not users and _configured_kind(r) == "public-users":
            users = ("as configured",)
        by.setdefault(users, set()).add(r.strategy)
    if len(by) < 2:
        return ""
    public = sorted(name for users, names in by.items() if users for name in names)
    return (
        f"; the public users of {', '.join(public)} (its side information, built from their "
        "data without noise) are private users of another row, so for them the report has no "
        "guarantee (ε = ∞)"
    )


def _shared_privacy_config(runs: Sequence[RunData]) -> list[tuple[str, str]]:
    """Privacy-related config keys, with their value when all runs agree, else "varies".

    The runs are the private ones (finite ε) when there are any, as for the "δ" line: a
    non-private baseline's settings made ``delta: varies`` stand beside one δ (thirtieth review
    of issue 15, privacy-report finding 4). A tree run does not sample (its ``sampling`` key
    is ignored): it shows as :data:`_TREE_SAMPLING` (issue 20 review, finding 5).
    """
    runs = [r for r in runs if math.isfinite(r.epsilon)] or list(runs)
    configs = [dict(r.summary.get("config") or {}) for r in runs]
    for c in configs:
        if c.get("noise-mechanism") == "tree" and "sampling" in c:
            c["sampling"] = _TREE_SAMPLING
    keys = sorted(
        k
        for k in {k for c in configs for k in c}
        if any(w in k for w in _PRIVACY_CONFIG_WORDS) and k not in _NOT_PRIVACY_CONFIG
    )
    out = []
    for key in keys:
        values = {json.dumps(c.get(key), sort_keys=True) for c in configs}
        if len(values) > 1:
            # forty-fourth review of issue 15 (reports, finding 5): "clip-norm: varies (see the
            # runs)" beside a per-strategy clip norm named neither value nor strategy
            by: dict[str, set[str]] = {}
            values = [json.dumps(c.get(key), sort_keys=True) for c in configs]
            for value, name in zip(values, _row_names(runs, values), strict=True):
                by.setdefault(value, set()).add(name)
            which = "; ".join(f"{v} ({', '.join(sorted(n))})" for v, n in sorted(by.items()))
            out.append((key, "varies (see the runs)" + (f": {table_cell(which)}"
                                                      if len(by) <= LISTED else "")))  # fmt: skip
            continue
        value = configs[0].get(key)
        out.append((key, table_cell(value if isinstance(value, str) else values.pop())))
    return out
