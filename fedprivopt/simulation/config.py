"""Run configuration: presets (TOML), ``--set key=value`` overrides and validation.

A preset is a TOML file whose top-level keys are kebab-case, the same keys as the Flower app's run
config: every :class:`~fedprivopt.strategies.StrategyConfig` field (``strategy``,
``num-server-rounds``, ``clients-per-round``, ``noise-multiplier``, ...) plus the run keys of
:class:`RunConfig` (``engine``, ``task``, ...). The task's own parameters live in a
``[task-params]`` table (in Flower's flattened run config: ``task-params.<key>``). Everything is
validated before any training; every error names the key.

AdaDPS' side information is a ``[side-information]`` table (``kind`` and the kind's parameters,
:mod:`fedprivopt.models.side_information_config`); flattened ``side-information.<key>``, also
with ``--set``. The string form ``side-information = "ones"`` (or ``"auto"``) is its ``kind``. A
layer (preset < strategy table < ``--set``) that sets another ``kind`` than the layers below
replaces their table: their parameters belong to the other kind.

Per-strategy hyperparameters go in ``[strategies.<name>]`` tables (e.g. a smaller
``server-learning-rate`` for the Adam strategies); they apply when that strategy runs. Precedence:
preset < its ``[strategies.<name>]`` table < ``--set`` and command-line flags.

:class:`RunConfig` is the validated configuration; a preset's text, its tables flattened to dotted
keys and the layers merged: :mod:`fedprivopt.simulation.config_presets` (with ``--set``'s
:func:`~fedprivopt.simulation.config_presets.parse_override`); the checks of directory task
parameters and TOML dates: :mod:`fedprivopt.simulation.config_values`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedprivopt.core.checks import check_int
from fedprivopt.core.files import url_refusal
from fedprivopt.core.text import shown
from fedprivopt.models.side_information_config import KEY as SIDE_INFORMATION
from fedprivopt.models.side_information_config import (
    ResolvedSideInformation,
    SideInformationSpec,
    resolve_side_information,
)
from fedprivopt.models.task import Task
from fedprivopt.privacy.events import MIN_NOISE_MULTIPLIER
from fedprivopt.simulation.cluster_config import check_address
from fedprivopt.simulation.config_presets import (
    PRESET_LIMIT,
    flat_overrides,
    flatten,
    merge,
    preset_text,
    task_param_spellings,
    unknown_strategy_table,
)
from fedprivopt.simulation.config_values import (
    TASK_PATHS,
    check_no_dates,
    check_task_dirs,
    plain_scalar,
    plain_task_params,
    task_path,
)
from fedprivopt.simulation.files import to_toml
from fedprivopt.strategies.config import STRATEGIES, StrategyConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "ENGINES",
    "RunConfig",
    "load_config",
    "resolve_config",
]

ENGINES = ("fast", "flower")
_STRATEGY_KEYS = StrategyConfig.keys()
#: Strategy keys whose default is ``None`` ("derive it"): ``""`` unsets them (``--set tau=``), as
#: in the Flower run config, so that a preset's pinned value can be given back to the code.
UNSETTABLE = frozenset(k for k, rule in StrategyConfig.rules().items() if rule.optional)
#: a CUDA index of at most 9 digits: ``cuda:`` and 5,000 digits passed, then ended in Python's
#: "Exceeds the limit (4300 digits) for integer string conversion", naming no key (thirty-first
#: review of issue 15)
_DEVICE = re.compile(r"(auto|cpu|cuda(:[0-9]{1,9})?)\Z")
_INT64 = (-(2**63), 2**63)  # TOML integers are signed 64-bit; tomllib accepts any size


MAX_FAST_ACTORS = 256
"""Upper bound of ``fast-actors``: processes, each with its own copy of the task."""

MAX_CLIENT_RESOURCES = 1e6
"""Upper bound of ``client-cpus`` and ``client-gpus``, on every engine (no Ray node declares more;
the ``fast`` engine ignores both, so a larger value is a slip, not a request)."""

MIN_ROUND_TIMEOUT = 1.0
"""Lower bound of ``round-timeout`` in seconds: below it no node's reply arrives in time, so every
update of every round is lost while each round is charged to the budget all the same (a toy
round on the ``flower`` engine takes 0.1-0.2 s, its first about 9 s, measured)."""


@dataclass(frozen=True)
class RunConfig:
    """Everything one simulation needs.

    Attributes
    ----------
    strategy : StrategyConfig
        Server and client hyperparameters.
    engine : {"fast", "flower"}
        ``fast``: in process, the same core and LocalTrainer; ``flower``: Flower's simulation
        engine on Ray.
    task : str
        Registered task name, or a reference ``"package.module:factory"``
        (:func:`fedprivopt.models.build_task`).
    task_params : dict
        The task's keyword parameters.
    eval_every : int
        Evaluate centrally every this many rounds (and after the last round).
    checkpoint_every : int
        Write a checkpoint every this many rounds (and after the last round).
    side_information : SideInformationSpec
        AdaDPS' public side information (the ``[side-information]`` table; a kind name or a
        mapping is converted): ``auto`` is
        :data:`~fedprivopt.models.side_information.DEFAULT_SIDE_INFORMATION` on a task it applies
        to and ones otherwise (the summary says so); ``ones`` is plain DP-FedAvg. Used only by
        ``adadps``.
    client_cpus, client_gpus : float
        Resources of one simulated client on the ``flower`` engine (fractional GPUs allowed), in
        ``[0, MAX_CLIENT_RESOURCES]`` on every engine (the ``fast`` engine ignores them); the
        ``flower`` engine also checks them against the machine or cluster.
    ray_cpus : int
        CPUs Ray may use (0: all); must be 0 when joining a cluster (its nodes declare theirs).
        The ``flower`` engine sizes its pool of client actors by them; ``fast-actors`` shards
        take one each (so at least ``fast-actors``; 0: one per shard) and split them into their
        torch threads. An in-process run starts no Ray and ignores it.
    ray_address : str
        Join the Ray cluster at this address (``host:port`` of its head, as ``ray start --head``
        prints it, or ``auto``: the cluster this machine is a node of) instead of starting a
        private Ray instance; ``local`` always starts one. Unset (``""``): the environment
        variable ``RAY_ADDRESS`` when set, else ``local``. Used by the ``flower`` engine and by
        ``fast-actors`` (:mod:`fedprivopt.simulation.cluster`, ``docs/SCALING.md``).
    device : str
        Training device of the fast engine and of each client: ``auto`` (cuda if present),
        ``cpu`` or ``cuda[:i]``.
    vectorize : bool
        Fast engine: train a cohort's users together when the task has a cohort trainer
        (row-sparse bag-of-words tasks); otherwise, or when false, one user at a time with
        :class:`~fedprivopt.clients.LocalTrainer`. Both give the same model up to float rounding.
    cohort_chunk : int
        Fast engine: users trained together (bounds memory), ``>= 1``.
    fast_actors : int
        Fast engine: shard each cohort over this many Ray actors (each holds the task and trains
        its share of users); ``0`` trains in process. Refused above ``0`` on the ``flower``
        engine, whose clients are Ray actors already (``client-cpus``).
    round_timeout : float
        Flower engine and deployment: seconds the server waits for a cohort's replies, at least
        :data:`MIN_ROUND_TIMEOUT` (1 s; below it every update is lost while every round is
        charged) and finite; users whose node has not replied by then are counted in the round
        metric ``timed_out`` and the round goes on without them (their sampling is accounted
        all the same).
    tensorboard : bool
        Also write every metrics row as TensorBoard scalars into the run directory
        (:mod:`fedprivopt.simulation.tensorboard`).
    """

    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    engine: str = "fast"
    task: str = "toy"
    task_params: dict[str, Any] = field(default_factory=dict)
    eval_every: int = 1
    checkpoint_every: int = 1
    side_information: SideInformationSpec = field(default_factory=SideInformationSpec)
    client_cpus: float = 1.0
    client_gpus: float = 0.0
    ray_cpus: int = 0
    ray_address: str = ""
    device: str = "auto"
    vectorize: bool = True
    cohort_chunk: int = 256
    fast_actors: int = 0
    round_timeout: float = 3600.0
    tensorboard: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # forty-fifth review of issue 15 (input 2)
            object.__setattr__(self, f.name, plain_scalar(getattr(self, f.name)))
        if self.engine not in ENGINES:
            raise ValueError(
                f"engine must be one of {', '.join(ENGINES)}, got {shown(self.engine)}"
            )
        object.__setattr__(
            self, "side_information", SideInformationSpec.parse(self.side_information)
        )
        for key in ("eval_every", "checkpoint_every"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{key.replace('_', '-')} must be an integer >= 1, got {shown(value)}"
                )
        if (
            isinstance(self.ray_cpus, bool)
            or not isinstance(self.ray_cpus, int)
            or self.ray_cpus < 0
        ):
            raise ValueError(f"ray-cpus must be an integer >= 0, got {shown(self.ray_cpus)}")
        for key in ("client_cpus", "client_gpus"):
            value = getattr(self, key)
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not (0 <= value <= MAX_CLIENT_RESOURCES)
            ):
                raise ValueError(
                    f"{key.replace('_', '-')} must be a number in [0, {MAX_CLIENT_RESOURCES:g}], "
                    f"got {shown(value)}"
                )
        if (
            not isinstance(self.round_timeout, (int, float))
            or isinstance(self.round_timeout, bool)
            or not (MIN_ROUND_TIMEOUT <= self.round_timeout < math.inf)
        ):
            raise ValueError(
                f"round-timeout must be a number of seconds >= {MIN_ROUND_TIMEOUT:g} (below it "
                f"no reply arrives in time and every update is lost), got "
                f"{shown(self.round_timeout)}"
            )
        for key in ("vectorize", "tensorboard"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key} must be true or false, got {shown(getattr(self, key))}")
        check_int("cohort-chunk", self.cohort_chunk, 1)
        check_address(self.ray_address)
        if self.ray_address not in ("", "local") and self.engine == "fast" and not self.fast_actors:
            raise ValueError(
                f"ray-address {shown(self.ray_address)} is used only by the flower engine and by "
                "fast-actors >= 1; the fast engine with fast-actors = 0 trains in process "
                "(set fast-actors, or leave ray-address unset)"
            )
        # each actor is a process (a Ray worker with its own copy of the task)
        check_int("fast-actors", self.fast_actors, 0, MAX_FAST_ACTORS)
        if self.fast_actors and self.engine != "fast":
            # thirty-fourth review of issue 15: accepted and ignored, as ray-address on the
            # fast engine in process was before the eighth review
            raise ValueError(
                f"fast-actors {self.fast_actors} is used only by the fast engine (its shards); "
                f"the {self.engine} engine runs each client as a Ray actor of client-cpus CPUs "
                "(set fast-actors = 0, or use the fast engine)"
            )
        if 0 < self.ray_cpus < self.fast_actors:
            # thirty-fourth review of issue 15: Ray was given fast-actors CPUs whatever
            # ray-cpus said; given ray-cpus, the shards beyond it would wait for a CPU for ever
            raise ValueError(
                f"fast-actors must be at most ray-cpus = {self.ray_cpus} (each shard is a Ray "
                f"actor that takes one of the CPUs Ray is given), got {self.fast_actors}"
            )
        if not isinstance(self.task, str) or not self.task:
            raise ValueError(f"task must be a task name, got {shown(self.task)}")
        check_task_dirs(self.task_params)
        # forty-fifth review of issue 15 (input 1): a Path, a NumPy scalar or None was written
        # to config.toml and the ledger as no TOML value (a TypeError after the rounds, or a
        # run --resume refused for ever)
        object.__setattr__(self, "task_params", plain_task_params(self.task_params))
        if not isinstance(self.device, str) or not _DEVICE.match(self.device):
            raise ValueError(
                f"device must be auto, cpu or cuda[:i] (i of at most 9 digits), got "
                f"{shown(self.device)}"
            )

    def to_mapping(self) -> dict[str, Any]:
        """Nested kebab-case mapping (a preset) of this configuration."""
        out = dict(self.strategy.to_mapping())
        for f in dataclasses.fields(self):
            if f.name in ("strategy", "task_params", "side_information"):
                continue
            out[f.name.replace("_", "-")] = getattr(self, f.name)
        out[SIDE_INFORMATION] = self.side_information.to_mapping()
        out["task-params"] = dict(self.task_params)
        return out


def _known_key(key: str) -> bool:
    run_keys = {f.name.replace("_", "-") for f in dataclasses.fields(RunConfig)}
    return (
        key in _STRATEGY_KEYS
        or key in run_keys - {"strategy", "task-params"}
        or key.startswith(("task-params.", f"{SIDE_INFORMATION}."))
    )


def _apply_strategy_table(flat: dict[str, Any], strategy: str) -> dict[str, Any]:
    """Apply ``[strategies.<strategy>]`` overrides and drop the other strategies' tables.

    Every table is checked, not only the one applied: its name must be a strategy and its keys
    real keys other than ``strategy``, so a typo is an error rather than silently ignored.
    """
    out = {k: v for k, v in flat.items() if not k.startswith("strategies.")}
    table: dict[str, Any] = {}
    prefix = f"strategies.{strategy}."
    for key, value in flat.items():
        if not key.startswith("strategies."):
            continue
        name, _, rest = key[len("strategies.") :].partition(".")
        if not rest:
            raise ValueError(f"unknown key {shown(key)} (expected [strategies.<name>] tables)")
        if name not in STRATEGIES:
            raise unknown_strategy_table(f"strategies.{name}")
        if rest == "strategy" or not _known_key(rest):
            raise ValueError(f"unknown key {shown(key)}")
        if key.startswith(prefix):
            table[key[len(prefix) :]] = value
    return merge(out, table)


def resolve_config(data: Mapping[str, Any]) -> RunConfig:
    """Build a validated :class:`RunConfig` from a (nested or flattened) kebab-case mapping."""
    flat = task_param_spellings(flatten(data))
    flat = _apply_strategy_table(flat, str(flat.get("strategy", "dp-fedavg")))
    strategy: dict[str, Any] = {}
    run: dict[str, Any] = {}
    task_params: dict[str, Any] = {}
    side: dict[str, Any] = {}
    run_keys = {f.name.replace("_", "-") for f in dataclasses.fields(RunConfig)} - {
        "strategy",
        "task-params",
        SIDE_INFORMATION,
    }
    for key, value in flat.items():
        value = plain_scalar(value)  # forty-fifth review of issue 15 (input 2): numpy.uint64
        check_no_dates(key, value)
        if key.startswith("task-params."):
            name = key.split(".", 1)[1].replace("-", "_")
            task_params[name] = task_path(key, value) if name in TASK_PATHS else value
            continue
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and not _INT64[0] <= value < _INT64[1]
        ):
            raise ValueError(f"{key}: integers must fit in 64 bits (as in TOML), got {value}")
        if key.startswith(f"{SIDE_INFORMATION}."):
            side[key.split(".", 1)[1]] = value
        elif key in _STRATEGY_KEYS:
            strategy[key] = None if key in UNSETTABLE and value == "" else value
        elif key in run_keys:
            run[key.replace("-", "_")] = value
        else:
            raise ValueError(f"unknown key {shown(key)}")
    if "client_cpus" in run and type(run["client_cpus"]) is int:  # not bool: false is no count
        run["client_cpus"] = float(run["client_cpus"])
    if "client_gpus" in run and type(run["client_gpus"]) is int:  # not bool: false is no count
        run["client_gpus"] = float(run["client_gpus"])
    if "round_timeout" in run and type(run["round_timeout"]) is int:
        # forty-seventh review of issue 15 (sameness 5): compare --set round-timeout=600 over
        # its cells of 600.0 refused every one ('a run made with round-timeout = 600.0, this
        # call asks for 600'), the same setting
        run["round_timeout"] = float(run["round_timeout"])
    strategy_config = StrategyConfig.from_mapping(strategy)
    if 0 < strategy_config.noise_multiplier < MIN_NOISE_MULTIPLIER:
        raise ValueError(
            f"noise-multiplier must be 0 (no privacy) or at least {MIN_NOISE_MULTIPLIER:g} "
            "(below it the accountants are not numerically reliable), got "
            f"{strategy_config.noise_multiplier:g}"
        )
    return RunConfig(
        strategy=strategy_config,
        task_params=task_params,
        side_information=SideInformationSpec.parse(side),
        **run,
    )


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """Read a preset, apply ``overrides`` (kebab-case keys, ``task-params.x`` allowed), validate."""
    if isinstance(path, str) and not path.strip():  # Path("") is "." (sixteenth review)
        raise ValueError(f"config file must be a path, got {shown(path)}")
    # forty-sixth review of issue 15 (input 1): simulate "https://.../toy.toml" (a preset's
    # address pasted; also s3://, compare, tune, deploy local, this API) was "config file
    # 'https:/.../toy.toml' does not exist", a path not typed, and read from ./https:/... where
    # such a file exists; --out, --resume and the data directories refuse a URL so
    refused = url_refusal("config file", path)
    if refused is not None:
        raise ValueError(refused)
    path = Path(path)
    if not path.is_file():
        what = "is not a regular file" if os.path.lexists(path) else "does not exist"
        raise ValueError(f"config file {shown(str(path))} {what}")
    text = preset_text(path)
    try:
        data = tomllib.loads(text)
    except ValueError as exc:  # also an integer too long to read (twelfth review of issue 15)
        raise ValueError(f"config file {shown(str(path))} is not valid TOML: {exc}") from None
    try:
        flat = task_param_spellings(flatten(data))
    except ValueError as exc:
        raise ValueError(f"config file {shown(str(path))}: {exc}") from None
    overrides = flat_overrides(overrides or {})
    strategy = str(overrides.get("strategy", flat.get("strategy", "dp-fedavg")))
    flat = _apply_strategy_table(flat, strategy)  # preset < its strategy table < overrides
    config = resolve_config(merge(flat, overrides))
    config_to_toml(config)  # a config.toml --resume could not read back is refused here
    return config


def config_to_toml(config: RunConfig) -> str:
    """The resolved configuration as a preset (loadable by :func:`load_config`).

    Raises ``ValueError`` when the text is above :data:`~fedprivopt.simulation.config_presets.
    PRESET_LIMIT`, the most a preset or a run's ``config.toml`` may hold. Follow-up of the
    fortieth review of issue 15 (outputs, open row): a preset of 913 kB (its ``1e-5`` written
    back as ``1e-05``) or long ``--set`` lists ran with rc 0 and wrote a ``config.toml`` of
    1.07 MB, which ``--resume`` and ``compare`` then refused. :func:`load_config` and every
    writer of a run's ``config.toml`` call this before anything is written.
    """
    text = to_toml(config.to_mapping())
    # its size only: a value that cannot be written is refused naming the file where it is
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > PRESET_LIMIT:
        raise ValueError(
            f"the run's configuration (the preset with its --set values) is {size:,} bytes as "
            f"TOML, above the {PRESET_LIMIT:,} a run's config.toml may hold (what --resume "
            "reads back): shorten its longest values"
        )
    return text


def side_information_of(config: RunConfig, task: Task) -> ResolvedSideInformation | None:
    """The resolved side information of an ``adadps`` run (``None`` for other strategies).

    Cheap (nothing is computed from data); raises ``ValueError`` naming the key on settings that
    do not fit the task or the population.
    """
    s = config.strategy
    if s.strategy != "adadps":
        return None
    return resolve_side_information(
        config.side_information,
        task,
        population=s.population,
        clients_per_round=s.clients_per_round,
        batch_size=s.batch_size,
        max_examples=s.max_examples,
    )
