"""``fedprivopt deploy local``: the command-line face of :func:`~fedprivopt.deploy.deploy_local`.

The main command line (``fedprivopt/cli.py``) wires it in with::

    from fedprivopt.deploy.cli import add_deploy_subcommand
    add_deploy_subcommand(sub)   # sub = parser.add_subparsers(...)

Bad input raises ``ValueError`` naming the flag (the main command line turns it into one line on
stderr and exit code 2), and so does an unusable ``--out`` or preset (checked with the main
command line's :func:`~fedprivopt.cli_args.check_out_dir` before any process starts). A deployment
that fails prints one line and returns 1; Ctrl-C stops every process and returns 130.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fedprivopt.core.orphans import fork_refusal
from fedprivopt.core.text import epsilon_text, shown
from fedprivopt.deploy import MAX_LOCAL_NODES
from fedprivopt.deploy.out_checks import MAX_RECORD_BYTES, check_out_claimable  # noqa: F401
from fedprivopt.deploy.out_checks import check_log_dir as _check_log_dir  # noqa: F401
from fedprivopt.deploy.out_checks import check_temp_outside as _check_temp_outside  # noqa: F401
from fedprivopt.deploy.out_checks import quoted_out as _quoted

__all__ = ["MAX_LOCAL_NODES", "add_deploy_subcommand", "run_deploy_command"]


_EXAMPLES = """examples:
  fedprivopt deploy local --nodes 3
  fedprivopt deploy local --nodes 2 simulations/toy.toml --set strategy=dp-fedadam \\
      --set num-server-rounds=5 --out runs/deploy-a
  fedprivopt deploy local --nodes 2 --insecure --set population=6 --set task-params.num-users=6 \\
      --set clients-per-round=3"""


def _int_flag(flag: str, text: Any, minimum: int, maximum: int | None = None) -> int:
    try:
        value = int(str(text)) if str(text).isascii() else None
    except ValueError:
        value = None
    if maximum is not None and (value is None or not minimum <= value <= maximum):
        raise ValueError(f"{flag} must be an integer in [{minimum}, {maximum}], got {text!r}")
    if value is None or value < minimum:
        raise ValueError(f"{flag} must be an integer >= {minimum}, got {text!r}")
    return value


def _timeout_flag(text: Any) -> float:
    """``--timeout``'s text as seconds, checked as :func:`deploy_local` checks them."""
    from fedprivopt.deploy.local_checks import check_timeout

    try:
        # forty-seventh review of issue 15 (follow-up outputs 3): float() reads "２" (a
        # full-width digit) or "٣" as a number, so --timeout ２ ran 2 s, where --nodes and every
        # other command's numbers refuse non-ASCII digits (as TOML does)
        value = float(str(text)) if str(text).isascii() else None
    except ValueError:
        value = None
    return check_timeout(value, shown_as=text)


def _overrides(items: list[str] | None) -> dict[str, Any]:
    from fedprivopt.simulation.config_presets import parse_override
    from fedprivopt.simulation.tune_grid import empty_table_error, sets_nothing

    out: dict[str, Any] = {}
    for text in items or []:
        try:
            key, value = parse_override(text)
        except ValueError as exc:
            raise ValueError(f"--set: {exc}") from None
        except RecursionError:
            raise ValueError("--set: a value is nested too deeply") from None
        if sets_nothing(value):  # nineteenth review of issue 15, finding 1
            raise ValueError(empty_table_error("--set", key, value))
        if key in out and _differ(out[key], value):  # the last silently won (finding 4)
            raise ValueError(
                f"argument --set: {key}={shown(value)} contradicts an earlier --set "
                f"{key}={shown(out[key])}; give one of them"
            )
        out[key] = value
    return out


def _differ(old: Any, new: Any) -> bool:
    """Whether two values of one key differ, a boolean never equal to a number.

    Forty-seventh review of issue 15 (input 3): ``deploy local --seed 1 --set seed=true`` (also
    ``--set seed=true --set seed=1``) was no contradiction, since ``True == 1`` in Python: the
    value the key refuses was dropped silently and seed 1 used, where ``simulate`` refuses both
    (forty-third review, input 6: :func:`fedprivopt.cli_runs.values_differ`).

    Forty-seventh review of issue 15 (sameness 2): inside a table or an array too (``--set
    'strategies.dp-fedavg={seed=true}' --set 'strategies.dp-fedavg={seed=1}'`` ran seed 1):
    entry by entry, as ``cli_runs.values_differ``.
    """
    from fedprivopt.cli_runs import values_differ

    return values_differ(old, new)


def _checked_out(out: str) -> None:
    """``--out`` usable as a results directory, else ``ValueError`` naming it."""
    from fedprivopt.cli_args import UsageError, check_out_dir

    try:
        check_out_dir(out)
    except UsageError as exc:
        raise ValueError(str(exc)) from None


def _checked_config(config_path: str | None, overrides: dict[str, Any]) -> Any:
    """The run's configuration; an unreadable or too deeply nested preset is a ``ValueError``."""
    from fedprivopt.deploy.local import REPO_ROOT, resolve_deployment

    try:
        config, _, _ = resolve_deployment(config_path, overrides, REPO_ROOT)
    except RecursionError:
        raise ValueError(f"config file {config_path!r} is nested too deeply") from None
    except OSError as exc:
        name = exc.filename if exc.filename is not None else config_path
        raise ValueError(
            f"config file {str(name)!r} cannot be read: {exc.strerror or exc}"
        ) from None
    return config


def _continuation(out: Path) -> str | None:
    """How the unfinished run in ``out`` continues, or ``None`` (none began, or it finished).

    ``fedprivopt simulate --resume OUT`` continues a deployment's run; a secure tree run whose
    rounds after its checkpoint cannot be redone says so, as ``simulate`` says it
    (:func:`~fedprivopt.simulation.audit_tree.secure_tree_redo`).
    """
    from fedprivopt.simulation.audit_tree import secure_tree_redo

    if (out / "summary.json").is_file() or not (out / "config.toml").is_file():
        return None
    refused = secure_tree_redo(out)
    if refused is not None:
        why = refused.split(": refusing")[0]
        return f"the run cannot be resumed ({why}): start a new run in another directory"
    return f"the run can be continued with fedprivopt simulate --resume {_quoted(out)}"


def _interrupted(out: Path) -> str:
    """The one line of an interrupted deployment: whether its run finished, or how it continues.

    Thirty-first review of issue 15: the line was ``interrupted; every process was stopped``
    also after the run had written ``summary.json`` (the ServerApp writes it last), and said
    nothing of ``fedprivopt simulate --resume``, which continues an unfinished one.
    """
    head = "fedprivopt deploy local: interrupted"
    if (out / "summary.json").is_file():
        return f"{head} after the run had finished (its results are in {_quoted(out)})"
    then = _continuation(out)
    if then is None:
        return f"{head} before the run released a round; every process was stopped"
    return f"{head}; every process was stopped; {then}"


def _note_ignored(config: Any) -> None:
    """Say in one line which simulation-only keys of the preset the deployment ignores.

    Thirty-fourth review of issue 15: a preset's ``vectorize``, ``fast-actors`` or
    ``ray-address`` (a cluster's preset) went unused without a word; given with ``--set`` they
    are refused (:func:`~fedprivopt.deploy.runconfig.refuse_simulation_only`).
    """
    from fedprivopt.deploy.runconfig import ignored_simulation_keys

    ignored = ignored_simulation_keys(config)
    if ignored:
        it = "it" if len(ignored) == 1 else "them"
        print(
            f"note: deploy local ignores the preset's {', '.join(ignored)} (only fedprivopt "
            f"simulate's engines use {it}; the SuperNodes train without Ray)",
            file=sys.stderr,
        )


def run_deploy_command(args: argparse.Namespace) -> int:
    """Handler of ``fedprivopt deploy local``; returns the exit code."""
    from fedprivopt.deploy.local import deploy_local
    from fedprivopt.deploy.local_checks import check_not_deploying, check_out

    if getattr(args, "deploy_command", None) != "local":
        raise ValueError("deploy: choose a target, e.g. `fedprivopt deploy local --nodes 2`")
    if args.insecure and args.no_node_auth:
        # twenty-eighth review of issue 15: accepted, the deployment ran without TLS although
        # --no-node-auth asks for TLS (without SuperNode authentication)
        raise ValueError(
            "argument --no-node-auth: not allowed with argument --insecure (--no-node-auth is "
            "TLS without SuperNode authentication, --insecure is neither); give one of them"
        )
    nodes = _int_flag("--nodes", args.nodes, 1, MAX_LOCAL_NODES)
    timeout = _timeout_flag(args.timeout)
    overrides = _overrides(args.set)
    flags = {}
    for flag, key in (("--strategy", "strategy"), ("--rounds", "num-server-rounds")):
        value = getattr(args, flag.lstrip("-"), None)
        if value is not None:
            flags[flag, key] = (
                _int_flag(flag, value, 1) if key == "num-server-rounds" else str(value)
            )
    if args.seed is not None:
        flags["--seed", "seed"] = _int_flag("--seed", args.seed, 0, 2**63 - 1)
    for (flag, key), value in flags.items():
        if key in overrides and _differ(overrides[key], value):  # the flag won (finding 4)
            raise ValueError(
                f"argument {flag}: {shown(value)} contradicts --set {key}="
                f"{shown(overrides[key])}; give one of them"
            )
        overrides[key] = value
    if args.out is not None:
        _checked_out(args.out)
        check_out(args.out)  # thirty-fourth review of issue 15: '{run_id}' in it
    from fedprivopt.deploy.local_checks import check_min_nodes

    check_min_nodes(overrides, nodes)
    config = _checked_config(args.config, overrides)
    from fedprivopt.cli_args import UsageError
    from fedprivopt.cli_runs import refuse_table_against_flags

    try:  # twenty-ninth review of issue 15 (as for simulate): the strategy's table won silently
        refuse_table_against_flags(args, overrides, config.strategy.strategy)
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    from fedprivopt.deploy.local_checks import check_nodes

    check_nodes(nodes, config.strategy.population)
    out = args.out
    if out is None:
        out = f"runs/deploy-{config.strategy.strategy}-seed{config.strategy.seed}"
        _checked_out(out)
    # the ServerApp refuses a directory that is not a new run's only after the deployment has
    # written its logs (and processes.json) there and started SuperLink and SuperNodes: refuse
    # it here, before anything is created
    check_not_deploying(out)  # before the claim, which would call its run one to resume
    check_out_claimable(out, config)
    from fedprivopt.simulation.engines import check_device

    check_device(config)  # the SuperNodes train on this machine
    _note_ignored(config)
    from fedprivopt.cli_runs import note_unused

    # thirty-fourth review of issue 15 (deploy, finding 4): simulate names the keys its strategy
    # does not use (tau for dp-fedavg, a [side-information] table for any but adadps); deploy
    # local said nothing. Without a preset the base is the app's run config, which declares
    # every option: only the --set keys are named
    note_unused([config], None if args.config is not None else overrides)

    def progress(line: str) -> None:
        if not args.quiet:
            print(f"[deploy] {line}", file=sys.stderr, flush=True)

    from fedprivopt.cli_runs import task_errors
    from fedprivopt.simulation import interrupt

    # what a second signal says, once the run's directory is known (processes 3)
    resume = f"fedprivopt simulate --resume {_quoted(Path(out).expanduser())}"
    before = interrupt.second_line(
        "fedprivopt deploy local: interrupted twice; ended at once, as a kill would (a run "
        f"that released a round is continued with {resume})"
    )
    try:
        # a task parameter's error, found before any process starts, names its key as simulate's
        # does (thirty-first review of issue 15: 'dim * num_classes must be ...', no key)
        with task_errors("config", config.task_params, config.task, every_value_error=False):
            run_dir = deploy_local(
                nodes=nodes,
                tls=not args.insecure,
                config_path=args.config,
                overrides=overrides,
                out=out,
                timeout=timeout,
                node_auth=False if (args.insecure or args.no_node_auth) else None,
                progress=progress,
            )
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (interrupt.Interrupted)
        moved = getattr(exc, "out_moved", None)  # set by deploy_local (follow-up, outputs 5)
        if moved is not None:
            line = f"fedprivopt deploy local: interrupted; every process was stopped; {moved}"
        else:
            line = _interrupted(Path(out).expanduser())
        print(line, file=sys.stderr)
        return 128 + int(getattr(exc, "signum", 2))  # 130 for Ctrl-C
    except (RuntimeError, TimeoutError, OSError) as exc:
        if isinstance(exc, OSError) and not isinstance(exc, TimeoutError):
            # TimeoutError is an OSError: the deployment's own timeout is said as it is
            refused = fork_refusal(exc)
            if refused is None:
                raise
            exc = RuntimeError(refused)
        print(f"fedprivopt deploy local: failed: {exc}", file=sys.stderr)
        from fedprivopt.deploy.session import OutMoved

        if isinstance(exc, OutMoved):  # what is at out is another's (follow-up, outputs 4)
            return 1
        then = _continuation(Path(out).expanduser())  # after the log's lines: said last
        if then is not None:  # thirty-first review of issue 15: a timeout did not say it
            print(f"fedprivopt deploy local: every process was stopped; {then}", file=sys.stderr)
        return 1
    finally:
        interrupt.second_line(before)

    summary = json.loads((run_dir / "summary.json").read_text())
    final = summary.get("final", {})
    leading = summary.get("primary_metric", "eval_accuracy")
    metric = next((k for k in (leading, "eval_loss") if k in final), None)
    shown_metric = f", {metric} = {final[metric]:.4f}" if metric else ""
    print(
        f"{summary['rounds_completed']} rounds ({summary['stopped_reason']}){shown_metric}, "
        f"epsilon = {epsilon_text(summary['epsilon'])}; results in {run_dir}"
    )
    from fedprivopt.simulation.divergence import DIVERGED_KEY, checked_round, warning_line

    diverged = checked_round(summary.get(DIVERGED_KEY))
    if diverged is not None:  # its final metrics describe an overflowed model
        print(warning_line(diverged, metric), file=sys.stderr)
    empty = _empty_rounds(run_dir, summary)
    if empty is not None:
        print(empty, file=sys.stderr)
    return 0


_CAUSES = {  # the round metrics of users whose update did not arrive (strategies.flower)
    "timed_out": "their nodes did not answer within round-timeout",
    "failed": "their nodes failed",
    "unavailable": "their nodes were unavailable",
    "dropped": "their nodes replied without them",
    "unhosted": "no node hosts them",
}
#: why a tree round's cohort was empty (not a round metric: no user was asked)
_NOBODY_LEFT = (
    "under tree aggregation no user who had not yet taken part in the restart period was on a "
    "connected node"
)


def _round_timeout(summary: dict[str, Any]) -> str:
    """The run's ``round-timeout`` as its summary records it (``T s``), else ``?``."""
    config = summary.get("config")
    timeout = config.get("round-timeout") if isinstance(config, dict) else None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        return "?"
    return f"{timeout:g} s"


def _empty_rounds(out: Path, summary: dict[str, Any]) -> str | None:
    """The warning of a deployment some of whose rounds no update reached, or ``None``.

    Thirty-fifth review of issue 15: ``deploy local toy.toml --nodes 2 --set round-timeout=5
    --rounds 3`` (also 1 or 10: a deployment's node asks for messages every 3 s and starts a
    ClientApp process for each, 6-11 s here) ended rc 0 with ``3 rounds (rounds), eval_accuracy
    = 0.3867, epsilon = 12.17``: every sampled user had timed out in every round, so each
    released model was noise only, charged all the same, and nothing said so. Rounds that
    sampled nobody are not counted. The causes are named, not counted (the round metrics are
    not covered by ε).

    Thirty-seventh review of issue 15: under tree aggregation a round's cohort is taken among
    the users on connected nodes who have not taken part in the restart period, so when none
    was left (their nodes disconnected) the round's cohort was empty: it released noise only,
    charged, and was not counted, where sampling counts such users ``unhosted``. Such tree
    rounds count now, their cause named (``_NOBODY_LEFT``).
    """
    from fedprivopt.simulation.files import read_rows

    try:
        rows = read_rows(out / "metrics.jsonl")
    except (OSError, ValueError):
        return None
    tree = summary.get("noise_mechanism") == "tree"
    empty, causes, nobody_left = 0, set(), False
    for row in rows:
        received = [row[k] for k in ("received", "received_1", "received_2") if k in row]
        if not received or sum(received) != 0 or not (row.get("cohort_size") or tree):
            continue
        empty += 1
        causes.update(key for key in _CAUSES if row.get(key))
        nobody_left |= not row.get("cohort_size")  # a tree round: nobody eligible was reachable
    if not empty:
        return None
    which = "any round" if empty == len(rows) else f"{empty} of the {len(rows)} rounds"
    why = [_CAUSES[key] for key in _CAUSES if key in causes] + [_NOBODY_LEFT] * nobody_left
    why = why or ["none arrived"]
    if "timed_out" in causes:
        why[0] = (
            f"{why[0]} = {_round_timeout(summary)}, shorter than a node's reply takes (a node "
            "asks for messages every 3 s and starts a ClientApp process for each: raise it)"
        )
    return (
        f"warning: no sampled user's update reached the server in {which}, so the models "
        "released there are noise only, charged all the same (epsilon = "
        f"{epsilon_text(summary['epsilon'])}): {'; '.join(why)}"
    )


def add_deploy_subcommand(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``deploy local`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``).

    Sets ``func=run_deploy_command`` on the parsed namespace, like the other subcommands.
    """
    deploy = subparsers.add_parser(
        "deploy",
        help="run on Flower's deployment runtime (SuperLink and SuperNodes)",
        description="Run one fedprivopt run on Flower's deployment runtime. `local` starts a "
        "SuperLink and N SuperNodes on this machine (127.0.0.1), runs, and stops them.",
    )
    targets = deploy.add_subparsers(
        dest="deploy_command", metavar="TARGET", parser_class=type(deploy)
    )
    p = targets.add_parser(
        "local",
        help="SuperLink + N SuperNodes on this machine, one run, then stop",
        description="Start a SuperLink and N SuperNodes on 127.0.0.1 (TLS with a private CA and "
        "SuperNode keys by default), run the Flower app of this repository with the given "
        "preset and overrides, write the results like `fedprivopt simulate` (plus logs in "
        "OUT/deploy/), and stop every process.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from fedprivopt.cli_args import preset_path  # "~/x.toml" expanded, as --out's "~"

    p.add_argument(
        "config", nargs="?", type=preset_path, metavar="CONFIG", help="preset TOML file (optional)"
    )
    p.add_argument(
        "--nodes",
        required=True,
        metavar="N",
        help=f"number of SuperNodes, in [1, {MAX_LOCAL_NODES}], at most this machine's memory "
        "over 512 MiB (a node holds its ClientApp and the task) and at most the population",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--tls", action="store_true", help="encrypt every connection (default)")
    mode.add_argument("--insecure", action="store_true", help="no TLS, no node authentication")
    p.add_argument(
        "--no-node-auth", action="store_true", help="TLS without SuperNode authentication"
    )
    p.add_argument("--strategy", help="override the strategy")
    p.add_argument("--rounds", metavar="R", help="num-server-rounds")
    p.add_argument("--seed", metavar="S", help="root seed, in [0, 9223372036854775807]")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a run-config key, e.g. --set clip-norm=0.5 --set noise-multiplier=0.8",
    )
    p.add_argument(
        "--out", metavar="DIR", help="results directory (default runs/deploy-<strategy>-seed<S>)"
    )
    p.add_argument("--timeout", default="900", metavar="S",
                   help="seconds for the whole deployment, at most 30 days (default: 900)",
                   )  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run_deploy_command)
    deploy.set_defaults(func=run_deploy_command, deploy_command=None)
    return p
