"""DP² delayed preconditioners (Li et al. 2023) as a server state machine."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import ClassVar, Literal

import torch

from ._checks import (
    check_bool,
    check_frozen,
    check_in_dtype,
    check_int,
    check_noise_variance_spec,
    check_params,
    check_real,
    check_state,
    check_update_inputs,
    resolve_noise_variance,
)
from .base import ServerTransform, StateDictMixin, record_hparams
from .sgd import capped_rate

__all__ = [
    "DP2State",
    "Phase",
    "dp2",
    "dp2_capped_fraction",
    "dp2_rate",
    "phase",
    "preconditioner",
    "preconditioner_mean",
]

Phase = Literal["sgd", "adaptive"]


@dataclasses.dataclass(frozen=True, eq=False)
class DP2State(StateDictMixin):
    """State of :func:`dp2`; it describes the **next** round to be run.

    Attributes
    ----------
    count : int
        Number of updates applied so far.
    adaptive : bool
        Whether the next round is an adaptive round (else an SGD round).
    phase_step : int
        Rounds already completed in the current phase (``0 <= phase_step < s1`` or ``< s2``).
    accumulator : torch.Tensor
        ``G``, the sum of the Δ̃ of the SGD rounds of the current SGD phase.
    accumulator_noise_variance : float
        Sum of the per-coordinate noise variances ``Φ_t`` of those rounds, so that the noise
        variance of ``G / s1`` is ``accumulator_noise_variance / s1²``.
    second_moment : torch.Tensor
        ``v``, updated only at the switch from an SGD phase to an adaptive phase.
    preconditioner : torch.Tensor
        ``P = √v + ε`` formed at the last switch (``ε`` everywhere before the first switch);
        in use only during adaptive rounds, see :func:`preconditioner`.
    """

    #: fields whose entries no update leaves negative, or at most 0 (checked by ``from_dict``)
    NONNEGATIVE: ClassVar[tuple[str, ...]] = ("second_moment",)
    POSITIVE: ClassVar[tuple[str, ...]] = ("preconditioner",)

    count: int
    adaptive: bool
    phase_step: int
    accumulator: torch.Tensor
    accumulator_noise_variance: float
    second_moment: torch.Tensor
    preconditioner: torch.Tensor


def phase(state: DP2State) -> Phase:
    """Return the phase of the next round: ``"sgd"`` or ``"adaptive"``."""
    return "adaptive" if check_state(state, DP2State).adaptive else "sgd"


def preconditioner(state: DP2State) -> torch.Tensor | None:
    """Return the delayed preconditioner ``P`` of the next round, or ``None`` in an SGD round.

    In the default (precondition-first) mode this is what the strategy broadcasts: clients divide
    their local gradients by ``P`` before clipping. With ``noise_first=True`` (see :func:`dp2`)
    clients train plainly and the transform applies ``P`` itself after noising, so nothing is
    broadcast; this function still reports the ``P`` the server will use.
    """
    return state.preconditioner if check_state(state, DP2State).adaptive else None


def dp2(
    *,
    sgd_learning_rate: float,
    adaptive_learning_rate: float,
    s1: int,
    s2: int,
    epsilon: float,
    beta: float = 0.9,
    noise_variance: float | Callable[[int], float] | None = 0.0,
    subtract_noise_variance: bool = False,
    noise_first: bool = False,
    clip_norm_adaptive: float | None = None,
    scale_by_preconditioner: bool = False,
    max_noise_step: float | None = None,
    frozen: torch.Tensor | None = None,
) -> ServerTransform:
    r"""DP² (DP²-RMSProp) of Li et al. (2023): alternate SGD and delayed-preconditioner rounds.

    Rounds cycle through ``s1`` SGD rounds then ``s2`` adaptive rounds, starting with SGD. Let Δ̃
    be the round's noised mean update.

    * **SGD round**: ``step = η_sgd · Δ̃`` and ``G ← G + Δ̃``.
    * **Switch** (right after the ``s1``-th SGD round of a phase):
      ``v ← β v + (1-β)(G/s1)²``, ``G ← 0``, and the delayed preconditioner ``P = √v + ε`` is
      formed for the coming adaptive phase. With ``subtract_noise_variance=True`` the known
      noise variance of the averaged accumulator, ``Σ_t Φ_t / s1²`` (``Φ/s1`` for a constant
      ``Φ``), is subtracted from ``(G/s1)²`` and the result floored at 0 before it enters ``v``.
      ``v`` starts at 0 and is not bias-corrected, as in the paper.
    * **Adaptive round**: clients precondition their local gradients by ``P`` before clipping
      and noising, so Δ̃ is already preconditioned and ``step = η_adaptive · Δ̃``. With
      ``noise_first=True`` (the paper's noise-before-preconditioning ablation, strategy
      ``dp2-noise-first``) clients are plain and the server applies ``P`` after noising:
      ``step = η_adaptive · Δ̃ / P``. With ``scale_by_preconditioner=True`` (not in the paper)
      the precondition-first step is ``η_adaptive · Δ̃ / mean(P)``: when every client's
      preconditioned update is clipped, the clip removes the ``1/P`` scale that noise-first
      keeps, and ``mean(P)`` (the noise's magnitude where ``v`` is noise, so ``∝ σ``) puts it
      back, making the adaptive rate's noise step ``η·σC/(m̄·mean P)`` independent of σ.

    With ``max_noise_step = κ`` (as in :func:`~fedprivopt.optim.momentum_sgd`) a round whose step
    is a rate ``r`` times Δ̃ (SGD rounds; precondition-first adaptive rounds, where ``r`` is
    ``η_adaptive``, or ``η_adaptive/mean(P)`` when scaled) takes ``min(r, κ/√Φ_t)``, so the
    noise it adds to a coordinate, ``r√Φ_t``, is at most κ (``√Φ_t``: the per-coordinate noise
    std of the round's Δ̃, passed as ``update(..., noise_variance=Φ_t)``; no bound without it).
    A noise-first adaptive round, whose rate differs by coordinate, takes
    ``min(η_adaptive/P_i, κ/√Φ_t)`` in coordinate ``i``. Where ``v`` is noise ``P_i`` is about
    ``0.22 |z_i| √Φ + ε`` (``z_i`` standard normal, ``β = 0.9`` after one switch), so without the
    bound the noise step ``η_adaptive √Φ_t / P_i`` is heavy-tailed: its mean square grows like
    ``η_adaptive² √Φ / ε``, with the noise, bounded only by the fixed ``ε`` (stage 12 of
    ``docs/EXPERIMENTS.md``).

    ``v`` is updated only from SGD-phase aggregates: adaptive-round inputs never touch ``v`` or
    ``G``. Use :func:`phase` and :func:`preconditioner` on the current state to configure the
    next round. The paper clips adaptive-round updates with a separate norm ``C2``;
    ``clip_norm_adaptive`` records it for the strategy (``None`` means the same clip norm).

    Parameters
    ----------
    sgd_learning_rate : float
        Server learning rate ``η_sgd`` of SGD rounds, in ``(0, inf)``.
    adaptive_learning_rate : float
        Server learning rate ``η_adaptive`` of adaptive rounds, in ``(0, inf)``.
    s1 : int
        SGD rounds per cycle (the preconditioner delay), in ``[1, inf)``.
    s2 : int
        Adaptive rounds per cycle, in ``[1, inf)``.
    epsilon : float
        ``ε`` in ``P = √v + ε``, in ``(0, inf)``; below the smallest normal number of the
        parameters' dtype (``torch.finfo(dtype).tiny``, 1.2e-38 in float32), which it would
        round towards 0 in, that number is used (as for :func:`~fedprivopt.optim.adam`'s ``τ``).
    beta : float, default 0.9
        EMA decay of ``v`` in ``[0, 1)``.
    noise_variance : float or callable or None, default 0.0
        Per-coordinate noise variance ``Φ_t`` of each SGD round's Δ̃: a float in ``[0, inf)``,
        a callable ``t -> Φ_t`` of the 1-based update index, or ``None`` (then every SGD-round
        call must pass ``update(..., noise_variance=Φ_t)``). Only used when
        ``subtract_noise_variance`` is true.
    subtract_noise_variance : bool, default False
        Subtract the accumulator's noise variance at the switch (floored at 0).
    noise_first : bool, default False
        Apply ``P`` on the server after noising instead of on the clients before clipping.
    clip_norm_adaptive : float or None, default None
        Clip norm of adaptive rounds in ``(0, inf)``, recorded in ``hparams`` for the strategy.
    scale_by_preconditioner : bool, default False
        Divide the precondition-first adaptive step by the mean of ``P`` (ignored with
        ``noise_first``, whose step already divides by ``P``).
    max_noise_step : float or None, default None
        κ in ``(0, inf)``: the largest noise std a step may add to a coordinate (see above);
        ``None``: no bound.
    frozen : torch.Tensor or None, default None
        Boolean mask (the parameters' length, checked by ``init``) of the coordinates no noise
        reaches (the model's frozen parameters and buffers, whose noise the server drops:
        :func:`~fedprivopt.models.task.frozen_mask`); ``mean(P)`` of the scaled step and the
        capped share leave them out (``hparams["frozen"]``). Their ``v`` stays 0 and ``P`` is
        ``ε``: counted, 100,000 frozen entries beside a 33-parameter model pulled ``mean(P)``
        from 0.0195 to 0.00011 at ``ε = 1e-4`` and the scaled adaptive step 177 times up
        (``eval_loss`` 0.86 to 78.5; thirty-fifth review of issue 15, models, finding 5).

    Returns
    -------
    ServerTransform
        ``init(params) -> DP2State`` and ``update(delta_tilde, state, params=None, *,
        noise_variance=None) -> (step, state)``; ``hparams`` holds ``noise_first`` and
        ``clip_norm_adaptive``.

    Raises
    ------
    ValueError
        If a hyperparameter is outside its range.

    References
    ----------
    .. [1] T. Li, M. Zaheer, K. Z. Liu, S. J. Reddi, H. B. McMahan, V. Smith, "Differentially
       Private Adaptive Optimization with Delayed Preconditioners", ICLR 2023.
    """
    lr_sgd = check_real("sgd_learning_rate", sgd_learning_rate, low=0.0, low_open=True)
    lr_ada = check_real("adaptive_learning_rate", adaptive_learning_rate, low=0.0, low_open=True)
    s1 = check_int("s1", s1, low=1)
    s2 = check_int("s2", s2, low=1)
    eps = check_real("epsilon", epsilon, low=0.0, low_open=True)
    beta = check_real("beta", beta, low=0.0, high=1.0, high_open=True)
    phi_spec = check_noise_variance_spec(noise_variance, allow_none=True)
    subtract = check_bool("subtract_noise_variance", subtract_noise_variance)
    noise_first = check_bool("noise_first", noise_first)
    rescale = check_bool("scale_by_preconditioner", scale_by_preconditioner) and not noise_first
    kappa = None
    if max_noise_step is not None:
        kappa = check_real("max_noise_step", max_noise_step, low=0.0, low_open=True)
    frozen = check_frozen(frozen)
    if clip_norm_adaptive is not None:
        clip_norm_adaptive = check_real(
            "clip_norm_adaptive", clip_norm_adaptive, low=0.0, low_open=True
        )

    def eps_in(dtype: torch.dtype) -> float:
        """``ε``, at least the smallest normal number of ``dtype``.

        Thirty-third review of issue 15: ``dp2-epsilon = 1e-50`` is 0 in float32, so ``P`` was 0
        wherever ``v`` is (a frozen coordinate, a Δ̃ whose square underflows): the clients
        refused that ``P`` after a released round (rc 2, ``preconditioner must be finite and >
        0 everywhere``), a noise-first step was 0/0 (the model NaN) and a scaled step divided by
        a zero mean (``ZeroDivisionError``).
        """
        return max(eps, torch.finfo(dtype).tiny)

    def init(params: torch.Tensor) -> DP2State:
        params = check_params(params)
        check_in_dtype("epsilon", eps, params)
        check_frozen(frozen, params.numel())
        zeros = torch.zeros_like(params)
        return DP2State(
            count=0,
            adaptive=False,
            phase_step=0,
            accumulator=zeros,
            accumulator_noise_variance=0.0,
            second_moment=zeros.clone(),
            preconditioner=torch.full_like(params, eps_in(params.dtype)),
        )

    def _switch(state: DP2State, accumulator: torch.Tensor, noise_sum: float) -> DP2State:
        """End of an SGD phase: fold the averaged accumulator into v and form P."""
        term = accumulator.div(s1).square_()
        if subtract:
            term.sub_(noise_sum / (s1 * s1)).clamp_(min=0.0)
        v = state.second_moment.mul(beta).add_(term, alpha=1.0 - beta)
        return DP2State(
            count=state.count + 1,
            adaptive=True,
            phase_step=0,
            accumulator=torch.zeros_like(accumulator),
            accumulator_noise_variance=0.0,
            second_moment=v,
            preconditioner=v.sqrt().add_(eps_in(v.dtype)),
        )

    @torch.no_grad()
    def update(
        delta_tilde: torch.Tensor,
        state: DP2State,
        params: torch.Tensor | None = None,
        *,
        noise_variance: float | None = None,
    ) -> tuple[torch.Tensor, DP2State]:
        check_update_inputs(delta_tilde, params, check_state(state, DP2State).accumulator)
        _check_phase_step(state)
        t = state.count + 1
        if state.adaptive:
            if noise_first:
                step = _noise_first_step(delta_tilde, state.preconditioner, noise_variance)
            else:
                step = delta_tilde.mul(dp2_rate(hparams, state, noise_variance))
            done = state.phase_step + 1 == s2
            new_state = dataclasses.replace(
                state, count=t, adaptive=not done, phase_step=0 if done else state.phase_step + 1
            )
            return step, new_state
        step = delta_tilde.mul(dp2_rate(hparams, state, noise_variance))
        accumulator = state.accumulator.add(delta_tilde)
        noise_sum = state.accumulator_noise_variance
        if subtract:
            noise_sum += resolve_noise_variance(phi_spec, noise_variance, t)
        if state.phase_step + 1 == s1:
            return step, _switch(state, accumulator, noise_sum)
        new_state = dataclasses.replace(
            state,
            count=t,
            phase_step=state.phase_step + 1,
            accumulator=accumulator,
            accumulator_noise_variance=noise_sum,
        )
        return step, new_state

    def _check_phase_step(state: DP2State) -> None:
        """Refuse a state whose phase has run more rounds than this transform's phase has.

        Thirty-third review of issue 15: the state of a ``dp2(s1=5)`` three rounds into its SGD
        phase, rebuilt with ``DP2State.from_dict`` and given to a ``dp2(s1=2)``, never reached
        ``phase_step + 1 == s1``: every later round was an SGD round, silently.
        """
        rounds, key = (s2, "s2") if state.adaptive else (s1, "s1")
        if not 0 <= state.phase_step < rounds:
            raise ValueError(
                f"state.phase_step must be in [0, {key} = {rounds}) in its {phase(state)} "
                f"phase, got {state.phase_step} (a state of a dp2 with another {key}?)"
            )

    def _noise_first_step(
        delta_tilde: torch.Tensor, p: torch.Tensor, noise_variance: float | None
    ) -> torch.Tensor:
        """``η_adaptive Δ̃ / P``, each coordinate's rate at most ``κ/√Φ_t`` when bounded."""
        cap = _coordinate_cap(kappa, noise_variance)
        if cap >= lr_ada / eps_in(p.dtype):  # no bound, no noise, or one no coordinate reaches
            return delta_tilde.div(p).mul_(lr_ada)
        return p.reciprocal().mul_(lr_ada).clamp_(max=cap).mul_(delta_tilde)

    hparams = record_hparams(
        "dp2",
        sgd_learning_rate=lr_sgd,
        adaptive_learning_rate=lr_ada,
        s1=s1,
        s2=s2,
        epsilon=eps,
        beta=beta,
        noise_variance=phi_spec,
        subtract_noise_variance=subtract,
        noise_first=noise_first,
        clip_norm_adaptive=clip_norm_adaptive,
        scale_by_preconditioner=rescale,
        **({} if kappa is None else {"max_noise_step": kappa}),
        **({} if frozen is None else {"frozen": frozen}),
    )
    return ServerTransform(init, update, hparams)


def dp2_rate(hparams, state: DP2State, noise_variance: float | None) -> float | None:
    """The rate a :func:`dp2` step with ``hparams`` multiplies Δ̃ by in the round ``state`` is in.

    ``η_sgd`` in an SGD round, ``η_adaptive`` (over ``mean(P)`` when scaled) in an adaptive one,
    each bounded by ``max_noise_step`` when set; ``None`` in a noise-first adaptive round, whose
    step is ``η_adaptive · Δ̃ / P`` (bounded by coordinate: :func:`dp2_capped_fraction`). What
    ``update`` uses and a strategy reports.
    """
    if not state.adaptive:
        rate = hparams["sgd_learning_rate"]
    elif hparams["noise_first"]:
        return None
    else:
        rate = hparams["adaptive_learning_rate"]
        if hparams["scale_by_preconditioner"]:
            rate /= preconditioner_mean(state, frozen=hparams.get("frozen"))
    kappa = hparams.get("max_noise_step")
    return rate if kappa is None else capped_rate(rate, kappa, noise_variance)


def dp2_capped_fraction(hparams, state: DP2State, noise_variance: float | None) -> float | None:
    """The share of coordinates whose noise-first adaptive rate ``η_adaptive/P_i`` is capped.

    ``None`` outside a noise-first adaptive round of a bounded :func:`dp2` with noise (the
    coordinates with ``P_i < η_adaptive √Φ_t / κ`` take ``κ/√Φ_t``; see :func:`dp2`).
    """
    cap = _coordinate_cap(hparams.get("max_noise_step"), noise_variance)
    if not (state.adaptive and hparams["noise_first"]) or cap == math.inf:
        return None
    floor = hparams["adaptive_learning_rate"] / cap if cap > 0.0 else math.inf  # κ/√Φ_t underflow
    p = _unfrozen(state.preconditioner, hparams.get("frozen"))
    return float((p < floor).sum()) / max(p.numel(), 1)


def _coordinate_cap(kappa: float | None, noise_variance: float | None) -> float:
    """``κ/√Φ_t``, the largest rate a coordinate of a noise-first adaptive step may take.

    ``inf`` without a bound or without noise (``Φ_t`` None or 0). What :func:`dp2`'s step
    clamps at and :func:`dp2_capped_fraction` counts against.
    """
    if kappa is None or noise_variance is None:
        return math.inf
    phi = check_real("noise_variance", noise_variance, low=0.0)
    return kappa / math.sqrt(phi) if phi > 0.0 else math.inf


def preconditioner_mean(state: DP2State, *, frozen: torch.Tensor | None = None) -> float:
    """The mean of ``P`` (over the coordinates not ``frozen``), summed in float64.

    A float32 mean of entries near float32's largest value (``dp2-epsilon`` at 1e38) overflows
    to ``inf`` though every entry is finite (eighteenth review of issue 15, an observation): the
    scaled adaptive step was then 0 and the round metric ``Infinity``. ``frozen``: see
    :func:`dp2`.

    Raises
    ------
    TypeError
        If ``state`` is not a :class:`DP2State`.
    ValueError
        If ``frozen`` is not a boolean mask of ``P``'s length leaving a coordinate.
    """
    if not isinstance(state, DP2State):
        raise TypeError(f"state must be a DP2State, got {type(state).__name__}")
    return float(_unfrozen(state.preconditioner, frozen).mean(dtype=torch.float64))


def _unfrozen(p: torch.Tensor, frozen: torch.Tensor | None) -> torch.Tensor:
    """The entries of ``p`` that ``frozen`` (checked against ``p``'s length) leaves."""
    if check_frozen(frozen, p.numel()) is None:
        return p
    return p[~frozen.to(p.device)]
