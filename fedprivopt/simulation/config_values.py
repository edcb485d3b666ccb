"""Checks of single configuration values: directory task parameters and TOML dates.

:data:`TASK_PATHS` are the task parameters that are directories: :func:`task_path` expands a
leading ``~`` (:func:`expand_home`) and refuses a null character (:func:`refuse_null_character`;
:func:`check_task_dirs` for a :class:`~fedprivopt.simulation.config.RunConfig` made in Python);
:func:`check_no_dates` refuses a TOML date or time as a setting. Each error names the key.

Split from :mod:`fedprivopt.simulation.config` (where these were ``_TASK_PATHS``,
``_expand_home``, ``_task_path``, ``_refuse_null_character``, ``_check_task_dirs`` and
``_check_no_dates``).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from typing import Any

from fedprivopt.core.checks import plain_scalar
from fedprivopt.core.text import shown, shown_key

__all__ = [
    "TASK_PATHS",
    "check_no_dates",
    "check_task_dirs",
    "expand_home",
    "plain_scalar",
    "plain_task_params",
    "refuse_null_character",
    "task_path",
]

TASK_PATHS = frozenset({"data_dir", "cache_dir"})
"""Task parameters that are directories: a leading ``~`` is expanded (:func:`expand_home`)."""


def expand_home(key: str, value: Any) -> Any:
    """``value`` with a leading ``~`` or ``~user`` expanded, when it is such a string.

    Twenty-eighth review of issue 15: ``--set task-params.data-dir=~/sodata`` (quoted, so the
    shell left the ``~``) generated the dataset into ``./~/sodata``, a directory named ``~``,
    where ``--out "~/x"`` and a preset ``"~/x.toml"`` are expanded. Anything else is unchanged
    (the task checks it). Forty-second review of issue 15 (input 5): a ``~user`` of no user
    (``~nosuchuser/d``, which ``expanduser`` leaves as it is) generated into ``./~nosuchuser/d``;
    ``ValueError`` naming ``key``.
    """
    if isinstance(value, str) and value.startswith("~"):
        expanded = os.path.expanduser(value)
        if expanded == value:  # forty-second review of issue 15 (input 5): "~nosuchuser/d"
            raise ValueError(
                f"{key} starts with ~, but names no user of this machine whose home it could "
                f"be: {shown(value)}; name the directory (./~x for a name that starts with ~)"
            )
        return expanded
    return value


def task_path(key: str, value: Any) -> Any:
    r"""A directory task parameter (:data:`TASK_PATHS`): ``~`` expanded, a null character refused.

    Forty-first review of issue 15 (input 1): ``--set 'task-params.data-dir="D\u0000x"'`` (also
    ``cache-dir``, a preset's or a run's ``config.toml``; TOML writes a null character so) was
    refused as ``config: embedded null byte``, the operating system's words naming no key, by
    the check that the directories lie outside ``--out`` (``simulate``, ``compare``). No
    directory's name holds one: refused here naming the key (before ``~`` is expanded, which
    raises on ``~\x00``).
    """
    refuse_null_character(key, value)
    return expand_home(shown_key(key), value)


def refuse_null_character(key: str, value: Any) -> None:
    """``ValueError`` naming ``key`` when the directory ``value`` (str, bytes or path) holds NUL."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if isinstance(value, str) and "\x00" in value:
        raise ValueError(
            f"{shown_key(key)} holds a null character: {shown(value)}; a directory name has none"
        )


def check_task_dirs(params: Any) -> None:
    r"""Refuse a directory task parameter (:data:`TASK_PATHS`) that holds a null character.

    Follow-up of the forty-first review of issue 15 (outputs 1): input 1 refused it where a
    configuration is read (:func:`task_path`), but a ``RunConfig`` made in Python
    (``dataclasses.replace(config, task_params={..., "data_dir": "D\x00x"})``, a
    ``pathlib.Path`` too) reached ``simulate``, which refused it as ``embedded null byte``, the
    operating system's words naming no parameter. ``ValueError`` naming the key, as there.
    """
    if not isinstance(params, Mapping):
        return  # the task's own refusal names it
    for name in sorted(TASK_PATHS & set(params)):
        refuse_null_character(f"task-params.{name.replace('_', '-')}", params[name])


def check_no_dates(key: str, value: Any) -> None:
    """Refuse a TOML date or time (also inside an array) as the value of ``key``.

    Thirty-fourth review of issue 15 (the tasks reviewer's report): ``--set
    task-params.extra=1979-05-27`` for a factory taking ``**params`` ended in ``TypeError:
    Object of type date is not JSON serializable`` (rc 1) where the run's settings are recorded.
    """
    values = value if isinstance(value, list) else [value]
    for item in values:
        if isinstance(item, list):
            check_no_dates(key, item)
        elif isinstance(item, (datetime.date, datetime.time)):  # datetime is a date
            raise ValueError(
                f"{shown_key(key)}: a TOML date or time is no setting (strings, numbers, booleans "
                f"and arrays of them are), got {shown(str(item))}"
            )


def plain_task_params(params: Any) -> Any:
    """``params`` with each value as a run's ``config.toml`` records it; ``ValueError`` if none.

    A path (``os.PathLike``) becomes its text, a NumPy scalar its Python number (``.item()``), a
    tuple a list (inside arrays and tables too). ``None`` and any other value (a set, bytes, an
    object) are refused naming the key: ``to_toml`` wrote them as the text ``"None"`` or the
    object's ``str``, which ``--resume`` then refused for ever. Forty-fifth review of issue 15
    (input 1): ``simulate(load_config(P, {"task-params.data-dir": Path(D)}), out)`` released its
    rounds and ended in ``TypeError: Object of type PosixPath is not JSON serializable`` before
    ``summary.json``; ``numpy.int64`` ended so at the ledger; ``max_examples_per_user = None``
    (the next-word task's no cap) ran, and its ``--resume`` was refused (``"None"`` against the
    ledger's ``null``). Anything not a mapping is left to the task's own refusal.
    """
    if not isinstance(params, Mapping):
        return params
    # forty-seventh review of issue 15 (follow-up outputs 5): a key that is a str subclass (a
    # (str, Enum) member) ran as its value ("seed") and was written to config.toml as its str
    # ("K.SEED = 3", a table K), so --resume was refused for ever: a key is plain text too
    out = {}
    for name, value in params.items():
        if not isinstance(name, str):  # 1, b"seed", None: config_to_toml's TypeError, naming
            # nothing, after RunConfig took it (follow-up outputs 6)
            raise ValueError(
                f"task-params: a parameter's name is text in a run's config.toml, got {shown(name)}"
            )
        name = plain_scalar(name)
        out[name] = _plain(f"task-params.{str(name).replace('_', '-')}", value)
    return out


def _plain(key: str, value: Any) -> Any:
    """One value of :func:`plain_task_params` (``key`` names it in a refusal)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)  # bytes of a bytes path are refused below
    value = plain_scalar(value)
    if isinstance(value, (list, tuple)):
        return [_plain(key, item) for item in value]
    if isinstance(value, Mapping):
        out = {}
        for name, item in value.items():
            if not isinstance(name, str):
                raise ValueError(
                    f"{shown_key(key)}: a table's keys are text in a run's config.toml, got "
                    f"{shown(name)}"
                )
            name = plain_scalar(name)  # a str subclass's key as its text (follow-up outputs 5)
            out[name] = _plain(f"{key}.{name}", item)
        return out
    if value is None:
        raise ValueError(
            f"{shown_key(key)} is None, which a run's config.toml cannot record (TOML has no "
            "None, and --resume and compare read the file back): leave the key out to take the "
            "task's default, or give a value"
        )
    if not isinstance(value, (str, bool, int, float)):
        raise ValueError(
            f"{shown_key(key)} must be a string, number, boolean, array or table (what a run's "
            f"config.toml records), got {type(value).__name__} {shown(value)}"
        )
    return value
