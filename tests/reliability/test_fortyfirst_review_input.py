"""Issue 15, forty-first hostile review (input: bad settings and data files): tests.

1. ``simulate stackoverflow-tp-mini.toml --set 'task-params.data-dir="D\\u0000x"'`` (TOML
   writes a null character so; also ``task-params.cache-dir`` with ``token-cache = true``,
   ``compare``, a preset's or a run's ``config.toml``): rc 2, but ``config: embedded null
   byte``, the operating system's words naming no key, raised by the check that the task's
   directories lie outside ``--out`` before the task (which names the key for every other
   control character) was built. Now ``simulation.config`` refuses it when the configuration
   is read (``config_values.task_path``): one line naming the key.
2. ``SQLiteSplit(f).client_examples("u1")`` (also ``simulate`` of a task on the file) of a
   TFF-schema file whose ``examples.client_id`` is declared ``COLLATE NOCASE`` (or ``RTRIM``,
   or ``INTEGER``, which stores ``'01'`` and ``'1'`` as 1, so reading ``'1'`` found both) and
   whose ``client_metadata`` lists ``u1`` and ``U1`` with counts that add both: rc 0, each
   read every row of either, one person's examples trained as two users (the HDF5 twin:
   fortieth review, input 3). Now a row SQLite matched must be exactly the text of the split
   and client asked for (``sqlite_files.check_row_owner``; an ``INTEGER`` column is refused): one
   line naming both.
3. ``data synth --out D --overwrite`` (also a task's generation, ``write_sqlite``,
   ``decompress_lzma(..., overwrite=True)``) where ``D/stackoverflow.sqlite`` has a hot journal
   beside it (a write to it killed) and the file was removed by hand (or replaced): the new
   database was written beside the old one's journal; every read was refused as a hot journal,
   and that refusal's advice (open it once with write access) rolled the old file's pages into
   the new one: ``database disk image is malformed``. Now the writers remove the ``-journal``,
   ``-wal`` and ``-shm`` of the file they replace before the rename
   (``sqlite_files.remove_companions``).
4. ``data synth --out D --overwrite`` of a synthetic dataset whose file has a hot journal (the
   file kept): rc 2, but ``… is not the file its stackoverflow.synthetic.json describes (…
   hot journal …): a dataset fedprivopt did not generate was put there``, a cause that is not
   the one found. Now ``cli_data._refuse_hot_journal`` says the file cannot be read until the
   write is rolled back, and how; after that the same command writes the dataset.
5. ``simulate stackoverflow-tp-mini.toml --set task-params.data-dir=D`` (``synthetic`` false,
   ``D`` without the dataset's files): the line ended ``pass synthetic=True to generate a
   synthetic dataset``, which typed on the command line (``--set
   task-params.synthetic=True``) is refused (``must be true or false, got 'True'``: TOML's
   spelling is ``true``). Now it also gives the command line's spelling.
6. ``simulate stackoverflow-tp-mini.toml --set task-params.num-users=None`` (also
   ``max-examples-per-user``, ``synth-clients``): ``must be an integer in [1, 100000000] or
   None, got 'None'``, a line that contradicts itself (TOML has no None; the key is left out).
   Now ``cli_task_errors.name_task_param`` says so where it names a task parameter.
"""

from __future__ import annotations

import contextlib
import lzma
import sqlite3
import subprocess
import sys

import pytest

from fedprivopt.data.sqlite import SQLiteSplit, write_sqlite
from fedprivopt.data.sqlite_lzma import decompress_lzma
from fedprivopt.data.stackoverflow import StackOverflowExample, encode_example
from fedprivopt.simulation.config import load_config
from tests.reliability.test_thirtyeighth_review_input import _cli

MINI = "simulations/stackoverflow-tp-mini.toml"


# -- finding 1: a null character in a task directory --------------------------------------------


@pytest.mark.parametrize("key", ["data-dir", "cache-dir"])
@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_1_a_null_character_in_a_task_directory_is_named(tmp_path, key, command):
    argv = [command, MINI, "--rounds", "1", "--out", str(tmp_path / "r"), "--quiet"]
    if command == "compare":
        argv += ["--strategies", "dp-fedavg"]
    code, lines = _cli(
        *argv, "--set", "task-params.token-cache=true",
        "--set", f'task-params.{key}="{tmp_path}/d\\u0000x"',
    )  # fmt: skip
    assert code == 2 and len(lines) == 1, lines
    assert f"task-params.{key} holds a null character" in lines[0], lines
    assert not (tmp_path / "r").exists()


def test_1_a_preset_s_null_character_is_named(tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text(
        'task = "stackoverflow-tp"\n[task-params]\ndata-dir = "so\\u0000"\n', encoding="utf-8"
    )
    with pytest.raises(ValueError, match=r"task-params\.data-dir holds a null character"):
        load_config(preset)


# -- finding 2: an examples table that makes two client ids equal -------------------------------


def _example(text):
    return encode_example(StackOverflowExample(text, "", "a", "2010", 1, "question"))


def _equal_ids_file(path, column, ids):
    """A TFF-schema file whose ``examples.client_id`` is ``column``; both ``ids`` list 3."""
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE examples (split_name TEXT NOT NULL, "
        f"client_id {column} NOT NULL, serialized_example_proto BLOB NOT NULL)"
    )
    conn.execute(
        "CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, "
        "num_examples INTEGER NOT NULL)"
    )

    rows = [(ids[0], _example("private one")), (ids[0], _example("two")), (ids[1], _example("x"))]
    conn.executemany("INSERT INTO examples VALUES ('train', ?, ?)", rows)
    conn.executemany("INSERT INTO client_metadata VALUES (?, 'train', 3)", [(i,) for i in ids])
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize(
    "column, ids",
    [
        ("TEXT COLLATE NOCASE", ("u1", "U1")),
        ("TEXT COLLATE RTRIM", ("u1", "u1 ")),
        ("INTEGER", ("01", "1")),
    ],
)
def test_2_one_user_s_rows_are_not_read_for_another(tmp_path, column, ids):
    split = SQLiteSplit(_equal_ids_file(tmp_path / "s.sqlite", column, ids), warn_unindexed=False)
    for client in ids:  # before: each read all three rows, the other's too
        with pytest.raises(ValueError, match=r"found a row of client .* makes different client"):
            split.client_examples(client)


def test_2_a_file_write_sqlite_writes_is_read_as_before(tmp_path):
    rows = [("train", "u1", _example("a")), ("train", "U1", _example("b"))]
    path = write_sqlite(tmp_path / "s.sqlite", rows, [("u1", "train", 1), ("U1", "train", 1)])
    split = SQLiteSplit(path)
    assert [e.tokens for c in ("u1", "U1") for e in split.client_examples(c)] == ["a", "b"]


# -- finding 3: a database written beside another's hot journal ---------------------------------

_HOT = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA cache_size=1")  # the changed pages spill: the journal is hot
conn.execute("BEGIN")
conn.execute("UPDATE examples SET serialized_example_proto = zeroblob(10)")
os._exit(0)  # killed in the middle of the write
"""


def _small(path, text, clients=3):
    ids = [f"u{i}" for i in range(clients)]
    rows = [("train", c, _example(text)) for c in ids for _ in range(30)]
    return write_sqlite(path, rows, [(c, "train", 30) for c in ids], overwrite=True)


def _hot_journal(path):
    subprocess.run([sys.executable, "-c", _HOT, str(path)], check=True, timeout=60)
    journal = path.with_name(path.name + "-journal")
    assert journal.stat().st_size > 0
    return journal


def _read_back(path):
    """Its texts, after a writable open (which rolls a hot journal back) checked it."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA quick_check").fetchone() == ("ok",)
    split = SQLiteSplit(path)
    return {e.tokens for c in split.client_ids for e in split.client_examples(c)}


@pytest.mark.parametrize("removed", [False, True])
def test_3_write_sqlite_removes_the_replaced_file_s_journal(tmp_path, removed):
    path = _small(tmp_path / "stackoverflow.sqlite", "old", clients=4)
    journal = _hot_journal(path)
    if removed:  # the unreadable file removed by hand, its journal left
        path.unlink()
    _small(path, "new")  # before: beside the old journal, malformed once it was rolled back
    assert not journal.exists()
    assert _read_back(path) == {"new"}


def test_3_decompress_lzma_removes_the_replaced_file_s_journal(tmp_path):
    new = _small(tmp_path / "new.sqlite", "new")
    src = tmp_path / "stackoverflow.sqlite.xz"
    src.write_bytes(lzma.compress(new.read_bytes()))
    out = _small(tmp_path / "stackoverflow.sqlite", "old", clients=4)
    journal = _hot_journal(out)
    assert decompress_lzma(src, overwrite=True, index=False) == out
    assert not journal.exists()
    assert _read_back(out) == {"new"}


# -- finding 4: data synth --overwrite of a dataset whose file has a hot journal ---------------


def test_4_a_hot_journal_is_named_as_what_keeps_the_file_unread(tmp_path):
    out = tmp_path / "D"
    synth = ["data", "synth", "--out", str(out), "--clients", "3", "--workers", "1"]
    assert _cli(*synth)[0] == 0
    _hot_journal(out / "stackoverflow.sqlite")
    code, lines = _cli(*synth, "--seed", "5", "--overwrite")
    assert code == 2 and len(lines) == 1, lines
    assert "has a hot journal beside it" in lines[0] and "did not generate" not in lines[0]
    _read_back(out / "stackoverflow.sqlite")  # the advice: a writable open rolls it back
    assert _cli(*synth, "--seed", "5", "--overwrite")[0] == 0


# -- finding 5: the advice for a data directory without files, as the command line takes it ----


def test_5_the_advice_for_missing_files_is_what_the_command_line_takes(tmp_path):
    empty = tmp_path / "so"
    empty.mkdir()
    base = ["simulate", MINI, "--rounds", "1", "--out", str(tmp_path / "r"), "--quiet"]
    code, lines = _cli(
        *base, "--set", f"task-params.data-dir={empty}", "--set", "task-params.synthetic=false"
    )
    assert code == 2 and len(lines) == 1, lines
    advice = lines[0].split("on the command line ", 1)[1].split(",")[0].split()
    assert advice == ["--set", "task-params.synthetic=true"]  # before: synthetic=True
    code, lines = _cli(*base, *advice, "--set", "task-params.synth-clients=lots")
    assert code == 2 and "synth-clients" in lines[0], lines  # the advice is taken; stops here


# -- finding 6: "or None" in a task parameter's refusal on the command line ---------------------


@pytest.mark.parametrize("key", ["num-users", "max-examples-per-user", "synth-clients"])
def test_6_a_refusal_does_not_ask_the_command_line_for_none(tmp_path, key):
    code, lines = _cli(
        "simulate", MINI, "--rounds", "1", "--out", str(tmp_path / "r"), "--quiet",
        "--set", f"task-params.{key}=None",
    )  # fmt: skip
    assert code == 2 and len(lines) == 1, lines
    assert f"task-params.{key} must be" in lines[0] and " or None" not in lines[0], lines
    # the follow-up's outputs 4 changed the words (a key left out takes the task's default)
    assert "TOML has no None, and a key left out takes the task's default), got 'None'" in lines[0]
