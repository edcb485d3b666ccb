"""Server SGD with optional (Nesterov) momentum: the DP-FedAvg server step."""

from __future__ import annotations

import dataclasses
import math

import torch

from ._checks import check_bool, check_params, check_real, check_state, check_update_inputs
from .base import ServerTransform, StateDictMixin, record_hparams

__all__ = ["MomentumState", "capped_rate", "momentum_sgd", "momentum_sgd_rate"]


@dataclasses.dataclass(frozen=True, eq=False)
class MomentumState(StateDictMixin):
    """State of :func:`momentum_sgd`.

    Attributes
    ----------
    count : int
        Number of updates applied so far.
    momentum : torch.Tensor
        The momentum buffer ``m`` (zeros before the first update), dtype and device of params.
    """

    count: int
    momentum: torch.Tensor


def momentum_sgd(
    *,
    learning_rate: float,
    momentum: float = 0.0,
    nesterov: bool = False,
    max_noise_step: float | None = None,
) -> ServerTransform:
    r"""Server SGD with heavy-ball or Nesterov momentum on the noised mean update.

    With Δ̃ the noised mean model delta (the negative pseudo-gradient), each update does

    .. math::

        m \leftarrow \beta m + \tilde\Delta, \qquad
        \text{step} = \eta_s m \quad\text{or, with Nesterov,}\quad
        \text{step} = \eta_s (\beta m + \tilde\Delta),

    and the new parameters are ``params + step``. ``momentum=0`` is the plain FedAvg server
    step ``w ← w + η_s Δ̃`` (DP-FedAvg of McMahan et al. 2018); ``momentum > 0`` is their
    DP-FedAvg with server momentum. The Nesterov form is the one PyTorch's ``SGD`` and optax's
    ``trace`` use.

    With ``max_noise_step = κ`` the round's rate is ``η_t = min(η_s, κ(1 - β)/√Φ_t)``, where
    ``√Φ_t`` is the per-coordinate std of the noise on Δ̃ (``update(..., noise_variance=Φ_t)``,
    public: σC_t/m̄): the whole move one round's noise makes in a coordinate, over this step and
    the momentum's later ones (``η_t√Φ_t(1 + β + β² + …) = η_t√Φ_t/(1 - β)``), is at most κ. At a
    fixed rate that move grows with σ while the signal does not; bounding it keeps the *total
    amount of noise* of the run's steps in check, the quantity that predicts DP training's
    outcome at a given rate (Sander, Stock and Sablayrolles, "TAN without a burn", ICML 2023).
    Rounds whose ``η_s√Φ_t/(1 - β) ≤ κ`` (small σ) are unchanged.

    Parameters
    ----------
    learning_rate : float
        Server learning rate ``η_s`` in ``(0, inf)``.
    momentum : float, default 0.0
        Momentum ``β`` in ``[0, 1)``.
    nesterov : bool, default False
        Use Nesterov momentum; requires ``momentum > 0``.
    max_noise_step : float or None, default None
        κ in ``(0, inf)``: the largest move one round's noise may make in a coordinate, in
        std (see above); ``None``: the rate is ``η_s`` in every round.

    Returns
    -------
    ServerTransform
        ``init(params) -> MomentumState`` and ``update(delta_tilde, state, params=None, *,
        noise_variance=None) -> (step, state)``; ``noise_variance`` is used only with
        ``max_noise_step`` (``None`` or 0 there: no noise, the rate is ``η_s``).

    Raises
    ------
    ValueError
        If a hyperparameter is outside its range.

    References
    ----------
    .. [1] H. B. McMahan, D. Ramage, K. Talwar, L. Zhang, "Learning Differentially Private
       Recurrent Language Models", ICLR 2018.
    .. [2] I. Sutskever, J. Martens, G. Dahl, G. Hinton, "On the importance of initialization
       and momentum in deep learning", ICML 2013.
    """
    lr = check_real("learning_rate", learning_rate, low=0.0, low_open=True)
    beta = check_real("momentum", momentum, low=0.0, high=1.0, high_open=True)
    nesterov = check_bool("nesterov", nesterov)
    kappa = None
    if max_noise_step is not None:
        kappa = check_real("max_noise_step", max_noise_step, low=0.0, low_open=True)
    if nesterov and beta == 0.0:
        raise ValueError("momentum must be in (0, 1) when nesterov=True, got 0.0")

    def init(params: torch.Tensor) -> MomentumState:
        params = check_params(params)
        return MomentumState(count=0, momentum=torch.zeros_like(params))

    @torch.no_grad()
    def update(
        delta_tilde: torch.Tensor,
        state: MomentumState,
        params: torch.Tensor | None = None,
        *,
        noise_variance: float | None = None,
    ) -> tuple[torch.Tensor, MomentumState]:
        rate = momentum_sgd_rate(hparams, noise_variance)
        check_update_inputs(delta_tilde, params, check_state(state, MomentumState).momentum)
        m = state.momentum.mul(beta).add_(delta_tilde) if beta else delta_tilde.clone()
        direction = m.mul(beta).add_(delta_tilde) if nesterov else m
        step = direction.mul(rate)
        return step, MomentumState(count=state.count + 1, momentum=m)

    capped = {} if kappa is None else {"max_noise_step": kappa}
    hparams = record_hparams(
        "momentum_sgd", learning_rate=lr, momentum=beta, nesterov=nesterov, **capped
    )
    return ServerTransform(init, update, hparams)


def momentum_sgd_rate(hparams, noise_variance: float | None) -> float:
    """The rate a :func:`momentum_sgd` step with ``hparams`` takes at noise variance ``Φ_t``.

    ``η_s``, or with ``max_noise_step`` κ, ``min(η_s, κ(1 - β)/√Φ_t)``: what ``update`` uses and
    what a strategy reports as ``server_learning_rate``.
    """
    lr, kappa = hparams["learning_rate"], hparams.get("max_noise_step")
    if kappa is None:
        return lr
    return capped_rate(lr, kappa * (1.0 - hparams["momentum"]), noise_variance)


def capped_rate(lr: float, bound: float, noise_variance: float | None) -> float:
    """``min(lr, bound/√Φ)``; ``lr`` when there is no noise (``Φ`` None or 0).

    Raises
    ------
    ValueError
        For a rate or bound that is negative or not a finite number (a NaN bound made ``min``
        return ``lr``, a negative one a negative rate: nineteenth review of issue 15), or a
        negative ``Φ``.
    """
    lr = check_real("lr", lr, low=0.0) + 0.0  # 0 where a rate or κ(1 - β) underflowed
    bound = check_real("bound", bound, low=0.0) + 0.0  # + 0.0: -0.0 is 0.0, a rate not below 0
    if noise_variance is None:
        return lr
    phi = check_real("noise_variance", noise_variance, low=0.0)
    return lr if phi == 0.0 else min(lr, bound / math.sqrt(phi))
