import lzma
import shutil

import pytest
from so_fixtures import DATA

from fedprivopt.data import open_split
from fedprivopt.data.hdf5 import HDF5Split
from fedprivopt.data.sqlite import SQLiteSplit


def test_open_sqlite_file_and_directory(tff_sqlite_indexed):
    for target in (tff_sqlite_indexed, tff_sqlite_indexed.parent):
        sp = open_split(target, "heldout")
        assert isinstance(sp, SQLiteSplit) and list(sp.client_ids) == ["00000010"]
    assert open_split(tff_sqlite_indexed).split == "train"


def test_open_lzma_in_directory(tff_sqlite, tmp_path):
    d = tmp_path / "download"
    d.mkdir()
    (d / "stackoverflow.sqlite.lzma").write_bytes(lzma.compress(tff_sqlite.read_bytes()))
    sp = open_split(d, "test", cache_dir=tmp_path / "cache")
    assert sp.path == tmp_path / "cache" / "stackoverflow.sqlite"
    assert sp.client_examples("00000001") == DATA["test"]["00000001"]


def test_open_sqlite_without_suffix(tff_sqlite_indexed, tmp_path):
    other = shutil.copy(tff_sqlite_indexed, tmp_path / "data.bin")
    assert isinstance(open_split(other, "test"), SQLiteSplit)


def test_open_hdf5(tmp_path):
    pytest.importorskip("h5py")
    from fedprivopt.data.hdf5 import write_hdf5

    write_hdf5(tmp_path / "stackoverflow_test.h5", DATA["test"])
    sp = open_split(tmp_path / "stackoverflow_test.h5")
    assert isinstance(sp, HDF5Split) and sp.split == "test"
    assert open_split(tmp_path, "test").client_examples("00000003") == DATA["test"]["00000003"]
    with pytest.raises(ValueError, match="holds split 'test' of the release, not 'train'"):
        open_split(tmp_path / "stackoverflow_test.h5", "train")


def test_open_errors(tmp_path):
    with pytest.raises(ValueError, match="split must be one of"):
        open_split(tmp_path, "validation")
    with pytest.raises(FileNotFoundError, match="no StackOverflow data"):
        open_split(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"ghost\.sqlite"):
        open_split(tmp_path / "ghost.sqlite")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="unrecognized format"):
        open_split(tmp_path / "notes.txt")
