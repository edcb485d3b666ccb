"""Issue 15, thirty-eighth hostile review, follow-up (outputs: today's fixes to reports,
tuning, data input and accounting): tests.

1. ``HDF5Split(f).client_examples`` of a legacy HDF5 file whose ``score`` is a virtual
   dataset (the thirty-eighth review's input 4 refused one whose source file is missing).
   Before: (a) the file and its source moved together to another directory, the source named
   by its old absolute path (HDF5 finds it beside the file by its last part, and h5py reads
   it): refused, ``source file '/old/dir/scores.h5' does not exist ... put the file back
   beside it`` (it was beside it); (b) the source file there but without the source dataset
   (also a source in this file, ``'.'``, that is not there), or a source dataset with fewer
   values than mapped (one value for two): read as the fill value 0, silently, as the missing
   file was. Now ``HeapChecker._source_dataset`` looks the source up as HDF5 does (an
   absolute name, its last part beside the file, the working directory) and refuses a
   missing dataset or a short one (``... has no dataset 'gone'``, ``... holds 1 values ...
   fewer than it is mapped to read``); a source that is there is read as before.
2. ``data info D`` (also ``simulate`` on ``D``) where ``D/stackoverflow.sqlite`` was left in
   write-ahead-log mode and closed cleanly (SQLite removes the ``-wal`` file on the last
   close), ``D`` not writable by the reader (measured as user nobody with the system's
   Python: ``attempt to write a readonly database``). Before: that line alone (input 2's hint
   looked for a ``-wal`` file only), and the hint it gave with a ``-wal`` file advised ``PRAGMA
   wal_checkpoint(TRUNCATE)``, which leaves the file in WAL mode, and so in this very case.
   Now ``sqlite_files.unreadable`` also reads WAL mode from the header (bytes 18-19) and advises
   ``PRAGMA journal_mode=DELETE`` (measured: the same reader then reads it).
3. ``HDF5Split(f).client_examples`` of a legacy HDF5 file whose one score is a virtual
   dataset mapping a 16 kB source file that keeps it in chunks of 10**8 values with the
   scale-offset and gzip filters (input 3's case, through a source). Before: ``[5]`` after
   831 MB (HDF5 decodes the source's chunk whole; input 3 held only the file's own chunks to
   the bound). Now ``HeapChecker._source_dataset`` holds the source dataset's chunks to the
   same bound, with the source file's size (``_check_chunks``): ``'score' (source 'd' in
   'scores.h5') is stored in chunks of 80,000,000 bytes ...`` (10**7 values here).
4. The same with a source that is itself virtual: ``score`` maps ``mid.h5``'s ``d``, which maps
   ``gone.h5`` (not copied along); and ``score`` mapping itself (``'.'``,
   ``examples/c1/score``). Before: ``[0, 0]``, silently (findings 1 and input 4 checked one
   level); the self-mapping one killed the process with a segmentation fault inside HDF5
   (rc 139, no line; before today too). Now ``_check_sources`` checks a virtual source's own
   sources, relative to its file, to 8 levels: ``source file 'gone.h5' (through 'mid.h5':d)
   does not exist``; ``mapped through more than 8 virtual datasets (... a cycle?)``.
5. The same with a score kept in external storage (``create_dataset(..., external=[("short.bin",
   0, 16)])``, two values) whose file holds one value (8 bytes; a copy cut short). Before:
   ``[7, 0]``, silently: HDF5 reads zeros where an external file ends early (a missing one is
   HDF5's own error, one line). Now ``HeapChecker._check_external`` refuses it: ``'score' is
   stored in the external file 'short.bin', which holds 8 of the 16 bytes read from offset 0
   ...``; a file that holds them reads as before.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.reliability.test_thirtyeighth_review_input import refused_as_another_user


def _legacy(path, sources, *, shape=(2,)):
    """A legacy StackOverflow HDF5 file whose clients' 'score' maps ``sources[client]``."""
    import h5py
    import numpy as np

    with h5py.File(path, "w") as f:
        text = h5py.special_dtype(vlen=bytes)
        for client, (file_name, dset) in sources.items():
            group = f.create_group(f"examples/{client}")
            for name in ("tokens", "title", "tags", "creation_date", "type"):
                group.create_dataset(name, data=np.array([b"a", b"b"], dtype=object), dtype=text)
            layout = h5py.VirtualLayout(shape=shape, dtype="i8")
            layout[:] = h5py.VirtualSource(file_name, dset, shape=shape)
            group.create_virtual_dataset("score", layout, fillvalue=0)


# -- finding 1: a virtual score's source, looked up as HDF5 does ------------------------------


def test_1_a_virtual_source_is_looked_up_as_hdf5_does(tmp_path):
    h5py = pytest.importorskip("h5py")
    import numpy as np

    from fedprivopt.data.hdf5 import HDF5Split

    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    with h5py.File(old / "scores.h5", "w") as f:
        f.create_dataset("d", data=np.array([3, 4]))
        f.create_dataset("one", data=np.array([7]))
    _legacy(old / "stackoverflow_train.h5", {
        "moved": (str(old / "scores.h5"), "d"),
        "gone": ("scores.h5", "gone"),
        "here": (".", "gone"),
        "short": ("scores.h5", "one"),
    })  # fmt: skip
    for name in ("scores.h5", "stackoverflow_train.h5"):
        shutil.move(old / name, new / name)
    old.rmdir()
    split = HDF5Split(new / "stackoverflow_train.h5")
    # (a) was refused: "source file '.../old/scores.h5' does not exist"
    assert [e.score for e in split.client_examples("moved")] == [3, 4]
    # (b) each was [0, 0] or [7, 0]: fill values, silently
    with pytest.raises(ValueError, match=r"'score' is a virtual dataset whose source file "
                       r"'scores.h5' has no dataset 'gone'"):  # fmt: skip
        split.client_examples("gone")
    with pytest.raises(ValueError, match=r"source file 'stackoverflow_train.h5' has no dataset"):
        split.client_examples("here")
    with pytest.raises(ValueError, match=r"dataset 'one' in 'scores.h5' holds 1 values .*fewer "
                       r"than it is mapped to read"):  # fmt: skip
        split.client_examples("short")


# -- finding 2: a database in WAL mode without its -wal file, in a read-only directory --------


def test_2_a_wal_database_closed_cleanly_is_named_with_a_remedy_that_works(tmp_path, monkeypatch):
    import sqlite3

    from fedprivopt.data import sqlite as sq

    rows = [(split, f"c{i}", b"x") for split in ("train", "test") for i in range(2)]
    meta = [(f"c{i}", split, 1) for split in ("train", "test") for i in range(2)]
    db = sq.write_sqlite(tmp_path / "stackoverflow.sqlite", rows, meta, index=True)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    assert not (tmp_path / "stackoverflow.sqlite-wal").exists()  # removed on the last close
    # as root SQLite could create the -shm file: the refusal another user meets (measured)
    refused_as_another_user(monkeypatch, "attempt to write a readonly database")
    with pytest.raises(ValueError) as info:
        sq.read_example_counts(db)
    # was "unreadable SQLite database: attempt to write a readonly database", nothing more
    assert "write-ahead-log mode (its header says so)" in str(info.value)
    assert "'PRAGMA journal_mode=DELETE'" in str(info.value)  # a checkpoint keeps WAL mode


# -- finding 3: a virtual dataset's source in absurd chunks -----------------------------------


def test_3_a_virtual_sources_chunks_are_held_to_the_bound(tmp_path):
    h5py = pytest.importorskip("h5py")

    from fedprivopt.data.hdf5 import HDF5Split

    with h5py.File(tmp_path / "scores.h5", "w") as f:
        score = f.create_dataset(
            "d", shape=(2,), maxshape=(None,), chunks=(10**7,), dtype="int64",
            scaleoffset=0, compression="gzip",
        )  # fmt: skip
        score[:] = [3, 4]
    assert (tmp_path / "scores.h5").stat().st_size < 100_000
    _legacy(tmp_path / "stackoverflow_train.h5", {"c1": ("scores.h5", "d")})
    split = HDF5Split(tmp_path / "stackoverflow_train.h5")
    # was [3, 4] after decoding the whole 80 MB chunk (831 MB at 10**8 values)
    with pytest.raises(ValueError, match=r"'score' \(source 'd' in 'scores.h5'\) is stored in "
                       r"chunks of 80,000,000 bytes"):  # fmt: skip
        split.client_examples("c1")


# -- finding 4: a virtual source that is itself virtual ---------------------------------------


def test_4_a_virtual_sources_own_sources_are_checked(tmp_path):
    h5py = pytest.importorskip("h5py")

    from fedprivopt.data.hdf5 import HDF5Split

    with h5py.File(tmp_path / "mid.h5", "w") as f:
        layout = h5py.VirtualLayout(shape=(2,), dtype="i8")
        layout[:] = h5py.VirtualSource("gone.h5", "d", shape=(2,))
        f.create_virtual_dataset("d", layout, fillvalue=0)
    _legacy(tmp_path / "stackoverflow_train.h5", {"c1": ("mid.h5", "d")})
    with pytest.raises(ValueError, match=r"source file 'gone.h5' \(through 'mid.h5':d\) does "
                       r"not exist"):  # fmt: skip
        HDF5Split(tmp_path / "stackoverflow_train.h5").client_examples("c1")  # was [0, 0]
    # a score mapping itself: HDF5 crashed the process (a child here, so a crash fails only this)
    loop = tmp_path / "loop" / "stackoverflow_train.h5"
    loop.parent.mkdir()
    _legacy(loop, {"c1": (".", "examples/c1/score")})
    code = (
        "from fedprivopt.data.hdf5 import HDF5Split\n"
        f"HDF5Split({str(loop)!r}).client_examples('c1')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, (done.returncode, done.stderr[-300:])  # was -11 (SIGSEGV)
    assert "mapped through more than 8 virtual datasets" in done.stderr


# -- finding 5: external storage cut short ---------------------------------------------------


def test_5_external_storage_cut_short_is_refused_not_zero_filled(tmp_path, monkeypatch):
    h5py = pytest.importorskip("h5py")
    import numpy as np

    from fedprivopt.data.hdf5 import HDF5Split

    monkeypatch.chdir(tmp_path)  # HDF5 opens a relative external name from here
    np.array([3, 4], dtype="<i8").tofile(tmp_path / "scores.bin")
    np.array([7], dtype="<i8").tofile(tmp_path / "short.bin")
    path = tmp_path / "stackoverflow_train.h5"
    with h5py.File(path, "w") as f:
        text = h5py.special_dtype(vlen=bytes)
        for client, external in {"c1": "scores.bin", "c2": "short.bin"}.items():
            group = f.create_group(f"examples/{client}")
            for name in ("tokens", "title", "tags", "creation_date", "type"):
                group.create_dataset(name, data=np.array([b"a", b"b"], dtype=object), dtype=text)
            group.create_dataset("score", shape=(2,), dtype="<i8", external=[(external, 0, 16)])
    split = HDF5Split(path)
    assert [e.score for e in split.client_examples("c1")] == [3, 4]
    with pytest.raises(ValueError, match=r"'score' is stored in the external file 'short.bin', "
                       r"which holds 8 of the 16 bytes"):  # fmt: skip
        split.client_examples("c2")  # was [7, 0]
