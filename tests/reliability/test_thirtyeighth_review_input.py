"""Issue 15, thirty-eighth hostile review (input: bad settings and data files): tests.

1. ``simulate toy.toml --set task=fedprivopt.models.task:Task`` (the protocol a task
   implements, named where a task class belongs; also ``typing:Any``): a traceback ending in
   typing's ``TypeError: Protocols cannot be instantiated``, rc 1 (a ``TypeError`` raised inside
   code other than ``build_task`` counts as a bug of the factory). ``registry.resolve_task`` now
   refuses a ``Protocol`` class or a ``typing`` form before calling it: one line naming
   ``task`` (``… is a type for annotations (a Protocol or a typing form), which cannot be
   called …``), rc 2.
2. ``data info D`` (also ``simulate`` of a task whose ``data-dir`` is ``D``) where
   ``D/stackoverflow.sqlite`` has a hot journal beside it (the database copied, or its disk
   filled, while a write was under way): rc 2 and one line, but ``unreadable SQLite database:
   attempt to write a readonly database``, which blames the reader; a database in
   write-ahead-log mode in a directory the user cannot write: ``unable to open database
   file`` (the file is there and readable); a ``WITHOUT ROWID`` examples table: ``no such
   column: rowid``. ``sqlite_files.unreadable`` now says the cause and what to do: ``…-journal
   beside it is a hot journal (a write to the database was interrupted) … open it once with
   write access (e.g. sqlite3 stackoverflow.sqlite 'PRAGMA quick_check')``, or the WAL and the
   directory that is not writable; nothing beside the database is changed.
3. ``HDF5Split(f).client_examples("c1")`` (also ``data.loader.open_split``) of a legacy HDF5
   file whose one-example client keeps its ``score`` in chunks of 10**8 values with the
   scale-offset and gzip filters (a 26 kB file): 836 MB and 6 s to read one value (HDF5 reads
   and decodes a filtered chunk whole; chunks reach 4 GiB), beyond the 1,032x expansion bound
   the module holds the values to. ``HeapChecker.check`` now holds a chunk to the same bound
   (at least 16 MiB): ``'score' is stored in chunks of 800,000,000 bytes …`` before reading.
4. ``HDF5Split(f).client_examples("c2")`` of a legacy HDF5 file whose ``score`` (or a text
   feature) is a virtual dataset mapping a file that was not copied along: every score read
   as the fill value 0 (every text ``''``), silently; HDF5 reads fill values where a source
   file is missing. ``HeapChecker._check_sources`` now refuses it (``'score' is a virtual
   dataset whose source file '…/missing.h5' does not exist …``); a source that is there is
   read as before (one pointing at ``/etc/passwd`` was refused already).
5. ``simulate stackoverflow-tp-mini.toml --set task-params.data-dir=D --set
   task-params.synthetic=false`` where ``D/stackoverflow.sqlite`` has no client index (TFF's
   file decompressed with ``xz -dk``, as ``data info`` advises): rc 0 after the same
   ``RuntimeWarning`` three times, six lines on stderr, each with a source line of ours
   (``  train = SQLiteSplit(self.data_dir / SQLITE_FILE, "train")``): the task opens the
   file's splits one by one. ``SQLiteSplit`` now warns once a file in a process.
"""

from __future__ import annotations

import contextlib
import io

import pytest

from fedprivopt.cli import main

TOY = "simulations/toy.toml"


def _cli(*argv: str) -> tuple[int, list[str]]:
    """``fedprivopt ARGV`` in process: its exit code and its stderr lines."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
    return code, err.getvalue().strip().splitlines()


# -- finding 1: a Protocol (or a typing form) named as the task --------------------------------


@pytest.mark.parametrize("task", ["fedprivopt.models.task:Task", "typing:Any"])
def test_1_a_protocol_named_as_the_task_is_one_line(task, tmp_path):
    code, lines = _cli(
        "simulate", TOY, "--rounds", "1", "--out", str(tmp_path / "r"), "--quiet",
        "--set", f"task={task}",
    )  # fmt: skip
    assert code == 2 and len(lines) == 1, lines
    assert "task" in lines[0] and "cannot be called" in lines[0]
    assert not (tmp_path / "r").exists()


# -- finding 2: an SQLite database beside a hot journal (or a WAL in a read-only directory) ----


def _database(path):
    """A small database in the TFF schema (``data info`` reads its client_metadata)."""
    from fedprivopt.data.sqlite import write_sqlite

    rows = [("train", f"c{i}", bytes(200)) for i in range(400)]
    return write_sqlite(path, rows, [(f"c{i}", "train", 1) for i in range(400)])


def _hot_journal(db):
    """Leave ``db`` as a crash mid-write does: its pages as they were, and its hot journal."""
    import shutil
    import sqlite3

    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA cache_size = 1")  # the journal is synced as changed pages spill
    conn.execute("BEGIN")
    conn.execute("UPDATE examples SET serialized_example_proto = zeroblob(300)")
    shutil.copy(db, f"{db}.snap")
    shutil.copy(f"{db}-journal", f"{db}-journal.snap")
    conn.execute("ROLLBACK")
    conn.close()
    shutil.move(f"{db}.snap", db)
    shutil.move(f"{db}-journal.snap", f"{db}-journal")


def test_2_a_hot_journal_is_named_not_blamed_on_the_reader(tmp_path):
    db = _database(tmp_path / "stackoverflow.sqlite")
    _hot_journal(db)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    code, lines = _cli("data", "info", str(tmp_path))
    assert code == 2 and len(lines) == 1, lines
    # was "unreadable SQLite database: attempt to write a readonly database", nothing more
    assert "stackoverflow.sqlite-journal beside it is a hot journal" in lines[0]
    assert "open it once with write access" in lines[0]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing changed


def test_2_a_write_ahead_log_in_a_read_only_directory_is_named(tmp_path, monkeypatch):

    from fedprivopt.data import sqlite as sq

    db = _database(tmp_path / "stackoverflow.sqlite")
    (tmp_path / "stackoverflow.sqlite-wal").write_bytes(b"")
    # as root SQLite could create the -shm file: the reader's refusal, as another user meets it
    refused_as_another_user(monkeypatch, "unable to open database file")
    with pytest.raises(ValueError) as info:
        sq.read_example_counts(db)
    assert "write-ahead-log mode (stackoverflow.sqlite-wal beside it)" in str(info.value)
    assert "is not writable" in str(info.value)


# -- finding 3: an HDF5 feature stored in absurd chunks ----------------------------------------


def test_3_a_chunk_far_larger_than_the_file_is_refused_before_it_is_read(tmp_path):
    h5py = pytest.importorskip("h5py")
    import numpy as np

    from fedprivopt.data.hdf5 import HDF5Split

    path = tmp_path / "stackoverflow_train.h5"
    with h5py.File(path, "w") as f:
        client = f.create_group("examples").create_group("c1")
        text = h5py.special_dtype(vlen=bytes)
        for name in ("tokens", "title", "tags", "creation_date", "type"):
            client.create_dataset(name, data=np.array([b"a b"], dtype=object), dtype=text)
        # one score in a chunk of 10**7 values (80 MB), scale-offset and gzip: a few kB on disk
        score = client.create_dataset(
            "score", shape=(1,), maxshape=(None,), chunks=(10**7,), dtype="int64",
            scaleoffset=0, compression="gzip",
        )  # fmt: skip
        score[0] = 0
    assert path.stat().st_size < 100_000
    split = HDF5Split(path)
    assert split.num_examples("c1") == 1  # data info reads no chunk
    with pytest.raises(ValueError, match=r"'score' is stored in chunks of 80,000,000 bytes"):
        split.client_examples("c1")  # read the whole chunk (836 MB and 6 s at 10**8 values)


# -- finding 4: an HDF5 virtual dataset whose source file is missing ---------------------------


def test_4_a_virtual_dataset_without_its_source_is_refused_not_filled(tmp_path):
    h5py = pytest.importorskip("h5py")
    import numpy as np

    from fedprivopt.data.hdf5 import HDF5Split

    with h5py.File(tmp_path / "scores.h5", "w") as f:
        f.create_dataset("d", data=np.array([3, 4]))
    path = tmp_path / "stackoverflow_train.h5"
    with h5py.File(path, "w") as f:
        text = h5py.special_dtype(vlen=bytes)
        for client in ("c1", "c2"):
            group = f.create_group(f"examples/{client}")
            for name in ("tokens", "title", "tags", "creation_date", "type"):
                group.create_dataset(name, data=np.array([b"a", b"b"], dtype=object), dtype=text)
            layout = h5py.VirtualLayout(shape=(2,), dtype="i8")
            source = "scores.h5" if client == "c1" else str(tmp_path / "missing.h5")
            layout[:] = h5py.VirtualSource(source, "d", shape=(2,))
            group.create_virtual_dataset("score", layout, fillvalue=0)
    split = HDF5Split(path)
    assert [e.score for e in split.client_examples("c1")] == [3, 4]  # a source that is there
    with pytest.raises(ValueError, match=r"'score' is a virtual dataset whose source file .*"
                       r"missing.h5' does not exist"):  # fmt: skip
        split.client_examples("c2")  # was [0, 0]: the fill value, silently


# -- finding 5: the warning of a database without an index, once a file -----------------------


def test_5_an_unindexed_database_is_warned_about_once(tmp_path):
    import warnings

    from fedprivopt.data.sqlite import SQLiteSplit, write_sqlite

    rows = [(split, f"c{i}", b"x") for split in ("train", "test") for i in range(3)]
    meta = [(f"c{i}", split, 1) for split in ("train", "test") for i in range(3)]
    db = write_sqlite(tmp_path / "stackoverflow.sqlite", rows, meta, index=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for split in ("train", "test", "test"):  # as a task opens them (three warnings)
            SQLiteSplit(db, split, validate=False)
    shown = [w for w in caught if "has no index on (split_name, client_id)" in str(w.message)]
    assert len(shown) == 1


def refused_as_another_user(monkeypatch, message: str) -> None:
    """The data directory unwritable and every SQLite statement refused with ``message``.

    As root SQLite could create the ``-shm`` file; this is the refusal another user meets (the
    connection SQLite opens lazily fails on the first statement).
    """
    import os
    import sqlite3

    from fedprivopt.data import sqlite as sq

    monkeypatch.setattr(sq.os, "access", lambda path, mode: mode != os.W_OK)

    class Refused:
        def execute(self, *args):
            raise sqlite3.OperationalError(message)

        def close(self):
            pass

    monkeypatch.setattr(sq, "_connect", lambda path: Refused())
