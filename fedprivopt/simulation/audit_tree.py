"""The checks of a tree-aggregation run's files that ``--resume`` makes (split from ``audit``).

:func:`check_participants`: a checkpoint's tree participation ledger must be what its rounds
drew; :func:`refuse_secure_tree_redo`: a secure tree run cannot redo released rounds;
:func:`secure_tree_redo`: that refusal's reason for the line that reports an interruption.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fedprivopt.privacy.tree import tree_position
from fedprivopt.simulation.checkpoint import newest_checkpoint
from fedprivopt.simulation.config import RunConfig, load_config
from fedprivopt.simulation.files import CONFIG_FILE, METRICS_FILE
from fedprivopt.simulation.ledger import RunLedger
from fedprivopt.strategies.core import ServerAlgorithm

__all__ = ["check_participants", "refuse_secure_tree_redo", "secure_tree_redo"]


def check_participants(
    alg: ServerAlgorithm, rows: list[dict[str, Any]], name: str, recorded: bool = False
) -> None:
    """Raise if checkpoint ``name``'s tree participation ledger is not what its rounds drew.

    Fourteenth review of issue 15: a checkpoint whose participants were emptied (digest
    recomputed) resumed and drew users of the period again. Each round's ``cohort_size`` row
    is the number of users it checked in, so the restored period must hold their sum over the
    period's rounds up to the checkpoint (in secure mode too, and in a deployment whose
    cohorts came short); rows missing for one of those rounds leave ``step·m``, what every
    simulated round draws. In seeded mode full cohorts must also be the users the seed's
    shuffle gives; in secure mode the shuffle cannot be replayed, so users exchanged for as
    many others are not found (the files carry no secret).

    ``recorded``: the ledger's line of the checkpoint's round records these very participants
    (``participants_sha256``, compared by ``RunLedger.check_participants``). Fortieth review
    follow-up (ledger 1): a genuine run whose cohort came short in a round without a row
    (``eval-every`` above 1) was refused as edited; such a run's count then need only lie
    between its rows' sum and that sum plus ``m`` a missing row.
    """
    cohorts = alg.tree_cohorts
    if cohorts is None or alg.round_num == 0:
        return
    period, step = tree_position(alg.round_num, alg.config.restart_rounds)
    first = alg.round_num - step + 1
    sizes = {
        row["round"]: row["cohort_size"]
        for row in rows
        if first <= row["round"] <= alg.round_num and "cohort_size" in row
    }
    expected = step * cohorts.cohort_size
    source = f"{cohorts.cohort_size} a round"
    if len(sizes) == step and all(isinstance(v, (int, float)) for v in sizes.values()):
        expected, source = int(sum(sizes.values())), f"{METRICS_FILE}'s cohort_size"
    held = len(cohorts.ledger.state_dict()["users"])
    known = [v for v in sizes.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    least = sum(known) if len(known) == len(sizes) else expected
    short = recorded and len(sizes) < step and least <= held < expected
    if held != expected and not short:
        # a genuine run whose cohort came short in a round without a row, with its ledger lost,
        # is refused too: nothing else records the participants (fortieth review follow-up)
        maybe = (
            ", or its cohort came short in a round without a row and its ledger, which would "
            "record the participants, is lost"
            if not recorded and len(sizes) < step and least <= held < expected
            else ""
        )
        raise ValueError(
            f"{name}'s tree participation ledger holds {held} users of restart period {period}, "
            f"but its rounds {first}-{alg.round_num} drew {expected} ({source}): the checkpoint "
            f"was edited{maybe} (resuming it would let users of the period take part again); "
            "refusing to resume"
        )
    full = step * cohorts.cohort_size
    if not alg.config.secure and held == full:
        # seeded: full cohorts are the first step·m users of the period's shuffle, so users
        # exchanged for as many others are found too (a deployment whose cohorts were full
        # while some nodes were missing drew others, and is refused as well)
        # forty-eighth review of issue 15 (memory 4): compared as sorted tensors (iterating them
        # made a tensor a user: 655 bytes each, std::bad_alloc under 4 GB at 10**7 users)
        drawn = cohorts.order(period)[:full].sort().values
        held_users = cohorts.ledger.state_dict()["users"].sort().values
        if not torch.equal(held_users, drawn):
            raise ValueError(
                f"{name}'s tree participation ledger holds other users than the {full} that "
                f"the seed's shuffle gives rounds {first}-{alg.round_num} of restart period "
                f"{period}: the checkpoint was edited (resuming it would let users of the "
                "period take part again); refusing to resume"
            )


def refuse_secure_tree_redo(config: RunConfig, last_released: int, restored: int) -> None:
    """Tree aggregation in secure mode cannot redo released rounds (seventh review, F1).

    A redone round draws a new shuffle and new noise from OS entropy, but the users of the lost
    rounds are not in the restored participation ledger: some take part twice in the period,
    and the lost leaves' noise is drawn again, which one tree event per period does not cover.
    Seeded mode replays the same cohorts and noise, so it resumes.
    """
    s = config.strategy
    if s.private and s.tree and s.secure and last_released > restored:
        raise ValueError(
            f"noise-mechanism = tree with secure = true: rounds {restored + 1}-{last_released} "
            f"were released after the {'checkpoint' if restored else 'start'} this resume "
            "would restart from; redoing them draws new cohorts and noise, so users of the lost "
            "rounds could take part twice in a restart period, which the accounting does not "
            "cover: refusing to resume (start a new run in another directory)"
        )


def secure_tree_redo(out: Path) -> str | None:
    """Why ``--resume`` of an interrupted ``out`` will be refused for redoing secure tree rounds.

    The check of :func:`~fedprivopt.simulation.audit.audit_run_dir` that an interrupted run can
    trip by itself (released rounds beyond its newest checkpoint), made from ``config.toml``,
    the ledger and the checkpoint alone (no task is built), for the line that reports the
    interruption. ``None`` when that resume is not refused for this reason, or when the files
    cannot tell.
    """
    try:
        config = load_config(out / CONFIG_FILE)
        s = config.strategy
        if not (s.private and s.tree and s.secure):
            return None
        last_released = RunLedger.read(out).last_round
        state, _ = newest_checkpoint(out, {})
        refuse_secure_tree_redo(
            config, last_released, int(state["algorithm"]["round"]) if state else 0
        )
    except ValueError as exc:
        return str(exc)
    except Exception:  # unreadable files: --resume itself says what is wrong
        return None
    return None
