"""Updates as the aggregator measures and sums them: plain tensors, parts read once.

Forty-first review of issue 15 (api 1 and its follow-up, privacy 1): an update of a
``torch.Tensor`` subclass with a ``__torch_function__`` of its own, a ``RowSparse`` subclass whose
``add_to`` scales, or an instance carrying its own ``to``/``add_to`` was measured as one vector
and summed as another (the model at 90 where C = 1 over 10 users allows 0.9). :func:`own_update`
rebuilds an update of plain parts read once (no copy of the entries), or says why it cannot;
the strategies' aggregation and :class:`~fedprivopt.privacy.aggregate.NoisyMeanAggregator` call it.
"""

from __future__ import annotations

import torch

from fedprivopt.privacy.clip import PLAIN_TENSORS
from fedprivopt.privacy.sparse import RowSparse, RowSparseBatch, dense_problem

__all__ = ["foreign_tensor", "own_update"]


def _plain(part: object) -> tuple[object, str | None]:
    """``part`` as a fresh plain tensor (a detached alias), or why it cannot be one."""
    if isinstance(part, torch.Tensor) and part.is_nested:  # torch's NestedTensor, a subclass
        return part, dense_problem(part)
    if isinstance(part, torch.Tensor) and type(part) not in PLAIN_TENSORS:
        return part, (
            f"a {type(part).__name__} (a torch.Tensor subclass, whose own operations would "
            "measure its norm): an update must be a plain torch.Tensor"
        )
    # torch.Tensor.detach itself, not an attribute of the instance (api 1's follow-up: a plain
    # tensor whose own .to returned a subclass to the aggregator); no copy of the entries
    return (torch.Tensor.detach(part) if isinstance(part, torch.Tensor) else part), None


def own_update(update: object) -> tuple[object, str | None]:
    """``update`` rebuilt of plain parts the server measures and sums, or why it cannot be.

    Forty-first review of issue 15 (api 1): a ``drive_round`` train callback (or a task's
    ``cohort_trainer``) returning an instance of a ``torch.Tensor`` subclass with a
    ``__torch_function__`` of its own (a tracking or wrapper tensor) had its norm measured by
    that class: an update of norm 200 that reported 0.001 was summed unclipped (the model at 90
    where C = 1 over 10 users allows 0.9), under the charge of a sum of sensitivity C. The
    server measures only plain tensors (and ``torch.nn.Parameter``); the tensors of a
    :class:`~fedprivopt.privacy.sparse.RowSparse` update or batch alike. Follow-up (privacy 1):
    a ``RowSparse`` subclass of one's own (a scale applied in its ``add_to``), or a plain tensor
    or ``RowSparse`` whose instance carried its own ``to`` or ``add_to``, was measured as one
    vector and summed as another (the model at 90 again). The aggregator calls the update's
    methods, so it is given a fresh ``RowSparse``, ``RowSparseBatch`` or tensor of the parts
    read once, and a subclass of the first two is refused (its methods say what it stands for).
    """
    kinds = (RowSparse, RowSparseBatch)
    if isinstance(update, kinds) and type(update) not in kinds:
        base = "RowSparseBatch" if isinstance(update, RowSparseBatch) else "RowSparse"
        return update, (
            f"a {type(update).__name__} (a subclass of {base}, whose own methods would add "
            "other values than the server measures): "
            "an update must be a plain torch.Tensor, RowSparse or RowSparseBatch"
        )
    if not isinstance(update, kinds):
        return _plain(update)
    names = ("rows", "values") + (("row_ptr",) if type(update) is RowSparseBatch else ())
    parts = {}
    for name in names:
        parts[name], reason = _plain(getattr(update, name))
        if reason is not None:
            return update, reason
    try:
        if type(update) is RowSparse:
            return RowSparse(parts["rows"], parts["values"], update.length), None
        return RowSparseBatch(update.users, **parts, length=update.length, norms=update.norms), None
    except ValueError as error:  # a field set past the constructor's checks
        return update, f"a malformed {type(update).__name__}: {error}"


def foreign_tensor(update: object) -> str | None:
    """Why the server cannot measure ``update`` as it is summed (``None``: :func:`own_update`)."""
    return own_update(update)[1]
