"""Registry of tasks by name, so that every process can rebuild a task from plain parameters.

The Flower ClientApp reads ``task`` and ``task-params`` (JSON) from the run config and calls
:func:`build_task`; simulation presets use the same names.
"""

from __future__ import annotations

from collections.abc import Callable

from fedprivopt.models.next_word import StackOverflowNextWordTask
from fedprivopt.models.tag_prediction import StackOverflowTagTask
from fedprivopt.models.task import Task
from fedprivopt.models.toy import ToyClassificationTask

__all__ = ["build_task", "register_task", "task_names"]

_REGISTRY: dict[str, Callable[..., Task]] = {
    "stackoverflow-nwp": StackOverflowNextWordTask,
    "stackoverflow-tp": StackOverflowTagTask,
    "toy": ToyClassificationTask,
}


def register_task(name: str, factory: Callable[..., Task], *, replace: bool = False) -> None:
    """Register ``factory`` (called with keyword parameters) under ``name``.

    Raises
    ------
    ValueError
        If ``name`` is empty or already registered and ``replace`` is false.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if name in _REGISTRY and not replace:
        raise ValueError(f"task {name!r} is already registered (pass replace=True to replace it)")
    _REGISTRY[name] = factory


def task_names() -> tuple[str, ...]:
    """Names of the registered tasks, sorted."""
    return tuple(sorted(_REGISTRY))


def build_task(name: str, **params: object) -> Task:
    """Build the task registered as ``name`` with keyword ``params``.

    Parameters
    ----------
    name : str
        A registered name (see :func:`task_names`), e.g. ``"toy"`` or ``"stackoverflow-tp"``.
    **params
        Keyword parameters of the task's constructor.

    Raises
    ------
    ValueError
        If ``name`` is not registered (the message lists the known names), or a parameter is
        invalid.
    """
    try:
        factory = _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(task_names())}") from None
    return factory(**params)
