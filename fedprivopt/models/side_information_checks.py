"""The checked arguments and the result of the side-information builders.

:mod:`~fedprivopt.models.side_information` and its configuration
(:mod:`~fedprivopt.models.side_information_config`) check their numbers with
:func:`check_positive`, :func:`check_eps` and :func:`check_max_ratio` (NumPy's numbers taken as
Python's), the published word counts with :func:`counts_array`, the tag model's size with
:func:`tag_layout` and the public users with :func:`user_ids`; a vector is capped by
:func:`capped` and returned by :func:`as_float32`, which refuses one that does not fit float32.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np
import torch

from fedprivopt.core.checks import check_int
from fedprivopt.core.text import shown
from fedprivopt.data.vocab import Vocabulary

__all__ = [
    "MAX_EPS",
    "as_float32",
    "capped",
    "check_eps",
    "check_max_ratio",
    "check_positive",
    "counts_array",
    "tag_layout",
    "user_ids",
]


def _is_real(value: object) -> bool:
    """Whether ``value`` is a real number: Python's or NumPy's, not a bool.

    Thirty-third review of issue 15: ``two_level_preconditioner(factor=np.float32(2))`` was
    refused as ``factor must be a real number, got np.float32(2.0)`` (and NumPy integers as
    sizes), where :mod:`fedprivopt.core.checks` takes NumPy's numbers.
    """
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _is_integer(value: object) -> bool:
    """Whether ``value`` is an integer: Python's or NumPy's, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_positive(name: str, value: object, *, allow_zero: bool = False) -> float:
    """``value`` as a float, finite and ``> 0`` (``>= 0`` with ``allow_zero``); else ValueError."""
    if not _is_real(value):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    out = float(value)
    ok = (out >= 0 if allow_zero else out > 0) and math.isfinite(out)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {out}")
    return out


MAX_EPS = 1e38
"""Largest ``eps`` of :func:`~fedprivopt.models.side_information.public_users_preconditioner`:
its entries ``sqrt(v)/max + eps`` are at most ``1 + eps`` and must fit float32 (twenty-seventh
review of issue 15: ``eps = 1e308`` was refused as "under- or overflows float32; use a larger
eps", naming no key)."""


def check_eps(name: str, value: object) -> float:
    """``value`` as a float in ``(0, MAX_EPS]``; else ``ValueError`` naming ``name``."""
    out = check_positive(name, value)
    if out > MAX_EPS:
        raise ValueError(f"{name} must be a number in (0, {MAX_EPS:g}], got {out:g}")
    return out


def check_max_ratio(name: str, value: object) -> float:
    """``value`` as a float: 0 (no cap) or finite and ``>= 1``; else ValueError naming ``name``."""
    if not _is_real(value):
        raise ValueError(f"{name} must be 0 (no cap) or a number >= 1, got {value!r}")
    out = float(value)
    if not (out == 0 or (out >= 1 and math.isfinite(out))):
        raise ValueError(f"{name} must be 0 (no cap) or a finite number >= 1, got {value!r}")
    return out


def counts_array(word_counts: object) -> np.ndarray:
    """The counts of ``word_counts`` as a 1-D float64 array; else ValueError naming them.

    Thirty-third review of issue 15: a 2-D array was flattened and used as the counts (a
    preconditioner of the wrong words, silently), complex counts lost their imaginary part with
    a ``ComplexWarning``, ``None`` was "1 entries", a dict or a generator raised ``TypeError``.
    """
    raw = word_counts.counts if isinstance(word_counts, Vocabulary) else word_counts
    if isinstance(raw, torch.Tensor):
        raw = raw.detach().cpu()
        raw = raw.double().numpy() if raw.dtype == torch.bfloat16 else raw.numpy()
    counts = None
    if isinstance(raw, (np.ndarray, Sequence)) and not isinstance(raw, (str, bytes)):
        try:
            counts = np.asarray(raw)
        except ValueError:  # ragged nested sequences
            counts = None
    if counts is not None and counts.dtype == object and counts.ndim == 1:
        counts = counts.astype(np.float64) if all(map(_is_real, counts)) else None
    real = counts is not None and counts.dtype.kind in "iuf"  # not bool, complex, text, objects
    if not real or counts.ndim != 1:
        what = shown(raw) if counts is None else f"{counts.dtype} values of shape {counts.shape}"
        raise ValueError(
            "word_counts must be a Vocabulary or a 1-D sequence of real numbers (a count per "
            f"word, in model order), got {what}"
        )
    return counts.astype(np.float64)


def tag_layout(vocab_size: object, num_tags: object) -> tuple[int, int]:
    """``V`` and ``K``, each ``>= 1``, with ``V K + K`` at most the tag model's largest size.

    Twenty-fifth review of issue 15, finding 11: ``two_level_preconditioner(vocab_size=10**9,
    num_tags=10**9)`` asked torch for 4 EB (a ``RuntimeError`` from the allocator); the layout
    is the bag-of-words tag model's, which holds at most ``MAX_MODEL_PARAMETERS`` values.
    """
    from fedprivopt.models.stackoverflow_files import check_model_parameters

    v, k = check_int("vocab_size", vocab_size, 1), check_int("num_tags", num_tags, 1)
    check_model_parameters(v * k + k, f"vocab_size={v}, num_tags={k}")
    return v, k


def capped(values: np.ndarray, max_ratio: float) -> np.ndarray:
    """Raise every entry to ``max(values) / max_ratio`` (``max_ratio = 0``: unchanged)."""
    if max_ratio == 0:
        return values
    return np.maximum(values, values.max() / max_ratio)


def as_float32(flat: np.ndarray, hint: str) -> torch.Tensor:
    """``flat`` as float32; ``ValueError`` ending in ``hint`` unless all finite and ``> 0``."""
    out = torch.from_numpy(flat.astype(np.float32))
    if not bool(torch.all(torch.isfinite(out) & (out > 0))):
        raise ValueError(f"the preconditioner under- or overflows float32; {hint}")
    return out


def user_ids(users: object) -> tuple[int, ...]:
    """``users`` as a tuple of distinct integer ids (Python's or NumPy's); else ValueError.

    Thirty-third review of issue 15: ``public_users_preconditioner(task, users)`` took
    ``users="01"`` as users 0 and 1, ``[1.5]`` and ``[True]`` as user 1 and a repeated user twice
    (its minibatches counted twice), and ``None`` raised ``TypeError``.
    """
    ok = isinstance(users, (Sequence, np.ndarray)) and not isinstance(users, (str, bytes))
    ids = tuple(users) if ok else ()
    if not ok or not all(map(_is_integer, ids)) or len(set(ids)) != len(ids):
        raise ValueError(
            f"users must be a sequence of distinct integer user ids, got {shown(users)}"
        )
    return tuple(int(user) for user in ids)
