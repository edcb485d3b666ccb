"""Issue 15, forty-fourth hostile review (input: bad settings and data files): tests.

1. ``fedprivopt.data.generate(out, SyntheticConfig(num_clients=4096, mean_examples_per_client=200,
   mean_tokens_per_example=1000, mean_title_tokens=1000))`` (sentence and title lengths inside
   their documented ranges, [1, 1000] and [2, 1000]). Before: ``worker_memory`` counted 1 kB an
   example whatever its length, so a worker's chunk was estimated at 473 MB where it takes about
   19 GB (measured: 20,000 examples of 1,000 tokens took 720 MB, 36 bytes a token, and 1,000
   title tokens 222 MB more); the default workers (the CPUs, lowered to what the estimate said
   fits) each drew such a chunk, beyond the memory of a 23 GB machine; and where even one
   worker did not fit, one was started anyway (``processes_that_fit`` gives at least 1). Now
   ``synthetic_config.worker_memory`` counts 36 bytes a sentence token and 12 a title token
   beyond the 1 kB of the default lengths (the default estimate unchanged), a chunk of the
   dataset's users when it has fewer than 2,048, and ``workers_that_fit`` refuses a chunk larger
   than the machine's memory, naming the knobs, before anything is written.
2. The readers' Python API given a FIFO (``mkfifo f``; also a directory for the SQLite readers):
   ``read_word_counts(f)``, ``read_tag_counts(f)``, ``SQLiteSplit(f)`` (``check_sqlite_file``,
   also ``list_splits``, ``read_example_counts``) and ``decompress_lzma(f)`` (the forty-second
   review's minor). Before: ``FileNotFoundError: f: no such file`` of a path that exists (no
   hang). Now ``ValueError: f: not a regular file (a FIFO, device or socket) …``, as
   ``open_split`` and the tasks say it (``vocab._existing``, ``sqlite_files.check_sqlite_file``,
   ``sqlite_lzma.decompress_lzma``); a missing file is still ``FileNotFoundError``.
3. ``fedprivopt.data.generate("d\x00x", config)`` (also bytes; the forty-first review's minor).
   Before: ``ValueError: embedded null byte`` (the operating system's words, naming nothing).
   Now ``out_dir holds a null character: 'd\x00x'; a directory name has none``, before anything
   is made (``synthetic.generate``), as ``data synth --out`` and ``task-params.data-dir`` say it.
4. ``data info f.sqlite`` of a 24 MB TFF-schema file whose ``client_metadata`` names a million
   splits (a damaged table; a split column filled with ids). Before: rc 0 after 298 s and
   1.2 GB (50 times the file), a million lines printed; ``read_example_counts`` (also a task's
   data identity) held a counts array a split, ``list_splits`` every name, and ``SQLiteSplit(f,
   "nope")`` put every name in its one-line error. Now at most ``sqlite.MAX_SPLITS`` = 100 split
   names are read: ``f: client_metadata names more than 100 splits (a StackOverflow file has 3:
   train, heldout, test), so the file is damaged`` (rc 2, one line); the error of a split not
   there shows its names cut to 80 characters.
"""

from __future__ import annotations

import os

import pytest

from fedprivopt.data import synthetic, synthetic_config
from fedprivopt.data.sqlite import SQLiteSplit, list_splits, read_example_counts, write_sqlite
from fedprivopt.data.sqlite_lzma import decompress_lzma
from fedprivopt.data.stackoverflow import StackOverflowExample, encode_example
from fedprivopt.data.summary import summarize_sqlite
from fedprivopt.data.synthetic_config import SyntheticConfig
from fedprivopt.data.vocab import read_tag_counts, read_word_counts


class _Drawn(Exception):
    """Raised where the generator would start drawing chunks."""


@pytest.fixture
def machine(monkeypatch):
    """A machine of 8 GiB, and a generator that stops where it would start its workers."""
    monkeypatch.setattr(synthetic_config, "physical_memory", lambda: 8 * 2**30, raising=False)
    started: list[int] = []

    def chunk_rows(config, model, model_seed, chunk_seeds, workers):
        started.append(workers)
        raise _Drawn

    monkeypatch.setattr(synthetic, "chunk_rows", chunk_rows)
    return started


# -- finding 1: long sentences or titles made a worker's chunk far larger than estimated -------


def test_1_long_sentences_count_in_a_workers_memory(tmp_path, machine):
    long = SyntheticConfig(
        num_clients=4096, vocab_size=2000, num_tags=50, mean_examples_per_client=200.0,
        mean_tokens_per_example=1000.0, mean_title_tokens=1000.0,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"^a chunk of 2,048 users of this dataset takes about"):
        synthetic.generate(tmp_path / "a", long, workers=None)
    assert machine == [] and not (tmp_path / "a").exists()
    # a title alone of 1,000 tokens: 12 bytes a token and example
    title = SyntheticConfig(num_clients=4096, mean_title_tokens=1000.0)
    assert synthetic_config.worker_memory(title) > 2048 * 40 * 12_000
    # the default lengths keep the estimate of the thirty-ninth review (1 kB an example)
    default = SyntheticConfig(num_clients=4096, vocab_size=2000, num_tags=50)
    assert synthetic_config.worker_memory(default) == (
        64 * 2**20 + 95 * 2000 + 50_000 * 50 + 2048 * 40 * 1000
    )
    with pytest.raises(_Drawn):
        synthetic.generate(tmp_path / "b", default, workers=None)
    assert machine == [min(2, synthetic.default_workers())]


def test_1_a_small_dataset_is_estimated_by_its_own_users(tmp_path, machine):
    # 30 users of 1,000 tokens: a chunk of 30 users (about 0.3 GB), not of 2,048
    small = SyntheticConfig(
        num_clients=30, vocab_size=400, num_tags=20, mean_examples_per_client=200.0,
        mean_tokens_per_example=1000.0,
    )  # fmt: skip
    assert synthetic_config.worker_memory(small) < 2**30
    with pytest.raises(_Drawn):
        synthetic.generate(tmp_path / "c", small, workers=1)
    assert machine == [1]


# -- finding 2: the readers said "no such file" of a FIFO or directory that exists -------------


@pytest.mark.parametrize(
    "reader", [read_word_counts, read_tag_counts, SQLiteSplit, decompress_lzma]
)
def test_2_a_fifo_is_named_as_no_regular_file(tmp_path, reader):
    fifo = tmp_path / "stackoverflow.x"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"stackoverflow\.x: not a regular file \(a"):
        reader(fifo)
    with pytest.raises(FileNotFoundError, match=r"absent: no such file"):
        reader(tmp_path / "absent")


@pytest.mark.parametrize("reader", [SQLiteSplit, decompress_lzma])
def test_2_a_directory_is_named_as_no_regular_file(tmp_path, reader):
    directory = tmp_path / "d.sqlite"
    directory.mkdir()
    with pytest.raises(ValueError, match=r"d\.sqlite: not a regular file \(a directory"):
        reader(directory)


# -- finding 3: generate's out_dir with a null character ---------------------------------------


@pytest.mark.parametrize("kind", [str, os.fsencode])
def test_3_generate_names_a_null_character_in_out_dir(tmp_path, kind):
    out = kind(str(tmp_path / "d\x00x"))
    refused = r"^out_dir holds a null character: .*; a directory name has none$"
    with pytest.raises(ValueError, match=refused):
        synthetic.generate(out, SyntheticConfig.tiny(), workers=1)
    assert list(tmp_path.iterdir()) == []


# -- finding 4: a client_metadata of a million split names -------------------------------------


def _many_splits(tmp_path, splits: int):
    example = encode_example(StackOverflowExample("a b", "", "x", "2010", 1, "question"))
    metadata = [("u1", "train", 1)] + [(f"u{i}", f"s{i}", 1) for i in range(splits - 1)]
    return write_sqlite(tmp_path / "many.sqlite", [("train", "u1", example)], metadata)


def test_4_a_file_of_more_than_100_splits_is_refused(tmp_path):
    path = _many_splits(tmp_path, 101)
    for read in (read_example_counts, list_splits, summarize_sqlite):  # data info: summarize_sqlite
        with pytest.raises(ValueError, match=r"names more than 100 splits .* is damaged$"):
            read(path)
    with pytest.raises(ValueError, match=r"no split 'nope' .*\(splits present: more than 100\)$"):
        SQLiteSplit(path, "nope", warn_unindexed=False)
    assert len(SQLiteSplit(path, warn_unindexed=False).client_ids) == 1


def test_4_a_file_of_100_splits_is_read(tmp_path):
    path = _many_splits(tmp_path, 100)
    assert len(read_example_counts(path)) == len(list_splits(path)) == 100
    with pytest.raises(ValueError, match=r"\(splits present: \['s0', .*…\)$") as info:
        SQLiteSplit(path, "nope", warn_unindexed=False)
    assert len(str(info.value)) - len(str(path)) < 150
