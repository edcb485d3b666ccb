"""A task's parameter errors as the config writes them: one line naming ``task-params.KEY``.

A task constructor's ``ValueError`` names its arguments in Python's spelling
(:func:`name_task_param` renames them as the config's keys); a ``TypeError`` of the keywords a
task factory is called with (an unknown, nested, missing or positional-only task parameter, or a
factory that refuses the call) becomes one line (:func:`task_param_error`), while any other
``TypeError``, and any raised outside :func:`~fedprivopt.models.registry.build_task`, stays a bug.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from fedprivopt.core.text import cut_middle, shown

__all__ = ["name_task_param", "task_param_error"]

# ".*": an empty key (`--set task-params.=1`, `"" = 1` in [task-params]) ended in the task's
# TypeError traceback, rc 1 (twenty-eighth review of issue 15)
_UNKNOWN_KWARG = re.compile(r"\(\) got an unexpected keyword argument '(?P<key>.*)'\Z")


def name_task_param(message: str, params: dict, names: Iterable[str] = ()) -> str:
    """Name the task parameters in ``message`` as the config writes them.

    A task constructor's error starts with its argument's name (``train_bias must ...``,
    ``examples_per_user=...``); it becomes the key of the config (``task-params.train-bias must
    ...``). Other messages are returned unchanged.

    Parameters
    ----------
    message : str
        The task's error.
    params : dict
        The task parameters the config gives (snake case).
    names : iterable of str
        Every parameter the task takes (:func:`~fedprivopt.models.registry.task_parameters`),
        so that one the config leaves at its default is named too.

    Thirty-first review of issue 15: only the leading name was renamed, and only when the config
    gave it: ``--set task-params.num-classes=3000000`` on the toy task was refused as ``dim *
    num_classes must be at most ...`` (neither a key of the config), and ``task-params.dim=...
    must be at most ... with num_classes=2, examples_per_user=(5, 40)`` named the others in
    Python's spelling. Once the message leads with a task parameter, every other one it names
    as ``NAME=``, beside ``*``, or with an underscore (no English word) is renamed too.
    """
    known = sorted(set(params) | set(names), key=len, reverse=True)
    if not known or not message.startswith(tuple(f"{k}{end}" for k in known for end in " =")):
        return message
    words = "|".join(re.escape(key) for key in known)
    found = re.compile(rf"(?<![\w.\-/'\"])({words})(?=[ =,)*;:]|\Z)")

    def rename(match: re.Match) -> str:
        key, start, end = match[1], match.start(), match.end()
        if (
            start == 0
            or "_" in key
            or message.startswith(("=", " * "), end)
            or (message[max(start - 3, 0) : start] == " * ")
        ):
            return f"task-params.{key.replace('_', '-')}"
        return key

    # forty-first review of issue 15 (input 6): --set task-params.num-users=None was refused as
    # 'must be an integer in [1, 100000000] or None, got 'None'' (TOML has no None). Its
    # follow-up (outputs 4): 'or left out of the configuration' told stackoverflow-nwp's
    # max-examples-per-user (None: no cap) to be left out, which gives its default, 1000
    none = (
        " (None from Python only: TOML has no None, and a key left out takes the task's "
        "default), got "
    )
    return found.sub(rename, message).replace(" or None, got ", none, 1)


def task_param_error(exc: TypeError) -> str | None:
    """The message for a task constructor's unknown or missing keyword argument, else ``None``.

    An unknown or nested ``task-params`` key reaches the constructor as a keyword it does not
    take; any other ``TypeError``, and any raised outside
    :func:`~fedprivopt.models.registry.build_task`, is a bug and gives ``None`` (the caller
    re-raises it). Raised
    while the task is built (:func:`~fedprivopt.models.registry.build_task`), also a key named
    ``self`` (``got multiple values``) or one the task takes only by position, and a parameter
    the task requires that the config does not give (a task by reference's factory
    ``make(foo)``): these ended in a traceback, rc 1 (twenty-eighth review of issue 15).
    """
    text = str(exc)
    if not _while_building_a_task(exc):
        # thirty-fifth review of issue 15 (found by the data and lifecycle reviewers): a bug's
        # "unexpected keyword argument 'frozen'" in building the server algorithm was reported
        # as "unknown key 'task-params.frozen'", blaming the user's config for the code's bug
        return None
    match = _UNKNOWN_KWARG.search(text)
    if match is None:
        match = _TWICE_KWARG.search(text) or _POSITIONAL_ONLY.search(text)
        missing = _MISSING_ARGS.search(text)
        if missing is not None:
            keys = [key.replace("_", "-") for key in re.findall(r"'([^']*)'", missing["keys"])]
            named = ", ".join(shown(f"task-params.{key}") for key in keys)
            return f"the task requires {named}, which the config does not give"
    if match is None:
        return _call_refused(exc) or _raised_in_factory(exc)
    key = match.group("key").replace("_", "-")
    return f"unknown key {shown(f'task-params.{key}')}: {_not_a_parameter(exc, match['key'])}"


def _not_a_parameter(exc: TypeError, key: str) -> str:
    """Why ``key`` is no parameter of the task being built, naming the task and its parameters.

    Forty-sixth review of issue 15 (input 3): ``simulate stackoverflow-tp-mini.toml --set
    task=toy`` (a preset's task switched on the command line, its ``[task-params]`` kept) was
    refused as ``unknown key 'task-params.data-dir': not a parameter of the task (task
    parameters are plain values, not tables)``: a plain value told it is a table, and neither
    the task nor the keys it takes named. The table remark stays for a dotted key (a table
    under ``task-params`` reaches the task so: ``--set 'task-params.dim={a=1}'``).
    """
    from fedprivopt.models.registry import task_parameters

    name = None
    tb = exc.__traceback__
    while tb is not None:
        if _is_build_task(tb.tb_frame.f_code):
            name = tb.tb_frame.f_locals.get("name")
        tb = tb.tb_next
    # a table under task-params reaches the task as a dotted keyword (task-params.dim.a)
    table = "plain values, not tables" if "." in key else ""
    names = sorted(p.replace("_", "-") for p in task_parameters(name))
    if not isinstance(name, str) or not names:
        return "not a parameter of the task" + (f" (task parameters are {table})" * bool(table))
    known = ", ".join(cut_middle(n) for n in names[:_LISTED])
    more = f" and {len(names) - _LISTED:,} more" if len(names) > _LISTED else ""
    table = f"; they are {table}" if table else ""
    return f"not a parameter of task {shown(name)} (its parameters: {known}{more}{table})"


_LISTED = 30
"""Parameters of a task its unknown key's message lists at most (the packaged take 7-21)."""


_TWICE_KWARG = re.compile(r"\(\) got multiple values for argument '(?P<key>.*)'\Z")
_POSITIONAL_ONLY = re.compile(
    r"\(\) got some positional-only arguments passed as keyword arguments: '(?P<key>[^']*)'"
)
_MISSING_ARGS = re.compile(
    r"\(\) missing \d+ required (?:positional|keyword-only) arguments?: (?P<keys>.*)\Z"
)


def _call_refused(exc: TypeError) -> str | None:
    """The message for a task factory that refused the call itself, else ``None``.

    Thirty-first review of issue 15: ``--set task=builtins:print`` (or ``os:system``, any
    factory written in C) ended in ``TypeError: 'num_users' is an invalid keyword argument for
    print()``, a traceback with rc 1: a builtin's refusal of a keyword matches none of the
    messages above. A ``TypeError`` whose traceback ends in ``build_task`` itself was raised by
    the call of the factory, before any code of it ran: the config's task parameters do not fit
    it. One raised inside the factory's code is a bug and gives ``None``.
    """
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or not _is_build_task(tb.tb_frame.f_code):
        return None
    name, params = tb.tb_frame.f_locals.get("name"), tb.tb_frame.f_locals.get("params") or {}
    keys = ", ".join(f"task-params.{key.replace('_', '-')}" for key in params) or "none"
    return (
        f"task {shown(name)} cannot be called with the config's task parameters "
        f"({cut_middle(keys)}): {cut_middle(str(exc))}"
    )


def _raised_in_factory(exc: TypeError) -> str:
    """The message for a ``TypeError`` raised inside a task factory's own code.

    Forty-second review of issue 15 (lead 6, the docs reviewer's open row): a factory of one's
    own whose code raised ``TypeError`` (a bug in it) ended in a traceback, rc 1, where
    docs/TASKS.md promises one line and rc 2 for a task's exceptions (a ``TypeError`` of
    ``build_model``, ``user_data``, ``loss`` or ``evaluate``, and any other exception of the
    factory, were one line already). Named as :func:`~fedprivopt.models.registry.build_task`
    names the factory's other exceptions.
    """
    from fedprivopt.models.task_calls import raised

    tb, name = exc.__traceback__, None
    while tb is not None and name is None:
        if _is_build_task(tb.tb_frame.f_code):
            name = tb.tb_frame.f_locals.get("name")
        tb = tb.tb_next
    return f"task {shown(str(name))}: the factory raised {cut_middle(raised(exc))}"


def _is_build_task(code) -> bool:
    """Whether ``code`` is ``models.registry.build_task``'s."""
    return code.co_name == "build_task" and code.co_filename.endswith(
        os.path.join("models", "registry.py")
    )


def _while_building_a_task(exc: BaseException) -> bool:
    """Whether ``exc`` was raised within ``models.registry.build_task`` (the task's factory)."""
    tb = exc.__traceback__
    while tb is not None:
        if _is_build_task(tb.tb_frame.f_code):
            return True
        tb = tb.tb_next
    return False
