"""Engine-agnostic server logic: one round as a coroutine over training requests.

A :class:`ServerAlgorithm` owns everything the server knows: the global parameters, the sampler,
the aggregator (clip, sum, noise, fixed denominator), the server transform, the accountant and the
budget. A round is a generator: it yields :class:`TrainRequest` objects (which users to train, at
which parameters, with which preconditioner and client settings) and receives, for each request,
the updates that came back (``{user_id: flat update or None}``). Every engine — Flower's (through
:class:`~fedprivopt.strategies.flower.DPStrategy`) and the fast in-process one — drives the same
generator, so for the same seed they compute the same model.

Named strategies are small subclasses: ADADP asks for two cohorts per round, DP2 broadcasts its
delayed preconditioner in adaptive rounds, AdaDPS broadcasts the public side information.

The request and result types live in :mod:`fedprivopt.strategies.requests` (re-exported here),
the checkpoint of an algorithm in :mod:`fedprivopt.strategies.state`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Any

import torch

from fedprivopt import optim
from fedprivopt.core.checks import check_int, check_real
from fedprivopt.core.local import LocalConfig
from fedprivopt.core.text import shown
from fedprivopt.privacy.accounting import PrivacyAccountant
from fedprivopt.privacy.aggregate import (
    AggregationResult,
    NoisyMeanAggregator,
    default_min_shares,
)
from fedprivopt.privacy.clip import MIN_CLIP_NORM
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.pld_guard import check_pld_ledger
from fedprivopt.privacy.rng import RngFactory, derive_seed
from fedprivopt.privacy.sampling import SamplingSpec
from fedprivopt.privacy.tree import TreeCohorts, TreeNoise, tree_position
from fedprivopt.strategies.clipping import AdaptiveClipping
from fedprivopt.strategies.config import StrategyConfig
from fedprivopt.strategies.requests import (
    PartialRelease,
    ReportedUpdates,
    RoundResult,
    TrainRequest,
    Updates,
    each_user_once,
    refuse_malformed,
)
from fedprivopt.strategies.state import AlgorithmState
from fedprivopt.wire import ClientSettings

__all__ = [
    "ReportedUpdates",
    "RoundResult",
    "ServerAlgorithm",
    "TrainRequest",
    "Updates",
    "drive_round",
]

NOISE_HEADROOM = 64.0
"""How far below the model dtype's largest number the noise std of a round's sum must stay.

A float32 Gaussian draw reaches about 6 standard deviations (Box-Muller of 24-bit uniforms),
secure mode adds four draws before halving, and tree aggregation's prefix sums add up to
about 20 nodes (about 4.6 standard deviations of one): 64 keeps every draw finite.
"""


def largest_noise_std(dtype: torch.dtype) -> float:
    """The largest noise std of a round's sum in a model of ``dtype`` (:data:`NOISE_HEADROOM`)."""
    return torch.finfo(dtype).max / NOISE_HEADROOM if dtype.is_floating_point else math.inf


class ServerAlgorithm(AlgorithmState):
    """Server side of a (DP) federated strategy, independent of the transport.

    Parameters
    ----------
    config : StrategyConfig
        Validated hyperparameters.
    initial_params : torch.Tensor
        Flat initial model (its dtype is the model dtype; updates must match it).
    preconditioner : torch.Tensor, optional
        Public side information broadcast every round (AdaDPS); ignored by other strategies.
    user_offset : int
        ``>= 0``: the sampled population is ``config.population`` users whose ids are
        ``user_offset .. user_offset + population - 1`` (the task's users below ``user_offset``
        are public users who opted out of privacy: never sampled, accounted or trained on
        privately). The sampler draws ``0 .. population - 1`` and :meth:`sample` adds the offset,
        so sampling, sample rate and accounting are those of the private population.
    frozen : torch.Tensor, optional
        Boolean vector of the model's length: coordinates of parameters that never train
        (:func:`~fedprivopt.models.task.frozen_mask`). :meth:`aggregate` sets them to zero in
        the noised mean (post-processing), so they keep their initial values.
    """

    def __init__(
        self,
        config: StrategyConfig,
        initial_params: torch.Tensor,
        *,
        preconditioner: torch.Tensor | None = None,
        user_offset: int = 0,
        frozen: torch.Tensor | None = None,
    ) -> None:
        if initial_params.dim() != 1 or not initial_params.dtype.is_floating_point:
            raise ValueError("initial_params must be a flat floating-point tensor")
        if frozen is not None and (
            frozen.dtype != torch.bool or frozen.shape != initial_params.shape
        ):
            raise ValueError(
                f"frozen must be a boolean vector of the model's length {initial_params.numel()}"
            )
        self.frozen = None if frozen is None else frozen.to(initial_params.device)
        if isinstance(user_offset, bool) or not isinstance(user_offset, int) or user_offset < 0:
            raise ValueError(f"user_offset must be an integer >= 0, got {shown(user_offset)}")
        self.user_offset = user_offset
        self.config = config
        self.params = initial_params.detach().clone()
        self.averaged: torch.Tensor | None = None
        self.round_num = 0
        self.rngs = RngFactory(seed=None, secure=True) if config.secure else RngFactory(config.seed)
        self.sampling = SamplingSpec(
            config.sampling,
            config.population,
            sample_rate=config.sample_rate if config.sampling == "poisson" else None,
            cohort_size=int(config.clients_per_round) if config.sampling == "fixed" else None,
        )
        self.sampler = self.sampling.sampler(self.rngs)
        self.tree_cohorts, self.tree_noise = self._make_tree(initial_params)
        #: Task user ids that can be reached this round (deployment under tree aggregation;
        #: ``None``: all). Set by the engine before a round; ignored by sampled mechanisms.
        self.available_users: set[int] | None = None
        self._check_noise_fits(initial_params.dtype)
        self.aggregator = self._make_aggregator()
        self.clipping = None
        if config.adaptive:  # C stays where the noise std σ_Δ C fits the model's dtype
            limit = largest_noise_std(initial_params.dtype) / config.update_noise_multiplier
            self.clipping = AdaptiveClipping(config, self.aggregator.min_shares, limit)
        self.accountant = PrivacyAccountant(accountant=config.accountant)
        if config.accountant == "pld" and self.round_events():
            # a PLD too large for memory fails here, before training, not at the first ε query
            planned = config.num_server_rounds * self.events_per_round
            event = self.round_event().single_gaussian()
            check_pld_ledger([(event, planned)], self.accountant.pld_discretization)
        self.side_information = preconditioner
        self.transform = self.make_transform()
        self.opt_state = self.init_state()
        self.stopped_reason: str | None = None
        #: Called as ``(round_num, events, point)`` before a round sends out a point computed
        #: from a noised sum of the same round (ADADP's half step), so that the run's ledger
        #: records that part of the round first (``RunWriter`` sets it; ``None``: no ledger).
        self.on_partial_release: PartialRelease | None = None

    # -- construction hooks ------------------------------------------------------------------

    def _check_noise_fits(self, dtype: torch.dtype) -> None:
        """Refuse a sum noise std ``σ_Δ C`` beyond the largest number of the model's dtype.

        Twenty-fifth review of issue 15: ``simulate toy.toml --set noise-multiplier=1e39``
        drew infinite noise (float32 ends at 3.4e38) and ended rc 0 as a divergence whose
        advice named the learning rates. Twenty-sixth review: so did ``noise-multiplier=1e38``,
        below that bound (78 of 100,000 float32 draws of std 1e38 are infinite: a Gaussian
        draw reaches 4-6 standard deviations, secure mode sums four draws before halving, a
        tree sums up to ~20 nodes). The std may be at most the largest number over
        :data:`NOISE_HEADROOM`.

        Thirty-first review: DP2's ``clip-norm-adaptive`` (the clip norm of its adaptive rounds,
        whose sum gets noise of std ``σ_Δ`` times it) was not checked: ``--strategy dp2 --set
        clip-norm-adaptive=3e38`` drew infinite noise in its first adaptive round and ended rc 0
        as a divergence advising lower learning rates.
        """
        c = self.config
        largest = largest_noise_std(dtype)
        adaptive_c = getattr(c.options, "clip_norm_adaptive", None)  # DP2's second norm
        for key, clip in (("clip-norm", c.clip_norm), ("clip-norm-adaptive", adaptive_c)):
            if c.private and clip is not None and not c.update_noise_multiplier * clip <= largest:
                sigma = "sigma_Delta" if c.adaptive else "noise-multiplier"
                raise ValueError(
                    f"{sigma} * {key} must be at most {largest:.6g} for a {dtype} model (the "
                    f"noise std of a round's sum; its largest number over {NOISE_HEADROOM:g}: "
                    "beyond it noise draws overflow to infinity), got "
                    f"{c.update_noise_multiplier:g} * {clip:g}; lower noise-multiplier or {key}"
                )

    def _make_tree(self, params: torch.Tensor) -> tuple[TreeCohorts | None, TreeNoise | None]:
        """The cohorts and noise of tree aggregation (``None, None`` for the Gaussian)."""
        c = self.config
        if not c.tree:
            return None, None
        cohorts = TreeCohorts(
            population=c.population,
            cohort_size=int(c.clients_per_round),
            restart_rounds=c.restart_rounds,
            rngs=self.rngs,
        )
        noise = TreeNoise(
            std=c.noise_multiplier * c.clip_norm,
            restart_rounds=c.restart_rounds,
            rngs=self.rngs,
            dim=params.numel(),
            dtype=params.dtype,
            device=params.device,
        )
        return cohorts, noise

    def _make_aggregator(self) -> NoisyMeanAggregator:
        c = self.config
        if not c.private:
            return NoisyMeanAggregator(
                clip_norm=None, noise_multiplier=0.0, expected_cohort_size=c.clients_per_round
            )
        min_shares = None
        if c.noise_mode == "distributed" and c.min_shares:
            min_shares = c.min_shares
        elif c.noise_mode == "distributed" and c.sampling == "fixed":
            # every cohort has exactly m users, so every quantile of its size is m (thirty-third
            # review of issue 15: Binomial(N, q)'s 1% quantile, 4 for a cohort of 10, made each
            # share and the sum's noise std sqrt(10/4) times what the accountant was told)
            min_shares = int(c.clients_per_round)
        elif c.noise_mode == "distributed":
            min_shares = default_min_shares(c.population, c.sample_rate, c.min_shares_quantile)
        return NoisyMeanAggregator(
            clip_norm=c.clip_norm,
            noise_multiplier=c.update_noise_multiplier,  # σ_Δ with adaptive clipping
            expected_cohort_size=c.clients_per_round,
            noise_mode=c.noise_mode,
            min_shares=min_shares,
        )

    def make_transform(self) -> optim.ServerTransform | None:
        """Server optimizer of this strategy (each named strategy defines its own)."""
        raise NotImplementedError

    def init_state(self) -> Any:
        """The server optimizer's initial state."""
        return None if self.transform is None else self.transform.init(self.params)

    # -- privacy -----------------------------------------------------------------------------

    events_per_round = 1

    def round_event(self) -> SubsampledGaussianEvent | None:
        """The privacy event of one data access (``None`` for non-private strategies).

        With adaptive clipping the sum's multiplier is ``σ_Δ`` and the event carries the count's
        ``2σ_b``: together one Gaussian of the configured ``σ``. Under tree aggregation the
        event of a whole restart period (:meth:`SubsampledGaussianEvent.tree`).
        """
        c = self.config
        if not c.private:
            return None
        if c.tree:
            return SubsampledGaussianEvent.tree(
                population=c.population,
                cohort_size=int(c.clients_per_round),
                noise_multiplier=c.noise_multiplier,
                restart_rounds=c.restart_rounds,
            )
        count = 2.0 * c.count_stddev if c.adaptive else None
        return self.sampling.event(c.update_noise_multiplier, count)

    def round_events(self, round_num: int | None = None) -> list[SubsampledGaussianEvent]:
        """Events round ``round_num`` releases (``events_per_round`` copies of :meth:`round_event`).

        Under tree aggregation a period's event is charged whole at its first round, and the
        other rounds of the period release none. ``round_num=None``: the events of a round
        that charges (every round of a sampled mechanism).
        """
        event = self.round_event()
        if event is None:
            return []
        if round_num is not None:  # NaN and -1 were taken (a short API review of issue 15)
            round_num = check_int("round_num", round_num, 1)
        if self.tree_noise is not None and round_num is not None:
            if tree_position(round_num, self.config.restart_rounds)[1] != 1:
                return []
        return [event] * self.events_per_round

    def events_through(self, round_num: int) -> int:
        """How many events rounds ``1 .. round_num`` release together."""
        round_num = check_int("round_num", round_num, 0)  # -1 and NaN were taken (API review)
        if not self.config.private:
            return 0
        if self.tree_noise is not None:
            return -(-round_num // self.config.restart_rounds)
        return round_num * self.events_per_round

    def noise_std_of_mean(self) -> float:
        """Nominal per-coordinate noise std ``σC/m̄`` of the noised mean Δ̃ (0 if not private).

        With adaptive clipping ``σ_Δ C_0/m̄`` (the initial clip norm).
        """
        c = self.config
        if not c.private:
            return 0.0
        return c.update_noise_multiplier * c.clip_norm / c.clients_per_round

    def epsilon(self) -> float:
        """ε spent so far at the configured δ (``inf`` for non-private strategies)."""
        if not self.config.private:
            return math.inf
        return self.accountant.epsilon(self.config.delta)

    def budget_allows_next_round(self) -> bool:
        """False when the next round would push ε above the target (the run must stop)."""
        target = self.config.target_epsilon
        events = self.round_events(self.round_num + 1)
        if target is None or not events:
            return True
        return not self.accountant.would_exceed(target, self.config.delta, events)

    # -- one round -----------------------------------------------------------------------------

    def client_settings(self, *, clip_norm: float | None = None) -> ClientSettings:
        """What every client of a request is told (``clip_norm``: DP2's adaptive-phase norm).

        With adaptive clipping the clip norm is the round's ``C`` and clients report their bit
        (and, in distributed mode, add their share of the count noise).
        """
        c = self.config
        if clip_norm is not None:  # 0, True or False silently became the configured C (a
            # short review of the Python API, issue 15)
            clip_norm = check_real("clip_norm", clip_norm, low=0.0, low_open=True)
        if clip_norm is None and c.adaptive:
            clip_norm = self.current_clip_norm()
        clip = (clip_norm or c.clip_norm) if c.private else 0.0
        local = LocalConfig(
            learning_rate=c.local_learning_rate,
            epochs=c.local_epochs,
            batch_size=c.batch_size,
            max_examples=c.max_examples or None,
            clip_norm=float(clip) or None,
            noise_std=self.aggregator.share_std() * (clip / c.clip_norm if c.private else 0.0),
            clip_bit=c.adaptive,
            count_noise_std=self.clipping.share_std() if self.clipping is not None else 0.0,
        )
        # Clients get a seed derived one-way from the root seed: the root seed keys the server
        # noise and the sampling, and a client that knew it could subtract the noise.
        return ClientSettings(
            local=local,
            seed=derive_seed(c.seed, "clients"),
            secure=c.secure,
            report_private_metrics=not c.private,
        )

    def broadcast_preconditioner(self) -> torch.Tensor | None:
        """Preconditioner sent to clients this round (none by default)."""
        return None

    @property
    def user_ids(self) -> range:
        """The task's user ids that can be sampled (the private population)."""
        return range(self.user_offset, self.user_offset + self.config.population)

    def sample(self, round_num: int, purpose: str = "sampling") -> list[int]:
        """Sampled users of ``round_num`` (the second ADADP cohort uses another purpose).

        Task user ids: the sampler's ids plus :attr:`user_offset`. Under tree aggregation the
        round's cohort of the period's shuffle, among :attr:`available_users`, checked in to
        the participation ledger (:class:`~fedprivopt.privacy.tree.TreeCohorts`).
        """
        if self.tree_cohorts is not None:
            available = None
            if self.available_users is not None:
                available = torch.zeros(self.config.population, dtype=torch.bool)
                ids = [u - self.user_offset for u in self.available_users if u in self.user_ids]
                available[torch.as_tensor(ids, dtype=torch.int64)] = True
            cohort = self.tree_cohorts.cohort(round_num, available)
            return [u + self.user_offset for u in cohort]
        return [int(u) + self.user_offset for u in self.sampler.sample(round_num, purpose)]

    def aggregate(
        self,
        round_num: int,
        updates: Updates,
        *,
        clip_norm: float | None = None,
        stream: str = "",
        cohort: list[int] | None = None,
    ):
        """Noised mean of the updates of one cohort (server noise keyed by round and stream).

        With adaptive clipping the clip norm is the round's ``C``, a reply without a valid clip
        bit is rejected as a whole, and the cohort's noised count is kept for :meth:`_finish`
        (:meth:`_count`). ``cohort``: the users the round asked; a reply from anyone else is
        rejected (twenty-fifth review of issue 15: an update sent to :meth:`run_round` for a
        user who was not sampled was summed, releasing that user without the subsampling the
        accountant assumes; the engines and the Flower strategy never send one).

        ``round_num`` must be after the last round released (:attr:`round_num`): the server
        noise of a seeded run is keyed by round, so a round run again drew the same noise, and
        the difference of its two releases was the difference of the clipped sums without any
        noise (twenty-ninth review of issue 15: ``drive_round(alg, 1, train)`` twice, a user
        dropped the second time, gave that user's clipped update exactly, while the accountant
        charged two independent releases).
        """
        round_num = check_int("round_num", round_num, 1)
        if round_num <= self.round_num:
            raise ValueError(
                f"round {round_num} was released already (the last released round is "
                f"{self.round_num}): a round runs once, after the rounds before it (run again, its "
                "seeded noise would repeat)"
            )
        if clip_norm is not None:
            # a short API review of issue 15: True and 1+0j equal a configured C of 1 and were
            # taken; 1e300 overflowed squaring the noise std (now refused by the aggregator)
            clip_norm = check_real("clip_norm", clip_norm, low=MIN_CLIP_NORM)
            # thirty-first review of issue 15: clip_norm=3e38 on a float32 model (noise std
            # σC 3e38) gave a noised mean with 257 of 1,000 entries infinite
            sigma, largest = (
                self.config.update_noise_multiplier,
                largest_noise_std(self.params.dtype),
            )
            if self.config.private and not sigma * clip_norm <= largest:
                raise ValueError(
                    f"clip_norm must be at most {largest / sigma:.6g} for a {self.params.dtype} "
                    f"model (the noise std of the sum, {sigma:g} * clip_norm, at most "
                    f"{largest:.6g}), got {clip_norm:g}"
                )
        elif self.config.adaptive:
            clip_norm = self.current_clip_norm()
        aggregator = self.aggregator
        if clip_norm is not None and aggregator.private and clip_norm != aggregator.clip_norm:
            aggregator = NoisyMeanAggregator(
                clip_norm=clip_norm,
                noise_multiplier=aggregator.noise_multiplier,
                expected_cohort_size=aggregator.expected_cohort_size,
                noise_mode=aggregator.noise_mode,
                min_shares=aggregator.min_shares,
            )
        generator = self.rngs.generator(round_num, "server-noise", stream)
        # a fixed summation order (by user) makes every engine's sum bit-identical; a streamed
        # cohort (the fast engine's) already comes in that order and is consumed as it is trained,
        # a chunk of users at a time
        unasked: dict[int, str] = {}
        bad_bits: dict[int, str] = {}
        received: set[int] | None = None  # a streamed cohort's users that were yielded
        if getattr(updates, "sorted_by_user", False):
            if cohort is not None:
                # twenty-sixth review of issue 15: a streamed cohort (simulation.fast's
                # StreamedUpdates, trained as it is read) of users the round did not ask was
                # summed whole; its users are known before anything is trained, so it is refused
                extra = sorted(set(int(u) for u in updates.keys()) - set(cohort))
                if extra:
                    raise ValueError(
                        f"updates hold users not in round {round_num}'s cohort: {shown(extra)}"
                    )
            entries = updates.entries() if hasattr(updates, "entries") else updates.items()
            allowed, received = cohort if cohort is not None else updates.keys(), set()
            entries = each_user_once(entries, {int(u) for u in allowed}, round_num, received)
        else:
            entries = sorted(updates.items())
            if cohort is not None:
                asked = set(cohort)
                unasked = {
                    int(u): "not in the round's cohort" for u, _ in entries if u not in asked
                }
                entries = [(u, update) for u, update in entries if u in asked]
            if self.clipping is not None:
                # replies decoded from messages: one whose clip bit is invalid is not summed
                entries, bad_bits = self.clipping.screen(entries, getattr(updates, "clip_bits", {}))
        sum_noise = None
        if self.tree_noise is not None:
            noise, nodes = self.tree_noise.release(round_num)
            sum_noise = (noise, nodes * self.tree_noise.std**2)
        agg = aggregator.aggregate(
            entries,
            dim=self.params.numel(),
            dtype=self.params.dtype,
            generator=generator,
            device=self.params.device,
            sum_noise=sum_noise,
        )
        if received is not None:  # the fast engine's own trainer: no client sends a malformed one
            refuse_malformed(round_num, agg.rejected)
        if sum_noise is not None:
            agg.metrics["tree_nodes"] = float(nodes)
        if unasked:
            agg.rejected.update(unasked)
            agg.metrics["received"] += float(len(unasked))
            agg.metrics["rejected"] = float(len(agg.rejected))
        if self.frozen is not None:
            # frozen parameters: their coordinates are zero in every update, so only noise is
            # there; dropping it (the same coordinates for any data) is post-processing. In place:
            # the aggregator returns a fresh tensor, and a copy would cost a model's size a round
            agg.delta_tilde.masked_fill_(self.frozen, 0.0)
        if self.clipping is not None:
            self.clipping.count(round_num, self.rngs, updates, agg, bad_bits, stream, received)
        return agg

    def optimizer_noise_std(self, agg: Any, clip_norm: float | None = None) -> float:
        """The per-coordinate noise std of Δ̃ that a server optimizer may use: public.

        The aggregate's ``noise_std``, except with distributed noise (and no tree), where that
        grows with the number of shares accepted above ``min-shares``: there the accounted
        ``σ·C_t/m̄`` of the round's clip norm ``clip_norm`` (``None``: this round's, as
        :meth:`aggregate` takes it). Seventeenth review of issue 15 (an observation): DP-FedAdam's
        τ, DP-AdamBC's Φ and ADADP's tolerance followed the accepted count (noise std 0.032856
        with 19 shares, 0.034542 with 21). Δ̃'s own noise carries that count, so this leaked
        nothing new, but the contract is that Δ̃ is the only data-dependent input of the server
        optimizer; the rest is public configuration.
        """
        if not isinstance(agg, AggregationResult):  # an AttributeError before (API review)
            raise ValueError(f"agg must be an AggregationResult, got {type(agg).__name__}")
        if clip_norm is not None:  # ignored unchecked in server mode before (API review)
            clip_norm = check_real("clip_norm", clip_norm, low=MIN_CLIP_NORM)
        if self.tree_noise is not None or self.config.noise_mode != "distributed":
            return agg.noise_std
        if not self.aggregator.private:
            return 0.0
        clip = clip_norm if clip_norm is not None else self.current_clip_norm()
        a = self.aggregator
        return a.noise_multiplier * (clip or a.clip_norm) / a.expected_cohort_size

    # -- adaptive clipping ---------------------------------------------------------------------

    def current_clip_norm(self) -> float | None:
        """The clip norm of this round (``None``: ``clip-norm``).

        With adaptive clipping the adaptive ``C`` of the round's phase
        (:class:`~fedprivopt.strategies.clipping.AdaptiveClipping`), else
        :meth:`round_clip_norm`.
        """
        fixed = self.round_clip_norm()
        return fixed if self.clipping is None else self.clipping.clip_norm(fixed)

    def round_clip_norm(self) -> float | None:
        """The clip norm of this round when it is not ``clip-norm`` (DP2's adaptive rounds)."""
        return None

    def round_metrics(self) -> dict[str, float]:
        """Metrics of this round's shape, taken before the server step (DP2's phase)."""
        return {}

    def step_metrics(self, noise_std: float) -> dict[str, float]:
        """Metrics of the server step given the noise std it is passed (DP-FedAvg's rate)."""
        del noise_std
        return {}

    def run_round(self, round_num: int) -> Generator[TrainRequest, Updates, RoundResult]:
        """One round of a single-cohort strategy (override for other shapes)."""
        clip = self.current_clip_norm()
        users = self.sample(round_num)
        updates = yield TrainRequest(
            round_num,
            users,
            self.params,
            self.broadcast_preconditioner(),
            self.client_settings(clip_norm=clip),
        )
        agg = self.aggregate(round_num, updates, clip_norm=clip, cohort=users)
        noise_std = self.optimizer_noise_std(agg, clip)
        metrics = {**agg.metrics, **self.round_metrics(), **self.step_metrics(noise_std)}
        step, self.opt_state = self.transform.update(
            agg.delta_tilde, self.opt_state, self.params, noise_variance=noise_std**2
        )
        self.params = self.params + step
        return self._finish(round_num, users, metrics, agg.rejected)

    def _finish(
        self, round_num: int, users: list[int], metrics: dict[str, float], rejected: dict
    ) -> RoundResult:
        events = self.round_events(round_num)
        if events:
            self.accountant.step(events)
        self.round_num = round_num
        self._average()
        metrics = {**metrics, **(self.clipping.step() if self.clipping is not None else {})}
        out = {"cohort_size": float(len(users)), **metrics, "epsilon": self.epsilon()}
        return RoundResult(round_num, self.params, out, dict(rejected))

    def _average(self) -> None:
        """Fold the round's released iterate into the moving average (``ema-decay > 0``)."""
        beta = self.config.ema_decay
        if beta <= 0:
            return
        if self.averaged is None:
            self.averaged = self.params.detach().clone()
        else:
            self.averaged = beta * self.averaged + (1.0 - beta) * self.params

    def output_params(self) -> torch.Tensor:
        """The model a run evaluates and reports.

        With ``ema-decay = β > 0`` the exponential moving average of the released iterates,
        ``a_1 = θ_1`` and ``a_t = β a_{t-1} + (1 - β) θ_t``; otherwise (and before the first
        round) the current iterate ``θ_t``. The average is a function of models that were
        released already (each is recorded in the ledger), so it is post-processing: it costs no
        privacy and is never broadcast to clients. It damps the noise that the last steps leave
        in the iterate (De et al. 2022 report the same for DP-SGD).
        """
        return self.params if self.averaged is None else self.averaged


def drive_round(
    algorithm: ServerAlgorithm,
    round_num: int,
    train: Callable[[TrainRequest], Updates],
) -> RoundResult:
    """Run one round in process: ``train(request)`` returns the updates of each request's users.

    This is what every engine does; the Flower adapter does it through messages.
    """
    rounds = algorithm.run_round(round_num)
    request = next(rounds)
    try:
        while True:
            request = rounds.send(train(request))
    except StopIteration as stop:
        return stop.value
