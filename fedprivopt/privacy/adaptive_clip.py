"""Quantile-based adaptive clipping (Andrew et al. 2021): the clip norm follows a target quantile.

Each round every sampled user also reports the bit ``b_i = [‖Δ_i‖ ≤ C]`` of its *unclipped*
update. The server releases the noised fraction of unclipped users

    ``b̄ = (Σ (b_i − 1/2) + N(0, σ_b²)) / m̄ + 1/2``

(``m̄`` the expected cohort size) and moves the clip norm geometrically toward the
``γ``-quantile of the users' update norms,

    ``C ← C · exp(−η_C (b̄ − γ))``.

The bits are *centred* (``b_i − 1/2``), as in the paper and TFF's ``QuantileEstimatorQuery``:
adding or removing one user then moves the count by at most ``1/2``, so the count's noise
multiplier (std over sensitivity) is ``2σ_b``. (The uncentred ``Σ b_i`` moves by ``1``; with a
realized cohort equal to ``m̄`` both forms give the same ``b̄``.) The update's noise multiplier
``σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2)`` makes the sum and the count together exactly one Gaussian
mechanism with the user's ``σ`` (the paper's Theorem 1), so ``fedprivopt epsilon`` for ``σ``
gives the run's ε. That needs ``2σ_b > σ``: :func:`update_noise_multiplier` refuses
``σ_b ≤ σ/2``.

This module is framework-free: :func:`adaptive_clip` is an optax-style ``(init, update)`` pair
over :class:`ClipState`, :class:`NoisyCountAggregator` releases the noised fraction (server or
distributed noise, as :class:`~fedprivopt.privacy.aggregate.NoisyMeanAggregator` releases the
sum), and :func:`clip_bit` / :func:`count_share` are what a client reports.

References
----------
G. Andrew, O. Thakkar, H. B. McMahan, S. Ramaswamy, "Differentially Private Learning with Adaptive
Clipping", NeurIPS 2021.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from fedprivopt.core.checks import as_float, check_int, check_real
from fedprivopt.core.text import shown
from fedprivopt.privacy.clip import MIN_CLIP_NORM
from fedprivopt.privacy.limits import MAX_STATE_NOISE_MULTIPLIER
from fedprivopt.privacy.noise import gaussian_noise
from fedprivopt.privacy.received import user_pair
from fedprivopt.privacy.sparse import dense_problem

__all__ = [
    "MAX_CLIP_NORM",
    "AdaptiveClip",
    "ClipState",
    "CountResult",
    "NoisyCountAggregator",
    "adaptive_clip",
    "clip_bit",
    "count_share",
    "default_count_stddev",
    "update_noise_multiplier",
]

#: Upper bound of the adaptive clip norm: ``C`` is kept in ``[MIN_CLIP_NORM, MAX_CLIP_NORM]`` (the
#: largest float) so that a long run of noisy counts can neither underflow nor overflow it.
MAX_CLIP_NORM = sys.float_info.max

#: Reports that carry no count noise: an exact bit (0, 1) or centred bit (-1/2, 1/2). In
#: distributed-noise mode a share ``(b - 1/2) + N(0, s^2)`` equals one of them with probability
#: below ``1e-12`` for ``s >=`` :data:`NOISELESS_MIN_STD` (a float64 draw hits one value with
#: probability about ``ulp / s``). Forty-seventh review of issue 15 (mechanisms 2): a round of 9
#: such reports (``m_min`` 4) released the count without noise (9/10 + 1/2 = 1.4 exactly),
#: reported with noise std 0.075 and charged as noised.
NOISELESS_REPORTS = (-0.5, 0.0, 0.5, 1.0)
NOISELESS_MIN_STD = 1e-3
SHARE_WITHOUT_NOISE = "clip-bit share without its count noise (exactly a bit: no noise was added)"


def default_count_stddev(expected_cohort_size: float) -> float:
    """``σ_b = m̄ / 20``, the paper's default noise on the count (``m̄`` finite and ``> 0``)."""
    size = check_real("expected_cohort_size", expected_cohort_size, low=0.0, low_open=True)
    return size / 20.0


def update_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """``σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2)``: the sum's multiplier that keeps the round at ``σ``.

    Raises
    ------
    ValueError
        Naming ``clip-count-stddev`` when ``σ_b ≤ σ/2`` (the count alone would spend more than
        the round's budget).
    """
    sigma = check_real("noise-multiplier", noise_multiplier, low=0.0, low_open=True)
    sigma_b = check_real("clip-count-stddev", count_stddev, low=0.0, low_open=True)
    if not 2.0 * sigma_b > sigma:
        raise ValueError(
            f"clip-count-stddev must be > noise-multiplier/2 = {sigma / 2:g} (the count's noise "
            f"multiplier 2*clip-count-stddev must exceed the round's {sigma:g}), got {sigma_b:g}"
        )
    # σ_Δ = σ (1 − r²)^(-1/2) with r = σ/(2σ_b) < 1: the same number as (σ⁻² − (2σ_b)⁻²)^(-1/2)
    # without σ⁻², which overflows for a tiny σ
    rest = 1.0 - (sigma / (2.0 * sigma_b)) ** 2
    if not rest > 0:  # 2σ_b so close to σ that the difference rounds to 0
        raise ValueError(
            f"clip-count-stddev = {sigma_b:g} is too close to noise-multiplier/2 = {sigma / 2:g}"
        )
    return sigma / math.sqrt(rest)


@dataclass(frozen=True)
class ClipState:
    """The clip norm of the next round.

    Attributes
    ----------
    clip_norm : float
        ``C`` in ``[MIN_CLIP_NORM, MAX_CLIP_NORM]``.
    """

    clip_norm: float

    def __post_init__(self) -> None:
        c = check_real("clip_norm", self.clip_norm, low=MIN_CLIP_NORM, high=MAX_CLIP_NORM)
        object.__setattr__(self, "clip_norm", c)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form for checkpoints."""
        return {"clip_norm": self.clip_norm}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClipState:
        """Inverse of :meth:`to_dict` (``ValueError`` on anything else)."""
        if not isinstance(data, dict) or set(data) != {"clip_norm"}:
            raise ValueError(f"clip state must be {{'clip_norm': float}}, got {shown(data)}")
        return cls(data["clip_norm"])


class AdaptiveClip(NamedTuple):
    """``init() -> ClipState`` and ``update(fraction, state) -> ClipState``."""

    init: Callable[[], ClipState]
    update: Callable[[float, ClipState], ClipState]
    hparams: dict[str, float]


def adaptive_clip(
    *, initial_clip_norm: float, quantile: float = 0.5, learning_rate: float = 0.2
) -> AdaptiveClip:
    """The geometric update of the clip norm toward the ``quantile`` of the update norms.

    Parameters
    ----------
    initial_clip_norm : float
        ``C_0`` in ``[MIN_CLIP_NORM, MAX_CLIP_NORM]``.
    quantile : float
        Target ``γ`` in ``(0, 1)``: the fraction of users whose update should not be clipped.
    learning_rate : float
        ``η_C > 0``.

    Returns
    -------
    AdaptiveClip
        ``update(b̄, state)`` returns ``C·exp(−η_C(b̄ − γ))``, kept in
        ``[MIN_CLIP_NORM, MAX_CLIP_NORM]``. ``b̄`` is the released (noised) fraction; the update
        is post-processing of it.
    """
    c0 = check_real("clip-norm", initial_clip_norm, low=MIN_CLIP_NORM, high=MAX_CLIP_NORM)
    gamma = check_real("clip-quantile", quantile, low=0.0, high=1.0, low_open=True, high_open=True)
    eta = check_real("clip-learning-rate", learning_rate, low=0.0, low_open=True)

    def init() -> ClipState:
        return ClipState(c0)

    def update(fraction: float, state: ClipState) -> ClipState:
        # a short API review of issue 15: "1", True and a tensor were read as 1, 10**400 raised
        # OverflowError and a state that is no ClipState an AttributeError; the released
        # fraction is noised, so any finite number is one
        fraction = check_real("the released fraction", fraction)
        if not isinstance(state, ClipState):
            raise ValueError(f"state must be a ClipState, got {type(state).__name__}")
        exponent = min(max(-eta * (fraction - gamma), -700.0), 700.0)  # math.exp's range
        c = state.clip_norm * math.exp(exponent)
        return ClipState(min(max(c, MIN_CLIP_NORM), MAX_CLIP_NORM))  # inf becomes the maximum

    return AdaptiveClip(init, update, {"quantile": gamma, "learning_rate": eta})


# -- what a client reports ------------------------------------------------------------------


def clip_bit(norm: float, clip_norm: float) -> float:
    """``1.0`` when an update of L2 norm ``norm`` is not clipped at ``clip_norm``, else ``0.0``.

    A diverged update (``norm`` NaN or Inf) counts as clipped. A short API review of issue 15:
    a negative norm counted as unclipped, a NaN, negative or zero ``clip_norm`` gave a bit, and
    10**400 or a tensor raised ``OverflowError``/``RuntimeError``; ``ValueError`` now.
    """
    clip_norm = check_real("clip_norm", clip_norm, low=0.0, low_open=True)
    if isinstance(norm, bool) or not isinstance(norm, numbers.Real) or norm < 0:
        # not its value (forty-seventh review of issue 15, egress 2): a replacement clip's
        # norm (norm - C: -0.958) reached the server as the reason of a ClientApp's error reply
        real = isinstance(norm, numbers.Real) and not isinstance(norm, bool)
        what = "a negative number" if real else f"a {type(norm).__name__}"
        raise ValueError(f"norm must be a number >= 0 (NaN or inf: diverged), got {what}")
    norm = as_float(norm)
    return 1.0 if math.isfinite(norm) and norm <= clip_norm else 0.0


def count_share(bit: float, std: float, generator: torch.Generator) -> float:
    """A client's distributed-noise report: ``(bit − 1/2) + N(0, std²)`` (``std = 0``: none).

    Raises ``ValueError`` for a ``std`` that is not finite and ``>= 0`` and ``TypeError`` for a
    missing generator: a negative or NaN std added no noise, and ``None`` drew from the global
    RNG (a short review of the Python API, issue 15).
    """
    bit = _binary(bit)
    std = check_real("std", std, low=0.0, high=MAX_STATE_NOISE_MULTIPLIER)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    value = bit - 0.5
    if std > 0:
        value += _gaussian(std, generator)
    return value


def _binary(bit: object) -> float:
    """``bit`` as ``0.0`` or ``1.0``: a bool, or a number (or one-element tensor or array) 0 or 1.

    Thirty-seventh review of issue 15: ``count_share`` took any ``float(bit)``: a bit of 2 (or
    ``norm / C``, ``"1"``, NaN) gave a share ``1.5 + N(0, std²)`` that the server cannot tell
    from an honest one in distributed mode, while the count's noise is sized for a centred bit
    of at most ``1/2``: the client released more about itself than the round accounts.
    """
    value = bit
    if isinstance(bit, (torch.Tensor, np.ndarray)) and math.prod(bit.shape) == 1:
        value = bit.reshape(()).item()
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Real) and value in (0, 1)):
        return float(value)
    # its type only (forty-seventh review of issue 15, egress 2): a bit of norm / C (0.731) sent
    # the user's update norm as the reason of a ClientApp's error reply
    what = "another number" if isinstance(value, numbers.Real) else f"a {type(bit).__name__}"
    raise ValueError(
        f"bit must be 0 or 1 (1: the update was not clipped; see clip_bit), got {what}"
    )


def _gaussian(std: float, generator: torch.Generator) -> float:
    """One ``N(0, std²)`` float64 draw by :func:`~fedprivopt.privacy.noise.gaussian_noise`.

    So a secure-mode generator gets the hardened sampler, as the sum's noise does (thirty-fifth
    review of issue 15: the count's noise, on the server and in the clients' shares, was one
    ``torch.randn`` draw in secure mode too); a seeded draw is the same number as before.
    """
    return float(gaussian_noise(1, std, generator=generator, dtype=torch.float64)[0])


# -- what the server releases ---------------------------------------------------------------


@dataclass
class CountResult:
    """The released fraction of one cohort.

    Attributes
    ----------
    fraction : float
        ``b̄``, the noised fraction of users whose update was not clipped.
    noise_std : float
        Std of the noise on ``b̄`` (``σ_b/m̄``, more with distributed top-ups).
    counted : int
        Reports that entered the count.
    rejected : dict
        Reason of every rejected report, by user id.
    """

    fraction: float
    noise_std: float
    counted: int
    rejected: dict[int, str] = field(default_factory=dict)


class NoisyCountAggregator:
    """The noised count of unclipped users, over the fixed expected cohort size.

    Parameters
    ----------
    count_stddev : float
        ``σ_b > 0``, the std of the noise on the count.
    expected_cohort_size : float
        ``m̄ > 0``.
    noise_mode : {"server", "distributed"}
        ``"server"``: reports are bits, exactly ``0`` or ``1`` (anything else is rejected), and
        the server adds ``N(0, σ_b²)``. ``"distributed"``: reports are shares
        ``(b − 1/2) + N(0, σ_b²/m_min)``; the server tops up ``N(0, σ_b²(m_min − n)/m_min)`` when
        only ``n < m_min`` arrived, and rejects a share outside ``±(1/2 + 11·σ_b/√m_min)``, a
        bound an honest share exceeds with probability below ``e^{-50}``.
    min_shares : int, optional
        ``m_min`` (distributed mode only).
    """

    def __init__(
        self,
        *,
        count_stddev: float,
        expected_cohort_size: float,
        noise_mode: str = "server",
        min_shares: int | None = None,
    ) -> None:
        # as the run configuration bounds it (the count's multiplier 2σ_b must fit an accountant
        # state; 1e300 raised OverflowError from σ_b², twenty-third review of issue 15)
        self.count_stddev = check_real(
            "clip-count-stddev", count_stddev, low=0.0, high=MAX_STATE_NOISE_MULTIPLIER / 2,
            low_open=True,
        )  # fmt: skip
        self.expected_cohort_size = check_real(
            "expected_cohort_size", expected_cohort_size, low=0.0, low_open=True
        )
        if noise_mode not in ("server", "distributed"):
            raise ValueError(f"noise_mode must be server or distributed, got {shown(noise_mode)}")
        self.noise_mode = noise_mode
        distributed = noise_mode == "distributed"
        self.min_shares = check_int("min_shares", min_shares, 1) if distributed else None

    def share_std(self) -> float:
        """Std of one client's count-noise share (``σ_b/√m_min``; 0 in server mode)."""
        if self.noise_mode != "distributed":
            return 0.0
        return self.count_stddev / math.sqrt(self.min_shares)

    def accept_bound(self) -> float:
        """Largest ``|share|`` accepted in distributed mode."""
        return 0.5 + 11.0 * self.share_std()

    def check(self, report: object) -> tuple[float | None, str | None]:
        """``(centred value, None)`` for a valid report, ``(None, reason)`` otherwise."""
        value = _scalar(report)
        if value is None:
            return None, "clip bit must be one finite number"
        # the reason (the round's warning, a deployment's serverapp.log) does not show the value:
        # a client's norm / C (forty-seventh review of issue 15, egress 4)
        if self.noise_mode == "server":
            if value not in (0.0, 1.0):
                return None, "clip bit must be 0 or 1, got another number"
            return value - 0.5, None
        if abs(value) > self.accept_bound():
            return None, f"clip-bit share outside ±{self.accept_bound():g}"
        if value in NOISELESS_REPORTS and self.share_std() >= NOISELESS_MIN_STD:
            # forty-seventh review of issue 15 (mechanisms 2): an exact bit sent as a share
            # (clip_bit's report without count_share's noise) was counted, no top-up drawn
            return None, SHARE_WITHOUT_NOISE
        return value, None

    def aggregate(
        self, reports: Iterable[tuple[int, object]], *, generator: torch.Generator | None
    ) -> CountResult:
        """Release ``b̄`` from ``(user, report)`` pairs (see the class docstring).

        The noise is one float64 draw from ``generator`` (required; the hardened sampler of
        :mod:`~fedprivopt.privacy.noise` in secure mode).
        """
        total, counted, rejected, seen = 0.0, 0, {}, set()
        for i, entry in enumerate(reports):
            # thirty-seventh review of issue 15: a user id of 1.2 and 1.7 shared one rejected
            # entry, "u" was counted or raised int()'s message, and a bare report ended in
            # "cannot unpack"
            user, report = user_pair(i, entry, "reports", "(user_id, report) pair")
            if user in seen:  # thirty-fifth review of issue 15: both reports were counted
                raise ValueError(
                    f"reports: user {shown(user)} appears twice (one clip bit a user: the count's "
                    "noise is sized for one)"
                )
            seen.add(user)
            value, reason = self.check(report)
            if reason is not None:
                rejected[user] = reason
                continue
            total += value
            counted += 1
        var = self.count_stddev**2
        if self.noise_mode == "server":
            topup, sum_var = var, var
        else:
            topup = var * max(0, self.min_shares - counted) / self.min_shares
            sum_var = var * max(counted, self.min_shares) / self.min_shares
        if topup > 0:
            if generator is None:
                raise ValueError("generator is required for the noised count")
            total += _gaussian(math.sqrt(topup), generator)
        m = self.expected_cohort_size
        return CountResult(total / m + 0.5, math.sqrt(sum_var) / m, counted, rejected)


def _scalar(report: object) -> float | None:
    """The one finite float a report holds (a number or a one-element float array), or ``None``."""
    if isinstance(report, (bool, np.bool_)):
        return None
    if isinstance(report, (int, float, np.integer, np.floating)):
        # thirty-eighth review of issue 15: a NumPy scalar bit (np.float32(1.0), np.int64(0)),
        # which count_share takes, was rejected as not a number and its update left out
        value = float(report)
    elif isinstance(report, np.ndarray):
        if tuple(report.shape) not in ((), (1,)) or report.dtype.kind != "f":
            return None
        value = float(report.reshape(()).item())
    elif isinstance(report, torch.Tensor):
        if dense_problem(report) is not None:
            # thirty-ninth review of issue 15 (mechanisms 2): a meta or sparse one-element
            # report raised torch's RuntimeError out of the whole count (and the round's screen);
            # follow-up: a nested one (layout strided) raised it from its shape
            return None
        if tuple(report.shape) not in ((), (1,)) or not report.dtype.is_floating_point:
            return None
        value = float(report.reshape(()).item())
    else:
        return None
    return value if math.isfinite(value) else None
