"""Server Adam on the noised mean update: FedAdam (Reddi et al. 2021) and Flower's variant."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Literal

import torch

from fedprivopt.core.text import shown

from ._checks import (
    check_bool,
    check_int,
    check_params,
    check_real,
    check_state,
    check_update_inputs,
)
from .base import ServerTransform, StateDictMixin, record_hparams

__all__ = ["AdamState", "adam", "flower_fedadam"]

TauPlacement = Literal["corrected", "raw"]


@dataclasses.dataclass(frozen=True, eq=False)
class AdamState(StateDictMixin):
    """State of :func:`adam`.

    Attributes
    ----------
    count : int
        Number of updates applied so far (the k of the k-th update is ``count`` after it).
    mu : torch.Tensor
        First moment ``m`` (EMA of Δ̃), dtype and device of params.
    nu : torch.Tensor
        Second moment ``v`` (EMA of Δ̃²), dtype and device of params.
    """

    #: fields whose entries no update leaves negative (checked by ``from_dict``)
    NONNEGATIVE: ClassVar[tuple[str, ...]] = ("nu",)

    count: int
    mu: torch.Tensor
    nu: torch.Tensor


def adam(
    *,
    learning_rate: float,
    beta1: float = 0.9,
    beta2: float = 0.99,
    tau: float | None = 1e-3,
    bias_correction: bool = True,
    tau_placement: TauPlacement = "corrected",
    count_offset: int = 0,
) -> ServerTransform:
    r"""Adam on the pseudo-gradient ``-Δ̃`` (FedAdam when Δ̃ is the noised mean client delta).

    Each update does (all operations per coordinate)

    .. math::

        m \leftarrow \beta_1 m + (1-\beta_1)\tilde\Delta, \qquad
        v \leftarrow \beta_2 v + (1-\beta_2)\tilde\Delta^2,

    and returns one of three steps, with :math:`t = k + \text{count\_offset}` on the k-th
    update (k = 1, 2, ...), :math:`b_1 = 1-\beta_1^t` and :math:`b_2 = 1-\beta_2^t`:

    * ``bias_correction=False``: :math:`\eta\, m / (\sqrt v + \tau)`. This is FedAdam exactly as
      in Algorithm 2 of Reddi et al. (2021), which has no bias correction.
    * ``bias_correction=True, tau_placement="corrected"`` (default):
      :math:`\eta\, \hat m / (\sqrt{\hat v} + \tau)` with :math:`\hat m = m/b_1`,
      :math:`\hat v = v/b_2`; Algorithm 1 of Kingma & Ba (2015), as in PyTorch and optax.
    * ``bias_correction=True, tau_placement="raw"``:
      :math:`\eta\,(\sqrt{b_2}/b_1)\, m / (\sqrt v + \tau)`; the "efficient version" of Kingma
      & Ba (Sec. 2, with :math:`\hat\epsilon`), i.e. :math:`\eta\,\hat m/(\sqrt{\hat v} +
      \tau/\sqrt{b_2})`. This is the convention of Flower's ``FedAdam``.

    **Matching Flower.** ``flwr.serverapp.strategy.FedAdam`` (flwr 1.41,
    ``serverapp/strategy/fedadam.py``, ``aggregate_train``) computes
    ``eta_norm = eta * sqrt(1 - beta_2**(server_round + 1)) / (1 - beta_1**(server_round + 1))``
    and ``x + eta_norm * m_t / (sqrt(v_t) + tau)``, with ``m_t``, ``v_t`` the uncorrected EMAs
    of ``delta_t = aggregate - current`` (``fedopt.py``, ``_compute_deltat_and_mt``) and
    ``server_round`` counting from 1. That is ``tau_placement="raw"`` with ``count_offset=1``
    (its first round already uses :math:`t = 2`); :func:`flower_fedadam` builds exactly this.
    Two differences remain by design: Flower ties ``t`` to the round number, so after a round
    that aggregated nothing its ``t`` runs ahead of ours (ours counts updates); and Flower
    returns float64 arrays for a float32 model (``eta_norm`` is a NumPy float64), while this
    transform keeps the dtype of the state.

    Parameters
    ----------
    learning_rate : float
        Server learning rate ``η`` in ``(0, inf)``.
    beta1 : float, default 0.9
        First-moment decay in ``[0, 1)``.
    beta2 : float, default 0.99
        Second-moment decay in ``[0, 1)``.
    tau : float or None, default 1e-3
        Adaptivity constant ``τ`` (Adam's ε) in ``(0, inf)``; below the smallest normal number
        of the parameters' dtype (``torch.finfo(dtype).tiny``, 1.2e-38 in float32), which it
        would round to 0 in, that number is used. ``None``: ``τ_t = √Φ_t``, the
        per-coordinate noise std of the round's Δ̃, passed every round as
        ``update(..., noise_variance=Φ_t)``. A coordinate whose second moment is the noise
        alone then steps by ``m̂/(2√Φ)`` whatever σ is, the scale DP-AdamBC's floor ``γ′ = Φ``
        also sets (its pure-noise step is ``m̂/√Φ``).
    bias_correction : bool, default True
        Apply Adam's bias correction.
    tau_placement : {"corrected", "raw"}, default "corrected"
        Whether ``τ`` is added to the bias-corrected ``√v̂`` or to the raw ``√v``; ignored
        without bias correction.
    count_offset : int, default 0
        Added to the update count to form the bias-correction exponent ``t``; ``0`` for
        textbook Adam, ``1`` to match Flower.

    Returns
    -------
    ServerTransform
        ``init(params) -> AdamState`` and ``update(delta_tilde, state, params=None, *,
        noise_variance=None) -> (step, state)``; ``noise_variance`` is used only when ``tau``
        is ``None`` (see :func:`~fedprivopt.optim.adam_bc` for the DP-corrected variant).

    Raises
    ------
    ValueError
        If a hyperparameter is outside its range.

    References
    ----------
    .. [1] S. J. Reddi, Z. Charles, M. Zaheer, Z. Garrett, K. Rush, J. Konečný, S. Kumar,
       H. B. McMahan, "Adaptive Federated Optimization", ICLR 2021.
    .. [2] D. P. Kingma, J. Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015.
    """
    lr = check_real("learning_rate", learning_rate, low=0.0, low_open=True)
    b1 = check_real("beta1", beta1, low=0.0, high=1.0, high_open=True)
    b2 = check_real("beta2", beta2, low=0.0, high=1.0, high_open=True)
    if tau is not None:
        tau = check_real("tau", tau, low=0.0, low_open=True)
    bias_correction = check_bool("bias_correction", bias_correction)
    if tau_placement not in ("corrected", "raw"):
        raise ValueError(f"tau_placement must be 'corrected' or 'raw', got {shown(tau_placement)}")
    # at most int64's largest: 10**400 raised OverflowError in beta**t (a short API review)
    count_offset = check_int("count_offset", count_offset, low=0, high=2**63 - 1)

    def init(params: torch.Tensor) -> AdamState:
        params = check_params(params)
        return AdamState(count=0, mu=torch.zeros_like(params), nu=torch.zeros_like(params))

    @torch.no_grad()
    def update(
        delta_tilde: torch.Tensor,
        state: AdamState,
        params: torch.Tensor | None = None,
        *,
        noise_variance: float | None = None,
    ) -> tuple[torch.Tensor, AdamState]:
        check_update_inputs(delta_tilde, params, check_state(state, AdamState).mu)
        tau_t = tau if tau is not None else _noise_tau(noise_variance)
        count = state.count + 1
        mu = torch.lerp(state.mu, delta_tilde, 1.0 - b1)
        nu = state.nu.mul(b2).addcmul_(delta_tilde, delta_tilde, value=1.0 - b2)
        # Every convention is scale * m / (sqrt(v) + tau_eff), which needs one temporary:
        # m_hat / (sqrt(v_hat) + tau) = (sqrt(b_2) / b_1) * m / (sqrt(v) + tau * sqrt(b_2)).
        scale, tau_eff = lr, tau_t
        if bias_correction:
            t = count + count_offset
            sqrt_bc2 = math.sqrt(1.0 - b2**t)
            scale = lr * sqrt_bc2 / (1.0 - b1**t)
            if tau_placement == "corrected":
                tau_eff = tau_t * sqrt_bc2
        # A tau below the dtype's smallest normal number rounds to 0 in it (tau None follows
        # sigma C/m, 1e-50 at sigma 1e-48): 0/0 where m and v are 0 made the model NaN
        # (eighteenth review of issue 15, finding 1); the smallest normal number is tau's floor.
        denom = nu.sqrt().add_(max(tau_eff, torch.finfo(nu.dtype).tiny))
        step = torch.div(mu, denom, out=denom).mul_(scale)
        return step, AdamState(count=count, mu=mu, nu=nu)

    hparams = record_hparams(
        "adam",
        learning_rate=lr,
        beta1=b1,
        beta2=b2,
        tau=tau,
        bias_correction=bias_correction,
        tau_placement=tau_placement,
        count_offset=count_offset,
    )
    return ServerTransform(init, update, hparams)


def _noise_tau(noise_variance: float | None) -> float:
    """``√Φ_t`` for ``tau=None``: the round's per-coordinate noise std of Δ̃ (public metadata)."""
    if noise_variance is None:
        raise ValueError(
            "tau = None (tau follows the noise std) needs update(..., noise_variance=Phi_t)"
        )
    phi = check_real("noise_variance", noise_variance, low=0.0, low_open=True)
    return math.sqrt(phi)


def flower_fedadam(
    *, eta: float = 1e-1, beta_1: float = 0.9, beta_2: float = 0.99, tau: float = 1e-3
) -> ServerTransform:
    """Build the server step of Flower's ``FedAdam``, with Flower's argument names and defaults.

    Equivalent to ``adam(learning_rate=eta, beta1=beta_1, beta2=beta_2, tau=tau,
    bias_correction=True, tau_placement="raw", count_offset=1)``; see :func:`adam` for the
    formula, the reading of Flower's source it rests on, and the two remaining differences
    (round-tied ``t`` after empty rounds, float64 output in Flower).

    Parameters
    ----------
    eta : float, default 0.1
        Server learning rate.
    beta_1 : float, default 0.9
        First-moment decay.
    beta_2 : float, default 0.99
        Second-moment decay.
    tau : float, default 1e-3
        Adaptivity constant.

    Returns
    -------
    ServerTransform
        An :func:`adam` transform.

    Raises
    ------
    ValueError
        If an argument is outside its range (the message uses Flower's argument name).

    References
    ----------
    .. [1] S. J. Reddi et al., "Adaptive Federated Optimization", ICLR 2021.
    .. [2] Flower 1.41, ``flwr.serverapp.strategy.FedAdam``.
    """
    # Validate under Flower's names so an error names the argument the caller actually passed.
    eta = check_real("eta", eta, low=0.0, low_open=True)
    beta_1 = check_real("beta_1", beta_1, low=0.0, high=1.0, high_open=True)
    beta_2 = check_real("beta_2", beta_2, low=0.0, high=1.0, high_open=True)
    tau = check_real("tau", tau, low=0.0, low_open=True)
    return adam(
        learning_rate=eta,
        beta1=beta_1,
        beta2=beta_2,
        tau=tau,
        bias_correction=True,
        tau_placement="raw",
        count_offset=1,
    )
