"""L2 clipping of a user's whole update.

:func:`clip_l2` never returns a vector whose exact L2 norm exceeds the clip norm ``C``, for any
finite float32 or float64 input and any ``C > 0``. Three facts make that hold:

* the norm is accumulated in float64 (:func:`l2_norm`): squares of float32 entries are exact
  there and a float64 sum of ``n`` non-negative terms has relative error at most ``(n-1)·2^-53``
  in any summation order, so the measured norm comes with a proven error bound. (torch's float32
  reduction is far worse: measured relative error 1.3e-4 on 5M Gaussian entries, which let the
  old float32 clip return norms of 1.00011·C, and 1.0009·C at 20M entries);
* a vector that is not clearly inside the ball is decided exactly (a rational comparison of its
  squared norm with ``C²`` through error-free products and :func:`math.fsum`);
* the scale factor keeps a margin that covers the measurement and the product's rounding where
  both are relative (normal numbers); at extreme magnitudes (entries near the float maximum,
  subnormal factors or results, ``C`` down to the smallest subnormal) the vector is divided by a
  power of two (exact) and every scaled entry is rounded toward zero instead.
"""

from __future__ import annotations

import math
import numbers
import sys
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np
import torch

from fedprivopt.core.checks import as_float, check_int, check_real
from fedprivopt.core.text import shown

__all__ = [
    "MIN_CLIP_NORM",
    "ClipResult",
    "clip_factor",
    "clip_l2",
    "float_at_most",
    "l2_norm",
    "norm_error_bound",
    "refuse_subclass",
    "vector_norm_checked",
]

#: Smallest clip norm ``C`` a DP aggregator accepts (2^-100, about 7.9e-31). Below float32's
#: smallest normal number (1.2e-38) the clipped entries and the clip factor are subnormal and
#: lose the relative precision the factor's margin relies on: at ``C = 1e-42`` a re-clipped
#: update of norm 1 measured 1.0005·C, at ``C = 1e-45`` random updates reached 1.98·C (issue 15).
#: 2^-100 keeps every factor and every entry that matters normal in float32 and bfloat16.
MIN_CLIP_NORM = 2.0**-100


class ClipResult(NamedTuple):
    """Outcome of :func:`clip_l2`.

    Attributes
    ----------
    vector : torch.Tensor
        The clipped vector, same dtype and device as the input.
    norm : float
        L2 norm of the input before clipping.
    clipped : bool
        Whether the input was scaled down (its norm exceeded the clip norm).
    """

    vector: torch.Tensor
    norm: float
    clipped: bool


_CHUNK = 1 << 15  # entries cast to float64 at a time on the CPU (stays in cache)


def _pow2(x: torch.Tensor, exponent: int) -> torch.Tensor:
    """``x · 2^exponent`` in two exact steps (each factor is a normal float64)."""
    first = exponent // 2
    return x * math.ldexp(1.0, first) * math.ldexp(1.0, exponent - first)


def _rescaled_norm(x: torch.Tensor) -> float:
    """L2 norm of a float64 tensor whose squares under- or overflow: divided by ``2^e`` first."""
    peak = float(x.abs().max()) if x.numel() else 0.0
    if peak == 0.0 or not math.isfinite(peak):
        return peak
    exponent = math.frexp(peak)[1]
    norm = float(torch.linalg.vector_norm(_pow2(x, -exponent)))
    try:
        return math.ldexp(norm, exponent)
    except OverflowError:  # the norm of these finite entries exceeds the float range
        return math.inf


def l2_norm(vector: torch.Tensor) -> float:
    """L2 norm of a tensor of any shape, accumulated in float64.

    Float32 (and narrower) entries are squared exactly in float64 and summed in chunks of
    ``2^15`` on the CPU (one full float64 copy would cost more than the rest of an aggregation);
    the relative error is at most ``(n + 1)·2^-53`` for ``n`` entries, and no entry of such a
    tensor can make the sum under- or overflow. Float64 tensors are measured directly, and
    rescaled by a power of two when their squares would under- or overflow. Returns ``inf`` for
    finite float64 entries whose norm exceeds the float range, and NaN/Inf for such entries.
    """
    _check_tensor(vector)
    # forty-third review of issue 15 (mechanisms 4): a subclass measured by its own operations,
    # or an instance carrying its own detach, read 0.001 for 100 entries of 100, and
    # clip_factor's documented recipe v * clip_factor(l2_norm(v), C, ...) left v at norm 1000
    refuse_subclass(vector)
    _check_real_data(vector)
    flat = torch.Tensor.detach(vector).reshape(-1)
    if flat.dtype == torch.float64:
        norm = float(torch.linalg.vector_norm(flat))
        if not (1e-140 < norm < 1e140) and (norm != 0.0 or bool(flat.any())):
            return _rescaled_norm(flat) if math.isfinite(norm) or _finite(flat) else norm
        return norm
    if flat.device.type != "cpu" or flat.numel() <= _CHUNK:
        return float(torch.linalg.vector_norm(flat, dtype=torch.float64))
    parts = torch.stack(
        [torch.linalg.vector_norm(c, dtype=torch.float64) for c in flat.split(_CHUNK)]
    )
    return float(torch.linalg.vector_norm(parts))


def _finite(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all())


def norm_error_bound(numel: int) -> float:
    """A bound on the relative error of :func:`l2_norm` (and the rescaling) for ``numel``.

    Also of :func:`~fedprivopt.privacy.sparse.segment_sq_norms`' square root: both accumulate
    squares in float64, whose sum of ``n`` non-negative terms is within ``(n-1)·2^-53``.
    """
    # a short API review of issue 15: NaN and -1 gave a NaN or negative bound
    return (check_int("numel", numel, 0) + 16) * 2.0**-52


_error_bound = norm_error_bound


def clip_factor(
    norm: float,
    clip_norm: float,
    dtype: torch.dtype = torch.float32,
    *,
    numel: int | None = None,
) -> float:
    """Factor that brings a vector of L2 norm ``norm`` inside the ball of radius ``clip_norm``.

    ``1.0`` when ``norm <= clip_norm``; otherwise a hair below ``clip_norm / norm`` (4 units in the
    last place of ``dtype``), so that rounding in the product cannot leave the scaled vector above
    ``clip_norm``. As real numbers ``factor * norm <= clip_norm`` always holds (a subnormal
    quotient is rounded toward zero). The margin covers the product's rounding only while the
    factor and the scaled entries are normal numbers of ``dtype``: a factor below
    ``torch.finfo(dtype).tiny`` (an update near the float maximum, or a tiny ``C``) must be
    applied to an update first divided by a power of two (as the aggregator does), or use
    :func:`clip_l2`, which is exact at every magnitude.

    ``norm`` is taken as exact unless ``numel`` (the vector's length) is given: then the factor
    aims at ``clip_norm·(1 − 2·err)`` (``err`` = :func:`norm_error_bound` of ``numel``), which
    covers a norm measured by :func:`l2_norm`. Thirty-eighth review of issue 15: the 4-ulp margin
    alone does not cover it for float64 (a float64 vector of 10**6 entries, 256 of 1.0 and the
    rest 2^-27.6, times ``clip_factor(l2_norm(v), 1.0, torch.float64)`` had exact norm
    ``1 + 4.6e-14``), where this docstring said it did.
    """
    # a short API review of issue 15: a NaN norm gave a NaN factor, a negative one 1.0, a NaN
    # or negative clip_norm a NaN or negative factor (a reflected update)
    clip_norm_given = clip_norm
    if not isinstance(norm, numbers.Real) or isinstance(norm, bool) or not norm >= 0:
        raise ValueError(f"norm must be a number in [0, inf], got {shown(norm)}")
    norm = as_float(norm)
    clip_norm = check_real("clip_norm", clip_norm, low=0.0, low_open=True)
    if not isinstance(clip_norm_given, float):  # a Fraction, a big int: not rounded up
        clip_norm = min(clip_norm, float_at_most(clip_norm_given))
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype, got {shown(dtype)}")
    if numel is not None:  # the exact norm is at most norm·(1 + err): aim at C·(1 − 2err)
        clip_norm = clip_norm * (1.0 - 2.0 * norm_error_bound(numel))
    if norm <= clip_norm:
        return 1.0
    margin = 1.0 - 4.0 * torch.finfo(dtype).eps if dtype.is_floating_point else 1.0
    quotient = clip_norm / norm
    if quotient < sys.float_info.min:  # subnormal: its rounding error is not relative
        quotient = math.nextafter(quotient, 0.0)
    return quotient * margin


def vector_norm_checked(vector: torch.Tensor) -> float:
    """:func:`l2_norm`, raising ``ValueError`` if ``vector`` contains NaN or Inf.

    Finite float64 entries whose norm exceeds the float range give ``inf``.
    """
    norm = l2_norm(vector)
    if not math.isfinite(norm) and not _finite(torch.Tensor.detach(vector)):
        raise ValueError("vector contains NaN or Inf; it cannot be clipped")
    return norm


# -- exact decisions and scaling at any magnitude --------------------------------------------


_SPLIT = 134217729.0  # 2^27 + 1: Veltkamp's split of a float64 into two halves
_EXACT_MAX = 1 << 20  # entries up to which a boundary case is decided exactly (~100 MB of terms)


def _square_terms(a: torch.Tensor) -> torch.Tensor:
    """Float64 terms whose exact sum is ``Σ a²`` (Dekker's error-free products; ``a >= 2^-450``)."""
    t = a * _SPLIT
    hi = t - (t - a)
    lo = a - hi
    return torch.cat([hi * hi, 2.0 * hi * lo, lo * lo])


def _scaled64(vector: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(y, e)`` with ``x = 2^e·y`` and ``max|y|`` in ``[0.5, 1)``, ``y`` in float64 on the CPU."""
    x = vector.detach().reshape(-1).to(device="cpu", dtype=torch.float64)
    peak = float(x.abs().max()) if x.numel() else 0.0
    if peak == 0.0:
        return x, 0
    exponent = math.frexp(peak)[1]
    return _pow2(x, -exponent), exponent


def _exceeds(vector: torch.Tensor, clip_norm: float) -> bool:
    """Whether the exact L2 norm of ``vector`` exceeds ``clip_norm`` (``True`` when unsure).

    After the power-of-two scaling of :func:`_scaled64`, entries of at least ``2^-450`` are
    squared exactly (each square as three float64 terms) and compared with ``C²`` by
    :func:`math.fsum`, whose correctly rounded result has the sign of the exact sum. Nonzero
    entries below ``2^-450`` (and those rounded by the scaling) count as ``2^-900`` each: an upper
    bound; zeros count as nothing, so a vector of norm exactly ``C`` with zeros is not clipped.
    Vectors of more than :data:`_EXACT_MAX` entries (whose norm lies within ``~n·2^-52`` of ``C``,
    by chance about never) are reported as exceeding: scaling them costs that relative margin.
    """
    if vector.numel() > _EXACT_MAX:
        return True
    y, exponent = _scaled64(vector)
    if exponent == 0 and not bool(y.any()):
        return False
    try:
        c = math.ldexp(clip_norm, -exponent)
    except OverflowError:
        return False
    if c < 2.0**-450:  # ‖y‖ >= 1/2
        return True
    if c > 2.0**450:  # ‖y‖ <= √n
        return False
    a = y.abs()
    nonzero = vector.detach().reshape(-1).to(device="cpu", dtype=torch.float64) != 0
    small = (a < 2.0**-450) & nonzero  # an exact zero adds nothing (it used to add 2^-900)
    terms = _square_terms(a[~small]).tolist()
    terms.append(int(small.sum()) * 2.0**-900)
    terms.extend(-t for t in _square_terms(torch.tensor([c], dtype=torch.float64)).tolist())
    return math.fsum(terms) > 0.0


def _toward_zero(exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``exact`` (float64) in ``dtype``, every entry rounded toward zero."""
    if dtype == torch.float64:
        return exact
    out = exact.to(dtype)
    grew = out.double().abs() > exact.abs()
    if bool(grew.any()):
        out = torch.where(grew, torch.nextafter(out, torch.zeros_like(out)), out)
    return out


def _scaled_exact(vector: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """``vector`` scaled to norm at most ``clip_norm``, at any magnitude (slow, rare).

    ``y = x / 2^e`` is measured in float64, scaled by ``(1 - m)/‖y‖`` and then by ``C``, each
    product stepped one unit toward zero (so it is at most its exact value, subnormal or not),
    and cast to the input's dtype rounding toward zero. ``m`` covers the measurement error.
    """
    y, _ = _scaled64(vector)
    norm_y = float(torch.linalg.vector_norm(y))
    margin = 2.0 * _error_bound(y.numel()) + 8.0 * 2.0**-53
    zero = torch.zeros_like(y)
    out = torch.nextafter(y * ((1.0 - margin) / norm_y), zero)
    out = torch.nextafter(out * clip_norm, zero)
    return _toward_zero(out, vector.dtype).reshape(vector.shape).to(vector.device)


# Smallest C for which the fast path's subnormal rounding (absolute, at most half the smallest
# subnormal per entry) stays inside its margin, for up to 2^40 entries.
_FAST_MIN_C = {torch.float32: 2.0**-100, torch.float64: 2.0**-960}


def _scaled_fast(vector: torch.Tensor, norm: float, clip_norm: float) -> torch.Tensor | None:
    """``vector · f`` with a margin covering every rounding, or ``None`` where it cannot.

    With ``f = C/norm · (1 - 8u)(1 - err)`` (``u`` the unit roundoff of the dtype, ``err`` the
    bound on ``norm``'s relative error), each product is at most ``|x_i|·f·(1+u)²`` while the
    factor and the result are normal, and the subnormal results' absolute rounding is below the
    margin for ``C`` at least :data:`_FAST_MIN_C`: the exact norm stays at most ``C``.
    """
    dtype = vector.dtype
    numel = vector.numel()
    if dtype not in _FAST_MIN_C or clip_norm < _FAST_MIN_C[dtype] or numel > 2**40:
        return None
    if not (0.0 < norm < math.inf):
        return None
    info = torch.finfo(dtype)
    factor = clip_norm / norm * (1.0 - 4.0 * info.eps) * (1.0 - _error_bound(numel))
    if factor < 2.0 * info.tiny:
        return None
    return vector * factor


def _check_tensor(vector: Any) -> None:
    """``ValueError`` unless ``vector`` is a ``torch.Tensor``.

    Sixteenth review of issue 15: a NumPy array or a list ended in ``AttributeError: 'str'
    object has no attribute 'type'``.
    """
    if not isinstance(vector, torch.Tensor):
        raise ValueError(f"vector must be a torch.Tensor, got {type(vector).__name__}")


def _check_real_data(vector: torch.Tensor) -> None:
    """``ValueError`` unless ``vector`` holds real floating-point data (not on the meta device).

    A short API review of issue 15: :func:`l2_norm` of an int, bool or complex tensor ended in
    torch's ``RuntimeError``; int and complex tensors have no L2 ball of reals.
    """
    if torch.Tensor.is_nested.__get__(vector):  # forty-third review: torch's RuntimeError
        raise ValueError("vector must be a dense (strided) tensor, got a nested tensor")
    if vector.device.type == "meta":  # ninth review of issue 15: torch's RuntimeError
        raise ValueError("vector must hold data, got a tensor on the meta device")
    if not vector.dtype.is_floating_point:
        raise ValueError(f"vector must have a real floating dtype, got {vector.dtype}")
    if vector.layout is not torch.strided:  # sixth review of issue 15: torch's RuntimeError
        raise ValueError(f"vector must be a dense (strided) tensor, got layout {vector.layout}")
    if vector.dtype.itemsize < 2:  # float8: torch has no norm for it
        raise ValueError(
            f"vector must be float16, bfloat16, float32 or float64, got {vector.dtype}"
        )


def float_at_most(value: numbers.Real) -> float:
    """The largest float not above the real number ``value`` (``inf`` beyond the float range).

    Fortieth review of issue 15 (mechanisms 1): ``float()`` rounds to the nearest float, which
    may lie above a clip norm that is no float (``Fraction(1, 10)``, the integer ``2**54 - 1``,
    a ``numpy.longdouble`` just below 1), and a vector of that float's norm was returned
    unclipped, its exact norm above ``C``.
    """
    c = as_float(value)
    if isinstance(value, float) or not math.isfinite(c):
        return c
    ratio = getattr(value, "as_integer_ratio", None)
    if ratio is not None:
        exact = Fraction(*ratio())
    elif isinstance(value, numbers.Integral):
        exact = Fraction(int(value))
    else:  # another kind of real number: the float below the nearest one
        return math.nextafter(c, -math.inf)
    return math.nextafter(c, -math.inf) if Fraction(c) > exact else c


def _real_clip_norm(clip_norm: Any) -> float:
    """``clip_norm`` as the largest float not above it.

    A real number or a one-element real tensor, not a str or a bool.
    """
    if isinstance(clip_norm, torch.Tensor):
        ok = clip_norm.numel() == 1 and clip_norm.dtype != torch.bool
        ok = ok and not clip_norm.dtype.is_complex and clip_norm.device.type != "meta"
        if ok:
            return float_at_most(clip_norm.reshape(()).item())
    elif isinstance(clip_norm, numbers.Real) and not isinstance(clip_norm, (bool, np.bool_)):
        return float_at_most(clip_norm)
    raise TypeError(f"clip_norm must be a real number, got {type(clip_norm).__name__}")


def clip_l2(vector: torch.Tensor, clip_norm: float) -> ClipResult:
    """Scale ``vector`` so that its L2 norm is at most ``clip_norm``.

    The result is ``vector * min(1, clip_norm / ||vector||)`` up to a relative margin of a few
    units in the last place, and its exact L2 norm never exceeds ``clip_norm``, at any magnitude
    (see the module docstring). The direction is kept, a vector whose exact norm is at most
    ``clip_norm`` is returned unchanged (the same tensor; for one whose instance carries
    attributes of its own, e.g. its own ``detach``, a detached alias of its entries), and the
    zero vector is safe.

    Parameters
    ----------
    vector : torch.Tensor
        The whole update of one user, any shape (usually flat); float32 or float64 (other
        floating dtypes take the exact path).
    clip_norm : float
        The clip norm ``C > 0``.

    Returns
    -------
    ClipResult
        Clipped vector, pre-clip norm (``inf`` for finite float64 entries whose norm exceeds the
        float range) and whether it was clipped.

    Raises
    ------
    TypeError
        If ``clip_norm`` is not a real number (a ``str``, a ``bool``).
    ValueError
        If ``clip_norm`` is not a positive finite number, ``vector`` is on the meta device, or
        it contains NaN or Inf (such an update has no direction to keep; callers reject it).
    """
    _check_tensor(vector)
    refuse_subclass(vector)
    clip_norm = _real_clip_norm(clip_norm)
    if not (clip_norm > 0 and clip_norm < float("inf")):
        raise ValueError(f"clip_norm must be a finite number > 0, got {clip_norm}")
    # a tensor whose instance carried its own detach (or numel, dtype) read norm 0 and came back
    # unclipped (forty-second review follow-up, privacy, open for mechanisms: norm 1000 where
    # C = 1): such a one is measured and scaled through torch.Tensor's own detach (a plain
    # alias, no copy); any other as before (a result scaled from it keeps its autograd graph)
    plain = torch.Tensor.detach(vector) if vars(vector) else vector
    _check_real_data(plain)
    norm = vector_norm_checked(plain)
    err = _error_bound(plain.numel())
    # forty-third review of issue 15 (mechanisms 2): an unclipped one was returned as the
    # instance itself, whose own detach (what clients.reply_updates sends) gave 100s where
    # the entries measured 0.001: what is returned is the alias that was measured
    if norm * (1.0 + err) <= clip_norm:
        return ClipResult(plain, norm, False)  # inside, whatever the measurement error
    if norm * (1.0 - err) <= clip_norm and not _exceeds(plain, clip_norm):
        return ClipResult(plain, norm, False)  # on the boundary: decided exactly
    scaled = _scaled_fast(plain, norm, clip_norm)
    if scaled is None:
        scaled = _scaled_exact(plain, clip_norm)
    return ClipResult(scaled, norm, True)


#: The tensor types whose arithmetic is torch's own (a Parameter disables ``__torch_function__``):
#: the only ones :func:`clip_l2` and the server (:mod:`fedprivopt.privacy.plain`) measure.
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def refuse_subclass(vector: torch.Tensor, does: str = "measure its norm") -> None:
    """``ValueError`` for a ``torch.Tensor`` subclass other than ``torch.nn.Parameter``.

    Forty-second review of issue 15 (follow-up, privacy, open for mechanisms; lead 8): a
    subclass whose own ``__torch_function__`` reports a smaller norm came back unclipped from
    the public :func:`clip_l2` (norm 1000 where C = 1), as ``privatize_update`` and the server
    already refuse (``privacy.plain``).
    """
    # forty-third review of issue 15 (mechanisms 1): a subclass whose own is_nested said True
    # was let through here (the exemption was for torch's nested tensors) and measured by its
    # own __torch_function__: norm 1000 where C = 1 came back unclipped. Every subclass is
    # refused; a nested tensor of torch's own strided layout (type torch.Tensor) is refused by
    # _check_real_data, read through torch's own is_nested.
    if type(vector) not in PLAIN_TENSORS:
        raise ValueError(
            f"vector must be a plain torch.Tensor, got a {type(vector).__name__} (a subclass, "
            f"whose own operations would {does})"
        )
