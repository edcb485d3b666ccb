"""The ``fedprivopt`` command line.

Every command validates its arguments before doing any work. Bad input exits with code 2 and one
line on stderr that names the flag and its valid range (no traceback; set ``FEDPRIVOPT_DEBUG=1``
to see one: ``0``, ``false``, ``no``, ``off`` or empty leave it off).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from fedprivopt import __version__

__all__ = ["main"]

from fedprivopt.cli_args import (
    DELTA,
    EXIT_USAGE,
    NOISE_MULTIPLIER,
    POSITIVE,
    RATE,
    HelpFormatter,
    Parser,
    UsageError,
    describe_os_error,
    float_range,
    int_at_least,
    is_file_error,
    one_line,
    shown_path,
)
from fedprivopt.cli_compare_tune import add_compare_tune
from fedprivopt.cli_data import add_data
from fedprivopt.cli_runs import add_compare, add_simulate
from fedprivopt.cli_tune import add_tune
from fedprivopt.core.logs import log_warnings_to_stderr
from fedprivopt.core.threads import passive_openmp_wait

# ---------------------------------------------------------------------------------------------
# privacy commands

PLD_DISCRETIZATION = 1e-4
"""``--pld-discretization`` when it is not given (the accountants' own default)."""


def _add_sampling_args(p: argparse.ArgumentParser, *, needs_sigma: bool) -> None:
    from fedprivopt.privacy.accounting import ACCOUNTANTS

    if needs_sigma:
        p.add_argument(
            "--noise-multiplier",
            type=NOISE_MULTIPLIER,
            required=True,
            metavar="S",
            help="noise std on the clipped sum divided by the clip norm C (>= 1e-100)",
        )
    p.add_argument(
        "--sample-rate",
        type=RATE,
        metavar="Q",
        help="Poisson inclusion probability per user and round, in (0, 1]; "
        "defaults to COHORT/POPULATION when both are given",
    )
    p.add_argument(
        "--rounds", type=int_at_least(1), required=True, metavar="T", help="rounds, >= 1"
    )
    p.add_argument(
        "--delta", type=DELTA, required=True, metavar="D", help="target delta, in (0, 1)"
    )
    p.add_argument(
        "--accountant",
        choices=ACCOUNTANTS,
        default="rdp",
        help="rdp: dp-accounting RDP; pld: dp-accounting privacy loss distributions (tighter); "
        "prv: Opacus PRV",
    )
    p.add_argument(
        "--pld-discretization",
        type=float_range(0.0, 1.0, lo_open=True, hi_open=True),
        metavar="H",
        help="value discretization interval of --accountant pld, in (0, 1); coarser is faster, "
        f"uses less memory and gives a slightly larger (still valid) epsilon (default: "
        f"{PLD_DISCRETIZATION:g})",
    )
    p.add_argument(
        "--sampling",
        choices=("poisson", "fixed"),
        default="poisson",
        help="poisson: each user joins independently with probability Q (add/remove-one); "
        "fixed: exactly COHORT of POPULATION users without replacement (replace-one, rdp only)",
    )
    p.add_argument("--population", type=int_at_least(1), metavar="N", help="number of users N")
    p.add_argument(
        "--cohort", type=int_at_least(1), metavar="M", help="users per round M (fixed sampling)"
    )
    p.add_argument(
        "--events-per-round",
        type=int_at_least(1),
        default=1,
        metavar="K",
        help="data accesses per round (2 for dp-fedavg-adadp)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a line")


def _resolve_sampling(args: argparse.Namespace) -> dict:
    """Cross-flag checks; returns keyword arguments for ``make_round_event``.

    Also sets ``args.pld_discretization``: twenty-ninth review of issue 15, ``epsilon …
    --pld-discretization 0.5`` with the ``rdp`` (or ``prv``) accountant was silently ignored,
    where ``compare --mean-trials`` without ``--tune-grid`` is refused.
    """
    from fedprivopt.privacy.accounting_state import check_ledger_count

    if args.pld_discretization is None:
        args.pld_discretization = PLD_DISCRETIZATION
    elif args.accountant != "pld":
        raise UsageError(
            f"argument --pld-discretization: applies only with --accountant pld (got "
            f"--accountant {args.accountant})"
        )

    # sixteenth review of issue 15: --rounds 10**400 ended in "OverflowError: int too large to
    # convert to float"; the accountants compose at most MAX_LEDGER_COUNT events (float64)
    try:
        check_ledger_count(
            args.rounds * args.events_per_round,
            "rounds x events per round must be at most 10**300 (the accountants compose in "
            "float64)",
        )
    except ValueError as exc:
        raise UsageError(f"argument --rounds/--events-per-round: {exc}") from None
    if args.population is not None and args.cohort is not None and args.cohort > args.population:
        raise UsageError(
            f"argument --cohort: must be in [1, --population={args.population}], got {args.cohort}"
        )
    if args.sampling == "fixed":
        if args.population is None or args.cohort is None:
            raise UsageError("argument --sampling: 'fixed' needs --population N and --cohort M")
        if args.sample_rate is not None and not math.isclose(
            args.sample_rate, args.cohort / args.population, rel_tol=1e-9
        ):
            raise UsageError(
                f"argument --sample-rate: with --sampling fixed it must equal "
                f"COHORT/POPULATION = {args.cohort / args.population:g} (or be left out)"
            )
        if args.accountant != "rdp":
            raise UsageError(
                f"argument --accountant: '{args.accountant}' supports only --sampling poisson; "
                "use --accountant rdp for fixed-size sampling"
            )
        return {"sampling": "fixed", "population": args.population, "cohort_size": args.cohort}
    rate = args.sample_rate
    if rate is not None and args.cohort is not None:
        given = f"--cohort {args.cohort}" + (
            f" of --population {args.population}" if args.population is not None else ""
        )
        raise UsageError(
            f"argument --sample-rate: give either --sample-rate or --population and --cohort, "
            f"not both (got --sample-rate {rate:g} and {given})"
        )
    if rate is None:
        if args.population is None or args.cohort is None:
            raise UsageError(
                "argument --sample-rate: required in (0, 1] (or give --population and --cohort)"
            )
        rate = args.cohort / args.population
    return {"sampling": "poisson", "sample_rate": rate, "population": args.population}


def _echo(args: argparse.Namespace, sampling: dict, event) -> dict:
    return {
        "delta": args.delta,
        "rounds": args.rounds,
        "events_per_round": args.events_per_round,
        "accountant": args.accountant,
        "sampling": sampling["sampling"],
        "sample_rate": event.sample_rate,
        "population": args.population,
        "cohort": args.cohort,
        "neighboring_relation": event.neighboring_relation.name.lower(),
        "accountant_noise_multiplier": event.accountant_noise_multiplier,
    }


def _describe(out: dict) -> str:
    if out["sampling"] == "fixed":
        how = f"fixed-size sampling of {out['cohort']} of {out['population']} users (replace-one)"
    else:
        how = f"Poisson sampling (q = {out['sample_rate']:g})"
    per = out["events_per_round"]
    return (
        f"{out['rounds']} rounds of {how}, sigma = {out['noise_multiplier']:g}"
        f"{f', {per} events per round' if per > 1 else ''} [{out['accountant']} accountant]"
    )


@contextlib.contextmanager
def _accountant_numerics(sigma_flag: str) -> Iterator[None]:
    """Run the accountant quietly; a numerical failure on extreme flags is a usage error.

    In-range flags can still be beyond what the accounting libraries compute (e.g. sigma 1e300
    with sample rate 1e-300 overflows in dp-accounting; a target epsilon that no noise level in
    the calibration's search range reaches): one line naming the flags instead of a traceback.
    Overflow warnings of the libraries are dropped; the printed epsilon says what they meant.
    """
    from dp_accounting.mechanism_calibration import NoBracketIntervalFoundError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            yield
        except (ArithmeticError, NoBracketIntervalFoundError) as exc:
            raise UsageError(
                f"the accountant cannot handle these flags ({sigma_flag}, --sample-rate, "
                f"--rounds, --delta are too extreme): {type(exc).__name__}: {exc}"
            ) from None


def _epsilon(args: argparse.Namespace, event) -> float:
    """ε of ``--rounds`` x ``--events-per-round`` releases of ``event`` at ``--delta``."""
    from fedprivopt.privacy.accounting import compose_epsilon

    return compose_epsilon(
        [(event, args.rounds * args.events_per_round)],
        args.delta,
        accountant=args.accountant,
        pld_discretization=args.pld_discretization,
    )


def cmd_epsilon(args: argparse.Namespace) -> int:
    """``fedprivopt epsilon``: ε after T rounds."""
    from fedprivopt.privacy.calibration import make_round_event

    sampling = _resolve_sampling(args)
    event = make_round_event(args.noise_multiplier, **sampling)
    with _accountant_numerics("--noise-multiplier"):
        eps = _epsilon(args, event)
    out = {
        "epsilon": eps,
        "noise_multiplier": args.noise_multiplier,
        **_echo(args, sampling, event),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"epsilon = {eps:.4f} at delta = {args.delta:g} after {_describe(out)}")
    return 0


def _round_up(value: float, digits: int = 5) -> float:
    """``value`` rounded up to ``digits`` significant digits (exactly, in decimal)."""
    from decimal import ROUND_CEILING, Decimal

    exact = Decimal(value)
    step = Decimal(1).scaleb(exact.adjusted() - digits + 1)
    return float(exact.quantize(step, rounding=ROUND_CEILING))


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``fedprivopt calibrate``: the smallest σ that meets a target ε."""
    from fedprivopt.privacy.calibration import calibrate_noise_multiplier, make_round_event

    sampling = _resolve_sampling(args)
    with _accountant_numerics("--target-epsilon"):
        sigma = calibrate_noise_multiplier(
            target_epsilon=args.target_epsilon,
            delta=args.delta,
            rounds=args.rounds,
            events_per_round=args.events_per_round,
            accountant=args.accountant,
            pld_discretization=args.pld_discretization,
            **sampling,
        )
        # the text shows sigma rounded UP to 5 significant digits, and the epsilon of that value
        # (rounded to nearest, 1.2910 gave 5.0002 > target 5; sixth review of issue 15); --json
        # carries the exact sigma
        shown = sigma if args.json else _round_up(sigma)
        event = make_round_event(shown, **sampling)
        eps = _epsilon(args, event)
    out = {
        "noise_multiplier": shown,
        "epsilon": eps,
        "target_epsilon": args.target_epsilon,
        **_echo(args, sampling, event),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"noise multiplier = {shown:.5g} gives epsilon = {eps:.4f} "
            f"(target {args.target_epsilon:g}) at delta = {args.delta:g} after {_describe(out)}"
        )
    return 0


# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Build the ``fedprivopt`` argument parser with all subcommands."""
    parser = Parser(
        prog="fedprivopt",
        description="Differentially private adaptive federated optimization on Flower.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fedprivopt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    p = sub.add_parser(
        "epsilon",
        help="privacy spent (epsilon) after T rounds of subsampled Gaussian releases",
        description="Epsilon at delta after T rounds: each round samples users (Poisson with "
        "rate Q, or a fixed cohort of M of N) and adds Gaussian noise of std S*C to the sum of "
        "updates clipped to L2 norm C.",
        epilog="examples:\n"
        "  fedprivopt epsilon --noise-multiplier 1.0 --sample-rate 0.01 --rounds 10000 "
        "--delta 1e-5\n"
        "  fedprivopt epsilon --noise-multiplier 0.3 --rounds 40 --delta 0.0025 "
        "--sampling fixed --population 400 --cohort 20 --json",
        formatter_class=HelpFormatter,
    )
    _add_sampling_args(p, needs_sigma=True)
    p.set_defaults(func=cmd_epsilon)

    p = sub.add_parser(
        "calibrate",
        help="smallest noise multiplier that meets a target epsilon",
        description="Smallest noise multiplier S such that T rounds stay within "
        "(TARGET_EPSILON, delta).",
        epilog="example:\n"
        "  fedprivopt calibrate --target-epsilon 8 --delta 1e-6 --sample-rate 0.0003 --rounds 1500",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--target-epsilon", type=POSITIVE, required=True, metavar="E", help="target epsilon, > 0"
    )
    _add_sampling_args(p, needs_sigma=False)
    p.set_defaults(func=cmd_calibrate)
    add_simulate(sub)
    add_compare(sub)
    add_compare_tune(sub)  # compare --tune-grid: every cell a private tuning
    add_tune(sub)
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
    except (UsageError, ValueError, OSError) as exc:
        # OSError: a path that cannot be read, created or written (not a network failure)
        if isinstance(exc, OSError) and not is_file_error(exc):
            raise
        if _debug():
            raise
        message = describe_os_error(exc) if isinstance(exc, OSError) else str(exc)
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            # a full disk while a report, CSV or plot was flushed (no file name): name where
            # the command was writing (fourteenth review of issue 15); not one raised with a
            # message of ours (no errno), which names its own file (nineteenth review, finding 6:
            # a data directory's missing file was blamed on --out)
            for flag in ("out", "resume"):
                if getattr(args, flag, None):
                    message = f"argument --{flag}: {shown_path(getattr(args, flag))}: {message}"
                    break
        elif isinstance(exc, OSError) and exc.filename is not None:
            # a path in --out that cannot be made (`--out /proc/t`: "/proc/t: No such file or
            # directory", naming no flag; twenty-third review of issue 15)
            for flag in ("out", "resume"):
                given = getattr(args, flag, None)
                if _within(exc.filename, given):
                    message = f"argument --{flag}: {message}"
                    break
                if _missing_ancestor(exc.filename, given):
                    # thirty-sixth review of issue 15 (cli, finding 3): `--out /proc/a/b` (also
                    # the default runs/… in a working directory under /proc) named no flag
                    message = f"argument --{flag}: cannot create {shown_path(given)}: {message}"
                    break
        print(one_line(f"fedprivopt {_command(args)}: error: {message}"), file=sys.stderr)
        return EXIT_USAGE
    except MemoryError as exc:
        # thirty-fifth review of issue 15 (lead 3): a run whose task (or data) needed more
        # memory than the machine has ended in a traceback; the rounds it released are kept
        if _debug():
            raise
        detail = f" ({one_line(str(exc))[:200]})" if str(exc) else ""
        print(
            f"fedprivopt {_command(args)}: error: this machine ran out of memory{detail}; "
            "nothing already written is lost (FEDPRIVOPT_DEBUG=1 shows where)",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt as exc:
        # Ctrl-C, or SIGTERM/SIGHUP during a run (simulation.interrupt.Interrupted): every
        # process it started is stopped and what it released is kept; exit code 128 + signal
        if _debug():
            raise
        # sixteenth review of issue 15: Ctrl-C of `data synth` said "fedprivopt data: ..."
        print(_interrupted(_command(args), exc), file=sys.stderr)
        interrupt.reported()  # a second signal from now on ends the process without a line
        return 128 + int(getattr(exc, "signum", 2))  # 130 for Ctrl-C (SIGINT)


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
            from fedprivopt.simulation.audit import secure_tree_redo

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
