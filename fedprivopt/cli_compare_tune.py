"""``fedprivopt compare --tune-grid``: a comparison of privately tuned strategies.

With ``--tune-grid [STRATEGY:]KEY=V1,V2,...`` (repeatable) and ``--mean-trials K``, every cell
of ``compare``'s grid (strategy x noise multiplier x seed) is one private tuning
(Papernot & Steinke 2022): the ``fedprivopt tune`` of that strategy at that noise multiplier,
written into ``OUT/tune/<cell>/`` by ``tune`` itself (:func:`~fedprivopt.cli_tune.cmd_tune`), so
each directory is exactly what the equivalent ``fedprivopt tune`` command writes and
``compare-tuned`` can read it. Each tuning's seed is secret, as ``tune`` without ``--seed``
draws it: from OS entropy, kept only in the cell's ``tune.json`` (and reused from there by a
later call), so a cell's K and draws are not those of the public cell seed (tenth review of
issue 15, finding 2; the cell seed only names the cell). The report (``summary.csv``,
``report.md``, the two plots) is ``compare``'s, over each tuning's released trial at the ε of the
whole tuning (:func:`~fedprivopt.simulation.tune_report.load_tuned`, which checks the tuning and
recomputes that ε), with ``epsilon_single_run`` beside it.

A key without a ``STRATEGY:`` prefix is tuned for every strategy; a prefixed key for that
strategy only, in place of an unprefixed one of the same name. Every strategy compared must have
a key to tune: a tuned comparison has no untuned rows (show those beside with ``compare-tuned
OUT/tune/* --untuned``). ``noise-multiplier`` is the comparison's own axis
(``--noise-multipliers``) and cannot be tuned here.

Every flag, and every cell's tuning (its grid points, privacy bound and earlier trials: reused
only under the same plan and when identical, otherwise refused unless ``--overwrite``, which
starts a cell of another plan over as ``tune`` does), is checked before anything is written
(exit 2, one line naming the flag), with a progress bar unless ``--quiet``. The grid holds at
most 10,000 trials on average (tunings x ``--mean-trials``), checked before any tuning is
planned. ``--mean-trials``, ``--distribution`` and ``--nb-shape`` without ``--tune-grid`` are
refused.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

from fedprivopt.cli_args import Parser, UsageError, check_out_dir, float_range
from fedprivopt.cli_compare_tune_report import report

__all__ = ["TUNE_DIR", "add_compare_tune", "cmd_compare"]

TUNE_DIR = "tune"
"""``OUT/tune/<cell>/``: one ``fedprivopt tune`` directory per cell."""
PLANNING_EVERY_S = 2.0
"""Seconds between the lines that show the cells' checks on a stream that is not a terminal."""
_TUNE_FLAGS = (("mean_trials", "--mean-trials"), ("distribution", "--distribution"),
               ("nb_shape", "--nb-shape"))  # fmt: skip
_TNB = "truncated-negative-binomial"


def _usage(exc: Exception, where: str = "") -> UsageError:
    """``exc`` as a usage error naming ``--tune-grid`` where ``tune`` named its ``--grid``."""
    text = str(exc).replace("argument --grid", "argument --tune-grid")
    return UsageError(text + (f" ({where})" if where else ""))


def _split_grid(texts: list[str], strategies: list[str]) -> dict[str, list[str]]:
    """``--tune-grid`` texts per strategy: ``S:KEY=...`` for ``S``, unprefixed keys for all.

    A prefixed key replaces the unprefixed one of the same name for its strategy.
    """
    from fedprivopt.core.text import shown
    from fedprivopt.simulation.tune import parse_grid
    from fedprivopt.simulation.tune_grid import keys_set_for

    shared: list[str] = []
    own: dict[str, list[str]] = {name: [] for name in strategies}
    for text in texts:
        key, sep, _ = text.partition("=")
        prefix, colon, bare = key.partition(":")
        if not sep or not colon:
            shared.append(text)
            continue
        prefix = prefix.strip()
        if prefix not in own:
            raise UsageError(
                f"argument --tune-grid: {shown(text)} names {shown(prefix)}, which is not a "
                f"compared strategy ({', '.join(strategies)})"
            )
        own[prefix].append(f"{bare}{text[len(key) :]}")
    out: dict[str, list[str]] = {}
    for name in strategies:
        mine = {t.partition("=")[0].strip() for t in own[name]}
        out[name] = [t for t in shared if t.partition("=")[0].strip() not in mine] + own[name]
    for name, grid_texts in out.items():
        if not grid_texts:
            raise UsageError(
                f"argument --tune-grid: no key to tune for {name}; give one for every strategy "
                f"(e.g. --tune-grid {name}:server-learning-rate=0.1,1) or leave it out of "
                "--strategies (a tuned comparison has no untuned rows)"
            )
        try:
            grid = parse_grid(grid_texts)
        except ValueError as exc:
            raise _usage(exc, f"for {name}") from None
        if any("noise-multiplier" in keys_set_for(k, v, name) for k, v in grid.items()):
            raise UsageError(
                "argument --tune-grid: noise-multiplier is the comparison's axis "
                "(--noise-multipliers); tune it with fedprivopt tune"
            )
    return out


def _tune_argv(args: argparse.Namespace, out: Path, cell, grid: list[str], sets: dict) -> list:
    """The ``fedprivopt tune`` command line (without the program name) of one cell."""
    from fedprivopt.strategies.config import NON_PRIVATE

    s = cell.config.strategy
    argv = ["tune", str(args.config), "--strategy", s.strategy]
    argv += [f"--grid={text}" for text in grid]
    argv += ["--mean-trials", repr(args.mean_trials), "--distribution", args.distribution or _TNB]
    if args.nb_shape is not None:
        argv += ["--nb-shape", repr(args.nb_shape)]
    argv += ["--out", str(out / TUNE_DIR / cell.label)]  # no --seed: a secret one (finding 2)
    argv += [f"--set={text}" for text in args.set or []]
    if s.strategy not in NON_PRIVATE and "noise-multiplier" not in sets:
        argv.append(f"--set=noise-multiplier={s.noise_multiplier!r}")
    if args.tensorboard:
        argv.append("--set=tensorboard=true")
    for flag, value in (("--engine", args.engine), ("--rounds", args.rounds),
                        ("--metric", args.metric)):  # fmt: skip
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--selection-on-private-users"] * bool(getattr(args, "selection_on_private_users",
                                                            False))  # fmt: skip
    return argv + ["--overwrite"] * bool(args.overwrite) + ["--quiet"] * bool(args.quiet)


def _tune_namespace(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed by ``tune``'s own parser (its flags, types and defaults)."""
    from fedprivopt.cli_tune import add_tune

    parser = Parser(prog="fedprivopt")
    add_tune(parser.add_subparsers(dest="command", parser_class=Parser))
    ns = parser.parse_args(argv)
    ns.in_comparison = True  # the comparison replaces a cell and its report together
    return ns


def _check_tuning(ns: argparse.Namespace) -> None:
    """Every check ``fedprivopt tune`` makes before it writes, without writing (in its order).

    The tuning seed is the one ``tune`` without ``--seed`` takes (the cell's ``tune.json``, or
    OS entropy); it is kept in ``ns.secret_seed``, so the tuning run later is the one checked.
    A cell of another plan is refused naming the flag, or with ``--overwrite`` only checked to
    be removable (tenth review of issue 15, finding 3).
    """
    from fedprivopt.cli_tune_setup import prepare_tuning
    from fedprivopt.simulation.cell_plans import plan_cells
    from fedprivopt.simulation.tune_dir import check_leftover_trials, check_vanished_trials
    from fedprivopt.simulation.tune_replan import check_discardable, check_plan

    setup = prepare_tuning(ns)
    ns.secret_seed = setup.seed if setup.secret else None
    if check_plan(setup.out, setup.document, overwrite=ns.overwrite):
        check_discardable(setup.out)  # tune discards it and starts over
        return
    check_leftover_trials(setup.out, [c.label for c in setup.cells])
    check_vanished_trials(setup.out)  # forty-fifth review of issue 15 (reports, finding 3)
    plan_cells(setup.out, setup.cells, overwrite=ns.overwrite)  # earlier trials: if identical


class _Planning:
    """Progress of the checks before the first tuning (tenth review of issue 15, finding 4).

    A transient rich bar on a terminal; elsewhere a line ``checking tuning i/n: CELL`` once
    planning has taken :data:`PLANNING_EVERY_S` and at most that often (a refusal of a quick
    plan stays one line); nothing with ``--quiet``.
    """

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.bar = total, enabled, None
        self.next_line = time.monotonic() + PLANNING_EVERY_S
        if enabled and sys.stderr.isatty():
            from fedprivopt.core.progress import stderr_bar

            self.bar, self.task = stderr_bar(
                "checking tunings", total, field="cell", transient=True
            )

    def step(self, index: int, label: str) -> None:
        """Cell ``index`` (from 1) is being checked."""
        if self.bar is not None:
            self.bar.update(self.task, completed=index - 1, cell=label)
        elif self.enabled and time.monotonic() >= self.next_line:
            print(f"checking tuning {index}/{self.total}: {label}", file=sys.stderr, flush=True)
            self.next_line = time.monotonic() + PLANNING_EVERY_S

    def close(self) -> None:
        """Remove the bar."""
        if self.bar is not None:
            self.bar.stop()


def _foreign_beside_tune(out: Path, reports: list[str]) -> list[str]:
    """The entries that make ``out`` (holding ``tune/`` and reports) not a tuned comparison's.

    Twenty-seventh review of issue 15: ``compare --tune-grid ... --out P``, where ``P`` held
    an empty ``tune/`` and the user's ``report.md`` and ``summary.csv``, replaced both (rc 0).
    ``tune/`` of a tuned comparison holds only cells' tuning directories (named as
    :func:`~fedprivopt.simulation.cells.cell_label` names a cell), and a report stands beside
    at least one (as :func:`~fedprivopt.simulation.cells.check_compare_dir` requires of
    ``runs/``).
    """
    from fedprivopt.simulation.cells import CELL_NAME
    from fedprivopt.simulation.tune_plan import PLAN_FILE

    tune = out / TUNE_DIR
    if tune.is_symlink() or not tune.is_dir():
        return [TUNE_DIR]
    cells = sorted(tune.iterdir())
    foreign = [
        f"{TUNE_DIR}/{p.name}"
        for p in cells
        if not CELL_NAME.match(p.name) or p.is_symlink() or not p.is_dir()
    ]
    # a cell counts only when it holds its tuning's plan (twenty-ninth review: an empty
    # tune/<cell>/ beside the user's report let it be replaced)
    if not foreign and reports and not any((p / PLAN_FILE).is_file() for p in cells):
        foreign = reports  # a report with no tuning beside it: not one compare wrote
    return foreign


def check_tuned_compare_dir(out: Path) -> None:
    """Refuse an ``--out`` holding anything but an earlier tuned comparison's files.

    Raises
    ------
    ValueError
        Naming ``--out`` and the first foreign entry (an untuned comparison's ``runs/`` too).
    """
    from fedprivopt.simulation.cells import COMPARE_LOCK, REPORT_FILES

    if not out.is_dir():
        return
    allowed = {TUNE_DIR, COMPARE_LOCK, *REPORT_FILES}
    names = sorted(p.name for p in out.iterdir())
    foreign = [n for n in names if n not in allowed] or (
        [] if not names or (out / TUNE_DIR).is_dir() else names
    )
    if not foreign and names:
        foreign = _foreign_beside_tune(out, [n for n in names if n in REPORT_FILES])
    if foreign:
        raise ValueError(
            f"argument --out: {str(out)!r} holds {foreign[0][:60]!r}, which compare --tune-grid "
            "did not write (it writes tune/ and the report; an untuned comparison's runs/ "
            "cannot share it); choose a new or empty directory"
        )


def cmd_compare(args: argparse.Namespace) -> int:
    """``fedprivopt compare``: untuned (:func:`~fedprivopt.cli_compare.cmd_compare`) or tuned."""
    from fedprivopt.cli_compare import cmd_compare as untuned

    if not args.tune_grid:
        for name, flag in _TUNE_FLAGS:
            if getattr(args, name) is not None:
                raise UsageError(f"argument {flag}: applies only with --tune-grid")
        return untuned(args)
    if args.mean_trials is None:
        raise UsageError("argument --mean-trials: required with --tune-grid")
    if args.jobs != 1:
        raise UsageError("argument --jobs: applies only without --tune-grid")
    return _compare_tuned(args)


def _compare_tuned(args: argparse.Namespace) -> int:
    """Check every cell's tuning, run them under ``OUT``'s lock, write the report."""
    from fedprivopt.cli_compare import compare_cells, compare_overrides
    from fedprivopt.cli_runs import load_preset
    from fedprivopt.cli_tune import cmd_tune
    from fedprivopt.simulation.cells import check_vanished_cells, lock_compare_dir, remove_report

    out = check_out_dir(args.out)
    try:
        check_tuned_compare_dir(out)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    sets = compare_overrides(args)
    cells = compare_cells(args, load_preset(args.config, sets))
    grids = _split_grid(args.tune_grid, list(dict.fromkeys(c.config.strategy.strategy
                                                           for c in cells)))  # fmt: skip
    tunings = []
    progress = _Planning(len(cells), enabled=not args.quiet)
    try:
        for i, cell in enumerate(cells, 1):
            progress.step(i, cell.label)
            argv = _tune_argv(args, out, cell, grids[cell.config.strategy.strategy], sets)
            ns = _tune_namespace(argv)
            try:
                _check_tuning(ns)
            except (UsageError, ValueError) as exc:
                raise _usage(exc, f"tuning of cell {cell.label}") from None
            tunings.append((cell, ns, argv))
    finally:
        progress.close()
    _refuse_copied_cells(out, tunings)
    (out / TUNE_DIR).mkdir(parents=True, exist_ok=True)
    locked = contextlib.ExitStack()
    try:
        locked.enter_context(lock_compare_dir(out))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with locked:
        try:
            check_vanished_cells(out, TUNE_DIR)  # a tuning removed (45th review, lead 4)
            remove_report(out)  # before a tuning changes: no stale report is left behind
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        for i, (cell, ns, _) in enumerate(tunings, 1):
            if not args.quiet:  # --quiet: only the report line, or one line on error
                print(f"[{i}/{len(tunings)}] {cell.label} (tuning)", file=sys.stderr, flush=True)
            # tune's line to stderr (stdout: the report), or nowhere with --quiet
            with contextlib.redirect_stdout(io.StringIO() if args.quiet else sys.stderr):
                try:
                    cmd_tune(ns)
                except (UsageError, ValueError) as exc:  # changed since the check
                    raise _usage(exc, f"tuning of cell {cell.label}") from None
        return report(args, out, tunings)


def _refuse_copied_cells(out: Path, tunings: list) -> None:
    """Refuse two cells of one tuning seed: a cell's directory copied into another's place.

    Thirty-fourth review of issue 15 (tuning, finding 2): ``cp -r OUT/tune/CELL0 OUT/tune/CELL1``
    then ``compare --tune-grid … --seeds 2`` ran (CELL1 took CELL0's secret seed from its
    ``tune.json``, so both were one tuning), then ended rc 2 after the tunings, its report
    removed, with compare-tuned's words ``TUNED: 'OUT/tune/CELL1' has the tuning seed of …``,
    a flag ``compare`` does not have. Now refused before anything is written, naming both cells.
    """
    from fedprivopt.simulation.tune_plan import PLAN_FILE

    first: dict[int, str] = {}
    for cell, ns, _ in tunings:
        seed = getattr(ns, "secret_seed", None)
        if seed is None:
            continue
        if seed in first:
            raise UsageError(
                f"argument --out: {str(out / TUNE_DIR / cell.label)!r} holds the tuning of "
                f"{str(out / TUNE_DIR / first[seed])!r} (the same secret tuning seed in its "
                f"{PLAN_FILE}: a copy), and one tuning cannot be two seeds of a row; remove "
                f"{str(out / TUNE_DIR / cell.label)!r} to tune that cell afresh"
            )
        first[seed] = cell.label


def add_compare_tune(sub) -> None:
    """Add ``--tune-grid`` and the trial-count flags to the ``compare`` subcommand of ``sub``."""
    from fedprivopt.privacy.tuning import MAX_MEAN_TRIALS, MAX_SHAPE, TRIAL_DISTRIBUTIONS

    p = sub.choices["compare"]
    p.description += (
        " With --tune-grid, every cell is instead a private tuning (fedprivopt tune without "
        "--seed: its tuning seed drawn from OS entropy and kept in its tune.json) in "
        "OUT/tune/<cell>/, and the report is over each tuning's released trial at the epsilon "
        "that includes the tuning, with epsilon_single_run beside it; the grid then runs at "
        "most 10,000 trials on average (tunings x --mean-trials)."
    )
    p.epilog = p.epilog.replace("example:", "examples:", 1) + (
        "\n  fedprivopt compare simulations/toy.toml --strategies dp-fedavg,dp-fedadam "
        "--tune-grid server-learning-rate=0.3,1 --tune-grid dp-fedadam:server-learning-rate="
        "0.01,0.05 --mean-trials 3 --seeds 2"
    )
    p.add_argument("--tune-grid", action="append", metavar="[STRATEGY:]KEY=V1,V2,...",
                   help="tune every cell privately over this preset key (repeatable; with a "
                   "STRATEGY: prefix for that strategy only, replacing an unprefixed KEY; "
                   "every strategy needs a key)",
                   )  # fmt: skip
    p.add_argument(
        "--mean-trials",
        type=float_range(1.0, MAX_MEAN_TRIALS, lo_open=False, hi_open=False),
        metavar="K",
        help=f"with --tune-grid: mean number of trials per tuning, in [1, {MAX_MEAN_TRIALS:g}]",
    )
    p.add_argument("--distribution", choices=TRIAL_DISTRIBUTIONS,
                   help=f"with --tune-grid: distribution of the number of trials ({_TNB} "
                   "unless given)")  # fmt: skip
    p.add_argument(
        "--nb-shape",
        type=float_range(0.0, MAX_SHAPE, lo_open=False, hi_open=False),
        metavar="ETA",
        help=f"with --tune-grid: shape of the truncated negative binomial, in [0, {MAX_SHAPE:g}]"
        " (default 1)",
    )
    p.add_argument("--selection-on-private-users", action="store_true",
                   help="with --tune-grid: tune although the task's evaluation users are in the "
                   "private population; the selection is then NOT covered by epsilon")  # fmt: skip
    p.set_defaults(func=cmd_compare)
