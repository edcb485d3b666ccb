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

The table's keys and checks, :class:`SideInformationSpec` and :class:`ResolvedSideInformation`
are in :mod:`fedprivopt.models.side_information_spec` (re-exported here); this module resolves
the table for a task and builds ``A``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from fedprivopt.core.checks import check_int, check_real
from fedprivopt.core.text import shown
from fedprivopt.models.side_information import (
    DEFAULT_SIDE_INFORMATION,
    KINDS,
    public_users_preconditioner,
    token_frequency_preconditioner,
    two_level_preconditioner,
)
from fedprivopt.models.side_information_spec import (  # re-exported
    AUTO,
    BAG_OF_WORDS_KINDS,
    KEY,
    PARAMETERS,
    PUBLIC_USERS_SHARE,
    SOURCES,  # noqa: F401
    ResolvedSideInformation,
    SideInformationSpec,
    key_name,
)
from fedprivopt.models.task import Task, model_spec
from fedprivopt.models.task_calls import task_attribute

__all__ = [
    "PARAMETERS",
    "ResolvedSideInformation",
    "SideInformationSpec",
    "build_side_information",
    "resolve_side_information",
]


def bag_of_words_shape(task: Task) -> tuple[int, int] | None:
    """``(V, K)`` when ``task`` is a bag-of-words tag task with published word counts, else None.

    Such a task has ``word_count_path``, ``num_features`` (``V``) and ``num_tags`` (``K``), and
    its flat model is the ``(V, K)`` weight then the ``K`` bias.
    """
    # a property's own exception (a file it reads gone) names the member (forty-seventh review
    # of issue 15, follow-up outputs 4): it was a traceback, rc 1
    v, k = task_attribute(task, "num_features"), task_attribute(task, "num_tags")
    if task_attribute(task, "word_count_path") is None:
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
            f"{key_name('kind')} = {kind!r} needs a bag-of-words tag task (word counts, vocabulary "
            f"size, number of tags, e.g. stackoverflow-tp); for task "
            f"{getattr(task, 'name', '?')!r} use one of {', '.join(supported)}"
        )
    params = {**PARAMETERS[kind], **given}
    public: tuple[int, ...] = ()
    if kind == "two-level":
        v, _ = bag_of_words_shape(task)  # type: ignore[misc]
        if params["top-k"] > v:
            raise ValueError(
                f"{key_name('top-k')} must be an integer in [1, V={v}], got {params['top-k']}"
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
            else f"{key_name('kind')} = 'public-users'"
        )
        head = (
            f"{origin} takes {k} public user{'s' if k != 1 else ''} ({key_name('users')} unset: "
            f"{PUBLIC_USERS_SHARE:.0%} of the population, at least 1), but {bound} {why}"
        )
    else:
        head = f"{key_name('users')} must be an integer in [1, {bound}] {why}, got {k}"
    if most < 1:
        return (
            f"{head}; lower clients-per-round to at most population - 1 = {population - 1}, "
            f"or set {key_name('kind')} (e.g. 'ones')"
        )
    if default:
        return f"{head}; set {key_name('users')} in [1, {most}], or lower clients-per-round"
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
            f"{key_name(k)} = {shown(v)}" for k, v in resolved.params.items() if v is not None
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

    counts = read_word_counts(task_attribute(task, "word_count_path"), limit=v)
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
