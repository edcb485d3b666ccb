"""One user's local training: its settings and the order in which it visits its examples.

Both the per-user :class:`~fedprivopt.clients.LocalTrainer` and the tasks' vectorized cohort
trainers (e.g. :mod:`fedprivopt.models.tag_prediction_cohort`) take a :class:`LocalConfig` and
replay :func:`epoch_orders` from the same generator, so they visit the same minibatches.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Integral

import torch

from fedprivopt.core.checks import check_bool, check_int, check_real
from fedprivopt.core.text import shown

__all__ = [
    "MAX_COUNT_NOISE_STD",
    "MAX_EPOCHS",
    "MAX_LEARNING_RATE",
    "MAX_ORDER_ENTRIES",
    "LocalConfig",
    "check_train_call",
    "check_user_id",
    "epoch_orders",
]

#: Upper bound of :attr:`LocalConfig.epochs`. :func:`epoch_orders` holds one int64 permutation
#: of the user's examples per epoch (plus a tensor object, ~100 bytes, per epoch), so memory
#: grows like ``epochs * examples``: 10**13 epochs used to be accepted and grow until killed.
#: 10,000 passes over a user's data is far beyond any federated setting (1-5 is usual) and keeps
#: the orders of a user with 10,000 examples at 800 MB.
MAX_EPOCHS = 10_000
#: Upper bound of :attr:`LocalConfig.learning_rate`: float32's largest value, the command line's
#: bound of ``local-learning-rate``. Twenty-fifth review of issue 15, finding 12: a larger rate
#: was accepted, and ``LocalTrainer`` then failed with torch's ``RuntimeError: value cannot be
#: converted to type float without overflow`` while the cohort trainers returned zero updates.
MAX_LEARNING_RATE = float(torch.finfo(torch.float32).max)
#: Upper bound of :attr:`LocalConfig.count_noise_std`, the accountant's largest noise multiplier
#: (what ``privacy.adaptive_clip.count_share`` accepts): a larger one was accepted here and
#: refused only when the first clip bit was noised, by the fast engine after the round trained.
MAX_COUNT_NOISE_STD = 1e100

#: Upper bound of ``epochs * examples`` in :func:`epoch_orders`: 2**27 int64 entries (1 GiB),
#: checked before any permutation is drawn.
MAX_ORDER_ENTRIES = 2**27


@dataclass(frozen=True, kw_only=True)
class LocalConfig:
    """Hyperparameters of one user's local training.

    Parameters
    ----------
    learning_rate : float
        Local SGD step size, in ``(0, MAX_LEARNING_RATE]`` (float32's largest value).
    epochs : int
        Passes over the user's examples, in ``[1, MAX_EPOCHS]`` (:data:`MAX_EPOCHS` = 10,000:
        :func:`epoch_orders` holds one permutation of the examples per epoch, so memory grows
        like ``epochs * examples``; checked here, before anything is allocated).
    batch_size : int
        Minibatch size, ``>= 1`` (the last batch of an epoch may be smaller).
    max_examples : int or None
        Use at most this many of the user's examples per round (the first ``k`` of a seeded
        shuffle), ``>= 1``; ``None`` uses all.
    clip_norm : float or None
        Clip norm ``C > 0`` of the whole update; ``None`` disables clipping (non-private
        baselines only).
    noise_std : float
        Standard deviation ``>= 0`` of this client's Gaussian noise share, added to its clipped
        update in distributed-noise mode; ``0`` adds none.
    clip_bit : bool
        Whether the client reports its clip bit ``[‖Δ‖ ≤ C]`` (adaptive clipping).
    count_noise_std : float
        Std in ``[0, MAX_COUNT_NOISE_STD]`` (1e100) of this client's share of the count noise
        (adaptive clipping in distributed-noise mode): the client then reports ``(bit − 1/2) +
        N(0, count_noise_std²)`` instead of the bit.
    """

    learning_rate: float
    epochs: int = 1
    batch_size: int = 32
    max_examples: int | None = None
    clip_norm: float | None = None
    noise_std: float = 0.0
    clip_bit: bool = False
    count_noise_std: float = 0.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        lr = check_real(
            "learning_rate", self.learning_rate, low=0.0, high=MAX_LEARNING_RATE, low_open=True
        )
        set_(self, "learning_rate", lr)
        check_int("epochs", self.epochs, 1, MAX_EPOCHS)
        check_int("batch_size", self.batch_size, 1)
        set_(self, "epochs", int(self.epochs))
        set_(self, "batch_size", int(self.batch_size))
        if self.max_examples is not None:
            check_int("max_examples", self.max_examples, 1)
            set_(self, "max_examples", int(self.max_examples))
        if self.clip_norm is not None:
            set_(self, "clip_norm", check_real("clip_norm", self.clip_norm, low=0.0, low_open=True))
        set_(self, "noise_std", check_real("noise_std", self.noise_std, low=0.0))
        set_(self, "clip_bit", check_bool("clip_bit", self.clip_bit))
        count_std = check_real(
            "count_noise_std", self.count_noise_std, low=0.0, high=MAX_COUNT_NOISE_STD
        )
        set_(self, "count_noise_std", count_std)


def epoch_orders(
    num_examples: int,
    *,
    epochs: int,
    max_examples: int | None,
    generator: torch.Generator,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Return which of a user's examples are used and the order of each epoch.

    The draws are, in this order: ``subset = randperm(num_examples)[:max_examples]``, then one
    ``randperm(k)`` per epoch with ``k = len(subset)``. Epoch ``e`` visits the examples
    ``subset[orders[e]]`` in minibatches of consecutive positions. Any engine that replays these
    draws from the same generator visits the same minibatches as :class:`LocalTrainer`.

    Returns
    -------
    subset : torch.Tensor
        int64 CPU indices into the user's examples, length ``k``.
    orders : list of torch.Tensor
        ``epochs`` int64 CPU permutations of ``range(k)``.

    Raises
    ------
    ValueError
        If ``epochs`` is not in ``[1, MAX_EPOCHS]`` or ``epochs * k`` exceeds
        :data:`MAX_ORDER_ENTRIES` (2**27 entries, 1 GiB), before anything is drawn.
    """
    check_int("epochs", epochs, 1, MAX_EPOCHS)
    k = int(num_examples) if max_examples is None else min(int(num_examples), int(max_examples))
    if int(epochs) * k > MAX_ORDER_ENTRIES:
        # follow-up of the forty-fifth review of issue 15 (privacy 4): the message named k, a
        # user's exact example count, which a ClientApp's error reply sends to the server as
        # its reason (outside epsilon); it names the limit the configuration sets alone
        most = MAX_ORDER_ENTRIES // int(epochs)
        raise ValueError(
            f"epochs * examples must be at most {MAX_ORDER_ENTRIES} (one int64 permutation of "
            f"the examples per epoch): at local-epochs {int(epochs)} a user may train on at "
            f"most {most} examples, and one holds more; lower local-epochs or set max-examples "
            f"to at most {most}"
        )
    subset = torch.randperm(int(num_examples), generator=generator)
    if max_examples is not None:
        subset = subset[: int(max_examples)]
    k = int(subset.numel())
    return subset, [torch.randperm(k, generator=generator) for _ in range(int(epochs))]


def check_train_call(
    users: Iterable[int], *, round_num: int, config: LocalConfig, rngs: object, stream: str
) -> tuple[list[int], int]:
    """The arguments of a local training call, checked; returns the users and the round as ints.

    What :class:`~fedprivopt.clients.LocalTrainer` and the tasks' cohort trainers
    (:class:`~fedprivopt.models.cohort.CohortTrainer`) check before they train. Twenty-fifth
    review of issue 15: both took a user id of 1.5, ``True`` or ``"3"`` as user 1, 1 and 3 (and
    a round of 1.5 as round 1), and the cohort trainers took a ``stream`` of ``None`` or ``""``
    and failed on a ``config`` or ``rngs`` of another type with an ``AttributeError``.

    Parameters
    ----------
    users : iterable of int
        User ids, each an integer ``>= 0`` (numpy's integers, an integer tensor); the task
        checks the upper bound.
    round_num : int
        Server round, an integer ``>= 0``.
    config : LocalConfig
    rngs : RngFactory
    stream : str
        A non-empty string.

    Raises
    ------
    ValueError
        Naming the argument.
    """
    if not isinstance(config, LocalConfig):
        raise ValueError(f"config must be a LocalConfig, got {type(config).__name__}")
    # by its methods: core may not import privacy (tests/test_layers.py)
    if not (
        callable(getattr(rngs, "generator", None)) and callable(getattr(rngs, "seed_for", None))
    ):
        raise ValueError(f"rngs must be a RngFactory, got {type(rngs).__name__}")
    if not isinstance(stream, str) or not stream:
        raise ValueError(f"stream must be a non-empty string, got {stream!r}"[:200])
    round_num = check_int("round_num", round_num, 0)
    if isinstance(users, torch.Tensor):
        if users.is_floating_point() or users.is_complex() or users.dtype == torch.bool:
            raise ValueError(f"users must hold integer user ids, got a {users.dtype} tensor")
        users = users.reshape(-1).tolist()
    if isinstance(users, (str, bytes)):
        raise ValueError(f"users must be a sequence of user ids, got {users!r}"[:200])
    return [check_int("user id", _integer_item(u), 0) for u in users], round_num


def check_user_id(value: object, num_users: int) -> int:
    """A task's user id as an ``int`` in ``[0, num_users)``, else ``ValueError`` naming it.

    Integers of any kind (numpy's, a 0-d integer tensor) are ids; ``True``, ``1.5``, ``2.0``
    and ``"3"`` are not (twenty-fifth review of issue 15, finding 8: the tasks' ``user_data``
    and ``user_size`` took them through ``int()`` as users 1, 2 and 3).
    """
    item = _integer_item(value)
    if isinstance(item, bool) or not isinstance(item, Integral) or not 0 <= item < num_users:
        raise ValueError(f"user_id must be an integer in [0, {num_users}), got {shown(value)}")
    return int(item)


def _integer_item(value: object) -> object:
    """A 0-d integer tensor as its int (as ``int()`` took it); anything else unchanged."""
    if (
        isinstance(value, torch.Tensor)
        and value.dim() == 0
        and not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
    ):
        return value.item()
    return value
