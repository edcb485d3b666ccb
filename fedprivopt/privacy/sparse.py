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

import math
from dataclasses import dataclass

import torch

from fedprivopt.core.checks import check_int

__all__ = [
    "RowSparse",
    "RowSparseBatch",
    "segment_norms_checked",
    "segment_scale",
    "segment_sq_norms",
]


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

    def __post_init__(self) -> None:
        # a short API review of issue 15: a length of "6" or 6.5 was read as 6 and None or NaN
        # raised from int() inside the aggregator; a layout that does not fit the model is the
        # aggregator's to reject (:meth:`problem`)
        _check_tensors(rows=self.rows, values=self.values)
        object.__setattr__(self, "length", check_int("length", self.length, 0))

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
        layout = _layout_problem(rows, values, self.length, dim, dtype)
        if layout is not None:
            return layout
        alone = torch.tensor([0, rows.numel()], dtype=torch.int64)
        return RowSparseBatch((0,), rows, values, alone, self.length).user_problems(dim)[0]

    def to_dense(self) -> torch.Tensor:
        """The dense flat vector."""
        out = torch.zeros(self.length, dtype=self.values.dtype, device=self.values.device)
        out.view(-1, self.width).index_copy_(0, self.rows.to(out.device), self.values)
        return out

    def add_to(self, total: torch.Tensor, alpha: float = 1.0) -> None:
        """``total += alpha * self`` in place (``total`` is the dense flat vector).

        The values are cast to ``total``'s dtype first (the aggregator may sum in float64) and
        scaled there.
        """
        values = self.values.to(device=total.device, dtype=total.dtype)
        if alpha != 1.0:
            values = values * alpha
        total.view(-1, self.width).index_add_(0, self.rows.to(total.device), values)

    def to(self, device: torch.device | str) -> RowSparse:
        """A copy on ``device``."""
        return RowSparse(self.rows.to(device), self.values.to(device), self.length)


def _check_tensors(**tensors: object) -> None:
    """``ValueError`` naming the first argument that is not a ``torch.Tensor``."""
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")


def _check_segments(values: object, row_ptr: object) -> None:
    """``ValueError`` unless ``row_ptr`` cuts the rows of the 2-D float ``values`` in segments.

    A short API review of issue 15: a list ended in ``AttributeError``, and offsets past the
    rows in torch's ``RuntimeError`` ("allocated size does not match required size").
    """
    _check_tensors(values=values, row_ptr=row_ptr)
    if values.dim() != 2 or not values.dtype.is_floating_point:
        raise ValueError(
            f"values must be a floating (rows, width) tensor, got {values.dtype} of shape "
            f"{tuple(values.shape)}"
        )
    _check_counts("row_ptr", row_ptr, int(values.shape[0]), offsets=True)


def _check_counts(name: str, counts: torch.Tensor, rows: int, *, offsets: bool) -> None:
    """``counts`` (or, with ``offsets``, the offsets ``0 … rows``) of segments of ``rows`` rows."""
    ok = counts.dtype == torch.int64 and counts.dim() == 1
    if ok and offsets:
        ok = counts.numel() >= 1 and int(counts[0]) == 0 and int(counts[-1]) == rows
        steps = counts[1:] - counts[:-1]
    else:
        steps = counts
        ok = ok and int(counts.sum()) == rows
    if not (ok and not bool((steps < 0).any())):
        what = "offsets from 0 to" if offsets else "non-negative counts summing to"
        raise ValueError(f"{name} must be an int64 1-D tensor of {what} the {rows} rows")


def dense_problem(tensor: torch.Tensor) -> str | None:
    """Why ``tensor`` cannot be read as an update's entries (``None`` if it can).

    Thirty-ninth review of issue 15 (mechanisms 1): an update on the meta device (dense, or a
    ``RowSparse`` of meta rows or values) and a ``RowSparse`` of sparse values made the whole
    aggregation raise torch's ``NotImplementedError`` ("Cannot copy out of meta tensor"), and a
    sparse COO update was rejected as containing NaN or Inf; each is now rejected alone, with
    this reason. Follow-up: a nested tensor (``torch.nested.nested_tensor``, whose layout is
    ``torch.strided``) passed that check and raised torch's ``RuntimeError`` ("NestedTensorImpl
    doesn't support sizes") out of the whole aggregation; it is rejected alone too.
    """
    if tensor.is_nested:
        return "a dense (strided) tensor is needed, got a nested tensor"
    if tensor.layout != torch.strided:
        return f"a dense (strided) tensor is needed, got layout {tensor.layout}"
    if tensor.device.type == "meta":
        return "a tensor on the meta device holds no data"
    return None


def _layout_problem(
    rows: object, values: object, length: int, dim: int, dtype: torch.dtype
) -> str | None:
    """What is wrong with the tensors, shapes and dtypes of row-sparse ``(rows, values)``."""
    if not isinstance(rows, torch.Tensor) or not isinstance(values, torch.Tensor):
        return "row-sparse update without tensors"
    for name, tensor in (("rows", rows), ("values", values)):
        form = dense_problem(tensor)
        if form is not None:
            return f"row-sparse {name}: {form}"
    if values.dim() != 2 or values.shape[1] < 1:
        return f"row-sparse values of shape {tuple(values.shape)} (expected (rows, width))"
    if length != dim:
        return f"row-sparse length {length} != {dim}"
    if dim % values.shape[1]:
        return f"row width {values.shape[1]} does not divide the model length {dim}"
    if values.dtype != dtype:
        return f"dtype {values.dtype} != {dtype}"
    if rows.dtype != torch.int64 or rows.dim() != 1 or rows.numel() != values.shape[0]:
        return "row-sparse rows must be int64 (r,) with one row of values each"
    return None


#: float32 entries copied to float64 at a time on the CPU (2 MB of float64): 45,000 rows of 500,
#: one thread, 8.7 ms against 12.4 ms for blocks of 2^15 entries (``benchmarks/NOTES.md``, 18)
_ROW_CHUNK = 1 << 18


def _row_sq64(values: torch.Tensor) -> torch.Tensor:
    """Float64 squared L2 norm of each row of ``values`` (squares and sums in float64).

    On the CPU a float32 matrix is copied to float64 a block of about ``2^18`` entries at a
    time into one reused buffer, squared there (exactly: a float32's square fits a float64) and
    summed along the rows; one cast of the whole matrix took 55 ms instead of 7 ms for 20,000
    rows of 500 (float32 row norms: 1 ms, not accurate enough; see :func:`segment_sq_norms`).
    """
    if values.dtype == torch.float64 or values.device.type != "cpu":
        return torch.linalg.vector_norm(values, dim=1, dtype=torch.float64).square_()
    rows, width = int(values.shape[0]), int(values.shape[1])
    out = torch.empty(rows, dtype=torch.float64)
    per = max(1, _ROW_CHUNK // max(1, width))
    buf = torch.empty(min(per, rows), width, dtype=torch.float64)
    start = 0
    for block in values.split(per):
        n = int(block.shape[0])
        wide = buf[:n]
        wide.copy_(block)
        wide.mul_(wide)
        torch.sum(wide, dim=1, out=out[start : start + n])
        start += n
    return out


def segment_sq_norms(values: torch.Tensor, row_ptr: torch.Tensor) -> torch.Tensor:
    """Squared L2 norms of consecutive row segments of ``values``, in float64.

    Segment ``i`` is rows ``row_ptr[i]:row_ptr[i + 1]`` of the ``(R, width)`` matrix ``values``.
    Each row's squared norm is accumulated in float64 (squares of float32 entries are exact
    there) and summed per segment in float64, so a segment of ``n`` entries has relative error
    at most ``n·2^-53``, the bound of :func:`~fedprivopt.privacy.clip.l2_norm` that the
    aggregator's clip margin relies on, and is the same whichever segments share the call (the
    sum runs over each segment's rows in order). (Row norms taken in float32 were off by up to
    2.8e-5 relative on a 2M-wide row, more than the margin: a re-clipped update exceeded ``C``.)
    NaN or Inf entries (or squares that overflow) give a non-finite result for their segment.
    """
    _check_segments(values, row_ptr)
    rows = int(values.shape[0])
    counts = (row_ptr[1:] - row_ptr[:-1]).to(values.device)
    out = torch.zeros(counts.numel(), dtype=torch.float64, device=values.device)
    if rows:
        row_sq = _row_sq64(values)
        owner = torch.repeat_interleave(
            torch.arange(counts.numel(), device=values.device), counts, output_size=rows
        )
        out.index_add_(0, owner, row_sq)
    return out


@dataclass(frozen=True)
class RowSparseBatch:
    """The row-sparse updates of several users, stored back to back.

    User ``users[i]``'s update is the :class:`RowSparse` of ``rows[row_ptr[i]:row_ptr[i+1]]`` and
    the same rows of ``values``. The fast engine hands a chunk of users to the aggregator this
    way, so that checking, re-clipping and summing them takes a few tensor operations instead of
    a few per user; the aggregator treats every user of a batch exactly as if its update had come
    alone (each is checked and re-clipped on its own, and one bad user rejects only itself).

    Attributes
    ----------
    users : tuple of int
        The users, in order.
    rows : torch.Tensor
        ``int64`` ``(R,)``: each user's row indices (strictly increasing within a user).
    values : torch.Tensor
        ``(R, width)`` floating values of those rows.
    row_ptr : torch.Tensor
        ``int64`` ``(len(users) + 1,)`` offsets of each user's rows (``0 ... R``, nondecreasing).
    length : int
        Length of each user's dense flat update.
    norms : tuple of float, optional
        Each user's update norm *before* the trainer clipped it (``inf`` if it diverged), from
        which adaptive clipping's bits are computed; the aggregator does not read it.
    """

    users: tuple[int, ...]
    rows: torch.Tensor
    values: torch.Tensor
    row_ptr: torch.Tensor
    length: int
    norms: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        # a short API review of issue 15: users of None or "ab" raised from int() inside the
        # aggregator; offsets that do not fit are the aggregator's to reject (:meth:`problem`)
        _check_tensors(rows=self.rows, values=self.values, row_ptr=self.row_ptr)
        if not isinstance(self.users, (tuple, list)):
            raise ValueError(f"users must be a tuple of int, got {type(self.users).__name__}")
        users = tuple(check_int(f"users[{i}]", u) for i, u in enumerate(self.users))
        object.__setattr__(self, "users", users)
        object.__setattr__(self, "length", check_int("length", self.length, 0))

    def __len__(self) -> int:
        return len(self.users)

    def update(self, i: int) -> RowSparse:
        """User ``users[i]``'s update (views into the batch's tensors)."""
        i = check_int("i", i, 0, len(self.users) - 1)  # an IndexError before (API review)
        a, b = int(self.row_ptr[i]), int(self.row_ptr[i + 1])
        return RowSparse(self.rows[a:b], self.values[a:b], self.length)

    def split(self) -> list[tuple[int, RowSparse]]:
        """``(user, update)`` of every user, each update with its own copy of the values."""
        out = []
        for i, user in enumerate(self.users):
            u = self.update(i)
            out.append((user, RowSparse(u.rows.clone(), u.values.clone(), u.length)))
        return out

    def clone(self) -> RowSparseBatch:
        """A copy that owns its tensors (a trainer may reuse the memory of the one it yields)."""
        return RowSparseBatch(
            self.users,
            self.rows.clone(),
            self.values.clone(),
            self.row_ptr.clone(),
            self.length,
            self.norms,
        )

    def problem(self, dim: int, dtype: torch.dtype) -> str | None:
        """Why the batch as a whole is malformed (``None`` if its layout is valid).

        Checks what every user shares (tensors, shapes, dtype, width, offsets). Each user's own
        rows are checked by :meth:`user_problems`.
        """
        rows, values, ptr = self.rows, self.values, self.row_ptr
        layout = _layout_problem(rows, values, self.length, dim, dtype)
        if layout is not None:
            return layout
        if (
            not isinstance(ptr, torch.Tensor)
            or ptr.dtype != torch.int64
            or ptr.dim() != 1
            or ptr.numel() != len(self.users) + 1
        ):
            return "row-sparse batch offsets must be an int64 (users + 1,) tensor"
        if int(ptr[0]) != 0 or int(ptr[-1]) != rows.numel() or bool((ptr[1:] < ptr[:-1]).any()):
            return "row-sparse batch offsets must run from 0 to the row count, nondecreasing"
        return None

    def user_problems(self, dim: int) -> list[str | None]:
        """Per user: why its rows are invalid (out of range, not strictly increasing) or ``None``.

        Call after :meth:`problem` returned ``None``.
        """
        rows, ptr = self.rows, self.row_ptr
        n = len(self.users)
        if not rows.numel():
            return [None] * n
        owner = torch.repeat_interleave(torch.arange(n), (ptr[1:] - ptr[:-1]).cpu())
        rows = rows.cpu()
        out_of_range = (rows < 0) | (rows >= dim // self.values.shape[1])
        first = torch.zeros(rows.numel(), dtype=torch.bool)
        first[ptr[:-1][ptr[:-1] < ptr[1:]].cpu()] = True
        not_increasing = torch.zeros_like(first)
        not_increasing[1:] = rows[1:] <= rows[:-1]
        not_increasing &= ~first
        bad_range = torch.zeros(n, dtype=torch.bool).index_put_(
            (owner[out_of_range],), torch.tensor(True)
        )
        bad_order = torch.zeros(n, dtype=torch.bool).index_put_(
            (owner[not_increasing],), torch.tensor(True)
        )
        return [
            "row-sparse row index out of range"
            if r
            else "row-sparse rows must be strictly increasing"
            if o
            else None
            for r, o in zip(bad_range.tolist(), bad_order.tolist(), strict=True)
        ]


def segment_scale(factors: list[float], counts: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Each segment's factor over its ``counts`` rows: a ``(rows, 1)`` column to scale ``like``.

    In ``like``'s dtype: a Python float multiplies a float32 tensor in float32 too, so each
    segment is scaled exactly as a lone ``update * factor`` would be.
    """
    _check_tensors(counts=counts, like=like)
    _check_counts("counts", counts, int(like.shape[0]) if like.dim() else -1, offsets=False)
    if len(factors) != counts.numel():
        raise ValueError(f"factors must hold one factor per segment ({counts.numel()})")
    column = torch.repeat_interleave(
        torch.tensor(factors, dtype=like.dtype), counts.cpu(), output_size=int(like.shape[0])
    )
    return column.to(like.device)[:, None]


def segment_norms_checked(values: torch.Tensor, row_ptr: torch.Tensor) -> list[float | None]:
    """L2 norm of each row segment of ``values``; ``None`` for a segment holding NaN or Inf.

    Norms as :func:`segment_sq_norms` measures them. A segment whose squares overflow, or whose
    float32 norm is below 1e-15 (squares lose precision, or underflow to 0), is measured again
    on its own by :func:`~fedprivopt.privacy.clip.vector_norm_checked`, as a lone update would
    be.
    """
    from fedprivopt.privacy.clip import vector_norm_checked

    norms = segment_sq_norms(values, row_ptr).sqrt_().tolist()
    tiny = 1e-15 if values.dtype != torch.float64 else 0.0
    for i, norm in enumerate(norms):
        if math.isfinite(norm) and not norm < tiny:
            continue
        a, b = int(row_ptr[i]), int(row_ptr[i + 1])
        try:
            norms[i] = vector_norm_checked(values[a:b])
        except ValueError:
            norms[i] = None
    return norms
