"""Issue 15, fortieth hostile review (input: bad settings and data files): tests.

1. ``decompress_lzma(D / "stackoverflow.sqlite.xz")`` (also ``data.loader.open_split`` of it)
   of an ``.xz`` file of two streams, ``cat a.xz b.xz`` of a database cut in two (``xz -dk``
   writes the whole database; stream padding between them alike): refused, ``truncated SQLite
   database: header says 90112 bytes, file has 45056``, as only the first stream was read; and
   a stream followed by other bytes (a second file appended, a damaged tail), which ``xz -d``
   refuses, was read as if the file ended there. ``sqlite_lzma._Streams`` now decompresses
   every stream of an ``.xz`` file after its padding, as ``xz -d`` does, and refuses anything
   else after a stream (``data after the end of the compressed stream``).
2. ``simulate toy.toml --rounds 1 --set num-server-rounds=1`` where the value ends in a carriage
   return (a script saved with CRLF line ends passes it with its last word) or a no-break space
   (copied from a web page): no TOML, so the value was the text ``'1'``, and the line said
   ``argument --rounds: 1 contradicts --set num-server-rounds='1'``;
   ``--set secure=false\r`` was ``secure must be true or false, got 'false'``,
   ``noise-multiplier=0.5\r`` ``must be a real number …, got '0.5'`` (text values were already
   stripped). ``config_presets.parse_override`` now strips the value before reading it as TOML.
3. ``HDF5Split(f)`` (also ``data info f``, ``open_split``) of a legacy HDF5 file where client
   ``u3`` is a soft link to ``/examples/u1`` (or a hard link, ``f["examples/u3"] =
   f["examples/u1"]``, or an external link to it): rc 0, ``u3`` read as a user of its own with
   ``u1``'s examples, one person's data trained as two users; a feature of ``u2`` linked to
   ``u1``'s alike. Now ``HDF5Split`` refuses a client that is no hard link when it opens the
   file, and a client group or feature that has another name (``_check_one_name``: more than
   one hard link to the object) when it is read: one line naming it.
4. ``simulate big.toml`` of a preset of 16 MiB of tables (``[t0000001]`` lines; also ``--resume``
   of a run whose ``config.toml`` is such): 1.5 GB and 38 s in Python's TOML parser before the
   first key was refused (``t0000000 = {} is a table without a value``), about 6 GB at the
   64 MiB the reader allowed (a 20 GB file was refused unread). A preset is read up to
   ``config_presets.PRESET_LIMIT`` = 1 MiB now (about 250 times the largest preset here; 2 s
   and 80 MB to parse at most): ``holds more than 1,048,576 bytes``, one line.
5. ``simulate stackoverflow-tp-mini.toml --set 'task-params.data-dir=data/so<line break>'``
   (also a blank component, ``data/ /so``, and ``task-params.cache-dir`` with an escape
   sequence): rc 0, a directory of that name created and a synthetic dataset generated into it
   (or the token store), where ``--out`` of the same text is refused. Now
   ``stackoverflow_datadir.check_dir_text`` refuses both keys as ``--out`` does: rc 2, one line
   naming the key.
6. ``data info f`` (also ``HDF5Split(f)``) of a legacy HDF5 file with a client whose name is not
   UTF-8 (``u\xff2``): rc 2, but ``cannot read the client list (damaged HDF5 file?): '<' not
   supported between instances of 'bytes' and 'str'`` (h5py gives such a name as bytes). Now
   ``HDF5Split`` names it: ``client name b'u\xff2' under '/examples' is not UTF-8``.
"""

from __future__ import annotations

import lzma
import sqlite3
from pathlib import Path

import pytest

from fedprivopt.data.hdf5 import HDF5Split, write_hdf5
from fedprivopt.data.sqlite import write_sqlite
from fedprivopt.data.sqlite_lzma import decompress_lzma
from fedprivopt.data.stackoverflow import StackOverflowExample, encode_example
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.config_presets import parse_override
from tests.reliability.test_thirtyeighth_review_input import TOY, _cli


def _database(path):
    """A small database in the TFF schema (3 clients of 40 examples), its bytes."""
    example = StackOverflowExample(
        "a b c " * 20, "t", "x|y", "2010-01-08 09:34:05 UTC", 3, "answer"
    )
    blob = encode_example(example)
    clients = [f"u{i}" for i in range(3)]
    rows = [("train", c, blob) for c in clients for _ in range(40)]
    write_sqlite(path, rows, [(c, "train", 40) for c in clients])
    return path.read_bytes()


# -- finding 1: an .xz file of several streams, or with bytes after its stream -----------------


@pytest.mark.parametrize("padding", [b"", b"\0" * 8])
def test_1_every_stream_of_an_xz_file_is_decompressed(tmp_path, padding):
    raw = _database(tmp_path / "db.sqlite")
    half = len(raw) // 2
    src = tmp_path / "stackoverflow.sqlite.xz"
    src.write_bytes(lzma.compress(raw[:half]) + padding + lzma.compress(raw[half:]))
    out = decompress_lzma(src, index=False, chunk_size=997)
    assert out.read_bytes() == raw
    with sqlite3.connect(out) as conn:
        assert conn.execute("SELECT count(*) FROM examples").fetchone() == (120,)


@pytest.mark.parametrize(
    "tail, fmt",
    [
        (b"garbage", lzma.FORMAT_XZ),
        (b"\0\0\0", lzma.FORMAT_XZ),  # padding is a multiple of four bytes
        (b"\0\0\0\0" + b"\1", lzma.FORMAT_XZ),
        (b"garbage", lzma.FORMAT_ALONE),
    ],
)
def test_1_bytes_after_the_stream_are_refused(tmp_path, tail, fmt):
    raw = _database(tmp_path / "db.sqlite")
    src = tmp_path / "stackoverflow.sqlite.lzma"
    src.write_bytes(lzma.compress(raw, format=fmt) + tail)
    # what follows a stream is no stream (corrupt), or is not padding of four bytes
    with pytest.raises(ValueError, match="data after the end of the compressed stream"):
        decompress_lzma(src, index=False)
    assert not (tmp_path / "stackoverflow.sqlite").exists()


# -- finding 2: a --set value followed by a carriage return or a no-break space ----------------


@pytest.mark.parametrize("end", ["\r", "\u00a0", "\u3000", " \r\n"])
@pytest.mark.parametrize(
    "text, value",
    [("noise-multiplier=0.5", 0.5), ("num-server-rounds=1", 1), ("secure=false", False)],
)
def test_2_whitespace_after_a_set_value_is_no_part_of_it(text, value, end):
    key, parsed = parse_override(text + end)
    assert (key, parsed) == (text.split("=")[0], value)
    assert type(parsed) is type(value)
    assert parse_override(f"device=cpu{end}") == ("device", "cpu")  # text, as before


def test_2_a_crlf_script_s_rounds_do_not_contradict(tmp_path):
    code, lines = _cli(
        "simulate", TOY, "--rounds", "1", "--out", str(tmp_path / "r"), "--quiet",
        "--set", "num-server-rounds=1\r", "--set", "noise-multiplier=-1\r",
    )  # fmt: skip
    assert code == 2 and len(lines) == 1, lines
    assert "noise-multiplier" in lines[0] and "-1" in lines[0], lines  # not 'contradicts'


# -- finding 3: a legacy HDF5 client (or feature) that is a link to another -------------------


def legacy_h5(tmp_path):
    """A legacy train split of clients u1 (2 examples) and u2 (1), and h5py."""
    h5py = pytest.importorskip("h5py")

    def example(i):
        return StackOverflowExample(f"w{i} x", "t", "a|b", "2010-01-08 09:34:05 UTC", i, "answer")

    path = tmp_path / "stackoverflow_train.h5"
    write_hdf5(path, {"u1": [example(1), example(2)], "u2": [example(3)]})
    return path, h5py


@pytest.mark.parametrize("kind", ["soft", "hard", "external"])
def test_3_a_client_that_is_a_link_to_another_is_refused(tmp_path, kind):
    path, h5py = legacy_h5(tmp_path)
    with h5py.File(path, "a") as f:
        if kind == "soft":
            f["examples/u3"] = h5py.SoftLink("/examples/u1")
        elif kind == "hard":
            f["examples/u3"] = f["examples/u1"]
        else:
            f["examples/u3"] = h5py.ExternalLink(path.name, "/examples/u1")
    with pytest.raises(ValueError, match=r"/examples/u(1|3) is .*link"):
        split = HDF5Split(path)
        for client in split.client_ids:  # what data info and a reader do
            split.num_examples(client)
            split.client_examples(client)
    code, lines = _cli("data", "info", str(path))
    assert code == 2 and len(lines) == 1 and "link" in lines[0], lines


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_3_a_feature_linked_to_another_client_s_is_refused(tmp_path, kind):
    path, h5py = legacy_h5(tmp_path)
    with h5py.File(path, "a") as f:
        del f["examples/u2/tokens"]
        other = "/examples/u1/tokens"
        f["examples/u2/tokens"] = h5py.SoftLink(other) if kind == "soft" else f[other]
        del f["examples/u2/score"]
        f["examples/u2/score"] = f["examples/u1/score"]  # the lengths agree
        for name in ("creation_date", "tags", "title", "type"):
            del f[f"examples/u2/{name}"]
            f[f"examples/u2/{name}"] = f[f"examples/u1/{name}"]
    split = HDF5Split(path)
    with pytest.raises(ValueError, match=r"/examples/u[12]/\w+ is .*link"):
        split.client_examples("u2")


def test_3_a_file_written_by_write_hdf5_is_read_as_before(tmp_path):
    path, h5py = legacy_h5(tmp_path)
    with h5py.File(path, "a") as f:  # other names beside a client's features are no features
        f["examples/u2/note"] = h5py.SoftLink("/examples/u1/tokens")
    split = HDF5Split(path)
    assert [e.score for e in split.client_examples("u1")] == [1, 2]
    assert [e.score for e in split.client_examples("u2")] == [3]


# -- finding 4: a preset of tens of MB parsed before its first key is checked -----------------


PRESET_LIMIT = 1 << 20  # config_presets.PRESET_LIMIT


def test_4_a_preset_over_1_mib_is_refused_before_it_is_parsed(tmp_path):
    preset = tmp_path / "big.toml"
    tables = (PRESET_LIMIT + 12) // 12 + 1  # "[t0000001]\n": ~95 bytes of memory a byte
    preset.write_text("".join(f"[t{i:09d}]\n" for i in range(tables)))
    with pytest.raises(ValueError, match=r"holds more than 1,048,576 bytes"):
        load_config(preset)
    code, lines = _cli("simulate", str(preset), "--out", str(tmp_path / "r"), "--quiet")
    assert code == 2 and len(lines) == 1 and "1,048,576" in lines[0], lines
    assert not (tmp_path / "r").exists()


def test_4_a_preset_of_1_mib_is_read(tmp_path):
    text = Path(TOY).read_text()
    preset = tmp_path / "commented.toml"
    preset.write_text(text + "#" * (PRESET_LIMIT - len(text.encode()) - 1) + "\n")
    assert preset.stat().st_size == PRESET_LIMIT
    assert load_config(preset).strategy.num_server_rounds == 20


# -- finding 5: a task's data-dir or cache-dir with a line break or a blank component ---------

MINI = "simulations/stackoverflow-tp-mini.toml"


@pytest.mark.parametrize(
    "key, name, error",
    [
        ("data-dir", "s\no", "control character"),  # a trailing one is stripped (finding 2)
        ("data-dir", "a/ /so", "blank path component"),
        ("cache-dir", "cache\x1b[2J", "control character"),
    ],
)
def test_5_a_data_dir_that_is_no_name_is_refused(tmp_path, key, name, error):
    where = tmp_path / name
    code, lines = _cli(
        "simulate", MINI, "--rounds", "1", "--out", str(tmp_path / "r"), "--quiet",
        "--set", "task-params.token-cache=true", "--set", f"task-params.{key}={where}",
    )  # fmt: skip
    assert code == 2 and len(lines) == 1, lines
    assert f"task-params.{key}" in lines[0] and error in lines[0], lines
    assert not where.exists() and not (tmp_path / "a").exists()


# -- finding 6: a legacy HDF5 client name that is not UTF-8 -----------------------------------


def test_6_a_client_name_that_is_not_utf8_is_named(tmp_path):
    path, h5py = legacy_h5(tmp_path)
    with h5py.File(path, "a") as f:
        h5py.h5g.create(f["examples"].id, b"u\xff2")
    with pytest.raises(ValueError, match=r"client name b'u\\xff2' under '/examples' is not UTF-8"):
        HDF5Split(path)
    code, lines = _cli("data", "info", str(path))
    assert code == 2 and len(lines) == 1 and "not UTF-8" in lines[0], lines
