"""The ``[side-information]`` table of a run: parsing, validation, resolution and building.

A preset chooses AdaDPS' side information with a table (kebab-case keys)::

    [side-information]
    kind = "two-level"     # two-level | token-frequency | public-users | ones | auto
    top-k = 100
    factor = 200

In Flower's flattened run config and with ``--set`` the keys are ``side-information.kind``,
``side-information.top-k``, ... The old string form still works: ``side-information = "ones"``
is ``kind = "ones"``; ``side-information = "auto"`` (also: no table, or ``kind = "auto"``) is the
default, :data:`~fedprivopt.models.side_information.DEFAULT_SIDE_INFORMATION`, on a task it
applies to, and ``ones`` on another (the run summary says so). Parameters need an explicit kind.

:class:`SideInformationSpec` is what a :class:`~fedprivopt.simulation.config.RunConfig` holds (the
table as given, validated without the task); :func:`resolve_side_information` completes it for a
task (defaults, bounds that depend on the task or the population) and
:func:`build_side_information` computes the vector ``A``. The kinds and what each assumes is
public: :mod:`fedprivopt.models.side_information`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fedprivopt.core.checks import check_int, check_real
from fedprivopt.core.text import shown, shown_key
from fedprivopt.models.side_information import (
    DEFAULT_SIDE_INFORMATION,
    KINDS,
    NORMALIZATIONS,
    public_users_preconditioner,
    token_frequency_preconditioner,
    two_level_preconditioner,
)
from fedprivopt.models.side_information_checks import check_eps, check_max_ratio, check_positive
from fedprivopt.models.task import Task, model_spec

__all__ = [
    "PARAMETERS",
    "ResolvedSideInformation",
    "SideInformationSpec",
    "build_side_information",
    "resolve_side_information",
]

KEY = "side-information"
AUTO = "auto"
BAG_OF_WORDS_KINDS = ("two-level", "token-frequency")
PUBLIC_USERS_SHARE = 0.01  # default number of public users: ceil(1% of the population)

#: Parameters of every kind and their defaults (``None``: depends on the run, see
#: :func:`resolve_side_information`).
PARAMETERS: Mapping[str, Mapping[str, Any]] = {
    "two-level": {"top-k": 100, "factor": 200.0},
    "token-frequency": {
        "power": 1.0,
        "normalize": "mean",
        "floor": 1.0,
        "bias": "max",
        "bias-scale": 20.0,
        "max-ratio": 0.0,
    },
    # uncapped (eps 1e-5 relative to the largest sqrt(v) alone) the rare words' steps are 1e5 times
    # the largest: it diverged on the paper preset (held-out accuracy 0.13, loss 9.9). The authors'
    # absolute floor, sqrt(v + 1e-5), gives a range of 16-20 there; 200 is their two-level range
    "public-users": {"users": None, "eps": 1e-5, "max-ratio": 200.0},
    "ones": {},
}

SOURCES = {
    "two-level": (
        "the AdaDPS authors' federated StackOverflow code: gradients of the words beyond the "
        "top-k most frequent multiplied by factor (assumes public: the word-frequency ranking "
        "of the published word-count file)"
    ),
    "token-frequency": (
        "the published word-count file: A grows with a word's count (assumes public: the counts)"
    ),
    "public-users": (
        "sqrt of the second moment of the gradients of users who opted out of privacy, at the "
        "initial model (assumes public: those users' data)"
    ),
    "ones": "A = 1: AdaDPS is DP-FedAvg",
}


def _name(key: str) -> str:
    return f"{KEY}.{key}"


def _top_k(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{_name(key)} must be an integer in [1, V], got {value!r}")
    return value


def _users(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        bound = "[1, population - clients-per-round]"
        raise ValueError(f"{_name(key)} must be an integer in {bound}, got {value!r}")
    return value


def _normalize(key: str, value: Any) -> str:
    if value not in NORMALIZATIONS:
        raise ValueError(f"{_name(key)} must be one of {', '.join(NORMALIZATIONS)}, got {value!r}")
    return value


def _bias(key: str, value: Any) -> str | float:
    if value in ("max", "mean"):
        return value
    if isinstance(value, str) or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{_name(key)} must be 'max', 'mean' or a number > 0, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{_name(key)} must be 'max', 'mean' or a number > 0, got {value!r}")
    return float(value)


_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "top-k": _top_k,
    "factor": lambda k, v: check_positive(_name(k), v),
    "power": lambda k, v: check_positive(_name(k), v),
    "floor": lambda k, v: check_positive(_name(k), v, allow_zero=True),
    "bias-scale": lambda k, v: check_positive(_name(k), v),
    "eps": lambda k, v: check_eps(_name(k), v),
    "normalize": _normalize,
    "bias": _bias,
    "max-ratio": lambda k, v: check_max_ratio(_name(k), v),
    "users": _users,
}


@dataclass(frozen=True)
class SideInformationSpec:
    """The ``[side-information]`` table as configured, validated without the task.

    Parameters
    ----------
    kind : str
        One of :data:`~fedprivopt.models.side_information.KINDS` or ``"auto"`` (the default kind
        on a task it applies to, else ``ones``).
    params : dict
        The kind's parameters that were given (kebab-case keys, see :data:`PARAMETERS`);
        the others take their defaults when resolved. ``"auto"`` takes none.

    Raises
    ------
    ValueError
        Naming the key, for an unknown kind, an unknown key or an invalid value.
    """

    kind: str = AUTO
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        kinds = (*KINDS, AUTO)
        if self.kind not in kinds:
            raise ValueError(
                f"{_name('kind')} must be one of {', '.join(kinds)}, got {self.kind!r}"
            )
        if not isinstance(self.params, Mapping):
            raise ValueError(f"{KEY} parameters must be a table, got {self.params!r}")
        params: dict[str, Any] = {}
        for key, value in self.params.items():
            if self.kind == AUTO:
                raise ValueError(
                    f"{shown_key(_name(str(key)))} needs an explicit {_name('kind')} (one of "
                    f"{', '.join(KINDS)}); 'auto' takes no parameters"
                )
            allowed = PARAMETERS[self.kind]
            if key not in allowed:
                keys = ", ".join(allowed) or "none"
                raise ValueError(
                    f"unknown key {shown(_name(str(key)))} for {_name('kind')} = {self.kind!r} "
                    f"(its keys: {keys})"
                )
            params[key] = _CHECKS[key](key, value)
        object.__setattr__(self, "params", params)

    @classmethod
    def parse(cls, value: Any) -> SideInformationSpec:
        """From the string form (``"auto"``, ``"ones"``, a kind) or a table (``kind`` + keys)."""
        if isinstance(value, SideInformationSpec):
            return value
        if isinstance(value, str):
            return cls(kind=value)
        if isinstance(value, Mapping):
            params = {str(k): v for k, v in value.items() if k != "kind"}
            return cls(kind=value.get("kind", AUTO), params=params)
        raise ValueError(
            f"{KEY} must be a kind ({', '.join((*KINDS, AUTO))}) or a table, got {value!r}"
        )

    def to_mapping(self) -> dict[str, Any]:
        """The table (``kind`` first), as a preset writes it."""
        return {"kind": self.kind, **self.params}


@dataclass(frozen=True)
class ResolvedSideInformation:
    """The side information of one run, complete: kind, every parameter, public users.

    Attributes
    ----------
    requested : str
        The configured kind (``"auto"`` or a kind).
    kind : str
        The kind built.
    params : dict
        Every parameter of ``kind`` (kebab-case), defaults filled in.
    population : int
        ``N``, the task's users.
    public_users : tuple of int
        Users who opted out of privacy (``public-users``: ``0 .. k-1``), else empty.
    batch_size, max_examples : int
        The run's minibatch size and examples per user (``public-users`` computes with them).
    note : str
        How ``auto`` departed from the default, if it did (``ones`` on a task other than the
        bag-of-words tag task the default was chosen on).
    """

    requested: str
    kind: str
    params: dict[str, Any]
    population: int
    public_users: tuple[int, ...] = ()
    batch_size: int = 32
    max_examples: int = 0
    note: str = ""

    def __post_init__(self) -> None:
        """Refuse a record whose public users are not the ones its kind takes.

        Thirty-seventh review of issue 15: ``ResolvedSideInformation(..., population=40,
        public_users=(5, 7))`` was taken, and its summary said ``users 0..1 (2 of 40) opted out
        of privacy`` while :func:`build_side_information` built ``A`` from users 5 and 7, whom
        an offset of 2 (:func:`~fedprivopt.simulation.run.build_run`'s) leaves private; a
        ``population`` of 0 gave a private population of -1.
        """
        if self.kind not in KINDS or self.requested not in (*KINDS, AUTO):
            raise ValueError(
                f"kind must be one of {', '.join(KINDS)} and requested one of them or "
                f"{AUTO!r}, got {shown(self.kind)} and {shown(self.requested)}"
            )
        population = check_int("population", self.population, 1)
        users = self.params.get("users") if isinstance(self.params, Mapping) else None
        expected = tuple(range(users)) if self.kind == "public-users" else ()
        if self.kind == "public-users" and not (
            isinstance(users, int) and not isinstance(users, bool) and 1 <= users < population
        ):
            raise ValueError(
                f"params['users'] of kind 'public-users' must be an integer in [1, population - "
                f"1 = {population - 1}], got {shown(users)}"
            )
        if tuple(self.public_users) != expected:
            raise ValueError(
                f"public_users of kind {self.kind!r} must be {_users_range(expected)} (users "
                f"0 .. users - 1 opt out of privacy), got {shown(self.public_users)}"
            )
        object.__setattr__(self, "population", population)
        object.__setattr__(self, "public_users", expected)

    @property
    def private_population(self) -> int:
        """Users sampled and accounted: ``N - k``."""
        return self.population - len(self.public_users)

    def exclusion(self) -> str:
        """The sentence on the public users (empty for the other kinds)."""
        if not self.public_users:
            return ""
        k = len(self.public_users)
        who = "user 0" if k == 1 else f"users 0..{k - 1}"  # not "users 0..0" (the models reviewer)
        return (
            f"{who} ({k} of {self.population}) opted out of privacy: their "
            "gradients at the initial model are the side information, they are excluded from "
            f"the sampled and accounted population ({self.private_population} private users) "
            "and never trained on privately"
        )

    def summary(self) -> dict[str, Any]:
        """The ``side_information`` entry of ``summary.json``."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "requested": self.requested,
            "parameters": dict(self.params),
            "source": SOURCES[self.kind],
            "covered_by_guarantee": False,
        }
        if self.note:
            out["note"] = self.note
        if self.public_users:
            out["public_users"] = list(self.public_users)
            out["private_population"] = self.private_population
            out["computed_with"] = {
                "model": "initial",
                "batch-size": self.batch_size,
                "max-examples": self.max_examples,
            }
            out["exclusion"] = self.exclusion() + "."
        return out


def _users_range(users: tuple[int, ...]) -> str:
    """``users`` (``0 .. k-1`` or none) in words."""
    return f"users 0..{len(users) - 1}" if users else "empty"


def bag_of_words_shape(task: Task) -> tuple[int, int] | None:
    """``(V, K)`` when ``task`` is a bag-of-words tag task with published word counts, else None.

    Such a task has ``word_count_path``, ``num_features`` (``V``) and ``num_tags`` (``K``), and
    its flat model is the ``(V, K)`` weight then the ``K`` bias.
    """
    v, k = getattr(task, "num_features", None), getattr(task, "num_tags", None)
    if getattr(task, "word_count_path", None) is None:
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (v, k)):
        return None
    return (v, k) if model_spec(task).numel == v * k + k else None


def _supported(task: Task) -> tuple[str, ...]:
    if bag_of_words_shape(task) is not None:
        return KINDS
    return tuple(kind for kind in KINDS if kind not in BAG_OF_WORDS_KINDS)


def resolve_side_information(
    spec: SideInformationSpec | str | Mapping[str, Any],
    task: Task,
    *,
    population: int,
    clients_per_round: float,
    batch_size: int = 32,
    max_examples: int = 0,
) -> ResolvedSideInformation:
    """Complete ``spec`` for ``task`` (cheap: nothing is computed from data).

    Parameters
    ----------
    spec : SideInformationSpec, str or mapping
        The configured table.
    task : Task
        The run's task.
    population, clients_per_round : int, float
        ``N`` (the task's users) and the expected cohort ``m̄``: ``public-users`` must leave
        ``N - k >= m̄`` private users.
    batch_size, max_examples : int
        The run's minibatch size and examples per user.

    Raises
    ------
    ValueError
        Naming ``side-information.kind`` and the kinds that work when the kind does not apply to
        the task; naming the key when a value is out of its task-dependent range.
    """
    # thirty-seventh review of issue 15: unchecked, population 0 with clients_per_round -1 gave
    # a private population of -1, and an infinite or None cohort an OverflowError or TypeError
    population = check_int("population", population, 1)
    check_real("clients_per_round", clients_per_round, low=0.0, high=population, low_open=True)
    batch_size = check_int("batch_size", batch_size, 1)
    max_examples = check_int("max_examples", max_examples, 0)
    spec = SideInformationSpec.parse(spec)
    supported = _supported(task)
    kind, given, note = spec.kind, dict(spec.params), ""
    if kind == AUTO:
        default = dict(DEFAULT_SIDE_INFORMATION)
        kind = default.pop("kind")
        given = default
        if bag_of_words_shape(task) is None:  # the default was measured on the tag task only
            note = (
                f"auto: the default kind {kind!r} was chosen on the bag-of-words tag task, not "
                f"on task {getattr(task, 'name', '?')!r}, so A = 1 (ones); set the kind to use one"
            )
            kind, given = "ones", {}
        given = SideInformationSpec(kind=kind, params=given).params
    elif kind not in supported:
        raise ValueError(
            f"{_name('kind')} = {kind!r} needs a bag-of-words tag task (word counts, vocabulary "
            f"size, number of tags, e.g. stackoverflow-tp); for task "
            f"{getattr(task, 'name', '?')!r} use one of {', '.join(supported)}"
        )
    params = {**PARAMETERS[kind], **given}
    public: tuple[int, ...] = ()
    if kind == "two-level":
        v, _ = bag_of_words_shape(task)  # type: ignore[misc]
        if params["top-k"] > v:
            raise ValueError(
                f"{_name('top-k')} must be an integer in [1, V={v}], got {params['top-k']}"
            )
    if kind == "public-users":
        default_users = params["users"] is None
        if default_users:
            params["users"] = max(1, math.ceil(PUBLIC_USERS_SHARE * population))
        k, most = params["users"], math.floor(population - clients_per_round)
        if k > most:
            raise ValueError(_too_many_public_users(spec.kind, default_users, k, most, population))
        public = tuple(range(k))
    return ResolvedSideInformation(
        requested=spec.kind,
        kind=kind,
        params=params,
        population=population,
        public_users=public,
        batch_size=batch_size,
        max_examples=max_examples,
        note=note,
    )


def _too_many_public_users(
    requested: str, default: bool, k: int, most: int, population: int
) -> str:
    """The line refusing ``k`` public users where at most ``most`` leave a cohort private.

    Thirty-third review of issue 15: ``simulate stackoverflow-tp-mini.toml --strategy adadps
    --set clients-per-round=400`` (no side information set: ``auto``) was refused as
    ``side-information.users must be an integer in [1, population - clients-per-round = 0]
    ..., got 4``, a key and a value the user never gave, and a range that holds no integer.
    """
    bound, why = (
        f"population - clients-per-round = {most}",
        "(the private population must hold a cohort)",
    )
    if default:
        origin = (
            "the default side information (auto: public-users)"
            if requested == AUTO
            else f"{_name('kind')} = 'public-users'"
        )
        head = (
            f"{origin} takes {k} public user{'s' if k != 1 else ''} ({_name('users')} unset: "
            f"{PUBLIC_USERS_SHARE:.0%} of the population, at least 1), but {bound} {why}"
        )
    else:
        head = f"{_name('users')} must be an integer in [1, {bound}] {why}, got {k}"
    if most < 1:
        return (
            f"{head}; lower clients-per-round to at most population - 1 = {population - 1}, "
            f"or set {_name('kind')} (e.g. 'ones')"
        )
    if default:
        return f"{head}; set {_name('users')} in [1, {most}], or lower clients-per-round"
    return head


def build_side_information(resolved: ResolvedSideInformation, task: Task) -> torch.Tensor:
    """The vector ``A`` (float32, the model's flat length) of ``resolved`` for ``task``.

    Raises
    ------
    ValueError
        Naming the table's keys and values: twenty-seventh review of issue 15, a vector that
        under- or overflows float32 (``factor = 1e308``, ``power = 1e300``, ``bias = 1e308``)
        was refused naming no key (``the preconditioner under- or overflows float32``).
    """
    try:
        return _build(resolved, task)
    except ValueError as exc:
        given = ", ".join(
            f"{_name(k)} = {shown(v)}" for k, v in resolved.params.items() if v is not None
        )
        raise ValueError(f"{KEY}.kind = {resolved.kind!r} with {given}: {exc}") from None


def _build(resolved: ResolvedSideInformation, task: Task) -> torch.Tensor:
    p = resolved.params
    if resolved.kind == "ones":
        return torch.ones(model_spec(task).numel, dtype=torch.float32)
    if resolved.kind == "public-users":
        return public_users_preconditioner(
            task,
            resolved.public_users,
            batch_size=resolved.batch_size,
            max_examples=resolved.max_examples,
            eps=p["eps"],
            max_ratio=p["max-ratio"],
        )
    v, k = bag_of_words_shape(task)  # type: ignore[misc]
    if resolved.kind == "two-level":
        return two_level_preconditioner(
            vocab_size=v, num_tags=k, top_k=p["top-k"], factor=p["factor"]
        )
    from fedprivopt.data.vocab import read_word_counts

    counts = read_word_counts(task.word_count_path, limit=v)  # type: ignore[attr-defined]
    return token_frequency_preconditioner(
        counts,
        vocab_size=v,
        num_tags=k,
        power=p["power"],
        floor=p["floor"],
        bias=p["bias"],
        bias_scale=p["bias-scale"],
        normalize=p["normalize"],
        max_ratio=p["max-ratio"],
    )
