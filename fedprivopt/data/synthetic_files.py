"""The files of a synthetic dataset's directory, its marker, and where none may be written.

:class:`SyntheticFiles` names the four files :func:`~fedprivopt.data.synthetic.generate` writes;
the marker ``stackoverflow.synthetic.json`` says they are this generator's
(:func:`read_marker`, :func:`is_synthetic_dir`) and records what it wrote, against which
:func:`foreign_sqlite` checks a ``stackoverflow.sqlite`` put there later. :data:`OUTPUT_FILES`
and :func:`run_files_around` / :func:`run_files_note` recognize a run, comparison or tuning
directory, into which neither ``data synth`` nor a task generates a dataset.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from fedprivopt.core.files import read_at_most
from fedprivopt.data.lock_files import directory_held
from fedprivopt.data.sqlite import SQLiteSplit, read_example_counts
from fedprivopt.data.vocab import TAG_COUNT_FILE, WORD_COUNT_FILE

__all__ = [
    "DATASET_FILES",
    "MARKER_GENERATOR",
    "OUTPUT_FILES",
    "SQLITE_FILE",
    "SYNTHETIC_META_FILE",
    "SyntheticFiles",
    "foreign_sqlite",
    "is_synthetic_dir",
    "read_marker",
    "run_files_around",
    "run_files_note",
]

SQLITE_FILE = "stackoverflow.sqlite"
SYNTHETIC_META_FILE = "stackoverflow.synthetic.json"
DATASET_FILES = (SQLITE_FILE, WORD_COUNT_FILE, TAG_COUNT_FILE)
_MARKER_LIMIT = 1 << 20  # bytes: the marker is about 1 kB; a larger file is not ours
MARKER_GENERATOR = "fedprivopt.data.synthetic"  # the marker's "generator": the files are ours

#: Files only fedprivopt's runs, comparisons and tunings write: a directory holding one is no
#: data directory, and neither ``data synth`` nor a task's synthetic generation writes into it
#: (fourteenth review of issue 15).
OUTPUT_FILES = (
    "privacy_ledger.jsonl",
    "checkpoint.pt",
    "run.lock",
    "compare.lock",
    "tune.json",
    "tune.lock",
)

#: Of :data:`OUTPUT_FILES`, the names no other tool is likely to write.
_DISTINCTIVE_OUTPUT_FILES = ("privacy_ledger.jsonl", "compare.lock", "tune.lock")


@dataclass(frozen=True)
class SyntheticFiles:
    """Paths of a generated dataset.

    Attributes
    ----------
    root, sqlite, word_count, tag_count, meta : pathlib.Path
        The directory, ``stackoverflow.sqlite``, ``stackoverflow.word_count``,
        ``stackoverflow.tag_count`` and ``stackoverflow.synthetic.json``.
    """

    root: Path
    sqlite: Path
    word_count: Path
    tag_count: Path
    meta: Path

    @classmethod
    def at(cls, root: str | os.PathLike) -> SyntheticFiles:
        """Return the file paths under ``root``."""
        r = Path(root)
        return cls(
            r, r / SQLITE_FILE, r / WORD_COUNT_FILE, r / TAG_COUNT_FILE, r / SYNTHETIC_META_FILE
        )

    def open(self, split: str = "train") -> SQLiteSplit:
        """Open one split of the SQLite file."""
        return SQLiteSplit(self.sqlite, split)


def run_files_around(directory: str | os.PathLike) -> tuple[Path, list[str]] | None:
    """The run, comparison or tuning ``directory`` is, or lies inside, and the files showing it.

    ``directory`` (resolved) is looked at for :data:`OUTPUT_FILES` and each of its ancestors
    for the distinctive ones (a ledger, ``compare.lock``, ``tune.lock``); the nearest that holds
    any is returned with their names, ``None`` when none does. Sixteenth
    review of issue 15: ``data synth --out C/runs`` (a comparison's ``runs/``, also
    ``C/runs/new`` or a directory inside a run) wrote the dataset there, rc 0, as only
    ``directory`` itself was looked at.
    """
    # where the files would go: links and ".." followed (realpath: a link loop is left as
    # written, where Path.resolve raised RuntimeError, a traceback with rc 1; thirty-first
    # review of issue 15, data: task-params.data-dir or cache-dir through a loop)
    real = Path(os.path.realpath(directory))
    for place in (real, *real.parents):
        # an ancestor by the names only ours write (a checkpoint.pt or tune.json alone may be
        # any project's)
        names = OUTPUT_FILES if place == real else _DISTINCTIVE_OUTPUT_FILES
        ours = [name for name in names if os.path.lexists(place / name)]
        if not ours and _deploying(place):
            ours = [f"{_DEPLOY_LOCK} (a deployment into it runs)"]
        if not ours and place != real and _starting(place):
            ours = [f"{_RUN_LOCK} (a run into it starts)"]
        if ours:
            return place, ours
    return None


#: The lock file of a running ``deploy local --out D`` (``deploy.local_checks``' ``LOG_DIR``
#: and ``DEPLOY_LOCK``, which this layer does not import).
_DEPLOY_LOCK = "deploy/deploy.lock"


def _deploying(place: Path) -> bool:
    """Whether a deployment into ``place`` runs: it holds ``place/deploy`` (a ``flock``).

    Follow-up of the forty-third review of issue 15 (outputs 5): ``deploy local --out D`` holds
    ``D/deploy`` from its start, some 30 s before its ServerApp writes a run's first file into
    ``D``; ``data synth --out D`` (or ``D/deploy``) in that window wrote the dataset there, rc 0,
    and the deployment then failed (``out directory D is not empty``). Asked with
    :func:`~fedprivopt.data.lock_files.directory_held`, as ``deploy local`` asks it; nothing
    written.
    """
    log_dir = place / Path(_DEPLOY_LOCK).parent
    return os.path.lexists(place / _DEPLOY_LOCK) and directory_held(log_dir)


#: A run directory's lock file (``simulation.files.LOCK_FILE``, which this layer does not import).
_RUN_LOCK = "run.lock"


def _starting(place: Path) -> bool:
    """Whether a run holds ``place`` with ``run.lock`` (a ``flock`` on the directory itself).

    Forty-seventh review of issue 15 (follow-up outputs 1; the processes reviewer's open row):
    while another process held ``R`` with only ``run.lock`` written (a run starting),
    ``fedprivopt.data.generate(R / "sub", ...)`` wrote the dataset into it, rc 0, where ``data
    synth --out R/sub`` refuses it (``simulation.run_places.refuse_inside_held``). Asked for an
    ancestor only: ``run.lock`` in the directory itself is refused held or not.
    """
    return os.path.lexists(place / _RUN_LOCK) and directory_held(place)


def run_files_note(directory: str | os.PathLike) -> str | None:
    """What shows ``directory`` is, or lies inside, a run, comparison or tuning (else ``None``).

    ``"holds F, G"`` or ``"is inside P, which holds F"`` (:func:`run_files_around`), for the
    one-line refusals of ``data synth --out`` and of a task's synthetic generation.
    """
    around = run_files_around(directory)
    if around is None:
        return None
    place, ours = around
    here = place == Path(os.path.realpath(directory))
    where = "holds" if here else f"is inside {place}, which holds"
    return f"{where} {', '.join(ours)}"


def is_synthetic_dir(root: str | os.PathLike) -> bool:
    """Whether ``root`` holds this generator's marker ``stackoverflow.synthetic.json``.

    :func:`~fedprivopt.data.synthetic.generate` writes the marker before any data
    (``"complete": false``) and rewrites it with the configuration at the end, so a directory it
    was interrupted in is recognized too.
    """
    meta = read_marker(Path(root) / SYNTHETIC_META_FILE)
    return isinstance(meta, dict) and meta.get("generator") == MARKER_GENERATOR


def foreign_sqlite(root: str | os.PathLike, *, links: bool = True) -> str | None:
    """Why ``root``'s ``stackoverflow.sqlite`` is not the one its complete marker describes.

    A complete marker records each split's clients and examples; a file whose
    ``client_metadata`` holds others (or that is not a readable database) was put there after
    the generation: ``None`` when they agree, or nothing can be compared (no file, a marker that
    is incomplete or not ours). With ``links=False`` a file that is a link (symbolic, or with
    other hard links) is not looked at: replacing it removes the link only (sixteenth review of
    issue 15, finding 5), and what it links to is kept.

    Thirty-fifth review of issue 15 (data): the real dataset decompressed into a directory that
    held a synthetic one (its marker left beside it) was replaced by ``data synth --overwrite``
    (rc 0), and a task with ``synth_*`` parameters that matched the marker used it as that
    synthetic dataset.
    """
    files = SyntheticFiles.at(root)
    marker = read_marker(files.meta)
    if not isinstance(marker, dict) or marker.get("generator") != MARKER_GENERATOR:
        return None
    clients, examples = marker.get("clients"), marker.get("examples")
    if not (isinstance(clients, dict) and isinstance(examples, dict)) or not files.sqlite.is_file():
        return None
    if not links and (files.sqlite.is_symlink() or files.sqlite.stat().st_nlink > 1):
        return None
    recorded = {
        s: (clients.get(s, 0), examples.get(s, 0)) for s in {*clients, *examples}
    }  # fmt: skip
    recorded = {s: sizes for s, sizes in recorded.items() if sizes != (0, 0)}
    try:
        counts = read_example_counts(files.sqlite)
    except (OSError, ValueError) as exc:
        return f"it is not the database the generator wrote ({exc})"
    found = {s: (int(c.size), sum(c.tolist())) for s, c in counts.items()}
    if found == recorded:
        return None
    said = ", ".join(f"{s} {n:,} clients/{e:,} examples" for s, (n, e) in sorted(found.items()))
    wrote = ", ".join(f"{s} {n}/{e}" for s, (n, e) in sorted(recorded.items()))
    return f"it holds {said or 'no client'}, where the generator wrote {wrote or 'none'}"


def read_marker(path: str | os.PathLike) -> object:
    """The JSON in the marker ``path``; ``None`` if it is missing, unreadable or not a file.

    Only a regular file of at most 1 MiB is read (eighteenth review of issue 15, finding 4: a
    marker that was a FIFO hung ``data synth`` and a task's synthetic generation in ``read``;
    finding 7: one of 20 GB ended in ``MemoryError``).
    """
    path = Path(path)
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return None
        raw = read_at_most(path, _MARKER_LIMIT)  # finding 7: a sparse 20 GB marker
        return None if raw is None else json.loads(raw.decode("utf-8"))
    except (OSError, ValueError):
        return None
