"""Tasks by name: the registry, and tasks by reference (``"package.module:factory"``).

The Flower ClientApp reads ``task`` and ``task-params`` (JSON) from the run config and calls
:func:`build_task`; simulation presets use the same names. A name with a colon is a *reference*,
the way Flower names its apps (``serverapp = "module:app"``): ``"my_project.task:make_task"``
imports ``my_project.task`` and calls its ``make_task`` with the ``[task-params]`` as keywords.
Every process that builds the task imports the module itself (a Ray worker of either engine, the
ServerApp and every ClientApp of a deployment), so the module must be importable there: installed
in that environment, under the working directory the run was started from, or, in a deployment,
inside the app's FAB (``fab-include`` in ``[tool.flwr.app]``; ``docs/TASKS.md``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
import io
import json
import os
import re
import sys
import threading
from collections.abc import Callable
from numbers import Integral

from fedprivopt.core.checks import check_bool
from fedprivopt.core.text import shown
from fedprivopt.models.next_word import StackOverflowNextWordTask
from fedprivopt.models.tag_prediction import StackOverflowTagTask
from fedprivopt.models.task import Task, note_factory
from fedprivopt.models.task_calls import exited, out_of_memory, raised, task_attribute
from fedprivopt.models.toy import ToyClassificationTask

__all__ = [
    "TASK_MEMBERS",
    "build_task",
    "check_task_name",
    "is_reference",
    "register_task",
    "resolve_task",
    "task_defaults",
    "task_names",
    "task_parameters",
]

_REGISTRY: dict[str, Callable[..., Task]] = {
    "stackoverflow-nwp": StackOverflowNextWordTask,
    "stackoverflow-tp": StackOverflowTagTask,
    "toy": ToyClassificationTask,
}

_REGISTERED_BY: dict[str, tuple[Callable[..., Task], str | None]] = {}
"""Name → (factory, the module whose code called :func:`register_task` with it)."""

TASK_MEMBERS = (
    "name",
    "num_users",
    "build_model",
    "user_data",
    "loss",
    "evaluate_data",
    "evaluate",
)
"""What :class:`~fedprivopt.models.task.Task` requires (everything else is optional)."""

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def is_reference(name: object) -> bool:
    """Whether ``name`` is a task reference ``"module:factory"`` rather than a registered name."""
    return isinstance(name, str) and ":" in name


def register_task(name: str, factory: Callable[..., Task], *, replace: bool = False) -> None:
    """Register ``factory`` (called with keyword parameters) under ``name``.

    Raises
    ------
    ValueError
        If ``name`` is empty, contains a colon (the mark of a reference) or is already
        registered and ``replace`` is false, or ``factory`` is not callable.
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"name must be a non-empty string without ':', got {name!r}")
    # twenty-fifth review of issue 15, finding 11: a factory of 5 was registered, and the task
    # then failed when built ('int' object is not callable)
    if not callable(factory):
        raise ValueError(f"factory must be callable, got {shown(factory)}")
    replace = check_bool("replace", replace)
    if name in _REGISTRY and not replace:
        raise ValueError(f"task {name!r} is already registered (pass replace=True to replace it)")
    _REGISTRY[name] = factory
    # the module that registered it, which made a partial of a packaged class (build_task)
    caller = sys._getframe(1).f_globals.get("__name__")
    _REGISTERED_BY[name] = (factory, caller if isinstance(caller, str) else None)


def _own_module(module: object) -> bool:
    """Whether ``module`` is a module name outside fedprivopt (a user's code)."""
    return isinstance(module, str) and module.partition(".")[0] != "fedprivopt"


def task_names() -> tuple[str, ...]:
    """Names of the registered tasks, sorted."""
    return tuple(sorted(_REGISTRY))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Exited(Exception):
    """A module that called ``sys.exit()`` while importing (the text says how)."""


def _import(module_name: str) -> object:
    """Import ``module_name``; the working directory is searched last (as ``python -m`` does).

    What the module writes to stderr while it imports is written after it (warnings included);
    a module that calls ``sys.exit()`` raises :class:`_Exited` instead, quoting the last line
    it wrote (a training script's ``argparse`` usage error, which named fedprivopt's own
    arguments: thirty-fourth review of issue 15, tasks, finding 3).
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # console scripts (fedprivopt, Ray workers) do not search it
    written = io.StringIO()
    try:
        with contextlib.redirect_stderr(written):
            return importlib.import_module(module_name)
    except SystemExit as exc:
        lines = [line for line in written.getvalue().splitlines() if line.strip()]
        written = io.StringIO()  # quoted below rather than written
        after = f" after writing {shown(lines[-1].strip())}" if lines else ""
        raise _Exited(f"{exited(exc)} while importing{after}") from None
    finally:
        if written.getvalue():
            sys.stderr.write(written.getvalue())


def resolve_task(name: str) -> Callable[..., Task]:
    """The factory of ``name``: a registered task's, or the object a reference names.

    Parameters
    ----------
    name : str
        A registered name (:func:`task_names`) or a reference ``"package.module:factory"``
        (``factory`` may be dotted, e.g. ``"pkg.mod:Class.make"``), called with the task's
        parameters as keywords.

    Raises
    ------
    ValueError
        One line naming ``task``: an unknown name, a malformed reference, a module that does not
        import (any exception while importing it), a missing or non-callable object.
    """
    if not is_reference(name):
        try:
            return _REGISTRY[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown task {name!r}; known tasks: {', '.join(task_names())}, or a "
                "reference 'package.module:factory'"
            ) from None
    module_name, _, attr = name.partition(":")
    if not _DOTTED.match(module_name) or not _DOTTED.match(attr):
        raise ValueError(
            f"task {name!r} is not a reference 'package.module:factory' (dotted Python names)"
        )
    try:
        obj: object = _import(module_name)
    except _Exited as exc:
        raise ValueError(
            f"task {name!r}: module {module_name!r} does not import: {exc} (a script's own code "
            'belongs under `if __name__ == "__main__":`)'
        ) from None
    except Exception as exc:  # a user's module may fail in any way while importing
        raise ValueError(
            f"task {name!r}: module {module_name!r} does not import ({_one_line(exc)})"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"task {name!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(
            f"task {name!r}: {attr!r} is not callable ({type(obj).__name__}); it must be a "
            "class or function returning a Task"
        )
    if _is_type_hint(obj):
        # thirty-eighth review of issue 15 (input 1): `--set task=fedprivopt.models.task:Task`
        # (the protocol a task implements) ended in typing's "Protocols cannot be
        # instantiated" traceback, rc 1, as did `typing:Any`
        raise ValueError(
            f"task {name!r}: {attr!r} is a type for annotations (a Protocol or a typing form), "
            "which cannot be called; name a class or function returning a Task (one that has "
            "the members of fedprivopt.models.task.Task)"
        )
    return obj  # type: ignore[return-value]


def _is_type_hint(obj: object) -> bool:
    """Whether ``obj`` is a ``typing.Protocol`` class or a form of ``typing`` (not callable)."""
    if isinstance(obj, type) and getattr(obj, "_is_protocol", False):
        return True
    return getattr(obj, "__module__", None) in ("typing", "typing_extensions")


def check_task_name(name: str) -> None:
    """Raise ``ValueError`` (naming ``task``) unless ``name`` resolves (:func:`resolve_task`)."""
    resolve_task(name)


def task_parameters(name: object) -> tuple[str, ...]:
    """The keyword parameters the factory of task ``name`` takes; ``()`` when unknown.

    For naming them in messages (:func:`fedprivopt.cli_task_errors.name_task_param`): a name
    that does not resolve, or a factory without a signature (a builtin), gives ``()``; nothing
    raises.
    """
    try:
        factory = resolve_task(name)  # type: ignore[arg-type]
        signature = inspect.signature(factory)
    except Exception:  # an unresolved name is reported where the task is built
        return ()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in signature.parameters.values() if p.kind in kinds)


def task_defaults(name: object) -> dict[str, object]:
    """The keyword parameters of task ``name``'s factory that have a default, with it.

    ``{}`` when unknown (a name that does not resolve, a factory without a signature); nothing
    raises. A parameter set to this default builds the task a call without it builds: the
    factory's own signature says so (forty-eighth review of issue 15, compare: a cell made
    without ``task-params.heterogeneity`` was refused as stale against ``--set
    task-params.heterogeneity=0.5``, the toy task's default).
    """
    try:
        factory = resolve_task(name)  # type: ignore[arg-type]
        signature = inspect.signature(factory)
    except Exception:  # an unresolved name is reported where the task is built
        return {}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {
        p.name: p.default
        for p in signature.parameters.values()
        if p.kind in kinds and p.default is not inspect.Parameter.empty
    }


_BUILDING = threading.local()
"""The task names whose factory this thread is running (:func:`build_task`)."""


def factory_text(factory: object) -> str:
    """Which factory a registered name stands for: its qualified name and a partial's arguments.

    Forty-seventh review of issue 15 (api 3): a registered name's record was its module's
    digest alone, so ``register_task("sweep", partial(ToyClassificationTask, seed=seed),
    replace=True)`` in a loop over seeds 3 and 4 (or the name moved to another factory of the
    same module) recorded one identity for other data, which ``resume()`` and ``compare``'s
    reuse accept. Arguments that are JSON values are written as such, paths as text, anything
    else by its type (no address: the text is the same in every process).
    """
    bound = []
    while isinstance(factory, functools.partial):
        args = [_argument_text(a) for a in factory.args]
        keywords = {str(k): _argument_text(v) for k, v in sorted(factory.keywords.items())}
        bound.append(json.dumps([args, keywords], sort_keys=True))
        factory = factory.func
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", None) or type(factory).__qualname__
    return " ".join(
        [f"{module}.{qualname}", *(f"with {b}" for b in reversed(bound)), *_captured(factory)]
    )


def _captured(factory: object) -> list[str]:
    """A function's default arguments and the values its closure holds, as text.

    Forty-seventh review follow-up of issue 15 (ledger 5; a way around api 3): a factory made
    in a loop over seeds 3 and 4, ``register_task("sweep", lambda **p: Task(seed=seed, **p),
    replace=True)`` (or a ``def make(seed=seed)`` there), was recorded as the same
    ``<lambda>`` for both, and ``resume()`` went on with the other seed's data.
    """
    defaults = getattr(factory, "__defaults__", None) or ()
    keywords = getattr(factory, "__kwdefaults__", None) or {}
    parts = []
    if defaults or keywords:
        named = {str(k): _argument_text(v) for k, v in sorted(keywords.items())}
        text = json.dumps([[_argument_text(d) for d in defaults], named], sort_keys=True)
        parts.append(f"defaults {text}")
    cells = []
    for cell in getattr(factory, "__closure__", None) or ():
        try:
            cells.append(_argument_text(cell.cell_contents))
        except ValueError:  # a cell not yet filled
            cells.append("<empty>")
    if cells:
        parts.append(f"closing over {json.dumps(cells, sort_keys=True)}")
    return parts


def _argument_text(value: object) -> object:
    if isinstance(value, os.PathLike):
        return os.fspath(value) if isinstance(os.fspath(value), str) else repr(os.fspath(value))
    try:
        text = json.dumps(value, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return _value_repr(value)
    if len(text) > 256:  # a long value (a list of a user's indices): its digest
        return {"sha256": hashlib.sha256(text.encode()).hexdigest()}
    return value


def _value_repr(value: object) -> str:
    """``repr(value)`` where it is the same in every process (``np.int64(3)``), else its type.

    Forty-seventh review follow-up of issue 15 (ledger 5): ``partial(Task, seed=seed)`` over
    ``numpy.arange`` (numpy integers, no JSON value) was recorded as ``<int64>`` for every seed.
    A repr holding an address (``<... at 0x7f...>``) or of a set (its order varies with the hash
    seed) gives the type, as before.
    """
    kind = f"<{type(value).__qualname__}>"
    if isinstance(value, (set, frozenset)):
        return kind
    try:
        text = repr(value)
    except Exception:  # a repr of one's own that raises
        return kind
    if _ADDRESS.search(text):
        return kind
    if len(text) > 256:
        return f"{kind} sha256:{hashlib.sha256(text.encode()).hexdigest()}"
    return text


_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")


def _partial_modules(name: str, function_module: object) -> object:
    """The modules a ``functools.partial`` factory of task ``name`` is recorded by.

    The module that made the partial (a reference's module; for a registered name the module
    that called :func:`register_task`, forty-third review of issue 15, api 2: a partial of a
    packaged class recorded nothing) and the module of the partial's function when it is one's
    own (forty-second review, api 6). Forty-sixth review (api 2): a partial of a function of
    one's own made in another module (``register_task("mytoy", partial(helper.make, seed=SEED))``
    with ``SEED`` in the registering module) recorded the helper's module only, so an edit of
    ``SEED`` (3 to 4) went unseen by ``resume()`` and ``compare``'s reuse, where docs/TASKS.md
    says a partial is recorded by the module that made it. Returns a module name, a tuple of
    two, or ``None`` (a registered partial of a packaged function, made in fedprivopt).
    """
    if is_reference(name):
        made_by: object = name.partition(":")[0]
    else:
        by = _REGISTERED_BY.get(name, (None, None))
        made_by = by[1] if by[0] is _REGISTRY.get(name) else None
    own = [m for m in dict.fromkeys((function_module, made_by)) if _own_module(m)]
    if len(own) > 1:
        return tuple(own)
    if own:
        return own[0]
    return made_by if is_reference(name) else function_module


class _Recursion(Exception):
    """A factory building its own task again; not a ValueError, so no handler on the way says it."""


def build_task(name: str, **params: object) -> Task:
    """Build the task ``name`` with keyword ``params``.

    Parameters
    ----------
    name : str
        A registered name (see :func:`task_names`), e.g. ``"toy"`` or ``"stackoverflow-tp"``, or
        a reference ``"package.module:factory"`` (:func:`resolve_task`).
    **params
        Keyword parameters of the task's constructor or factory.

    Raises
    ------
    ValueError
        If ``name`` does not resolve (:func:`resolve_task`), a parameter is invalid, or a
        reference's factory returns something that is not a
        :class:`~fedprivopt.models.task.Task` (the message names ``task`` and what is missing).
    """
    factory = resolve_task(name)
    building = _BUILDING.__dict__.setdefault("names", set())
    if name in building:  # the factory builds its own task again: passes its callers' handlers
        raise _Recursion(name)
    building.add(name)
    try:
        task = factory(**params)
    except SystemExit as exc:  # thirty-fourth review of issue 15 (tasks, finding 3)
        raise ValueError(f"task {name!r}: the factory must return a Task; {exited(exc)}") from None
    except (_Recursion, RecursionError):
        # twenty-third review of issue 15: task = "fedprivopt.cli:main" ran the command again
        # from within itself, a RecursionError traceback of 2,991 lines (rc 1)
        raise ValueError(
            f"task {name!r}: the factory builds the task {name!r} again, without end (is it a "
            "task factory? it must return a Task, see fedprivopt.models.task.Task)"
        ) from None
    except (ValueError, TypeError, MemoryError):
        raise  # a parameter's refusal (named by the caller), memory, as they are
    except Exception as exc:
        # thirty-seventh review of issue 15 (the cli reviewer's report): torch's allocator
        # failing in a factory (its RuntimeError) is memory, not the factory's error
        if not is_reference(name) or out_of_memory(exc):
            raise
        # thirty-sixth review of issue 15 (the docs reviewer's report): a factory raising its
        # own exception (a data file gone: OSError, KeyError) ended in a traceback, rc 1
        raise ValueError(f"task {name!r}: the factory raised {raised(exc)}") from None
    finally:
        building.discard(name)
    module, registered = getattr(factory, "__module__", None), factory
    if isinstance(factory, functools.partial):
        # forty-second review of issue 15 (api 6): a partial's module is functools, whose
        # source was recorded in place of the module that made it (a reference's: an edit of
        # its seed in task = "mod:made", made = partial(Task, seed=3), went unseen)
        while isinstance(factory, functools.partial):
            factory = factory.func
        module = _partial_modules(name, getattr(factory, "__module__", None))
    if is_reference(name):  # its module's code is part of the task's (data_identity)
        note_factory(task, module or name.partition(":")[0])
    elif isinstance(module, tuple) or _own_module(module):
        # forty-second review of issue 15 (api 6): a factory registered under a name
        # (register_task("mytoy", make), make in a module of one's own setting a packaged task's
        # data seed) was not recorded, so after an edit of its seed (3 to 4) resume() went on
        # with rounds 2-3 on other data (eval_accuracy 0.67 where the unedited run gives 0.69)
        note_factory(task, module, factory=factory_text(registered))
    if is_reference(name):
        # forty-seventh review of issue 15 (follow-up outputs 4): isinstance(task, Task) reads
        # each member (hasattr): a property raising its own exception (a name read from a file
        # that was gone) was a traceback, rc 1; task_attribute names it
        for member in TASK_MEMBERS:
            task_attribute(task, member)
    if is_reference(name) and not isinstance(task, Task):
        missing = [m for m in TASK_MEMBERS if not hasattr(task, m)]
        what = f"it lacks {', '.join(missing)}" if missing else "it is not one"
        raise ValueError(
            f"task {name!r}: the factory returned {type(task).__name__!r}, not a Task ({what}; see "
            "fedprivopt.models.task.Task)"
        )
    count = getattr(task, "num_users", None)
    if is_reference(name) and (
        isinstance(count, bool) or not isinstance(count, Integral) or count < 1
    ):
        # thirty-first review of issue 15: a task by reference whose num_users was "40" was
        # refused as "population must equal the number of users of task ... (40), got 40"
        raise ValueError(
            f"task {name!r}: the factory's task has num_users = {shown(count)}; it must be an "
            "integer >= 1 (the training users' ids are 0 .. num_users - 1)"
        )
    return task
