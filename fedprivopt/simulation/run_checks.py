"""The checks of a run's inputs, made before anything of the run is written.

:func:`run_dir_argument` and :func:`check_config` check the arguments of
:func:`~fedprivopt.simulation.run.simulate` and :func:`~fedprivopt.simulation.run.resume`;
:func:`check_task_dirs_outside` the task's directories against the run directory;
:func:`check_config_file` and :func:`check_writable` a directory to resume;
:func:`initial_model` the task's ``build_model()`` and :func:`private_strategy` the strategy over
the private population, for :func:`~fedprivopt.simulation.run.build_run`.

Split from :mod:`fedprivopt.simulation.run`.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from pathlib import Path

import torch

from fedprivopt.core.files import real_path, url_refusal
from fedprivopt.core.text import shown
from fedprivopt.data.token_cache import CACHE_DIR
from fedprivopt.models.registry import is_reference, resolve_task
from fedprivopt.models.task import Task, refuse_unbuilt_model
from fedprivopt.models.task_calls import task_call
from fedprivopt.simulation.config import RunConfig
from fedprivopt.simulation.files import CONFIG_FILE
from fedprivopt.strategies.config import StrategyConfig

__all__ = [
    "check_config",
    "check_config_file",
    "check_new_run_name",
    "check_task_dirs_outside",
    "check_writable",
    "initial_model",
    "private_strategy",
    "run_dir_argument",
]


def run_dir_argument(name: str, value: object) -> Path:
    """A run directory given to ``run.simulate`` or ``run.resume``, as a ``Path``.

    Twenty-fifth review of issue 15, finding 14: ``simulate(config, "")`` wrote the run into the
    working directory and ``resume("")`` resumed it (the command line refuses ``--out ""`` and
    ``--resume ""``; the functions did not), and ``None`` or ``5`` raised ``os.fspath``'s
    ``TypeError`` naming nothing.
    """
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise ValueError(f"{name} must be a non-empty path, got {value!r}"[:200])
    refused = url_refusal(name, value)  # forty-third review of issue 15 (lead 2): ./s3:/b/r
    if refused is not None:
        raise ValueError(refused)
    return Path(value)


def check_new_run_name(name: str, out: Path) -> None:
    r"""Refuse a new run directory whose path holds a control character or a blank component.

    Forty-eighth review of issue 15 (overwrite 5): ``simulate(config, "R\n")`` (a line break
    pasted along) and ``simulate(config, " ")`` wrote the run into a directory named by a line
    break or blanks (rc 0), where ``simulate --out`` and the deployment's ``out`` refuse both
    (:func:`~fedprivopt.deploy.runconfig.check_run_out`).
    """
    text = os.fspath(out)
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        what = "the path holds a control character (a line break?)"
        raise ValueError(f"{name}: {what}: {shown(text)}")
    if any(not part.strip() for part in out.parts):
        raise ValueError(f"{name}: a path component is blank: {shown(text)}")


def check_config(config: object) -> None:
    """Raise ``ValueError`` unless ``config`` is a :class:`RunConfig`."""
    if not isinstance(config, RunConfig):
        raise ValueError(
            f"config must be a RunConfig (simulation.config.load_config), got "
            f"{type(config).__name__}"
        )


def initial_model(task: Task) -> torch.nn.Module:
    """``task.build_model()``, checked: a module of initialized tensors on the CPU.

    Thirty-fourth review of issue 15 (the tasks reviewer's report): a model built on the
    ``meta`` device or with a lazy module (``torch.nn.LazyLinear``) ended in a traceback (rc 1:
    ``Tensor.item() cannot be called on meta tensors``, ``Can't access the shape of an
    uninitialized parameter``), and ``sys.exit(0)`` in ``build_model()`` in rc 0 and no line.
    Its own exception (a weights file gone) is one line naming it (thirty-sixth review, the
    tasks reviewer's report: a 29-line traceback, rc 1).
    """
    name = f"{type(task).__name__}.build_model()"
    with task_call(name, f"{name} must return"):
        model = task.build_model()
    # thirty-second review of issue 15: a traceback for a model of another kind; forty-fourth
    # (the api reviewer's open row): a dict from a module's get_extra_state(), rc 1; a lazy or
    # non-CPU tensor in torch's errors. One check with LocalTrainer's (forty-sixth, api 3)
    refuse_unbuilt_model(model, task, cpu_only=True)
    return model


def private_strategy(strategy: StrategyConfig, private: int, public: int) -> StrategyConfig:
    """``strategy`` over the private population of ``private`` users (``public`` left out).

    A setting that does not fit it is refused naming that population (thirty-third review of
    issue 15, optim reviewer's note: ``min-shares = 20`` with 30 of 40 users public said
    ``min-shares must be in [0, population = 10]``, the preset's population being 40).
    """
    try:
        return dataclasses.replace(strategy, population=private)
    except ValueError as exc:
        raise ValueError(
            f"{exc} (population here is the private population: {strategy.population} users "
            f"less the {public} public users of side-information.users)"
        ) from None


def check_task_dirs_outside(config: RunConfig, out_dir: str | Path) -> None:
    """Refuse a task whose ``data-dir`` or ``cache-dir`` is the run directory or inside it.

    A run's directory holds its own files only. Twenty-second review of issue 15: a token store
    in ``cache-dir = <out>/cache`` was written into the run (rc 0), and its ``--overwrite`` was
    then refused for holding files that are not the run's; a ``data-dir`` there was generated
    first, then refused as "not empty". ``ValueError`` naming the key, before anything is
    written.

    Thirty-eighth review of issue 15 (rundirs): with ``token-cache = true`` and no
    ``cache-dir`` the store goes to ``<data-dir>/.fedprivopt-cache``, which was not checked:
    ``--out D/.fedprivopt-cache`` wrote the token store into the run (rc 0). That default is
    checked as ``cache-dir``.
    """
    run = real_path(out_dir)
    for key, value, given in _task_dirs(config.task_params):
        where = real_path(value)
        if where == run or where.is_relative_to(run):
            raise ValueError(
                f"task-params.{key.replace('_', '-')} = {given} is inside "
                f"{str(out_dir)!r}, the directory the run writes (--out), which holds only its "
                "own files; choose a directory outside it"
            )


def _task_dirs(params: dict) -> list[tuple[str, str | os.PathLike, str]]:
    """The task's directories as ``(key, path, how it is named)``, the default cache's too."""
    given = {
        key: value
        for key in ("data_dir", "cache_dir")
        if isinstance(value := params.get(key), (str, os.PathLike)) and str(value)
    }
    found = [(key, value, repr(str(value))) for key, value in given.items()]
    if params.get("token_cache") is True and "data_dir" in given and not params.get("cache_dir"):
        default = Path(given["data_dir"]) / CACHE_DIR
        found.append(("cache_dir", default, f"{str(default)!r} (its default with token-cache)"))
    return found


def check_writable(out: Path) -> None:
    """Raise ``ValueError`` naming run directory ``out`` when this user cannot write in it.

    Thirty-seventh review of issue 15 (cli, finding 4; the environment reviewer's report):
    ``--resume R`` of a directory its user may not write (``chmod -R a-w``, a copy of another
    account's run) said ``R/summary.json: Permission denied``, a file, after the lock was taken.
    """
    if os.access(out, os.W_OK | os.X_OK):
        return
    from fedprivopt.core.files import on_read_only_fs

    why = "read-only file system" if on_read_only_fs(out) else "permission denied"
    raise ValueError(
        f"--resume directory {str(out)!r} cannot be written by this user ({why}): a resumed "
        "run writes its checkpoint, rows and summary there; copy it to a directory you may "
        "write, or make it writable"
    )


def check_config_file(out: Path) -> None:
    """Raise ``ValueError`` unless run directory ``out`` holds its ``config.toml`` as a file.

    Thirty-fifth review of issue 15 (lifecycle, finding 4): a ``config.toml`` that was a
    directory or a dangling symbolic link was reported as missing (``has no config.toml``) beside
    the name ``ls`` shows, and a ``--resume`` path that does not exist as a directory without
    one.
    """
    path = out / CONFIG_FILE
    if path.is_file():
        return
    if path.is_dir():
        what = f": its {CONFIG_FILE} is a directory, not the run's configuration file"
    elif os.path.islink(path):
        target = os.readlink(path)
        what = f": its {CONFIG_FILE} is a symbolic link to {target!r}, which does not exist"
    else:
        what = f" has no {CONFIG_FILE}"
    raise ValueError(f"--resume directory {str(out)!r}{what}"[:400])


_PLAIN = (bool, int, float, str)


def refuse_other_task_parameters(config: RunConfig, task: Task) -> None:
    """``ValueError`` when a package task given to a run was built with other parameters.

    ``simulate(config, out, task=...)`` takes a task built before from ``config``'s ``task`` and
    ``task-params`` (data read once for several runs). Forty-seventh review of issue 15 (api,
    open for the lead): a toy task built with ``seed = 7`` beside a config of ``task-params.seed
    = 0`` trained and evaluated round 1 on seed 7's data while ``config.toml`` and the ledger
    recorded seed 0, and ``resume()`` went on with seed 0's task: one run of two datasets. For
    the package's own tasks, each seed parameter the factory takes (``seed``, ``*_seed``: the
    config's value, else the factory's default) is compared with the task's attribute of that
    name. Other parameters are not: a task may keep a value derived from its data under a
    parameter's name (``stackoverflow-tp`` keeps the 455 tags its data has where 500 were
    asked). A task of one's own (a reference or a registered factory of another module) is
    trusted: its attributes need not mirror its parameters.
    """
    if is_reference(config.task) or not type(task).__module__.startswith("fedprivopt."):
        return
    try:
        signature = inspect.signature(resolve_task(config.task))
    except (TypeError, ValueError):
        return
    wanted = {p.name: p.default for p in signature.parameters.values() if p.default is not p.empty}
    wanted.update({k.replace("-", "_"): v for k, v in config.task_params.items()})
    own = getattr(task, "__dict__", {})
    for name, value in wanted.items():
        if name != "seed" and not name.endswith("_seed"):
            continue
        have = own.get(name)
        if type(have) not in _PLAIN or type(value) not in _PLAIN:
            continue
        if isinstance(have, bool) != isinstance(value, bool) or have != value:
            key = "task-params." + name.replace("_", "-")
            raise ValueError(
                f"{key}: the task given was built with {name} = {have!r}, the config's "
                f"{config.task!r} with {value!r}; give a task built from the config's task and "
                "task-params, or none"
            )
