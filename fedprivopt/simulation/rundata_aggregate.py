"""Finished runs aggregated over seeds: the metric chosen, the runs selected and grouped.

:func:`aggregate_runs` groups runs (:class:`~fedprivopt.simulation.rundata.RunData`, as
:func:`~fedprivopt.simulation.rundata.load_runs` reads them) by (strategy, σ) and summarizes each
group over its seeds (:func:`mean_std`), with notes on what was left out or disagrees (issued as
:class:`~fedprivopt.simulation.rundata.RunWarning`); :func:`choose_metric` the task metric a
report shows and :func:`reference_model` the task's reference model. The report built from them:
:mod:`fedprivopt.simulation.report`.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedprivopt.core.text import shown
from fedprivopt.simulation.rundata import RunData, RunWarning, as_float

__all__ = [
    "BASIS_WORDS",
    "EPSILON_ACCOUNTANT",
    "Selection",
    "aggregate_runs",
    "aggregate_with_notes",
    "bases_notes",
    "choose_metric",
    "differing_bases",
    "epsilon_basis",
    "evaluations_outside",
    "group_runs",
    "mean_std",
    "mechanism",
    "reference_model",
    "seeds_composed_epsilon",
    "select_runs",
    "unequal_epsilon_notes",
    "warn_all",
]

_METRIC_PREFERENCE = ("eval_recall_at_5", "eval_accuracy")


def choose_metric(runs: Sequence[RunData]) -> str:
    """The task metric to report: the one the runs' task leads with.

    That is the ``primary_metric`` their summaries name (:func:`fedprivopt.models.primary_metric`)
    when every run that names one names the same and some run reports it. Runs written before
    summaries named it (or of several tasks) get ``eval_recall_at_5`` if any run has it, else
    ``eval_accuracy``. A name that is not text (a summary edited by hand) counts as none.
    """
    runs = list(runs)  # read more than once (forty-third review of issue 15, reports 1)
    # forty-eighth review of issue 15 (input 1): a list or table there (unhashable) ended
    # compare-tuned and compare in a TypeError traceback, rc 1
    named = {m for run in runs if isinstance(m := run.summary.get("primary_metric"), str)}
    preference = (*named, *_METRIC_PREFERENCE) if len(named) == 1 else _METRIC_PREFERENCE
    for metric in preference:
        if isinstance(metric, str) and any(run.has_metric(metric) for run in runs):
            return metric
    shown = list(dict.fromkeys(preference))  # the named metric is also a preferred one
    raise ValueError(f"runs: none reports a task metric (one of {shown})")


def aggregate_runs(runs: Sequence[RunData], *, metric: str | None = None) -> list[dict[str, Any]]:
    """Group runs by (strategy, noise multiplier) and summarize each group over its seeds.

    Parameters
    ----------
    runs : sequence of RunData
    metric : str, optional
        Task metric; ``None`` picks one with :func:`choose_metric`. Runs lacking it are skipped
        with a ``UserWarning``.

    Returns
    -------
    list of dict
        One dict per group, sorted by (strategy, σ), with keys ``strategy``, ``noise_multiplier``,
        ``metric``, ``n_seeds``, ``seeds``, ``n_finite`` (seeds whose final metric is finite),
        ``epsilon`` and ``delta`` (the largest over seeds; they should agree), ``rounds`` and
        ``rounds_max`` (the fewest and the most rounds a seed completed), ``<metric>_mean``,
        ``<metric>_std``, ``eval_loss_mean``, ``eval_loss_std`` (over finite values; sample
        std, NaN for one value),
        ``seconds_per_round`` (mean over seeds), ``stopped_reasons``, ``n_budget`` (seeds whose
        privacy budget stopped them before their last round) and ``diverged``: the
        ``(seed, round)`` of each seed whose model or an evaluation became non-finite
        (:meth:`RunData.diverged`; its final values describe an overflowed model), and
        ``accountants`` and ``relations`` (those of its private seeds, sorted: what its ε is;
        :func:`bases_notes`), ``private``: whether a seed is configured private or states a
        finite ε (a private run whose files state an infinite ε is not a non-private one).
    """
    rows, notes = aggregate_with_notes(runs, metric)
    warn_all(notes)
    return rows


@dataclass(frozen=True)
class Selection:
    """The runs a report covers and the metric it reports."""

    metric: str
    runs: list[RunData]


def warn_all(messages: Iterable[str]) -> None:
    """Issue each message as a :class:`RunWarning` (attributed to the caller's caller)."""
    for message in messages:
        warnings.warn(message, RunWarning, stacklevel=3)


def select_runs(runs: Sequence[RunData], metric: str | None) -> tuple[Selection, list[str]]:
    """The runs that report ``metric`` (chosen if ``None``), and notes on those left out."""
    runs = list(runs)
    if not runs:
        raise ValueError("runs: empty; need at least one run")
    notes = [w for run in runs for w in run.warnings]
    _check_some_round(runs)
    metric = choose_metric(runs) if metric is None else metric
    kept, skipped = [], []
    for run in runs:
        (kept if run.has_metric(metric) else skipped).append(run)
    notes += [f"{run.path}: no '{metric}'; run skipped" for run in skipped]
    if not kept:
        raise ValueError(f"metric: no run reports {metric!r}")
    return Selection(metric, kept), notes


def _check_some_round(runs: Sequence[RunData]) -> None:
    """Refuse runs none of which completed a round, naming why (twenty-first review).

    A report of them has no value to show; when each stopped at its privacy budget before its
    first round, the cause is ``target-epsilon`` below one round's ε, which the line names
    (instead of ``none reports a task metric``, which sent the user looking at the metric).
    """
    if any(run.rounds_completed > 0 or run.rows for run in runs):
        return
    if all(run.summary.get("stopped_reason") == "budget" for run in runs):
        raise ValueError(
            f"no results to report: every run ({len(runs)}) stopped at its privacy budget before "
            "its first round (target-epsilon is below the epsilon of one round); raise "
            "target-epsilon or the noise multiplier"
        )
    raise ValueError(f"no results to report: none of the {len(runs)} runs completed a round")


def group_runs(runs: Iterable[RunData]) -> dict[tuple[str, float], list[RunData]]:
    """Runs by (strategy, σ), sorted, each group sorted by seed."""
    groups: dict[tuple[str, float], list[RunData]] = {}
    for run in runs:
        groups.setdefault((run.strategy, run.noise_multiplier), []).append(run)
    return {k: sorted(groups[k], key=lambda r: r.seed) for k in sorted(groups)}


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std of the finite values (NaN for none).

    The std of one value is NaN: there is no spread to measure (thirtieth review of issue 15,
    privacy-report finding 3: it was 0.0, which ``summary.csv`` wrote beside ``seeds`` 2 when one
    seed diverged, and a reader took it for a measured std).
    """
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, math.nan
    std = float(np.std(finite, ddof=1)) if len(finite) > 1 else math.nan
    return float(np.mean(finite)), std


def aggregate_with_notes(
    runs: Sequence[RunData], metric: str | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`aggregate_runs`' rows, and its notes instead of warnings."""
    sel, notes = select_runs(runs, metric)
    m = sel.metric
    rows = []
    for (strategy, sigma), group in group_runs(sel.runs).items():
        diverged = []  # (seed, first non-finite round); noted first: stderr shows the first note
        for run in group:
            first = run.diverged(m)
            if first is not None:
                diverged.append((run.seed, first))
                notes.append(
                    f"{run.path}: diverged at round {first} (an evaluation loss or {m}, or the "
                    "model, became non-finite); its final values describe an overflowed model"
                )
        notes += _not_seeds_alone(strategy, sigma, group)
        finals = [run.final_value(m) for run in group]
        losses = [run.final_value("eval_loss") for run in group]
        for run, value, loss in zip(group, finals, losses, strict=True):
            for name, v in ((m, value), ("eval_loss", loss)):
                if not math.isfinite(v):
                    notes.append(f"{run.path}: final {name} is {v}; left out of the mean")
        epsilons = [run.epsilon for run in group]
        known_eps = [e for e in epsilons if not math.isnan(e)]
        if known_eps and max(known_eps) - min(known_eps) > 1e-9 * max(1.0, abs(max(known_eps))):
            notes.append(
                f"{strategy}, σ={sigma:g}: ε differs across seeds "
                f"({min(known_eps):.6g} to {max(known_eps):.6g}); reporting the largest"
            )
        metric_mean, metric_std = mean_std(finals)
        loss_mean, loss_std = mean_std(losses)
        rows.append({
            "strategy": strategy,
            "noise_multiplier": sigma,
            "metric": m,
            "n_seeds": len(group),
            "seeds": [run.seed for run in group],
            "n_finite": sum(math.isfinite(v) for v in finals),
            "epsilon": max(known_eps) if known_eps else math.nan,
            "delta": max((run.delta for run in group), default=math.nan),
            "rounds": min(run.rounds_completed for run in group),
            "rounds_max": max(run.rounds_completed for run in group),
            f"{m}_mean": metric_mean,
            f"{m}_std": metric_std,
            "eval_loss_mean": loss_mean,
            "eval_loss_std": loss_std,
            "seconds_per_round": mean_std([run.seconds_per_round() for run in group])[0],
            "stopped_reasons": sorted({str(run.summary.get("stopped_reason")) for run in group}),
            "n_budget": sum(run.summary.get("stopped_reason") == "budget" for run in group),
            "diverged": diverged,
            "private": any(mechanism(run.summary.get("config") or {}) is not None
                           or math.isfinite(run.epsilon) for run in group),
            **_bases(group),
            "evaluations_covered": _evaluations_covered(group),
            "public_users": _public_users_cell(group),
            "epsilon_seeds_composed": seeds_composed_epsilon(group),
        })  # fmt: skip
    # forty-second review of issue 15 (reports, finding 4): a note on the bases no longer
    # hides one on unequal epsilon between rows of one basis
    return rows, notes + bases_notes(rows) + unequal_epsilon_notes(rows)


_RELATION_WORDS = {
    "poisson": "add/remove",
    "fixed": "replace-one",
    "tree": "replace-special (tree)",
}
"""How neighbouring datasets differ, by :func:`mechanism`: the guarantee an ε is of."""
_BASES = (("accountants", "accountants", "accountant"),
          ("relations", "neighbouring relations",
           "neighbouring relation (one sampling and noise mechanism)"))  # fmt: skip
"""A row's keys of what its ε is (:func:`aggregate_runs`), as a note names them."""
BASIS_WORDS = {key: what for key, what, _ in _BASES}
"""What each key of :func:`differing_bases` is, in words."""


def mechanism(config: Mapping[str, Any]) -> str | None:
    """``poisson``, ``fixed`` or ``tree`` for a private run's config; ``None`` otherwise."""
    from fedprivopt.strategies.config import NON_PRIVATE

    if config.get("strategy") in NON_PRIVATE or not config.get("noise-multiplier"):
        return None
    if config.get("noise-mechanism") == "tree":
        return "tree"
    return "fixed" if config.get("sampling") == "fixed" else "poisson"


EPSILON_ACCOUNTANT = "epsilon_accountant"
"""A run summary's key naming the accountant of its ε where that is not the configured one.

Thirty-ninth review of issue 15 (reports, finding 1): a tuned run (``compare-tuned``,
``compare --tune-grid``) carries its tuning's ε, an RDP bound (``RepeatAndSelectDpEvent``),
also when its runs were configured with ``accountant = "pld"``; the row was labelled ``pld``
in ``summary.csv`` beside an untuned PLD row, and no note said their ε were of different
accountants (``tune_report.load_tuned`` sets it).
"""


def _bases(group: Sequence[RunData]) -> dict[str, list[str]]:
    """The accountants and neighbouring relations of ``group``'s private runs (finite ε)."""
    private = [run for run in group if math.isfinite(run.epsilon)]
    configs = [run.summary.get("config") or {} for run in private]
    accountants = {run.summary.get(EPSILON_ACCOUNTANT) or c.get("accountant")
                   for run, c in zip(private, configs, strict=True)} - {None}  # fmt: skip
    relations = {mechanism(c) for c in configs} - {None}
    return {"accountants": sorted(str(a) for a in accountants),
            "relations": sorted(_RELATION_WORDS[m] for m in relations)}  # fmt: skip


_EVALUATIONS_OUTSIDE = "nor the evaluations (eval_* metrics)"
"""What a run's ``not_covered`` says when its evaluations are (or may be) of private users."""


def _evaluations_covered(group: Sequence[RunData]) -> str:
    """``summary.csv``'s ``evaluations_covered`` of a row: ``no``, ``yes``, or empty if not private.

    ``no`` when one of its private runs' ``not_covered`` says epsilon does not cover its
    evaluations (users of the private population, or a task that does not say), as
    ``report.md``'s "Evaluations:" line reads it. Forty-fourth review of issue 15 (contract 4):
    ``compare stackoverflow-tp-mini.toml`` wrote ``summary.csv`` (ε 3.304 beside recall@5 of 91
    training users among 100) with nothing to say so; only ``report.md`` did.
    """
    private = [run for run in group if math.isfinite(run.epsilon)]
    if not private:
        return ""
    outside = any(evaluations_outside(run) for run in private)
    return "no" if outside else "yes"


def _public_users_cell(group: Sequence[RunData]) -> str:
    """``summary.csv``'s ``public_users`` of a row: its private runs' public users (AdaDPS).

    The most any of its private runs lists (users whose data built its side information
    outside the guarantee), ``configured`` for a run configured with public users whose
    ``summary.json`` lists none, empty for none. Forty-seventh review of issue 15 (reports,
    finding 6): ``summary.csv`` read alone set an adadps row at ε 7.712 beside dp-fedavg's with
    no word of its 4 public users, which only ``report.md`` named.
    """
    counts, configured = [], False
    for run in group:
        if not math.isfinite(run.epsilon):
            continue
        side = run.summary.get("side_information")
        users = side.get("public_users") if isinstance(side, Mapping) else None
        if isinstance(users, list) and users:
            counts.append(len(users))
            continue
        config = run.summary.get("config")
        kind = config.get("side-information") if isinstance(config, Mapping) else None
        configured |= (isinstance(kind, Mapping) and kind.get("kind") == "public-users"
                       and config.get("strategy") == "adadps")  # fmt: skip
    if counts:
        return str(max(counts))
    return "configured" if configured else ""


def evaluations_outside(run: RunData) -> bool:
    """Whether ``run``'s ``not_covered`` says ε does not cover its evaluations, or says nothing.

    Forty-seventh review of issue 15 (reports, finding 4): a ``summary.json`` without a
    ``not_covered`` text (edited, or of a version before it was written) was read as one whose
    evaluations ε covers: ``evaluations_covered`` ``yes`` in ``summary.csv`` and no
    "Evaluations:" line in ``report.md``, for runs that evaluated 3 of 5 training users.
    """
    text = run.summary.get("not_covered")
    return not isinstance(text, str) or _EVALUATIONS_OUTSIDE in text


def seeds_composed_epsilon(group: Sequence[RunData]) -> float:
    """ε of publishing every run of ``group`` (a row's seeds, on the same users) together.

    The composition of their ledgers' events by their accountant at their δ; the row's ε for
    one run; ``nan`` for a row of tuned runs (their tunings compose: ``compare-tuned``), of
    non-private runs, or when a ledger cannot be read, does not account for its run's ε, or the
    runs' accountants or δ differ. Forty-fourth review of issue 15 (contract 5): ``compare
    toy.toml --seeds 2`` reported the row over both seeds at one run's ε, 7.551, where
    publishing it costs 10.28.
    """
    from fedprivopt.privacy.accounting import compose_epsilon
    from fedprivopt.privacy.accounting_state import merge_ledger
    from fedprivopt.simulation.ledger import RunLedger

    private = [run for run in group if math.isfinite(run.epsilon)]
    if not private or any(run.summary.get(EPSILON_ACCOUNTANT) for run in private):
        return math.nan
    if len(private) == 1:
        return private[0].epsilon
    events, headers = [], set()
    for run in private:
        try:  # forty-fifth review follow-up (ledger 1): a ledger cut to its header (0 where
            # the run's other files state 10.28) was composed as none: 10.28 for two seeds
            ledger = RunLedger.read(run.path)
            if ledger is None or not ledger.header.get("private"):
                return math.nan
            if run.epsilon > ledger.epsilon(run.delta) * (1 + 1e-6) + 1e-12:
                return math.nan  # it does not account for its run's ε (load_run notes it)
        except (OSError, ValueError, TypeError, MemoryError):
            return math.nan
        events += list(ledger.total())
        headers.add(tuple(ledger.header.get(k) for k in ("accountant", "pld_discretization",
                                                           "prv_eps_error")))  # fmt: skip
    deltas = {run.delta for run in private}
    if len(headers) != 1 or len(deltas) != 1:
        return math.nan
    accountant, pld, prv = headers.pop()
    try:
        composed = compose_epsilon(merge_ledger(events), deltas.pop(), accountant=accountant,
                                   pld_discretization=pld, prv_eps_error=prv)  # fmt: skip
    except (ValueError, TypeError, MemoryError):
        return math.nan
    return max(composed, *(run.epsilon for run in private))


def differing_bases(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The keys of :data:`_BASES` whose values differ between ``rows``' private runs."""
    rows = list(rows)
    return [key for key, _, _ in _BASES if len({v for r in rows for v in r.get(key, ())}) > 1]


def epsilon_basis(row: dict[str, Any], keys: Sequence[str]) -> str:
    """What a row's ε is, for the ``keys`` of :func:`differing_bases`: ``pld, add/remove``."""
    return ", ".join(v for key in keys for v in row.get(key, ()))


def unequal_epsilon_notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """A note when the strategies of a report were run at unequal ε.

    Forty-first review of issue 15 (reports 2): ``compare toy.toml --strategies
    dp-fedavg,dp-fedavg-adadp --rounds 2`` reported dp-fedavg-adadp (two privacy events a round)
    at ε 13.71 beside dp-fedavg at 10.28, both at σ 0.5, and said nothing (a per-strategy
    ``clients-per-round`` or ``num-server-rounds`` alike), where a comparison of strategies is
    one at equal privacy and a report already warns when only the accountants differ. Each
    private strategy's finite ε (over its rows) is compared with the others' of its kind (tuned
    rows, whose ε is their tuning's, with tuned rows): a note unless one's ε are among the
    other's. Strategies calibrated to one ε, a noise grid that every strategy runs at equal ε
    (one strategy at more of its points, as ``compare-tuned --untuned`` may give), no note.
    Forty-second review (reports, finding 4): rows are compared within each basis of their ε
    (accountant and neighbouring relation, :func:`bases_notes` names the bases), and this note
    is no longer left out when the bases differ: ``compare P --strategies
    dp-fedavg,dp-fedavg-adadp,dp-fedadam --rounds 2`` with ``accountant = "pld"`` in P's
    ``[strategies.dp-fedadam]`` said only that the accountants differ, while dp-fedavg (10.28)
    and dp-fedavg-adadp (13.71), both RDP, were at unequal ε.
    Forty-third review (reports, finding 1): given a one-shot iterable of rows (a generator),
    the bases read it to its end and the note was left out (``[]`` for dp-fedadam at 11.25
    beside dp-fedavg at 3); ``rows`` is read into a list first, here and in :func:`bases_notes`,
    :func:`differing_bases`, :func:`choose_metric` and :func:`reference_model`.
    """
    from fedprivopt.core.text import epsilon_text
    from fedprivopt.simulation.tune_notes import TUNED_SUFFIX

    rows = list(rows)
    notes = []
    bases = sorted({_basis(r) for r in rows})
    for tuned, basis in [(t, b) for t in (False, True) for b in bases]:
        spent: dict[str, list[float]] = {}
        for r in rows:
            eps = r["epsilon"]
            if (
                r.get("private")
                and math.isfinite(eps)
                and r["strategy"].endswith(TUNED_SUFFIX) == tuned
                and _basis(r) == basis
            ):
                spent.setdefault(r["strategy"], []).append(eps)
        sets = [{f"{e:.9g}" for e in values} for values in spent.values()]
        if any(not (a <= b or b <= a) for a in sets for b in sets):  # one's points not the other's
            which = "; ".join(
                f"{name} {', '.join(epsilon_text(e) for e in sorted(values)[:4])}"
                + (", ..." if len(values) > 4 else "")
                for name, values in sorted(spent.items())
            )
            notes.append(
                f"the strategies were run at unequal epsilon ({which}): their metrics are not "
                "at equal privacy; to compare them at equal epsilon, give each strategy the "
                "noise multiplier that reaches one epsilon (fedprivopt calibrate; a "
                "[strategies.<name>] noise-multiplier in the preset)"
            )
    return notes


def _basis(row: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
    """What a row's ε is of: its accountants and neighbouring relations (:data:`_BASES`)."""
    return tuple(tuple(sorted(map(str, row.get(key) or ()))) for key, _, _ in _BASES)


def bases_notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """A note for each of the accountant and the neighbouring relation the rows' ε differ in.

    Thirty-seventh review of issue 15 (reports, finding 1): ``compare toy.toml --strategies
    dp-fedavg,dp-fedadam --rounds 2`` with ``accountant = "pld"`` in the preset's
    ``[strategies.dp-fedadam]`` reported dp-fedadam at ε 8.961 beside dp-fedavg at 10.28: the
    same σ, sampling and rounds (the same privacy loss), bounded by two accountants, and the
    privacy–utility plot set dp-fedadam to the left, as if it had spent less; only "accountant:
    varies (see the runs)" under the privacy parameters said anything. ``sampling = "fixed"``
    there alike (finding 3): 35.67, an ε of replace-one neighbours, beside 10.28 of add/remove
    ones, with nothing to say which row is which.
    """
    rows = list(rows)
    notes = []
    differ = differing_bases(rows)
    for key, what, one in _BASES:
        if key not in differ:
            continue
        by: dict[str, list[str]] = {}
        for r in rows:
            for value in r.get(key, ()):
                by.setdefault(value, []).append(f"{r['strategy']} σ={r['noise_multiplier']:g}")
        which = "; ".join(
            f"{value}: {', '.join(labels[:3])}{', ...' if len(labels) > 3 else ''}"
            for value, labels in sorted(by.items())
        )
        notes.append(
            f"the rows' epsilons come from different {what} ({which}): their epsilons are not "
            f"comparable (the Summary names each row's); compare with one {one} to compare at "
            "equal epsilon"
        )
    return notes


def _not_seeds_alone(strategy: str, sigma: float, group: Sequence[RunData]) -> list[str]:
    """A note when a row's runs are not seeds of one configuration (else nothing).

    Thirty-fifth review of issue 15 (outputs, finding 8): ``write_report(out, load_runs(F))``
    (the documented API) of a folder holding two ``simulate`` runs of dp-fedavg, seed 0, at
    ``local-learning-rate`` 0.1 and 0.5 reported one row "seeds 2, accuracy 0.543 ± 0.099" under
    "mean ± sample std over seeds", the header saying "1 seeds (0)": two configurations' spread
    read as the seeds'. ``compare-tuned --untuned`` refuses such runs
    (:func:`~fedprivopt.simulation.tune_untuned.check_untuned_seeds`); a tuned row's runs differ
    in their hyperparameters by design (each its tuning's choice) and are not checked, nor are
    the keys of how a run was executed or recorded (``tune_grid.RUN_ONLY_KEYS``: ``tensorboard``,
    ``eval-every``, ``engine``, …).
    """
    from fedprivopt.simulation.tune_grid import RUN_ONLY_KEYS
    from fedprivopt.simulation.tune_notes import TUNED_SUFFIX

    if strategy.endswith(TUNED_SUFFIX) or len(group) < 2:
        return []
    seeds = [run.seed for run in group]
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    where = f"{strategy}, σ={sigma:g}"
    if twice:
        same = [str(run.path) for run in group if run.seed == twice[0]]
        return [
            f"{where}: {len(same)} of its runs have seed {twice[0]} ({', '.join(same[:3])}"
            f"{', ...' if len(same) > 3 else ''}): runs of one seed are not seeds, and the row's "
            "mean and std are not over seeds"
        ]
    configs = [run.summary.get("config") for run in group]
    if not all(isinstance(c, dict) for c in configs):
        return []
    kept = {"seed", *RUN_ONLY_KEYS}  # how a run was executed or recorded is no configuration
    first = {k: v for k, v in configs[0].items() if k not in kept}
    for run, config in zip(group[1:], configs[1:], strict=True):
        other = {k: v for k, v in config.items() if k not in kept}
        keys = sorted(k for k in first.keys() | other.keys() if first.get(k) != other.get(k))
        if keys:
            return [
                f"{where}: {run.path} differs from {group[0].path} beyond the seed ({keys[0]} "
                f"{shown(other.get(keys[0]))}, not {shown(first.get(keys[0]))}): the row's mean "
                "and std are not over seeds of one configuration"
            ]
    return []


def reference_model(runs: Sequence[RunData], metric: str) -> tuple[str, dict[str, float]] | None:
    """The task's reference model from the runs' summaries (e.g. the tag prior), if any.

    A run's ``summary.json`` may hold ``"reference": {"name": ..., "metrics": {...}}``: a model
    built from public information only (no training), evaluated like the runs. Used when every
    run that has one agrees on it and it reports ``metric``.
    """
    runs = list(runs)
    found = {json.dumps(r.summary.get("reference"), sort_keys=True) for r in runs}
    found.discard("null")
    if len(found) != 1:
        return None
    ref = json.loads(found.pop())
    # forty-seventh review of issue 15 (reports, finding 3): a summary.json whose reference
    # was edited to a string (or its metrics to a list) was an AttributeError
    if not isinstance(ref, dict) or not isinstance(ref.get("metrics"), dict):
        return None
    metrics = {k: as_float(v) for k, v in ref["metrics"].items()}
    if not isinstance(ref.get("name"), str) or metric not in metrics:
        return None
    return ref["name"], metrics
