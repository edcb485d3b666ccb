"""The grid of a private tuning (``tune --grid``, ``compare --tune-grid``): keys and values.

``--grid KEY=V1,V2,...`` names a preset key and its values, typed as ``--set`` types them. A grid
may not vary a key of :data:`FORBIDDEN_GRID_KEYS`: one ε of the tuning must hold for every user
of every trial, so the keys that choose which users are private or what the data is are fixed,
as are those set by ``--strategy``, the tuning seed and the accounting (issue 15, tenth review,
finding 1: a grid over ``side-information.users`` made users private in some trials and public
in the released one).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from fedprivopt.core.text import shown, shown_key

__all__ = [
    "FORBIDDEN_GRID_KEYS",
    "MAX_GRID_POINTS",
    "RUN_ONLY_KEYS",
    "TUNABLE_TASK_PARAMS",
    "check_grid_overrides",
    "check_point_effect",
    "empty_table_error",
    "grid_points",
    "keys_set_for",
    "parse_grid",
    "refuse_table_spellings",
    "sets_nothing",
]

_USERS = "it chooses which users are private"
_PUBLIC = f"{_USERS} (public-users side information takes users out of the private population)"
_DATA = "it defines the task's data or users, so the trials would not train and score alike"
_SCORED = "it chooses the evaluation users the selection is scored on"
_RUN_ONLY = ("it changes how a run is executed or recorded, not the model it trains nor its "
             "score, so the trials would differ in their seeds alone")  # fmt: skip
RUN_ONLY_KEYS = ("engine", "eval-every", "checkpoint-every", "client-cpus", "client-gpus",
                 "ray-cpus", "ray-address", "device", "vectorize", "cohort-chunk",
                 "fast-actors", "round-timeout", "tensorboard")  # fmt: skip
"""Preset keys of how a run is executed or recorded: a run's model and score do not depend on
them (the same run seed releases the same models; thirty-fourth review of issue 15, tuning
finding 4: ``tune --grid checkpoint-every=1,2`` released "best trial-001
(checkpoint-every=2)", as the seventeenth review's finding 1 for another strategy's option)."""
FORBIDDEN_GRID_KEYS: Mapping[str, str] = MappingProxyType({
    "strategy": "--strategy sets it",
    "seed": "every trial gets its own seed",
    "delta": "a tuning is accounted at one delta",
    "accountant": "a tuning is accounted with one accountant",
    "population": _USERS,
    "side-information": _PUBLIC,
    "side-information.kind": _PUBLIC,
    "side-information.users": _USERS,
    "secure": "it would mix secure trials with seeded ones, whose noise their run seeds predict",
    "task": _DATA,
    "task-params.num-users": _USERS,
    "task-params.eval-split": _SCORED,
    "task-params.eval-users": _SCORED,
    **dict.fromkeys(RUN_ONLY_KEYS, _RUN_ONLY),
})  # fmt: skip
"""Preset keys a grid may not vary, and why (tenth review of issue 15, finding 1).

Set by ``--strategy`` or the tuning seed, fixed by the accounting, or keys that change which
users are private (the population, public-users side information) or what the data is (the
task; task parameters other than :data:`TUNABLE_TASK_PARAMS`): trials over them would each be
private for other users, so one ε would not cover every user, or be scored on other data.
``secure`` would mix seeded trials in. The keys of :data:`RUN_ONLY_KEYS` change nothing a trial
is selected by.
"""
TUNABLE_TASK_PARAMS = frozenset({"embedding-dim", "hidden-size", "init-bias", "train-bias"})
"""The only task parameters a grid may vary: the built-in tasks' model shape and bias handling.

Every other task parameter, of a built-in task or a user's own, may define the data, the users
or the evaluation (``data-dir``, ``seed``, ``synth-*``, ``num-users``, ``examples-per-user``,
...), so it is refused in a grid (a task the project does not know cannot say which are safe).
"""
MAX_GRID_POINTS = 10_000


def sets_nothing(value: Any) -> bool:
    """Whether ``value`` is a table without a value in it (``{}``, ``{a = {}}``).

    Nineteenth review of issue 15: such a ``--set`` or ``--grid`` value was dropped while the
    configuration was flattened, so ``--set noise-multiplier={}`` ran the preset's σ and
    ``--grid max-noise-step=0.5,{}`` released a "best" trial labelled ``{}`` that ran unbounded.
    """
    return isinstance(value, Mapping) and all(sets_nothing(v) for v in value.values())


def empty_table_error(flag: str, key: str, value: Any) -> str:
    """The one line refusing ``key={}`` (:func:`sets_nothing`) given to ``flag``."""
    return (
        f"argument {flag}: {shown_key(key)}={shown(value)} is a table without a value, which sets "
        "nothing (the preset's value would be used); give a value"
    )


def _same_value(a: Any, b: Any) -> bool:
    """Whether grid values ``a`` and ``b`` are one point: equal, and of one type.

    An integer and a float count as one type (``1`` and ``1.0`` set a key alike); ``true`` is
    not ``1``.

    Twenty-third review of issue 15: ``--grid server-learning-rate=1.0,1`` was accepted (the
    same configuration drawn twice as often as the others) where ``5e-1,0.5`` was refused.
    """
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def parse_grid(texts: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """``--grid KEY=V1,V2,...`` flags as ``{key: values}`` (values typed as ``--set`` types them).

    Raises
    ------
    ValueError
        Naming ``--grid``: no ``=``, an empty key or value, a key given twice or one that sets
        a reserved key (:data:`FORBIDDEN_GRID_KEYS`), a value given twice or that sets nothing
        (:func:`sets_nothing`), or more than
        :data:`MAX_GRID_POINTS` points in all.
    """
    from fedprivopt.simulation.config_presets import parse_override

    if not texts:
        raise ValueError("argument --grid: give at least one KEY=V1,V2,... to tune over")
    grid: dict[str, tuple[Any, ...]] = {}
    for text in texts:
        key, sep, values = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"argument --grid: expected KEY=V1,V2,..., got {shown(text)}")
        if key in grid:
            raise ValueError(f"argument --grid: {shown(key)} is given twice")
        parsed = []
        for part in values.split(","):
            if not part.strip():
                raise ValueError(
                    f"argument --grid: {shown(key)} has an empty value in {shown(text)}"
                )
            try:
                _, value = parse_override(f"{key}={part.strip()}")
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"argument --grid: {exc}") from None
            if sets_nothing(value):
                raise ValueError(empty_table_error("--grid", key, value))
            if any(_same_value(v, value) for v in parsed):
                raise ValueError(f"argument --grid: {shown(key)} lists {shown(part.strip())} twice")
            parsed.append(value)
            _refuse_forbidden(key, value)
        grid[key] = tuple(parsed)
    size = math.prod(len(v) for v in grid.values())
    if size > MAX_GRID_POINTS:
        raise ValueError(
            f"argument --grid: {size:,} grid points, more than the limit of {MAX_GRID_POINTS:,}"
        )
    return grid


def _keys_set(key: str, value: Any, strategy: str | None = None) -> list[str]:
    """The preset keys that ``key=value`` sets, spelled as :data:`FORBIDDEN_GRID_KEYS` spells them.

    A table value sets its dotted keys, a per-strategy key (``strategies.S.KEY``) sets ``KEY``
    for that strategy (nothing when ``strategy`` is given and ``S`` is another) and a task
    parameter may be written in snake case.
    """
    if isinstance(value, Mapping) and value:
        return [k for sub, v in value.items() for k in _keys_set(f"{key}.{sub}", v, strategy)]
    parts = key.split(".", 2)
    if parts[0] == "strategies" and len(parts) == 3:
        if strategy is not None and parts[1] != strategy:
            return []
        key = parts[2]
    if key.startswith("task-params."):
        key = "task-params." + key.split(".", 1)[1].replace("_", "-")
    return [key]


def keys_set_for(key: str, values: Sequence[Any], strategy: str) -> frozenset[str]:
    """The preset keys ``key`` set to any of ``values`` sets in a run of ``strategy``.

    Spelled as :data:`FORBIDDEN_GRID_KEYS` spells them (a table value sets its dotted keys, a
    task parameter in kebab case); ``strategies.S.KEY`` sets ``KEY`` when ``S`` is ``strategy``
    and nothing otherwise. Two layers that set one key are compared by these: a grid's
    ``strategies.dp-fedavg.noise-multiplier`` sets ``noise-multiplier`` as much as the bare key
    (eleventh review of issue 15, finding 2).
    """
    return frozenset(name for value in values for name in _keys_set(key, value, strategy))


def check_grid_overrides(
    grid: Mapping[str, Sequence[Any]], overrides: Mapping[str, Any], strategy: str
) -> None:
    """Refuse a grid key that sets a key ``--set`` (or a flag) sets too, in any spelling.

    Either may spell it as a table or as ``strategies.S.KEY``: one of them would win silently
    and the trials would not run what they are labelled with (eleventh review of issue 15,
    finding 2: ``--set strategies.dp-fedavg.server-learning-rate=1 --grid
    server-learning-rate=0.1,0.3`` ran every trial at 1).

    A grid key that sets nothing for ``strategy`` (another strategy's ``[strategies.S]`` table)
    is refused too: its trials would be labelled by values that changed nothing.

    Two grid keys that set one key are refused alike (thirty-first review of issue 15,
    compare finding 1: ``--grid server-learning-rate=0.5,1 --grid
    strategies.dp-fedavg.server-learning-rate=0.1,0.2`` ran every trial at the table's value
    and released "best trial-001 (server-learning-rate=0.5, ...)", a rate no trial ran).

    Raises
    ------
    ValueError
        Naming ``--grid``, the grid key and the key it sets.
    """
    fixed = {name: key for key, value in overrides.items()
             for name in keys_set_for(key, [value], strategy)}  # fmt: skip
    tuned: dict[str, str] = {}  # key set -> the grid key that sets it
    for key, values in grid.items():
        names = keys_set_for(key, values, strategy)
        if not names:  # trials labelled by a key that did nothing
            raise ValueError(
                f"argument --grid: {key} sets nothing for {strategy} (it is another strategy's "
                "table); tune a key of the tuned strategy"
            )
        for name in sorted(names & tuned.keys()):
            raise ValueError(
                f"argument --grid: {shown(key)} and {shown(tuned[name])} both set "
                f"{shown(name)}: one would win silently and the trials be labelled by values "
                "that did not run; give one"
            )
        tuned.update(dict.fromkeys(names, key))
        for name in sorted(keys_set_for(key, values, strategy) & fixed.keys()):
            via = "" if name == key else f" (it sets {shown(name)})"
            also = "" if fixed[name] == name else f" (as {shown(fixed[name])})"
            raise ValueError(
                f"argument --grid: {key}{via} is also set by --set or a flag{also}; give one"
            )


# Options a strategy holds but ignores (its block is shared with a strategy that uses them).
_IGNORED_BY = {
    "dp2-noise-first": frozenset({"dp2-scale-by-preconditioner"}),
    # no noise: the rate is never lowered, and the clip norm is not adapted (twenty-third review
    # of issue 15: --set adaptive-clipping=true on fedavg ran without a note, epsilon inf)
    "fedavg": frozenset({"max-noise-step", "adaptive-clipping"}),
    "fedadam": frozenset({"adaptive-clipping"}),
}


def keys_without_effect(strategy_config: Any) -> frozenset[str]:
    """The keys set in ``strategy_config`` that change nothing in a run of its strategy.

    Parameters
    ----------
    strategy_config : StrategyConfig
        A built strategy configuration.

    Returns
    -------
    frozenset of str
        Other strategies' options (:attr:`unused`) and options the strategy's block holds but
        ignores, when turned on (``dp2-noise-first``'s ``dp2-scale-by-preconditioner``, whose
        step already divides by ``P``; non-private ``fedavg``'s ``max-noise-step``, and the
        non-private baselines' ``adaptive-clipping``).
    """
    options = strategy_config.options

    def turned_on(key: str) -> bool:  # a block's option, or a strategy-wide one
        name = key.replace("-", "_")
        return bool(getattr(options, name, False) or getattr(strategy_config, name, False))

    ignored = {key for key in _IGNORED_BY.get(strategy_config.strategy, ()) if turned_on(key)}
    return frozenset(strategy_config.unused) | ignored


# DP2's adaptive-phase options: used only by its adaptive rounds, the first of which is round
# dp2-s1 + 1 (``dp2-noise-first`` shares the block; thirty-seventh review of issue 15, finding 1).
_DP2_ADAPTIVE = frozenset(
    {
        "dp2-s2",
        "dp2-beta",
        "dp2-epsilon",
        "dp2-learning-rate",
        "clip-norm-adaptive",
        "subtract-noise-variance",
        "dp2-scale-by-preconditioner",
    }
)


# ADADP's rate rule: it sets the rate of the rounds after the first (finding 3 of the same review).
_ADADP_RATE_RULE = frozenset(
    {"adadp-alpha-min", "adadp-alpha-max", "adadp-safety", "adadp-error-exponent"}
)


def idle_phase_keys(strategy_config: Any) -> dict[str, str]:
    """The options of a phase that no round of the run reaches, each with why.

    Parameters
    ----------
    strategy_config : StrategyConfig
        A built strategy configuration.

    Returns
    -------
    dict of str to str
        DP2's adaptive-phase options when ``dp2-s1 >= num-server-rounds`` (every round is an
        SGD round); Adam's ``beta1`` and ``beta2`` in a one-round run of a bias-corrected
        (standard flavor) Adam, whose first step is ``m̂/(√v̂ + τ)`` with ``m̂ = Δ̃`` and
        ``v̂ = Δ̃²`` whatever the decays (thirty-seventh review of issue 15, finding 2); ADADP's
        rate rule (finding 3) and adaptive clipping's ``clip-quantile`` and
        ``clip-learning-rate`` (finding 4), which set the next round's rate or clip norm, and
        ``server-momentum`` without ``max-noise-step`` (finding 5), in a one-round run. Empty
        otherwise.
    """
    options, idle = strategy_config.options, {}
    s1, rounds = getattr(options, "dp2_s1", None), strategy_config.num_server_rounds
    if s1 is not None and s1 >= rounds:
        why = (
            f"with dp2-s1 = {s1} and {rounds} round{'s' if rounds != 1 else ''} no adaptive "
            "round runs; raise --rounds above dp2-s1 or lower dp2-s1"
        )
        idle.update(dict.fromkeys(_DP2_ADAPTIVE, why))
    if rounds != 1:
        return idle
    bias_corrected = getattr(options, "adam_flavor", "standard") == "standard" and getattr(
        options, "bias_correction", True
    )
    if hasattr(options, "beta2") and bias_corrected:
        why = (
            "in one round the bias-corrected Adam step does not depend on beta1 or beta2 (its "
            "corrected moments are the round's update and its square); tune over more rounds"
        )
        idle.update(dict.fromkeys(("beta1", "beta2"), why))
    if hasattr(options, "adadp_alpha_max"):
        why = (
            "in one round ADADP's rate rule only sets the next round's rate (of its options "
            "only adadp-tolerance acts in the first round); tune over more rounds"
        )
        idle.update(dict.fromkeys(_ADADP_RATE_RULE, why))
    if getattr(options, "server_momentum", None) is not None and options.max_noise_step is None:
        why = (
            "in one round the heavy-ball step is the rate times the round's update whatever "
            "server-momentum is (it acts from the second round, or through max-noise-step); "
            "tune over more rounds"
        )
        idle["server-momentum"] = why
    if strategy_config.adaptive_clipping:
        why = (
            "in one round adaptive clipping only sets the next round's clip norm (the first "
            "round clips at clip-norm); tune over more rounds"
        )
        idle.update(dict.fromkeys(("clip-quantile", "clip-learning-rate"), why))
    return idle


def check_point_effect(point: Mapping[str, Any], strategy_config: Any) -> None:
    """Refuse a grid point whose key sets only options its strategy does not use.

    Its trials would be labelled, and the best chosen, by values that changed nothing
    (seventeenth review of issue 15, finding 1: ``tune toy.toml --strategy dp-fedavg --grid
    tau=0.1,1`` released "best trial (tau=1)").

    Raises
    ------
    ValueError
        Naming ``--grid``, the key and the strategy.
    """
    ignored = keys_without_effect(strategy_config)
    idle = idle_phase_keys(strategy_config)
    strategy = strategy_config.strategy
    for key, value in point.items():
        names = keys_set_for(key, [value], strategy)
        if names and names <= ignored:
            raise ValueError(
                f"argument --grid: {shown(key)} changes nothing in a run of {strategy} (it "
                "does not use that option); tune a key the tuned strategy uses"
            )
        if names and names <= ignored | idle.keys():
            why = next(idle[name] for name in sorted(names) if name in idle)
            raise ValueError(
                f"argument --grid: {shown(key)} changes nothing in a run of {strategy}: {why}"
            )


def refuse_table_spellings(overrides: Mapping[str, Any], keys: Mapping[str, str]) -> None:
    """Refuse an override that sets one of ``keys`` through a ``[strategies.S]`` table.

    ``compare`` sets every cell's ``strategy``, ``seed`` and ``noise-multiplier`` and ``tune``
    every trial's ``seed`` as overrides; ``--set strategies.S.seed=7`` is a strategy table, which
    wins over them, so every cell or trial silently ran it (eleventh review of issue 15, finding
    4: two seeds of a compare cell ran seed 7; every trial of a tuning ran seed 7, not its
    drawn run seed). ``keys`` maps each key to why it cannot be set.

    Raises
    ------
    ValueError
        Naming ``--set``, the override and the key it sets.
    """
    for key, value in overrides.items():
        if not key.startswith("strategies"):
            continue
        for name in _keys_set(key, value):
            if name in keys:
                raise ValueError(
                    f"argument --set: {key} sets {name} for a strategy, but {keys[name]}"
                )


def _refuse_forbidden(key: str, value: Any) -> None:
    """Refuse a key of :data:`FORBIDDEN_GRID_KEYS` or a task parameter not tunable here."""
    for name in _keys_set(key, value):
        why = FORBIDDEN_GRID_KEYS.get(name)
        param = name.removeprefix("task-params.")
        if why is None and param != name and param not in TUNABLE_TASK_PARAMS:
            tunable = ", ".join(sorted(TUNABLE_TASK_PARAMS))
            why = f"{_DATA} (of the task parameters only {tunable} can be tuned)"
        if why is not None:
            via = "" if name == key else f" (it sets {shown(name)})"
            raise ValueError(f"argument --grid: {shown(key)} cannot be tuned{via}: {why}")


def grid_points(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every point of the grid (the Cartesian product), in flag order."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*grid.values())]
