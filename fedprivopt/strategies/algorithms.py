"""The named strategies: small compositions of :class:`.core.ServerAlgorithm`.

References
----------
H. B. McMahan, D. Ramage, K. Talwar, L. Zhang, "Learning Differentially Private Recurrent Language
Models", ICLR 2018 (DP-FedAvg).
S. J. Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (FedAdam).
Q. Tang, F. Shpilevskiy, M. Lécuyer, "DP-AdamBC: Your DP-Adam Is Actually DP-SGD (Unless You Apply
Bias Correction)", AAAI 2024.
T. Li, M. Zaheer, K. Z. Liu, S. J. Reddi, H. B. McMahan, V. Smith, "Differentially Private
Adaptive Optimization with Delayed Preconditioners", ICLR 2023 (DP2).
T. Li, M. Zaheer, S. J. Reddi, V. Smith, "Private Adaptive Optimization with Side Information",
ICML 2022 (AdaDPS).
A. Koskela, A. Honkela, "Learning Rate Adaptation for Differentially Private Learning", AISTATS
2020 (ADADP).
"""

from __future__ import annotations

import math
from collections.abc import Generator
from functools import cached_property
from typing import Any

import torch

from fedprivopt import optim
from fedprivopt.core.text import shown
from fedprivopt.privacy.sparse import dense_problem
from fedprivopt.strategies.config import StrategyConfig
from fedprivopt.strategies.core import (
    RoundResult,
    ServerAlgorithm,
    TrainRequest,
    Updates,
    new_request,
    round_number,
)
from fedprivopt.strategies.requests import same_values

__all__ = ["ALGORITHMS", "build_algorithm"]


class DPFedAvg(ServerAlgorithm):
    """DP-FedAvg with optional server momentum (also the non-private ``fedavg``)."""

    def make_transform(self) -> optim.ServerTransform:
        c = self.config
        return optim.momentum_sgd(
            learning_rate=c.server_learning_rate,
            momentum=c.options.server_momentum,
            max_noise_step=c.options.max_noise_step,  # rounds pass noise_variance = Φ_t
        )

    def step_metrics(self, noise_std: float) -> dict[str, float]:
        """With ``max-noise-step`` κ: the round's ``server_learning_rate``, min(η, κ(1-β)/√Φ_t)."""
        if self.config.options.max_noise_step is None:
            return {}
        return {"server_learning_rate": optim.momentum_sgd_rate(self.transform.hparams,
                                                                noise_std**2)}  # fmt: skip


class DPFedAdam(ServerAlgorithm):
    """Adam on the noised mean (also the non-private ``fedadam``).

    ``tau`` unset follows the noise: ``τ_t = √Φ_t = σC_t/m̄`` (1e-3 when not private).
    """

    def make_transform(self) -> optim.ServerTransform:
        c = self.config
        rate, o = c.server_learning_rate, c.options
        # tau None follows the noise (sqrt(Phi_t), passed every round) in a private run.
        tau = o.tau if o.tau is not None or (c.private and o.adam_flavor != "flower") else 1e-3
        if o.adam_flavor == "flower":
            return optim.flower_fedadam(eta=rate, beta_1=o.beta1, beta_2=o.beta2, tau=tau)
        return optim.adam(
            learning_rate=rate,
            beta1=o.beta1,
            beta2=o.beta2,
            tau=tau,
            bias_correction=o.bias_correction,
        )


class DPFedAdamBC(ServerAlgorithm):
    """DP-AdamBC: Adam with the known noise variance of Δ̃ removed from its second moment.

    The floor ``γ′`` defaults to ``Φ = (σC/m̄)²``, the noise variance itself, and follows it
    round by round (``Φ̂_t``, the bias-corrected average of the rounds' noise variances, which
    adaptive clipping moves with ``C``): a coordinate whose
    corrected ``v̂ - Φ`` is below the noise level then takes Adam's pure-noise step
    (``m̂/√Φ``), never more. The old default ``γ′ = 1e-8`` let such coordinates step by
    ``m̂/10⁻⁴``; on ``simulations/adadps-paper.toml`` (Φ = 9e-4, 3 seeds) that diverged (accuracy
    0.004, eval loss 1371), while with ``γ′ = Φ`` and tuned rates it ties DP-FedAdam (0.322 vs
    0.317, ``docs/EXPERIMENTS.md``).
    """

    def make_transform(self) -> optim.ServerTransform:
        c = self.config
        return optim.adam_bc(
            learning_rate=c.server_learning_rate,
            gamma=c.options.gamma,  # None: the floor follows the round's noise variance
            noise_variance=None,  # passed every round: (std of the noise on Δ̃)²
            beta1=c.options.beta1,
            beta2=c.options.beta2,
        )


class AdaDPS(DPFedAvg):
    """AdaDPS: DP-FedAvg whose clients precondition local gradients by public side information."""

    def __init__(
        self,
        config: StrategyConfig,
        initial_params: torch.Tensor,
        *,
        preconditioner: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> None:
        if preconditioner is None:
            raise ValueError("adadps needs side information: a preconditioner vector A")
        # thirty-seventh review of issue 15: a list raised AttributeError, a complex tensor
        # NotImplementedError, a meta one RuntimeError; the tensor was kept, not copied, so the
        # caller's in-place edit (A.mul_(2)) changed what later rounds broadcast while the
        # checkpoint kept the digest of the A the run started with
        p = preconditioner
        tensor = isinstance(p, torch.Tensor) and p.device.type != "meta"  # meta: refused below
        problem = dense_problem(p) if tensor else None
        if problem is not None:
            # forty-third review of issue 15 (api 3): a sparse A ended in torch's
            # NotImplementedError (aten::ne.Scalar on SparseCPU)
            raise ValueError(f"preconditioner must be a dense tensor with values: {problem}")
        ok = (
            isinstance(p, torch.Tensor)
            and (p.is_floating_point() or (p.dtype != torch.bool and not p.is_complex()))
            and p.device.type != "meta"
            and p.shape == initial_params.shape
        )
        if not ok or not bool(torch.all(torch.isfinite(p) & (p > 0))):
            got = (
                f"a {p.dtype} tensor of shape {tuple(p.shape)} on {p.device}"
                if isinstance(p, torch.Tensor)
                else shown(p)
            )
            raise ValueError(
                "preconditioner must be a finite, positive real tensor of the model's shape "
                f"({initial_params.numel()},), got {got}"
                + (" (not all finite and > 0)" if ok else "")
            )
        preconditioner = p.detach().clone()
        super().__init__(config, initial_params, preconditioner=preconditioner, **kwargs)

    def broadcast_preconditioner(self) -> torch.Tensor | None:
        # a copy: forty-sixth review of issue 15 (api 8), the algorithm's own A was returned,
        # so a caller's in-place edit of it (A /= A.max() to show it) changed what later rounds
        # broadcast (5 where 1) while state_dict() kept the digest of the A the run began with
        # (the thirty-seventh review's edit of the constructor's A through this method)
        return self.side_information.detach().clone()


class DP2(ServerAlgorithm):
    """DP2: SGD rounds build a delayed preconditioner that adaptive rounds broadcast."""

    noise_first = False

    def make_transform(self) -> optim.ServerTransform:
        c = self.config
        return optim.dp2(
            sgd_learning_rate=c.server_learning_rate,
            adaptive_learning_rate=c.options.dp2_learning_rate,
            s1=c.options.dp2_s1,
            s2=c.options.dp2_s2,
            epsilon=c.options.dp2_epsilon,
            beta=c.options.dp2_beta,
            noise_variance=None,
            subtract_noise_variance=c.options.subtract_noise_variance,
            noise_first=self.noise_first,
            clip_norm_adaptive=c.options.clip_norm_adaptive,
            scale_by_preconditioner=c.options.dp2_scale_by_preconditioner,
            max_noise_step=c.options.max_noise_step,  # rounds pass noise_variance = Φ_t
            frozen=self.frozen,  # its P's mean leaves them out (thirty-fifth review, models 5)
        )

    def step_metrics(self, noise_std: float) -> dict[str, float]:
        """With ``max-noise-step``: the rate of this round's step (``server_learning_rate``).

        A noise-first adaptive round, whose rate ``η/P_i`` differs by coordinate, reports the
        share of coordinates the bound caps (``dp2_capped_fraction``) instead.
        """
        if self.config.options.max_noise_step is None:
            return {}
        hparams, state, phi = self.transform.hparams, self.opt_state, noise_std**2
        rate = optim.dp2_rate(hparams, state, phi)
        if rate is not None:
            return {"server_learning_rate": rate}
        share = optim.dp2_capped_fraction(hparams, state, phi)
        return {} if share is None else {"dp2_capped_fraction": share}

    def _adaptive(self) -> bool:
        return optim.phase(self.opt_state) == "adaptive"

    def broadcast_preconditioner(self) -> torch.Tensor | None:
        if self.noise_first or not self._adaptive():
            return None
        # a copy (forty-sixth review of issue 15, api 8): the optimizer state's own P was
        # returned, so a caller's in-place edit of it (mul_(7)) changed the server's state
        return optim.preconditioner(self.opt_state).detach().clone()

    def round_clip_norm(self) -> float | None:
        return self.config.options.clip_norm_adaptive if self._adaptive() else None

    def round_metrics(self) -> dict[str, float]:
        # the P this round used (adaptive), over the coordinates that learn
        mean_p = optim.preconditioner_mean(self.opt_state, frozen=self.frozen)
        return {"adaptive_round": float(self._adaptive()), "dp2_preconditioner_mean": mean_p}


class DP2NoiseFirst(DP2):
    """DP2 ablation: clients train plainly; the server divides the noised mean by ``P``."""

    noise_first = True


class DPFedAvgADADP(ServerAlgorithm):
    """DP-FedAvg with ADADP server learning-rate adaptation (two cohorts, two events a round)."""

    events_per_round = 2

    def make_transform(self) -> None:
        return None  # the controller steps: two half steps against one full step

    @cached_property
    def controller(self) -> optim.ADADPController:
        """The learning-rate controller, its tolerance calibrated to the noise unless set."""
        o = self.config.options
        tolerance = o.adadp_tolerance
        if tolerance is None:
            tolerance = optim.noise_calibrated_tolerance(
                learning_rate=self.initial_rate,
                noise_std=self.noise_std_of_mean(),
                dim=self.params.numel(),
                frozen=self.frozen,  # no noise there (thirty-fifth review, models 4)
            )
        return optim.adadp(
            learning_rate=self.initial_rate,
            tolerance=tolerance,
            alpha_min=o.adadp_alpha_min,
            alpha_max=o.adadp_alpha_max,
            safety=o.adadp_safety,
            error_exponent=o.adadp_error_exponent,
        )

    @cached_property
    def initial_rate(self) -> float:
        """η₀: ``server-learning-rate``, lowered to κ/(σC/m̄) with ``max-noise-step`` κ.

        Fixed by the configuration (σC/m̄ is the nominal noise std, with C₀ under adaptive
        clipping), so it is computed once, not every round.
        """
        rate, kappa = self.config.server_learning_rate, self.config.options.max_noise_step
        if kappa is None:
            return rate
        std = self.noise_std_of_mean()
        capped = optim.capped_rate(rate, kappa, std**2)
        if capped == 0.0 < rate:  # κ/(σC/m̄) underflowed (twentieth review of issue 15)
            raise ValueError(
                f"max-noise-step must be in (0, inf) and leave dp-fedavg-adadp a positive "
                f"initial rate max-noise-step/(sigma C/m) = {kappa!r}/{std:.6g}, which is 0 in "
                "floating point (ADADP cannot start from a zero rate); give a larger value"
            )
        return capped

    def init_state(self) -> optim.ADADPState:
        return self.controller.init()

    def round_tolerance(
        self, noise_std_1: float, noise_std_2: float, full_step_point: torch.Tensor
    ) -> float | None:
        """The round's noise-calibrated tolerance; ``None`` where ``adadp-tolerance`` is set.

        The noise of ``(η/2)(Δ̃₁ - Δ̃₂)`` has per-coordinate std ``(η/2)√(s₁² + s₂²)``, so the
        calibration of :func:`~fedprivopt.optim.noise_calibrated_tolerance` uses
        ``s = √((s₁² + s₂²)/2)`` (adaptive clipping moves it: from C₀ = 0.2 it grew C to 1.4
        and, with τ fixed at C₀'s noise, ADADP rejected its rounds and stayed at the prior,
        0.271 over 3 seeds), and the round's full-step point, whose ``max(1, |w₁|)`` divides
        the error (calibrated to ``d`` alone, η grew with the noise in the weights: 10 → 46.5
        at σ 1.5 on the paper preset).
        """
        if self.config.options.adadp_tolerance is not None:
            return None
        tolerance = optim.noise_calibrated_tolerance(
            learning_rate=self.initial_rate,
            noise_std=math.sqrt((noise_std_1**2 + noise_std_2**2) / 2.0),
            dim=self.params.numel(),
            full_step_point=full_step_point,
            frozen=self.frozen,
        )
        # at least the smallest positive float: a tiny η₀ (max-noise-step 5e-324) whose clip
        # norm adaptive clipping shrank underflowed it to 0, and the run stopped after round 1
        # ("tolerance must be ... got 0.0"; twentieth review of issue 15)
        return max(tolerance, math.ulp(0.0))

    def _refuse_other_point(self, round_num: int, half: torch.Tensor) -> None:
        """Refuse a seeded round whose half-step point, released before, now comes out otherwise.

        Thirty-ninth review of issue 15 (api 4): ``state_dict()`` taken between the two cohorts
        of round ``r`` (the half-step point sent), loaded into another algorithm, and round
        ``r`` driven again with one user of cohort 1 left out: cohort 1's seeded noise repeats,
        so the two released points differed by that user's clipped update without noise
        (-0.005 in every entry: lr x 0.1 / 10). The state carries the point
        (:attr:`partial_point`); a seeded redo must release the same one (the command line's
        ``partial`` ledger line is compared alike). In secure mode the noise is new, and the
        point is a second release, charged again.
        """
        saved = self.partial_point
        if saved is None or saved[0] != round_num or self.config.secure:
            return
        if not same_values(half, saved[1]):
            raise ValueError(
                f"round {round_num}: its half-step point was released before this state was "
                "saved (state_dict() between its two cohorts) and comes out otherwise now: "
                "cohort 1's seeded noise repeats, so the two points differ by users' clipped "
                "updates without noise; redo the round with the same cohort's updates"
            )

    def run_round(self, round_num: int) -> Generator[TrainRequest, Updates, RoundResult]:
        round_num = round_number(round_num)  # forty-second review of issue 15 (api 1)
        self._refuse_spent_round(round_num, "train")  # before its samples (forty-third, api 6)
        cfg = self.client_settings()
        users_1 = self.sample(round_num, "sampling")
        request = new_request(round_num, users_1, self.params, None, cfg, "train")
        updates_1 = yield request
        agg_1 = self._aggregate_in_round(
            round_num, updates_1, stream="train", cohort=users_1, count_now=False
        )
        self.refuse_changed_request(request, self.params, stream="train")
        self._count_cohort()  # forty-third review of issue 15 (api 4)
        half = self.controller.half_step(self.opt_state, self.params, agg_1.delta_tilde)
        self._refuse_other_point(round_num, half)
        if self.on_partial_release is not None:
            # the half-step point is a function of cohort 1's noised sum, sent to cohort 2
            # before the round ends: the ledger records that release first (thirty-third
            # review of issue 15: a kill after it, then --resume, released cohort 1's sum a
            # second time, uncharged in secure mode and without noise in seeded mode)
            self.on_partial_release(round_num, self.round_events(round_num)[:1], half)
        self.charge_partial(round_num)  # the accountant alike, before cohort 2 is asked
        self.partial_point = (round_num, half.detach().clone())  # in state_dict() until _finish
        users_2 = self.sample(round_num, "sampling-2")
        request = new_request(round_num, users_2, half, None, cfg, "train-2")
        updates_2 = yield request
        agg_2 = self._aggregate_in_round(
            round_num, updates_2, stream="train-2", cohort=users_2, count_now=False
        )
        self.refuse_changed_request(request, half, stream="train-2")
        self._count_cohort()  # forty-third review of issue 15 (api 4)
        lr = self.opt_state.learning_rate
        s_1, s_2 = self.optimizer_noise_std(agg_1), self.optimizer_noise_std(agg_2)
        set_tolerance = self.config.options.adadp_tolerance is not None
        res = self.controller.update(
            self.opt_state,
            self.params,
            agg_1.delta_tilde,
            agg_2.delta_tilde,
            tolerance=None if set_tolerance else (lambda w_1: self.round_tolerance(s_1, s_2, w_1)),
        )
        self.params, self.opt_state = res.params, res.state
        metrics = {f"{k}_1": v for k, v in agg_1.metrics.items()}
        metrics |= {f"{k}_2": v for k, v in agg_2.metrics.items()}
        metrics |= {
            "adadp_step_accepted": float(res.accepted),
            "adadp_accept_rate": res.state.accepted / (res.state.accepted + res.state.rejected),
            "adadp_error": res.error,
            "adadp_tolerance": res.tolerance,
            "server_learning_rate": lr,
            "noise_std": agg_1.metrics["noise_std"],
        }
        rejected = {**agg_1.rejected, **agg_2.rejected}
        return self._finish(round_num, users_1 + users_2, metrics, rejected)


ALGORITHMS: dict[str, type[ServerAlgorithm]] = {
    "dp-fedavg": DPFedAvg,
    "dp-fedadam": DPFedAdam,
    "dp-fedadam-bc": DPFedAdamBC,
    "adadps": AdaDPS,
    "dp2": DP2,
    "dp2-noise-first": DP2NoiseFirst,
    "dp-fedavg-adadp": DPFedAvgADADP,
    "fedavg": DPFedAvg,
    "fedadam": DPFedAdam,
}


def build_algorithm(
    config: StrategyConfig,
    initial_params: torch.Tensor,
    *,
    preconditioner: torch.Tensor | None = None,
    user_offset: int = 0,
    frozen: torch.Tensor | None = None,
) -> ServerAlgorithm:
    """Instantiate the server algorithm named by ``config.strategy``.

    ``user_offset`` shifts the sampled ids past the public users, ``frozen`` marks the
    coordinates that never train (see :class:`~fedprivopt.strategies.core.ServerAlgorithm`).
    """
    return ALGORITHMS[config.strategy](
        config,
        initial_params,
        preconditioner=preconditioner,
        user_offset=user_offset,
        frozen=frozen,
    )
