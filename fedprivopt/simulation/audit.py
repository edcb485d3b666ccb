"""What a run directory's files may be used for again: every check ``--resume`` makes, read-only.

:func:`audit_run_dir` reads a run directory (``config.toml``, the privacy ledger, the metrics
rows, ``summary.json`` and the newest readable checkpoint) and checks them against each other as
:func:`~fedprivopt.simulation.run.resume` needs them, writing nothing:

* the configuration against the ledger's header and its round events
  (:meth:`~fedprivopt.simulation.ledger.RunLedger.check_config`, ``check_algorithm``);
* every ε the rows and the summary reported against the ledger (``check_reported``), and the
  rounds they show against the ledger's last round (a truncated ledger);
* the checkpoint's accountant against the ledger (``restore``), or, without a ledger, against
  the ε the rows reported (``check_carried``) and the ledger it rebuilds against every ε the
  rows and the summary reported (``check_rebuilt``); a checkpoint holding events no round of the
  configuration releases, or fewer than its rounds release, is refused;
* without a readable checkpoint, whether restarting from round 0 would reset the accountant.

``resume`` continues from what the audit returns (:class:`RunDirState`); ``compare`` audits a
cell's earlier run before it reuses or resumes it, and reuses it only when
:meth:`RunDirState.unfinished` finds nothing left to do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedprivopt.core.files import naming
from fedprivopt.core.text import shown
from fedprivopt.models.task import Task, data_identity
from fedprivopt.simulation.audit_tree import check_participants, refuse_secure_tree_redo
from fedprivopt.simulation.checkpoint import (
    LEDGER_HEADER,
    check_rows_digest,
    checkpoints_beside,
    newest_checkpoint,
)
from fedprivopt.simulation.config import RunConfig, load_config
from fedprivopt.simulation.divergence import checked_round
from fedprivopt.simulation.engines import check_flower_resources
from fedprivopt.simulation.files import (
    CHECKPOINT,
    CONFIG_FILE,
    LEDGER_FILE,
    METRICS_FILE,
    PREVIOUS_CHECKPOINT,
    SMALL_FILE_LIMIT,
    SUMMARY_FILE,
    check_config_not_empty,
    check_regular,
    check_run_files,
    parse_json,
    read_rows,
    stated_epsilons,
)
from fedprivopt.simulation.ledger import OldLedgerError, RunLedger
from fedprivopt.simulation.ledger_convert import rebuilt_parts
from fedprivopt.simulation.ledger_lines import tree_participants
from fedprivopt.simulation.rundata import check_summary_rounds
from fedprivopt.strategies.core import ServerAlgorithm

__all__ = ["RunDirState", "audit_run_dir", "read_summary"]


@dataclass
class RunDirState:
    """A run directory that passed :func:`audit_run_dir`, and what was read from it.

    Attributes
    ----------
    out : pathlib.Path
    config : RunConfig
        From ``config.toml``.
    task : Task
    alg : ServerAlgorithm
        Restored from :attr:`checkpoint` (round 0 without one); with a ledger, its accountant
        is already set from the ledger (:meth:`RunLedger.restore`).
    ledger : RunLedger or None
        ``None`` when the ledger is missing or of an earlier version (:attr:`old`): a resume
        rebuilds it from the checkpoint, or creates it for a start killed before its header.
    old : OldLedgerError or None
    rows : list of dict
        The metrics rows.
    summary : dict or None
        ``summary.json``.
    last_released : int
        The last round any file shows released.
    checkpoint : str or None
        The checkpoint file restored (``None``: none readable, a restart from round 0).
    problems : dict
        Unreadable checkpoint files and why.
    diverged : int or None
        The first diverged round the restored checkpoint records
        (:mod:`~fedprivopt.simulation.divergence`); ``None``: none, or no checkpoint.
    recorded_plan : str or None
        Without a ledger: the tuning plan the checkpoint's copy of the ledger header names
        (:meth:`RunLedger.check_recorded`; ``None``: none, or no copy).
    """

    out: Path
    config: RunConfig
    task: Task
    alg: ServerAlgorithm
    ledger: RunLedger | None
    old: OldLedgerError | None
    rows: list[dict[str, Any]]
    summary: dict[str, Any] | None
    last_released: int
    checkpoint: str | None
    problems: dict[str, str] = field(default_factory=dict)
    diverged: int | None = None
    recorded_plan: str | None = None

    def refuse_trial(self) -> None:
        """Refuse a run whose ledger names a tuning plan: a trial of ``fedprivopt tune``.

        Its hyperparameters were chosen (or drawn for the choice) on the private data by its
        tuning, which spent more than the run's own ε; reported alone, as a ``compare`` cell
        or a ``compare-tuned --untuned`` run (a copy or a link of the trial), it understated
        that (thirty-first review of issue 15, compare finding 5).

        Raises
        ------
        ValueError
            Naming the ledger and the plan.
        """
        plan = self.recorded_plan if self.ledger is None else self.ledger.header.get("tuning_plan")
        if plan is not None:
            # fortieth review follow-up (ledger 2): a trial's ledger deleted, its checkpoint's
            # copy of the header still names the plan
            where = (
                self.ledger.path
                if self.ledger is not None
                else f"{self.out / str(self.checkpoint)} (its copy of the ledger header)"
            )
            raise ValueError(
                f"{where}: its header names the tuning plan {str(plan)[:16]!r}...: "
                "the run is a trial of a tuning, and reported alone its epsilon would understate "
                "what the tuning spent (report the tuning with compare-tuned)"
            )

    def unfinished(self) -> str | None:
        """Why the run is not finished (``None`` when it is, and may be reused as it is).

        Decided from the checkpoint and the ledger, not from the existence of ``summary.json``:
        a finished run's ledger, checkpoint and summary all end at the same round, which is the
        configuration's last, or one after which the target ε allows no further round (the run
        stopped at its budget; when that is round 0 there is no checkpoint).
        """
        rounds = self.config.strategy.num_server_rounds
        done = self.alg.round_num
        if self.ledger is None:
            what = "of an earlier version" if self.old is not None else "missing"
            if self.checkpoint is None:  # a start killed before the ledger's header
                return f"its {LEDGER_FILE} is {what} and no round was released"
            return (
                f"its {LEDGER_FILE} is {what}: rebuilt from {self.checkpoint}'s accountant and "
                "the metrics rows, as --resume does, and epsilon composed from it"
            )
        if self.problems:
            return f"{', '.join(self.problems)} unreadable; continued from round {done}"
        if self._stopped_by_budget_after_lost_rounds():
            return None
        if self.checkpoint is None and self.ledger.last_round:
            return f"no checkpoint, though its ledger records round {self.ledger.last_round}"
        if self.ledger.last_round != done:
            return f"its ledger records round {self.ledger.last_round}, its checkpoint round {done}"
        if self.summary is None:
            return f"no {SUMMARY_FILE}: it stopped at round {done} of {rounds}"
        stated = int(self.summary["rounds_completed"])
        if stated != done:
            return (
                f"its {SUMMARY_FILE} states round {stated}, but its ledger and checkpoint end at "
                f"round {done} of {rounds}"
            )
        if done >= rounds:
            return None
        if (
            self.summary.get("stopped_reason") == "budget"
            and not self.alg.budget_allows_next_round()
        ):
            return None
        return f"it stopped at round {done} of {rounds}"

    def _stopped_by_budget_after_lost_rounds(self) -> bool:
        """Whether a resume stopped at its budget before redoing the rounds lost after it.

        In secure mode the rounds released after the restored checkpoint stay charged and a
        resume redoes them as new releases; when the target ε allows none of them, the resume
        stops at the checkpoint's round with ``stopped_reason`` ``budget``, and the ledger keeps
        recording the lost rounds past it. Nothing is left to do: every later resume stops
        there again. Thirty-second review of issue 15 (resume, finding 3): such a run was
        unfinished forever (``its ledger records round 3, its checkpoint round 2``), so
        ``compare`` resumed the cell on every call, ``compare-tuned --untuned`` refused it
        ("--resume it first") and ``tune`` counted the trial as unfinished.
        """
        done, summary = self.alg.round_num, self.summary
        return (
            summary is not None
            and self.ledger is not None
            and self.ledger.last_round > done
            and int(summary["rounds_completed"]) == done
            and summary.get("stopped_reason") == "budget"
            and not self.alg.budget_allows_next_round()
        )


def read_summary(out: Path) -> dict[str, Any] | None:
    """``summary.json`` of ``out`` (``None`` if there is none); unreadable is a ``ValueError``."""
    path = out / SUMMARY_FILE
    if not check_regular(path, limit=SMALL_FILE_LIMIT):
        return None
    try:
        with naming(path):
            text = path.read_text()
        summary = parse_json(text)
        rounds = summary["rounds_completed"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is unreadable ({exc})") from None
    # thirty-first review of issue 15: Infinity, -Infinity and 1e400 (floats to ``json``) were an
    # OverflowError traceback from int(); 2.5 and true were taken as 2 and 1 (thirty-second,
    # resume finding 2: beyond MAX_ROUNDS); the check reports share (rundata.load_run)
    check_summary_rounds(rounds, path)
    return summary


def _shown_rounds(rows: list[dict[str, Any]], summary: dict[str, Any] | None) -> int:
    """The last round the metrics rows and the summary show as released (0 if none)."""
    released = [int(r["round"]) for r in rows]
    if summary is not None:
        released.append(int(summary["rounds_completed"]))
    return max(released, default=0)


def _refuse_restart(
    out: Path,
    config: RunConfig,
    last_released: int,
    problems: dict[str, str],
    stopped_before_round_1: bool = False,
) -> None:
    """Raise unless restarting from round 0 keeps the privacy ledger intact.

    Allowed only when no checkpoint file exists and no round past the first checkpoint is known
    to have been released (a crash before the first checkpoint was complete), or nothing was
    released at all (a run whose budget allowed no round): the restart then redoes those rounds
    (and, in secure mode, the resume charges their earlier release). A finished run (it has a
    summary) that released rounds but lost its checkpoints is refused.

    ``stopped_before_round_1``: its summary says a resume from round 0 stopped at its budget
    there, beside a ledger that keeps every release charged (a secure run killed before its
    first checkpoint, whose lost rounds the target allows no redo of). That resume wrote no
    checkpoint, and restarting resets nothing: every later one stops there again.
    Thirty-second review of issue 15 (resume, finding 3): such a run was refused by every
    later ``--resume`` and ``compare`` ("restarting from round 0 would reset the privacy
    accountant"), though the resume that wrote its summary had ended rc 0.
    """
    present = [n for n in (CHECKPOINT, PREVIOUS_CHECKPOINT) if (out / n).exists()]
    reset = "restarting from round 0 would reset the privacy accountant"
    if present:
        raise ValueError(
            f"no readable checkpoint in {str(out)!r}: "
            + "; ".join(f"{n} is unreadable ({shown(problems.get(n, '?'))})" for n in present)
            + f"; {reset} "
            f"(rounds up to {last_released} were released). Restore a checkpoint or start a new "
            "run in another directory"
        )
    first = min(config.checkpoint_every, config.strategy.num_server_rounds)
    if stopped_before_round_1:
        return
    if last_released > first or (last_released and (out / SUMMARY_FILE).exists()):
        raise ValueError(
            f"{str(out)!r} has no checkpoint, but its metrics, summary or privacy ledger show "
            f"rounds up to {last_released} were released; {reset}. Restore a checkpoint or "
            "start a new run in another directory"
        )


def _check_restored(alg: ServerAlgorithm, config: RunConfig, name: str) -> None:
    """Raise if checkpoint ``name`` (restored into ``alg``) holds events it cannot have."""
    least = alg.events_through(alg.round_num)
    foreign = [e for e, _ in alg.accountant.ledger if e not in alg.round_events()]
    if foreign:
        raise ValueError(
            f"{name} holds a privacy event ({foreign[0].to_dict()}) that no round of "
            f"{CONFIG_FILE} releases: the checkpoint was edited; refusing to resume"
        )
    if alg.accountant.num_events < least:
        raise ValueError(
            f"{name} is a checkpoint of round {alg.round_num}, but its accountant holds "
            f"{alg.accountant.num_events} privacy events, fewer than the {least} that "
            f"{alg.round_num} rounds release: the checkpoint was edited; refusing to resume"
        )


def _check_rows_kept(
    out: Path, state: dict[str, Any], round_num: int, rows: list[dict[str, Any]], name: str
) -> None:
    """Refuse metrics rows fewer than the checkpoint's count of those written before it.

    Twenty-sixth review of issue 15: a finished run of ``adadps-paper.toml`` whose
    ``metrics.jsonl`` had lost its last 3 rows resumed with rc 0, and its new ``summary.json``
    (and any report) gave round 37's metrics as the final ones of 40 rounds. A row is written
    before the checkpoint that counts it, so fewer rows up to the checkpoint's round were
    removed afterwards. Checked for a checkpoint of the run's last round only: a resume of an
    unfinished run redoes rounds and writes their rows (the final metrics are then right; a
    crash's evidence may be an emptied ``metrics.jsonl``, ``tests/reliability/test_crash.py``).
    """
    saved = state.get("rows")
    if isinstance(saved, bool) or not isinstance(saved, int):
        return  # a checkpoint of an earlier version: nothing recorded
    kept = sum(1 for r in rows if isinstance(r.get("round"), int) and r["round"] <= round_num)
    if kept < saved:
        raise ValueError(
            f"{out / METRICS_FILE} holds {kept} rows up to round {round_num}, but {name} was "
            f"written after {saved}: rows were removed (the run's results would be reported "
            f"from an earlier round); restore {METRICS_FILE} or start a new run in another "
            "directory"
        )
    before = {
        r["round"] for r in rows if isinstance(r.get("round"), int) and r["round"] < round_num
    }
    if saved > len(before) and not any(r.get("round") == round_num for r in rows):
        # twenty-seventh review: the last round's row deleted and an earlier one duplicated in
        # its place kept the count, and round 2's metrics were reported as the final ones.
        # Only a checkpoint written after a row of its round had one (thirty-fifth review, the
        # lifecycle reviewer: with eval-every 3, a run killed at round 5's checkpoint and cut
        # to 5 rounds was refused as if round 5's row, never written, had been removed)
        raise ValueError(
            f"{out / METRICS_FILE} holds no row of round {round_num}, the last round {name} "
            f"was written after: it was removed (the run's results would be reported from an "
            f"earlier round); restore {METRICS_FILE} or start a new run in another directory"
        )


def audit_run_dir(out: Path, task: Task | None = None, *, engine: bool = True) -> RunDirState:
    """Every check a resume of ``out`` makes, writing nothing; the caller holds its lock.

    ``task``: ``config.toml``'s task built before (see
    :func:`~fedprivopt.simulation.run.build_run`). ``engine``: also check that this machine can
    start the configured engine (:func:`~fedprivopt.simulation.engines.check_flower_resources`;
    a run that is only reused starts none).

    Raises
    ------
    ValueError
        Naming the file, key or round that makes the directory's files unusable; see the
        module docstring.
    """
    from fedprivopt.simulation.run import build_run  # run.py imports this module

    check_run_files(out)
    if not (out / CONFIG_FILE).is_file():
        raise ValueError(f"--resume directory {str(out)!r} has no {CONFIG_FILE}")
    check_config_not_empty(out / CONFIG_FILE)
    config = load_config(out / CONFIG_FILE)
    old: OldLedgerError | None = None
    try:
        ledger = RunLedger.read(out)
    except OldLedgerError as exc:
        ledger, old = None, exc
    if ledger is not None:
        ledger.check_config(config, str(out / CONFIG_FILE))
    task, alg = build_run(config, task)
    if ledger is not None:
        ledger.check_data(data_identity(task), str(out / CONFIG_FILE))
    if engine:
        check_flower_resources(config)
    if ledger is not None:
        ledger.check_algorithm(alg)
    rows = read_rows(out / METRICS_FILE)
    summary = read_summary(out)
    last_shown = _shown_rounds(rows, summary)
    if ledger is not None:
        ledger.check_reported(stated_epsilons(rows, summary))
    if ledger is not None and last_shown > ledger.last_round:
        raise ValueError(
            f"{ledger.path} ends at round {ledger.last_round}, but {METRICS_FILE} or "
            f"{SUMMARY_FILE} show round {last_shown} was released: the ledger is incomplete "
            "(truncated or edited); refusing to resume"
        )
    last_released = max(last_shown, ledger.last_round if ledger else 0, old.max_round if old else 0)
    problems: dict[str, str] = {}
    state, name = newest_checkpoint(out, problems)
    beside = checkpoints_beside(out, name)  # forty-eighth review of issue 15 (ledger 2)
    for other, done in beside.items():
        if ledger is not None and done > ledger.last_round:
            raise ValueError(
                f"{out / other} is a checkpoint of round {done}, but {ledger.path.name} ends at "
                f"round {ledger.last_round}: rounds up to {done} were released, which the ledger "
                "does not record (an older copy of the run's files put back beside newer ones, "
                "or the ledger cut); refusing to resume (put the newer files back, or start a "
                "new run in another directory)"
            )
    last_released = max(last_released, *beside.values(), 0)
    if ledger is not None and state is not None:
        ledger.check_header_copy(state.get(LEDGER_HEADER), name)
    if state is None:
        stopped = (
            ledger is not None
            and summary is not None
            and summary["rounds_completed"] == 0
            and summary.get("stopped_reason") == "budget"
        )
        _refuse_restart(out, config, last_released, problems, stopped)
    else:
        for unreadable, why in problems.items():  # resumed from the previous one
            # cut as in the refusal below: torch's text of a corrupt file is 8 lines advising
            # weights_only=False (thirty-second review of issue 15, resume finding 6)
            logging.getLogger(__name__).warning(
                "checkpoint %s is unreadable (%s); continuing from %s", unreadable, shown(why), name
            )
        try:  # the config and every accountant field checked
            alg.load_state_dict(state["algorithm"])
        except ValueError as exc:  # twenty-first review of issue 15: the file was not named
            raise ValueError(f"{out / name}: {exc}; refusing to resume") from None
        _check_restored(alg, config, name)
        recorded = ledger is not None and ledger.records(alg.round_num, tree_participants(alg))
        check_participants(alg, rows, name, recorded)
        if alg.round_num >= config.strategy.num_server_rounds:  # nothing will be redone
            _check_rows_kept(out, state, alg.round_num, rows, name)
        if ledger is not None:
            ledger.check_participants(alg.round_num, tree_participants(alg), name)
            ledger.check_model(alg.round_num, alg.params, name)
    refuse_secure_tree_redo(config, last_released, alg.round_num if state else 0)
    released, rounds = (
        max(last_released, alg.round_num if state else 0),
        config.strategy.num_server_rounds,
    )
    if released > rounds:  # config.toml edited down (issue 15, ninth review, N10)
        raise ValueError(
            f"{out / CONFIG_FILE}: its files show rounds up to {released} released, more than the "
            f"num-server-rounds = {rounds} of its {CONFIG_FILE}; set it to at least {released}"
        )
    recorded_plan: str | None = None
    if ledger is None and state is None:
        if old is not None:
            raise ValueError(
                f"{old} and no checkpoint is readable; restarting from round 0 would reset the "
                "privacy accountant (finish the run with the version that started it, or start "
                "a new run in another directory)"
            )
        if last_released:
            raise ValueError(
                f"{str(out)!r} shows rounds up to {last_released} were released, but its "
                f"{LEDGER_FILE} is missing and no checkpoint is readable: what was released "
                "cannot be established, and restarting from round 0 would reset the privacy "
                "accountant; start a new run in another directory"
            )
    elif ledger is None:
        RunLedger.check_carried(config, alg.accountant, alg.round_num, name, rows)
        parts = rebuilt_parts(alg.accountant, alg.round_num, last_released, alg.round_events(), old)
        RunLedger.check_rebuilt(config, alg.accountant, parts, name, stated_epsilons(rows, summary))
        # fortieth review follow-up (ledger 2): the checkpoint's copy of the ledger header,
        # checked here for every caller (compare's plan, compare-tuned, tune), not on --resume only
        recorded_plan = RunLedger.check_recorded(out, state, name, config, data_identity(task))
    else:
        ledger.restore(alg.accountant, alg.round_num, name, secure=config.strategy.secure)
    if state is not None:
        # the rows are this run's (a finished run's summary.json too: an unfinished one may
        # keep its summary beside rows a crash emptied, tests/reliability/test_crash.py)
        finished = alg.round_num >= config.strategy.num_server_rounds
        check_rows_digest(out, rows, state, name, summary if finished else None)
    diverged = checked_round(state.get("diverged"), alg.round_num) if state else None
    return RunDirState(
        out, config, task, alg, ledger, old, rows, summary, last_released, name, problems, diverged,
        recorded_plan,
    )  # fmt: skip
