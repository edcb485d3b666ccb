"""Server SGD with optional (Nesterov) momentum: the DP-FedAvg server step."""

from __future__ import annotations

import dataclasses

import torch

from ._checks import check_bool, check_params, check_real, check_update_inputs
from .base import ServerTransform, StateDictMixin, record_hparams

__all__ = ["MomentumState", "momentum_sgd"]


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
    *, learning_rate: float, momentum: float = 0.0, nesterov: bool = False
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

    Parameters
    ----------
    learning_rate : float
        Server learning rate ``η_s`` in ``(0, inf)``.
    momentum : float, default 0.0
        Momentum ``β`` in ``[0, 1)``.
    nesterov : bool, default False
        Use Nesterov momentum; requires ``momentum > 0``.

    Returns
    -------
    ServerTransform
        ``init(params) -> MomentumState`` and ``update(delta_tilde, state, params=None, *,
        noise_variance=None) -> (step, state)``; ``noise_variance`` is ignored.

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
        del noise_variance  # public metadata this transform does not use
        check_update_inputs(delta_tilde, params, state.momentum)
        m = state.momentum.mul(beta).add_(delta_tilde) if beta else delta_tilde.clone()
        direction = m.mul(beta).add_(delta_tilde) if nesterov else m
        step = direction.mul(lr)
        return step, MomentumState(count=state.count + 1, momentum=m)

    hparams = record_hparams("momentum_sgd", learning_rate=lr, momentum=beta, nesterov=nesterov)
    return ServerTransform(init, update, hparams)
