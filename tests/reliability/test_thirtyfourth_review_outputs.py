r"""Issue 15, thirty-fourth review (outputs under a hostile environment): regression tests.

1. ``ulimit -f 4; fedprivopt simulate toy.toml --rounds 20 --tensorboard --out R`` (also a
   full disk, a 1 MB tmpfs with 3 to 4 pages free; the TensorBoard event file is the first file
   past the limit): ``SummaryWriter``'s writer thread printed ``Exception in thread Thread-1:``
   and a 16-line traceback (``OSError: [Errno 27] File too large``), then the command ended
   ``error: argument --out: R: [Errno 27] File too large``, rc 2, naming the run directory, not
   the file; when the event file could not be created at the start, the thread's traceback was
   cut off by the exit (38-44 lines, varying). Now the events are written in the command's
   thread (``simulation/tensorboard.py``, TensorBoard's record format) and a failed write is
   one line naming the event file, rc 2; the ledger, rows and last checkpoint are kept and
   ``--resume`` with the limit lifted completes the run, every round once in TensorBoard.
2. ``MPLBACKEND=bogus fedprivopt compare toy.toml --strategies dp-fedavg --rounds 1 --out C``
   (a misspelt backend, or one left from another tool): every cell ran, then rc 2 with
   ``error: Key backend: 'bogus' is not a valid value for backend; supported values are
   [...]`` (matplotlib's import validating the variable), naming no variable, and no
   ``report.md`` or plots. The plots use no backend (an Agg canvas): ``report_plots``
   imports matplotlib without the variable when it is invalid, and the report and plots are
   written as without it (the same PNG bytes, checked by hand); the variable is left as it was.
3. ``LC_ALL=C PYTHONUTF8=0 fedprivopt simulate stackoverflow-tp-mini.toml --set
   'task-params.data-dir="/tmp/dätä"'`` (an ASCII locale; also a task of one's own with a
   non-ASCII text parameter): rc 2, ``error: 'ascii' codec can't encode characters in position
   741-742: ordinal not in range(128)``, naming nothing, the run not started: ``config.toml``
   was written in the locale's encoding (under Latin-1 or a Windows code page, in that
   encoding, which TOML's reader refuses on ``--resume``). A value whose bytes are not UTF-8
   (``data-dir`` ``/tmp/d\xff``) ended ``error: 'utf-8' codec can't encode character '\udcff'
   … surrogates not allowed``. Now every text a run writes is UTF-8 (``files.write_synced``,
   ``atomic_write``), and text with no UTF-8 form is one line naming the file: ``R/config.toml:
   cannot hold '\udcff', bytes of a name or value that are not UTF-8 …``.
4. ``fedprivopt simulate toy.toml --tensorboard --out $'R\xff'`` (a directory whose name is
   not UTF-8, e.g. Latin-1; Python keeps it as ``'R\udcff'``): rc 2, ``error: 'utf-8' codec
   can't encode character '\udcff' in position 3: surrogates not allowed``, the run not
   started (without ``--tensorboard`` it ran): the event file's suffix was measured with
   ``str.encode()``. Now in the file system's bytes (``os.fsencode``), cut between characters:
   rc 0, the event file ends with the directory's bytes. (TensorBoard's own reader takes only
   UTF-8 paths; the file reads back when copied.)
5. A run's progress bar at a terminal (``script -qec "fedprivopt simulate …"``) of a task by
   reference whose metric is named ``acc[top1]``: the bar read ``eval_acc=0.6133`` (rich took
   ``[top1]`` for a style; ``[a-z]+`` showed as ``+``), and text holding ``[/x]`` ended the
   bar's refresh thread in ``rich.errors.MarkupError: closing tag '[/x]' … doesn't match any
   open tag`` (a traceback on stderr). The label and field of ``core.progress.stderr_bar`` are
   now plain text.
"""

from __future__ import annotations

import errno
import locale
import os
import resource
import shutil
import sys
import threading
from pathlib import Path

import pytest
import tomllib
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedprivopt.cli import main
from fedprivopt.core.progress import stderr_bar
from fedprivopt.simulation.files import (
    CONFIG_FILE,
    LEDGER_FILE,
    METRICS_FILE,
    read_lines,
    read_rows,
)
from fedprivopt.simulation.report_plots import plot_metric_vs_round
from fedprivopt.simulation.rundata import load_runs
from fedprivopt.simulation.tensorboard import TensorBoardLog

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


class _FileSizeLimit:
    """Within the block, no file of this process may grow beyond ``limit`` bytes (EFBIG).

    Python ignores SIGXFSZ, so a write past the soft limit fails with ``File too large``.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def __enter__(self) -> None:
        self.saved = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, self.saved[1]))

    def __exit__(self, *exc: object) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, self.saved)


@pytest.fixture
def thread_errors(monkeypatch) -> list[BaseException]:
    """Exceptions that ended a thread (``threading.excepthook``), instead of printing them."""
    seen: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen


def _steps(run: Path, tag: str) -> list[int]:
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    return [event.step for event in acc.Scalars(tag)]


def test_1_an_event_file_that_cannot_grow_is_named_by_the_raised_error(tmp_path, thread_errors):
    log = TensorBoardLog(tmp_path, first_round=1)
    (event_file,) = tmp_path.glob("events.out.tfevents.*")
    row = {"round": 1, "epsilon": 1.0, **{f"eval_m{i}": float(i) for i in range(40)}}
    with pytest.raises(OSError) as caught, _FileSizeLimit(event_file.stat().st_size + 600):
        for r in range(1, 20):
            log.add_row({**row, "round": r})
    assert caught.value.errno == errno.EFBIG
    assert caught.value.filename == str(event_file)
    log.close()
    assert thread_errors == []


def test_1_simulate_names_the_event_file_and_resumes(tmp_path, capsys, thread_errors):
    run = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "8", "--tensorboard", "--quiet", "--out", str(run)]
    with _FileSizeLimit(4096):  # the checkpoint (3 kB) fits; the event file outgrows it first
        code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and "Exception in thread" not in err
    assert "events.out.tfevents." in err and "File too large" in err, err
    assert thread_errors == []
    released = len(read_lines(run / LEDGER_FILE)[0]) - 1  # the header, then a line a round
    assert 1 <= len(read_rows(run / METRICS_FILE)) <= released < 8
    assert (run / "checkpoint.pt").is_file()
    assert main(["simulate", "--resume", str(run), "--quiet"]) == 0
    assert "8 rounds (rounds)" in capsys.readouterr().out
    assert _steps(run, "epsilon") == list(range(1, 9))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("outputs34")
    assert main(["simulate", str(TOY), "--rounds", "2", "--quiet", "--out", str(root / "r")]) == 0
    return root


def test_2_plots_ignore_an_invalid_mplbackend(finished_run, tmp_path, monkeypatch):
    runs = load_runs(finished_run)
    loaded = {m: sys.modules[m] for m in list(sys.modules) if m.split(".")[0] == "matplotlib"}
    monkeypatch.setenv("MPLBACKEND", "bogus")
    for name in loaded:  # as in a process that has not imported matplotlib yet
        del sys.modules[name]
    try:
        path = plot_metric_vs_round(runs, tmp_path / "metric.png")
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "matplotlib"]:
            del sys.modules[name]
        sys.modules.update(loaded)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert os.environ["MPLBACKEND"] == "bogus"


def _own_task_run(out: Path, mode: str) -> list[str]:
    """``simulate`` of a task by reference whose parameter ``mode`` is free text (unused)."""
    return [
        "simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(out),
        "--set", "task=tests.reliability.test_thirtysecond_review_models:BadTask",
        "--set", "population=6", "--set", "clients-per-round=3",
        "--set", f'task-params={{num-users=6, mode="{mode}"}}',
    ]  # fmt: skip


def test_3_config_toml_is_utf8_under_an_ascii_locale(tmp_path, capsys):
    run = tmp_path / "run"
    saved = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")  # open()'s default encoding: ASCII (UTF-8 mode off)
    try:
        code = main(_own_task_run(run, "ôk"))
    finally:
        locale.setlocale(locale.LC_CTYPE, saved)
    assert code == 0, capsys.readouterr().err
    config = tomllib.loads((run / CONFIG_FILE).read_bytes().decode("utf-8"))
    assert config["task-params"]["mode"] == "ôk"


def test_3_a_value_in_bytes_that_are_not_utf8_is_one_line_naming_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_own_task_run(run, "d\udcff")) == 2  # os.fsdecode(b"d\xff"), as argv gives it
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run / CONFIG_FILE}: cannot hold '\\udcff'" in err, err


def test_4_tensorboard_in_a_directory_whose_name_is_not_utf8(tmp_path, capsys):
    run = tmp_path / os.fsdecode(b"run\xff")  # 'run\udcff', as argv gives a Latin-1 name
    argv = ["simulate", str(TOY), "--rounds", "1", "--tensorboard", "--quiet", "--out", str(run)]
    assert main(argv) == 0, capsys.readouterr().err
    (event_file,) = run.glob("events.out.tfevents.*")
    assert os.fsencode(event_file.name).endswith(b".run\xff")
    (tmp_path / "copy").mkdir()  # TensorBoard's reader takes only UTF-8 paths
    shutil.copy(event_file, tmp_path / "copy" / "events.out.tfevents.0.copy")
    assert _steps(tmp_path / "copy", "epsilon") == [1]


@pytest.mark.parametrize("text", ["eval_acc[top1]=0.6133", "mode=[/x]"])
def test_5_progress_shows_brackets_as_written(text, capsys, thread_errors):
    bar, task = stderr_bar("round [b]", 2, field="shown")
    try:
        bar.update(task, completed=1, shown=text)
    finally:
        bar.stop()  # not a terminal here: the bar is drawn once, as it stops
    err = capsys.readouterr().err
    assert text in err and "round [b]" in err, err
    assert thread_errors == []
