"""The command line's ``simulate``, and what every command that runs a preset shares.

:func:`load_preset` and :func:`build_checked_run` turn a bad preset, ``--set`` or task parameter
into a :class:`~fedprivopt.cli_args.UsageError` naming it, before anything is written;
:func:`set_overrides` reads ``--set`` and the shorthand flags, and :func:`note_unused` says which
strategies ignore keys that are set (``simulate``, ``compare``, ``tune``, ``deploy local``).
``simulate`` is :func:`cmd_simulate`, its argument parsing :func:`add_simulate`; ``compare`` is
:mod:`fedprivopt.cli_compare`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from fedprivopt.cli_args import (
    MAX_SEED,
    SEED,
    HelpFormatter,
    UsageError,
    check_out_dir,
    check_path_text,
    int_at_least,
    preset_path,
    shown,
)
from fedprivopt.cli_task_errors import name_task_param, task_param_error
from fedprivopt.core.text import epsilon_text

__all__ = [
    "add_simulate",
    "build_checked_run",
    "cmd_simulate",
    "load_preset",
    "note_unused",
    "refuse_ray_temp_inside",
    "refuse_table_against_flags",
    "set_overrides",
    "values_differ",
]


def build_checked_run(config, where: str = "config", task=None, out=None):
    """``build_run(config, task)``; bad settings and unknown task parameters are usage errors.

    ``out``: the command's ``--out``; a task ``data-dir`` or ``cache-dir`` inside it is refused
    before the task is built (which may generate data there).
    """
    from fedprivopt.simulation.cluster_config import check_cluster_config
    from fedprivopt.simulation.run import build_run, check_task_dirs_outside

    with task_errors(where, config.task_params, config.task, every_value_error=True):
        if out is not None:
            check_task_dirs_outside(config, out)
            check_cluster_config(config)  # a relative data-dir when joining (45th review, lead 2)
    if out is not None:
        refuse_ray_temp_inside(config, out, "--out")
    with task_errors(where, config.task_params, config.task, every_value_error=True):
        return build_run(config, task)


def refuse_ray_temp_inside(config, out, flag: str) -> None:
    """Refuse a run that starts Ray while Ray's temporary directory is ``out`` or inside it.

    Ray writes its session (logs, sockets, spilled objects) under ``RAY_TMPDIR`` if set (set
    empty: the working directory), else ``TMPDIR`` on Linux. Thirty-eighth review of issue 15
    (rundirs 5): ``TMPDIR=R simulate toy.toml --engine flower --out R`` (also a comparison's or
    tuning's ``--out``, and ``--resume R``) ran (rc 0) and left Ray's ``ray/`` session
    directory (276 kB of logs and sockets) among the run's files, after which the directory held
    files that are not a run's (``simulate --out R`` and a cell's ``--overwrite`` refused it).
    ``flag`` (``--out`` or ``--resume``) is named in the :class:`UsageError`, before anything
    is written. A run that joins a Ray cluster (``ray-address``) starts no local Ray and passes.
    """
    if config.engine != "flower" and not config.fast_actors:
        return
    if config.ray_address:
        return
    names = ("RAY_TMPDIR", "TMPDIR") if sys.platform.startswith("linux") else ("RAY_TMPDIR",)
    # Ray's own choice: a variable set, even to '' (ray._common.utils.get_default_system_temp_dir)
    # (follow-up of the thirty-eighth review, rundirs 1: RAY_TMPDIR='' was passed over for
    # TMPDIR, while Ray wrote ./ray into the working directory, --out .)
    name = next((n for n in names if n in os.environ), None)
    if name is None:
        return
    value = os.environ[name]
    base, run = _real(os.path.expanduser(value) or os.curdir), _real(out)
    if base == run or run in base.parents:
        where = " (empty: the working directory)" if not value else ""
        raise UsageError(
            f"argument {flag}: {shown(str(out))} holds {name} = {shown(value)}{where}, where "
            "Ray, which this run starts, writes its session files (logs, sockets): a run's "
            f"directory holds its own files only; set {name} to a directory outside it"
        )


@contextlib.contextmanager
def task_errors(where: str, params: dict, task: object, *, every_value_error: bool):
    """A task parameter's error inside the block is a usage error led by ``where``, naming it.

    A ``ValueError`` names the parameters of ``task`` (the config's ``task``, ``None`` when
    unknown) as the config writes them (``task-params.KEY``: :func:`name_task_param`); with
    ``every_value_error`` false one that names no task parameter goes on as it was. A
    ``TypeError`` of a task constructor's keywords (:func:`task_param_error`) is one line; any
    other is a bug and goes on.
    """
    try:
        yield
    except ValueError as exc:
        from fedprivopt.models.registry import task_parameters

        named = name_task_param(str(exc), params, task_parameters(task))
        if not every_value_error and named == str(exc):
            raise
        raise UsageError(f"{where}: {named}") from None
    except TypeError as exc:
        message = task_param_error(exc)
        if message is None:
            raise
        raise UsageError(f"{where}: {message}") from None


def load_preset(path: str | os.PathLike, overrides: dict | None = None, where: str = "config"):
    """``load_config``; an unreadable or too deeply nested file is a usage error naming it."""
    from fedprivopt.simulation.config import load_config

    try:
        return load_config(path, overrides)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from None
    except RecursionError:
        raise UsageError(f"{where}: config file {str(path)!r} is nested too deeply") from None
    except OSError as exc:
        raise UsageError(
            f"{where}: config file {str(path)!r} cannot be read: {exc.strerror or exc}"
        ) from None


_FLAG_KEYS = (
    ("strategy", "strategy"),
    ("engine", "engine"),
    ("rounds", "num-server-rounds"),
    ("seed", "seed"),
    ("tensorboard", "tensorboard"),
)
"""The shorthand flags and the preset key each sets."""


def set_overrides(args: argparse.Namespace) -> dict:
    """The preset overrides of ``--set KEY=VALUE`` and the shorthand flags (``--rounds``, ...)."""
    from fedprivopt.simulation.config_presets import parse_override
    from fedprivopt.simulation.tune_grid import empty_table_error, sets_nothing

    out = {}
    for text in args.set or []:
        try:
            key, value = parse_override(text)
        except ValueError as exc:
            raise UsageError(f"argument --set: {exc}") from None
        except RecursionError:
            raise UsageError(f"argument --set: {shown(text)} is nested too deeply") from None
        if sets_nothing(value):  # silently dropped (nineteenth review of issue 15, finding 1)
            raise UsageError(empty_table_error("--set", key, value))
        if key in out and values_differ(out[key], value):  # the last would silently win
            merged = _merged_tables(out[key], value)
            if merged is None:
                raise UsageError(
                    f"argument --set: {key}={value!r} contradicts an earlier --set {key}="
                    f"{out[key]!r}; give one of them"
                )
            value = merged
        out[key] = value
    for flag, key in _FLAG_KEYS:
        value = getattr(args, flag, None)
        if value is None:
            continue
        if key in out and values_differ(out[key], value):  # the shorthand would silently win
            raise UsageError(
                f"argument --{flag}: {value!r} contradicts --set {key}={out[key]!r}; "
                "give one of them"
            )
        out[key] = value
    return out


def values_differ(old: object, new: object) -> bool:
    """Whether two values of one key differ, a boolean never equal to a number.

    Forty-third review of issue 15 (input 6): ``--seed 1 --set seed=true`` (also
    ``--tensorboard --set tensorboard=1``, ``--set seed=1 --set seed=true``) was not a
    contradiction, since ``True == 1`` in Python: the value the key refuses was dropped
    silently, and the other one used.

    Forty-seventh review of issue 15 (sameness 2): inside a table or an array too (``--set
    'strategies.dp-fedavg={seed=true}' --set 'strategies.dp-fedavg={seed=1}'``, ``--set
    'task-params={seed=1}' --set 'task-params={seed=true}'``, ``[true]`` and ``[1]``): the
    tables were compared with ``!=``, so the last one silently won (seed 1, rc 0, where the
    refused ``seed=true`` alone is refused).
    """
    if isinstance(old, dict) and isinstance(new, dict):
        return old.keys() != new.keys() or any(values_differ(old[k], new[k]) for k in old)
    if isinstance(old, list) and isinstance(new, list):
        return len(old) != len(new) or any(
            values_differ(a, b) for a, b in zip(old, new, strict=False)
        )
    return old != new or isinstance(old, bool) != isinstance(new, bool)


def _merged_tables(old: object, new: object) -> dict | None:
    """Two ``--set`` tables of one key as one, else ``None`` where a key of both differs.

    Thirty-fifth review of issue 15 (found by the lifecycle reviewer): ``--set
    'task-params={seed=1}' --set 'task-params={num-users=40}'`` was refused as contradicting,
    though the two set different keys (as ``--set task-params.seed=1 --set
    task-params.num-users=40`` do).
    """
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return None
    out = dict(old)
    for key, value in new.items():
        if key in out and values_differ(out[key], value):
            value = _merged_tables(out[key], value)
            if value is None:
                return None
        out[key] = value
    return out


def refuse_table_against_flags(args: argparse.Namespace, sets: dict, strategy: str) -> None:
    """Refuse ``--set strategies.S.KEY=V`` of the run's strategy ``S`` beside ``KEY``'s flag.

    Twenty-ninth review of issue 15: ``simulate toy.toml --strategy fedavg --rounds 1 --set
    strategies.fedavg.num-server-rounds=3`` (also ``--set num-server-rounds=1``, ``--engine``,
    ``--seed``; and in ``tune``) ran 3 rounds: the strategy's table is applied over the other
    overrides, so the flag, the one run's setting, silently lost where ``--set
    num-server-rounds=3`` beside it is refused. ``compare`` is left alone: there a table of
    one strategy beside a flag or ``--set`` for all is an exception for that strategy (as
    ``--tune-grid S:KEY`` replaces an unprefixed ``KEY``), and each row shows its settings.
    """
    from fedprivopt.simulation.config_presets import flat_overrides

    flags = {key: f"--{flag}" for flag, key in _FLAG_KEYS if getattr(args, flag, None) is not None}
    try:
        flat = flat_overrides(sets)
    except ValueError as exc:
        raise UsageError(f"argument --set: {exc}") from None
    typed = {_kind_key(key, value): key for key, value in flat.items()}
    flat = {_kind_key(key, value): value for key, value in flat.items()}
    prefix = f"strategies.{strategy}."
    for key, value in flat.items():
        name = key.removeprefix(prefix)
        # a boolean is no number here either (forty-seventh review of issue 15, input 4:
        # --set seed=true beside strategies.dp-fedavg.seed=1 ran seed 1, rc 0)
        if name == key or name not in flat or not values_differ(flat[name], value):
            continue
        other, key = flat[name], typed[key]
        name = typed[name]
        source = f"{flags[name]} {other!r}" if name in flags else f"--set {name}={other!r}"
        raise UsageError(
            f"argument --set: {key}={value!r} contradicts {source}, which it would silently "
            f"override for {strategy}; give one of them"
        )


def _kind_key(key: str, value: object) -> str:
    """``key``, or ``<key>.kind`` for the string form of the side information (its kind).

    Forty-seventh review of issue 15 (input 2): ``simulate toy.toml --strategy adadps --set
    side-information=ones --set strategies.adadps.side-information.kind=public-users`` (or the
    two spellings the other way round) ran, rc 0, with public users (user 0's data outside the
    guarantee) where ``ones`` was asked: the spellings were compared as two keys.
    """
    from fedprivopt.models.side_information_config import KEY

    if isinstance(value, str) and (key == KEY or key.endswith(f".{KEY}")):
        return f"{key}.kind"
    return key


def _real(path: str | os.PathLike) -> Path:
    """``path`` absolute, its links resolved where they can be (a loop: as written)."""
    try:
        return Path(path).absolute().resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symbolic-link loop (Python 3.11)
        return Path(os.path.abspath(path))


# -- simulate ----------------------------------------------------------------------------------


def cmd_simulate(args: argparse.Namespace) -> int:
    """``fedprivopt simulate``: one run with metrics, summary and checkpoints."""
    from fedprivopt.simulation.files import CONFIG_FILE
    from fedprivopt.simulation.run import resume, simulate

    if args.resume is not None:
        if (
            args.config is not None
            or args.set
            or any(
                getattr(args, f) is not None
                for f in ("strategy", "engine", "rounds", "seed", "out", "tensorboard")
            )
        ):
            raise UsageError(
                "argument --resume: give only the run directory (its config.toml "
                "is the configuration)"
            )
        # the paths as checked, "~" expanded (twenty-fifth review of issue 15, finding 9:
        # simulate --out "~/x" created a directory named "~" where compare, tune and data
        # synth wrote into the home directory, and --resume "~/x" looked for "./~/x")
        run_dir = check_path_text(args.resume, "--resume")
        stored = run_dir / CONFIG_FILE
        params, task = {}, None
        if stored.is_file():  # unreadable or nested too deeply
            stored_config = load_preset(stored, where="argument --resume")
            params, task = stored_config.task_params, stored_config.task
            from fedprivopt.simulation.engines import check_flower_resources

            try:  # this machine's devices and CPUs: the line names the file that asks for them
                check_flower_resources(stored_config)
            except ValueError as exc:  # (thirty-fifth review of issue 15, the lifecycle reviewer)
                raise UsageError(f"{stored}: {exc}") from None
            refuse_ray_temp_inside(stored_config, run_dir, "--resume")
        outcome = _resume_checked(resume, run_dir, stored, params, task, progress=not args.quiet)
    else:
        if args.config is None:
            raise UsageError("argument CONFIG: a preset file is required (or --resume DIR)")
        out = check_out_dir(args.out) if args.out is not None else None
        sets = set_overrides(args)
        config = load_preset(args.config, sets)
        refuse_table_against_flags(args, sets, config.strategy.strategy)
        note_unused([config])  # a shared preset's other knobs, or a mistake
        if out is None:  # named by an error creating it, as a given --out is
            out = check_out_dir(f"runs/{config.strategy.strategy}-seed{config.strategy.seed}")
            args.out = str(out)
        # validates everything before anything is written
        task, _ = build_checked_run(config, out=out)
        outcome = simulate(config, out, progress=not args.quiet, task=task)
    final = outcome.rows[-1] if outcome.rows else {}
    metric = next((k for k in (outcome.metric, "eval_loss") if k in final), None)
    shown = f", {metric} = {final[metric]:.4f}" if metric else ""
    print(
        f"{outcome.rounds_completed} rounds ({outcome.stopped_reason}){shown}, "
        f"epsilon = {epsilon_text(outcome.epsilon)}; results in {outcome.out_dir}"
    )
    if outcome.diverged is not None:  # its final metrics describe an overflowed model
        from fedprivopt.simulation.divergence import warning_line

        print(warning_line(outcome.diverged, metric), file=sys.stderr)
    return 0


def _resume_checked(resume, run_dir, stored, params: dict, task, *, progress: bool):
    """``resume(run_dir)``; a bad task parameter in ``stored`` is a usage error naming it.

    Twenty-seventh review of issue 15: ``cache_dir = "/x"`` (or ``token_cache = true``) added
    under ``[task-params]`` of a run's ``config.toml`` passes the ledger check (a key that only
    says where data lives is not privacy-relevant), and ``simulate --resume`` ended in the
    task's ``TypeError: ... unexpected keyword argument 'cache_dir'`` traceback, rc 1; a bad
    value of such a key (``data_dir = 5``) was one line that named neither the file nor the
    key (``data_dir must be a non-empty path, got 5``). As :func:`build_checked_run` does, the
    message names the key (``params``: the stored ``[task-params]``), prefixed with the file.
    """
    with task_errors(str(stored), params, task, every_value_error=False):
        return resume(run_dir, progress=progress)


def add_simulate(sub) -> None:
    """Add ``simulate`` to the subcommands ``sub``."""
    from fedprivopt.simulation.config import ENGINES
    from fedprivopt.strategies.config import STRATEGIES

    p = sub.add_parser(
        "simulate",
        help="simulate federated training of one strategy",
        description="Run one federated simulation from a preset (TOML) and write metrics.jsonl, "
        "privacy_ledger.jsonl (the rounds released and what each cost), "
        "summary.json, config.toml and checkpoints to the output directory.",
        epilog="examples:\n"
        "  fedprivopt simulate simulations/toy.toml --strategy dp-fedadam --rounds 20\n"
        "  fedprivopt simulate simulations/toy.toml --set noise-multiplier=0.8 --out runs/a\n"
        "  fedprivopt simulate --resume runs/a",
        formatter_class=HelpFormatter,
    )
    p.add_argument("config", nargs="?", type=preset_path, metavar="CONFIG", help="preset TOML file")
    p.add_argument("--strategy", choices=STRATEGIES, help="override the preset's strategy")
    p.add_argument("--engine", choices=ENGINES, help="fast (in process) or flower (Ray)")
    p.add_argument("--rounds", type=int_at_least(1), metavar="R", help="num-server-rounds")
    p.add_argument("--seed", type=SEED, metavar="S", help=f"root seed, in [0, {MAX_SEED}]")
    p.add_argument("--out", metavar="DIR", help="run directory (default runs/<strategy>-seed<S>)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        # twenty-ninth review of issue 15: the example was --set task-params.num-users=50,
        # which every preset refuses alone (population must equal the task's users)
        help="override any preset key, e.g. --set clip-norm=0.5 "
        "--set task-params.num-users=50 --set population=50 (repeatable)",
    )
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its checkpoint")
    p.add_argument(
        "--tensorboard",
        action="store_true",
        default=None,
        help="also write TensorBoard event files next to metrics.jsonl (tensorboard = true)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-round progress on stderr")
    p.set_defaults(func=cmd_simulate)


def note_unused(configs: list, only: dict | None = None) -> None:
    """Say on stderr which strategies do not use keys that are set, one line per set of keys.

    ``configs`` are run configurations. ``simulate`` names every such key of its one strategy;
    ``compare`` only the keys of ``only`` (its ``--set``s): a preset shared by several
    strategies holds options some of them ignore by design. A ``[side-information]`` table
    counts too: only ``adadps`` reads it (thirty-fourth review of issue 15: ``simulate
    toy.toml --set strategy=dp-fedavg --set side-information.kind=public-users`` ran without
    a word, its summary showing the table it never used).
    """
    from fedprivopt.models.side_information_config import KEY as SIDE_INFORMATION
    from fedprivopt.models.side_information_config import SideInformationSpec
    from fedprivopt.simulation.tune_grid import keys_without_effect

    by_keys: dict[tuple, list[str]] = {}
    for config in configs:
        strategy = config.strategy
        unused = set(keys_without_effect(strategy))
        if strategy.strategy != "adadps" and config.side_information != SideInformationSpec():
            unused.add(SIDE_INFORMATION)
        if only is not None:  # --set strategies.<this strategy>.KEY sets KEY for it
            own = f"strategies.{strategy.strategy}."
            given = {key.removeprefix(own) for key in only}
            given |= {SIDE_INFORMATION for key in given if key.startswith(SIDE_INFORMATION)}
            unused &= given
        if unused:
            names = by_keys.setdefault(tuple(sorted(unused)), [])
            if strategy.strategy not in names:
                names.append(strategy.strategy)
    for unused, names in by_keys.items():
        verb, pronoun = ("does", "it ignores") if len(names) == 1 else ("do", "they ignore")
        print(
            f"note: {', '.join(names)} {verb} not use {', '.join(unused)} "
            f"(other strategies' options, or ones {pronoun})",
            file=sys.stderr,
        )
