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
"""

from __future__ import annotations

import lzma
import sqlite3

import pytest

from fedprivopt.data.sqlite import write_sqlite
from fedprivopt.data.sqlite_lzma import decompress_lzma
from fedprivopt.data.stackoverflow import StackOverflowExample, encode_example
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
