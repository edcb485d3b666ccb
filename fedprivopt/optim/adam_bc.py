"""DP-AdamBC: Adam whose second moment is corrected for the known DP noise variance."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import ClassVar

import torch

from ._checks import (
    check_in_dtype,
    check_noise_variance_spec,
    check_params,
    check_real,
    check_state,
    check_update_inputs,
    resolve_noise_variance,
)
from .base import ServerTransform, StateDictMixin, record_hparams

__all__ = ["AdamBCState", "adam_bc", "noise_corrected_second_moment"]


@dataclasses.dataclass(frozen=True, eq=False)
class AdamBCState(StateDictMixin):
    """State of :func:`adam_bc`.

    Attributes
    ----------
    count : int
        Number of updates applied so far (``t`` of the last update).
    mu : torch.Tensor
        First moment ``m`` (EMA of Δ̃, not bias-corrected).
    nu : torch.Tensor
        Second moment ``v`` (EMA of Δ̃², not bias-corrected).
    noise_ema : float
        EMA with decay ``beta2`` of the per-round noise variances ``Φ_t``, not bias-corrected,
        so that ``noise_ema / (1 - beta2**t)`` is the ``Φ̂`` matching ``v̂``.
    floor_fraction : float
        Fraction of coordinates whose ``v̂ - Φ̂`` fell below ``gamma`` in the last update (a
        diagnostic for tuning ``gamma``; 0 before the first update).
    """

    #: fields whose entries no update leaves negative (checked by ``from_dict``)
    NONNEGATIVE: ClassVar[tuple[str, ...]] = ("nu",)

    count: int
    mu: torch.Tensor
    nu: torch.Tensor
    noise_ema: float
    floor_fraction: float


def adam_bc(
    *,
    learning_rate: float,
    gamma: float | None,
    noise_variance: float | Callable[[int], float] | None,
    beta1: float = 0.9,
    beta2: float = 0.99,
) -> ServerTransform:
    r"""DP-AdamBC (Tang et al. 2024) on the noised mean update Δ̃.

    Δ̃ carries isotropic Gaussian noise of known per-coordinate variance ``Φ = (σC/m̄)²``, so
    ``E[Δ̃²] = Δ² + Φ`` and plain Adam's ``v̂`` is dominated by noise: the step degenerates to
    a sign-like DP-SGD step. DP-AdamBC subtracts the noise variance from the bias-corrected
    second moment. On the t-th update (t = 1, 2, ...):

    .. math::

        m &\leftarrow \beta_1 m + (1-\beta_1)\tilde\Delta, \qquad
        v \leftarrow \beta_2 v + (1-\beta_2)\tilde\Delta^2, \qquad
        e \leftarrow \beta_2 e + (1-\beta_2)\Phi_t, \\
        \hat m &= m / (1-\beta_1^t), \quad \hat v = v / (1-\beta_2^t), \quad
        \hat\Phi = e / (1-\beta_2^t), \\
        \text{step} &= \eta\, \hat m \,/\, \sqrt{\max(\hat v - \hat\Phi,\ \gamma')}.

    With a constant ``Φ`` the EMA gives exactly ``Φ̂ = Φ``; when the noise varies by round (e.g.
    distributed noise with a varying cohort) ``Φ̂`` is the same bias-corrected EMA of the
    ``Φ_t`` that ``v̂`` is of the ``Δ̃²``, so ``v̂ - Φ̂`` stays centred on the signal's second
    moment. The floor ``γ′`` is on the scale of ``Φ`` and must be tuned: far below ``Φ``, the
    coordinates whose ``v̂`` falls under ``Φ`` by chance get huge steps
    (``state.floor_fraction`` reports how many hit the floor).

    **Reduction to Adam.** With ``Φ = 0`` the step is ``η m̂ / √max(v̂, γ′)``: bias-corrected
    Adam whose ε is a floor on ``v̂`` rather than a constant added to ``√v̂``. It coincides with
    :func:`~fedprivopt.optim.adam` (``bias_correction=True``) in the limit ``γ′ → 0``,
    ``τ → 0``, and exactly on every coordinate with ``v̂ ≥ γ′`` when compared with ``τ = 0``.

    The floor is applied on the bias-corrected scale, as in the paper's update rule. (Some
    implementations floor the uncorrected ``v - (1-β2^t)Φ`` instead, i.e. use the effective
    floor ``γ′/(1-β2^t)``; the two agree once ``β2^t`` is small.)

    Parameters
    ----------
    learning_rate : float
        Server learning rate ``η`` in ``(0, inf)``.
    gamma : float or None
        Floor ``γ′`` of the corrected second moment, in ``(0, inf)``; on the scale of ``Φ``.
        ``None``: the floor follows the noise, ``γ′_t = Φ̂_t`` (then ``Φ_t > 0`` is required):
        with a constant ``Φ`` this is ``γ′ = Φ``; when ``Φ_t`` moves (adaptive clipping moves
        ``C``) a fixed ``γ′`` chosen for the first round would be off by the square of ``C``'s
        change (measured: ``C`` 0.2 → 3.6 made ``Φ`` 300 times larger and DP-AdamBC diverged).
        A floor below the smallest normal number of the parameters' dtype
        (``torch.finfo(dtype).tiny``), which it would round to 0 in, is raised to that number.
    noise_variance : float or callable or None
        Per-coordinate noise variance ``Φ`` of Δ̃: a float in ``[0, inf)``; a callable
        ``t -> Φ_t`` of the 1-based update index; or ``None``, in which case every call must
        pass ``update(..., noise_variance=Φ_t)``. A per-call value always wins.
    beta1 : float, default 0.9
        First-moment decay in ``[0, 1)``.
    beta2 : float, default 0.99
        Second-moment decay in ``[0, 1)``.

    Returns
    -------
    ServerTransform
        ``init(params) -> AdamBCState`` and ``update(delta_tilde, state, params=None, *,
        noise_variance=None) -> (step, state)``.

    Raises
    ------
    ValueError
        If a hyperparameter is outside its range; from ``update``, if the round's noise variance
        is missing, negative or not finite.

    References
    ----------
    .. [1] Q. Tang, F. Shpilevskiy, M. Lécuyer, "DP-AdamBC: Your DP-Adam Is Actually DP-SGD
       (Unless You Apply Bias Correction)", AAAI 2024.
    .. [2] D. P. Kingma, J. Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015.
    """
    lr = check_real("learning_rate", learning_rate, low=0.0, low_open=True)
    if gamma is not None:
        gamma = check_real("gamma", gamma, low=0.0, low_open=True)
    phi_spec = check_noise_variance_spec(noise_variance, allow_none=True)
    b1 = check_real("beta1", beta1, low=0.0, high=1.0, high_open=True)
    b2 = check_real("beta2", beta2, low=0.0, high=1.0, high_open=True)

    def init(params: torch.Tensor) -> AdamBCState:
        params = check_params(params)
        check_in_dtype("gamma", gamma, params)
        zeros = torch.zeros_like(params)
        return AdamBCState(count=0, mu=zeros, nu=zeros.clone(), noise_ema=0.0, floor_fraction=0.0)

    @torch.no_grad()
    def update(
        delta_tilde: torch.Tensor,
        state: AdamBCState,
        params: torch.Tensor | None = None,
        *,
        noise_variance: float | None = None,
    ) -> tuple[torch.Tensor, AdamBCState]:
        check_update_inputs(delta_tilde, params, check_state(state, AdamBCState).mu)
        t = state.count + 1
        phi_t = resolve_noise_variance(phi_spec, noise_variance, t)
        mu = torch.lerp(state.mu, delta_tilde, 1.0 - b1)
        nu = state.nu.mul(b2).addcmul_(delta_tilde, delta_tilde, value=1.0 - b2)
        noise_ema = b2 * state.noise_ema + (1.0 - b2) * phi_t
        bc1 = 1.0 - b1**t
        bc2 = 1.0 - b2**t
        # v_hat - Phi_hat = (v - e) / b_2 and the floor gamma on it is gamma * b_2 on v - e, so
        # step = lr * (sqrt(b_2) / b_1) * m / sqrt(max(v - e, gamma * b_2)): one temporary.
        # Following the noise (gamma None), gamma_t = Phi_hat_t = e / b_2: the floor is e itself.
        if gamma is None and not noise_ema > 0.0:
            raise ValueError("gamma = None (the floor follows the noise) needs noise variance > 0")
        # A floor below the dtype's smallest normal number rounds to 0 in it (gamma None
        # follows Phi, 1e-62 at sigma 1e-30): 0/0 where m and v are 0 made the model NaN
        # (eighteenth review of issue 15, finding 1); the smallest normal number is its floor.
        # A floor beyond the dtype's largest number (Φ = (σC/m̄)² of 1e200 at clip-norm 1e100
        # on float32; a short API review of issue 15) made clamp_ raise; the largest number is
        # its ceiling (Δ̃ itself has overflowed there: the run reports divergence).
        info = torch.finfo(nu.dtype)
        floor = min(max(noise_ema if gamma is None else gamma * bc2, info.tiny), info.max)
        denom = nu.sub(noise_ema)
        floor_count = int(torch.count_nonzero(denom < floor))
        denom.clamp_(min=floor).sqrt_()
        step = torch.div(mu, denom, out=denom).mul_(lr * math.sqrt(bc2) / bc1)
        floor_fraction = floor_count / max(denom.numel(), 1)
        new_state = AdamBCState(
            count=t, mu=mu, nu=nu, noise_ema=noise_ema, floor_fraction=floor_fraction
        )
        return step, new_state

    hparams = record_hparams(
        "adam_bc",
        learning_rate=lr,
        gamma=gamma,
        noise_variance=phi_spec,
        beta1=b1,
        beta2=b2,
    )
    return ServerTransform(init, update, hparams)


def noise_corrected_second_moment(state: AdamBCState, *, beta2: float) -> torch.Tensor:
    """Return the DP-corrected second moment ``v̂ - Φ̂`` of an :func:`adam_bc` state (unfloored).

    Parameters
    ----------
    state : AdamBCState
        A state after at least one update.
    beta2 : float
        The ``beta2`` the transform was built with (``transform.hparams["beta2"]``).

    Returns
    -------
    torch.Tensor
        ``v / (1 - beta2**t) - noise_ema / (1 - beta2**t)``; centred on the signal's second
        moment, so on pure noise its mean is close to 0.

    Raises
    ------
    ValueError
        If the state has no update yet or ``beta2`` is outside ``[0, 1)``.
    """
    b2 = check_real("beta2", beta2, low=0.0, high=1.0, high_open=True)
    if check_state(state, AdamBCState).count < 1:
        raise ValueError("state.count must be in [1, inf) (at least one update), got 0")
    bc2 = 1.0 - b2**state.count
    return state.nu.div(bc2).sub_(state.noise_ema / bc2)
