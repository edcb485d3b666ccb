"""Per-strategy option blocks: each strategy's own knobs, their defaults and valid values.

A strategy's options live in one frozen dataclass, its *block*; each field declares its default
and its rule (:func:`real`, :func:`integer`, :func:`flag`, :func:`choice`), and the block
validates itself on construction. :data:`BLOCKS` maps every strategy name to its block. The
settings every strategy shares (sampling, privacy, server learning rate, local training) are the
fields of :class:`~fedprivopt.strategies.config.StrategyConfig`, declared with the same rules.

Adding an option to a strategy is one field in its block (and the line of the algorithm that
uses it): presets, ``--set``, compare grids, checkpoints, the ledger and the Flower run config
all read the keys from here. Keys are the kebab-case forms of the field names, as in presets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fedprivopt.core.checks import check_bool, check_int, check_real
from fedprivopt.core.text import shown
from fedprivopt.privacy.clip import MIN_CLIP_NORM

__all__ = [
    "BLOCKS",
    "FLOAT32_MAX",
    "ADADPOptions",
    "AdamBCOptions",
    "AdamOptions",
    "DP2Options",
    "MomentOptions",
    "MomentumOptions",
    "Options",
    "Rule",
    "apply_rules",
    "choice",
    "flag",
    "integer",
    "key_of",
    "real",
    "rules_of",
]

#: ``torch.finfo(torch.float32).max``: the bound of settings held in (or stepping) float32
#: weights, as every task's model is.
FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class Rule:
    """What values a setting accepts (``optional``: ``None`` too, meaning "derive it")."""

    kind: str  # "real", "int", "bool" or "choice"
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    optional: bool = False

    def check(self, key: str, value: Any) -> Any:
        """``value`` normalized (ints of a real setting become floats), or ``ValueError``."""
        if value is None and self.optional:
            return None
        if self.kind == "real":
            return check_real(
                key,
                value,
                low=self.low,
                high=self.high,
                low_open=self.low_open,
                high_open=self.high_open,
            )
        if self.kind == "int":
            high = None if math.isinf(self.high) else int(self.high)
            return check_int(key, value, int(self.low), high)
        if self.kind == "bool":
            return check_bool(key, value)
        # forty-fourth review of issue 15 (api 3): a str subclass was kept as the setting, so
        # one whose == says yes to every string ran another setting than the one it names
        # (sampling 'fixed' reported while a Poisson sampler drew, 'dp-fedavg' run without
        # noise); the setting is the plain string of its characters
        plain = str.__str__(value) if isinstance(value, str) else value
        if type(plain) is not str or plain not in self.choices:
            raise ValueError(f"{key} must be one of {', '.join(self.choices)}, got {shown(value)}")
        return plain


def real(
    default: float | None,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
) -> Any:
    """A real-valued setting in the interval (``optional``: ``None`` allowed)."""
    rule = Rule("real", low, high, low_open, high_open, optional=optional)
    return field(default=default, metadata={"rule": rule})


def integer(default: int, low: int, high: int | None = None) -> Any:
    """An integer setting in ``[low, high]``."""
    rule = Rule("int", low, math.inf if high is None else high)
    return field(default=default, metadata={"rule": rule})


def flag(default: bool) -> Any:
    """A true/false setting."""
    return field(default=default, metadata={"rule": Rule("bool")})


def choice(default: str, choices: tuple[str, ...]) -> Any:
    """A setting that is one of ``choices``."""
    return field(default=default, metadata={"rule": Rule("choice", choices=tuple(choices))})


def key_of(name: str) -> str:
    """The kebab-case key of a field name."""
    return name.replace("_", "-")


def rules_of(cls: Any) -> dict[str, Rule]:
    """Field name → :class:`Rule` of every ruled field of the dataclass (or instance) ``cls``."""
    return {f.name: f.metadata["rule"] for f in fields(cls) if "rule" in f.metadata}


def apply_rules(obj: Any) -> None:
    """Check every ruled field of the dataclass ``obj`` and store its normalized value."""
    for name, rule in rules_of(obj).items():
        object.__setattr__(obj, name, rule.check(key_of(name), getattr(obj, name)))


@dataclass(frozen=True)
class Options:
    """Base of the blocks: validated on construction, read from and written to kebab-case keys."""

    def __post_init__(self) -> None:
        apply_rules(self)

    @classmethod
    def keys(cls) -> frozenset[str]:
        """The block's keys (kebab-case)."""
        return frozenset(key_of(f.name) for f in fields(cls))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Options:
        """The block from kebab-case (or snake_case) keys, all of them the block's own.

        Raises
        ------
        ValueError
            For anything but a mapping, and naming a key that is not the block's (thirty-seventh
            review of issue 15: ``MomentumOptions.from_mapping({"beta1": 0.9})`` raised the
            constructor's ``TypeError``, ``from_mapping(None)`` an ``AttributeError``).
        """
        if not isinstance(data, Mapping):
            raise ValueError(
                f"{cls.__name__} must be built from a mapping of keys, got {shown(data)}"
            )
        own = {f.name for f in fields(cls)}
        kwargs = {}
        for raw, value in data.items():
            name = str(raw).replace("-", "_")
            if name not in own:
                keys = ", ".join(sorted(cls.keys())) or "none"
                raise ValueError(f"unknown key {shown(raw)} for {cls.__name__} (its keys: {keys})")
            kwargs[name] = value
        return cls(**kwargs)

    def to_mapping(self) -> dict[str, Any]:
        """Kebab-case mapping of the block (``None`` values left out)."""
        return {
            key_of(f.name): getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) is not None
        }


@dataclass(frozen=True)
class MomentumOptions(Options):
    """DP-FedAvg, AdaDPS and FedAvg: momentum SGD on the (noised) mean at ``server-learning-rate``.

    Attributes
    ----------
    server_momentum : float
        Heavy-ball momentum ``β`` in ``[0, 1)``.
    max_noise_step : float or None
        κ in ``(0, inf)``: the server rate of a round is lowered to ``κ(1 - β)/√Φ_t`` when
        ``server-learning-rate · √Φ_t/(1 - β)``, the move one round's noise makes in a
        coordinate over the momentum's steps, exceeds it (``√Φ_t = σC_t/m̄``, the accounted noise
        std of a coordinate of Δ̃; :func:`~fedprivopt.optim.momentum_sgd`). In distributed-noise
        mode Δ̃'s noise also grows with the number of accepted shares, which the bound does not
        see: that count is data-dependent and no optimizer reads it. ``None`` (the default): no
        bound. Presets set it where it was measured (``simulations/adadps-paper.toml``).
    """

    server_momentum: float = real(0.0, 0, 1, high_open=True)
    max_noise_step: float | None = real(None, 0, math.inf, low_open=True, optional=True)


@dataclass(frozen=True)
class MomentOptions(Options):
    """Adam's moment decays ``beta1``, ``beta2`` in ``[0, 1)``: the base of the Adam blocks."""

    beta1: float = real(0.9, 0, 1, high_open=True)
    beta2: float = real(0.99, 0, 1, high_open=True)


@dataclass(frozen=True)
class AdamOptions(MomentOptions):
    """DP-FedAdam and FedAdam: Adam on the (noised) mean; ``server-learning-rate`` is its rate.

    Attributes
    ----------
    tau : float or None
        Adam's ``τ`` (added to ``√v̂``), ``> 0``. ``None`` (default): follows the noise,
        ``τ_t = σC_t/m̄`` (``√Φ_t``, the per-coordinate noise std of the round's Δ̃; 1e-3 in
        a non-private run, and with ``adam-flavor = "flower"``, Flower's default). A fixed τ
        is right at one σ only: on ``simulations/adadps-paper.toml`` (tuning seeds 10-12)
        τ = 0.033 led at σ 0.3 (0.374 against 0.345 at 0.1) and τ = 0.1 at σ 1.5 (0.291
        against 0.284); ``σC/m̄`` is 0.03 and 0.15 there (``docs/EXPERIMENTS.md``).
    bias_correction : bool
        Whether the moments are bias-corrected (``adam-flavor = "standard"`` only: Flower's
        ``FedAdam`` always corrects, so ``false`` with ``"flower"`` is refused).
    adam_flavor : {"standard", "flower"}
        ``"flower"`` reproduces Flower's ``FedAdam`` exactly (τ added to the uncorrected √v and
        the bias-correction exponent ``round + 1``); ``"standard"`` is Reddi et al.
    """

    tau: float | None = real(None, 0, math.inf, low_open=True, optional=True)
    bias_correction: bool = flag(True)
    adam_flavor: str = choice("standard", ("standard", "flower"))

    def __post_init__(self) -> None:
        super().__post_init__()
        # Eighteenth review of issue 15, finding 2: the flower flavor ignored bias-correction =
        # false (a tuning grid over it released "best (bias-correction=True)" of identical runs).
        if self.adam_flavor == "flower" and not self.bias_correction:
            raise ValueError(
                "bias-correction applies only with adam-flavor 'standard' (Flower's FedAdam "
                "always corrects); with adam-flavor 'flower' it must be unset or its default "
                "true, got false"
            )


@dataclass(frozen=True)
class AdamBCOptions(MomentOptions):
    """DP-AdamBC: Adam with the known noise variance ``Φ`` of Δ̃ removed from its second moment.

    Attributes
    ----------
    gamma : float or None
        The floor ``γ′`` of ``v̂ - Φ``. ``None`` (default): ``Φ = (σC/m̄)²`` itself, followed
        round by round when the noise moves (adaptive clipping), so a
        coordinate whose corrected moment is below the noise level takes Adam's pure-noise step
        ``m̂/√Φ``. The old default 1e-8 let such coordinates step by ``m̂/10⁻⁴``: on
        ``simulations/adadps-paper.toml`` (Φ = 9e-4, 3 seeds) accuracy 0.004, eval loss 1371,
        against a tie with DP-FedAdam at ``γ′ = Φ`` (``docs/EXPERIMENTS.md``).
    """

    gamma: float | None = real(None, 0, math.inf, low_open=True, optional=True)


@dataclass(frozen=True)
class DP2Options(Options):
    """DP2: SGD rounds (at ``server-learning-rate``) build a delayed preconditioner ``P = √v + ε``.

    Attributes
    ----------
    dp2_s1, dp2_s2 : int
        SGD and adaptive rounds per cycle, ``>= 1``.
    dp2_beta : float
        Decay of the EMA ``v`` of the noised means, in ``[0, 1)``.
    dp2_epsilon : float
        ``ε`` of ``P = √v + ε``, in ``(0, FLOAT32_MAX]`` (``P`` is held in the model's
        float32; thirty-third review of issue 15: ``1e300`` was refused only when the
        optimizer was built, as ``epsilon must be at most 3.40282e+38 ...``, a name that reads
        as the privacy budget's).
    dp2_learning_rate : float
        Server learning rate of the adaptive rounds, ``> 0``.
    clip_norm_adaptive : float or None
        Clip norm of the adaptive rounds (``None``: ``clip-norm``).
    subtract_noise_variance : bool
        Whether the known noise variance is subtracted from ``v``.
    dp2_scale_by_preconditioner : bool
        Divide ``dp2``'s adaptive step by the mean of ``P`` (not in the paper;
        :func:`fedprivopt.optim.dp2`): every client's preconditioned update is clipped, which
        drops the ``1/P`` scale, so at a fixed adaptive rate the adaptive rounds' noise step
        grows with σ. Off by default (the paper's step); ``dp2-noise-first`` ignores it (its
        step already divides by ``P``).
    max_noise_step : float or None
        κ in ``(0, inf)``: a round whose step is a rate times Δ̃ (SGD rounds, and ``dp2``'s
        adaptive rounds) takes at most ``κ/√Φ_t`` as its rate, and a ``dp2-noise-first``
        adaptive round at most ``κ/√Φ_t`` in each coordinate (its rate ``η/P_i`` differs by
        coordinate), so its step's accounted noise per coordinate is at most κ
        (:func:`fedprivopt.optim.dp2`; as for :class:`MomentumOptions`, distributed noise's
        accepted shares are not seen). ``None`` (the default): no bound.
    """

    dp2_s1: int = integer(5, 1)
    dp2_s2: int = integer(5, 1)
    dp2_beta: float = real(0.9, 0, 1, high_open=True)
    dp2_epsilon: float = real(1e-3, 0, FLOAT32_MAX, low_open=True)
    dp2_learning_rate: float = real(0.1, 0, math.inf, low_open=True)
    clip_norm_adaptive: float | None = real(None, MIN_CLIP_NORM, math.inf, optional=True)
    subtract_noise_variance: bool = flag(False)
    dp2_scale_by_preconditioner: bool = flag(False)
    max_noise_step: float | None = real(None, 0, math.inf, low_open=True, optional=True)


@dataclass(frozen=True)
class ADADPOptions(Options):
    """ADADP: two cohorts a round; the server rate (``server-learning-rate`` at the start) adapts.

    The rule is ``η ← η·clip(s·(τ/err)^p, α_min, α_max)`` (:class:`fedprivopt.optim.
    ADADPController`).

    Attributes
    ----------
    adadp_tolerance : float or None
        ``τ``. ``None`` (default): calibrated to the noise,
        ``τ = 1.5·η₀·(σC/m̄)·√(d_eff/2)`` every round, ``d_eff = Σ 1/max(1, w₁ᵢ²)`` over
        the round's full-step point (:func:`fedprivopt.optim.noise_calibrated_tolerance`). A
        fixed τ = 0.1 rejected every step on ``simulations/adadps-paper.toml`` (accuracy 0.003).
    adadp_alpha_min, adadp_alpha_max : float
        Bounds of the rate's factor per round, in ``(0, 1]`` and ``[1, inf)``.
    adadp_safety : float
        ``s`` in ``(0, 1]``. 0.9 keeps the settled error below ``τ``: on the toy preset 19 of
        20 rounds were accepted at 0.9, 12 at 1 (the authors' rule; ``docs/EXPERIMENTS.md``).
    adadp_error_exponent : float
        ``p`` in ``(0, 1]``: ½ (default) is the authors' rule (an SGD step's local error is
        ``O(η²)``), 1 the linear rule ``η·clip(s·τ/err, …)``.
    max_noise_step : float or None
        κ in ``(0, inf)``: the initial rate η₀, and with it the calibrated tolerance, is
        lowered to ``κ/(σC/m̄)`` where ``server-learning-rate·σC/m̄``, the noise a step adds to a
        coordinate, exceeds it. ADADP's rate is its error control's, so the bound is on where it
        starts and on the scale it settles at (about 1.5·η₀), not a cap on every round as for
        :class:`MomentumOptions`. ``None`` (the default): no bound.
    """

    adadp_tolerance: float | None = real(None, 0, math.inf, low_open=True, optional=True)
    adadp_alpha_min: float = real(0.9, 0, 1, low_open=True)
    adadp_alpha_max: float = real(1.1, 1, math.inf)
    adadp_safety: float = real(0.9, 0, 1, low_open=True)
    adadp_error_exponent: float = real(0.5, 0, 1, low_open=True)
    max_noise_step: float | None = real(None, 0, math.inf, low_open=True, optional=True)


#: The parameter block of every strategy; the order is that of ``compare``'s default grid.
BLOCKS: dict[str, type[Options]] = {
    "dp-fedavg": MomentumOptions,
    "dp-fedadam": AdamOptions,
    "dp-fedadam-bc": AdamBCOptions,
    "adadps": MomentumOptions,
    "dp2": DP2Options,
    "dp2-noise-first": DP2Options,
    "dp-fedavg-adadp": ADADPOptions,
    "fedavg": MomentumOptions,
    "fedadam": AdamOptions,
}
