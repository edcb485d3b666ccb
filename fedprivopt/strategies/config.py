"""Hyperparameters of a federated run, validated once.

:class:`StrategyConfig` holds everything the server side needs (strategy, sampling, privacy,
server optimizer) and what it broadcasts to clients (local training). Its fields are the
snake_case forms of the kebab-case keys of presets and of Flower's run config;
:meth:`StrategyConfig.from_mapping` reads either form and names the key in every error.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from fedprivopt.core.checks import interval
from fedprivopt.core.local import MAX_EPOCHS
from fedprivopt.privacy.accounting_state import MAX_STATE_NOISE_MULTIPLIER
from fedprivopt.privacy.sampling import MAX_POPULATION

__all__ = ["STRATEGIES", "StrategyConfig"]

STRATEGIES = (
    "dp-fedavg",
    "dp-fedadam",
    "dp-fedadam-bc",
    "adadps",
    "dp2",
    "dp2-noise-first",
    "dp-fedavg-adadp",
    "fedavg",
    "fedadam",
)
NON_PRIVATE = ("fedavg", "fedadam")


# name -> (low, high, low_open, high_open); None in a field's slot means "not a bounded number"
_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "clients_per_round": (0, math.inf, True, True),
    # at most what a checkpoint's accountant state may hold (a larger σ could not be resumed)
    "noise_multiplier": (0, MAX_STATE_NOISE_MULTIPLIER, False, False),
    "clip_norm": (0, math.inf, True, True),
    "delta": (0, 1, True, True),
    "target_epsilon": (0, math.inf, True, True),
    "server_learning_rate": (0, math.inf, True, True),
    "server_momentum": (0, 1, False, True),
    "beta1": (0, 1, False, True),
    "beta2": (0, 1, False, True),
    "tau": (0, math.inf, True, True),
    "gamma": (0, math.inf, True, True),
    "dp2_beta": (0, 1, False, True),
    "dp2_epsilon": (0, math.inf, True, True),
    "dp2_learning_rate": (0, math.inf, True, True),
    "clip_norm_adaptive": (0, math.inf, True, True),
    "adadp_tolerance": (0, math.inf, True, True),
    "adadp_alpha_min": (0, 1, True, False),
    "adadp_alpha_max": (1, math.inf, False, True),
    "adadp_safety": (0, 1, True, False),
    "local_learning_rate": (0, math.inf, True, True),
    "min_shares_quantile": (0, 1, True, True),
    "ema_decay": (0, 1, False, True),
}
_INT_MIN = {
    "population": 1,
    "num_server_rounds": 1,
    "dp2_s1": 1,
    "dp2_s2": 1,
    "local_epochs": 1,
    "batch_size": 1,
    "max_examples": 0,
    "min_shares": 0,
    "seed": 0,
}
#: Upper bounds of integer settings, from memory: a run keeps every round's metrics row and
#: ledger entry in memory (about 2 KB a round, measured on the toy preset), so 10**6 rounds hold
#: about 2 GB; ``--rounds 10**14`` used to be accepted and grow until killed. ``population`` is
#: bounded by the sampler, which draws one value per user each round
#: (:data:`fedprivopt.privacy.sampling.MAX_POPULATION` = 10**8, about 0.9 GB), and
#: ``local_epochs`` by the one permutation per epoch a client holds
#: (:data:`fedprivopt.core.local.MAX_EPOCHS` = 10,000).
MAX_ROUNDS = 1_000_000
_INT_MAX = {
    "num_server_rounds": MAX_ROUNDS,
    "population": MAX_POPULATION,
    "local_epochs": MAX_EPOCHS,
}
_CHOICES = {
    "strategy": STRATEGIES,
    "sampling": ("poisson", "fixed"),
    "noise_mode": ("server", "distributed"),
    "accountant": ("rdp", "pld", "prv"),
    "adam_flavor": ("standard", "flower"),
}


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
        Expected cohort size ``m̄``; ``q = m̄/N``. An integer ``m <= N`` for fixed sampling.
    num_server_rounds : int
        Rounds to run, in ``[1, 10**6]`` (a privacy budget may stop the run earlier).
    noise_multiplier, clip_norm : float
        ``σ`` (noise std on the clipped sum over ``C``) and ``C``. Ignored by the non-private
        baselines ``fedavg`` and ``fedadam``.
    sampling : {"poisson", "fixed"}
    noise_mode : {"server", "distributed"}
    min_shares : int
        ``m_min`` for distributed noise; 0 means the ``min_shares_quantile`` quantile of
        ``Binomial(N, q)``.
    delta, target_epsilon : float
        δ of the reported ε; optional budget ε (``None``: no budget).
    accountant : {"rdp", "pld", "prv"}
    seed : int
        Root seed of every random stream; ignored in ``secure`` mode (OS entropy).
    server_learning_rate, server_momentum : float
        Server step ``η_s`` and momentum ``β`` (dp-fedavg, adadps, fedavg); ``η_s`` is Adam's
        learning rate for the Adam strategies.
    beta1, beta2, tau, bias_correction, gamma : float
        Adam's moments and ``τ``; DP-AdamBC's floor ``γ′`` (``None``: the per-coordinate noise
        variance ``Φ = (σC/m̄)²`` of Δ̃).
    adam_flavor : {"standard", "flower"}
        ``"flower"`` reproduces Flower's ``FedAdam`` exactly (τ added to the uncorrected √v and
        the bias-correction exponent ``round + 1``); ``"standard"`` is Reddi et al.
    dp2_s1, dp2_s2, dp2_beta, dp2_epsilon, dp2_learning_rate, clip_norm_adaptive,
    subtract_noise_variance
        DP2: SGD and adaptive rounds per cycle, EMA decay, ``ε`` of ``P = √v + ε``, adaptive-phase
        server learning rate (SGD rounds use ``server_learning_rate``), adaptive-phase clip norm
        (``None``: ``clip_norm``), whether to subtract the known noise variance from ``v``.
    adadp_tolerance, adadp_alpha_min, adadp_alpha_max, adadp_safety : float
        ADADP's ``τ``, ``α_min``, ``α_max`` and the safety factor ``s`` of its learning-rate
        rule (1: the authors' rule; 0.9 keeps the settled error below ``τ``, see
        :class:`fedprivopt.optim.ADADPController`); ``server_learning_rate`` is the initial ``η``.
        ``adadp_tolerance = None`` calibrates ``τ`` to the noise
        (:func:`fedprivopt.optim.noise_calibrated_tolerance`).
    local_learning_rate, local_epochs, batch_size, max_examples
        Client training (``max_examples = 0``: all of a user's examples); ``local_epochs`` is in
        ``[1, 10000]`` (a client holds one permutation of its examples per epoch).
    ema_decay : float
        ``β`` of the exponential moving average of the released iterates that a run evaluates
        and reports (``0``: the last iterate). Post-processing of released models: it costs no
        privacy (see :meth:`fedprivopt.strategies.core.ServerAlgorithm.output_params`).
    """

    strategy: str = "dp-fedavg"
    population: int = 100
    clients_per_round: float = 10.0
    num_server_rounds: int = 10
    noise_multiplier: float = 1.0
    clip_norm: float = 1.0
    sampling: str = "poisson"
    noise_mode: str = "server"
    min_shares: int = 0
    min_shares_quantile: float = 0.01
    delta: float = 1e-5
    target_epsilon: float | None = None
    accountant: str = "rdp"
    seed: int = 0
    secure: bool = False
    server_learning_rate: float = 1.0
    server_momentum: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    bias_correction: bool = True
    adam_flavor: str = "standard"
    gamma: float | None = None
    dp2_s1: int = 5
    dp2_s2: int = 5
    dp2_beta: float = 0.9
    dp2_epsilon: float = 1e-3
    dp2_learning_rate: float = 0.1
    clip_norm_adaptive: float | None = None
    subtract_noise_variance: bool = False
    adadp_tolerance: float | None = None
    adadp_alpha_min: float = 0.9
    adadp_alpha_max: float = 1.1
    adadp_safety: float = 0.9
    local_learning_rate: float = 0.1
    local_epochs: int = 1
    batch_size: int = 32
    max_examples: int = 0
    ema_decay: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            key = f.name.replace("_", "-")
            value = getattr(self, f.name)
            if f.name in _CHOICES:
                if value not in _CHOICES[f.name]:
                    raise ValueError(
                        f"{key} must be one of {', '.join(_CHOICES[f.name])}, got {value!r}"
                    )
            elif f.name in _INT_MIN:
                top = _INT_MAX.get(f.name)
                if (
                    isinstance(value, bool)
                    or not isinstance(value, int)
                    or value < _INT_MIN[f.name]
                    or (top is not None and value > top)
                ):
                    where = (
                        f">= {_INT_MIN[f.name]}"
                        if top is None
                        else f"in [{_INT_MIN[f.name]}, {top}]"
                    )
                    raise ValueError(f"{key} must be an integer {where}, got {value!r}")
            elif f.name in _RANGES:
                if value is None and f.default is None:
                    continue
                lo, hi, lo_open, hi_open = _RANGES[f.name]
                ok = (
                    isinstance(value, (int, float))
                    and not isinstance(value, bool)
                    and math.isfinite(value)
                    and (value > lo if lo_open else value >= lo)
                    and (value < hi if hi_open else value <= hi)
                )
                if not ok:
                    raise ValueError(
                        f"{key} must be a number in {interval(lo, hi, lo_open, hi_open)}, "
                        f"got {value!r}"
                    )
            elif f.type in ("bool",) and not isinstance(value, bool):
                raise ValueError(f"{key} must be true or false, got {value!r}")
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
                f"noise-multiplier must be > 0 for strategy {self.strategy!r} "
                "(use 'fedavg' or 'fedadam' for non-private training)"
            )

    @property
    def private(self) -> bool:
        """Whether the strategy is a DP strategy."""
        return self.strategy not in NON_PRIVATE

    @property
    def sample_rate(self) -> float:
        """``q = m̄ / N``."""
        return self.clients_per_round / self.population

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> StrategyConfig:
        """Build from a mapping with kebab-case (or snake_case) keys; unknown keys are errors."""
        names = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            name = str(key).replace("-", "_")
            if name not in names:
                raise ValueError(f"unknown key {key!r}")
            kwargs[name] = value
        defaults = {f.name: f.default for f in fields(cls)}
        for name, value in list(kwargs.items()):
            default = defaults[name]
            if (
                isinstance(default, float)
                and isinstance(value, int)
                and not isinstance(value, bool)
            ):
                kwargs[name] = float(value)
        return cls(**kwargs)

    def to_mapping(self) -> dict[str, Any]:
        """Kebab-case mapping of every field (``None`` values left out)."""
        return {
            k.replace("_", "-"): v for k, v in dataclasses.asdict(self).items() if v is not None
        }
