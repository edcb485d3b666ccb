import pickle

import numpy as np
import pytest
from so_fixtures import DATA

from fedprivopt.data.hdf5 import HDF5Split, open_hdf5, write_hdf5
from fedprivopt.data.stackoverflow import FEATURES

h5py = pytest.importorskip("h5py")

TEXT = [f for f in FEATURES if f != "score"]


def write_legacy(path, clients, *, text_dtype="vlen-bytes"):
    """The legacy TFF layout /examples/<client_id>/<feature>, written with raw h5py."""
    with h5py.File(path, "w") as f:
        for cid, examples in clients.items():
            g = f.create_group(f"examples/{cid}")
            for name in TEXT:
                values = [getattr(e, name).encode() for e in examples]
                if text_dtype == "vlen-bytes":
                    g.create_dataset(
                        name,
                        data=np.array(values, dtype=object),
                        dtype=h5py.special_dtype(vlen=bytes),
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
