"""The ``[side-information]`` table as configured, and the record of it resolved for a run.

:class:`SideInformationSpec` (the table as given, validated without the task: each kind's keys
:data:`PARAMETERS` and their checks) and :class:`ResolvedSideInformation` (complete for a task:
kind, every parameter, public users, and the ``side_information`` entry of ``summary.json``);
:func:`key_name` writes a key as ``side-information.<key>``.

Split from :mod:`fedprivopt.models.side_information_config`, which resolves the table for a task
and builds the vector ``A`` (and re-exports every name here).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fedprivopt.core.checks import check_int
from fedprivopt.core.text import shown, shown_key
from fedprivopt.models.side_information import KINDS, NORMALIZATIONS
from fedprivopt.models.side_information_checks import check_eps, check_max_ratio, check_positive

__all__ = [
    "AUTO",
    "BAG_OF_WORDS_KINDS",
    "KEY",
    "PARAMETERS",
    "PUBLIC_USERS_SHARE",
    "SOURCES",
    "ResolvedSideInformation",
    "SideInformationSpec",
    "key_name",
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


def key_name(key: str) -> str:
    """``key`` of the table as a flattened key: ``side-information.<key>``."""
    return f"{KEY}.{key}"


def _top_k(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key_name(key)} must be an integer in [1, V], got {value!r}")
    return value


def _users(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        bound = "[1, population - clients-per-round]"
        raise ValueError(f"{key_name(key)} must be an integer in {bound}, got {value!r}")
    return value


def _normalize(key: str, value: Any) -> str:
    if value not in NORMALIZATIONS:
        raise ValueError(
            f"{key_name(key)} must be one of {', '.join(NORMALIZATIONS)}, got {value!r}"
        )
    return value


def _bias(key: str, value: Any) -> str | float:
    if value in ("max", "mean"):
        return value
    if isinstance(value, str) or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key_name(key)} must be 'max', 'mean' or a number > 0, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{key_name(key)} must be 'max', 'mean' or a number > 0, got {value!r}")
    return float(value)


_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "top-k": _top_k,
    "factor": lambda k, v: check_positive(key_name(k), v),
    "power": lambda k, v: check_positive(key_name(k), v),
    "floor": lambda k, v: check_positive(key_name(k), v, allow_zero=True),
    "bias-scale": lambda k, v: check_positive(key_name(k), v),
    "eps": lambda k, v: check_eps(key_name(k), v),
    "normalize": _normalize,
    "bias": _bias,
    "max-ratio": lambda k, v: check_max_ratio(key_name(k), v),
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
                f"{key_name('kind')} must be one of {', '.join(kinds)}, got {self.kind!r}"
            )
        if not isinstance(self.params, Mapping):
            raise ValueError(f"{KEY} parameters must be a table, got {self.params!r}")
        params: dict[str, Any] = {}
        for key, value in self.params.items():
            known = sorted({name for names in PARAMETERS.values() for name in names})
            if self.kind == AUTO and str(key) not in known:
                # forty-fifth review of issue 15 (input 5): --set side-information.Kind=ones
                # (a key in another case, or misspelled) was told to give the kind it gave
                raise ValueError(
                    f"unknown key {shown(key_name(str(key)))} (the keys of {KEY}: kind, "
                    f"{', '.join(known)})"
                )
            if self.kind == AUTO:
                raise ValueError(
                    f"{shown_key(key_name(str(key)))} needs an explicit {key_name('kind')} (one of "
                    f"{', '.join(KINDS)}); 'auto' takes no parameters"
                )
            allowed = PARAMETERS[self.kind]
            if key not in allowed:
                keys = ", ".join(allowed) or "none"
                raise ValueError(
                    f"unknown key {shown(key_name(str(key)))} for {key_name('kind')} = "
                    f"{self.kind!r} (its keys: {keys})"
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
