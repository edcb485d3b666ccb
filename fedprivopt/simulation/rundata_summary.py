"""A run's ``summary.json`` read against its other files, for :func:`load_run`.

Split from :mod:`fedprivopt.simulation.rundata`, whose :func:`load_run` takes a run's strategy, σ,
seed and δ from its ``config.toml`` (:func:`configured_summary`) or, without a readable one, from
its privacy ledger's header (:func:`recorded_summary`), checks ``rounds_completed``
(:func:`check_summary_rounds`), tells a run that completed no round (:func:`no_round`) and notes
rows that are not those its summary or newest checkpoint was written after (:func:`check_rows`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedprivopt.core.text import shown
from fedprivopt.simulation.checkpoint import newest_checkpoint, rows_problem
from fedprivopt.simulation.files import CONFIG_FILE, LEDGER_FILE, SUMMARY_FILE, parse_json
from fedprivopt.simulation.ledger import OldLedgerError, RunLedger
from fedprivopt.strategies.config import MAX_ROUNDS

__all__ = [
    "LEDGER_KEYS",
    "check_rows",
    "check_summary_rounds",
    "configured_summary",
    "no_round",
    "recorded_summary",
]


def check_rows(
    path: Path, rows: list[dict[str, Any]], summary: dict[str, Any], notes: list[str]
) -> None:
    """Note rows that are not those the summary or the newest checkpoint was written after.

    Thirty-ninth review of issue 15 (outputs follow-up 1): seed 0's ``metrics.jsonl`` copied
    over seed 1's was reported as seed 1's results without a word
    (:func:`~fedprivopt.simulation.checkpoint.rows_problem`; ``compare``, ``compare-tuned
    --untuned`` and ``--resume`` refuse such a run).
    """
    try:
        state, name = newest_checkpoint(path, problems={})
    except ValueError:  # a checkpoint this process may not read: the summary's digest stands
        state, name = None, None
    problem = rows_problem(path, rows, state, name, summary)
    if problem is not None:
        notes.append(f"{problem}; reported as its files state")


def check_summary_rounds(rounds: Any, path: Path) -> int:
    """``summary.json``'s ``rounds_completed``: an integer in ``[0, MAX_ROUNDS]``.

    Thirty-third review of issue 15 (results, finding 9): :func:`load_run` took any value, and
    a report (the documented ``write_report(out, load_runs(...))``) of a summary edited to
    ``"abc"``, ``null``, ``[2]`` or ``1e400`` ended in a ``ValueError``, ``TypeError`` or
    ``OverflowError`` from ``int()`` naming no file, while ``2.5``, ``-3``, ``true`` and ``"2"``
    were reported as rounds ``2``, ``-3``, ``1`` and ``2``. ``--resume`` and ``compare`` refuse
    such a summary with the same words (``audit.read_summary``).

    Raises
    ------
    ValueError
        Naming ``path`` and the value.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(
            f"{path} is unreadable (rounds_completed must be an integer >= 0, got {shown(rounds)})"
        )
    if rounds > MAX_ROUNDS:
        raise ValueError(
            f"{path} is unreadable (rounds_completed {shown(rounds)} is beyond the {MAX_ROUNDS:,} "
            "a run may have: the file was edited)"
        )
    return rounds


def no_round(summary_path: Path) -> bool:
    """Whether ``summary.json`` says the run completed no round (its budget allowed none).

    Such a run writes no metrics row, so it has no ``metrics.jsonl``.
    """
    try:
        return parse_json(summary_path.read_text(encoding="utf-8"))["rounds_completed"] == 0
    except (OSError, ValueError, KeyError, TypeError):
        return False


def configured_summary(path: Path, summary: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """``summary`` with what the run's ``config.toml`` says it is; a disagreement is noted.

    A report groups runs by strategy and σ: they come from the configuration, not from what
    ``summary.json`` states (an edited summary moved a run into another cell's row, issue 15).
    A run without a readable ``config.toml`` keeps its summary's values (noted if unreadable).
    """
    from fedprivopt.simulation.config import load_config

    if not (path / CONFIG_FILE).is_file():
        return summary
    try:
        config = load_config(path / CONFIG_FILE)
    except (ValueError, OSError, RecursionError) as exc:
        notes.append(f"{path}: its {CONFIG_FILE} cannot be read ({exc}); grouped by {SUMMARY_FILE}")
        return summary
    s = config.strategy
    own = {
        "strategy": s.strategy,
        "noise_multiplier": s.noise_multiplier if s.private else 0.0,
        "seed": s.seed,
        "delta": s.delta,
    }
    differ = [key for key, value in own.items() if summary.get(key) != value]
    if differ:
        stated = ", ".join(f"{key} {summary.get(key)!r}" for key in differ)
        configured = ", ".join(f"{key} {own[key]!r}" for key in differ)
        notes.append(
            f"{path}: its {SUMMARY_FILE} states {stated}, but its {CONFIG_FILE} {configured}; "
            "reported as configured"
        )
    return {**summary, **own, "config": config.to_mapping()}


LEDGER_KEYS = ("strategy", "noise-multiplier", "seed", "accountant", "sampling",
               "noise-mechanism", "population", "clients-per-round", "clip-norm", "secure",
               "noise-mode")  # fmt: skip
"""A ledger header's settings a report shows or reads its ε's basis from
(:func:`recorded_summary`).

Forty-sixth review of issue 15 (reports, finding 5): ``secure`` and ``noise-mode`` were not
among them, so a seeded run (``secure = false``) whose ``config.toml`` (or, without one,
``summary.json``'s ``config``) was edited to ``secure = true`` was reported "secure: true",
without the line that its seeds regenerate its noise; ``noise-mode`` alike (the threat model
of the noise the report shows)."""


def recorded_summary(
    path: Path, summary: dict[str, Any], notes: list[str], configured: bool = False
) -> dict[str, Any]:
    """``summary`` with the strategy, σ, seed and settings its privacy ledger's header records.

    For a run without a readable ``config.toml``. Thirty-ninth review of issue 15 (reports,
    finding 4): ``write_report(out, load_runs(F))`` of a dp-fedavg run at σ 0.5 whose
    ``config.toml`` was deleted and whose ``summary.json`` states ``noise_multiplier`` 5 and
    ``config.accountant`` ``pld`` reported "σ 5, ε 10.28 (pld)": the ledger's ε beside a σ and
    an accountant the run did not have, without a warning. δ stays the summary's (ε is
    composed at it, noted when it is not the ledger's: thirty-seventh review, finding 4).

    Forty-sixth review of issue 15 (reports, finding 4): with ``configured`` (``summary`` as
    the run's readable ``config.toml`` says, :func:`configured_summary`) the ledger was not
    read: ``write_report(out, load_runs(F))`` of a dp-fedavg run at σ 0.5 (RDP, ε 10.28)
    whose ``config.toml`` was edited to ``noise-multiplier = 5.0`` and ``accountant = "pld"``
    reported "dp-fedavg σ 5, ε 10.28, pld" (the ledger's RDP ε beside a σ and an accountant
    the run did not have; ``compare``, ``compare-tuned --untuned`` and ``--resume`` refuse such
    a run), warning only that ``summary.json`` says σ 0.5. The ledger's header is the record
    here too: what it records wins over ``config.toml``, with a note naming both.
    """
    try:
        ledger = RunLedger.read(path)
    except (OldLedgerError, ValueError, OSError):  # a damaged one: accounted_epsilon raises
        return summary
    settings = None if ledger is None else ledger.header.get("settings")
    if not isinstance(settings, dict):
        return summary
    private = ledger.header.get("private") is True
    own = {"strategy": settings.get("strategy"), "seed": settings.get("seed"),
           "noise_multiplier": settings.get("noise-multiplier") if private else 0.0}  # fmt: skip
    kinds = {"strategy": (str,), "seed": (int,), "noise_multiplier": (int, float)}
    own = {key: value for key, value in own.items()  # a header's odd value is not taken
           if isinstance(value, kinds[key]) and not isinstance(value, bool)}  # fmt: skip
    differ = [key for key, value in own.items() if summary.get(key) != value]
    stated = summary.get("config")
    stated = stated if isinstance(stated, dict) else {}
    recorded = {key: settings[key] for key in LEDGER_KEYS if key in settings}
    differ += [key for key, value in recorded.items() if stated.get(key) != value]
    config = {**stated, **recorded}
    if differ and configured:  # configured_summary's "reported as configured" no longer holds
        notes[:] = [n for n in notes if not n.startswith(f"{path}: its {SUMMARY_FILE} states ")]
        keys = list(dict.fromkeys(key.replace("_", "-") for key in differ))
        key = next((k for k in keys if k in recorded), keys[0])
        notes.append(
            f"{path}: its {CONFIG_FILE} disagrees with its {LEDGER_FILE} ({', '.join(keys[:3])}; "
            f"{key}: {shown(stated.get(key))} in {CONFIG_FILE}, {shown(recorded.get(key))} in "
            "the ledger): the file was edited after the run; reported as its ledger records"
        )
    elif differ:
        notes.append(
            f"{path}: no readable {CONFIG_FILE}, and its {SUMMARY_FILE} disagrees with its "
            f"{LEDGER_FILE} ({', '.join(differ[:3])}); reported as its ledger records"
        )
    return {**summary, **own, "config": config}
