"""What a round asks of its cohorts and what comes back (the types every engine speaks).

:class:`TrainRequest` is what one cohort of a round must do, :data:`Updates` (or
:class:`ReportedUpdates`, with adaptive clipping's bits) what its users sent back, and
:class:`RoundResult` the round's outcome; :func:`each_user_once` checks a streamed cohort's
entries before they are summed, and :func:`refuse_malformed` the forms of what it sent.
:mod:`fedprivopt.strategies.core` re-exports the types.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.received import NON_FINITE
from fedprivopt.privacy.sparse import RowSparseBatch
from fedprivopt.wire import ClientSettings

__all__ = [
    "NON_FINITE",
    "PartialRelease",
    "ReportedUpdates",
    "RoundResult",
    "TrainRequest",
    "Updates",
    "each_user_once",
    "refuse_malformed",
    "same_values",
]


Updates = Mapping[int, Any]


class ReportedUpdates(dict):
    """``{user: update}`` and, in :attr:`clip_bits`, each user's clip-bit report.

    With adaptive clipping every user's reply carries the bit ``[‖Δ‖ ≤ C]`` (or, in
    distributed-noise mode, its noised share); an engine hands the round the updates in this
    form. A reply without a valid report is rejected as a whole (the update is not summed).
    """

    def __init__(self, updates: Mapping[int, Any] = (), *, clip_bits: Mapping[int, Any] = ()):
        super().__init__(updates)
        if not isinstance(clip_bits, (Mapping, tuple, list)):
            # forty-sixth review of issue 15 (flags 5): a train callback's mapping of its own
            # whose clip_bits was a method (def clip_bits(self)) ended in "'method' object is
            # not iterable", naming nothing
            raise TypeError(
                "clip_bits must be a mapping {user: clip-bit report} (a train callback's "
                f"updates.clip_bits), got {type(clip_bits).__name__}"
            )
        self.clip_bits: dict[int, Any] = dict(clip_bits)


@dataclass(frozen=True)
class TrainRequest:
    """What one cohort of a round must do.

    Attributes
    ----------
    round_num : int
        Server round (from 1).
    users : list of int
        Sampled user ids.
    params : torch.Tensor
        Flat parameters the users start from.
    preconditioner : torch.Tensor or None
        Flat vector the clients divide their gradients by (AdaDPS, DP2 adaptive rounds).
    settings : ClientSettings
        How the clients train (:class:`~fedprivopt.wire.ClientSettings`: local training, clip
        norm, noise-share std, seed, secure mode, whether to report private metrics).
    stream : str
        Name of the cohort inside the round (``"train"``, ADADP's ``"train-2"``); clients key
        their randomness by it.
    """

    round_num: int
    users: list[int]
    params: torch.Tensor
    preconditioner: torch.Tensor | None
    settings: ClientSettings
    stream: str = "train"

    def __post_init__(self) -> None:
        # thirty-eighth review of issue 15 (api 1): the request held the algorithm's own model
        # (and DP2's or AdaDPS' preconditioner), so a train callback that trained on it in
        # place (torch.nn.utils.vector_to_parameters makes a model's parameters views of the
        # vector) moved the released model by its users' training, without clipping or noise.
        # A request now holds copies; run_round refuses a cohort that changed them (changed_in).
        object.__setattr__(self, "params", self.params.detach().clone())
        # thirty-ninth review (api 5): the list was the round's own cohort, which its
        # aggregation accepts updates from, so request.users.append(u) summed an unsampled user
        object.__setattr__(self, "users", list(self.users))
        if isinstance(self.preconditioner, torch.Tensor):
            object.__setattr__(self, "preconditioner", self.preconditioner.detach().clone())
        # thirty-ninth review (api 1): a write put back before the check (copy_ of a saved
        # copy after the cohort) leaves the values; the tensors' version counters record it
        object.__setattr__(self, "_versions", self._tensor_versions())

    def _tensor_versions(self) -> tuple[int, int]:
        pre = self.preconditioner
        return self.params._version, pre._version if isinstance(pre, torch.Tensor) else 0

    def changed_in(
        self, params: torch.Tensor, preconditioner: torch.Tensor | None = None
    ) -> str | None:
        """``"params"`` or ``"preconditioner"``: the copy a trainer changed in place, else ``None``.

        ``params`` and ``preconditioner`` are what the request was built from; NaN equals NaN.
        A copy written in place and put back (its version counter moved) is changed too.
        """
        versions = self._tensor_versions()
        for i, (name, ours, given) in enumerate((
            ("params", params, self.params),
            ("preconditioner", preconditioner, self.preconditioner),
        )):  # fmt: skip
            if ours is None or given is None:
                continue
            if versions[i] != self._versions[i] or not same_values(given, ours):
                return name
        return None


def same_values(given: torch.Tensor, ours: torch.Tensor) -> bool:
    """Whether ``given`` holds the values of ``ours`` (the same shape; NaN equals NaN)."""
    return given.shape == ours.shape and (
        torch.equal(given, ours)  # one pass; NaN needs the second look
        or bool(((given == ours) | (given.isnan() & ours.isnan())).all())
    )


@dataclass
class RoundResult:
    """Outcome of one round: new parameters and the round's metrics."""

    round_num: int
    params: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)


PartialRelease = Callable[[int, list[SubsampledGaussianEvent], torch.Tensor], None]
"""``on_partial_release(round_num, events, point)``: see
:class:`~fedprivopt.strategies.core.ServerAlgorithm`."""


def each_user_once(
    entries: Iterable[Any], allowed: set[int], round_num: int, seen: set[int]
) -> Iterator[Any]:
    """``entries`` of a streamed cohort, refused at the first user it yields twice or not asked.

    Thirty-second review of issue 15: a streamed cohort's keys were checked against the round's
    cohort, but not the users its entries then carried. A task's own ``cohort_trainer`` that
    yielded a chunk twice had every user of it summed twice (a sensitivity of 2C under an ε
    accounted for C: 18 updates accepted from a cohort of 9), and one that yielded users it was
    not asked for had them summed without the sampling the accountant assumes. The entries must
    carry each user at most once, in increasing order (the order every engine sums in), and
    only users of ``allowed``; anything else raises ``ValueError`` before the round's noise is
    drawn, so nothing is released. A malformed entry is left to the aggregator, which rejects it
    (then :func:`refuse_malformed`). The users yielded are added to ``seen`` (adaptive clipping
    counts only those).
    """
    last = -1
    for entry in entries:
        if isinstance(entry, RowSparseBatch):
            users = [int(u) for u in entry.users]
        elif (
            isinstance(entry, (tuple, list))
            and len(entry) == 2
            and isinstance(entry[0], numbers.Integral)
            and not isinstance(entry[0], bool)
        ):
            users = [int(entry[0])]
        else:
            yield entry
            continue
        for user in users:
            if user not in allowed or user <= last:
                why = "not in the round's cohort" if user not in allowed else "out of user order"
                raise ValueError(
                    f"round {round_num}'s streamed updates hold user {user} "
                    f"{'twice' if user in seen else why}: a streamed cohort (a task's "
                    "cohort_trainer) must yield each user it was asked for at most once, in "
                    "increasing order"
                )
            last = user
            seen.add(user)
        yield entry


def refuse_malformed(round_num: int, rejected: Mapping[int, str]) -> None:
    """Raise ``ValueError`` when a streamed cohort sent an update of the wrong form.

    ``rejected``: the aggregator's reasons, by user, for a cohort of the fast engine, whose every
    update comes from the run's own trainer (no client can send one). An update rejected for
    its form (a dtype, a length, a layout) is then the task's or the trainer's bug, not a
    hostile client's: the round is refused before its noised mean is used, so nothing is
    released. A NaN or infinite entry (:data:`NON_FINITE`: a user's training diverged) is
    rejected and counted as from any client. Thirty-fifth review of issue 15 (lead, the
    thirty-fourth review's open tasks item): a task's ``cohort_trainer`` returning float64
    updates of a float32 model (or one entry short) had every update rejected, and the run
    released noise-only rounds, charged, to rc 0, saying so only in ``metrics.jsonl``.
    """
    wrong = {int(u): why for u, why in rejected.items() if why != NON_FINITE}
    if wrong:
        user = min(wrong)
        raise ValueError(
            f"round {round_num}: the run's own trainer gave user {user} an update of the wrong "
            f"form ({wrong[user]}; {len(wrong)} of the round's updates so): a bug of the task's "
            "cohort_trainer or model, not a client's; nothing of the round was released"
        )
