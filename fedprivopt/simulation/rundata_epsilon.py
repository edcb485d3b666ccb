"""The ε a run directory's files state, and the notes a report gives about it.

:func:`~fedprivopt.simulation.rundata.load_run`'s accounting: ε composed from the privacy
ledger or, without one, from the newest checkpoint's accountant (:func:`checkpoint_epsilon`),
the δ it is composed at where ``summary.json``'s is no δ, and the note of a tuning's trial
(:func:`trial_note`). Split from :mod:`fedprivopt.simulation.rundata`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fedprivopt.core.text import shown
from fedprivopt.simulation.checkpoint import checkpoints_beside, newest_checkpoint
from fedprivopt.simulation.files import CONFIG_FILE, LEDGER_FILE, METRICS_FILE, SUMMARY_FILE
from fedprivopt.simulation.ledger import OldLedgerError, RunLedger

__all__ = [
    "accounted_epsilon",
    "beside_epsilons",
    "checkpoint_epsilon",
    "checkpoint_epsilon_header",
    "composed_delta",
    "is_delta",
    "note_copied_plan",
    "trial_note",
]


def is_delta(value: Any) -> bool:
    """Whether ``value`` is a δ a report may show: a float in (0, 1)."""
    return isinstance(value, float) and 0.0 < value < 1.0


def composed_delta(
    summary: dict[str, Any],
    accounted: tuple[str, float, float] | None,
    known: list[tuple[str, float]],
    summary_path: Path,
    notes: list[str],
) -> dict[str, Any]:
    """``summary`` with the δ its ε is composed at, where the δ it states is no δ.

    Thirty-ninth review of issue 15 (reports, finding 2): ``write_report(out, load_runs(F))``
    of a run whose ``config.toml`` was deleted and whose ``summary.json`` states ``delta`` 0
    showed ε 10.28 (composed at its ledger's δ 1e-4) beside δ ``0``, a claim of pure DP, and
    without a warning; ``-1e-4``, ``1`` and ``null`` (``n/a``) alike. The δ shown is now the one
    ``accounted`` (the ledger or the newest checkpoint) composed ε at, and that is noted; a
    private run with neither has no δ for the ε its files state, and is refused.

    Raises
    ------
    ValueError
        Naming ``summary.json``, for a run with a finite stated ε and nothing to compose it.
    """
    stated = summary.get("delta")
    if accounted is None:
        if any(math.isfinite(v) for _, v in known):
            raise ValueError(
                f"{summary_path} is unreadable (delta must be a number in (0, 1), got "
                f"{shown(stated)}), and the run has no {LEDGER_FILE} or checkpoint to give the "
                "delta its epsilon holds at"
            )
        return summary  # not private: no epsilon for a delta to qualify
    source, _, delta = accounted
    notes.append(
        f"{summary_path.parent}: its {SUMMARY_FILE} states delta {shown(stated)}, not a number in "
        f"(0, 1); reported at delta {delta:g}, the one its epsilon is composed at ({source})"
    )
    return {**summary, "delta": delta}


def trial_note(path: Path, source: str = LEDGER_FILE) -> str:
    """The note of a run whose privacy ledger names a tuning plan: a trial of ``fedprivopt tune``.

    Fortieth review of issue 15 (reports, finding 2): ``write_report(out,
    load_runs("T/runs/trial-001"))`` of a tuning's released trial showed ε 10.28 without a word,
    where the tuning that chose it spent 13.09 (``compare`` and ``compare-tuned --untuned``
    refuse a trial; the tuned row of :func:`~fedprivopt.simulation.tune_report.load_tuned`
    carries the tuning's ε and drops this note). ``source``: what names the plan; without a
    ledger, a checkpoint's copy of its header (fortieth review follow-up, ledger 3: a trial
    copied out without its ledger was reported without a word).
    """
    return (
        f"{path}: a trial of a tuning (its {source} names a tuning plan): the epsilon shown "
        "is its own run's, below what the tuning that chose its hyperparameters spent (report "
        "the tuning with compare-tuned)"
    )


def note_copied_plan(path: Path, name: str, header: Any, notes: list[str]) -> None:
    """Note a trial whose checkpoint's copy of the ledger header names a plan its ledger does not.

    Fortieth review follow-up (ledger 6): a trial's ledger header with its ``tuning_plan``
    deleted was reported by ``load_run`` as a run of its own, without :func:`trial_note`.
    """
    if not isinstance(header, dict) or header.get("tuning_plan") is None:
        return
    if trial_note(path) not in notes:
        notes.append(trial_note(path, f"{name}'s copy of the ledger header"))


def accounted_epsilon(
    path: Path, notes: list[str], delta: object = None, where: str = CONFIG_FILE
) -> tuple[str, float, float] | None:
    """``(source, ε, δ)``: the run's privacy ledger composed, or its newest checkpoint's accountant.

    A ledger this version cannot read raises ``ValueError`` naming it: a report never falls
    back to a summary's ε when the ledger that should back it is damaged. Without a ledger (or
    with an earlier version's), ε is recomputed from the newest readable checkpoint's accountant,
    as ``--resume`` rebuilds the ledger from it, and that is noted; a deleted ledger beside
    edited metrics and summary used to lower the reported ε (issue 15). ``None`` when there is
    neither (the ε the run's files state is then all there is).

    ``delta``: the δ the report shows beside ε (the configuration's). ε is composed at it; a
    ledger or checkpoint of another δ is noted. Sixteenth review of issue 15: a ledger whose
    header and settings said δ 0.5 (the rows' and summary's ε lowered to match, ``config.toml``
    kept at 1e-4) was reported by ``compare-tuned --untuned`` as ε 2.88 beside δ 1e-4, where
    the run spent 13.70 at 1e-4. ``where``: the file ``delta`` comes from, which the note
    names (thirty-seventh review, reports finding 4: a run without ``config.toml`` whose
    ``summary.json`` states δ 0.5 was noted "its config.toml 0.5", a file it does not have).
    A run with neither is noted so: forty-third review of issue 15 (ledger, finding 3), a
    secure run's ledger and checkpoints deleted and the ε of its rows and summary divided by
    100 was reported by ``write_report(out, load_runs(R))`` at 0.163 without a word.
    """
    shown_delta = delta if is_delta(delta) else None
    old: OldLedgerError | None = None
    try:
        ledger = RunLedger.read(path)
    except OldLedgerError as exc:
        ledger, old = None, exc
    if ledger is not None:
        if ledger.header.get("tuning_plan") is not None:
            notes.append(trial_note(path))
        if shown_delta is not None and ledger.header["delta"] != shown_delta:
            notes.append(
                f"{path}: its {LEDGER_FILE} states delta {ledger.header['delta']:g}, its "
                f"{where} {shown_delta:g}; epsilon is composed at {shown_delta:g}"
            )
        at = ledger.header["delta"] if shown_delta is None else shown_delta
        return LEDGER_FILE, ledger.epsilon(shown_delta), at
    found = checkpoint_epsilon_header(path, shown_delta, old)
    if found is None:
        if old is not None:  # forty-third review follow-up (ledger 4): noted 'no ledger'
            notes.append(
                f"{path}: its {LEDGER_FILE} is an earlier version's (event counts only: "
                f"{old.max_events} events by round {old.max_round}) and no checkpoint is "
                f"readable to charge them as: its epsilon is as {SUMMARY_FILE} and "
                f"{METRICS_FILE} state it, which may be less than those events cost (compare "
                "and --resume refuse such a run)"
            )
        elif _states_finite_epsilon(path):  # forty-third review (ledger 3): without a word
            notes.append(
                f"{path}: no {LEDGER_FILE} and no readable checkpoint: its epsilon is as "
                f"{SUMMARY_FILE} and {METRICS_FILE} state it, which nothing of the run confirms "
                "(compare and --resume refuse such a run)"
            )
        return None
    name, epsilon, round_num, at, header = found
    if isinstance(header, dict) and header.get("tuning_plan") is not None:
        notes.append(trial_note(path, f"{name}'s copy of the ledger header"))
    which = (
        f"no {LEDGER_FILE}"
        if old is None
        else f"its {LEDGER_FILE} is an earlier version's (event counts only: "
        f"{old.max_events} events by round {old.max_round})"
    )
    notes.append(
        f"{path}: {which}; epsilon {epsilon:.6g} recomputed from the accountant of "
        f"{name} (round {round_num}){' and the events counted beyond it' if old else ''}"
    )
    return f"{name} (its accountant)", epsilon, at


def _states_finite_epsilon(path: Path) -> bool:
    """Whether ``path`` is a run of fedprivopt whose ``summary.json`` states a finite ε.

    A run fedprivopt wrote has a ``config.toml`` and a summary stating its ``threat_model``; files
    written by hand without either (a report's test data) are not noted.
    """
    from fedprivopt.simulation.files import parse_json

    try:
        summary = parse_json((path / SUMMARY_FILE).read_text(encoding="utf-8"))
        epsilon = summary.get("epsilon")
    except (OSError, ValueError, AttributeError):
        return False
    ours = (path / CONFIG_FILE).exists() or "threat_model" in summary
    number = isinstance(epsilon, (int, float)) and not isinstance(epsilon, bool)
    return ours and number and math.isfinite(epsilon)


def checkpoint_epsilon(path: Path, delta: float | None) -> tuple[str, float, int, float] | None:
    """``(file, ε, round, δ)`` of the newest readable checkpoint's accountant, at ``delta``.

    ``delta`` ``None``: the checkpoint's configured δ. ``None`` without a checkpoint.

    Raises
    ------
    ValueError
        If the checkpoint's accountant or configuration cannot be read, naming the file.
    """
    found = checkpoint_epsilon_header(path, delta)
    return None if found is None else found[:4]


def checkpoint_epsilon_header(
    path: Path, delta: float | None, old: OldLedgerError | None = None
) -> tuple[str, float, int, float, Any]:
    """:func:`checkpoint_epsilon`, and the checkpoint's copy of the ledger header (or ``None``).

    ``old``: the run's ledger of an earlier version (event counts only). The events it counts
    beyond the checkpoint's accountant are charged too, as ``--resume`` charges them when it
    converts that ledger (:meth:`~fedprivopt.simulation.ledger.RunLedger.convert`), each as the
    costliest of the accountant's events (:func:`_with_uncounted`). Forty-third review of issue
    15 (ledger, finding 1): ``load_run`` (what ``write_report`` reads) took the checkpoint's
    accountant alone and said the run had no ledger: a secure run of 2 rounds whose ledger of
    an earlier version counts 3 events (a resume of that version killed after round 3's line)
    was reported at epsilon 10.28 where its ledger, and ``--resume``, charge 12.17.

    Raises
    ------
    ValueError
        As :func:`checkpoint_epsilon`; also when ``old`` counts events beyond a checkpoint
        whose accountant holds none to charge them as.
    """
    from fedprivopt.privacy.accounting import PrivacyAccountant
    from fedprivopt.simulation.checkpoint import LEDGER_HEADER
    from fedprivopt.strategies.config import StrategyConfig

    state, name = newest_checkpoint(path, problems={})
    if state is None:
        return None
    algorithm = state["algorithm"]
    try:
        config = StrategyConfig.from_mapping(algorithm["config"])
        accountant = PrivacyAccountant()
        accountant.load_state_dict(algorithm["accountant"])
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{path / name}: its privacy accountant cannot be read ({exc})") from None
    at = config.delta if delta is None else delta
    if not config.private:
        epsilon = math.inf
    elif old is not None and old.max_events > accountant.num_events:
        epsilon = _with_uncounted(accountant, old.max_events - accountant.num_events, at, path)
    else:
        epsilon = accountant.epsilon(at)
    return name, epsilon, algorithm["round"], at, state.get(LEDGER_HEADER)


def _with_uncounted(accountant, extra: int, delta: float, path: Path) -> float:
    """ε of ``accountant``'s events and ``extra`` more, each its costliest event (the largest ε).

    An earlier version's ledger counts events without saying which; the checkpoint's
    accountant holds the run's kinds of event, so the largest ε over charging the ``extra``
    as each of them bounds what was released.
    """
    from fedprivopt.privacy.accounting_state import merge_ledger

    base = accountant.ledger
    kinds = list(dict.fromkeys(event for event, _ in base))
    if not kinds:
        raise ValueError(
            f"{path / LEDGER_FILE}: an earlier version's ledger counting {extra} events beyond "
            "a checkpoint that holds none: what was released cannot be established"
        )
    composed = []
    for event in kinds:
        accountant.set_ledger(merge_ledger([*base, (event, extra)]))
        composed.append(accountant.epsilon(delta))
    accountant.set_ledger(base)
    return max(composed)


def beside_epsilons(path: Path, delta: float | None) -> list[tuple[str, float]]:
    """``(file, ε)`` of the accountant of each intact checkpoint but the newest, at ``delta``.

    Forty-eighth review of issue 15 (ledger 3): a secure run's files of a backup taken after
    round 1 put back over the run after it released 3 rounds left the newer
    ``checkpoint.prev.pt`` of round 2 beside them; ``load_run`` (what ``write_report`` reads)
    reported epsilon 7.55 without a word, the newer checkpoint's accountant holding 10.28
    (:func:`~fedprivopt.simulation.checkpoint.checkpoints_beside`). A file that cannot be read
    as a checkpoint of a private run is left out.
    """
    import torch

    from fedprivopt.privacy.accounting import PrivacyAccountant
    from fedprivopt.simulation.checkpoint import check_checkpoint
    from fedprivopt.strategies.config import StrategyConfig

    try:
        name = newest_checkpoint(path, problems={})[1]
    except ValueError:
        name = None
    found = []
    for other in checkpoints_beside(path, name):
        try:
            state = torch.load(path / other, map_location="cpu", weights_only=True)
            check_checkpoint(state)
            config = StrategyConfig.from_mapping(state["algorithm"]["config"])
            accountant = PrivacyAccountant()
            accountant.load_state_dict(state["algorithm"]["accountant"])
            if config.private:
                found.append(
                    (
                        f"{other} (its accountant)",
                        accountant.epsilon(config.delta if delta is None else delta),
                    )
                )
        except Exception:  # torn, or not a checkpoint's accountant: it states nothing
            continue
    return found
