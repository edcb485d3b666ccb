"""Hyperparameters of a federated run, validated once.

:class:`StrategyConfig` holds what every strategy shares (sampling, privacy, the server learning
rate, local training) and, in :attr:`StrategyConfig.options`, the strategy's own parameter block
(:mod:`fedprivopt.strategies.options`). Its keys are the kebab-case keys of presets and of
Flower's run config; :meth:`StrategyConfig.from_mapping` reads either form, routes each key to
the shared fields or to the strategy's block, and names the key in every error.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fedprivopt.core.local import MAX_EPOCHS
from fedprivopt.core.text import shown
from fedprivopt.privacy.accounting_state import ACCOUNTANTS, MAX_STATE_NOISE_MULTIPLIER
from fedprivopt.privacy.adaptive_clip import default_count_stddev, update_noise_multiplier
from fedprivopt.privacy.aggregate import MAX_SUM_NOISE_STD, NOISE_MODES
from fedprivopt.privacy.clip import MIN_CLIP_NORM
from fedprivopt.privacy.events import SAMPLING_KINDS
from fedprivopt.privacy.sampling import MAX_POPULATION
from fedprivopt.privacy.tree import NOISE_MECHANISMS
from fedprivopt.strategies.options import (
    BLOCKS,
    FLOAT32_MAX,
    Options,
    Rule,
    apply_rules,
    choice,
    flag,
    integer,
    key_of,
    real,
    rules_of,
)

__all__ = ["MAX_COHORT", "MAX_SUM_NOISE_STD", "NON_PRIVATE", "STRATEGIES", "StrategyConfig"]

STRATEGIES = tuple(BLOCKS)
NON_PRIVATE = ("fedavg", "fedadam")

#: Upper bounds of integer settings, from memory: a run keeps every round's metrics row and
#: ledger entry in memory (about 2 KB a round, measured on the toy preset), so 10**6 rounds hold
#: about 2 GB; ``--rounds 10**14`` used to be accepted and grow until killed. ``population`` is
#: bounded by the sampler, which draws one value per user each round
#: (:data:`fedprivopt.privacy.sampling.MAX_POPULATION` = 10**8, about 0.9 GB), and
#: ``local_epochs`` by the one permutation per epoch a client holds
#: (:data:`fedprivopt.core.local.MAX_EPOCHS` = 10,000).
MAX_ROUNDS = 1_000_000
#: Upper bound of ``clients_per_round``: a round holds its cohort as user ids, a list and a set
#: of them (about 230 bytes a sampled user through a toy round, measured at 2·10**4 and 10**5), so
#: 10**7 take about 2.3 GB; a cohort of 10**8 (the population's bound) ended in ``std::bad_alloc``
#: under a 4 GB address-space limit (forty-eighth review of issue 15, memory 2).
MAX_COHORT = 10_000_000
#: The largest integer setting a run's ``config.toml`` holds (TOML integers are 64-bit).
INT64_MAX = 2**63 - 1
_INF = float("inf")
_BLOCK_RULES = {
    key_of(name): rule for block in BLOCKS.values() for name, rule in rules_of(block).items()
}
_EVERY_BLOCK_KEY = frozenset(_BLOCK_RULES)


@dataclass(frozen=True)
class StrategyConfig:
    """Validated hyperparameters of one run (see ``docs/DESIGN.md`` for their meaning).

    Parameters
    ----------
    strategy : str
        One of :data:`STRATEGIES`.
    population : int
        Number of users ``N``, in ``[1, 10**8]`` (the sampler draws one value per user a round).
    clients_per_round : float
        Expected cohort size ``m̄`` in ``(0, 10**7]`` (a round holds its cohort's ids);
        ``q = m̄/N``. An integer ``m <= N`` for fixed sampling.
    num_server_rounds : int
        Rounds to run, in ``[1, 10**6]`` (a privacy budget may stop the run earlier).
    noise_multiplier, clip_norm : float
        ``σ`` (noise std on the clipped sum over ``C``) and ``C``. Ignored by the non-private
        baselines ``fedavg`` and ``fedadam``.
    sampling : {"poisson", "fixed"}
    noise_mode : {"server", "distributed"}
    min_shares : int
        ``m_min`` for distributed noise, in ``[0, population]``; 0 means the
        ``min_shares_quantile`` quantile of the cohort size: of ``Binomial(N, q)`` under
        Poisson sampling, ``m`` under fixed sampling. With server noise both keys
        must be at their defaults (a value that would be ignored is refused).
    delta, target_epsilon : float
        δ of the reported ε; optional budget ε (``None``: no budget).
    accountant : {"rdp", "pld", "prv"}
    seed : int
        Root seed of every random stream; ignored in ``secure`` mode (OS entropy).
    server_learning_rate : float
        Server step ``η_s``: SGD's rate, Adam's rate for the Adam strategies, DP2's rate in its
        SGD rounds, ADADP's initial rate.
    local_learning_rate, local_epochs, batch_size, max_examples
        Client training (``max_examples = 0``: all of a user's examples); ``local_epochs`` is in
        ``[1, 10000]`` (a client holds one permutation of its examples per epoch).
    ema_decay : float
        ``β`` of the exponential moving average of the released iterates that a run evaluates
        and reports (``0``: the last iterate). Post-processing of released models: it costs no
        privacy (see :meth:`fedprivopt.strategies.core.ServerAlgorithm.output_params`).
    adaptive_clipping : bool
        Quantile-based adaptive clipping (Andrew et al. 2021, :mod:`fedprivopt.privacy.
        adaptive_clip`) for a DP strategy: ``clip_norm`` is then the initial ``C``,
        ``clip_quantile`` the target ``γ`` in ``(0, 1)``, ``clip_learning_rate`` ``η_C >
        0`` and ``clip_count_stddev`` the noise ``σ_b`` on the count (``None``: ``m̄/20``), which
        must exceed ``noise_multiplier/2``. Ignored by the non-private baselines. With
        ``adaptive_clipping`` false, those three must be at their defaults (a value that would
        be ignored is refused, naming the key).
    noise_mechanism : {"gaussian", "tree"}
        ``"tree"``: tree aggregation (DP-FTRL, :mod:`fedprivopt.privacy.tree`) instead of a fresh
        Gaussian on every round's sum. No sampling then (``sampling`` is ignored): each restart
        period shuffles the users and a round takes the next ``clients_per_round`` (an integer)
        of them, each user at most once a period. Needs the ``rdp`` accountant, server noise,
        a fixed clip norm and one cohort a round (not ``dp-fedavg-adadp``).
    tree_restart_rounds : int
        Rounds per restart period ``T`` under tree aggregation; ``0`` (default):
        ``population // clients_per_round`` (one pass over the users). ``T·m <= N``.
    options : Options
        The strategy's own parameter block (:data:`fedprivopt.strategies.options.BLOCKS`; ``None``
        when constructing: the block's defaults).
    unused : tuple of str
        Keys given to :meth:`from_mapping` that belong to other strategies' blocks (a preset
        shared by ``compare`` sets knobs of several strategies); not part of the config.
    """

    strategy: str = choice("dp-fedavg", STRATEGIES)
    population: int = integer(100, 1, MAX_POPULATION)
    clients_per_round: float = real(10.0, 0, MAX_COHORT, low_open=True)
    num_server_rounds: int = integer(10, 1, MAX_ROUNDS)
    # at most what a checkpoint's accountant state may hold (a larger σ could not be resumed)
    noise_multiplier: float = real(1.0, 0, MAX_STATE_NOISE_MULTIPLIER)
    clip_norm: float = real(1.0, MIN_CLIP_NORM, _INF)  # tinier C: subnormal clipping
    sampling: str = choice("poisson", SAMPLING_KINDS)
    noise_mode: str = choice("server", NOISE_MODES)
    min_shares: int = integer(0, 0)
    min_shares_quantile: float = real(0.01, 0, 1, low_open=True, high_open=True)
    delta: float = real(1e-5, 0, 1, low_open=True, high_open=True)
    target_epsilon: float | None = real(None, 0, _INF, low_open=True, optional=True)
    accountant: str = choice("rdp", ACCOUNTANTS)
    seed: int = integer(0, 0)
    secure: bool = flag(False)
    server_learning_rate: float = real(1.0, 0, _INF, low_open=True)
    # at most float32's largest value: clients step float32 weights by it
    local_learning_rate: float = real(0.1, 0, FLOAT32_MAX, low_open=True)
    local_epochs: int = integer(1, 1, MAX_EPOCHS)
    batch_size: int = integer(32, 1)
    max_examples: int = integer(0, 0)
    ema_decay: float = real(0.0, 0, 1, high_open=True)
    adaptive_clipping: bool = flag(False)
    clip_quantile: float = real(0.5, 0, 1, low_open=True, high_open=True)
    clip_learning_rate: float = real(0.2, 0, _INF, low_open=True)
    # at most half the largest noise multiplier an accountant state holds: the count's
    # multiplier 2σ_b is in every ledger event (twenty-third review of issue 15: above it a run
    # could not be resumed, its ledger called damaged; from ~1.4e154 σ_b² overflowed in round 1)
    clip_count_stddev: float | None = real(
        None, 0, MAX_STATE_NOISE_MULTIPLIER / 2, low_open=True, optional=True
    )
    noise_mechanism: str = choice("gaussian", NOISE_MECHANISMS)
    tree_restart_rounds: int = integer(0, 0, MAX_ROUNDS)
    options: Options | None = None
    unused: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        apply_rules(self)
        block = BLOCKS[self.strategy]
        if self.options is None:
            object.__setattr__(self, "options", block())
        elif type(self.options) is not block:
            raise ValueError(
                f"options of strategy {shown(self.strategy)} must be a {block.__name__}, "
                f"got {type(self.options).__name__}"
            )
        self._check_64_bits()
        if self.clients_per_round > self.population:
            raise ValueError(
                f"clients-per-round must be in (0, population={self.population}], "
                f"got {self.clients_per_round}"
            )
        if self.sampling == "fixed" and float(self.clients_per_round) != int(
            self.clients_per_round
        ):
            raise ValueError("clients-per-round must be an integer with sampling 'fixed'")
        if self.private and self.noise_multiplier == 0:
            raise ValueError(
                f"noise-multiplier must be > 0 for strategy {shown(self.strategy)} "
                "(use 'fedavg' or 'fedadam' for non-private training)"
            )
        if self.tree:
            self._check_tree()
        elif self.tree_restart_rounds and self.noise_mechanism != "tree":
            raise ValueError(
                "tree-restart-rounds applies only with noise-mechanism 'tree', got "
                f"{self.tree_restart_rounds} with noise-mechanism {shown(self.noise_mechanism)}"
            )
        if not self.adaptive_clipping:
            self._check_adaptive_keys()
        self._check_min_shares()
        if self.adaptive:
            try:
                update_noise_multiplier(self.noise_multiplier, self.count_stddev)
            except ValueError as exc:
                if self.clip_count_stddev is not None:
                    raise
                raise ValueError(
                    f"{exc} (its default clients-per-round/20); set clip-count-stddev"
                ) from None
        self._check_noise_std()

    def _check_64_bits(self) -> None:
        """Refuse an integer setting that a run's ``config.toml`` (TOML: 64-bit) cannot hold.

        Forty-fifth review of issue 15 (input 2): ``StrategyConfig(seed=2**63)`` (also
        ``batch_size``, ``max_examples``, ``min_shares`` and ``dp2-s1``/``dp2-s2`` in the
        options, which have no upper bound) ran through ``simulate``, and its ``config.toml``
        was refused by ``--resume`` and ``compare`` for ever (``integers must fit in 64 bits``);
        ``--set`` and presets are refused so when the configuration is read.
        """
        for holder in (self, self.options):
            for name in rules_of(holder):
                value = getattr(holder, name)
                if isinstance(value, int) and not isinstance(value, bool) and value > INT64_MAX:
                    raise ValueError(
                        f"{key_of(name)} must be an integer of at most {INT64_MAX} (64 bits, as "
                        f"a run's config.toml holds it), got {value}"
                    )

    def _check_tree(self) -> None:
        """Refuse, naming the key, what tree aggregation cannot do."""
        why = "with noise-mechanism 'tree'"
        m = self.clients_per_round
        if float(m) != int(m):
            raise ValueError(
                f"clients-per-round must be an integer {why} (a fixed cohort a round), got {m}"
            )
        most = self.population // int(m)
        if self.tree_restart_rounds > most:
            raise ValueError(
                f"tree-restart-rounds must be in [0, population // clients-per-round = {most}] "
                f"{why} (each user joins at most one round of a period; 0: {most}), got "
                f"{self.tree_restart_rounds}"
            )
        if self.sampling != "poisson":
            # fourteenth review of issue 15: sampling = "fixed" was accepted and ignored (the
            # tree draws its cohorts from a shuffle per period; same epsilon, same cohorts)
            raise ValueError(
                f"sampling applies only with noise-mechanism 'gaussian' ({why} the cohorts are "
                f"the next clients-per-round users of a shuffle per restart period): it must be "
                f"unset or its default 'poisson', got {shown(self.sampling)}"
            )
        if self.noise_mode != "server":
            raise ValueError(
                f"noise-mode must be 'server' {why}: the tree's nodes are noised partial sums "
                "over several rounds, which per-client shares of one round cannot form"
            )
        if self.adaptive_clipping:
            raise ValueError(
                f"adaptive-clipping must be false {why}: its noised count would be a second "
                "release per round outside the tree (not accounted)"
            )
        if self.accountant != "rdp":
            raise ValueError(
                f"accountant must be 'rdp' {why} (dp-accounting accounts "
                f"SingleEpochTreeAggregationDpEvent with RDP only), got {shown(self.accountant)}"
            )
        adaptive_c = getattr(self.options, "clip_norm_adaptive", None)
        if adaptive_c is not None and adaptive_c != self.clip_norm:
            raise ValueError(
                f"clip-norm-adaptive must be unset (or clip-norm) {why}: a tree node sums rounds "
                "of both DP2 phases, and its noise is sized for one clip norm"
            )
        if self.strategy == "dp-fedavg-adadp":
            raise ValueError(
                f"strategy 'dp-fedavg-adadp' cannot run {why}: it releases two cohorts' sums a "
                "round"
            )

    def _check_adaptive_keys(self) -> None:
        """Refuse an adaptive-clipping key set away from its default without adaptive clipping.

        Eleventh review of issue 15, finding 3: ``clip-quantile``, ``clip-learning-rate`` and
        ``clip-count-stddev`` were silently ignored (a tuning grid over them labelled trials by
        a key that changed nothing). Their defaults stay accepted, as a stored configuration
        may carry them.
        """
        for name in _ADAPTIVE_KEYS:
            value = getattr(self, name)
            default = _DEFAULTS[name]
            if value != default:
                key = key_of(name)
                allowed = "unset" if default is None else f"unset or its default {default:g}"
                raise ValueError(
                    f"{key} applies only with adaptive-clipping = true; with adaptive-clipping "
                    f"false it must be {allowed}, got {value:g} (set adaptive-clipping = true, "
                    f"or remove {key})"
                )

    def _check_min_shares(self) -> None:
        """``min-shares`` at most the population, and both share keys only with distributed noise.

        Twelfth review of issue 15: ``min-shares = 10**11`` among 12 users was accepted, a
        guarantee against the server that needs more honest shares than there are users (the
        server tops up every round, so the shares protect nothing); and both keys were silently
        ignored with server noise.
        """
        if self.noise_mode != "distributed":
            for name, default in (("min_shares", 0), ("min_shares_quantile", 0.01)):
                value = getattr(self, name)
                if value != default:
                    raise ValueError(
                        f"{key_of(name)} applies only with noise-mode 'distributed'; with "
                        f"noise-mode {shown(self.noise_mode)} it must be unset or its default "
                        f"{default:g}, got {shown(value)}"
                    )
        elif self.min_shares > self.population:
            raise ValueError(
                f"min-shares must be in [0, population = {self.population}] (0: the "
                "min-shares-quantile quantile of the cohort size): the guarantee against the "
                f"server needs min-shares honest shares in a round, got {self.min_shares}"
            )

    def _check_noise_std(self) -> None:
        """Refuse a clip norm whose noise std exceeds :data:`MAX_SUM_NOISE_STD` (naming it).

        Sixth review of issue 15: ``clients-per-round=1e-200`` or ``clip-norm=1e300`` overflowed
        in the first round; eleventh review, finding 1: so did ``σ C`` itself when only
        ``(σC/m̄)²`` was checked, and ``σ_Δ C`` with adaptive clipping (``σ_Δ > σ``).
        """
        limit = self.max_clip_norm
        sigma = "sigma_Delta" if self.adaptive else "noise-multiplier"  # the sum's multiplier
        adaptive_c = getattr(self.options, "clip_norm_adaptive", None)  # DP2's second norm
        for key, c in (("clip-norm", self.clip_norm), ("clip-norm-adaptive", adaptive_c)):
            if c is not None and not c <= limit:
                advice = f"lower {key} or raise clients-per-round ({key} at most {limit:.6g} here)"
                if limit < MIN_CLIP_NORM:
                    # forty-fifth review of issue 15 (input 6): clients-per-round = 1e-310 was
                    # told "clip-norm at most 0 here", below the smallest clip-norm allowed
                    need = self.update_noise_multiplier * c / MAX_SUM_NOISE_STD
                    advice = (
                        f"raise clients-per-round (to at least {need:.6g} for this {key}; no "
                        f"{key} of at least {MIN_CLIP_NORM:g} fits {self.clients_per_round:g})"
                    )
                raise ValueError(
                    f"{sigma} * {key} / min(1, clients-per-round) must be at most "
                    f"{MAX_SUM_NOISE_STD:g} (the noise std of a round's sum and mean; its square, "
                    f"times up to the population, must be a float), got "
                    f"{self.update_noise_multiplier:g} * {c:g} / min(1, {self.clients_per_round:g})"
                    f"; {advice}"
                )

    @property
    def tree(self) -> bool:
        """Whether the run uses tree aggregation (a DP strategy with ``noise-mechanism`` tree)."""
        return self.private and self.noise_mechanism == "tree"

    @property
    def restart_rounds(self) -> int:
        """``T``: ``tree-restart-rounds``, or ``population // clients-per-round`` when 0."""
        return self.tree_restart_rounds or self.population // int(self.clients_per_round)

    @property
    def adaptive(self) -> bool:
        """Whether the run clips adaptively (a DP strategy with ``adaptive-clipping``)."""
        return self.private and self.adaptive_clipping

    @property
    def count_stddev(self) -> float:
        """``σ_b``: ``clip-count-stddev``, or ``m̄/20`` when it is not set."""
        if self.clip_count_stddev is not None:
            return self.clip_count_stddev
        return default_count_stddev(self.clients_per_round)

    @property
    def update_noise_multiplier(self) -> float:
        """Noise multiplier of the sum: ``σ_Δ`` with adaptive clipping, else ``σ``."""
        if not self.adaptive:
            return self.noise_multiplier
        return update_noise_multiplier(self.noise_multiplier, self.count_stddev)

    @property
    def max_clip_norm(self) -> float:
        """Largest clip norm whose noise std stays within :data:`MAX_SUM_NOISE_STD`.

        ``MAX_SUM_NOISE_STD / (σ_Δ max(1, 1/m̄))`` (``σ_Δ``: :attr:`update_noise_multiplier`),
        at most the largest float; the largest float when not private. The adaptive clip norm
        is kept at most this (:class:`~fedprivopt.strategies.clipping.AdaptiveClipping`).
        """
        if not self.private or self.noise_multiplier == 0:
            return sys.float_info.max
        scale = self.update_noise_multiplier * max(1.0, 1.0 / self.clients_per_round)
        return min(MAX_SUM_NOISE_STD / scale, sys.float_info.max)

    @property
    def private(self) -> bool:
        """Whether the strategy is a DP strategy."""
        return self.strategy not in NON_PRIVATE

    @property
    def sample_rate(self) -> float:
        """``q = m̄ / N``."""
        return self.clients_per_round / self.population

    @classmethod
    def shared_keys(cls) -> frozenset[str]:
        """Keys every strategy reads (kebab-case)."""
        return frozenset(key_of(f.name) for f in fields(cls) if f.name not in _NOT_KEYS)

    @classmethod
    def option_keys(cls) -> frozenset[str]:
        """The keys of every strategy's option block."""
        return _EVERY_BLOCK_KEY

    @classmethod
    def keys(cls) -> frozenset[str]:
        """Every key a strategy config may hold: the shared ones and every block's."""
        return cls.shared_keys() | _EVERY_BLOCK_KEY

    @classmethod
    def rules(cls) -> dict[str, Rule]:
        """The :class:`~fedprivopt.strategies.options.Rule` of every key."""
        return {key_of(name): rule for name, rule in rules_of(cls).items()} | _BLOCK_RULES

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> StrategyConfig:
        """Build from kebab-case (or snake_case) keys.

        Shared keys go to the config, the strategy's own keys to its block; keys of other
        strategies' blocks are set aside in :attr:`unused`; any other key is an error.
        """
        if not isinstance(data, Mapping):  # an AttributeError before (thirty-seventh review)
            raise ValueError(f"a strategy config must be a mapping of keys, got {shown(data)}")
        shared = cls.shared_keys()
        kwargs: dict[str, Any] = {}
        block_kwargs: dict[str, Any] = {}
        unused: list[str] = []
        strategy = data.get("strategy", "dp-fedavg")
        if not isinstance(strategy, str) or strategy not in BLOCKS:
            raise ValueError(
                f"strategy must be one of {', '.join(STRATEGIES)}, got {shown(strategy)}"
            )
        own = BLOCKS[strategy].keys()
        for raw, value in data.items():
            key = key_of(str(raw))
            if key in shared:
                kwargs[key.replace("-", "_")] = value
            elif key in own:
                block_kwargs[key] = value
            elif key in _EVERY_BLOCK_KEY:
                _BLOCK_RULES[key].check(key, value)  # a bad value is an error even if unused
                unused.append(key)
            else:
                raise ValueError(f"unknown key {shown(raw)}")
        options = BLOCKS[strategy].from_mapping(block_kwargs)
        return cls(**kwargs, options=options, unused=tuple(sorted(unused)))

    def to_mapping(self) -> dict[str, Any]:
        """Kebab-case mapping of the shared fields and the block (``None`` values left out).

        The adaptive-clipping and tree keys are left out at their defaults, so that the
        configuration (and the ledger header) of a run without them is what it was before them.
        """
        out = {
            key_of(f.name): getattr(self, f.name)
            for f in fields(self)
            if f.name not in _NOT_KEYS
            and getattr(self, f.name) is not None
            and not (f.name in _OMITTED_AT_DEFAULT and getattr(self, f.name) == f.default)
        }
        return out | self.options.to_mapping()


_NOT_KEYS = ("options", "unused")
#: Keys that only adaptive clipping reads (refused away from their defaults without it).
_ADAPTIVE_KEYS = ("clip_quantile", "clip_learning_rate", "clip_count_stddev")
_DEFAULTS = {f.name: f.default for f in fields(StrategyConfig) if f.name in _ADAPTIVE_KEYS}
_OMITTED_AT_DEFAULT = (
    "adaptive_clipping",
    "clip_quantile",
    "clip_learning_rate",
    "noise_mechanism",
    "tree_restart_rounds",
)
