r"""Public side information for AdaDPS: a token-frequency preconditioner for bag-of-words models.

AdaDPS [1]_ replaces Adam's data-dependent denominator :math:`\sqrt{E[g^2]}` by a vector ``A``
computed from *public* information, and every client divides its local gradients by it before
clipping (:meth:`fedprivopt.clients.LocalTrainer.precondition`). Because ``A`` does not depend on
the training users' data, it costs no privacy.

Why token frequencies, and which way round
------------------------------------------
With bag-of-words features (the mean of the one-hot vectors of an example's words), the gradient
of the weight row of word ``j`` is ``x_j (p - y)``: it is exactly zero in every example without
word ``j``. Over a minibatch, ``E[g_j^2]`` therefore grows with the fraction ``f_j`` of examples
containing ``j`` (like ``f_j`` while the word is rare in a batch, like ``f_j^2`` once it is in
most batches), so Adam's denominator is ``\propto f_j^{p}`` with ``p`` between ½ and 1. Dividing by
``A_j \propto (\mathrm{count}_j + \mathrm{floor})^{p}`` hence **shrinks the steps of frequent words
(stop words, which carry little tag information) and enlarges those of rare words** (the
informative, tag-specific ones), as Adam does; plain SGD moves rare-word weights almost never.
AdaDPS' StackOverflow code divides by the normalized frequency itself (``p = 1``), the default
here.

The bias is a feature present in every example with value 1, whereas even the most frequent
word has a feature value of about its share of the example's words (5-15 %). The bias gradient
is therefore several times the most frequent word's, and so is Adam's denominator for it
(measured at initialization on the synthetic data: 6-7 times). By default the bias entries get
``bias_scale = 20`` times the largest word value; larger values behave the same (measured: 20,
50 and 200 alike, 5 somewhat worse), since the bias needs only small steps. This matters: with
the bias at the largest word value (``bias_scale = 1``, what AdaDPS' code does by leaving the
bias unpreconditioned), the bias, not the words, limits the stable learning rate and
preconditioned SGD with a constant learning rate oscillates like plain SGD (see
``tests/models/test_realism.py``).

What counts as non-sensitive
----------------------------
Usable: statistics of public data, e.g. the published ``stackoverflow.word_count`` file (the TFF
release, fixed before any run; a synthetic dataset's file plays the same role), word frequencies
of a public corpus, statistics of users who opted out of privacy or of a held-out public split,
and constants. Not usable: anything computed from this run's training users (their word counts,
their example counts). Note that the TFF word counts were themselves computed from the training
split; we treat them, as AdaDPS does, as published public statistics. The run summary states that
the side information is not covered by the guarantee.

References
----------
.. [1] T. Li, M. Zaheer, S. Reddi, V. Smith, "Private adaptive optimization with side
   information", ICML 2022.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from fedprivopt.data.vocab import Vocabulary

__all__ = ["NORMALIZATIONS", "token_frequency_preconditioner"]

#: Accepted values of ``normalize``.
NORMALIZATIONS = ("mean", "max", "none")


def _positive(name: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    out = float(value)
    ok = (out >= 0 if allow_zero else out > 0) and math.isfinite(out)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {out}")
    return out


def token_frequency_preconditioner(
    word_counts: Vocabulary | Sequence[float] | np.ndarray | torch.Tensor,
    *,
    vocab_size: int,
    num_tags: int,
    power: float = 1.0,
    floor: float = 1.0,
    bias: str | float = "max",
    bias_scale: float = 20.0,
    normalize: str = "mean",
) -> torch.Tensor:
    r"""Return AdaDPS' side information ``A`` for the bag-of-words tag model, as a flat vector.

    ``A`` is aligned with the flat layout of
    :class:`~fedprivopt.models.tag_prediction.BagOfWordsLogisticRegression`: the ``(V, K)`` weight
    row-major (word ``j``'s ``K`` entries at ``[j K, (j + 1) K)``, all equal to ``a_j``), then the
    ``K`` bias entries.

    .. math::

        a_j = (\mathrm{count}_j + \mathrm{floor})^{p}, \qquad A = [a_0 1_K, \dots,
        a_{V-1} 1_K, \beta b 1_K] / s

    with ``b`` the bias base value, ``\beta`` = ``bias_scale`` and ``s`` the normalization.

    Parameters
    ----------
    word_counts : Vocabulary or array-like
        Public counts of the ``V`` vocabulary words in model order (word id ``j`` first); a
        :class:`~fedprivopt.data.Vocabulary` (e.g. ``read_word_counts(path)``) or a 1-D array of
        non-negative numbers. Only the first ``vocab_size`` entries are used.
    vocab_size : int
        ``V``, ``>= 1``; ``word_counts`` must have at least this many entries.
    num_tags : int
        ``K``, ``>= 1``.
    power : float
        ``p > 0``: 1 follows AdaDPS' code; ½ would be the square root of the counts (see the
        module docstring for why ``p`` lies between ½ and 1).
    floor : float
        ``>= 0`` added to every count, so that unseen words get a finite, positive value;
        ``floor = 0`` requires all counts ``> 0``.
    bias : {"max", "mean"} or float
        Base value of the bias entries before normalization: the largest or the mean word value,
        or a given number ``> 0``.
    bias_scale : float
        ``> 0``: the bias entries are ``bias_scale`` times the base value (see the module
        docstring for the default 20).
    normalize : {"mean", "max", "none"}
        Divide ``A`` by its mean over all entries (so ``mean(A) = 1``), by its maximum (so
        frequent words keep about plain SGD's step), or not at all.

    Returns
    -------
    torch.Tensor
        float32 CPU vector of length ``V K + K``, finite and ``> 0``.

    Raises
    ------
    ValueError
        On invalid parameters, too few or negative counts, or a zero value with ``floor = 0``.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
    if isinstance(num_tags, bool) or not isinstance(num_tags, int) or num_tags < 1:
        raise ValueError(f"num_tags must be an integer >= 1, got {num_tags!r}")
    p = _positive("power", power)
    fl = _positive("floor", floor, allow_zero=True)
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {', '.join(NORMALIZATIONS)}, got {normalize!r}")
    raw = word_counts.counts if isinstance(word_counts, Vocabulary) else word_counts
    if isinstance(raw, torch.Tensor):
        raw = raw.detach().cpu().numpy()
    counts = np.asarray(raw, dtype=np.float64).reshape(-1)
    if counts.size < vocab_size:
        raise ValueError(
            f"word_counts has {counts.size} entries, fewer than vocab_size={vocab_size}"
        )
    counts = counts[:vocab_size]
    if not np.all(np.isfinite(counts)) or np.any(counts < 0):
        raise ValueError("word_counts must be finite and >= 0")
    base = counts + fl
    if np.any(base <= 0):
        raise ValueError("floor must be > 0 when some word count is 0")
    words = base**p
    if isinstance(bias, str):
        if bias not in ("max", "mean"):
            raise ValueError(f"bias must be 'max', 'mean' or a number > 0, got {bias!r}")
        b = float(words.max() if bias == "max" else words.mean())
    else:
        b = _positive("bias", bias)
    b *= _positive("bias_scale", bias_scale)
    flat = np.concatenate([np.repeat(words, num_tags), np.full(num_tags, b)])
    if normalize == "mean":
        flat = flat / flat.mean()
    elif normalize == "max":
        flat = flat / flat.max()
    out = torch.from_numpy(flat.astype(np.float32))
    if not bool(torch.all(torch.isfinite(out) & (out > 0))):
        raise ValueError(
            "the preconditioner under- or overflows float32; use a smaller power or a larger floor"
        )
    return out
