"""The cohorts a server algorithm draws, what a caller's ``aggregate`` may sum, and what is charged.

:class:`AlgorithmCohorts` is a mixin of :class:`~fedprivopt.strategies.core.ServerAlgorithm`: the
privacy events of a round and the accountant's charge (:meth:`~AlgorithmCohorts.round_events`,
:meth:`~AlgorithmCohorts.charge_partial`, the budget check), the sampling of a round's cohort with
its secure-mode and tree bookkeeping (:meth:`~AlgorithmCohorts.sample`, ``_check_out``), and the
noised mean a caller of the Python API asks for (:meth:`~AlgorithmCohorts.aggregate`, charged when
returned, its cohort checked against the round's draw). It reads and sets the algorithm's
attributes (config, sampler, tree cohorts, accountant, the draws kept by purpose).
:func:`read_now` and :func:`refuse_shared_memory` keep a cohort's updates each user's own
(forty-fifth review of issue 15, api 1, 3 and 5).

Split from :mod:`fedprivopt.strategies.core`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from fedprivopt.core.checks import check_int
from fedprivopt.core.text import shown
from fedprivopt.privacy.aggregate_checks import KeptReads, shared_users
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.plain import own_update
from fedprivopt.privacy.sparse import RowSparse, RowSparseBatch
from fedprivopt.privacy.tree import tree_position
from fedprivopt.strategies.requests import Updates

__all__ = ["AlgorithmCohorts", "ReadOnce", "read_now", "refuse_shared_memory"]


class AlgorithmCohorts:
    """Sampling, privacy charges and a caller's ``aggregate`` of a server algorithm (a mixin).

    A mixin of :class:`~fedprivopt.strategies.core.ServerAlgorithm`.
    """

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

    # -- sampling ----------------------------------------------------------------------------

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
        # follow-up of the forty-second review of issue 15 (privacy 5, api 1's twin): the draw was
        # kept under the round as given; an int subclass equal to every round let aggregate reuse
        # round 1's secure draw for round 2 (one cohort summed twice, charged as two samples)
        round_num = check_int("round_num", round_num, 0)
        if purpose in ("sampling", self._stream_purpose("train-2")):
            self._refuse_unreleased_draw(round_num, "drawn")  # forty-fourth review (api 2)
        if self.tree_cohorts is not None:
            available = None
            if self.available_users is not None:
                available = torch.zeros(self.config.population, dtype=torch.bool)
                ids = [u - self.user_offset for u in self.available_users if u in self.user_ids]
                available[torch.as_tensor(ids, dtype=torch.int64)] = True
            users = [u + self.user_offset for u in self.tree_cohorts.cohort(round_num, available)]
        elif self.config.secure and (purpose, round_num) in self._secure_draws:
            # forty-third review of issue 15 (api 8): in secure mode every call drew anew, so a
            # caller could draw round 1 again until a chosen user was in it (the second draw held
            # user 7) and aggregate that cohort, charged as a Poisson sample of rate q; a round
            # has one draw, as a seeded one has
            users = list(self._secure_draws[purpose, round_num])
        else:
            # forty-eighth review of issue 15 (memory 2): iterating the tensor made a tensor a
            # user (680 bytes each a sampled user; a cohort of 10**8 about 68 GB)
            drawn = self.sampler.sample(round_num, purpose)
            if isinstance(drawn, torch.Tensor):
                drawn = drawn.tolist()
            users = [int(u) + self.user_offset for u in drawn]
            if self.config.secure:
                self._secure_draws[purpose, round_num] = tuple(users)
        self._drawn[purpose] = (round_num, frozenset(users))
        return users

    # -- a caller's aggregation, refused cohorts, partial charges ----------------------------

    def aggregate(
        self,
        round_num: int,
        updates: Updates,
        *,
        clip_norm: float | None = None,
        stream: str = "",
        cohort: list[int] | None = None,
    ):
        """The noised mean of one cohort, asked by a caller: a release, charged when returned.

        :meth:`run_round` (and so every engine) aggregates with ``_aggregate_in_round`` and
        charges the round when it finishes. A caller of the Python API that calls this itself
        is given the noised mean, which is then released: the accountant is charged round
        ``round_num``'s events (:meth:`round_events`) before it is returned. Thirty-ninth review
        of issue 15 (api 2): the accountant was not charged, so five noised sums of rounds
        1-5 left ``aggregate`` with ``epsilon()`` 0.0 (dp-fedavg, sigma 0.5, q 0.25), and
        ``run_round`` of a round so begun is refused without charge (``round 1 was begun
        already``): round 2 after it gave 7.55 where two released sums are 10.28. Arguments
        and errors are :meth:`~fedprivopt.strategies.aggregation.AlgorithmAggregation.
        _aggregate_in_round`'s (the noised mean :meth:`run_round` takes, uncharged).
        """
        cohort = self._round_cohort(round_num, stream, cohort)
        agg = self._aggregate_in_round(
            round_num, updates, clip_norm=clip_norm, stream=stream, cohort=cohort
        )
        # ADADP's second cohort after drive_round's half step (charged then): the rest of the
        # round's events, as the round's finish charges them (follow-up, privacy 3)
        second = self._stream_purpose(stream) == "sampling-2"
        events = self.uncharged_events(round_num) if second else self.round_events(round_num)
        if events:
            self.accountant.step(events)
        if second:
            self._partial_charged = None
        return agg

    def _round_cohort(self, round_num: int, stream: str, cohort: list[int] | None) -> list[int]:
        """The cohort :meth:`aggregate` sums: ``cohort``, or the round's sample without one.

        Fortieth review of issue 15 (api 6): ``aggregate(1, updates)`` without ``cohort``
        summed every user of ``updates`` (all 40 of a population sampled at q = 0.25: accepted
        40) under the charge of a round that samples a quarter of them, and so did
        ``cohort=range(40)``. A seeded sampled round draws the same cohort at every call
        (:meth:`sample`): a given cohort must be within it. In secure mode or under tree
        aggregation a second draw is another cohort, so the caller must pass the one it used,
        within that draw (follow-up, privacy 3: ``cohort=range(40)`` summed all 40 there).
        """
        round_num = check_int("round_num", round_num, 1)
        if cohort is not None:
            cohort = _cohort_users(cohort)
        purpose = self._stream_purpose(stream)
        if purpose == "sampling-2" and (round_num, "train") not in self._aggregated:
            # forty-fourth review of issue 15 (api 1): a second cohort summed alone let a caller
            # release whichever of the round's two draws held a chosen user
            raise ValueError(
                f"aggregate of round {round_num}'s second cohort (stream 'train-2') follows its "
                "first (stream 'train', the users of alg.sample(round_num)), as run_round does"
            )
        if self.config.secure or self.tree_cohorts is not None:
            if cohort is None:
                raise ValueError(
                    "aggregate needs cohort= (the users alg.sample(round_num) returned for the "
                    "round its updates were trained for) in secure mode or under tree "
                    "aggregation, where another draw gives another cohort"
                )
            drawn_round, sampled = self._drawn.get(purpose, (0, frozenset()))
            if drawn_round != round_num:
                raise ValueError(
                    f"aggregate of round {round_num} in secure mode or under tree aggregation "
                    f"sums users of the cohort this algorithm drew for it last, and it drew "
                    f"none (call alg.sample({round_num}) and train those users)"
                )
        else:
            sampled = self.sample(round_num, purpose)
        if cohort is None:
            return sampled
        extra = sorted(set(cohort) - set(sampled))
        if extra:
            raise ValueError(
                f"cohort holds users round {round_num} did not sample ({shown(extra)}; "
                f"alg.sample({round_num}) gives its cohort): their updates would be summed "
                "outside the sampling the accountant charges"
            )
        return cohort

    def _stream_purpose(self, stream: str) -> str:
        """The draw (:meth:`sample`'s purpose) whose users a ``stream`` of a round sums.

        ``"sampling-2"`` for the second cohort (``"train-2"``) of a strategy with two a round
        (ADADP), else ``"sampling"``. Forty-fourth review of issue 15 (api 1): a single-cohort
        strategy (dp-fedavg) took ``aggregate(r, ..., stream="train-2")`` with the users of
        ``alg.sample(r, "sampling-2")``, a second independent draw of the round: a caller who
        released whichever of the two draws held a chosen user (secure mode) released that
        user in 44.5% of runs where q is 0.25, charged as one Poisson sample of rate q.
        """
        return "sampling-2" if stream == "train-2" and self.events_per_round > 1 else "sampling"

    def _refuse_unreleased_draw(self, round_num: int, does: str = "released") -> None:
        """In secure mode, refuse round ``round_num`` while another round's draw is unreleased.

        Forty-fourth review of issue 15 (api 2): a caller who drew a round (``alg.sample(r)``,
        or ``drive_round`` whose callback saw ``request.users`` and raised) could leave it
        unreleased and go on to another round (later, or earlier ones taken downwards),
        releasing only the rounds whose draw held a chosen user (that user in every released
        round, charged as a Poisson sample of rate q: epsilon 7.55 after one). A secure round's
        draw is given again for its round (forty-third review, api 8), so a round whose draw was
        seen is released (or run again) before another round is drawn (:meth:`sample`, ``does``
        ``"drawn"``) or released (``_refuse_spent_round``); a seeded caller knows every draw
        from the seed anyway. Stopping the run is not refused: the caller sees the cohorts it
        trains.
        """
        if not self.config.secure or self.tree_cohorts is not None:
            return
        purposes = {"sampling", self._stream_purpose("train-2")}
        # each draw is released by the sum of its own cohort: follow-up of the forty-fourth
        # review (privacy 3), an ADADP round whose first cohort was summed counted as released,
        # so a callback raising when a chosen user was not in the second cohort (request.stream
        # 'train-2') released only second cohorts holding that user (5 of 20 rounds, each one)
        released = {(r, self._stream_purpose(stream)) for r, stream in self._aggregated}
        held = sorted(
            (r, purpose)
            for purpose, r in self._secure_draws
            if purpose in purposes
            and (r, purpose) not in released
            and round_num != r > self.round_num
        )
        if held:
            r, purpose = held[0]
            how = "drive_round, or aggregate with that cohort"
            if purpose != "sampling":
                # its round cannot run again (its first cohort's sum was computed): a lost second
                # cohort is released by aggregate, with the updates that came (none: noise alone)
                how = f"alg.aggregate({r}, updates, stream='train-2', cohort=that cohort)"
            second = "" if purpose == "sampling" else f", {purpose!r}"
            raise ValueError(
                f"round {round_num} cannot be {does} while round {r}'s cohort, drawn in secure "
                f"mode (alg.sample({r}{second})), is not released: release it first ({how}); "
                "a drawn cohort skipped lets its draw choose which rounds are released (a chosen "
                "user in every one, charged as a Poisson sample of rate q)"
            )

    def _check_out(self, round_num: int, users: list[int]) -> None:
        """Take round ``round_num``'s refused cohort ``users`` out of the tree's participation.

        Forty-third review of issue 15 (api 7): a tree round refused after its sum (its trainer
        changed the request's model), or whose aggregation refused its updates (a callback
        returning ``None``), nothing released, kept its cohort checked in to the
        period's participation ledger: the round run again drew 10 other users, 10 users were
        lost to the period, and the algorithm's own ``state_dict()`` was refused by
        ``load_state_dict`` as edited (30 users at step 2, at most 20). Only these users are
        taken out (a cohort drawn since for another attempt stays in), and the draw is
        forgotten, so ``aggregate`` cannot sum them unchecked in.
        """
        if self.tree_cohorts is None:
            return
        if self._drawn.get("sampling", (None,))[0] == round_num:
            del self._drawn["sampling"]
        state = self.tree_cohorts.state_dict()
        if state["period"] != tree_position(round_num, self.config.restart_rounds)[0]:
            return
        refused = {u - self.user_offset for u in users}
        kept = [int(u) for u in state["users"].tolist() if int(u) not in refused]
        self.tree_cohorts.load_state_dict(
            {"period": state["period"], "users": torch.tensor(kept, dtype=torch.int64)}
        )

    def charge_partial(self, round_num: int) -> None:
        """Charge the accountant the first of round ``round_num``'s events now (ADADP's half step).

        Thirty-eighth review of issue 15, follow-up (privacy 3): the accountant was charged a
        round's events only when the round finished, but ADADP's half-step point (a function of
        cohort 1's noised sum) reaches cohort 2's trainer before that; a round then refused
        (api 1's changed request of ``train-2``, or a failed second aggregation) left that
        release uncharged: ``epsilon()`` 0.0 after it, 3.19 after the next round where three
        cohorts' sums were released. :meth:`_finish` charges the rest
        (:meth:`uncharged_events`).
        """
        events = self.round_events(round_num)[:1]
        if events:
            self.accountant.step(events)
        self._partial_charged = round_num

    def charge_begun_period(self, round_num: int) -> None:
        """Charge a tree period whose first round failed after its noised sum reached the step.

        Follow-up of the forty-fourth review of issue 15 (privacy 1): under tree aggregation a
        period's event is charged at its first round (:meth:`round_events`), when that round
        finishes. A first round whose server step raised after its sum (a transform of one's
        own, a KeyboardInterrupt in a notebook) cannot run again (``begun already``), but the
        period's nodes were drawn and the tree stays at that round, so rounds 2 and 3 were
        released with ``epsilon()`` 0.0 (dp-fedavg or dp-fedadam, sigma 0.5, restart 4), where
        an honest round 1 charges 19.62. The noised sum reached the step, so the period is
        charged now, as ADADP's half step is (:meth:`charge_partial`); a Gaussian round so
        begun releases nothing a later round reads and stays uncharged.
        """
        if self.tree_noise is None or self.tree_noise.round_num != round_num:
            return
        events = self.uncharged_events(round_num)
        if events:
            self.accountant.step(events)
        self._partial_charged = round_num

    def uncharged_events(self, round_num: int) -> list[SubsampledGaussianEvent]:
        """Round ``round_num``'s events not yet charged (all but the first after a half step)."""
        events = self.round_events(round_num)
        return events[1:] if getattr(self, "_partial_charged", None) == round_num else events


def _cohort_users(cohort: object) -> list[int]:
    """``aggregate``'s ``cohort`` as a list of plain user ids, read once.

    Forty-second review of issue 15 (api 5): a generator or iterator (``cohort=iter(users)``)
    was read by the check against the round's sample and was empty when the aggregation read
    it: every update was rejected as not in the cohort and a round of noise alone was released
    and charged (epsilon 7.55, accepted 0); ``[True]`` summed user 1, and 0-d tensors were
    refused as users the round did not sample.
    """
    if isinstance(cohort, (str, bytes)) or not isinstance(cohort, Iterable):
        raise ValueError(
            f"cohort must be a list of user ids (what alg.sample(round_num) returns), got "
            f"{shown(cohort)}"
        )
    return [check_int("cohort entry (a user id)", user, 0) for user in cohort]


def read_now(update: object) -> object:
    """``update`` as read now: a copy of its plain parts (or as is, when it is refused later).

    Forty-fifth review of issue 15 (api 1): a train callback (or ``aggregate``'s caller)
    returning a mapping of its own whose ``items()`` trains each user when it reaches it, into
    one workspace it reuses (a lazy view; the fast engine's cohort trainers reuse theirs so),
    gave every user's pair the same tensor, holding the last user's update when the pairs were
    summed: that user's clipped update was summed once for every user of the cohort (the
    model at 0.45 where that user alone moves it 0.05 over m 10), a sensitivity of 9C under a
    charge of C. Values of a mapping whose ``items()`` is not a plain ``dict``'s are copied as
    they are read (a dict's values are not changed between two reads).
    """
    owned, reason = own_update(update)
    if reason is not None:  # refused below, whatever its values
        return update
    if isinstance(owned, torch.Tensor):
        return owned.clone()
    if isinstance(owned, RowSparseBatch):
        return owned.clone()
    if isinstance(owned, RowSparse):
        return RowSparse(owned.rows.clone(), owned.values.clone(), owned.length)
    return owned


def refuse_shared_memory(round_num: int, entries: list[tuple[int, object]]) -> None:
    """Raise ``ValueError`` when two users' updates are held in the same memory.

    Forty-fifth review of issue 15 (api 3): a train callback that trained each user into one
    workspace and returned ``{user: work}`` (a plain ``dict``, the values one tensor) had the
    last user's update summed once for every user of the cohort (the model at 0.45 where that
    user alone moves it 0.05 over m 10), a sensitivity of 9C under a charge of C. The values
    are what the users hold when they are summed, so a cohort whose updates share memory (the
    same tensor, or views of the same entries) is refused before its noise is drawn: nothing
    is released, and the round may run again. Views of distinct entries of one tensor (the
    rows of a stacked matrix) are distinct updates. The fast engine checks a cohort trainer's
    batch of pairs with it too (:mod:`fedprivopt.simulation.fast_trainer`, api 5), and the
    aggregation every cohort it reads from a mapping.
    """
    # follow-up of the forty-fifth review (privacy 5): every pair of a storage's updates was
    # compared (0.65 s for the 4,000 rows of one stacked matrix, 4 s for 10,000, each round);
    # now one view twice by a dict and overlapping contiguous ranges by one sorted sweep
    # (privacy.aggregate_checks.shared_users, which the aggregator's own check shares)
    pair = shared_users(entries)
    if pair is not None:
        _refuse_shared(round_num, *pair)


def _refuse_shared(round_num: int, user_a: object, user_b: object) -> None:
    raise ValueError(
        f"round {round_num}: the updates of users {min(user_a, user_b)} and "
        f"{max(user_a, user_b)} are held in the same memory (one tensor, or views of the "
        "same entries: a workspace reused for every user holds the last user's update "
        "when they are summed); give each user a tensor of its own (work.clone()); "
        "nothing of the cohort was released"
    )


class ReadOnce:
    """A mapping of one's own read once: its values copied as read, and shared memory refused.

    Follow-up of the forty-fifth review of issue 15 (privacy 3): api 1 copied the values of a
    mapping whose ``items()`` is not a plain ``dict``'s as they are read (a lazy mapping that
    trains each user into one workspace when it reaches it), so api 3's check of shared memory
    compared the copies alone: a train callback that trained each user into one workspace and
    returned ``OrderedDict`` (also ``MappingProxyType``, ``UserDict``) of ``{user: work}`` had
    the last user's update summed once for every user (the model at 0.45 where 0.05), a
    sensitivity of 9C under a charge of C, where a plain ``dict`` of it is refused. Updates
    read from one memory that was not written between their reads (the same version of it)
    held the same values: refused (:meth:`refuse_unchanged`) before the noise is drawn; a lazy
    mapping, which writes its workspace before each read, is summed as before. An update that
    is its whole memory is kept by a weak reference (one the mapping let go is no workspace
    another update holds).
    """

    def __init__(self) -> None:
        self.reads = KeptReads()

    def read(self, user: object, update: object) -> object:
        """``update`` as :func:`read_now` gives it, its memory remembered as ``user``'s."""
        if isinstance(user, int) and not isinstance(user, bool):
            self.reads.keep(int(user), update.values if isinstance(update, RowSparse) else update)
        return read_now(update)

    def refuse_unchanged(self, round_num: int) -> None:
        """``ValueError`` naming two users read from one memory not written between the reads."""
        pair = self.reads.shared()
        if pair is not None:
            _refuse_shared(round_num, *pair)
