import pickle

import numpy as np
import pytest
from so_fixtures import DATA, read_hdf5_in_child

from fedprivopt.data.hdf5 import HDF5Split, open_hdf5, write_hdf5
from fedprivopt.data.stackoverflow import FEATURES

h5py = pytest.importorskip("h5py")

TEXT = [f for f in FEATURES if f != "score"]


def write_legacy(path, clients, *, text_dtype="vlen-bytes", userblock_size=None, **layout):
    """The legacy TFF layout /examples/<client_id>/<feature>, written with raw h5py
    (``layout``: dataset options of the text features, e.g. ``chunks=True``)."""
    with h5py.File(path, "w", userblock_size=userblock_size) as f:
        for cid, examples in clients.items():
            g = f.create_group(f"examples/{cid}")
            for name in TEXT:
                values = [getattr(e, name).encode() for e in examples]
                if text_dtype == "vlen-bytes":
                    g.create_dataset(
                        name,
                        data=np.array(values, dtype=object),
                        dtype=h5py.special_dtype(vlen=bytes),
                        **layout,
                    )
                elif text_dtype == "fixed":
                    g.create_dataset(name, data=np.array(values, dtype="S"))
                else:
                    g.create_dataset(
                        name, data=[v.decode() for v in values], dtype=h5py.string_dtype("utf-8")
                    )
            g.create_dataset("score", data=np.array([e.score for e in examples], dtype=np.int64))
    return path


@pytest.mark.parametrize("text_dtype", ["vlen-bytes", "fixed", "vlen-str"])
def test_reads_the_legacy_layout(tmp_path, text_dtype):
    path = write_legacy(
        tmp_path / "stackoverflow_held_out.h5", DATA["train"], text_dtype=text_dtype
    )
    sp = HDF5Split(path)
    assert sp.split == "heldout"  # inferred from the release file name
    assert list(sp.client_ids) == sorted(DATA["train"])
    for cid, examples in DATA["train"].items():
        assert sp.num_examples(cid) == len(examples)
        assert sp.client_examples(cid) == examples
    with pytest.raises(KeyError, match="ghost"):
        sp.num_examples("ghost")
    assert "ghost" not in sp and "00000001" in sp


def test_unicode_and_int64_scores(tmp_path):
    write_legacy(tmp_path / "stackoverflow_test.h5", DATA["test"])
    assert open_hdf5(tmp_path, "test").client_examples("00000003") == DATA["test"]["00000003"]


def test_write_hdf5_round_trip_and_pickle(tmp_path):
    path = write_hdf5(tmp_path / "stackoverflow_train.h5", DATA["train"])
    sp = open_hdf5(path)
    assert {c: sp.client_examples(c) for c in sp.client_ids} == DATA["train"]
    clone = pickle.loads(pickle.dumps(sp))
    assert clone.client_examples("00000002") == DATA["train"]["00000002"]
    sp.close()
    clone.close()
    with pytest.raises(FileExistsError):
        write_hdf5(path, {})


def test_bad_hdf5_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing\.h5"):
        HDF5Split(tmp_path / "missing.h5")
    text = tmp_path / "text.h5"
    text.write_text("not hdf5")
    with pytest.raises(ValueError, match=r"text\.h5: not a readable HDF5 file"):
        HDF5Split(text)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.create_dataset("images", data=np.zeros(3))
    with pytest.raises(ValueError, match=r"other\.h5: no '/examples' group"):
        HDF5Split(other)
    with pytest.raises(ValueError, match="split must be one of"):
        open_hdf5(tmp_path, "validation")


def test_malformed_clients(tmp_path):
    path = write_legacy(tmp_path / "s.h5", DATA["train"])
    with h5py.File(path, "a") as f:
        del f["examples/00000001/title"]
        del f["examples/00000002/score"]
        f["examples/00000002/score"] = np.array([1.5])
        del f["examples/00000003/tags"]
        f["examples/00000003/tags"] = np.array([b"a|b"], dtype="S")
    sp = HDF5Split(path, "train")
    with pytest.raises(ValueError, match=r"s\.h5: client '00000001' lacks feature 'title'"):
        sp.client_examples("00000001")
    with pytest.raises(ValueError, match="'score' has dtype float64"):
        sp.client_examples("00000002")
    with pytest.raises(ValueError, match="unequal lengths"):
        sp.client_examples("00000003")


@pytest.mark.parametrize(
    "layout",
    [{"userblock_size": 1024}, {"chunks": True}, {"chunks": True, "compression": "gzip"}],
    ids=["userblock", "chunked", "chunked-gzip"],
)
def test_other_layouts_read_back(tmp_path, layout):
    """Heap references are checked at the right offsets after a user block; chunked strings
    go through the forked probe and read back the same."""
    path = write_legacy(tmp_path / "stackoverflow_train.h5", DATA["train"], **layout)
    sp = HDF5Split(path)
    assert {c: sp.client_examples(c) for c in sp.client_ids} == DATA["train"]
    sp.close()


def test_probe_stops_a_hang_in_chunked_strings(tmp_path):
    """A heap object with index 0 and size 0 hangs HDF5; with chunked strings the references
    are not checked from the file, so the forked probe must time out and name the file."""
    path = write_legacy(tmp_path / "stackoverflow_train.h5", DATA["train"], chunks=True)
    data = bytearray(path.read_bytes())
    start = data.index(b"GCOL")
    obj = start + 16 + 16 + -(-int.from_bytes(data[start + 24 : start + 32], "little") // 8) * 8
    assert int.from_bytes(data[obj : obj + 2], "little") > 0  # the second object's header
    data[obj : obj + 2] = bytes(2)  # index 0
    data[obj + 8 : obj + 16] = bytes(8)  # size 0
    path.write_bytes(bytes(data))
    out = read_hdf5_in_child(path, probe_timeout=2.0)
    assert out.startswith("ValueError:") and "stackoverflow_train.h5" in out, out
    assert "took more than 2.0 s" in out, out
