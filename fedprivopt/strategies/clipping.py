"""The server side of adaptive clipping (Andrew et al. 2021) for every DP strategy.

:class:`AdaptiveClipping` is what a :class:`~fedprivopt.strategies.core.ServerAlgorithm` with
``adaptive-clipping = true`` holds: the clip state (:mod:`fedprivopt.privacy.adaptive_clip`), the
noised count of each cohort and the step of ``C`` at the end of the round. The round's privacy
event (sum with ``σ_Δ``, count with ``2σ_b``) is built by the algorithm from its config.

A round's clip norm is read once per cohort (:meth:`AdaptiveClipping.clip_norm`); every cohort
releases its noised fraction ``b̄`` (:meth:`AdaptiveClipping.count`); :meth:`AdaptiveClipping.step`
moves ``C`` with their mean (ADADP's two cohorts share one ``C`` and one step). DP2's adaptive
rounds clip at their own fixed norm (``clip-norm-adaptive``); with adaptive clipping they get a
second state started there and stepped only in those rounds.

References
----------
G. Andrew, O. Thakkar, H. B. McMahan, S. Ramaswamy, "Differentially Private Learning with Adaptive
Clipping", NeurIPS 2021.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fedprivopt.core.checks import check_real
from fedprivopt.privacy.adaptive_clip import ClipState, NoisyCountAggregator, adaptive_clip
from fedprivopt.privacy.aggregate import share_noise_growth
from fedprivopt.privacy.clip import MIN_CLIP_NORM
from fedprivopt.privacy.rng import RngFactory

__all__ = ["CLIP_KEYS", "AdaptiveClipping", "share_growth_advice", "sum_noise_growth"]

#: The clip states a run may hold: the one started at ``clip-norm`` and, for a strategy whose
#: rounds clip at another fixed norm (DP2's adaptive phase), the one started at that norm.
CLIP_KEYS = ("clip-norm", "round-clip-norm")


def most_shares(config) -> int:
    """The most shares a round can accept: the cohort (fixed-size sampling) or everyone."""
    return int(config.clients_per_round) if config.sampling == "fixed" else config.population


def sum_noise_growth(config, min_shares: int | None) -> float:
    """How far a round's sum noise std can grow over ``σ_Δ C`` (distributed noise; else 1).

    Thirty-seventh review of issue 15: ``C`` was kept where ``σ_Δ C`` fits the model's dtype,
    but the sum of ``n`` distributed shares has noise std ``σ_Δ C √(n/m_min)``: with
    ``min-shares = 1``, 500 users a round and ``C`` grown to its bound (``clip-quantile =
    0.9999``, ``clip-learning-rate = 1000``; or a fixed ``clip-norm = 5e36``) the sum overflowed
    and the model became infinite, reported as a divergence advising lower learning rates.
    """
    if config.noise_mode != "distributed" or min_shares is None:
        return 1.0
    return share_noise_growth(min_shares, most_shares(config))


def share_growth_advice(config, key: str) -> str:
    """The clause a refusal of ``key`` adds in distributed mode (empty in server mode)."""
    if config.noise_mode != "distributed":
        return ""
    return (
        f"; with noise-mode 'distributed' a round's up to {most_shares(config)} shares make that "
        f"std grow with sqrt(shares / min-shares): raise min-shares or lower {key}"
    )


class AdaptiveClipping:
    """Clip states, the noised count of each cohort and the step of ``C``.

    Parameters
    ----------
    config : StrategyConfig
        A configuration with ``config.adaptive`` true.
    min_shares : int or None
        ``m_min`` of distributed noise (the sum's), ``None`` in server mode.
    max_clip_norm : float, optional
        The largest ``C`` (default ``config.max_clip_norm``); a server passes the largest norm
        whose noise std its model's dtype holds (thirty-first review of issue 15: on a float32
        model ``C`` grew to 1e150, and the noise of std ``σ_Δ C`` was infinite). In
        distributed-noise mode it is divided by :func:`~fedprivopt.privacy.aggregate.
        share_noise_growth` at the most shares a round can accept; a starting norm above the
        result is refused.
    """

    def __init__(self, config, min_shares: int | None, max_clip_norm: float | None = None) -> None:
        if not config.adaptive:
            raise ValueError("AdaptiveClipping needs a DP strategy with adaptive-clipping = true")
        self.config = config
        self.counter = NoisyCountAggregator(
            count_stddev=config.count_stddev,
            expected_cohort_size=config.clients_per_round,
            noise_mode=config.noise_mode,
            min_shares=min_shares,
        )
        self.states: dict[str, ClipState] = {}
        self.key = CLIP_KEYS[0]
        self._fractions: list[float] = []
        self._fractions_round: int | None = None  # the round the kept fractions belong to
        self.max_clip_norm = config.max_clip_norm
        if max_clip_norm is not None:
            limit = check_real("max_clip_norm", max_clip_norm, low=MIN_CLIP_NORM)
            growth = sum_noise_growth(config, min_shares)
            self.max_clip_norm = min(self.max_clip_norm, limit / growth)
        self._check_start()

    def _check_start(self) -> None:
        """Refuse a starting norm (``clip-norm``, DP2's ``clip-norm-adaptive``) above the bound."""
        c = self.config
        for key, start in (
            ("clip-norm", c.clip_norm),
            ("clip-norm-adaptive", getattr(c.options, "clip_norm_adaptive", None)),
        ):
            if start is not None and not start <= self.max_clip_norm:
                shares = share_growth_advice(c, key)
                raise ValueError(
                    f"{key} must be at most {self.max_clip_norm:.6g} with adaptive clipping here "
                    f"(sigma_Delta * {key}, the noise std of a round's sum, must fit the model's "
                    f"dtype{shares}), got {start:g}"
                )

    def clip_norm(self, fixed: float | None) -> float:
        """``C`` of this round; ``fixed`` is the strategy's own fixed norm of the round, if any."""
        self.key = CLIP_KEYS[0] if fixed is None else CLIP_KEYS[1]
        if self.key not in self.states:
            self.states[self.key] = ClipState(self.config.clip_norm if fixed is None else fixed)
        return self.states[self.key].clip_norm

    def share_std(self) -> float:
        """Std of a client's count-noise share (distributed mode; 0 in server mode)."""
        return self.counter.share_std()

    def screen(
        self, entries: Iterable[tuple[int, Any]], bits: Mapping[int, Any]
    ) -> tuple[list[tuple[int, Any]], dict[int, str]]:
        """Leave out of the sum every reply whose clip report is missing or invalid.

        Returns the remaining ``(user, update)`` entries and the reason of each left out (a
        reply without an update is left to the aggregator, which rejects it).
        """
        kept, bad = [], {}
        for user, update in entries:
            reason = self.counter.check(bits[user])[1] if user in bits else "no clip bit"
            if update is not None and reason is not None:
                bad[int(user)] = reason
            else:
                kept.append((user, update))
        return kept, bad

    def count(
        self,
        round_num: int,
        rngs: RngFactory,
        updates: Mapping[int, Any],
        agg,
        bad: Mapping[int, str],
        stream: str,
        received: Iterable[int] | None = None,
    ) -> None:
        """Release the noised fraction of one cohort's accepted users; update ``agg``.

        Only users whose update was accepted are counted; ``bad`` (left out by :meth:`screen`)
        and reports the counter rejects join ``agg.rejected``, and ``agg.metrics`` get
        ``clip_count_noise_std``. The count noise comes from the generator
        ``(round_num, "count-noise", stream)``. ``received``: the users whose reply came, when
        not every key of ``updates`` did (a streamed cohort's trainer may yield fewer users than
        it was asked for; thirty-second review of issue 15: such a user was counted as a
        rejected clip bit, and ``accepted`` lowered for an update never received). Fractions
        kept from an earlier round whose :meth:`step` never ran are dropped first.
        """
        if self._fractions and self._fractions_round != round_num:
            # forty-fourth review of issue 15 (mechanisms 1): a round whose step never ran (its
            # optimizer step or its finish raised after the cohort was counted) left its noised
            # count here, and the next round's step of C averaged it in, under no charge (the
            # round was never charged); a count moves C only in its own round's step
            self._fractions = []
        self._fractions_round = round_num
        bits = getattr(updates, "clip_bits", {})
        users = sorted(int(u) for u in (updates.keys() if received is None else received))
        counted = [u for u in users if u not in agg.rejected and u not in bad]
        result = self.counter.aggregate(
            [(u, bits.get(u, "missing")) for u in counted],
            generator=rngs.generator(round_num, "count-noise", stream),
        )
        agg.rejected.update({**bad, **result.rejected})
        agg.metrics["received"] += float(len(bad))
        agg.metrics["rejected"] = float(len(agg.rejected))
        agg.metrics["accepted"] -= float(len(result.rejected))
        agg.metrics["clip_count_noise_std"] = result.noise_std
        self._fractions.append(result.fraction)

    def step(self) -> dict[str, float]:
        """Move ``C`` with the mean released fraction of the round; the round's metrics."""
        if not self._fractions:
            return {}
        fraction = sum(self._fractions) / len(self._fractions)
        self._fractions = []
        state = self.states[self.key]
        rule = adaptive_clip(
            initial_clip_norm=state.clip_norm,
            quantile=self.config.clip_quantile,
            learning_rate=self.config.clip_learning_rate,
        )
        stepped = rule.update(fraction, state)
        # at most the norm whose noise std is a float's (eleventh review of issue 15, finding 1:
        # C grew until sum_noise_std**2 overflowed mid-run)
        self.states[self.key] = ClipState(min(stepped.clip_norm, self.max_clip_norm))
        return {
            "clip_norm": state.clip_norm,
            "clip_count_fraction": fraction,
            "update_noise_multiplier": self.config.update_noise_multiplier,
            "next_clip_norm": self.states[self.key].clip_norm,
        }

    def state_dict(self) -> dict[str, dict[str, float]]:
        """The clip states (plain data) for a checkpoint."""
        return {k: v.to_dict() for k, v in self.states.items()}

    def load_state_dict(self, saved: object) -> None:
        """Restore :meth:`state_dict` (``ValueError`` for anything it would not have written)."""
        if not isinstance(saved, dict) or not set(saved) <= set(CLIP_KEYS):
            raise ValueError("checkpoint has no adaptive clip state (adaptive-clipping)")
        states = {k: ClipState.from_dict(v) for k, v in saved.items()}
        limit = self.max_clip_norm
        for key, state in states.items():
            if not state.clip_norm <= limit:
                raise ValueError(
                    f"checkpoint's adaptive clip norm ({key}) {state.clip_norm:g} is above "
                    f"{limit:g}, the most this run's noise allows (adaptive-clipping)"
                )
        self.states = states
