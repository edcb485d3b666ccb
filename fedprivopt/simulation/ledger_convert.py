"""A run's ledger rebuilt when it is missing or of an earlier version, and accountant checks.

:class:`LedgerConversion` is the part of :class:`~fedprivopt.simulation.ledger.RunLedger` (a
mixin) that rebuilds a ledger conservatively from a readable checkpoint
(:meth:`LedgerConversion.convert`) after checking that the checkpoint accounts every ε its
rounds' metrics rows reported (:meth:`LedgerConversion.check_carried`).
:func:`check_accountant_kind` refuses a restored checkpoint whose accountant is not the one the
ledger's header or the configuration records.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedprivopt.core.text import shown
from fedprivopt.privacy.accounting import PrivacyAccountant, compose_epsilon
from fedprivopt.privacy.accounting_state import merge_ledger
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.tree import tree_position
from fedprivopt.simulation.checkpoint import LEDGER_HEADER
from fedprivopt.simulation.files import (
    CONFIG_FILE,
    LEDGER_FILE,
    METRICS_FILE,
    json_line,
    stated_epsilons,
)
from fedprivopt.simulation.ledger_lines import (
    Ledger,
    OldLedgerError,
    count_events,
    parse_lines,
    released_json,
    round_released,
)

if TYPE_CHECKING:
    from fedprivopt.simulation.ledger import RunLedger

__all__ = ["ACCOUNTANT_FIELDS", "LedgerConversion", "check_accountant_kind", "rebuilt_parts"]

_log = logging.getLogger(__name__)


ACCOUNTANT_FIELDS = ("accountant", "pld_discretization", "prv_eps_error")


def _released_by(round_events: Sequence[SubsampledGaussianEvent], round_num: int) -> Ledger:
    """What round ``round_num`` released, of a charging round's ``round_events``.

    Under tree aggregation a restart period's event is charged whole at its first round and
    the period's other rounds release none (``ServerAlgorithm.round_events``), as every line a
    run writes records. Thirty-ninth review of issue 15 (ledger, finding 1): a tree run's
    rebuilt ledger charged each round after the checkpoint a whole period's event (epsilon
    31.57 where the run spent 23.82), and the next ``--resume`` refused that line as edited.
    """
    steps = {e.tree_steps for e in round_events if e.sampling == "tree"}
    if len(steps) == 1 and tree_position(round_num, steps.pop())[1] != 1:
        return ()
    return round_released(round_events)


def check_accountant_kind(
    accountant: PrivacyAccountant, expected: Mapping[str, Any], checkpoint: str, source: str
) -> None:
    """Refuse a restored checkpoint whose accountant is not the one ``source`` records.

    ``expected`` holds :data:`ACCOUNTANT_FIELDS` (a ledger's header, or the configuration's
    accountant). Thirty-first review of issue 15: a checkpoint whose accountant was set from
    ``"rdp"`` to ``"pld"`` (its digest recomputed with ``state_digest``) resumed with rc 0; the
    run's metrics rows and its budget then used PLD, so a run with ``target-epsilon = 16`` went
    on to round 8 and stopped "at its budget" with the ledger's (RDP) ε 18.41.
    """
    for key in ACCOUNTANT_FIELDS:
        have, want = getattr(accountant, key), expected[key]
        if have != want:
            raise ValueError(
                f"{checkpoint}'s privacy accountant has {key} = {shown(have)}, but {source} "
                f"records {shown(want)}: the checkpoint was edited; refusing to resume"
            )


def rebuilt_parts(
    accountant: PrivacyAccountant,
    round_num: int,
    last_released: int,
    round_events: Sequence[SubsampledGaussianEvent],
    old: OldLedgerError | None,
) -> list[tuple[str, int, Ledger]]:
    """The ``(kind, round, released)`` lines of a ledger rebuilt from a checkpoint of ``round_num``.

    The checkpoint's events (``carried``), each round shown after it up to ``last_released``
    (:func:`_released_by`), and what an older ledger (``old``) counts beyond that (``carried``).
    """
    parts: list[tuple[str, int, Ledger]] = [("carried", round_num, accountant.ledger)]
    for r in range(round_num + 1, last_released + 1):
        parts.append(("round", r, _released_by(round_events, r)))
    total = sum(count_events(released) for _, _, released in parts)
    if old is not None and old.max_events > total and round_events:
        extra = ((round_events[0], old.max_events - total),)
        parts.append(("carried", max(round_num, last_released, 1), extra))
    return parts


class LedgerConversion:
    """The conversion of :class:`~fedprivopt.simulation.ledger.RunLedger` (a mixin).

    :meth:`convert` writes through the ledger's ``header_for`` and ``write_converted``.
    """

    @staticmethod
    def check_carried(
        config, accountant: PrivacyAccountant, round_num: int, checkpoint: str,
        rows: Sequence[dict[str, Any]],
    ) -> None:  # fmt: skip
        """Raise unless checkpoint ``checkpoint`` accounts every ε its rounds' rows reported.

        ``accountant`` holds the checkpoint's state, ``round_num`` its round: a ledger rebuilt
        from it (:meth:`convert`) must not compose to less than a row of a round up to it
        reported, or the checkpoint was edited.
        """
        configured = PrivacyAccountant(accountant=config.strategy.accountant)
        expected = {key: getattr(configured, key) for key in ACCOUNTANT_FIELDS}
        check_accountant_kind(accountant, expected, checkpoint, CONFIG_FILE)
        if not config.strategy.private:
            return
        claimed = accountant.epsilon(config.strategy.delta)
        for row in rows:
            eps = row.get("epsilon")
            if (
                isinstance(eps, (int, float))
                and row.get("round", math.inf) <= round_num
                and eps > claimed * (1 + 1e-9)
            ):
                raise ValueError(
                    f"{checkpoint} accounts epsilon {claimed:.6g} at round {round_num}, but "
                    f"{METRICS_FILE} shows epsilon {eps:.6g} at round {row['round']}: the "
                    "checkpoint was edited; refusing to resume"
                )

    @staticmethod
    def check_rebuilt(
        config, accountant: PrivacyAccountant, parts: Sequence[tuple[str, int, Ledger]],
        checkpoint: str, reported: Sequence[tuple[str, float]],
    ) -> None:  # fmt: skip
        """Raise unless the ledger rebuilt as ``parts`` composes to every ε the run reported.

        ``parts``: :func:`rebuilt_parts` of the checkpoint's ``accountant``; ``reported``:
        :func:`~fedprivopt.simulation.files.stated_epsilons` of the rows and the summary. The
        rebuilt ledger charges every round they show, so one that composes to less was built
        from an edited checkpoint or configuration. Thirty-ninth review of issue 15 (ledger,
        finding 2): :meth:`check_carried` compares only the rows of rounds up to the
        checkpoint; a checkpoint of round 3 whose events and configuration were set to σ 50
        (digest recomputed), ``config.toml`` to match and the ledger deleted resumed, rc 0,
        ε 0.0466 where the row of round 5 (``eval-every = 5``) and the summary had reported
        17.28, and the resume dropped that row.
        """
        if not config.strategy.private or not reported:
            return
        where, most = max(reported, key=lambda item: item[1])
        have = compose_epsilon(
            merge_ledger(p for _, _, released in parts for p in released),
            config.strategy.delta,
            accountant=accountant.accountant,
            pld_discretization=accountant.pld_discretization,
            prv_eps_error=accountant.prv_eps_error,
        )
        if most > have * (1 + 1e-6):
            raise ValueError(
                f"{checkpoint} and the rounds released after it rebuild a privacy ledger (its "
                f"{LEDGER_FILE} is missing or of an earlier version) that composes to epsilon "
                f"{have:.6g}, but {where} reported epsilon {most:.6g}: the checkpoint or "
                f"{CONFIG_FILE} was edited; refusing to resume"
            )

    @classmethod
    def check_recorded(
        cls, out: Path, state: Mapping[str, Any], checkpoint: str, config,
        data: Mapping[str, Any] | None, tuning_plan: str | None = None,
    ) -> str | None:  # fmt: skip
        """Raise unless ``config`` and ``data`` are what checkpoint ``checkpoint`` recorded.

        A ledger rebuilt from a checkpoint (:meth:`convert`) takes its header from the
        configuration as it now is. A checkpoint of this version holds a copy of the run's
        ledger header (``ledger_header``, absent in earlier versions' checkpoints, which are not
        checked), compared here as :meth:`~fedprivopt.simulation.ledger.RunLedger.check_config`
        and ``check_data`` compare a ledger's. Fortieth review of issue 15 (ledger, finding 3):
        a seeded tree run (restart 3, 2 rounds) whose ledger was deleted and whose
        ``task-params.seed`` was edited 0 → 1 in ``config.toml`` resumed, rc 0, round 3 of the
        restart period on other data at its users' indices (accuracy 0.59 → 0.51), where the
        same edit beside the ledger is refused. A trial's ledger deleted and the trial resumed
        by ``simulate --resume`` was rebuilt naming no tuning plan, and ``tune`` then refused
        the genuine trial as not its plan's (ledger, finding 4).

        Returns
        -------
        str or None
            The tuning plan the recorded header names (a trial of ``fedprivopt tune``), for the
            rebuilt header to name too; ``tuning_plan`` (a resume by ``tune``) must be it.
        """
        header = state.get(LEDGER_HEADER)
        if header is None:
            return tuning_plan
        try:
            header, _ = parse_lines(out / checkpoint, [json_line(header)])
            recorded = cls(out / LEDGER_FILE, header, [])  # type: ignore[call-arg]
            recorded.check_config(config, str(out / CONFIG_FILE))
            recorded.check_data(data, str(out / CONFIG_FILE))
            if tuning_plan is not None:
                recorded.check_tuning_plan(tuning_plan)
        except (OldLedgerError, ValueError) as exc:
            raise ValueError(
                f"{exc} (the ledger header as {checkpoint} recorded it: {LEDGER_FILE} is missing)"
            ) from None
        return recorded.header.get("tuning_plan")

    @classmethod
    def convert(
        cls,
        out: Path,
        config,
        accountant: PrivacyAccountant,
        *,
        round_num: int,
        checkpoint: str,
        rows: Sequence[dict[str, Any]],
        last_released: int,
        round_events: Sequence[SubsampledGaussianEvent],
        old: OldLedgerError | None,
        data: Mapping[str, Any] | None = None,
        tuning_plan: str | None = None,
    ) -> RunLedger:
        """A ledger for a run whose ledger is missing or of an earlier version, conservatively.

        Needs a readable checkpoint (``accountant`` holds its state, ``round_num`` its round):
        its events are carried over (checked against the ε the metrics rows of rounds up to it
        report by :meth:`check_carried`: a checkpoint claiming less is refused), every round the
        rows or the summary show after it is charged ``round_events`` (under tree aggregation only
        a restart period's first round), and whatever count an
        older ledger claims beyond that total is charged too. The result replaces the old file,
        which is kept as ``privacy_ledger.jsonl.v1``; nothing of it can be replayed, so the
        rounds after the checkpoint are charged again when they are redone. ``tuning_plan``: a
        trial's, resumed by ``tune`` under that plan, recorded as :meth:`create` records it
        (nineteenth review of issue 15, finding 9).
        """
        cls.check_carried(config, accountant, round_num, checkpoint, rows)
        parts = rebuilt_parts(accountant, round_num, last_released, round_events, old)
        cls.check_rebuilt(config, accountant, parts, checkpoint, stated_epsilons(rows, None))
        header = cls.header_for(config, accountant, data, tuning_plan)
        lines: list[dict[str, Any]] = []
        total = 0
        source = "converted from an earlier version's ledger" if old else "no ledger was found"
        for kind, round_, released in parts:
            total += count_events(released)
            extra: dict[str, Any] = {"params_sha256": None}
            if kind == "carried":
                first = not lines
                extra = {"source": f"{checkpoint} ({source})" if first else
                         f"counted by the earlier version's {LEDGER_FILE}"}  # fmt: skip
            lines.append({"kind": kind, "round": round_, "events": total,
                          "accountant": accountant.accountant,
                          "released": released_json(released), **extra})  # fmt: skip
        _log.warning(
            "%s: %s; rebuilt from %s and the metrics: %d privacy events charged",
            out / LEDGER_FILE,
            source,
            checkpoint,
            total,
        )
        return cls.write_converted(out, header, lines)
