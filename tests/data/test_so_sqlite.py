import hashlib
import lzma
import pickle
import shutil
import sqlite3
import warnings

import numpy as np
import pytest
from so_fixtures import DATA, TFF_DDL, ex, write_tff_sqlite

from fedprivopt.data.sqlite import (
    SQLiteSplit,
    create_client_index,
    has_client_index,
    list_splits,
    read_example_counts,
    write_sqlite,
)
from fedprivopt.data.sqlite_lzma import decompress_lzma, open_sqlite
from fedprivopt.data.stackoverflow import encode_example
from fedprivopt.data.tfexample_encode import serialize_example


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _open(path, split="train", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return SQLiteSplit(path, split, **kw)


@pytest.mark.parametrize("split", ["train", "heldout", "test"])
def test_reads_every_split_of_the_real_schema(tff_sqlite_indexed, split):
    sp = SQLiteSplit(tff_sqlite_indexed, split)
    assert list(sp.client_ids) == sorted(DATA[split])
    assert len(sp) == len(DATA[split])
    for cid, examples in DATA[split].items():
        assert cid in sp
        assert sp.num_examples(cid) == len(examples)
        assert sp.client_examples(cid) == examples  # file order, exact fields
    assert "nobody" not in sp
    with pytest.raises(KeyError, match="nobody"):
        sp.client_examples("nobody")
    assert repr(sp).startswith("SQLiteSplit(")


def test_unindexed_file_warns_and_still_reads(tff_sqlite):
    with pytest.warns(RuntimeWarning, match="no index"):
        sp = SQLiteSplit(tff_sqlite, "train")
    assert not sp.indexed
    assert sp.client_examples("00000003") == DATA["train"]["00000003"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SQLiteSplit(tff_sqlite, "train", warn_unindexed=False)


def test_opening_is_read_only(tff_sqlite):
    before = _digest(tff_sqlite)
    sp = _open(tff_sqlite)
    sp.client_examples("00000001")
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        sp._connection().execute("CREATE TABLE t (a)")
    sp.close()
    assert _digest(tff_sqlite) == before
    assert list_splits(tff_sqlite) == ["heldout", "test", "train"]


def test_pickles_without_its_connection(tff_sqlite_indexed):
    sp = SQLiteSplit(tff_sqlite_indexed, "test")
    sp.client_examples("00000001")
    clone = pickle.loads(pickle.dumps(sp))
    assert clone._conn is None
    assert clone.client_examples("00000003") == DATA["test"]["00000003"]
    with clone:
        pass
    assert clone._conn is None


def test_create_client_index_on_an_owned_copy(tff_sqlite, tmp_path):
    copy = shutil.copy(tff_sqlite, tmp_path / "copy.sqlite")
    assert create_client_index(copy) is True
    assert create_client_index(copy) is False
    conn = sqlite3.connect(copy)
    assert has_client_index(conn)
    plan = " ".join(
        r[-1]
        for r in conn.execute(
            "EXPLAIN QUERY PLAN SELECT serialized_example_proto FROM examples "
            "WHERE split_name = 'train' AND client_id = 'x' ORDER BY rowid"
        )
    )
    assert "USING INDEX" in plan
    conn.close()
    assert SQLiteSplit(copy).indexed


def test_read_example_counts(tff_sqlite):
    counts = read_example_counts(tff_sqlite)
    assert set(counts) == set(DATA)
    for split, clients in DATA.items():
        assert sorted(counts[split].tolist()) == sorted(len(v) for v in clients.values())
        assert counts[split].dtype == np.int64


def test_write_sqlite_round_trip(tmp_path):
    rows = [(s, c, encode_example(e)) for s, cl in DATA.items() for c, es in cl.items() for e in es]
    meta = [(c, s, len(es)) for s, cl in DATA.items() for c, es in cl.items()]
    path = write_sqlite(tmp_path / "w.sqlite", iter(rows), iter(meta))
    assert not (tmp_path / "w.sqlite.partial").exists()
    sp = SQLiteSplit(path, "train")
    assert sp.indexed
    assert {c: sp.client_examples(c) for c in sp.client_ids} == DATA["train"]
    with pytest.raises(FileExistsError):
        write_sqlite(path, [], [])
    conn = sqlite3.connect(path)
    ddl = [r[0] for r in conn.execute("SELECT sql FROM sqlite_master WHERE type='table'")]
    conn.close()
    assert [" ".join(d.split()) for d in ddl] == [" ".join(d.rstrip(";").split()) for d in TFF_DDL]


# ---- the .lzma download ----


@pytest.mark.parametrize("fmt, suffix", [(lzma.FORMAT_ALONE, ".lzma"), (lzma.FORMAT_XZ, ".xz")])
def test_decompress_lzma_streams_to_a_cache(tff_sqlite, tmp_path, fmt, suffix):
    raw = tff_sqlite.read_bytes()
    src = tmp_path / "dl" / f"stackoverflow.sqlite{suffix}"
    src.parent.mkdir()
    src.write_bytes(lzma.compress(raw, format=fmt))
    seen = []
    out = decompress_lzma(
        src, cache_dir=tmp_path / "cache", chunk_size=97, index=False, progress=seen.append
    )
    assert out == tmp_path / "cache" / "stackoverflow.sqlite"
    assert out.read_bytes() == raw
    assert seen and seen[-1] == src.stat().st_size and seen == sorted(seen)
    assert list((tmp_path / "cache").iterdir()) == [out]  # no .partial left
    # cached: a second call does not rewrite; overwrite does
    stamp = out.stat().st_mtime_ns
    assert decompress_lzma(src, cache_dir=tmp_path / "cache") == out
    assert out.stat().st_mtime_ns == stamp
    indexed = decompress_lzma(src, cache_dir=tmp_path / "cache", overwrite=True)
    assert SQLiteSplit(indexed, "heldout").indexed  # our cache gets the index
    assert (
        SQLiteSplit(indexed, "heldout").client_examples("00000010") == DATA["heldout"]["00000010"]
    )


def test_open_sqlite_accepts_the_download(tff_sqlite, tmp_path):
    src = tmp_path / "stackoverflow.sqlite.lzma"
    src.write_bytes(lzma.compress(tff_sqlite.read_bytes(), format=lzma.FORMAT_ALONE))
    tff_sqlite.unlink()
    sp = open_sqlite(src, "test")
    assert sp.path == tmp_path / "stackoverflow.sqlite" and sp.indexed
    assert sp.client_examples("00000001") == DATA["test"]["00000001"]


def test_bad_lzma_files(tff_sqlite, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.lzma"):
        decompress_lzma(tmp_path / "nope.lzma")
    good = lzma.compress(tff_sqlite.read_bytes(), format=lzma.FORMAT_XZ)
    trunc = tmp_path / "trunc.sqlite.lzma"
    trunc.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match=r"trunc\.sqlite\.lzma: truncated"):
        decompress_lzma(trunc)
    junk = tmp_path / "junk.sqlite.lzma"
    junk.write_bytes(b"this is not compressed at all" * 10)
    with pytest.raises(ValueError, match=r"junk\.sqlite\.lzma: corrupt"):
        decompress_lzma(junk)
    notdb = tmp_path / "notdb.sqlite.lzma"
    notdb.write_bytes(lzma.compress(b"hello world"))
    with pytest.raises(ValueError, match="not an SQLite database"):
        decompress_lzma(notdb)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "junk.sqlite.lzma",
        "notdb.sqlite.lzma",
        "stackoverflow.sqlite",
        "trunc.sqlite.lzma",
    ]
    with pytest.raises(ValueError, match="chunk_size"):
        decompress_lzma(trunc, chunk_size=0)


# ---- bad files ----


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"absent\.sqlite"):
        SQLiteSplit(tmp_path / "absent.sqlite")


@pytest.mark.parametrize("content", [b"", b"hello, I am text\n" * 20, b"SQLite format 3"])
def test_not_sqlite(tmp_path, content):
    path = tmp_path / "bad.sqlite"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"bad\.sqlite: not an SQLite database"):
        SQLiteSplit(path)


def test_truncated_sqlite(tmp_path):
    big = {"train": {f"{i:08d}": [ex("word " * 50)] * 20 for i in range(30)}}
    path = write_tff_sqlite(tmp_path / "full.sqlite", big)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"full\.sqlite: truncated SQLite database"):
        SQLiteSplit(path)


def test_sqlite_that_is_not_stackoverflow(tmp_path):
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(
        ValueError,
        match=r"other\.sqlite: not a TFF StackOverflow database: "
        r"missing table\(s\) \['client_metadata', 'examples'\]",
    ):
        SQLiteSplit(path)


def test_wrong_columns(tmp_path):
    path = tmp_path / "cols.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE examples (split_name TEXT, client_id TEXT, proto BLOB)")
    conn.execute(TFF_DDL[1])
    conn.commit()
    conn.close()
    with pytest.raises(
        ValueError,
        match=r"'examples' lacks column\(s\) "
        r"\['serialized_example_proto'\]",
    ):
        SQLiteSplit(path)


def test_absent_split_lists_present_ones(tff_sqlite):
    with pytest.raises(ValueError, match=r"no split 'validation'.*\['heldout', 'test', 'train'\]"):
        _open(tff_sqlite, "validation")


def test_other_tff_dataset_is_rejected_at_open(tmp_path):
    """A TFF SQLite file of another dataset (e.g. Shakespeare) has the tables but not the data."""
    data = {"train": {"THE_TRAGEDY_OF_KING_LEAR_KENT": [None, None]}}
    path = write_tff_sqlite(
        tmp_path / "shakespeare.sqlite",
        data,
        blob=lambda _: serialize_example({"snippets": "To be or not to be"}),
    )
    with pytest.raises(
        ValueError,
        match=r"shakespeare\.sqlite: .*feature 'creation_date' is "
        r"missing \(found \['snippets'\]\)",
    ):
        _open(path)
    assert _open(path, validate=False).num_examples("THE_TRAGEDY_OF_KING_LEAR_KENT") == 2


def test_corrupt_proto_names_file_and_client(tmp_path):
    good = encode_example(ex("fine"))
    blobs = iter([good, good, good[:-3], b"not a blob"])
    data = {"train": {"00000001": [None, None], "00000002": [None], "00000003": [None]}}
    path = write_tff_sqlite(tmp_path / "corrupt.sqlite", data, blob=lambda _: next(blobs))
    sp = _open(path)
    assert len(sp.client_examples("00000001")) == 2
    with pytest.raises(
        ValueError,
        match=r"corrupt\.sqlite: client '00000002' of split 'train', "
        r"example 0: .*runs past",
    ):
        sp.client_examples("00000002")
    conn = sqlite3.connect(path)
    conn.execute(
        "UPDATE examples SET serialized_example_proto = 'text' WHERE client_id = '00000003'"
    )
    conn.commit()
    conn.close()
    with pytest.raises(ValueError, match="is str, not a BLOB"):
        _open(path).client_examples("00000003")


def test_inconsistent_metadata(tmp_path):
    path = write_tff_sqlite(tmp_path / "dup.sqlite")
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO client_metadata VALUES ('00000001', 'train', 5)")
    conn.commit()
    conn.close()
    with pytest.raises(ValueError, match="lists a client twice"):
        _open(path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE client_metadata SET num_examples = -1 WHERE client_id = '00000002'")
    conn.commit()
    conn.close()
    with pytest.raises(ValueError, match="num_examples holds -1"):
        read_example_counts(path)
