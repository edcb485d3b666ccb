r"""Public side information for AdaDPS: the preconditioner vectors ``A``.

AdaDPS [1]_ replaces Adam's data-dependent denominator :math:`\sqrt{E[g^2]}` by a vector ``A``
computed from *public* information, and every client divides its local gradients by it before
clipping (:meth:`fedprivopt.clients.LocalTrainer.precondition`). Because ``A`` does not depend on
the private training users' data, it costs no privacy. A run chooses ``A`` with the
``[side-information]`` table (:mod:`fedprivopt.models.side_information_config`); the kinds:

``two-level`` (:func:`two_level_preconditioner`)
    What the AdaDPS authors' federated StackOverflow code does
    (``federated/flearn/models/stackoverflow/lr.py`` of ``litian96/AdaDPS``:
    ``grads[0][100:] = grads[0][100:] * 200``): the gradient rows of the words beyond the
    ``top_k = 100`` most frequent are multiplied by ``factor = 200``, the ``top_k`` most frequent
    words and the bias are left alone; i.e. ``A = 1`` on the top-k word rows and the bias and
    ``1/factor`` on the other word rows. Assumes public: which words are the most frequent (the
    word ids are ranks in the published ``stackoverflow.word_count`` file).
``token-frequency`` (:func:`token_frequency_preconditioner`)
    A smooth version built here: ``A_j`` grows with the published count of word ``j`` (see
    below). Assumes public: the counts of the ``word_count`` file.
``public-users`` (:func:`public_users_preconditioner`)
    The paper's setting with public data (its Table 3: the first 4 of 400 users opted out of
    privacy), in the form of the authors' centralized code (``stackoverflow_centralized``,
    ``estimate_preconditioner``: ``A = sqrt(v + 1e-5)``, ``v`` the mean ``g²`` of public
    minibatches, re-estimated at the current model every epoch). Here: once, at the initial
    model, the mean of ``g²`` over the minibatches of the first ``k`` users, who opted out of
    privacy; ``A = sqrt(v) / max + eps``, capped (``max_ratio``). Assumes public: those users'
    data. They are removed from the private population (never sampled, never accounted, never
    trained on privately). Re-estimating at every round's model did not help on the paper preset
    (``docs/EXPERIMENTS.md``, "AdaDPS' side information").
``ones``
    ``A = 1``: AdaDPS reduces to DP-FedAvg.

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
The two-level scaling of the authors' federated code is the coarsest form of the same idea (rare
words get 200 times the step); their centralized code measures ``E[g^2]`` on public data
instead. ``p = 1`` is the default here.

The bias is a feature present in every example with value 1, whereas even the most frequent
word has a feature value of about its share of the example's words (5-15 %). The bias gradient
is therefore several times the most frequent word's, and so is Adam's denominator for it
(measured at initialization on the synthetic data: 6-7 times). By default the token-frequency
bias entries get ``bias_scale = 20`` times the largest word value; larger values behave the same
(measured: 20, 50 and 200 alike, 5 somewhat worse), since the bias needs only small steps. This
matters: with the bias at the largest word value (``bias_scale = 1``), the bias, not the words,
limits the stable learning rate and preconditioned SGD with a constant learning rate oscillates
like plain SGD (see ``tests/models/test_realism.py``). The two-level scaling leaves the bias at
the frequent words' value, as the authors' code does.

``max_ratio`` caps the ratio between the largest and the smallest entry of ``A`` (entries are
raised to ``max(A) / max_ratio``), which bounds how much larger than plain SGD's any step gets.

What counts as non-sensitive
----------------------------
Usable: statistics of public data, e.g. the published ``stackoverflow.word_count`` file (the TFF
release, fixed before any run; a synthetic dataset's file plays the same role), word frequencies
of a public corpus, data of users who opted out of privacy (removed from the private
population) or of a held-out public split, and constants. Not usable: anything computed from this
run's private training users (their word counts, their example counts). Note that the TFF word
counts were themselves computed from the training split; we treat them, as AdaDPS does, as
published public statistics. The run summary states that the side information is not covered by
the guarantee.

References
----------
.. [1] T. Li, M. Zaheer, S. Reddi, V. Smith, "Private adaptive optimization with side
   information", ICML 2022. Code: https://github.com/litian96/AdaDPS
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedprivopt.core.checks import check_int
from fedprivopt.core.text import shown
from fedprivopt.data.vocab import Vocabulary
from fedprivopt.models.side_information_checks import (
    as_float32,
    capped,
    check_eps,
    check_max_ratio,
    check_positive,
    counts_array,
    tag_layout,
    user_ids,
)
from fedprivopt.models.task import built_model
from fedprivopt.models.task_calls import minibatch_loss, user_examples
from fedprivopt.privacy.rng import derive_seed

if TYPE_CHECKING:  # pragma: no cover
    from fedprivopt.models.task import Task

__all__ = [
    "DEFAULT_SIDE_INFORMATION",
    "KINDS",
    "NORMALIZATIONS",
    "gradient_second_moment",
    "public_users_preconditioner",
    "token_frequency_preconditioner",
    "two_level_preconditioner",
]

#: The kinds of side information, in the order the documentation lists them.
KINDS = ("two-level", "token-frequency", "public-users", "ones")

#: The default side information (``side-information = "auto"`` or no table) of the bag-of-words
#: tag task: its kind and parameters, kebab-case as in a preset. The one place to change it.
#: Chosen by measurement (``experiments/adadps-side-information.sweep.toml``, docs/EXPERIMENTS.md):
#: at the paper preset's own rates, 3 seeds, test accuracy (tag prior 0.271): public-users capped
#: at 200 0.357 ± 0.004, token-frequency (p = 1/2, max) 0.317 ± 0.026, two-level 0.299 ± 0.020,
#: ones 0.270 ± 0.001, token-frequency (p = 1, mean; the previous default) 0.005 ± 0.009.
#: Re-measured once the preset froze the bias (2026-11-25): token-frequency (1/2, max) 0.326,
#: two-level 0.326, public-users 0.276 at those rates; over AdaDPS' rate grid (6 conditions) the
#: preset's public-users (max-ratio 50) kept the better worst margin (+2.0 points against +1.6).
DEFAULT_SIDE_INFORMATION: Mapping[str, Any] = MappingProxyType(
    {"kind": "public-users", "max-ratio": 200.0}
)

#: Accepted values of ``normalize``.
NORMALIZATIONS = ("mean", "max", "none")


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
    max_ratio: float = 0.0,
) -> torch.Tensor:
    r"""Return a token-frequency side information ``A`` for the bag-of-words tag model.

    ``A`` is aligned with the flat layout of
    :class:`~fedprivopt.models.tag_prediction.BagOfWordsLogisticRegression`: the ``(V, K)`` weight
    row-major (word ``j``'s ``K`` entries at ``[j K, (j + 1) K)``, all equal to ``a_j``), then the
    ``K`` bias entries.

    .. math::

        a_j = (\mathrm{count}_j + \mathrm{floor})^{p}, \qquad A = \mathrm{cap}([a_0 1_K, \dots,
        a_{V-1} 1_K, \beta b 1_K]) / s

    with ``b`` the bias base value, ``\beta`` = ``bias_scale``, ``cap`` raising every entry to
    ``max / max_ratio`` and ``s`` the normalization. Where it comes from and what it assumes
    public: see the module docstring (the published word counts).

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
        ``p > 0``; ½ would be the square root of the counts (see the module docstring for why
        ``p`` lies between ½ and 1).
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
    max_ratio : float
        Cap on ``max(A) / min(A)``: entries (bias included) are raised to ``max(A) / max_ratio``
        before the normalization. ``0``: no cap; otherwise ``>= 1``.

    Returns
    -------
    torch.Tensor
        float32 CPU vector of length ``V K + K``, finite and ``> 0``.

    Raises
    ------
    ValueError
        On invalid parameters, too few or negative counts, or a zero value with ``floor = 0``.
    """
    tag_layout(vocab_size, num_tags)
    p = check_positive("power", power)
    fl = check_positive("floor", floor, allow_zero=True)
    cap = check_max_ratio("max_ratio", max_ratio)
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {', '.join(NORMALIZATIONS)}, got {normalize!r}")
    counts = counts_array(word_counts)
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
    if isinstance(bias, str):
        if bias not in ("max", "mean"):
            raise ValueError(f"bias must be 'max', 'mean' or a number > 0, got {bias!r}")
    else:
        check_positive("bias", bias)
    scale = check_positive("bias_scale", bias_scale)
    # an overflow is refused by as_float32 in one line; numpy's RuntimeWarning lines before it
    # broke the command's one-line error (twenty-seventh review of issue 15, power = 1e300)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        words = base**p
        b = float(words.max() if bias == "max" else words.mean() if bias == "mean" else bias)
        b *= scale
        flat = capped(np.concatenate([np.repeat(words, num_tags), np.full(num_tags, b)]), cap)
        if normalize == "mean":
            flat = flat / flat.mean()
        elif normalize == "max":
            flat = flat / flat.max()
    return as_float32(flat, "use a smaller power or a larger floor")


def two_level_preconditioner(
    *, vocab_size: int, num_tags: int, top_k: int = 100, factor: float = 200.0
) -> torch.Tensor:
    """Return the AdaDPS authors' two-level side information for the bag-of-words tag model.

    ``A = 1`` on the weight rows of the ``top_k`` most frequent words (word ids ``0 .. top_k -
    1``: ids are ranks in the published word-count file) and on the bias, ``1 / factor`` on the
    other word rows. Dividing by ``A`` multiplies the gradients of the rarer words by ``factor``,
    exactly ``grads[0][100:] = grads[0][100:] * 200`` of ``federated/flearn/models/stackoverflow/
    lr.py`` in ``litian96/AdaDPS`` with the defaults. Assumes public: the frequency ranking of the
    words.

    Parameters
    ----------
    vocab_size, num_tags : int
        ``V`` and ``K``, ``>= 1``; the layout is that of
        :func:`token_frequency_preconditioner`.
    top_k : int
        Words left at ``A = 1``, in ``[1, V]``.
    factor : float
        ``> 0``: the other words' gradients are multiplied by it.

    Returns
    -------
    torch.Tensor
        float32 CPU vector of length ``V K + K``.
    """
    v, k = tag_layout(vocab_size, num_tags)
    top_k = check_int("top_k", top_k, 1, v, high_name="V")
    f = check_positive("factor", factor)
    out = torch.ones(v * k + k, dtype=torch.float32)
    out[top_k * k : v * k] = 1.0 / f
    if not bool(torch.all(torch.isfinite(out) & (out > 0))):
        raise ValueError(f"factor={f} under- or overflows float32")
    return out


#: The root key of the global generators a public user's gradients are computed under.
SEED_KEY = "side-information"


@contextlib.contextmanager
def _seeded_global_generators(user: int) -> Iterator[None]:
    """Torch's (CPU), NumPy's and Python's global generators seeded for public ``user``.

    Restored afterwards, as :class:`~fedprivopt.clients.LocalTrainer` does for every private
    user (its ``_seeded_global_rng``). Thirty-seventh review of issue 15: a task whose
    ``loss`` draws from them (dropout, ``np.random`` augmentation) gave another side information
    on every run (two runs of one seed released different models, and ``--resume`` was refused
    for ever: "checkpoint was written with different side information"), and advanced them. The
    seed is a constant of the user (no run seed): the side information is a function of public
    data and constants, the same for every seed.
    """
    seed = derive_seed(0, SEED_KEY, user)
    numpy_state, python_state = np.random.get_state(), random.getstate()  # noqa: NPY002
    np.random.seed([seed & 0xFFFFFFFF, seed >> 32])  # noqa: NPY002
    random.seed(seed)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)
            yield
    finally:
        np.random.set_state(numpy_state)  # noqa: NPY002
        random.setstate(python_state)


def gradient_second_moment(
    task: Task, users: Sequence[int], *, batch_size: int, max_examples: int = 0
) -> torch.Tensor:
    """Mean of ``g²`` over the minibatches of ``users`` at the task's initial model.

    For each user (in the given order), its examples in order (the first ``max_examples`` if
    ``> 0``) are cut into minibatches of ``batch_size`` (the last may be smaller); ``g`` is the
    gradient of ``task.loss(model, x, y)`` on a minibatch at ``task.build_model()``, laid out like
    :func:`~fedprivopt.models.task.model_spec` (entries without a gradient, e.g. buffers, are 0).
    Works for any task. A user's minibatches run with the global generators (torch's on the CPU,
    NumPy's, Python's) seeded from a constant key of that user and restored afterwards, so a
    ``loss`` that draws from them (dropout, augmentation) gives the same result every time.

    Returns
    -------
    torch.Tensor
        float64 CPU vector of the model's flat length.

    Raises
    ------
    ValueError
        If ``users`` is not a sequence of distinct integer ids, or they have no example at all.
    """
    users = user_ids(users)
    bs = check_int("batch_size", batch_size, 1)
    max_examples = check_int("max_examples", max_examples, 0)
    model = built_model(task)  # its own exception is the task's (forty-seventh review, api 4)
    state = model.state_dict()
    named = dict(model.named_parameters())
    total = torch.zeros(sum(t.numel() for t in state.values()), dtype=torch.float64)
    batches = 0
    for user in users:
        x, y = user_examples(task, user)
        n = int(x.shape[0]) if max_examples == 0 else min(int(x.shape[0]), max_examples)
        with _seeded_global_generators(user):
            for start in range(0, n, bs):
                stop = min(start + bs, n)
                model.zero_grad(set_to_none=True)
                minibatch_loss(task, model, x[start:stop], y[start:stop]).backward()
                offset = 0
                for name, tensor in state.items():
                    size = tensor.numel()
                    param = named.get(name)
                    if param is not None and param.grad is not None:
                        g = param.grad.detach().reshape(-1).to(torch.float64)
                        total[offset : offset + size] += g * g
                    offset += size
                batches += 1
    if batches == 0:
        raise ValueError(f"the public users {shown(list(users))} have no training example")
    return total / batches


def public_users_preconditioner(
    task: Task,
    users: Sequence[int],
    *,
    batch_size: int,
    max_examples: int = 0,
    eps: float = 1e-5,
    max_ratio: float = 200.0,
) -> torch.Tensor:
    r"""Return AdaDPS' side information from the gradients of users who opted out of privacy.

    .. math::

        v = \mathrm{mean}_{\text{minibatches}}\, g^2, \qquad
        A = \mathrm{cap}\big(\sqrt{v} / \max\sqrt{v} + \mathrm{eps}\big)

    with ``v`` from :func:`gradient_second_moment` at the initial model and ``cap`` raising every
    entry to ``max(A) / max_ratio``. This is the paper's public-data setting (Table 3: 4 public
    users of 400) and, up to scale, the form of the authors' centralized code
    (``sqrt(v + 1e-5)``, whose absolute floor ``sqrt(1e-5)`` bounds their ratio at
    ``max sqrt(v) / 0.0032``: 16-20 on the paper preset's data); ``eps`` is relative to the
    largest ``sqrt(v)``. Assumes public:
    the data of ``users``, who must then be left out of the private population (the caller's job:
    :func:`fedprivopt.simulation.run.build_run` does it).

    Parameters
    ----------
    task : Task
        Any task (``build_model``, ``user_data``, ``loss``).
    users : sequence of int
        The public users' ids.
    batch_size, max_examples : int
        Minibatch size (``>= 1``) and examples used per user (``0``: all).
    eps : float
        In ``(0, MAX_EPS]`` (1e38: the entries must fit float32), added after normalizing by
        the maximum.
    max_ratio : float
        ``0`` (no cap) or ``>= 1``; default 200, the range of the two-level scaling (uncapped,
        the rare words of the paper preset diverged).

    Returns
    -------
    torch.Tensor
        float32 CPU vector of the model's flat length, finite and ``> 0``.
    """
    e = check_eps("eps", eps)
    cap = check_max_ratio("max_ratio", max_ratio)
    root = gradient_second_moment(
        task, users, batch_size=batch_size, max_examples=max_examples
    ).sqrt()
    top = float(root.max())
    if not (top > 0 and math.isfinite(top)):
        raise ValueError(
            f"the public users' gradients are all zero or not finite (max sqrt(v) = {top})"
        )
    flat = capped((root / top + e).numpy(), cap)
    return as_float32(flat, "use a larger eps")  # underflow: eps is at most MAX_EPS
