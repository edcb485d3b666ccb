"""Issue 15, twenty-ninth hostile review, data area: regression tests of its findings.

1. ``simulate stackoverflow-nwp.toml --set task-params.eval-users=100000000000000000000``
   (also ``vocab-size``, ``max-examples-per-user``, ``cache-users``; the tag task's
   ``num-tags`` and ``vocab-size``): rc 0, the values silently capped by the files (50
   evaluation users, the file's 4,000 words) while the run's ``config.toml`` and its ledger's
   header recorded 10**20. Now rc 2 before a file is read or generated, one line naming the
   key and its range: users (``num-users``, ``eval-users``, ``cache-users``) at most 10**8
   (the population's bound), ``max-examples-per-user`` at most 10**8, ``vocab-size`` at most
   10**7 (the words a word-count file may hold, finding 2), ``num-tags`` at most 2**25 (the
   tag model's ``(V + 1) K <= 2**26``).
2. A ``stackoverflow.word_count`` of 10**7 words (189 MB; the synthetic generator's largest
   vocabulary) took 1.97 GB and 37 s to build a task that keeps its top 2,000 words (measured
   with ``/usr/bin/time -v``): every word was held, with a set of them, before ``top``; a file
   of 10**8 words grew until the kernel killed the run, and the run's data identity read the
   whole file into memory to hash it. Now a task reads with ``limit`` (only the kept words
   are held: 28 MB and 13.5 s for the same file), a file of more than ``MAX_WORDS`` = 10**7 words
   is refused as it is read (one line naming the file and line), and the identity is hashed
   streaming.
3. A ``stackoverflow.sqlite`` whose ``examples`` hold 400,000 more rows of a training client
   than ``client_metadata`` declares (37), ``simulate stackoverflow-nwp.toml`` on it: rc 2 with
   one line, but only after every row of the client was read (513 MB peak against 399 MB):
   the surplus was read whole before the count was compared, so a larger file grew without
   bound; a task also read all of a user's rows before keeping ``max-examples-per-user``. Now
   at most ``num_examples + 1`` rows are read (the line says ``has more than 37 examples``),
   and a task reads at most ``max-examples-per-user`` rows of a user.
4. A dataset whose evaluation users hold no example (``client_metadata`` 0 and no rows for the
   ``test`` split; also a tag task whose evaluation examples carry none of its ``num-tags``
   tags): ``simulate`` ran, rc 0, every metric NaN, and said ``warning: the model diverged at
   round 1 ... (lower the learning rates)``. Now the first evaluation refuses it: rc 2, one line
   ``eval_users=100: the first 100 users of split 'test' in D hold no example with one of the
   1 tags, so every evaluation would be NaN; raise it or choose another eval_split``.
5. ``HDF5Split(f).client_examples("c1")`` (also ``data.loader``) of an 8 MB legacy HDF5 file
   whose 1-example client has a gzip-compressed ``score`` of 10**9 zeros (within the reader's
   1,032x expansion bound): 7.9 GB and 94 s, then ``has features of unequal lengths``. The
   lengths are now compared before a dataset is read: the same line in 0.7 s and 42 MB.
6. ``decompress_lzma("zeros.sqlite.xz")`` (``open_sqlite`` alike) of 360 kB of ``xz`` holding
   2 GB of zeros: 2 GB written and 37 s before ``not an SQLite database`` (a few MB of such a
   stream fill any disk); a valid database followed by 50 MB of zeros was written whole. Now
   the output's first 100 bytes must be an SQLite header (refused in 1.2 s, nothing kept) and
   it may not grow past the size that header declares.
7. The tag task's token store (``task-params.token-cache = true``) whose ``meta.json`` was made
   a sparse 3 GB file (``truncate -s 3G``): 6.6 GB and 109 s before the store was found damaged
   and rebuilt (20 GB: killed); one whose ``"num_users"`` is ``null`` (or a size a list or an
   object): a ``TypeError`` traceback, rc 1. Now ``meta.json`` is read up to 1 MiB, and both are
   a damaged store, rebuilt (rc 0, 7.7 s and 330 MB for the first).
8. The tasks' per-user tensor cache was bounded by its count (``cache-users``, 2,048) alone:
   next-word users of the real sizes (``data synth --user-sizes real``) at ``seq-len = 1024``
   hold about 6 MB each; reading 300 of them took 1.84 GB, so a run touching 2,048 users holds
   about 12 GB. The cache now also keeps at most ``CACHE_BYTES`` = 1 GiB of tensors (least
   recently used evicted, the newest kept): 1.33 GB for the same 300 users, and no more for 800.
9. The evaluation set is built in memory (about 1-1.5 kB an example for next-word at
   ``seq-len`` 20, 0.6-0.7 kB for the tag task, measured), with no bound: ``eval-users`` of a
   whole test split (the real one: 204,088 users, 16.6 million examples) would take 10-20 GB
   at the first evaluation; on the 342k synthetic dataset (1.68 million test examples)
   next-word's evaluation set alone took 2.0 GB and 122 s (measured). Now the task counts the
   examples from ``client_metadata`` when it is built and refuses more than ``EVAL_BYTES`` =
   2 GiB: rc 2 in 3.8 s, one line ``task-params.eval-users=100000000: the first 132,086 users
   of split 'test' hold 1,678,411 examples to evaluate, about 2.0 GiB in memory; at most
   2 GiB: lower it (the first 132,024 users fit) or max_examples_per_user``.
10. A ``stackoverflow.sqlite`` whose ``client_metadata`` lists 2 million training clients
    (50 MB) took 0.63 GB to build a task (every id and count held, about 175 bytes a client);
    the 10**8 the population's bound admits would take 17 GB. A split may now list at most
    ``MAX_SPLIT_CLIENTS`` = 10**7 clients (the real dataset's largest holds 342,477), counted
    before any id is read: rc 2, one line naming the file, the split and the bound.
"""

from __future__ import annotations

import json
import lzma
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from fedprivopt.data import vocab
from fedprivopt.data.sqlite import SQLiteSplit, write_sqlite
from fedprivopt.data.stackoverflow import StackOverflowExample, encode_example
from fedprivopt.data.vocab import read_word_counts, write_tag_counts, write_word_counts
from tests.reliability.test_fuzz_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
NWP = ROOT / "simulations" / "stackoverflow-nwp.toml"
TP = ROOT / "simulations" / "stackoverflow-tp-mini.toml"
HUGE = 10**20


def _refused(argv: list[str]) -> str:
    """Run the CLI in-process; assert rc 2 with one line and no traceback; return the line."""
    code, _, err = run_cli(argv)
    assert code == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


# -- finding 1: task parameters beyond their bound are refused, not silently capped ------------


@pytest.mark.parametrize(
    ("preset", "key", "value", "bound"),
    [
        (NWP, "eval-users", HUGE, "[1, 100000000]"),
        (NWP, "vocab-size", HUGE, "[1, 10000000]"),
        (NWP, "max-examples-per-user", HUGE, "[1, 100000000]"),
        (NWP, "cache-users", HUGE, "[0, 100000000]"),
        (NWP, "num-users", HUGE, "[1, 100000000]"),
        (TP, "num-tags", HUGE, "[1, 33554432]"),
        (TP, "vocab-size", 10**7 + 1, "[1, 10000000]"),
        (TP, "eval-users", 10**8 + 1, "[1, 100000000]"),
    ],
)
def test_1_task_parameter_above_its_bound_is_refused(tmp_path, preset, key, value, bound):
    data, out = tmp_path / "data", tmp_path / "run"
    err = _refused(["simulate", str(preset), "--rounds", "1", "--out", str(out),
                    "--set", f"task-params.data-dir={data}",
                    "--set", f"task-params.{key}={value}"])  # fmt: skip
    assert f"task-params.{key} must be an integer in {bound}" in err, err
    # refused before the run directory or the synthetic dataset was written
    assert not out.exists() and not data.exists()


def test_1_the_bounds_are_the_documented_ones():
    from fedprivopt.models.stackoverflow_files import (
        MAX_EXAMPLES_PER_USER,
        MAX_MODEL_PARAMETERS,
        MAX_TAGS,
        MAX_USERS,
    )

    assert MAX_USERS == 10**8 and MAX_EXAMPLES_PER_USER == 10**8
    assert vocab.MAX_WORDS == 10**7 and MAX_TAGS == MAX_MODEL_PARAMETERS // 2 == 2**25


# -- finding 2: a word-count file is read within bounded memory --------------------------------


def _word_file(path: Path, words: int) -> Path:
    path.write_text("".join(f"w{i} {words - i}\n" for i in range(words)), encoding="utf-8")
    return path


def test_2_a_limited_read_holds_only_the_kept_words(tmp_path):
    path = _word_file(tmp_path / "stackoverflow.word_count", 200_000)
    tracemalloc.start()
    try:
        top = read_word_counts(path, limit=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert top.items == tuple(f"w{i}" for i in range(10))
    assert peak < 4 * 2**20, peak  # every word held before: about 40 MB for 200,000 words


def test_2_a_limited_read_keeps_the_order_of_an_unsorted_file(tmp_path):
    path = tmp_path / "wc"
    path.write_text("a 1\nb 5\nc 5\nd 9\ne 1\nf 5\n", encoding="utf-8")
    assert read_word_counts(path, limit=3).items == ("d", "b", "c")
    assert read_word_counts(path, limit=4).counts.tolist() == [9, 5, 5, 5]
    assert read_word_counts(path, limit=0).items == ()
    assert read_word_counts(path).items == ("d", "b", "c", "f", "a", "e")
    with pytest.raises(ValueError, match="word 'b' appears twice"):
        (tmp_path / "dup").write_text("a 9\nb 5\nb 4\n", encoding="utf-8")
        read_word_counts(tmp_path / "dup", limit=2)


def test_2_a_word_count_file_of_more_than_max_words_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(vocab, "MAX_WORDS", 5)
    path = _word_file(tmp_path / "wc", 6)
    for limit in (None, 2):
        with pytest.raises(ValueError, match=r"wc:6: more than 5 words, which no word-count"):
            read_word_counts(path, limit=limit)
    assert len(read_word_counts(_word_file(tmp_path / "ok", 5))) == 5


# -- finding 3: a client's rows are read up to what client_metadata declares --------------------


def _example(i: int) -> bytes:
    text = f"word{i} " * 100
    return encode_example(
        StackOverflowExample(text, "title", "python", "2010-01-08", 1, "question")
    )


def _surplus_sqlite(path: Path, declared: int, rows: int) -> Path:
    examples = [("train", "a", _example(i)) for i in range(rows)]
    return write_sqlite(path, examples, [("a", "train", declared)])


def test_3_rows_beyond_the_declared_count_are_not_read(tmp_path):
    split = SQLiteSplit(_surplus_sqlite(tmp_path / "s.sqlite", 3, 20_000), "train")
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"'a' of split 'train' has more than 3 examples, "
                                             r"client_metadata.num_examples says 3"):  # fmt: skip
            split.serialized_examples("a")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak  # the 20,000 rows (15 MB) were read first


def test_3_a_limited_read_reads_the_first_rows(tmp_path):
    split = SQLiteSplit(_surplus_sqlite(tmp_path / "s.sqlite", 5, 5), "train")
    assert split.serialized_examples("a", limit=2) == [_example(0), _example(1)]
    tokens = [e.tokens for e in split.client_examples("a", limit=9)]
    assert tokens == [f"word{i} " * 100 for i in range(5)]
    short = SQLiteSplit(_surplus_sqlite(tmp_path / "t.sqlite", 5, 1), "train")
    with pytest.raises(ValueError, match=r"has 1 examples, client_metadata\.num_examples says 5"):
        short.serialized_examples("a", limit=2)
    with pytest.raises(ValueError, match="limit must be an integer >= 0"):
        split.serialized_examples("a", limit=1.5)


# -- finding 4: an evaluation set the metrics count nothing in is refused --------------------


def _dataset(root: Path, test_tag: str | None) -> Path:
    """Two training users; one test user with no example (``test_tag`` None) or one example."""
    root.mkdir()
    post = StackOverflowExample("a b c", "t", "python", "2010-01-08", 1, "question")
    rows = [("train", u, encode_example(post)) for u in ("u1", "u2")]
    meta = [("u1", "train", 1), ("u2", "train", 1), ("v1", "test", int(test_tag is not None))]
    if test_tag is not None:
        other = StackOverflowExample("zzz", "t", test_tag, "2010-01-08", 1, "question")
        rows.append(("test", "v1", encode_example(other)))
    write_sqlite(root / "stackoverflow.sqlite", rows, meta)
    write_word_counts(root / "stackoverflow.word_count", ["a", "b", "c"], [2, 2, 2])
    write_tag_counts(root / "stackoverflow.tag_count", ["python", "java"], [2, 1])
    return root


@pytest.mark.parametrize(("test_tag", "num_tags"), [(None, 2), ("java", 1)])
def test_4_tag_task_without_anything_to_evaluate_is_refused(tmp_path, test_tag, num_tags):
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    task = StackOverflowTagTask(
        data_dir=_dataset(tmp_path / "d", test_tag), synthetic=False, num_tags=num_tags
    )
    what = f"example with one of the {num_tags} tags"
    with pytest.raises(ValueError, match=rf"^eval_users=200: .* split 'test' .* hold no {what}"):
        task.evaluate(task.build_model())  # was every metric NaN


@pytest.mark.parametrize("test_tag", [None, "python"])  # no example; only words out of vocabulary
def test_4_next_word_task_without_anything_to_evaluate_is_refused(tmp_path, test_tag):
    from fedprivopt.models.next_word import StackOverflowNextWordTask

    task = StackOverflowNextWordTask(
        data_dir=_dataset(tmp_path / "d", test_tag), synthetic=False, hidden_size=8
    )
    with pytest.raises(ValueError, match=r"hold no word in the vocabulary to predict"):
        task.evaluate(task.build_model())


def test_4_the_cli_refuses_it_in_one_line_and_keeps_nothing(tmp_path):
    data, out = _dataset(tmp_path / "d", None), tmp_path / "run"
    sets = [f"task-params.data-dir={data}", "population=2", "clients-per-round=1",
            "task-params.num-users=2"]  # fmt: skip
    argv = ["simulate", str(TP), "--rounds", "1", "--out", str(out)]
    err = _refused(argv + [x for kv in sets for x in ("--set", kv)])
    assert "eval_users=100: the first 100 users of split 'test'" in err, err
    assert not out.exists()


def test_4_a_set_with_something_to_count_is_evaluated(tmp_path):  # control
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    task = StackOverflowTagTask(data_dir=_dataset(tmp_path / "d", "python"), synthetic=False)
    assert task.evaluate(task.build_model())["recall_at_5"] == 1.0


# -- finding 5: an HDF5 client's feature lengths are compared before they are read ------------


def test_5_unequal_hdf5_features_are_refused_before_reading(tmp_path):
    h5py = pytest.importorskip("h5py")
    from fedprivopt.data.hdf5 import HDF5Split, write_hdf5

    n, path = 10**7, tmp_path / "big.h5"
    post = StackOverflowExample("a b", "t", "python", "2010-01-08", 1, "question")
    write_hdf5(path, {"c1": [post]})
    with h5py.File(path, "a") as f:
        del f["examples/c1/score"]
        f["examples/c1"].create_dataset(
            "score", shape=(n,), dtype="i8", chunks=(1 << 20,), compression="gzip", fillvalue=0
        )
        f["pad"] = np.zeros(n * 8 // 1000 + 4096, dtype="u1")  # within the expansion bound
    split = HDF5Split(path)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"'c1' has features of unequal lengths .*'score': "):
            split.client_examples("c1")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        split.close()
    assert peak < 8 * 2**20, peak  # 80 MB of scores were read first


def test_5_a_group_in_place_of_a_feature_is_named(tmp_path):
    h5py = pytest.importorskip("h5py")
    from fedprivopt.data.hdf5 import HDF5Split, write_hdf5

    path = tmp_path / "g.h5"
    post = StackOverflowExample("a b", "t", "python", "2010-01-08", 1, "question")
    write_hdf5(path, {"c1": [post]})
    with h5py.File(path, "a") as f:
        del f["examples/c1/title"]
        f["examples/c1"].create_group("title")
    split = HDF5Split(path)
    with pytest.raises(ValueError, match=r"client 'c1': 'title' is not a dataset"):
        split.client_examples("c1")
    split.close()


# -- finding 6: a decompressed download is bounded by its SQLite header ------------------------


def _decompress_steps(src: Path) -> tuple[str, int]:
    """``decompress_lzma`` in 256-byte steps: its error and the compressed bytes it read."""
    from fedprivopt.data.sqlite_lzma import decompress_lzma

    read: list[int] = []
    with pytest.raises(ValueError) as info:
        decompress_lzma(src, chunk_size=256, index=False, progress=read.append)
    return str(info.value), max(read, default=0)


def test_6_a_stream_that_is_no_database_is_refused_at_its_header(tmp_path):
    src = tmp_path / "zeros.sqlite.xz"
    src.write_bytes(lzma.compress(bytes(64 << 20), format=lzma.FORMAT_XZ))  # 64 MiB of zeros
    message, read = _decompress_steps(src)
    assert read < src.stat().st_size // 2, (read, src.stat().st_size)  # read (and written) whole
    assert "its first 100 bytes: not an SQLite database" in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zeros.sqlite.xz"]


def test_6_a_database_with_more_bytes_than_its_header_declares_is_refused(tmp_path):
    db = _surplus_sqlite(tmp_path / "db.sqlite", 1, 1)
    src = tmp_path / "padded.sqlite.xz"
    src.write_bytes(lzma.compress(db.read_bytes() + bytes(64 << 20), format=lzma.FORMAT_XZ))
    message, read = _decompress_steps(src)
    assert f"more than the {db.stat().st_size:,} bytes its SQLite header declares" in message
    assert read < src.stat().st_size // 2, (read, src.stat().st_size)
    # the database alone decompresses as before
    from fedprivopt.data.sqlite_lzma import open_sqlite

    (tmp_path / "ok.sqlite.xz").write_bytes(lzma.compress(db.read_bytes(), format=lzma.FORMAT_XZ))
    assert list(open_sqlite(tmp_path / "ok.sqlite.xz").client_ids) == ["a"]


# -- finding 7: a token store's meta.json is read bounded and checked as data -------------------


def _store(root: Path):
    from fedprivopt.data.token_cache import open_or_build

    def encode(user: int):
        return [[user, 1], [2]], [[0], [1]]

    return open_or_build(
        root, {"k": 1}, 3, encode, multi_label=True, token_bound=5, label_bound=2, workers=1
    )


def test_7_a_huge_store_meta_is_damage_read_in_bounded_memory(tmp_path):
    from fedprivopt.data.token_cache import EncodedUsers

    meta = _store(tmp_path).directory / "meta.json"
    os.truncate(meta, 64 << 20)  # sparse: `truncate -s`
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as info:
            EncodedUsers(meta.parent)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, peak  # the whole file was read (and decoded) first
    assert "meta.json holds more than 1,048,576 bytes" in str(info.value)
    assert _store(tmp_path).num_users == 3  # rebuilt


@pytest.mark.parametrize("value", [None, [1], {}])
def test_7_a_store_meta_size_of_another_type_is_damage(tmp_path, value):
    from fedprivopt.data.token_cache import EncodedUsers

    meta = _store(tmp_path).directory / "meta.json"
    data = json.loads(meta.read_text(encoding="utf-8"))
    data["num_users"] = value
    meta.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="damaged encoded-user store"):  # was a TypeError
        EncodedUsers(meta.parent)
    assert _store(tmp_path).num_users == 3  # rebuilt


# -- finding 8: the per-user cache is bounded in bytes -----------------------------------------


def _users_dataset(root: Path, users: int) -> Path:
    root.mkdir()
    post = StackOverflowExample("a b c", "t", "python", "2010-01-08", 1, "question")
    rows = [("train", f"u{u}", encode_example(post)) for u in range(users) for _ in range(u + 1)]
    rows.append(("test", "v1", encode_example(post)))
    meta = [(f"u{u}", "train", u + 1) for u in range(users)] + [("v1", "test", 1)]
    write_sqlite(root / "stackoverflow.sqlite", rows, meta)
    write_word_counts(root / "stackoverflow.word_count", ["a", "b", "c"], [2, 2, 2])
    write_tag_counts(root / "stackoverflow.tag_count", ["python", "java"], [2, 1])
    return root


@pytest.mark.parametrize("task_name", ["stackoverflow-nwp", "stackoverflow-tp"])
def test_8_the_user_cache_keeps_at_most_cache_bytes(tmp_path, monkeypatch, task_name):
    from fedprivopt.models import stackoverflow_files
    from fedprivopt.models.registry import build_task

    data = _users_dataset(tmp_path / "d", 6)
    task = build_task(task_name, data_dir=str(data), synthetic=False)
    # what the cache holds: the tag task's users unpadded (thirty-first review of issue 15)
    sizes = []
    for u in range(6):
        task.user_data(u)
        sizes.append(stackoverflow_files._nbytes(task._cache[u]))
    assert len(task._cache) == 6  # control: 2,048 users and 1 GiB hold them all
    task = build_task(task_name, data_dir=str(data), synthetic=False)
    monkeypatch.setattr(stackoverflow_files, "CACHE_BYTES", sizes[4] + sizes[5])
    for u in range(6):
        task.user_data(u)
    assert list(task._cache) == [4, 5] and task._cache_bytes == sizes[4] + sizes[5]
    task.user_data(0)  # user 0 is the smallest: user 4 goes
    assert list(task._cache) == [5, 0] and task._cache_bytes == sizes[5] + sizes[0]
    monkeypatch.setattr(stackoverflow_files, "CACHE_BYTES", 1)
    task.user_data(3)  # the newest is kept, alone, above the bound
    assert list(task._cache) == [3] and task._cache_bytes == sizes[3]


# -- finding 9: the evaluation set is bounded in memory before it is read ----------------------


def _eval_dataset(root: Path) -> Path:
    """Two training users; test users ``t0 .. t5`` with 1 .. 6 examples."""
    root.mkdir()
    post = StackOverflowExample("a b c", "t", "python", "2010-01-08", 1, "question")
    train = [("train", u, encode_example(post)) for u in ("u1", "u2")]
    test = [("test", f"t{u}", encode_example(post)) for u in range(6) for _ in range(u + 1)]
    meta = [("u1", "train", 1), ("u2", "train", 1)] + [(f"t{u}", "test", u + 1) for u in range(6)]
    write_sqlite(root / "stackoverflow.sqlite", train + test, meta)
    write_word_counts(root / "stackoverflow.word_count", ["a", "b", "c"], [2, 2, 2])
    write_tag_counts(root / "stackoverflow.tag_count", ["python", "java"], [2, 1])
    return root


def test_9_evaluation_users_beyond_eval_bytes_are_refused(tmp_path, monkeypatch):
    from fedprivopt.models import stackoverflow_files
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    data = _eval_dataset(tmp_path / "d")
    monkeypatch.setattr(stackoverflow_files, "EVAL_BYTES", 6 * 1024)  # 6 tag examples
    StackOverflowTagTask(data_dir=data, synthetic=False, eval_users=3)  # 1 + 2 + 3: fits
    refused = r"^eval_users=4: the first 4 users of split 'test' hold 10 examples .* \(the first 3"
    with pytest.raises(ValueError, match=refused):
        StackOverflowTagTask(data_dir=data, synthetic=False, eval_users=4)
    capped = {"data_dir": data, "synthetic": False, "max_examples_per_user": 1}
    StackOverflowTagTask(**capped, eval_users=6)  # 6 examples once capped at 1 a user
    monkeypatch.setattr(stackoverflow_files, "EVAL_BYTES", 10 * 64)  # next-word: 64 B at seq 1
    sets = [f"task-params.data-dir={data}", "population=2", "clients-per-round=1",
            "task-params.num-users=2", "task-params.seq-len=1",
            "task-params.eval-users=5"]  # fmt: skip
    argv = ["simulate", str(NWP), "--rounds", "1", "--out", str(tmp_path / "r")]
    err = _refused(argv + [x for kv in sets for x in ("--set", kv)])
    assert "task-params.eval-users=5: the first 5 users of split 'test' hold 15 examples" in err
    assert "(the first 4 users fit)" in err, err
    assert not (tmp_path / "r").exists()


# -- finding 10: the clients of a split are counted before their ids are held ------------------


def test_10_a_split_of_more_than_max_split_clients_is_refused(tmp_path, monkeypatch):
    from fedprivopt.data import sqlite

    data = _users_dataset(tmp_path / "d", 3)
    monkeypatch.setattr(sqlite, "MAX_SPLIT_CLIENTS", 2)
    with pytest.raises(ValueError, match=r"split 'train' lists 3 clients in client_metadata, "
                                         r"more than 2 \(the real"):  # fmt: skip
        SQLiteSplit(data / "stackoverflow.sqlite", "train")
    assert len(SQLiteSplit(data / "stackoverflow.sqlite", "test").client_ids) == 1  # control
    out = tmp_path / "r"
    err = _refused(["simulate", str(TP), "--rounds", "1", "--out", str(out),
                    "--set", f"task-params.data-dir={data}"])  # fmt: skip
    assert "stackoverflow.sqlite: split 'train' lists 3 clients" in err and not out.exists()
