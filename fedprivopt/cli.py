"""The ``fedprivopt`` command line.

Every command validates its arguments before doing any work. Bad input exits with code 2 and one
line on stderr that names the flag and its valid range (no traceback; set ``FEDPRIVOPT_DEBUG=1``
to see one: ``0``, ``false``, ``no``, ``off`` or empty leave it off).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from fedprivopt import __version__

__all__ = ["main"]

from fedprivopt.cli_args import (
    EXIT_USAGE,
    LIMIT_ERRNOS,
    HelpFormatter,
    Parser,
    UsageError,
    describe_os_error,
    is_file_error,
    one_line,
    shown_path,
)
from fedprivopt.cli_compare import add_compare
from fedprivopt.cli_compare_tune import add_compare_tune
from fedprivopt.cli_compare_tuned import add_compare_tuned
from fedprivopt.cli_data import add_data
from fedprivopt.cli_privacy import add_privacy
from fedprivopt.cli_runs import add_simulate
from fedprivopt.cli_tune import add_tune
from fedprivopt.core.logs import log_warnings_to_stderr
from fedprivopt.core.orphans import fork_refusal
from fedprivopt.core.threads import passive_openmp_wait


def build_parser() -> argparse.ArgumentParser:
    """Build the ``fedprivopt`` argument parser with all subcommands."""
    parser = Parser(
        prog="fedprivopt",
        description="Differentially private adaptive federated optimization on Flower.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fedprivopt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    add_privacy(sub)
    add_simulate(sub)
    add_compare(sub)
    add_compare_tune(sub)  # compare --tune-grid: every cell a private tuning
    add_tune(sub)
    add_compare_tuned(sub)
    add_data(sub)
    from fedprivopt.deploy.cli import add_deploy_subcommand

    add_deploy_subcommand(sub)
    return parser


_COMMAND: dict[str, str] = {}
"""For :func:`console`'s line: ``name``, the command :func:`main` parsed (``data synth``);
``finished``, set once the command has returned."""


def console() -> None:
    """The ``fedprivopt`` program: :func:`main`, then exit with its code.

    Its signal handlers stay until the process has ended (:func:`~fedprivopt.simulation.
    interrupt.handle_until_exit`): a second Ctrl-C, SIGTERM or SIGHUP ends it at once, with one
    line and exit code 130 (128 + the first signal), and a signal after :func:`main` returned
    ends it with the one line of a command interrupted after it finished and ``128 + signal``
    (:mod:`fedprivopt.cli_exit`; before the twenty-eighth review of issue 15 it ended silently
    with ``main``'s code, or was killed by SIGINT in Python's module teardown); the process ends
    after the ``atexit`` callbacks, without Python's module teardown
    (:func:`~fedprivopt.cli_exit.end_program`). Twenty-second review of issue
    15: a second Ctrl-C 0.005-0.08 s after the first printed tracebacks from ``atexit`` callbacks
    and from ``main``'s own ``with`` block (3 of 8 runs).
    """
    import atexit

    from fedprivopt.cli_exit import after_finish, end_program, exit_code, finished_line
    from fedprivopt.simulation import interrupt

    interrupt.handle_until_exit()
    atexit.register(end_program)  # registered first: runs after every other
    try:
        code = main()
    except SystemExit as exc:  # argparse's --help, --version and usage errors
        code = exit_code(exc)
        if code is None:
            raise
    except KeyboardInterrupt as exc:  # at start-up, or as main's blocks ended after the result
        name = _COMMAND.get("name")
        if _COMMAND.get("finished"):
            print(finished_line(name), file=sys.stderr)
        else:
            print(f"fedprivopt{f' {name}' if name else ''}: interrupted", file=sys.stderr)
        code = 128 + int(getattr(exc, "signum", 2))
    # a signal from now on: one line and 128 + signal (twenty-eighth review of issue 15)
    after_finish(_COMMAND.get("name"), code)
    interrupt.finished(code)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``fedprivopt`` command line: the exit code of the command ``argv`` asks for."""
    from fedprivopt.simulation.interrupt import ENDING_SIGNALS, signals_raise

    try:
        os.getcwd()
    except FileNotFoundError:
        # sixteenth review of issue 15: from a directory that was removed, every command ended
        # with MKL's "FATAL ERROR: Cannot load .../libtorch_cpu.so" (rc 2), naming no cause
        print(
            "fedprivopt: error: the current directory no longer exists (it was removed); "
            "change to an existing directory and run the command again",
            file=sys.stderr,
        )
        return EXIT_USAGE

    # before torch loads: OpenMP threads that sleep rather than spin while they wait, so a round
    # does not stall when another process holds a core (fedprivopt.core.threads)
    passive_openmp_wait()
    # SIGTERM and SIGHUP raise as Ctrl-C does from the start: during start-up and planning they
    # ended the process with no line (tenth review of issue 15, finding 5); a run installs its
    # own handlers over these and restores them. A second signal ends the process at once.
    from fedprivopt.cli_stdout import closed_streams_filled, stderr_failures_dropped

    # a progress line that cannot be written (a full disk under `2> log`, `2>&1 | head` after
    # head left) stopped the run (twenty-fifth review of issue 15, finding 17): dropped instead;
    # a closed stdout or stderr (`>&-`) was None: a traceback (twenty-sixth review, finding 1)
    with signals_raise(ENDING_SIGNALS), closed_streams_filled(), stderr_failures_dropped():
        code = _main(argv)
        _COMMAND["finished"] = "yes"  # a signal from here on comes after the result
        return code


_DEBUG_OFF = frozenset({"", "0", "false", "no", "off"})


def _debug() -> bool:
    """Whether ``FEDPRIVOPT_DEBUG`` asks for tracebacks: set to anything but 0, false, no, off.

    Thirty-first review of issue 15: any non-empty value counted, so ``FEDPRIVOPT_DEBUG=0``
    (meant as "off", as in a CI file that lists every variable) turned every one-line error
    into a traceback with exit code 1, and Ctrl-C into a death by SIGINT.
    """
    return os.environ.get("FEDPRIVOPT_DEBUG", "").strip().lower() not in _DEBUG_OFF


def _main(argv: Sequence[str] | None) -> int:
    """:func:`main` with SIGTERM and SIGHUP raising ``Interrupted``."""
    try:  # building the parser imports torch and the accountants: seconds, Ctrl-C included
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt as exc:
        if _debug():
            raise
        print("fedprivopt: interrupted", file=sys.stderr)
        return 128 + int(getattr(exc, "signum", 2))
    except (ImportError, MemoryError, OSError) as exc:
        # thirty-seventh review of issue 15 (cli, finding 5): under `ulimit -v 400000` torch's
        # library could not be mapped ("failed to map segment from shared object"; at 800000
        # an import's directory listing failed with ENOMEM): a 25- to 45-line traceback, rc 1
        if _debug() or not _no_memory_to_load(exc):
            raise
        detail = one_line(str(exc))[:200]
        print(
            f"fedprivopt: error: this machine ran out of memory while loading the libraries "
            f"({detail}); raise this process's limit of memory (ulimit -v) or free memory",
            file=sys.stderr,
        )
        return 1
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    _COMMAND["name"] = _command(args)
    from fedprivopt.simulation import interrupt

    interrupt.begin(_interrupted_twice(_command(args)))
    # dp-accounting logs (via absl) when it drops RDP orders that do not converge; the bound it
    # returns stays valid, so keep the command's output to its one line.
    logging.getLogger("absl").setLevel(logging.ERROR)
    log_warnings_to_stderr()  # or absl's first note doubles every Flower log line
    warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
    from fedprivopt.cli_stdout import StdoutError, guarded_stdout, stdout_failed

    try:
        with _run_warnings(_command(args)), guarded_stdout():
            return int(args.func(args))
    except StdoutError as exc:  # a closed pipe or a full disk under the redirected output
        if _debug():
            raise
        return stdout_failed(_command(args), exc)
    except Warning as exc:
        # thirty-seventh review of issue 15 (cli, finding 6): with PYTHONWARNINGS=error (a CI
        # file's habit), `simulate --engine flower` ended in a 54-line traceback of click's
        # DeprecationWarning raised while Flower was imported, rc 1
        if _debug() or not _warnings_are_errors():
            raise
        text = f"{type(exc).__name__}: {exc}"
        print(
            one_line(
                f"fedprivopt {_command(args)}: error: a warning was raised as an error "
                f"(PYTHONWARNINGS or python -W make warnings errors): {text[:300]}; run with "
                "PYTHONWARNINGS=default to see it as a warning; nothing already written is lost"
            ),
            file=sys.stderr,
        )
        return EXIT_USAGE
    except (UsageError, ValueError, OSError) as exc:
        # OSError: a path that cannot be read, created or written (not a network failure)
        if isinstance(exc, OSError) and exc.errno == errno.ENOMEM and exc.filename is None:
            if _debug():  # a fork or mmap refused (ulimit -v): this machine's memory
                raise
            return _out_of_memory(args, exc)
        refused = fork_refusal(exc)  # forty-third review of issue 15 (processes, open for cli)
        if refused is not None:
            if _debug():
                raise
            print(f"fedprivopt {_command(args)}: error: {one_line(refused)}", file=sys.stderr)
            return 1
        if isinstance(exc, OSError) and not is_file_error(exc):
            raise
        if _debug():
            raise
        message = describe_os_error(exc) if isinstance(exc, OSError) else str(exc)
        if isinstance(exc, OSError) and exc.errno in LIMIT_ERRNOS:
            pass  # a limit of this process or system, not of the file it was opening
        elif isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            # a full disk while a report, CSV or plot was flushed (no file name): name where
            # the command was writing (fourteenth review of issue 15); not one raised with a
            # message of ours (no errno), which names its own file (nineteenth review, finding 6:
            # a data directory's missing file was blamed on --out)
            for flag in ("out", "resume"):
                if getattr(args, flag, None):
                    message = f"{shown_path(getattr(args, flag))}: {message}"
                    message = _storage_failed(args, flag, exc, message)
                    break
        elif isinstance(exc, OSError) and exc.filename is not None:
            # a path in --out that cannot be made (`--out /proc/t`: "/proc/t: No such file or
            # directory", naming no flag; twenty-third review of issue 15)
            for flag in ("out", "resume"):
                given = getattr(args, flag, None)
                if _within(exc.filename, given):
                    message = _storage_failed(args, flag, exc, message)
                    break
                if _missing_ancestor(exc.filename, given):
                    # thirty-sixth review of issue 15 (cli, finding 3): `--out /proc/a/b` (also
                    # the default runs/… in a working directory under /proc) named no flag
                    message = f"argument --{flag}: cannot create {shown_path(given)}: {message}"
                    break
        print(one_line(f"fedprivopt {_command(args)}: error: {message}"), file=sys.stderr)
        return EXIT_USAGE
    except (MemoryError, RuntimeError) as exc:
        # thirty-fifth review of issue 15 (lead 3): a run whose task (or data) needed more
        # memory than the machine has ended in a traceback; the rounds it released are kept.
        # Thirty-seventh review (cli, finding 3): torch's allocator says so with a RuntimeError
        from fedprivopt.models.task_calls import out_of_memory

        if _debug() or not out_of_memory(exc):
            raise
        return _out_of_memory(args, exc)
    except KeyboardInterrupt as exc:
        # Ctrl-C, or SIGTERM/SIGHUP during a run (simulation.interrupt.Interrupted): every
        # process it started is stopped and what it released is kept; exit code 128 + signal
        if _debug():
            raise
        # sixteenth review of issue 15: Ctrl-C of `data synth` said "fedprivopt data: ..."
        print(_interrupted(_command(args), exc), file=sys.stderr)
        interrupt.reported()  # a second signal from now on ends the process without a line
        return 128 + int(getattr(exc, "signum", 2))  # 130 for Ctrl-C (SIGINT)


def _warnings_are_errors() -> bool:
    """Whether ``PYTHONWARNINGS`` or ``-W`` asked for warnings to be raised as errors."""
    return any(option.partition(":")[0].strip() == "error" for option in sys.warnoptions)


def _no_memory_to_load(exc: BaseException) -> bool:
    """Whether loading a module failed for want of memory (``ulimit -v``), not for a bug."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError):
        return exc.errno == errno.ENOMEM
    return "failed to map segment" in str(exc)  # the dynamic loader's ENOMEM


def _out_of_memory(args: argparse.Namespace, exc: BaseException) -> int:
    """Report that this machine ran out of memory: one line, exit code 1."""
    detail = f" ({one_line(str(exc))[:200]})" if str(exc) else ""
    print(
        f"fedprivopt {_command(args)}: error: this machine ran out of memory{detail}; "
        "nothing already written is lost (FEDPRIVOPT_DEBUG=1 shows where)",
        file=sys.stderr,
    )
    return 1


#: errnos of the storage failing under --out or --resume: a full disk or quota, a failing disk
#: or file server (not a fault of the argument, as a path that cannot be made is)
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})


def _storage_failed(args: argparse.Namespace, flag: str, exc: OSError, message: str) -> str:
    """``message`` of a file error under ``--flag``: a storage failure's own, or the argument's.

    Forty-seventh review follow-up of issue 15 (ledger 3; the first wave's open row ledger 4):
    a run whose disk filled (or failed) while it wrote said ``error: argument --out:
    R/privacy_ledger.jsonl: No space left on device``, a bad argument, where the argument was
    fine and the run can be resumed once there is room.
    """
    if exc.errno not in _STORAGE_ERRNOS:
        return f"argument --{flag}: {message}"
    given = getattr(args, flag)
    again = "run the command again"
    run = _command(args) in ("simulate", "deploy local")  # deploy's run: simulate --resume
    if run and os.path.isfile(os.path.join(given, "config.toml")):
        again = f"resume the run (fedprivopt simulate --resume {shown_path(given)})"
    return (
        f"{message} (the disk or file server under --{flag} failed, not the argument); free "
        f"space or check the disk, then {again}; what was already written is kept"
    )


def _within(path: object, directory: object) -> bool:
    """Whether ``path`` is ``directory`` or inside it (both as given, made absolute)."""
    if not isinstance(path, (str, os.PathLike)) or not isinstance(directory, (str, os.PathLike)):
        return False
    try:
        inner, outer = Path(os.path.abspath(path)), Path(os.path.abspath(directory))
    except (ValueError, OSError):
        return False
    return inner == outer or outer in inner.parents


def _missing_ancestor(path: object, directory: object) -> bool:
    """Whether ``path`` is a directory above ``directory`` that does not exist.

    Such a ``path`` in a file-system error is where creating ``directory`` failed.
    """
    return (
        isinstance(path, (str, os.PathLike))
        and isinstance(directory, (str, os.PathLike))
        and _within(directory, path)
        and not os.path.lexists(path)
    )


def _command(args: argparse.Namespace) -> str:
    """The command as typed, with its action: ``simulate``, ``data synth``, ``deploy local``."""
    action = getattr(args, "data_command", None) or getattr(args, "deploy_command", None)
    return f"{args.command} {action}" if action else args.command


@contextlib.contextmanager
def _run_warnings(command: str) -> Iterator[None]:
    """Notes on the runs of a report, as one line when the command ends.

    A report lists what it tolerated or found disagreeing in the runs' files under Warnings and
    issues each as a :class:`~fedprivopt.simulation.rundata.RunWarning`, which Python would
    print as two lines naming our source line. The command instead ends with one line: the
    first note and how many there are. Other warnings are shown as Python shows them.
    """
    seen: list[str] = []
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        rundata = sys.modules.get("fedprivopt.simulation.rundata")  # None: no RunWarning yet
        if rundata is not None and issubclass(category, rundata.RunWarning):
            seen.append(str(message))
        else:
            original(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = original
    if seen:
        more = f" (and {len(seen) - 1} more)" if len(seen) > 1 else ""
        text = f"fedprivopt {command}: warning: {seen[0]}{more}; the report lists them all"
        print(one_line(text), file=sys.stderr)


def _interrupted(command: str, exc: KeyboardInterrupt) -> str:
    """The one line that reports an interrupted command, and how to continue it."""
    import shlex

    out = getattr(exc, "out_dir", None)
    text = f"fedprivopt {command}: interrupted"
    if command == "simulate" and out is not None:
        if (Path(out) / "config.toml").is_file():
            from fedprivopt.simulation.audit_tree import secure_tree_redo

            where = shlex.quote(str(out)).replace("\n", "\\n")
            refused = secure_tree_redo(Path(out))
            if refused is None:
                text += f"; the run can be continued with --resume {where}"
            else:  # what --resume would refuse, said now (issue 20 review, finding 7)
                why = refused.split(": refusing")[0]
                text += f"; it cannot be resumed ({why}): start a new run in another directory"
        else:
            text += " before it released a round; nothing was kept"
    elif command == "compare":
        text += "; the same command continues it (finished runs are reused, others resumed)"
    elif command == "tune":
        text += "; the same command continues it (finished trials are reused, others resumed)"
    return text


def _interrupted_twice(command: str) -> str:
    """The one line of a command that a second signal ended at once (as a kill would)."""
    text = f"fedprivopt {command}: interrupted twice; ended at once, as a kill would"
    if command == "simulate":
        return text + " (--resume continues the run from its last checkpoint)"
    if command in ("compare", "tune"):
        return text + " (the same command continues it)"
    return text


if __name__ == "__main__":  # pragma: no cover
    console()
