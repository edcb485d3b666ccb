"""Issue 15, follow-up of the fortieth hostile review (outputs and inputs: today's fixes): tests.

1. ``HDF5Split(f).client_examples("u3")`` (also through ``open_split``) of a legacy HDF5 file
   where client ``u3``'s features are virtual datasets mapping ``/examples/u1``'s
   (``h5py.VirtualSource(".", "examples/u1/tokens", ...)``, or naming the file by its own
   name): the fortieth review's
   input 3 refuses a client or feature that is a soft, external or second hard link, but a
   virtual dataset is none of these, so ``u3`` was read as a user of its own with ``u1``'s
   examples (one person's data trained as two users, each release accounting for it once).
   Now ``HDF5Split._client_source`` refuses a virtual feature whose source is a client's data
   in the same file, naming it (``... is a virtual dataset of /examples/u1/...``); a virtual
   feature mapping data outside ``/examples`` is read as before (``data info``: finding 5).
2. ``HDF5Split(f).client_examples("u2")`` of a legacy HDF5 file where ``u2`` holds, beside its
   features, a name that is not UTF-8 (``b"\\xffnote"``; the fortieth review's input 6 is the
   same in the client list): refused, ``cannot read client 'u2' (damaged HDF5 file?): '<' not
   supported between instances of 'bytes' and 'str'`` (h5py gives such a name as bytes),
   where a UTF-8 name there (``note``) is no feature and read past. Now the names are sorted
   as text (``hdf5._name_text``): ``u2``'s example read as with a UTF-8 name.
3. ``cp -al dA dB`` (``.stackoverflow.lock`` one file of two names, no holder), then two claims of
   ``dA`` at once (``data synth --out dA`` twice; ``exclusive_lock``): the first locks the file
   and, as it has another name, detaches it (the fortieth review's processes 1 and 5), letting
   its shared lock on ``dA`` go for the directory's exclusive one; a second claim in that window
   found the file held, took the exclusive lock itself, detached the name and locked ``dA``'s
   new file. Before: the first, refused the exclusive lock, returned the old file (by then
   ``dB``'s alone) as ``dA``'s lock: both claims held ``dA`` (two writers of one dataset), and
   the first wrote its PID into ``dB``'s file. Now ``_claim`` checks the name again after a
   detach that did not happen and claims the new file: refused, ``in use by process N``.
   (The race is forced here by running the second claim inside the first's ``unshare``.)
4. The same race for a task that waits (``file_lock``, a task generating ``dA``'s synthetic
   files): ``dA``'s lock file a hard link of ``dB``'s, held by ``dB``'s process; the task found
   it held and, detaching it, let its share go; a claim of ``dA`` then detached the name and
   locked ``dA``'s new file. Before: the task waited on the old file, for ``dB``'s process (the
   processes-1 symptom, until that process ended), and only then found the name gone. Now
   ``file_lock`` checks the name again after a detach that did not happen and waits for the
   holder of ``dA``'s own file.
5. ``data info f`` (``summarize_split``: each client's ``num_examples``) of a legacy HDF5 file
   whose client ``u2``'s features are hard links to ``u1``'s (``f["examples/u2/tokens"] =
   f["examples/u1/tokens"]``, and the others), soft links, or virtual datasets of them
   (finding 1): rc 0, ``train 2 clients 4 examples`` (``u2`` counted with ``u1``'s 2), where
   reading ``u2`` refuses it (input 3); only the client group was checked there. Now
   ``num_examples`` checks the ``tokens`` it counts as ``client_examples`` does: rc 2, one
   line naming it.
"""

from __future__ import annotations

import contextlib
import os

import pytest

from fedprivopt.cli import main
from fedprivopt.data.hdf5 import HDF5Split
from fedprivopt.data.loader import open_split
from fedprivopt.data.stackoverflow import FEATURES
from tests.reliability.test_fortieth_review_input import legacy_h5


def _virtual_client(h5py, f, client: str, source_file: str, prefix: str) -> None:
    """Make ``client`` a group of virtual features mapping ``prefix/<feature>``."""
    group = f.create_group(f"examples/{client}")
    for name in FEATURES:
        src = f[f"{prefix}/{name}"]
        layout = h5py.VirtualLayout(shape=src.shape, dtype=src.dtype)
        layout[:] = h5py.VirtualSource(source_file, f"{prefix}/{name}", shape=src.shape)
        group.create_virtual_dataset(name, layout)


@pytest.mark.parametrize("named", [".", "own name"])
def test_1_a_client_of_virtual_datasets_of_another_s_is_refused(tmp_path, named):
    path, h5py = legacy_h5(tmp_path)
    with h5py.File(path, "a") as f:
        _virtual_client(h5py, f, "u3", "." if named == "." else path.name, "examples/u1")
    split = HDF5Split(path)
    with pytest.raises(ValueError, match=r"/examples/u3/\w+ is a virtual dataset of /examples/u1"):
        split.client_examples("u3")
    with pytest.raises(ValueError, match=r"virtual dataset of /examples/u1"):
        open_split(path).client_examples("u3")  # the reader a user's own task calls


def test_1_a_virtual_feature_of_data_outside_examples_is_read_as_before(tmp_path):
    path, h5py = legacy_h5(tmp_path)
    with h5py.File(path, "a") as f:  # a client's features kept elsewhere, mapped once
        f.copy("examples/u2", "raw/u2")
        del f["examples/u2"]
        _virtual_client(h5py, f, "u2", ".", "raw/u2")
    split = HDF5Split(path)
    assert [e.score for e in split.client_examples("u2")] == [3]
    assert [e.score for e in split.client_examples("u1")] == [1, 2]


# -- finding 2: a name that is not UTF-8 beside a client's features ----------------------------


def test_2_a_non_utf8_name_beside_the_features_is_no_feature(tmp_path):
    path, h5py = legacy_h5(tmp_path)
    with h5py.File(path, "a") as f:
        f.create_dataset(b"/examples/u2/\xffnote", data=[1])
    split = HDF5Split(path)
    assert [e.score for e in split.client_examples("u2")] == [3]


# -- finding 3: two claims of one directory's hard-linked lock file at once --------------------


def test_3_a_claim_that_lost_the_detach_race_is_refused(tmp_path, monkeypatch):
    from fedprivopt.data import locks

    da, db = tmp_path / "dA", tmp_path / "dB"
    da.mkdir()
    db.mkdir()
    (da / locks.DATA_LOCK).write_text("")
    os.link(da / locks.DATA_LOCK, db / locks.DATA_LOCK)  # cp -al dA dB, nobody holding it
    unshare = locks._DirectoryShare.unshare
    held = contextlib.ExitStack()
    calls = []

    def racing_unshare(self):
        unshare(self)
        if not calls:  # the first claim's detach let its share go: a second claim comes now
            calls.append(True)
            held.enter_context(locks.exclusive_lock(da / locks.DATA_LOCK))

    monkeypatch.setattr(locks._DirectoryShare, "unshare", racing_unshare)
    with held:
        # the second claim detached dA's name and locks dA's new file; the first holds the
        # old one (dB's now): it must not hold dA too
        with pytest.raises(locks.LockHeldError, match=r"in use by process"):
            with locks.exclusive_lock(da / locks.DATA_LOCK):
                pass
        assert calls and (da / locks.DATA_LOCK).read_text().strip() == str(os.getpid())
    assert (db / locks.DATA_LOCK).read_text() == ""  # dB's file not given a PID


# -- finding 4: a task's wait (file_lock) in the same race ------------------------------------


def test_4_a_waiting_task_that_lost_the_detach_race_waits_for_its_own_directory(
    tmp_path, monkeypatch
):
    from fedprivopt.data import locks

    da, db = tmp_path / "dA", tmp_path / "dB"
    da.mkdir()
    db.mkdir()
    held = contextlib.ExitStack()
    held.enter_context(locks.exclusive_lock(db / locks.DATA_LOCK))  # dB's holder
    os.link(db / locks.DATA_LOCK, da / locks.DATA_LOCK)  # cp -al dB dA while it holds
    unshare = locks._DirectoryShare.unshare
    other_directorys = os.stat(db / locks.DATA_LOCK)
    waited_for_b, raced = [], []

    def racing_unshare(self):
        unshare(self)
        if not raced:  # a claim of dA comes while the task's share is off
            raced.append(True)
            held.enter_context(locks.exclusive_lock(da / locks.DATA_LOCK))

    def say_waiting(path, fd):  # the task waits: record for which file, then let both go
        waited_for_b.append(os.path.samestat(os.fstat(fd), other_directorys))
        held.close()

    monkeypatch.setattr(locks._DirectoryShare, "unshare", racing_unshare)
    monkeypatch.setattr(locks, "_say_waiting", say_waiting)
    try:
        with locks.file_lock(da / locks.DATA_LOCK):
            pass
    finally:
        held.close()
    assert waited_for_b == [False]  # it waited for dA's new file's holder, not dB's


# -- finding 5: data info of a client whose features are another's -----------------------------


@pytest.mark.parametrize("kind", ["hard", "soft", "virtual"])
def test_5_data_info_refuses_a_client_whose_features_are_another_s(tmp_path, capsys, kind):
    path, h5py = legacy_h5(tmp_path)
    with h5py.File(path, "a") as f:
        if kind == "virtual":
            del f["examples/u2"]
            _virtual_client(h5py, f, "u2", ".", "examples/u1")
        for name in FEATURES if kind != "virtual" else ():
            del f[f"examples/u2/{name}"]
            other = f"/examples/u1/{name}"
            f[f"examples/u2/{name}"] = f[other] if kind == "hard" else h5py.SoftLink(other)
    assert main(["data", "info", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "/tokens is " in lines[0], lines
