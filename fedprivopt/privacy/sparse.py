"""Row-sparse flat updates: a user's update that is zero outside a few rows.

A flat vector of length ``rows x width`` viewed as a ``(rows, width)`` matrix is *row-sparse* when
only a few of its rows are nonzero. A bag-of-words model's user update is: local training only
changes the weight rows of the words the user wrote (and the bias, the last row of the flat
layout of :class:`~fedprivopt.models.tag_prediction.BagOfWordsLogisticRegression`). Keeping
only those rows saves the engines from materializing, clipping and summing a dense vector per user
(20 MB each at 5,000,500 parameters).

:class:`RowSparse` is accepted wherever the server takes a user's update
(:class:`~fedprivopt.privacy.aggregate.NoisyMeanAggregator`): it is checked, re-clipped and summed
exactly like the dense vector it stands for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RowSparse"]


@dataclass(frozen=True)
class RowSparse:
    """A flat vector of length ``length`` that is zero outside rows ``rows`` of width ``width``.

    Attributes
    ----------
    rows : torch.Tensor
        ``int64`` ``(r,)`` strictly increasing row indices in ``[0, length / width)``.
    values : torch.Tensor
        ``(r, width)`` floating values of those rows.
    length : int
        Length of the dense flat vector (a multiple of ``width``).
    """

    rows: torch.Tensor
    values: torch.Tensor
    length: int

    @property
    def width(self) -> int:
        """Row width (entries per row)."""
        return int(self.values.shape[1])

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the values (and of the dense vector)."""
        return self.values.dtype

    def problem(self, dim: int, dtype: torch.dtype) -> str | None:
        """Why this is not a valid update of a ``dim``-long ``dtype`` model (``None`` if valid)."""
        rows, values = self.rows, self.values
        if not isinstance(rows, torch.Tensor) or not isinstance(values, torch.Tensor):
            return "row-sparse update without tensors"
        if values.dim() != 2 or values.shape[1] < 1:
            return f"row-sparse values of shape {tuple(values.shape)} (expected (rows, width))"
        if int(self.length) != dim:
            return f"row-sparse length {self.length} != {dim}"
        if dim % values.shape[1]:
            return f"row width {values.shape[1]} does not divide the model length {dim}"
        if values.dtype != dtype:
            return f"dtype {values.dtype} != {dtype}"
        if rows.dtype != torch.int64 or rows.dim() != 1 or rows.numel() != values.shape[0]:
            return "row-sparse rows must be int64 (r,) with one row of values each"
        if rows.numel():
            if int(rows[0]) < 0 or int(rows[-1]) >= dim // values.shape[1]:
                return "row-sparse row index out of range"
            if rows.numel() > 1 and not bool((rows[1:] > rows[:-1]).all()):
                return "row-sparse rows must be strictly increasing"
        return None

    def to_dense(self) -> torch.Tensor:
        """The dense flat vector."""
        out = torch.zeros(self.length, dtype=self.values.dtype, device=self.values.device)
        out.view(-1, self.width).index_copy_(0, self.rows.to(out.device), self.values)
        return out

    def add_to(self, total: torch.Tensor, alpha: float = 1.0) -> None:
        """``total += alpha * self`` in place (``total`` is the dense flat vector)."""
        values = self.values.to(total.device)
        if alpha != 1.0:
            values = values * alpha
        total.view(-1, self.width).index_add_(0, self.rows.to(total.device), values)

    def to(self, device: torch.device | str) -> RowSparse:
        """A copy on ``device``."""
        return RowSparse(self.rows.to(device), self.values.to(device), self.length)
