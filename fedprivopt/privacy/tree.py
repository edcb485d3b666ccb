"""Tree aggregation (DP-FTRL): noise without sampling, for users who join once a period.

Under ``noise-mechanism = "tree"`` the rounds are grouped into *restart periods* of ``T`` rounds.
Inside a period the server keeps the honest binary tree of Kairouz et al. (2021) over the rounds'
clipped sums ``x_1 … x_T``: node ``(l, j)`` (level ``l``, index ``j`` from 0) is the partial sum
of leaves ``j·2^l + 1 … (j+1)·2^l`` plus its own noise ``N(0, σ²C²I)``, drawn once. The prefix
sum ``x_1 + … + x_t`` is estimated from the nodes of the binary decomposition of ``t``
(:func:`prefix_nodes`, ``popcount(t)`` of them), and round ``t`` releases the *difference* of two
consecutive prefix estimates, i.e. its own sum plus the noise

    ``Ñ_t − Ñ_{t−1}`` = (the node completed at step ``t``) − (the nodes it replaces),

``1 + tz(t)`` nodes (``tz``: trailing zero bits). Everything after the release is
post-processing, so the adaptive server optimizers apply unchanged. :class:`TreeNoise` produces
exactly that noise; the clipped sum itself comes from
:class:`~fedprivopt.privacy.aggregate.NoisyMeanAggregator`.

A user joins at most one round of a period (:class:`ParticipationLedger` refuses a second
check-in), so it is in one leaf, and every node has L2 sensitivity ``C`` under the
replace-with-a-special-element relation; a leaf has ``⌈log2(T + 1)⌉`` ancestors in a tree of
``T`` leaves. dp-accounting's ``SingleEpochTreeAggregationDpEvent(σ, T)`` accounts one period
(:meth:`~fedprivopt.privacy.events.SubsampledGaussianEvent.tree`); periods compose.

Cohorts are formed without sampling: each period draws a seeded shuffle of the users
(:class:`TreeCohorts`), and round ``t`` takes the next ``m`` users of that order that are
available and have not checked in this period.

Randomness: node ``(l, j)`` of period ``p`` is drawn from the generator
``(p, "tree-noise", l, j)`` and the period's order from ``(p, "tree-cohorts")``
(:class:`~fedprivopt.privacy.rng.RngFactory`), so a seeded run regenerates them; the live nodes
and the ledger are part of :meth:`TreeNoise.state_dict` / :meth:`TreeCohorts.state_dict`, so a
resumed run (seeded or secure) continues the same tree.

References
----------
P. Kairouz, B. McMahan, S. Song, O. Thakkar, A. Thakurta, Z. Xu, "Practical and Private (Deep)
Learning without Sampling or Shuffling", ICML 2021 (Appendix D: restarts).
T.-H. H. Chan, E. Shi, D. Song, "Private and Continual Release of Statistics", ACM TISSEC 2011.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from fedprivopt.core.checks import check_int, check_real
from fedprivopt.core.devices import check_device
from fedprivopt.core.memory import check_fits
from fedprivopt.core.text import shown
from fedprivopt.privacy.noise import gaussian_noise
from fedprivopt.privacy.rng import RngFactory, check_rngs
from fedprivopt.privacy.sampling import MAX_POPULATION

__all__ = [
    "NOISE_MECHANISMS",
    "ParticipationError",
    "ParticipationLedger",
    "TreeCohorts",
    "TreeNoise",
    "calibrate_tree",
    "prefix_nodes",
    "released_nodes",
    "tree_depth",
    "tree_position",
]

#: Values of ``noise-mechanism``: a fresh Gaussian on every round's sum, or tree aggregation.
NOISE_MECHANISMS = ("gaussian", "tree")

#: A node's std may be at most its dtype's largest number over this (the strategies' bound on
#: a round's noise std, ``strategies.aggregation.NOISE_HEADROOM``): a Gaussian draw reaches 4-6
#: standard deviations, and a release sums up to ~20 nodes.
NODE_HEADROOM = 64.0

#: Nudges of :func:`calibrate_tree` (relative steps 1e-9 · 2**k: the last multiplies σ by ~10**4).
_NUDGES = 44


def tree_position(round_num: int, restart_rounds: int) -> tuple[int, int]:
    """``(period, step)`` of server round ``round_num`` (from 1): period from 0, step from 1."""
    round_num = check_int("round_num", round_num, 1)
    period, step = divmod(round_num - 1, check_int("restart_rounds", restart_rounds, 1))
    return period, step + 1


def prefix_nodes(step: int) -> list[tuple[int, int]]:
    """The nodes ``(level, index)`` whose sum estimates the prefix ``x_1 + … + x_step``.

    One node per set bit of ``step`` (``popcount(step)`` nodes; none for ``step = 0``), highest
    level first; node ``(l, j)`` covers leaves ``j·2^l + 1 … (j+1)·2^l``.
    """
    step = check_int("step", step, 0)
    nodes, start = [], 0
    for level in reversed(range(step.bit_length())):
        if step >> level & 1:
            nodes.append((level, start >> level))
            start += 1 << level
    return nodes


def released_nodes(step: int) -> int:
    """Nodes in the release of ``step``: ``1 + tz(step)`` (its noise variance over σ²C²)."""
    step = check_int("step", step, 1)
    return (step & -step).bit_length()


def tree_depth(steps: int) -> int:
    """``⌈log2(steps + 1)⌉``: the nodes one leaf of a ``steps``-leaf tree contributes to."""
    return check_int("steps", steps, 1).bit_length()


def calibrate_tree(
    target_epsilon: float,
    delta: float,
    *,
    restart_rounds: int,
    rounds: int,
    population: int = 1,
    cohort_size: int = 1,
) -> float:
    """The smallest node noise multiplier ``σ`` whose tree run of ``rounds`` meets (ε, δ).

    ``⌈rounds / restart_rounds⌉`` periods, each charged whole, under the RDP accountant; the
    search is dp-accounting's ``calibrate_dp_mechanism`` and the result is checked against
    :func:`~fedprivopt.privacy.accounting.compose_epsilon` (nudged up until it meets the target).
    ``population`` and ``cohort_size`` only label the event (they do not change ε).
    """
    import dp_accounting as dpa
    from dp_accounting import rdp

    from fedprivopt.privacy.accounting import compose_epsilon
    from fedprivopt.privacy.accounting_state import check_delta, check_ledger_count
    from fedprivopt.privacy.calibration import SEARCH_LOWEST_SIGMA, bracketed_search
    from fedprivopt.privacy.events import SubsampledGaussianEvent

    target_epsilon = check_real("target_epsilon", target_epsilon, low=0.0, low_open=True)
    # sixteenth review of issue 15: delta="1e-5" raised a TypeError inside dp-accounting, and
    # rounds=10**400 an OverflowError
    delta = check_delta(delta)
    periods = -(-check_int("rounds", rounds, 1) // check_int("restart_rounds", restart_rounds, 1))
    check_ledger_count(
        periods, "rounds / restart_rounds must be at most 10**300 periods (float64 holds no more)"
    )

    def event(sigma: float) -> SubsampledGaussianEvent:
        return SubsampledGaussianEvent.tree(
            population=population,
            cohort_size=cohort_size,
            noise_multiplier=sigma,
            restart_rounds=restart_rounds,
        )

    def eps_at(sigma: float) -> float:
        return compose_epsilon([(event(sigma), periods)], delta)

    sigma = bracketed_search(
        lambda: dpa.calibrate_dp_mechanism(
            lambda: rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_SPECIAL),
            lambda s: dpa.SelfComposedDpEvent(event(s).to_dp_event(), periods),
            target_epsilon,
            delta,
            bracket_interval=dpa.LowerEndpointAndGuess(SEARCH_LOWEST_SIGMA, 1.0),
            tol=1e-7,
        ),
        eps_at,
        target_epsilon,
    )
    # Nudge up by steps that double from 1e-9 (relative): a short API review of issue 15 found
    # steps of a fixed 1e-9 running on for minutes (rounds=10**12 with restart_rounds=1), and
    # forever where compose_epsilon's ε stays above the target at every σ (a target of 1e-300,
    # below what RDP of a round within rounding of 0 shows).
    step = 1e-9
    for _ in range(_NUDGES):
        spent = eps_at(sigma)
        if spent <= target_epsilon:
            return sigma
        sigma, step = sigma * (1 + step), step * 2
    raise ValueError(
        f"target_epsilon={target_epsilon:g} is not reached: at the noise_multiplier {sigma:.5g} "
        f"the epsilon that can be shown is {spent:.4g} (the RDP of a period is within rounding "
        "of 0); raise target_epsilon or delta, or use fewer rounds"
    )


class TreeNoise:
    """Noise of the tree releases, one round at a time (see the module docstring).

    Parameters
    ----------
    std : float
        Noise std of every node, ``σC`` (``> 0``).
    restart_rounds : int
        Rounds per period ``T``; the tree starts anew at rounds ``1, T + 1, 2T + 1, …``.
    rngs : RngFactory
        Source of the node generators (purpose ``"tree-noise"``).
    dim : int
        Length of the released vector.
    dtype : torch.dtype
        Floating dtype of the noise.
    device : torch.device or str
        Device of the noise (drawn on the CPU, then moved, as the aggregator's).
    """

    def __init__(
        self,
        *,
        std: float,
        restart_rounds: int,
        rngs: RngFactory,
        dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.std = check_real("std", std, low=0.0, low_open=True)
        self.restart_rounds = check_int("restart_rounds", restart_rounds, 1)
        self.rngs = check_rngs(rngs)
        self.dtype = dtype
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"dtype must be a floating torch.dtype, got {shown(dtype)}")
        self.device = check_device(device)
        self.dim = check_fits("dim", check_int("dim", dim, 1), dtype.itemsize, self.device)
        self.round_num = 0
        self._nodes: dict[tuple[int, int], torch.Tensor] = {}

    def _node(self, period: int, level: int, index: int) -> torch.Tensor:
        generator = self.rngs.generator(period, "tree-noise", level, index)
        noise = gaussian_noise(self.dim, self.std, generator=generator, dtype=self.dtype)
        return noise.to(self.device)

    def release(self, round_num: int) -> tuple[torch.Tensor, int]:
        """The noise of round ``round_num``'s released sum, and how many nodes it carries.

        Rounds are released in order: ``round_num`` must be the round after the last one
        released, or the first round of a period. The noise's per-coordinate variance is the
        node count times ``std²``.
        """
        period, step = tree_position(round_num, self.restart_rounds)
        largest = torch.finfo(self.dtype).max / NODE_HEADROOM
        if not self.std <= largest:
            # forty-sixth review of issue 15 (mechanisms 1): float16 nodes of std 1e5 were
            # about half infinite (float16 ends at 65504), and so was the released mean.
            # Checked here, not when built: a strategy refuses the same bound naming its keys
            raise ValueError(
                f"std must be at most {largest:.6g} for {self.dtype} nodes (the dtype's largest "
                f"number over {NODE_HEADROOM:g}: beyond it draws overflow to infinity), got "
                f"{self.std:g}; draw the nodes in a wider dtype (dtype=torch.float64)"
            )
        if round_num <= self.round_num:
            # thirty-fifth review of issue 15: a period's first round could be released again
            # (release(1) after release(3)), with the same node noise in a seeded run: the
            # difference of the two releases was the difference of the sums, noiseless
            raise ValueError(
                f"tree noise is released round by round: round {round_num} was released "
                f"already (the last released round is {self.round_num})"
            )
        if step == 1:
            self._nodes = {}
        elif round_num != self.round_num + 1:
            raise ValueError(
                f"tree noise is released round by round: round {round_num} follows round "
                f"{self.round_num}"
            )
        needed = prefix_nodes(step)
        dropped = [node for node in self._nodes if node not in needed]
        (new,) = [node for node in needed if node not in self._nodes]  # one node completes
        node = self._node(period, *new)
        noise = node.clone()
        for old in dropped:
            noise -= self._nodes.pop(old)
        self._nodes[new] = node
        self.round_num = round_num
        return noise, 1 + len(dropped)

    def state_dict(self) -> dict[str, Any]:
        """The last released round and the live nodes (tensors), for checkpoints."""
        return {
            "round": self.round_num,
            "nodes": [[level, index, t] for (level, index), t in sorted(self._nodes.items())],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; ``ValueError`` for nodes that cannot be this tree's."""
        if not isinstance(state, Mapping):
            raise ValueError("tree state must be a mapping of round and nodes")
        round_num = check_int("tree state round", state.get("round"), 0)
        nodes: dict[tuple[int, int], torch.Tensor] = {}
        items = state.get("nodes", [])
        shape = "tree state: nodes must be a list of [level, index, vector]"
        if not isinstance(items, list | tuple):  # None, a string: TypeError before (issue 15)
            raise ValueError(f"{shape}, got {shown(items)}")
        for item in items:
            if not isinstance(item, list | tuple) or len(item) != 3:
                raise ValueError(f"{shape}, got an item {shown(item)}")
            level, index, tensor = item
            if any(isinstance(v, bool) or not isinstance(v, int) for v in (level, index)):
                raise ValueError(f"{shape}, got a level and index {shown(level)}, {shown(index)}")
            if (
                not isinstance(tensor, torch.Tensor)
                or tensor.shape != (self.dim,)
                or tensor.dtype != self.dtype
            ):
                raise ValueError("tree state: a node is not a vector of the model's length/dtype")
            nodes[(level, index)] = tensor.to(self.device)
        step = tree_position(round_num, self.restart_rounds)[1] if round_num else 0
        expected = prefix_nodes(step)
        if sorted(nodes) != sorted(expected):
            raise ValueError(
                f"tree state: nodes {shown(sorted(nodes))} are not the prefix nodes {expected} of "
                f"round {round_num}"
            )
        # in release order (prefix_nodes' order, as a running tree holds them): release()
        # subtracts the dropped nodes in this order, and another order rounds differently
        # (twenty-seventh review of issue 15: a seeded tree run resumed from a mid-period
        # checkpoint replayed round 4 with a model differing in its last bits)
        self.round_num, self._nodes = round_num, {node: nodes[node] for node in expected}


def _user_ids(users: Iterable[Any], population: int) -> torch.Tensor:
    """``users`` as an int64 tensor; ``ValueError`` unless every one is an integer.

    Thirty-seventh review of issue 15: ``check_in(0, [1.9])`` recorded user 1 (``-0.5``, user
    0): the ids were cast to int64, which truncates, so the user meant could check in again in
    the same period; ``True`` was user 1 and a string raised torch's ``too many dimensions``.
    """
    items = list(users)
    try:
        ids = torch.as_tensor(items) if items else torch.zeros(0, dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        ids = None
    odd = ids is None or ids.dim() != 1 or ids.dtype == torch.bool or ids.is_floating_point()
    if odd or ids.is_complex() or any(isinstance(u, bool) for u in items):
        raise ValueError(f"user ids must be integers in [0, {population}), got {shown(items)}")
    return ids.to(torch.int64)


class ParticipationError(ValueError):
    """A user checked in a second time in one restart period."""


class ParticipationLedger:
    """Which users took part in the current restart period; refuses a second check-in.

    Parameters
    ----------
    population : int
        Number of users ``N`` (ids ``0 .. N-1``).
    """

    def __init__(self, population: int) -> None:
        # the run configuration's bound (10**12 raised an allocation RuntimeError; twenty-third
        # review of issue 15)
        self.population = check_int("population", population, 1, MAX_POPULATION)
        self.period = 0
        self._seen = torch.zeros(self.population, dtype=torch.bool)

    def _enter(self, period: int) -> None:
        period = check_int("period", period, 0)
        if period < self.period:
            raise ParticipationError(
                f"period {period} is over (the ledger is at restart period {self.period})"
            )
        if period > self.period:
            self.period = period
            self._seen.zero_()

    def eligible(self, period: int) -> torch.Tensor:
        """Boolean mask of the users that may still check in during ``period``."""
        self._enter(period)
        return ~self._seen

    def check_in(self, period: int, users: Iterable[int]) -> None:
        """Record that ``users`` take part in a round of ``period``.

        Raises
        ------
        ParticipationError
            If a user already checked in during ``period`` (or twice in ``users``), or the
            period is over; nothing is recorded then.
        """
        self._enter(period)
        ids = _user_ids(users, self.population)
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.population):
            raise ValueError(f"user ids must be in [0, {self.population})")
        again = self._seen[ids].nonzero().flatten() if ids.numel() else ids
        if again.numel() or ids.unique().numel() != ids.numel():
            user = int(ids[again[0]]) if again.numel() else int(ids[0])
            raise ParticipationError(
                f"user {user} already took part in restart period {period}: under tree "
                "aggregation a user joins at most one round a period"
            )
        self._seen[ids] = True

    def state_dict(self) -> dict[str, Any]:
        """The period and its participants (an int64 tensor)."""
        return {"period": self.period, "users": self._seen.nonzero().flatten()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Raises
        ------
        ValueError
            Unless ``state`` holds ``period`` and ``users``, a 1-D tensor of integer ids in the
            population (twenty-third review of issue 15: a checkpoint whose ``users`` was
            deleted, ``None`` or a string, its digest recomputed, raised ``KeyError`` or
            ``TypeError`` out of ``--resume``, rc 1).
        """
        if not isinstance(state, Mapping) or not {"period", "users"} <= set(state):
            raise ValueError("participation state must hold 'period' and 'users'")
        users = state["users"]
        integral = isinstance(users, torch.Tensor) and not (
            users.is_floating_point() or users.is_complex() or users.dtype == torch.bool
        )
        if not integral or users.dim() != 1:
            got = (
                f"a {users.dtype} tensor of shape {tuple(users.shape)}"
                if isinstance(users, torch.Tensor)
                else shown(users)
            )
            raise ValueError(
                f"participation state: users must be a 1-D tensor of user ids, got {got}"
            )
        users = users.to(torch.int64)
        if users.numel() and (users.min() < 0 or users.max() >= self.population):
            raise ValueError("participation state: a user id is outside the population")
        self.period = check_int("participation state period", state["period"], 0)
        self._seen.zero_()
        self._seen[users] = True


class TreeCohorts:
    """Cohorts without sampling: the next ``m`` users of the period's shuffle, once a period each.

    Parameters
    ----------
    population : int
        ``N`` users (ids ``0 .. N-1``).
    cohort_size : int
        ``m`` users a round; ``m·T <= N`` so every round of a period can be filled.
    restart_rounds : int
        ``T`` rounds per period.
    rngs : RngFactory
        Source of the period's order (purpose ``"tree-cohorts"``).
    """

    def __init__(
        self, *, population: int, cohort_size: int, restart_rounds: int, rngs: RngFactory
    ) -> None:
        # the run configuration's bound (10**12 raised an allocation RuntimeError; twenty-third
        # review of issue 15)
        self.population = check_int("population", population, 1, MAX_POPULATION)
        self.restart_rounds = check_int("restart_rounds", restart_rounds, 1)
        self.cohort_size = check_int(
            "cohort_size", cohort_size, 1, self.population // self.restart_rounds
        )
        self.rngs = check_rngs(rngs)
        self.ledger = ParticipationLedger(self.population)
        self._order: tuple[int, torch.Tensor] | None = None

    def order(self, period: int) -> torch.Tensor:
        """The period's shuffle of the users (drawn once per period and kept)."""
        if self._order is None or self._order[0] != period:
            generator = self.rngs.generator(period, "tree-cohorts")
            self._order = (period, torch.randperm(self.population, generator=generator))
        return self._order[1]

    def cohort(self, round_num: int, available: torch.Tensor | None = None) -> list[int]:
        """The users of ``round_num`` (sorted), checked in to the ledger.

        ``available``: boolean mask of the users that can be reached now (deployment; ``None``:
        all). The cohort is the first ``m`` users of the period's order that are available and
        have not taken part in the period; fewer if not enough are left.
        """
        period, _ = tree_position(round_num, self.restart_rounds)
        order = self.order(period)
        ok = self.ledger.eligible(period)
        if available is not None:
            # a short API review of issue 15: a float tensor or a number ended in torch's
            # NotImplementedError, and True was taken as every user
            shape_ok = isinstance(available, torch.Tensor) and available.shape == ok.shape
            if not (shape_ok and available.dtype == torch.bool):
                raise ValueError(
                    f"available must be a bool tensor with one entry per user ({ok.numel()}), "
                    f"got {shown(available)}"
                )
            ok = ok & available.to(ok.device)
        chosen = order[ok[order]][: self.cohort_size]
        # forty-eighth review of issue 15 (memory 3): iterating the tensor made a tensor a user
        # (698 bytes each; a cohort of 10**7 ended in std::bad_alloc under a 4 GB limit)
        users = sorted(chosen.tolist())
        self.ledger.check_in(period, users)
        return users

    def state_dict(self) -> dict[str, Any]:
        """The participation ledger (the order is regenerated, or redrawn in secure mode)."""
        return self.ledger.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.ledger.load_state_dict(state)
