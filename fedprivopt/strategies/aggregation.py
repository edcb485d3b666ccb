"""A server algorithm's noised aggregation: the mechanism built from its config, one cohort's mean.

:class:`AlgorithmAggregation` is a mixin of :class:`~fedprivopt.strategies.core.ServerAlgorithm`
(as :class:`~fedprivopt.strategies.state.AlgorithmState` is): it builds the aggregator (clip, sum,
noise, fixed denominator) and tree aggregation's cohorts and noise from the configuration, refuses
a noise std beyond the model dtype's range (:data:`NOISE_HEADROOM`), computes the noised mean of
one cohort's updates (:meth:`~AlgorithmAggregation._aggregate_in_round`: server noise keyed by
round and stream, the cohort's replies checked, frozen coordinates zeroed) and the noise std a
server optimizer may use. It reads and sets the algorithm's attributes (``config``, ``params``,
``rngs``, ``aggregator``, ``clipping``, ``tree_noise``, ``frozen``, ``round_num``, ``accountant``).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from fedprivopt.core.checks import check_int, check_real
from fedprivopt.core.text import shown
from fedprivopt.privacy.aggregate import (
    AggregationResult,
    NoisyMeanAggregator,
    default_min_shares,
)
from fedprivopt.privacy.clip import MIN_CLIP_NORM
from fedprivopt.privacy.plain import own_update
from fedprivopt.privacy.sparse import RowSparseBatch
from fedprivopt.privacy.tree import TreeCohorts, TreeNoise
from fedprivopt.strategies.clipping import share_growth_advice, sum_noise_growth
from fedprivopt.strategies.cohorts import ReadOnce, refuse_shared_memory
from fedprivopt.strategies.requests import (
    ReportedUpdates,
    Updates,
    each_user_once,
    refuse_malformed,
)

__all__ = ["NOISE_HEADROOM", "AlgorithmAggregation", "largest_noise_std"]

NOISE_HEADROOM = 64.0
"""How far below the model dtype's largest number the noise std of a round's sum must stay.

A float32 Gaussian draw reaches about 6 standard deviations (Box-Muller of 24-bit uniforms),
secure mode adds four draws before halving, and tree aggregation's prefix sums add up to
about 20 nodes (about 4.6 standard deviations of one): 64 keeps every draw finite.
"""


def _stream_name(stream: str) -> str:
    """`` of stream 'train-2'`` for a named stream (one of ADADP's cohorts), else nothing."""
    return f" of stream {stream!r}" if stream else ""


def _own_pair(entry: Any) -> Any:
    """A streamed entry as a fresh ``(user, update)`` tuple of its parts read once (or as is)."""
    if isinstance(entry, (tuple, list)) and len(entry) == 2:
        return (entry[0], entry[1])
    return entry


def _plain_stream(entries: Any, round_num: int) -> Any:
    """A streamed cohort's ``entries`` rebuilt (:func:`own_update`), refused at a foreign one."""
    for entry in entries:
        pair = isinstance(entry, tuple) and len(entry) == 2  # as _own_pair made it
        update, reason = own_update(entry[1] if pair else entry)
        if reason is not None:
            users = entry.users if isinstance(entry, RowSparseBatch) else [entry[0]]
            # a batch of no users: IndexError before (follow-up, privacy 5)
            who = f"update of user {int(users[0])}" if len(users) else "batch (of no users)"
            raise ValueError(f"round {round_num}'s streamed {who} is {reason}")
        yield (entry[0], update) if pair else update


def _user_order(pair: tuple[Any, Any]) -> tuple[int, Any, str]:
    """The sort key of an ``(user, update)`` pair: by user, never comparing the updates.

    Forty-first review of issue 15 (api 5): ``sorted(updates.items())`` compared the updates of
    a user that came twice (a mapping of one's own whose ``items()`` yields a user twice) and
    keys of two types (``{3: u, "a": v}``), raising torch's ``RuntimeError: Boolean value of
    Tensor with more than one value is ambiguous`` or ``'<' not supported between instances of
    'str' and 'int'`` (and with ``cohort=``, ``int()``'s ``invalid literal for int()``) where the
    aggregator names the user that came twice; a key that is no user id is refused naming it.
    """
    user = pair[0]
    if isinstance(user, numbers.Integral) and not isinstance(user, bool):
        return (0, int(user), "")
    return (1, 0, f"{type(user).__name__}:{user!r}")


def largest_noise_std(dtype: torch.dtype) -> float:
    """The largest noise std of a round's sum in a model of ``dtype`` (:data:`NOISE_HEADROOM`)."""
    return torch.finfo(dtype).max / NOISE_HEADROOM if dtype.is_floating_point else math.inf


class AlgorithmAggregation:
    """Noised aggregation of :class:`~fedprivopt.strategies.core.ServerAlgorithm` (a mixin)."""

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

        Thirty-seventh review: in distributed-noise mode the sum of ``n`` shares has noise std
        ``σ_Δ C √(n/m_min)``, so the bound is divided by
        :func:`~fedprivopt.strategies.clipping.sum_noise_growth` (``min-shares = 1``, 500 users
        a round and ``clip-norm = 5e36`` overflowed the sum to an infinite model, rc 0).
        """
        c = self.config
        if not c.private:
            return
        largest = largest_noise_std(dtype) / sum_noise_growth(c, self._min_shares())
        adaptive_c = getattr(c.options, "clip_norm_adaptive", None)  # DP2's second norm
        for key, clip in (("clip-norm", c.clip_norm), ("clip-norm-adaptive", adaptive_c)):
            if clip is not None and not c.update_noise_multiplier * clip <= largest:
                sigma = "sigma_Delta" if c.adaptive else "noise-multiplier"
                raise ValueError(
                    f"{sigma} * {key} must be at most {largest:.6g} for a {dtype} model (the "
                    f"noise std of a round's sum; its largest number over {NOISE_HEADROOM:g}: "
                    "beyond it noise draws overflow to infinity"
                    f"{share_growth_advice(c, key)}), got "
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
        return NoisyMeanAggregator(
            clip_norm=c.clip_norm,
            noise_multiplier=c.update_noise_multiplier,  # σ_Δ with adaptive clipping
            expected_cohort_size=c.clients_per_round,
            noise_mode=c.noise_mode,
            min_shares=self._min_shares(),
        )

    def _min_shares(self) -> int | None:
        """``m_min`` of distributed noise (``None`` in server mode)."""
        c = self.config
        if c.noise_mode != "distributed":
            return None
        if c.min_shares:
            return c.min_shares
        if c.sampling == "fixed":
            # every cohort has exactly m users, so every quantile of its size is m (thirty-third
            # review of issue 15: Binomial(N, q)'s 1% quantile, 4 for a cohort of 10, made each
            # share and the sum's noise std sqrt(10/4) times what the accountant was told)
            return int(c.clients_per_round)
        return default_min_shares(c.population, c.sample_rate, c.min_shares_quantile)

    # -- one round -----------------------------------------------------------------------------

    def _aggregate_in_round(
        self,
        round_num: int,
        updates: Updates,
        *,
        clip_norm: float | None = None,
        stream: str = "",
        cohort: list[int] | None = None,
        count_now: bool = True,
    ):
        """Noised mean of the updates of one cohort (server noise keyed by round and stream).

        For :meth:`~fedprivopt.strategies.core.ServerAlgorithm.run_round`, which charges the
        round when it finishes; a caller's own
        :meth:`~fedprivopt.strategies.core.ServerAlgorithm.aggregate` charges it at once.
        Private: fortieth review of issue 15 (api 4), as the public ``aggregate_in_round`` it
        gave a caller five noised means of rounds 1-5 with ``epsilon()`` 0.0 (the thirty-ninth
        review's api 2 through the name DESIGN.md gives the round's aggregation step).

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

        ``count_now=False`` (a round's own cohort, checked after its sum): the cohort's noised
        count of adaptive clipping is kept for :meth:`_count_cohort`, which the round calls
        once its trainer's copies were found unchanged.
        """
        round_num = check_int("round_num", round_num, 1)
        if not callable(getattr(updates, "items", None)):
            # fortieth review of issue 15 (api 5): a train callback returning None, a list of
            # pairs, a generator or a tensor ended in AttributeError ("no attribute 'items'")
            raise TypeError(
                f"updates must be a mapping {{user: update}} (what a train callback returns for "
                f"its request's users), got {type(updates).__name__}"
            )
        self._refuse_spent_round(round_num, stream)
        if clip_norm is not None:
            # a short API review of issue 15: True and 1+0j equal a configured C of 1 and were
            # taken; 1e300 overflowed squaring the noise std (now refused by the aggregator)
            clip_norm = check_real("clip_norm", clip_norm, low=MIN_CLIP_NORM)
            # thirty-first review of issue 15: clip_norm=3e38 on a float32 model (noise std
            # σC 3e38) gave a noised mean with 257 of 1,000 entries infinite
            # thirty-seventh review: in distributed mode over the growth of the shares' sum
            sigma, largest = (
                self.config.update_noise_multiplier,
                largest_noise_std(self.params.dtype)
                / sum_noise_growth(self.config, self.aggregator.min_shares),
            )
            if self.config.private and not sigma * clip_norm <= largest:
                raise ValueError(
                    f"clip_norm must be at most {largest / sigma:.6g} for a {self.params.dtype} "
                    f"model (the noise std of the sum, {sigma:g} * clip_norm, at most "
                    f"{largest:.6g}), got {clip_norm:g}"
                )
        elif self.config.adaptive:
            clip_norm = self.current_clip_norm()
        tree_c = self.config.clip_norm
        if self.tree_noise is not None and clip_norm is not None and clip_norm != tree_c:
            # thirty-eighth review of issue 15: aggregate(1, updates, clip_norm=100) of a tree run
            # at clip-norm 1 clipped at 100 and added the tree's node noise, sized for 1 (std
            # sigma * 1): a user's update of norm 100 released under a hundredth of the noise
            # multiplier charged
            raise ValueError(
                f"clip_norm must be the run's clip-norm {tree_c:g} under tree aggregation (its "
                f"node noise is drawn for that norm; a period's nodes sum rounds), got "
                f"{clip_norm:g}"
            )
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
        reported: Any = updates  # what the count reads its users' bits from
        replied: set[int] | None = None  # the users the count may count (None: streamed)
        # forty-sixth review of issue 15 (api 6): read by its truth, a dict subclass of one's own
        # with a method of that name (sorted_by_user(self): sorted(self.items())) took the
        # streamed path, where one workspace stored for every user is not refused (api 3 of the
        # forty-fifth review): the last user summed 9 times (model 0.45 where 0.05) under a
        # charge of C. Only the bool True declares a streamed cohort (simulation.fast's).
        # Follow-up (privacy 3): and never a dict, which holds every value at once: a dict
        # subclass with the class attribute sorted_by_user = True and one workspace took the
        # streamed path as the method had (model 0.45 where 0.05)
        streamed = getattr(updates, "sorted_by_user", False) is True
        if streamed and not isinstance(updates, dict):
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
            entries = (_own_pair(entry) for entry in entries)  # read once (privacy 1)
            entries = each_user_once(entries, {int(u) for u in allowed}, round_num, received)
            entries = _plain_stream(entries, round_num)
        else:
            # pairs of their parts read once (follow-up, privacy 1): the aggregator reads them again
            # forty-fifth review of issue 15 (api 1): a mapping of one's own is read once, now
            now = type(updates).items is not dict.items
            once = ReadOnce()  # follow-up (privacy 3): and one memory read twice unchanged
            pairs = ((u, once.read(u, x) if now else x) for u, x in updates.items())
            entries = sorted(pairs, key=_user_order)
            once.refuse_unchanged(round_num)
            # forty-first review (api 5): int("a") raised here. Follow-up (privacy 3): a key of
            # an int subclass that compares (and hashes) as a sampled user passed the cohort
            # check while the aggregator summed its int value, an unsampled user: every check
            # below and the aggregator see the int value alone
            entries = [(check_int("updates key (a user id)", u), x) for u, x in entries]
            # forty-fourth review of issue 15 (api 5): the count read the users again from
            # updates.keys(), so a mapping whose keys() named every user of the population (its
            # items() the cohort's) had 40 users' bits counted (clip_count_fraction 2.46 where
            # 0.91), 31 of them unsampled, under the charge of a sampled cohort; the count reads
            # the users and bits this one reading gives
            replied = {u for u, _ in entries}
            if cohort is not None:
                asked = set(cohort)
                unasked = {
                    int(u): "not in the round's cohort" for u, _ in entries if u not in asked
                }
                entries = [(u, update) for u, update in entries if u in asked]
            owned = [(u, *own_update(x)) for u, x in entries]
            foreign = {int(u): why for u, _, why in owned if why is not None}
            if foreign:  # rejected alone, as a malformed update is
                unasked.update(foreign)
            entries = [(u, update) for u, update, why in owned if why is None]
            refuse_shared_memory(round_num, entries)  # forty-fifth review of issue 15 (api 3)
            if self.clipping is not None:
                # replies decoded from messages: one whose clip bit is invalid is not summed
                reported = ReportedUpdates(clip_bits=getattr(updates, "clip_bits", {}))
                entries, bad_bits = self.clipping.screen(entries, reported.clip_bits)
        sum_noise = None
        if self.tree_noise is not None:
            # the tree before this round's release, restored when the round fails before it
            # is released (_undo_tree_release)
            self._tree_undo = (round_num, self.tree_noise.state_dict())
            noise, nodes = self.tree_noise.release(round_num)
            sum_noise = (noise, nodes * self.tree_noise.std**2)
        try:
            agg = aggregator.aggregate(
                entries,
                dim=self.params.numel(),
                dtype=self.params.dtype,
                generator=generator,
                device=self.params.device,
                sum_noise=sum_noise,
            )
            if received is not None:  # the fast engine's own trainer sends no malformed one
                refuse_malformed(round_num, agg.rejected)
        except BaseException:
            self._undo_tree_release(round_num)
            raise
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
        self._uncounted = None
        if self.clipping is not None:
            users = received if replied is None else replied
            count = (round_num, self.rngs, reported, agg, bad_bits, stream, users)
            if count_now:
                self.clipping.count(*count)
            else:
                self._uncounted = count
        self._aggregated.add((round_num, stream))  # until the round finishes (_finish)
        return agg

    def _count_cohort(self) -> None:
        """Release the noised count :meth:`_aggregate_in_round` kept (``count_now=False``).

        Forty-third review of issue 15 (api 4): the count was released into the next step of
        ``C`` also for a cohort the round then refused (its trainer changed the request's
        model), so after the round ran again ``C`` and ``clip_count_fraction`` held the mean of
        two noised counts of round 1 (secure mode: 0.9137, the refused cohort's 0.8391 and the
        rerun's), one of them never charged. A refused cohort's count is dropped.
        """
        count, self._uncounted = getattr(self, "_uncounted", None), None
        if count is not None and self.clipping is not None:
            self.clipping.count(*count)

    def _refuse_spent_round(self, round_num: int, stream: str = "") -> None:
        """Refuse round ``round_num`` (``stream``) when it was released or begun, or is over budget.

        :meth:`_aggregate_in_round` checks it, and ``run_round`` before it samples: forty-third
        review of issue 15 (api 6), under tree aggregation ``drive_round(alg, 1, train)`` again
        after round 1 (refused as released already, at its aggregation) had checked a second
        cohort in to the period's participation ledger first: 10 users of 40 lost to the period,
        and the algorithm's own ``state_dict()`` after round 2 was refused by ``load_state_dict``
        as edited (30 users at step 2, at most 20).
        """
        if round_num <= self.round_num:
            raise ValueError(
                f"round {round_num} was released already (the last released round is "
                f"{self.round_num}): a round runs once, after the rounds before it (run again, its "
                "seeded noise would repeat)"
            )
        self._refuse_over_budget(round_num)
        self._refuse_unreleased_draw(round_num)  # forty-fourth review of issue 15 (api 2)
        if (round_num, stream) in self._aggregated:
            raise ValueError(
                f"round {round_num} was begun already: its noised sum{_stream_name(stream)} was "
                "computed by an earlier attempt that did not finish (ADADP's half-step point "
                "carries it to the second cohort); a round runs once (run again, its noise would "
                "repeat in seeded mode, or be released twice under one charge in secure mode)"
            )

    def _undo_tree_release(self, round_num: int) -> None:
        """Put the tree noise back as it was before round ``round_num``'s unreleased sum.

        Thirty-eighth review of issue 15, follow-up (privacy 2): a tree round refused after its
        node noise was taken (api 1's changed request, a streamed cohort that yields a user twice)
        left the tree at that round while the algorithm stayed before it: the round could not
        run again ("released already"), and the next one was released with its period's charge
        never made (``epsilon()`` 0.0 after round 2 of a 4-round period, sigma 1). Nothing of
        the refused round was released, so its nodes are drawn again (the same in a seeded run).
        """
        undo = getattr(self, "_tree_undo", None)
        if self.tree_noise is not None and undo is not None and undo[0] == round_num:
            self.tree_noise.load_state_dict(undo[1])
            self._tree_undo = None

    def _refuse_over_budget(self, round_num: int) -> None:
        """Refuse round ``round_num`` when its events would push ε above ``target-epsilon``.

        The engines stop before such a round (``budget_allows_next_round``); this refuses it,
        before any noise is drawn, to a caller of the Python API that does not (thirty-seventh
        review of issue 15: ``drive_round`` of a config with ``target_epsilon = 8`` released
        rounds 2 and 3 at ε 10.28 and 12.17, the second cohort of an ADADP round alike).
        """
        c = self.config
        events = self.uncharged_events(round_num)  # ADADP's cohort 2: its half step is charged
        if c.target_epsilon is None or not events:
            return
        if self.accountant.would_exceed(c.target_epsilon, c.delta, events):
            after = self.accountant.epsilon_after(events, c.delta)
            raise ValueError(
                f"round {round_num} would spend epsilon {after:.6g}, above target-epsilon "
                f"{c.target_epsilon:g} ({self.epsilon():.6g} spent through round "
                f"{self.round_num}): stop when budget_allows_next_round() is false"
            )

    def optimizer_noise_std(self, agg: Any, clip_norm: float | None = None) -> float:
        """The per-coordinate noise std of Δ̃ that a server optimizer may use: public.

        The aggregate's ``noise_std``, except with distributed noise (and no tree), where that
        grows with the number of shares accepted above ``min-shares``: there the accounted
        ``σ·C_t/m̄`` of the round's clip norm ``clip_norm`` (``None``: this round's, as
        the aggregation takes it). Seventeenth review of issue 15 (an observation): DP-FedAdam's
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
