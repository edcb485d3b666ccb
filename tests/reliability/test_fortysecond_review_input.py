"""Issue 15, forty-second hostile review (input: bad settings and data files): tests.

1. ``cp other.sqlite D/stackoverflow.sqlite`` (a copy writes into the same file, where ``data
   synth --overwrite`` renames a new one into place) while a run of a StackOverflow task read
   ``D``: the task's open training split went on reading the other file's pages under the old
   client ids: ``unreadable SQLite database: database disk image is malformed`` (rc 2, a damaged
   file where it was a replaced one), or the other dataset's users silently where the pages fit,
   until the next evaluation reopened the file. Now a ``stat`` before each read of a user, and
   the full check of the thirty-fifth review when it changed
   (``StackOverflowFiles._check_file_unchanged``): ``the dataset changed while the task used
   it``; a file touched or replaced by an equal copy still reads.
2. ``HDF5Split(f).client_examples("/examples/u1")`` (also ``"u1/"``, ``"./u1"``, ``"u1/."``,
   ``"//examples//u1"``, ``b"u1"``; ``num_examples`` alike; also through
   ``data.loader.open_split``) of a legacy HDF5 split listing ``u1``: ``u1``'s examples read
   under another id, since h5py resolves a name as a path (one person's data as two users of a
   task built on the split, the twin of the forty-first review's ``COLLATE NOCASE``), and an
   ``int`` id blamed the file: ``cannot read client 1 (damaged HDF5 file?)``. Now only an id
   of ``client_ids`` as listed is read (``HDF5Split._client``); another is a ``KeyError`` naming
   it, as ``SQLiteSplit`` raises.
3. ``simulate --resume R`` from another directory than the one the run started in, whose
   ``task-params.data-dir`` was relative (``--set task-params.data-dir=e1``, recorded as
   ``data_dir = "e1"``): ``e1: missing stackoverflow.sqlite, …``, as if the dataset were gone;
   a relative directory is read from the working directory, which the line did not name. Now
   ``e1 (a relative data_dir, read from the working directory: /tmp): missing …``
   (``StackOverflowDataDir._shown_dir``).
4. ``data.loader.open_split(f)`` (the API that opens "whatever the user points at") where
   ``f`` is a FIFO without a known suffix (``mkfifo so``; also ``is_hdf5_file``): blocked for
   ever, its first bytes read to tell the format (``data info`` refuses it first); a FIFO named
   ``x.h5`` (also ``HDF5Split``): ``x.h5: no such file`` of a path that exists. Now
   ``ValueError: … not a regular file (a FIFO, device or socket)`` before anything is opened,
   and ``is_hdf5_file`` reads only a regular file.
5. ``simulate toy.toml --out "~nosuchuser/x"`` (quoted, or a user of another machine; also
   ``--resume``, ``data info``, ``data synth --out``, ``compare``, ``tune``, ``compare-tuned``,
   ``deploy local``): pathlib's ``RuntimeError: Could not determine home directory.``
   traceback, rc 1; ``--set task-params.data-dir=~nosuchuser/d`` (``expanduser`` leaves it as
   it is): rc 0, a synthetic dataset generated into ``./~nosuchuser/d``, where ``~/d`` is
   expanded (twenty-eighth review). Now rc 2, one line naming the flag or the key
   (``cli_args.check_path_text``, ``simulation.config_values.expand_home``).
6. The same through the tasks' Python API: ``StackOverflowTagTask(data_dir="~nosuchuser/d")``
   (also ``cache_dir``; the next-word task's ``data_dir``): pathlib's ``RuntimeError: Could not
   determine home directory.``, naming no parameter. Now ``ValueError`` naming it
   (``stackoverflow_datadir.expanded_dir``).
7. ``simulate stackoverflow-tp-mini.toml --set task-params.data-dir=D/stackoverflow.sqlite``
   (the database named where its directory belongs): ``D/stackoverflow.sqlite: missing
   stackoverflow.sqlite, stackoverflow.word_count, stackoverflow.tag_count (…; pass
   synthetic=True …)``, a line that contradicts itself, and with that advice taken (``--set
   task-params.synthetic=true``, the preset's own) ``… exists and is not a directory``. Now
   ``config: task-params.data-dir 'D/stackoverflow.sqlite' is a file, not a directory: name the
   directory that holds stackoverflow.sqlite, … (D)`` either way
   (``StackOverflowDataDir._ensure_files``).
"""

from __future__ import annotations

import os
import shutil

import pytest

from fedprivopt.data import SyntheticConfig, generate
from fedprivopt.data.hdf5 import HDF5Split, is_hdf5_file, write_hdf5
from fedprivopt.data.loader import open_split
from fedprivopt.data.stackoverflow import StackOverflowExample
from fedprivopt.models.tag_prediction import StackOverflowTagTask
from fedprivopt.simulation.config import load_config
from tests.reliability.test_thirtyeighth_review_input import _cli

NO_USER = "~fedprivopt-no-such-user-42"
MINI = "simulations/stackoverflow-tp-mini.toml"


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Two tiny synthetic datasets of the same sizes and other seeds (``a``, ``b``)."""
    root = tmp_path_factory.mktemp("review42-input")
    for name, seed in (("a", 0), ("b", 1)):
        config = SyntheticConfig.tiny(num_clients=30, vocab_size=200, num_tags=10, seed=seed)
        generate(root / name, config, workers=1)
    return root


def _tag_task(d):
    return StackOverflowTagTask(
        data_dir=d, synthetic=False, vocab_size=50, num_tags=5, num_users=10, eval_users=5
    )


# -- finding 1: a dataset copied over the file a task reads -------------------------------------


@pytest.mark.parametrize("how", ["copy over", "copy over, time kept"])
def test_1_a_copy_over_the_file_stops_the_next_read(tmp_path, datasets, how):
    d = tmp_path / "d"
    shutil.copytree(datasets / "a", d)
    task = _tag_task(d)
    task.user_data(0)
    sqlite = d / "stackoverflow.sqlite"
    (shutil.copy2 if "kept" in how else shutil.copyfile)(datasets / "b" / sqlite.name, sqlite)
    with pytest.raises(ValueError, match=r"stackoverflow\.sqlite: the dataset changed while "):
        task.user_data(5)


def test_1_a_touched_or_equal_file_still_reads(tmp_path, datasets):
    d = tmp_path / "d"
    shutil.copytree(datasets / "a", d)
    task = _tag_task(d)
    x = task.user_data(0)[0]
    sqlite = d / "stackoverflow.sqlite"
    os.utime(sqlite)  # touched
    task.user_data(1)
    shutil.copyfile(datasets / "a" / sqlite.name, sqlite)  # the same bytes written over it
    task._cache.clear()
    assert task.user_data(0)[0].equal(x)


# -- finding 2: an HDF5 client read under another spelling of its id ---------------------------


def _example(word: str) -> StackOverflowExample:
    return StackOverflowExample(
        tokens=word, title="t", tags="a", creation_date="2020-01-01", score=1, type="question"
    )


@pytest.mark.parametrize(
    "other", ["/examples/u1", "u1/", "./u1", "u1/.", "//examples//u1", b"u1", 1, None]
)
def test_2_an_hdf5_client_is_read_only_by_its_listed_id(tmp_path, other):
    f = write_hdf5(tmp_path / "stackoverflow_train.h5", {"u1": [_example("x")] * 2, "u2": []})
    split = open_split(f)
    assert list(split.client_ids) == ["u1", "u2"] and len(split.client_examples("u1")) == 2
    for read in (split.client_examples, split.num_examples):
        with pytest.raises(KeyError, match=r"is not in split 'train'"):
            read(other)


# -- finding 3: a relative data directory read from another working directory ------------------


def test_3_a_relative_data_dir_names_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        _tag_task("e1")
    line = str(info.value)
    assert line.startswith(f"e1 (a relative data_dir, read from the working directory: {tmp_path})")
    assert "missing stackoverflow.sqlite" in line
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path}/e1: missing "):
        _tag_task(tmp_path / "e1")  # an absolute one as before


# -- finding 4: a FIFO given to open_split -------------------------------------------------------


def test_4_a_fifo_is_refused_before_it_is_read(tmp_path):
    fifo, fifo_h5 = tmp_path / "so", tmp_path / "x.h5"
    os.mkfifo(fifo)
    os.mkfifo(fifo_h5)
    # a writer holds the FIFO open with bytes in it (more than two buffered reads take), so
    # that the unfixed reads do not block
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(writer, b"x" * 40_000)
        with pytest.raises(ValueError, match=r"so: not a regular file \(a FIFO"):
            open_split(fifo)
        assert not is_hdf5_file(fifo)
        assert os.read(writer, 50_000) == b"x" * 40_000  # nothing of it was read
    finally:
        os.close(writer)
    for call in (open_split, HDF5Split):
        with pytest.raises(ValueError, match=r"x\.h5: not a regular file \(a FIFO"):
            call(fifo_h5)


# -- finding 5: a ~user of no user ---------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "simulations/toy.toml", "--rounds", "1", "--quiet", "--out", f"{NO_USER}/x"],
        ["simulate", "--resume", f"{NO_USER}/x"],
        ["data", "info", NO_USER],
        ["data", "synth", "--clients", "5", "--out", f"{NO_USER}/x"],
    ],
)
def test_5_a_tilde_of_no_user_is_one_line(tmp_path, monkeypatch, argv):
    root = os.getcwd()
    monkeypatch.chdir(tmp_path)
    argv = [os.path.join(root, a) if a.startswith("simulations/") else a for a in argv]
    code, lines = _cli(*argv)
    assert code == 2 and len(lines) == 1, lines
    assert f"'{NO_USER}" in lines[0] and "names no user of this machine" in lines[0], lines
    assert not os.listdir(tmp_path)


def test_5_a_task_directory_of_no_user_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    preset = os.path.join(os.path.dirname(__file__), "..", "..", "simulations", "toy.toml")
    with pytest.raises(ValueError, match=r"task-params\.data-dir starts with ~, but names no"):
        load_config(preset, {"task-params.data-dir": f"{NO_USER}/d"})
    assert load_config(preset, {"task-params.data-dir": "~/d"}).task_params["data_dir"] == (
        os.path.expanduser("~/d")
    )


# -- finding 6: the same through the tasks' Python API ------------------------------------------


def test_6_a_task_directory_of_no_user_names_the_parameter(tmp_path, datasets):
    from fedprivopt.models.next_word import StackOverflowNextWordTask

    for task in (StackOverflowTagTask, StackOverflowNextWordTask):
        with pytest.raises(ValueError, match=r"^data_dir starts with ~, but names no user"):
            task(data_dir=f"{NO_USER}/d", synthetic=False)
    d = tmp_path / "d"
    shutil.copytree(datasets / "a", d)
    with pytest.raises(ValueError, match=r"^cache_dir starts with ~, but names no user"):
        StackOverflowTagTask(
            data_dir=d, synthetic=False, vocab_size=50, num_tags=5, token_cache=True,
            cache_dir=f"{NO_USER}/c",
        )  # fmt: skip


# -- finding 7: the database named as the data directory ----------------------------------------


@pytest.mark.parametrize("synthetic", ["false", "true"])
def test_7_the_database_named_as_data_dir_is_one_line(tmp_path, datasets, synthetic):
    d = datasets / "a"
    code, lines = _cli(
        "simulate", os.path.join(os.path.dirname(__file__), "..", "..", MINI), "--rounds", "1",
        "--out", str(tmp_path / "r"), "--quiet",
        "--set", f"task-params.data-dir={d}/stackoverflow.sqlite",
        "--set", f"task-params.synthetic={synthetic}",
    )  # fmt: skip
    assert code == 2 and len(lines) == 1, lines
    # the quoted path may be shortened (shown()) on a long temporary path
    assert "task-params.data-dir '" in lines[0], lines
    assert "stackoverflow.sqlite' is a file, not a directory: name the directory" in lines[0]
    assert lines[0].endswith(f"({d})"), lines
