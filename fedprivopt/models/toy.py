r"""A small synthetic non-IID classification task for tests and examples.

:class:`ToyClassificationTask` draws multinomial-logistic data: a true weight matrix ``W*`` and
bias ``b*``, and for each user a feature shift ``mu_u`` and a label-bias vector ``c_u`` (both scaled
by ``heterogeneity``), so that user ``u``'s examples are

.. math::

    x \sim N(\mu_u, I), \qquad y \sim \mathrm{softmax}(W^* x + b^* + c_u).

User sizes are skewed (most users small, a few large). The held-out test set draws a fresh shift
and label bias for every example, i.e. it samples the population of users.

Everything is generated from explicit ``torch.Generator`` objects keyed by ``(seed, purpose,
user)`` (:func:`fedprivopt.privacy.derive_seed`): a user's data does not depend on which other
users were generated before, construction is O(1) in the number of users, and the global random
state is never read or changed. The model is ``torch.nn.Linear(dim, num_classes)`` (multinomial
logistic regression) with cross-entropy loss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral

import torch
import torch.nn.functional as F

from fedprivopt.core.checks import check_int, check_real
from fedprivopt.core.local import check_user_id
from fedprivopt.core.text import shown
from fedprivopt.models.task import evaluating
from fedprivopt.models.uninitialized import materialize
from fedprivopt.privacy.rng import derive_seed
from fedprivopt.privacy.sampling import MAX_POPULATION

__all__ = ["MAX_MODEL_VALUES", "MAX_TENSOR_VALUES", "ToyClassificationTask"]

MAX_TENSOR_VALUES = 2**28  # float32 values of one tensor the task allocates: 1 GiB
# parameters of the model: a run holds many model-sized tensors (a 2**26-parameter toy model
# peaked at 3.6 GB in one round), so 2**24 (64 MB each)
MAX_MODEL_VALUES = 2**24


def _generator(seed: int, *keys: int | str) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(derive_seed(seed, "toy", *keys))
    return gen


def _size_pair(value: object) -> tuple[int, int]:
    """``examples_per_user`` given as a pair: two integers ``0 <= lo <= hi``.

    Twenty-fifth review of issue 15, finding 7: the pair's entries went through ``int()``, so
    ``[1.5, 40.9]``, ``[true, 5]``, ``["3", "5"]`` and ``[-0.5, 3]`` ran as ``(1, 40)``,
    ``(1, 5)``, ``(3, 5)`` and ``(0, 3)`` while ``config.toml`` and the ledger recorded what was
    written, and ``[3, 1e300]`` was refused with a 301-digit number.
    """
    pair = tuple(value) if isinstance(value, (list, tuple)) else None
    if (
        pair is None
        or len(pair) != 2
        or any(isinstance(v, bool) or not isinstance(v, Integral) for v in pair)
    ):
        raise ValueError(
            "examples_per_user must be an integer mean >= 1 or a pair (lo, hi) of integers with "
            f"0 <= lo <= hi, got {shown(value)}"
        )
    lo, hi = (int(v) for v in pair)
    if not 0 <= lo <= hi:
        raise ValueError(f"examples_per_user must satisfy 0 <= lo <= hi, got ({lo}, {hi})")
    return lo, hi


class ToyClassificationTask:
    """Synthetic non-IID multinomial logistic regression.

    Parameters
    ----------
    num_users : int
        Number of training users, in ``[1, 10**8]``: a run samples from them, and its sampler
        draws one value per user a round
        (:data:`fedprivopt.privacy.sampling.MAX_POPULATION`).
    dim : int
        Feature dimension, ``>= 1``.
    num_classes : int
        Number of classes, ``>= 2``.
    examples_per_user : int or (int, int)
        A pair ``(lo, hi)`` with ``0 <= lo <= hi``: user sizes are ``lo + floor((hi - lo + 1)
        U^3)`` (``U`` uniform), skewed towards ``lo`` with a tail up to ``hi`` (mean
        ``lo + (hi - lo) / 4``); ``(n, n)`` gives every user exactly ``n`` examples. An integer
        ``m >= 1`` is a mean: sizes are log-normal with mean ``m`` (log-std 1), rounded and clipped
        to ``[1, 10 m]``.
    heterogeneity : float
        Scale ``h`` in ``[0, 1e6]`` of the per-user feature shift (std ``h``) and label bias
        (std ``2h``); ``0`` makes the users IID.
    test_examples : int
        Size of the held-out test set, ``>= 1``.
    seed : int
        Root seed of the data and of the model's initialization, ``>= 0``.

    Raises
    ------
    ValueError
        If a parameter is out of range (the message names it), or if a tensor the task would
        allocate holds more than :data:`MAX_TENSOR_VALUES` = 2**28 float32 values (1 GiB):
        the largest user's features and logits, ``max_size * (dim + num_classes)`` with
        ``max_size = hi`` (pair) or ``10 m`` (mean); the test set's, ``test_examples * (dim +
        num_classes)``; the model's weight, ``dim * num_classes``. Checked at construction,
        before anything is allocated, so ``examples_per_user = (1, 10**11)`` fails at once
        rather than when training reaches a large user.

    Examples
    --------
    >>> task = ToyClassificationTask(num_users=5, seed=1)
    >>> x, y = task.user_data(0)
    >>> x.shape[1], int(y.max()) < task.num_classes
    (10, True)
    """

    name = "toy"

    def __init__(
        self,
        *,
        num_users: int = 20,
        dim: int = 10,
        num_classes: int = 3,
        examples_per_user: int | Sequence[int] = (5, 40),
        heterogeneity: float = 0.5,
        test_examples: int = 300,
        seed: int = 0,
    ) -> None:
        self.num_users = check_int("num_users", num_users, 1, MAX_POPULATION)
        self.dim = check_int("dim", dim, 1)
        self.num_classes = check_int("num_classes", num_classes, 2)
        self.test_examples = check_int("test_examples", test_examples, 1)
        self.seed = check_int("seed", seed, 0)
        # features are float32: a larger shift overflows them (1e308 made the labels' softmax NaN)
        self.heterogeneity = check_real("heterogeneity", heterogeneity, low=0.0, high=1e6)
        if isinstance(examples_per_user, Integral) and not isinstance(examples_per_user, bool):
            check_int("examples_per_user", examples_per_user, 1)
            self.examples_per_user: int | tuple[int, int] = int(examples_per_user)
        else:
            self.examples_per_user = _size_pair(examples_per_user)
        self._check_memory()

        gen = _generator(self.seed, "true-model")
        scale = 3.0 / math.sqrt(self.dim)
        self.true_weight = torch.randn(self.num_classes, self.dim, generator=gen) * scale
        self.true_bias = torch.randn(self.num_classes, generator=gen) * 0.5
        self.test_x, self.test_y = self._draw_test()

    def _check_memory(self) -> None:
        """Refuse sizes whose tensors exceed :data:`MAX_TENSOR_VALUES` (see the class doc)."""
        epu = self.examples_per_user
        largest = epu[1] if isinstance(epu, tuple) else 10 * epu
        width = self.dim + self.num_classes
        if self.dim * self.num_classes > MAX_MODEL_VALUES:
            raise ValueError(
                f"dim * num_classes must be at most {MAX_MODEL_VALUES:,} (2**24 parameters: a "
                "run holds a few dozen model-sized tensors, the cohort's updates among them), "
                f"got dim={self.dim} * num_classes={self.num_classes}"
            )
        for name, value, rows in (
            ("examples_per_user", epu, largest),
            ("test_examples", self.test_examples, self.test_examples),
        ):
            if rows * width > MAX_TENSOR_VALUES:
                raise ValueError(self._size_message(name, value, rows))

    def _size_message(self, name: str, value: object, rows: int) -> str:
        """Why ``rows * (dim + num_classes)`` values are refused, led by the key to change.

        Thirtieth review of issue 15 (data, finding 2): ``num_classes=8388608, dim=2`` was
        refused with a line led by the default ``examples_per_user=(5, 40)``, which the user never
        set. When ``name`` keeps its default, the larger of ``dim`` and ``num_classes`` leads,
        with the largest value it may take here.
        """
        values = rows * (self.dim + self.num_classes)
        size = f"a tensor of {values:,} float32 values (about {values * 4 / 2**30:,.1f} GiB"
        limit = "the limit is 2**28 values (1 GiB)"
        default = type(self).__init__.__kwdefaults__[name]
        if value != default or rows == 0:
            return (
                f"{name}={value!r} needs {size} with dim={self.dim} and "
                f"num_classes={self.num_classes}); {limit}"
            )
        lead, other = (
            ("num_classes", "dim") if self.num_classes >= self.dim else ("dim", "num_classes")
        )
        epu = self.examples_per_user  # the largest it may take for every tensor, model included
        rows = max(epu[1] if isinstance(epu, tuple) else 10 * epu, self.test_examples)
        other_value = getattr(self, other)
        most = max(min(MAX_TENSOR_VALUES // rows - other_value, MAX_MODEL_VALUES // other_value), 0)
        return (
            f"{lead}={getattr(self, lead)} must be at most {most:,} with {other}={other_value}, "
            f"examples_per_user={epu!r} and test_examples={self.test_examples}: {name}="
            f"{value!r} needs {size}); {limit}"
        )

    # ----------------------------------------------------------------------------- data
    def __repr__(self) -> str:
        return (
            f"ToyClassificationTask(num_users={self.num_users}, dim={self.dim}, "
            f"num_classes={self.num_classes}, examples_per_user={self.examples_per_user!r}, "
            f"heterogeneity={self.heterogeneity}, test_examples={self.test_examples}, "
            f"seed={self.seed})"
        )

    def _size(self, gen: torch.Generator) -> int:
        if isinstance(self.examples_per_user, tuple):
            lo, hi = self.examples_per_user
            u = float(torch.rand((), generator=gen, dtype=torch.float64))
            return min(hi, lo + math.floor((hi - lo + 1) * u**3))
        mean = self.examples_per_user
        z = float(torch.randn((), generator=gen, dtype=torch.float64))
        return int(min(10 * mean, max(1, round(mean * math.exp(z - 0.5)))))

    def _labels(self, x: torch.Tensor, label_bias: torch.Tensor, gen: torch.Generator):
        if x.shape[0] == 0:
            return torch.zeros(0, dtype=torch.long)
        logits = x @ self.true_weight.T + self.true_bias + label_bias
        return torch.multinomial(torch.softmax(logits, dim=1), 1, generator=gen).reshape(-1)

    def _draw_test(self) -> tuple[torch.Tensor, torch.Tensor]:
        gen = _generator(self.seed, "test")
        n, h = self.test_examples, self.heterogeneity
        shift = torch.randn(n, self.dim, generator=gen) * h
        label_bias = torch.randn(n, self.num_classes, generator=gen) * (2 * h)
        x = shift + torch.randn(n, self.dim, generator=gen)
        return x, self._labels(x, label_bias, gen)

    def private_evaluation_users(self) -> tuple[int, int]:
        """``(0, 0)``: the test set is drawn apart from every user, so no user is evaluated."""
        return 0, 0

    def user_size(self, user_id: int) -> int:
        """Number of training examples of ``user_id`` (without generating them)."""
        return self._size(_generator(self.seed, "user", self._check_user(user_id)))

    def _check_user(self, user_id: int) -> int:
        return check_user_id(user_id, self.num_users)

    def user_data(self, user_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(x, y)``: float32 features ``(n, dim)`` and int64 labels ``(n,)``."""
        gen = _generator(self.seed, "user", self._check_user(user_id))
        n, h = self._size(gen), self.heterogeneity
        shift = torch.randn(self.dim, generator=gen) * h
        label_bias = torch.randn(self.num_classes, generator=gen) * (2 * h)
        x = shift + torch.randn(n, self.dim, generator=gen)
        return x, self._labels(x, label_bias, gen)

    # ---------------------------------------------------------------------------- model
    def build_model(self) -> torch.nn.Module:
        """Return ``Linear(dim, num_classes)`` initialized like torch's default, from the seed.

        The layer is created without running torch's initializer (which would draw from the global
        RNG) and then filled from a generator keyed by the task's seed.
        """
        model = materialize(torch.nn.Linear(self.dim, self.num_classes, device="meta"))
        gen = _generator(self.seed, "model-init")
        bound = 1.0 / math.sqrt(self.dim)
        with torch.no_grad():
            model.weight.uniform_(-bound, bound, generator=gen)
            model.bias.uniform_(-bound, bound, generator=gen)
        return model

    def loss(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of ``model`` on ``(x, y)``."""
        return F.cross_entropy(model(x), y)

    def evaluate_data(
        self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> dict[str, float]:
        """Mean ``"loss"`` and ``"accuracy"`` on ``(x, y)`` (NaN for zero examples)."""
        if x.shape[0] == 0:
            return {"loss": float("nan"), "accuracy": float("nan")}
        with evaluating(model) as device:
            x, y = x.to(device), y.to(device)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            acc = (logits.argmax(dim=1) == y).to(torch.float64).mean()
        return {"loss": float(loss), "accuracy": float(acc)}

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """Mean ``"loss"`` and ``"accuracy"`` on the held-out test set."""
        return self.evaluate_data(model, self.test_x, self.test_y)
