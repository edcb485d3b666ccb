"""Checks of ``compare-tuned``'s ``--untuned`` runs and ``--out``.

An untuned row stands for hyperparameters that were *not* chosen on the private data by a
tuning. A trial of a tuning (a run directory inside a tuning's ``runs/``) is such a choice: shown
as an untuned row it would be reported at its single run's ε, below what its tuning spent, so
:func:`check_untuned_path` refuses it. Untuned runs of one strategy and noise multiplier make one
row whose runs are its seeds: :func:`check_untuned_seeds` refuses runs that differ in another
hyperparameter, as :func:`~fedprivopt.simulation.tune_check.check_tunings` does for tunings.
:func:`check_untuned_files` gives each untuned run the checks of ``--resume``.
:func:`check_out_outside` keeps the report out of every tuning given, and
:func:`check_report_dir` out of a directory that holds anything but its own earlier report.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedprivopt.core.text import shown

__all__ = [
    "REPORT_TITLE",
    "check_out_outside",
    "check_report_dir",
    "check_untuned_copies",
    "check_untuned_files",
    "check_untuned_path",
    "check_untuned_seeds",
    "tuned_comparison_cells",
]


def _tuning_of(path: Path) -> Path | None:
    """The tuning directory whose ``runs/`` holds (or is) ``path``, or that ``path`` is."""
    from fedprivopt.simulation.tune_plan import PLAN_FILE

    path = path.resolve()
    if (path / PLAN_FILE).exists():
        return path
    for folder in (path, *path.parents):
        if folder.name == "runs" and (folder.parent / PLAN_FILE).exists():
            return folder.parent
    return None


def _tunings_in(path: Path) -> list[Path]:
    """The tuning directories (holding a ``tune.json``) in ``path``; none if it is unreadable."""
    from fedprivopt.simulation.tune_plan import PLAN_FILE

    try:
        return sorted(p for p in path.iterdir() if (p / PLAN_FILE).is_file())
    except OSError:
        return []


def tuned_comparison_cells(path: str | Path) -> list[Path]:
    """The cells' tunings of a tuned comparison ``path`` (``compare --tune-grid``'s ``OUT``).

    Empty when ``path`` is no such comparison: its ``tune/`` holds no directory with a
    ``tune.json``.
    """
    return _tunings_in(Path(path) / "tune")  # cli_compare_tune.TUNE_DIR


def check_untuned_path(text: str, runs: Sequence[Any] = ()) -> None:
    """Refuse an ``--untuned`` path (or one of its loaded ``runs``) inside a tuning's ``runs/``.

    A directory holding tunings (a tuned comparison's ``tune/``), or a tuned comparison
    (:func:`tuned_comparison_cells`), is refused likewise.

    Raises
    ------
    ValueError
        Naming ``--untuned``, the path and the tuning.
    """
    # thirty-fourth review of issue 15 (tuning, finding 3): a directory of tunings (a tuned
    # comparison's tune/) was refused as "…/metrics.jsonl: missing", not as tunings
    cells = tuned_comparison_cells(text)
    if cells:
        raise ValueError(
            f"argument --untuned: {shown(str(text))} is a tuned comparison (compare --tune-grid): "
            f"its {len(cells)} cells are tunings, whose hyperparameters were chosen on the "
            f"private data; give them as TUNED ({shown(str(Path(text) / 'tune' / '*'))})"
        )
    for path in (Path(text), *_tunings_in(Path(text)), *(Path(r.path) for r in runs)):
        tuning = _tuning_of(path)
        if tuning is not None:
            raise ValueError(
                f"argument --untuned: {shown(str(path))} is (or holds) a trial of the tuning "
                f"{shown(str(tuning))}; its hyperparameters were chosen on the private data, so "
                "it cannot be an untuned run (give the tuning as TUNED)"
            )


def _config(run: Any):
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.files import CONFIG_FILE

    try:
        config = load_config(Path(run.path) / CONFIG_FILE)
    except (OSError, ValueError):
        return None
    except RecursionError:  # nineteenth review of issue 15, finding 7: a traceback
        raise ValueError(
            f"argument --untuned: {shown(str(run.path))}: its {CONFIG_FILE} is nested too deeply "
            "to read (not written by fedprivopt)"
        ) from None
    import dataclasses

    return dataclasses.replace(config, strategy=dataclasses.replace(config.strategy, seed=0))


def check_untuned_files(runs: Sequence[Any]) -> None:
    """Every check ``--resume`` makes, for each untuned run's files (``ValueError`` naming it).

    Sixteenth review of issue 15: a run whose ledger was edited to σ 50 (header and lines), with
    the rows' and summary's ε lowered to match and ``config.toml`` and the checkpoints kept, was
    reported as an untuned row of σ 0.5 at ε 0.0235, where it spent 13.70; ``--resume`` and
    ``compare`` refuse it (its configuration is not its ledger's), ``compare-tuned`` did not
    check. The run is read, not locked (an archive on a read-only disk is compared too).

    A run that is not finished (its ``config.toml`` asks for more rounds than its checkpoint
    and ledger hold, beside an earlier ``summary.json``) is refused as ``compare`` refuses to
    report one (thirty-first review of issue 15, compare finding 12: reported as final, rc 0);
    a run whose ledger is missing is reported from its files as they are, as before.
    """
    from fedprivopt.simulation.audit import audit_run_dir

    for run in runs:
        try:
            state = audit_run_dir(Path(run.path), engine=False)
            state.refuse_trial()  # a copied trial too
            why = None if state.ledger is None else state.unfinished()
            if why is not None:  # thirty-first review of issue 15, compare finding 12
                raise ValueError(f"it is not finished: {why}; --resume it first")
        except ValueError as exc:
            raise ValueError(
                f"argument --untuned: {run.path} fails the checks of --resume ({exc}); it "
                "cannot be reported"
            ) from None


def _released_digests(run_dir: Path) -> set[str]:
    """The digests of the models ``run_dir``'s privacy ledger records as released, with its seed.

    Each is ``"<seed>:<digest>"``, the seed the ledger's header records. Twenty-ninth review
    of issue 15: ``compare toy.toml --strategies fedavg --seeds 3 --set
    server-learning-rate=1e39`` then ``compare-tuned T --untuned C`` was refused as "one run
    given twice, or a copy": seeds that diverge release the same overflowed model, so their
    digests alone matched. A copy keeps its seed; runs of other seeds are other computations.

    A run without a readable ledger: the models its checkpoints hold, with its
    ``config.toml``'s seed (:func:`_checkpoint_digests`).
    """
    from fedprivopt.simulation.ledger import RunLedger

    try:
        ledger = RunLedger.read(run_dir)
    except (ValueError, OSError):
        ledger = None
    if ledger is None:
        return _checkpoint_digests(run_dir)
    settings = ledger.header.get("settings")
    seed = settings.get("seed") if isinstance(settings, dict) else None
    return {f"{seed}:{e.params_sha256}" for e in ledger.entries if e.params_sha256}


def _checkpoint_digests(run_dir: Path) -> set[str]:
    """``"<seed>:<digest>"`` of the models ``run_dir``'s checkpoints hold (none if unreadable).

    Fortieth review of issue 15 (reports, finding 1): a trial copied out of its tuning with its
    ``privacy_ledger.jsonl`` deleted (``cp -r T/runs/trial-002 R; rm R/privacy_ledger.jsonl``)
    kept neither the ledger's tuning plan nor its digests, and ``compare-tuned T --untuned R``
    reported it as an untuned row at its single run's epsilon (10.28 where the tuning spent
    13.09); an untuned run and its copy without a ledger were one row of "2 seeds", ``± 0``.
    A checkpoint holds the model its round released, whose digest the ledger's line records
    (the check of ``--resume``), so the copy is still told by its checkpoints' models.
    """
    import torch

    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.files import CHECKPOINT, CONFIG_FILE, PREVIOUS_CHECKPOINT
    from fedprivopt.simulation.ledger_lines import params_sha256

    try:
        seed = load_config(run_dir / CONFIG_FILE).strategy.seed
    except (OSError, ValueError, RecursionError):
        return set()
    digests = set()
    for name in (CHECKPOINT, PREVIOUS_CHECKPOINT):
        path = run_dir / name
        try:
            if not path.is_file():  # a FIFO or device is never read
                continue
            state = torch.load(path, map_location="cpu", weights_only=True)
            params = state["algorithm"]["params"]
        except Exception:  # an unreadable checkpoint holds no model to match
            continue
        if isinstance(params, torch.Tensor):
            digests.add(f"{seed}:{params_sha256(params)}")
    return digests


def _has_ledger(run: Any) -> bool:
    from fedprivopt.simulation.files import LEDGER_FILE

    return (Path(run.path) / LEDGER_FILE).exists()


def check_untuned_copies(tuned: Sequence[Path], runs: Sequence[Any]) -> None:
    """Refuse an untuned run that released a model a trial of a given tuning released.

    Sixteenth review of issue 15: a trial's directory copied out of the tuning (``cp -r
    T/runs/trial-001 R``) was reported by ``compare-tuned T --untuned R`` as an untuned row at
    its single run's ε, below its tuning's; a path inside the tuning was already refused. A
    released model's digest (``params_sha256`` of the ledger's round lines) is shared only by
    the same computation: the same hyperparameters and run seed, which a trial draws from its
    tuning's seed.
    """
    trials: dict[str, Path] = {}
    for tuning in tuned:
        root = Path(tuning) / "runs"
        for trial in sorted(root.iterdir()) if root.is_dir() else ():
            for digest in _released_digests(trial):
                trials.setdefault(digest, trial)
    for run in runs:
        shared = sorted(_released_digests(Path(run.path)) & trials.keys())
        if shared:
            kept = ("their privacy ledgers" if _has_ledger(run)
                    else "the trial's privacy ledger and this run's checkpoints")  # fmt: skip
            raise ValueError(
                f"argument --untuned: {shown(str(run.path))} released the models of "
                f"{shown(str(trials[shared[0]]))} (the same digests in {kept}): "
                "it is a copy of a trial, whose hyperparameters were chosen on the private "
                "data, so it cannot be an untuned run (give the tuning as TUNED)"
            )


def _refuse_repeated_runs(runs: Sequence[Any]) -> None:
    """Refuse one run given twice, or a copy of another: it would count as two seeds.

    Nineteenth review of issue 15, finding 8: ``compare-tuned T --untuned R --untuned R`` (also
    ``R/../R``, or ``R`` and ``cp -r R R2``) reported the untuned row with 2 seeds and a std of
    0, where a tuning given twice is refused. A copy is told by the released models' digests
    (shared only by the same computation; two secure runs of one seed differ).
    """
    seen: dict[Path, Any] = {}
    released: dict[str, Any] = {}
    for run in runs:
        path = Path(run.path).resolve()
        other = seen.get(path)
        if other is None:
            shared = sorted(_released_digests(path) & released.keys())
            other = released[shared[0]] if shared else None
        if other is not None:
            raise ValueError(
                f"argument --untuned: {shown(str(run.path))} is {shown(str(other.path))} again, "
                "or a copy of it (the same released models); a run counts once, not as two seeds"
            )
        seen[path] = run
        released.update(dict.fromkeys(_released_digests(path), run))


def check_untuned_seeds(runs: Sequence[Any]) -> None:
    """Refuse untuned runs of one strategy and σ whose configurations differ beyond the seed.

    Also one run given twice, or a copy of one (:func:`_refuse_repeated_runs`).

    Raises
    ------
    ValueError
        Naming ``--untuned``, both runs and the first differing key.
    """
    from fedprivopt.simulation.cell_plans import first_difference

    # forty-third review of issue 15 (reports, finding 5): a one-shot iterable of runs was read
    # to its end by the repeated-runs check, and runs of other configurations passed as seeds
    runs = list(runs)
    _refuse_repeated_runs(runs)
    first: dict[tuple, tuple[Any, Any]] = {}
    for run in runs:
        config = _config(run)
        if config is None:
            continue
        key = (run.strategy, run.noise_multiplier)
        if key not in first:
            first[key] = (run, config)
            continue
        other, other_config = first[key]
        diff = first_difference(other_config, config)
        if diff is not None:
            name, old, new = diff
            raise ValueError(
                f"argument --untuned: {shown(str(run.path))} has {name} = {shown(new)}, "
                f"{shown(str(other.path))} {shown(old)}; runs of one strategy and noise "
                "multiplier are its seeds only when their configurations differ in the seed alone"
            )


def check_out_outside(out: Path, tuned: Sequence[str]) -> None:
    """Refuse an ``--out`` equal to or inside a TUNED directory.

    Raises
    ------
    ValueError
        Naming ``--out`` and the tuning.
    """
    resolved = out.resolve()
    for text in tuned:
        root = Path(text).resolve()
        if resolved == root or root in resolved.parents:
            raise ValueError(
                f"argument --out: {shown(str(out))} is inside the tuning {shown(text)}; writing "
                "there would change the tuning; choose a directory outside it"
            )


REPORT_TITLE = "fedprivopt compare-tuned"
"""The title of ``compare-tuned``'s report: the first line of its ``report.md`` is ``# `` and it."""


def check_report_dir(out: Path) -> None:
    """Refuse an ``--out`` that holds anything but an earlier ``compare-tuned`` report.

    The report's file names alone do not make a directory ours: a user's own ``report.md`` or
    ``summary.csv`` there was replaced (eleventh review of issue 15, finding 6). Its files are
    ours when its ``report.md`` is a regular file whose first line is ``# compare-tuned``'s
    title.

    Raises
    ------
    ValueError
        Naming ``--out`` and the first entry compare-tuned did not write.
    """
    from fedprivopt.simulation.cells import REPORT_FILES

    if not out.is_dir():
        return
    names = sorted(p.name for p in out.iterdir())
    foreign = [name for name in names if name not in REPORT_FILES]
    if names and not foreign and not _own_report(out / "report.md"):
        foreign = names
    if foreign:
        raise ValueError(
            f"argument --out: {str(out)!r} holds {foreign[0]!r}, which compare-tuned did not "
            "write; choose a new or empty directory"
        )


def _own_report(path: Path) -> bool:
    """Whether ``path`` is a regular file that starts with compare-tuned's title line."""
    try:
        if not path.is_file():  # a FIFO or device is never read
            return False
        with open(path, "rb") as handle:
            first = handle.readline(200)
    except OSError:
        return False
    return first.rstrip(b"\r\n") == f"# {REPORT_TITLE}".encode()
