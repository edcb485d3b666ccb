"""Issue 15, thirty-first hostile review (data layer and tasks): regression tests of its findings.

1. ``simulate … --set task-params.cache-dir=K`` without ``task-params.token-cache = true`` (the
   default): rc 0, ``K`` silently unused (the thirtieth review noted it and left it). As every
   setting that applies only with another one (``tree-restart-rounds``, the adaptive-clipping
   and distributed-noise keys), it is now refused before anything is read or written: rc 2,
   ``config: task-params.cache-dir applies only with token_cache = true (it is where the token
   store is written) …``;
   a run whose ``config.toml`` holds it is refused on ``--resume`` naming that file.
2. The root of the file system as a directory the data layer writes into: ``task-params.cache-dir
   = "/"`` (also ``"/tmp/.."`` or a link to ``/``) with the token store on wrote the store's
   directory and its lock file into ``/`` (rc 0, as root); ``data synth --out /`` wrote the
   dataset's four files and its lock there (rc 0); a task's synthetic generation with
   ``data-dir = "/"`` would too. All three are now refused with one line
   (``… '/' is the root of the file system, which holds the system's directories: choose a
   directory of its own``; ``data.locks.refuse_filesystem_root``, also in
   ``token_cache.open_or_build``).
3. A vocabulary file saved by an editor as "UTF-8 with BOM": a ``stackoverflow.word_count``
   was read with the byte-order mark in its first word (``'\\ufeffthe'``, which no example
   holds), so the most frequent word was silently out of the vocabulary (rc 0); a
   ``stackoverflow.tag_count`` was refused as ``not a JSON tag-count file: Expecting value:
   line 1 column 1 (char 0)``. A leading byte-order mark is now skipped in both, as the
   configuration loader skips it.
4. A ``stackoverflow.tag_count`` holding the tag ``""``: every example without tags (the TFF
   answers, whose tags are empty) was labelled with it, since an example's tags are split on
   ``"|"`` and ``"".split("|") == [""]`` (a class that is no tag, trained and evaluated, rc 0);
   a tag holding ``"|"`` (``"a|b"``) was a class no example can carry. Both are refused naming
   the file and the tag; ``write_tag_counts`` refuses to write them.
5. The tag task's user read padded every example to the user's longest before anything else:
   the cohort trainer's ragged read (``user_csr``, the fast engine's default) was cut from that
   ``n x L`` tensor. A user of 2,000 examples, one of them 400,000 words (an 800 kB example,
   within the 1 MiB ``MAX_EXAMPLE_BYTES``), took 6.4 GB and 49 s for one user (under a 4 GB
   address-space limit: a ``MemoryError`` traceback, rc 1); 20,000 such examples would take
   64 GB. The user cache now holds users ragged (as read), the cohort trainer never pads
   (335 MB for that run, rc 0), and ``user_data`` (the sequential trainer, ``vectorize =
   false``, the Flower client) pads from them and refuses a user whose padded tensors exceed
   ``USER_PAD_BYTES`` = 1 GiB with one line naming the file, the client and the sizes.
6. A token store built beforehand (``docs/SCALING.md``: "build the store once with a run on one
   machine before using the cluster") on a share mounted read-only, or in a read-only data
   directory: refused, rc 2, ``K/<digest>.lock: Read-only file system``, since the store was
   opened only under its lock file, which cannot be created there. A store is renamed into
   place whole, so a valid one of the key is now opened without the lock (rc 0); only a build
   takes it (checked again under it).
7. ``HDF5Split.client_examples`` (``data.open_split`` of a legacy ``stackoverflow_*.h5``, Python
   API) of a client whose ``score`` dataset is ``uint64`` with ``2**64 - 1``: the score was read
   as ``-1`` (``astype(int64)`` wraps). A score beyond int64 (a ``tf.Example`` score's type) is
   now refused naming the file and the client.
8. The tag task's evaluation set was bounded only by a count of examples (``EVAL_BYTES`` at
   0.6-1 kB an example, checked when the task is built), while a tag example is not cut to a
   length and may hold up to 1 MiB: 300 test examples of 200,000 words (a 114 MB file) took
   1.66 GB and 14.5 s, 600 of them 3.1 GB and 32 s (2,000 about 11 GB). The words are now
   counted as the users are read, and the set refused once they pass ``EVAL_BYTES`` (at 24
   bytes a word, measured): one line naming ``task-params.eval-users`` and the split, 1.4 GB
   for the 600 (the one user's examples are read whole first), at the first evaluation.
9. ``fedprivopt data info stackoverflow.sqlite.lzma`` (the file TFF publishes) said ``not an
   SQLite database (bad or missing header)``, and ``data info DIR`` of a directory holding only
   it ``holds no stackoverflow.sqlite``. Both now say it is the compressed download and how to
   decompress it once (``fedprivopt.data.decompress_lzma``, or ``xz -dk``).
10. ``simulate … --set task-params.token-cache=true --set task-params.cache-dir=C/runs/CELL/k``
    (a cache directory inside another run, a comparison's cell, or a comparison): rc 0, the
    token store written there, after which ``compare C … --overwrite`` refused that cell
    (``holds files that are not part of a fedprivopt run (cache)``). As a dataset is not
    generated into one (``synthetic.run_files_note``), it is now refused with one line.
11. ``task-params.data-dir`` (with ``synthetic = true``) or, with finding 10's check,
    ``cache-dir`` through a symbolic-link loop: a ``RuntimeError: Symlink loop`` traceback,
    rc 1 (``Path.resolve`` in ``synthetic.run_files_around``). Now ``os.path.realpath``, and
    the directory's creation names the loop: rc 2, one line, nothing kept.
12. ``data synth --out D --overwrite`` where ``D/.fedprivopt-cache`` is a link to a cache
    directory that several datasets share: every store there was removed, the other datasets'
    too, and reported as ``removed 2 token store(s) of the replaced files``. Only the stores
    whose key names the replaced ``stackoverflow.sqlite`` (its size and modification time,
    ``token_cache.file_key``) are removed now.
13. Ctrl-C of ``data synth --out D --overwrite --seed 9 --clients 60000`` (after the parser was
    built): rc 130, and ``D`` kept the previous dataset's files (seed 0, 300 clients) under a
    marker rewritten as ``{"complete": false}`` without a configuration (between the SQLite
    file's rename and the vocabularies' writes: the new SQLite file beside the old
    vocabularies). A task then used the files whatever its ``synth_*`` parameters (rc 0),
    although the generator's comment says such a directory "is never taken as current". A
    data directory whose marker is ours and incomplete is now refused with one line saying
    the generation was interrupted and how to redo it.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from fedprivopt.cli import main
from fedprivopt.core.text import shown
from fedprivopt.data.vocab import read_tag_counts, read_word_counts, write_tag_counts

_TP = """strategy = "dp-fedavg"
engine = "fast"
task = "stackoverflow-tp"
population = 20
clients-per-round = 4
num-server-rounds = 1
noise-multiplier = 1.0
clip-norm = 1.0
delta = 0.01
batch-size = 8
max-examples = 8

[task-params]
data-dir = {data!r}
synthetic = false
vocab-size = 100
num-tags = 5
num-users = 20
eval-users = 5
"""


@pytest.fixture(scope="module")
def tp_preset(tmp_path_factory):
    """A 30-user synthetic dataset and a one-round tag-task preset on it."""
    root = tmp_path_factory.mktemp("review31-data")
    synth = ["data", "synth", "--out", str(root / "d"), "--clients", "30", "--vocab", "200"]
    assert main([*synth, "--tags", "10", "--workers", "1"]) == 0
    preset = root / "tp.toml"
    preset.write_text(_TP.format(data=str(root / "d")))
    return preset


def _usage_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.splitlines()[0]


def _tag_task(data_dir, **kw):
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    return StackOverflowTagTask(
        data_dir=data_dir, synthetic=False, vocab_size=100, num_tags=5, num_users=20,
        eval_users=5, **kw,
    )  # fmt: skip


# -- 1. cache-dir without the token store -----------------------------------------------------


def test_1_cache_dir_without_token_cache_is_refused_before_anything_is_written(
    tmp_path, capsys, tp_preset
):
    out, cache = tmp_path / "run", tmp_path / "cache"
    argv = ["simulate", str(tp_preset), "--out", str(out), "--quiet"]
    line = _usage_line(capsys, [*argv, "--set", f"task-params.cache-dir={cache}"])
    assert "error: config: task-params.cache-dir applies only with " in line, line
    assert re.search("with (task-params.)?token[-_]cache = true", line)
    # the path as messages show a value: its middle is cut past SHOWN_CHARS, which pytest's
    # base directory (it grows with the run count) reached in a fresh clone's full run
    assert shown(str(cache)) in line
    assert not out.exists() and not cache.exists()
    # with the store on, the same directory holds it (control)
    sets = ["--set", f"task-params.cache-dir={cache}", "--set", "task-params.token-cache=true"]
    assert main([*argv, *sets]) == 0
    assert any(cache.glob("*/meta.json"))


def test_1_the_task_refuses_it_and_keeps_the_default(tp_preset):
    data = tp_preset.parent / "d"
    with pytest.raises(ValueError, match=r"^cache_dir applies only with token_cache = true"):
        _tag_task(data, cache_dir=str(data.parent / "elsewhere"))
    assert _tag_task(data).cache_dir == data / ".fedprivopt-cache"  # the default, unused
    assert _tag_task(data, cache_dir=str(data / ".fedprivopt-cache")).token_cache is False


def test_1_a_run_config_holding_it_names_the_file_on_resume(tmp_path, capsys, tp_preset):
    out = tmp_path / "run"
    assert main(["simulate", str(tp_preset), "--out", str(out), "--quiet"]) == 0
    config = out / "config.toml"
    text = config.read_text().replace("num-server-rounds = 1", "num-server-rounds = 2")
    config.write_text(text.replace("[task-params]\n", '[task-params]\ncache_dir = "/x"\n'))
    line = _usage_line(capsys, ["simulate", "--resume", str(out), "--quiet"])
    assert f"{config}: task-params.cache-dir applies only with " in line, line


# -- 2. the root of the file system -----------------------------------------------------------


@pytest.mark.parametrize("root", ["/", "/tmp/..", "//", "link"])
def test_2_a_token_store_in_the_filesystem_root_is_refused(tp_preset, tmp_path, root):
    if root == "link":
        (tmp_path / "link").symlink_to("/")
        root = str(tmp_path / "link")
    data = tp_preset.parent / "d"
    with pytest.raises(ValueError, match=r"^cache_dir .* is the root of the file system"):
        _tag_task(data, token_cache=True, cache_dir=root)  # before: built into "/" on first use


def test_2_data_synth_into_the_filesystem_root_is_refused(capsys):
    # --vocab 5 is refused too: before the fix that was the line, and nothing was written
    line = _usage_line(capsys, ["data", "synth", "--out", "/", "--clients", "5", "--vocab", "5"])
    assert "error: argument --out: '/' is the root of the file system" in line, line
    assert "choose a directory of its own" in line


def test_2_a_task_does_not_generate_its_dataset_into_the_root(monkeypatch):
    import fedprivopt.models.stackoverflow_datadir as datadir
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    def generated(*args, **kwargs):  # before the fix the files were generated into "/"
        raise AssertionError("synthetic files generated into the root of the file system")

    monkeypatch.setattr(datadir, "ensure_synthetic", generated)
    monkeypatch.setattr(datadir, "_directory_lock", generated)  # before: "/.stackoverflow.lock"
    with pytest.raises(ValueError, match=r"^data_dir '/' is the root of the file system"):
        StackOverflowTagTask(data_dir="/", synthetic=True, synth_clients=30, num_users=20)


def test_2_the_shared_check_refuses_the_root_only():
    from fedprivopt.data.locks import refuse_filesystem_root

    with pytest.raises(ValueError, match="is the root of the file system"):
        refuse_filesystem_root("/", "root")
    refuse_filesystem_root("/tmp", "root")  # a directory under it is the user's choice


# -- 3. a byte-order mark ---------------------------------------------------------------------


def test_3_a_word_count_file_with_a_bom_keeps_its_first_word(tmp_path):
    path = tmp_path / "stackoverflow.word_count"
    path.write_bytes(b"\xef\xbb\xbfthe 9\r\nto 5\r\n")  # Notepad's "UTF-8 with BOM", CRLF
    assert read_word_counts(path).items == ("the", "to")  # before: ('\ufeffthe', 'to')
    assert read_word_counts(path, limit=1).items == ("the",)


def test_3_a_tag_count_file_with_a_bom_is_read(tmp_path):
    path = tmp_path / "stackoverflow.tag_count"
    path.write_bytes(b'\xef\xbb\xbf{"python": 3, "java": 2}')
    assert read_tag_counts(path).items == ("python", "java")  # before: "Expecting value"


def test_3_a_task_on_bom_files_has_the_same_vocabulary(tp_preset, tmp_path):
    data = tp_preset.parent / "d"
    copy = tmp_path / "d"
    copy.mkdir()
    for name in ("stackoverflow.sqlite", "stackoverflow.word_count", "stackoverflow.tag_count"):
        body = (data / name).read_bytes()
        (copy / name).write_bytes(body if name.endswith("sqlite") else b"\xef\xbb\xbf" + body)
    plain, bom = _tag_task(data), _tag_task(copy)
    assert bom.words == plain.words and bom.tags == plain.tags


# -- 4. an empty tag, or one holding the separator --------------------------------------------


@pytest.mark.parametrize("tag", ["", "a|b", "|"])
def test_4_a_tag_no_example_can_carry_is_refused(tmp_path, tag):
    path = tmp_path / "stackoverflow.tag_count"
    path.write_text(json.dumps({"python": 5, tag: 3}))
    with pytest.raises(ValueError, match=r"is empty or holds '\|'") as info:
        read_tag_counts(path)
    assert str(path) in str(info.value)
    with pytest.raises(ValueError, match=r"must be non-empty without '\|'"):
        write_tag_counts(tmp_path / "out", ["python", tag], [5, 3])


def test_4_the_empty_tag_no_longer_labels_untagged_examples(tp_preset, tmp_path):
    from fedprivopt.models.tag_prediction_encoding import encode_texts

    data = tp_preset.parent / "d"
    copy = tmp_path / "d"
    copy.mkdir()
    for name in ("stackoverflow.sqlite", "stackoverflow.word_count"):
        os.link(data / name, copy / name)
    tags = read_tag_counts(data / "stackoverflow.tag_count")
    (copy / "stackoverflow.tag_count").write_text(json.dumps({"": 10**9, **tags.as_dict()}))
    # what it did: an answer (no tags) was labelled with the "" class
    assert encode_texts([("w", "", "")], {"w": 0}, {"": 0}, single_label=True)[1] == [0]
    with pytest.raises(ValueError, match=r"stackoverflow\.tag_count: tag '' is empty"):
        _tag_task(copy)


# -- 5. a user padded to its longest example --------------------------------------------------


def _long_post_user(root, examples: int, words: int):
    """A training user ``u0`` of ``examples`` examples, the first of ``words`` words."""
    from fedprivopt.data.sqlite import write_sqlite
    from fedprivopt.data.stackoverflow import StackOverflowExample, encode_example
    from fedprivopt.data.vocab import write_word_counts

    def post(text: str) -> bytes:
        return encode_example(StackOverflowExample(text, "t", "python", "2010", 1, "question"))

    root.mkdir()
    rows = [("train", "u0", post("a " * words))] + [("train", "u0", post("b"))] * (examples - 1)
    rows += [("train", "u1", post("c")), ("test", "v1", post("a b"))]
    meta = [("u0", "train", examples), ("u1", "train", 1), ("v1", "test", 1)]
    write_sqlite(root / "stackoverflow.sqlite", rows, meta)
    write_word_counts(root / "stackoverflow.word_count", ["a", "b", "c"], [3, 2, 1])
    write_tag_counts(root / "stackoverflow.tag_count", ["python", "java"], [2, 1])
    return root


def test_5_the_cohort_trainers_read_of_a_user_is_not_padded(tmp_path):
    import tracemalloc

    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    data = _long_post_user(tmp_path / "d", 200, 40_000)
    task = StackOverflowTagTask(data_dir=data, synthetic=False, vocab_size=3, num_tags=2)
    tracemalloc.start()
    try:
        csr = task.user_csr(0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert csr.lengths.tolist() == [40_001] + [2] * 199 and csr.tokens.numel() == 40_399  # titles
    # before: padded first, 200 x 40,001 int64 (64 MB); the measure at 2,000 examples and
    # 400,000 words was 6.4 GB and 49 s, now 0.5 s
    assert peak < 16 * 2**20, peak


def test_5_the_padded_read_is_bounded_and_unchanged(tmp_path, monkeypatch, capsys, tp_preset):
    from fedprivopt.models import tag_prediction_data
    from fedprivopt.models.tag_prediction import StackOverflowTagTask
    from fedprivopt.models.tag_prediction_encoding import example_tensors

    for single in (False, True):  # control: the same tensors as the lists padded
        task = _tag_task(tp_preset.parent / "d", single_label=single)
        for user in (0, 7):
            lists = task._read_train_user(task.client_ids[user])
            want = example_tensors(*lists, task.num_features, task.num_tags, single)
            got = task.user_data(user)
            assert all(a.equal(b) for a, b in zip(got, want, strict=True))
    data = _long_post_user(tmp_path / "d", 200, 4_000)
    monkeypatch.setattr(tag_prediction_data, "USER_PAD_BYTES", 2**20)
    task = StackOverflowTagTask(data_dir=data, synthetic=False, vocab_size=3, num_tags=2)
    with pytest.raises(ValueError, match=r"stackoverflow\.sqlite: training user 'u0': 200 exa"):
        task.user_data(0)  # 200 x 4,001 x 8 bytes = 6.1 MiB
    assert task.user_data(1)[0].shape == (1, 2)  # "c" and the title
    preset = tmp_path / "p.toml"
    preset.write_text(
        tp_preset.read_text()
        .replace(str(tp_preset.parent / "d"), str(data))
        .replace("population = 20", "population = 2")
        .replace("clients-per-round = 4", "clients-per-round = 2")
        .replace("vocab-size = 100\nnum-tags = 5\nnum-users = 20\neval-users = 5", "vocab-size = 3")
    )
    argv = ["simulate", str(preset), "--out", str(tmp_path / "r"), "--quiet"]
    line = _usage_line(capsys, [*argv, "--set", "vectorize=false"])
    assert "training user 'u0': 200 examples padded to the longest one (4,001 words)" in line
    assert main(argv) == 0  # the cohort trainer reads it unpadded


# -- 6. a built token store on a read-only file system ----------------------------------------


def test_6_a_built_store_is_read_without_its_lock(tmp_path, monkeypatch):
    import errno

    from fedprivopt.data import token_cache

    def encode(user):
        return [[user, 1], [2]], [[0], [1]]

    args = dict(multi_label=True, token_bound=10, label_bound=5, workers=1)
    built = token_cache.open_or_build(tmp_path, {"k": 1}, 3, encode, **args)

    def read_only(path):  # what a read-only share (or export) answers to the lock's open
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(token_cache, "file_lock", read_only)
    store = token_cache.open_or_build(tmp_path, {"k": 1}, 3, encode, **args)  # before: EROFS
    assert store.directory == built.directory and store.user(2)[0].tolist() == [2, 1, 2]
    with pytest.raises(OSError, match="Read-only file system"):  # a store to build needs it
        token_cache.open_or_build(tmp_path, {"k": 2}, 3, encode, **args)


# -- 7. an HDF5 score beyond int64 ------------------------------------------------------------


def test_7_a_uint64_hdf5_score_beyond_int64_is_refused_not_wrapped(tmp_path):
    h5py = pytest.importorskip("h5py")
    import numpy as np

    from fedprivopt.data.hdf5 import HDF5Split

    path = tmp_path / "stackoverflow_train.h5"
    with h5py.File(path, "w") as f:
        for cid, score in (("c1", 2**64 - 1), ("c2", 2**63 - 1)):
            client = f.create_group(f"examples/{cid}")
            for name in ("creation_date", "tags", "title", "tokens", "type"):
                client.create_dataset(name, data=[b"a"], dtype=h5py.string_dtype())
            client.create_dataset("score", data=np.array([score], dtype=np.uint64))
    split = HDF5Split(path)
    with pytest.raises(ValueError, match=r"client 'c1': a 'score' does not fit in int64"):
        split.client_examples("c1")  # before: score -1
    assert split.client_examples("c2")[0].score == 2**63 - 1


# -- 8. the tag task's evaluation set, bounded by its words -----------------------------------


def test_8_evaluation_words_beyond_eval_bytes_are_refused_as_they_are_read(tmp_path, monkeypatch):
    from fedprivopt.data.sqlite import write_sqlite
    from fedprivopt.data.stackoverflow import StackOverflowExample, encode_example
    from fedprivopt.data.vocab import write_word_counts
    from fedprivopt.models import tag_prediction_data
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    def post(words: int) -> bytes:
        return encode_example(StackOverflowExample("a " * words, "", "python", "", 1, "question"))

    root = tmp_path / "d"
    root.mkdir()
    rows = [("train", "u0", post(1)), ("test", "v0", post(1))]
    rows += [("test", "v1", post(50_000)), ("test", "v2", post(1))]
    meta = [("u0", "train", 1), ("v0", "test", 1), ("v1", "test", 1), ("v2", "test", 1)]
    write_sqlite(root / "stackoverflow.sqlite", rows, meta)
    write_word_counts(root / "stackoverflow.word_count", ["a"], [1])
    write_tag_counts(root / "stackoverflow.tag_count", ["python"], [1])
    # 3 test examples pass the count built into the task (0.6-1 kB an example), but one holds
    # 50,000 words (about 1.2 MB in memory)
    monkeypatch.setattr(tag_prediction_data, "EVAL_BYTES", 2**20)
    task = StackOverflowTagTask(data_dir=root, synthetic=False, vocab_size=1, num_tags=1)
    with pytest.raises(ValueError, match=r"^eval_users=200: the examples of the first 2 users "):
        task.eval_batches()  # before: built whole
    few = StackOverflowTagTask(data_dir=root, synthetic=False, vocab_size=1, eval_users=1)
    assert few.eval_batches()[0][0].shape == (1, 1)  # control


# -- 9. data info of TFF's compressed download ------------------------------------------------


def test_9_data_info_of_the_compressed_download_says_so(tmp_path, capsys, tp_preset):
    import lzma

    down = tmp_path / "dl" / "stackoverflow.sqlite.lzma"
    down.parent.mkdir()
    sqlite = (tp_preset.parent / "d" / "stackoverflow.sqlite").read_bytes()
    down.write_bytes(lzma.compress(sqlite))
    for path in (down, down.parent):  # the file, and a directory holding only it
        line = _usage_line(capsys, ["data", "info", str(path)])
        assert f"argument PATH: {down} is compressed (TFF's download)" in line, line
        assert "decompress_lzma" in line  # before: "not an SQLite database (bad or missing
        # header)", and "directory ... holds no stackoverflow.sqlite"
    assert main(["data", "info", str(tp_preset.parent / "d")]) == 0  # control


# -- 10. a token store inside another run -----------------------------------------------------


@pytest.mark.parametrize("inside", ["cell/cache", "cell", "cmp/runs"])
def test_10_a_token_store_inside_a_run_or_comparison_is_refused(tp_preset, tmp_path, inside):
    (tmp_path / "cell").mkdir()
    (tmp_path / "cell" / "privacy_ledger.jsonl").write_text("")  # a run (a comparison's cell)
    (tmp_path / "cmp").mkdir()
    (tmp_path / "cmp" / "compare.lock").write_text("")
    cache = tmp_path / inside
    with pytest.raises(ValueError, match=r"^cache_dir .* it is a fedprivopt run, comparison or"):
        _tag_task(tp_preset.parent / "d", token_cache=True, cache_dir=str(cache))
    assert not (tmp_path / "cell" / "cache").exists()


def test_10_the_comparison_keeps_its_overwrite(tmp_path, capsys, tp_preset):
    cmp = tmp_path / "cmp"
    argv = ["compare", str(tp_preset), "--strategies", "dp-fedavg", "--out", str(cmp), "--quiet"]
    assert main(argv) == 0
    (cell,) = (cmp / "runs").iterdir()
    other = ["simulate", str(tp_preset), "--out", str(tmp_path / "r"), "--quiet"]
    sets = ["--set", "task-params.token-cache=true", "--set", f"task-params.cache-dir={cell}/k"]
    line = _usage_line(capsys, [*other, *sets])  # before: rc 0, the store written in the cell
    assert "task-params.cache-dir" in line and f"is inside {cell}, which holds" in line, line
    assert main([*argv, "--overwrite", "--rounds", "2"]) == 0  # before: refused (foreign files)


# -- 11. a data or cache directory through a symbolic-link loop --------------------------------


@pytest.mark.parametrize("key", ["data-dir", "cache-dir"])
def test_11_a_link_loop_is_one_line(tmp_path, capsys, tp_preset, key):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    argv = ["simulate", str(tp_preset), "--out", str(tmp_path / "r"), "--quiet"]
    sets = ["--set", f"task-params.{key}={tmp_path / 'a' / 'x'}"]
    sets += ["--set", "task-params.synthetic=true", "--set", "task-params.token-cache=true"]
    line = _usage_line(capsys, [*argv, *sets])  # before: RuntimeError (Symlink loop), rc 1
    assert "Too many levels of symbolic links" in line and str(tmp_path / "a") in line, line
    assert not (tmp_path / "r").exists()


# -- 12. data synth --overwrite and a cache directory other datasets share --------------------


def test_12_overwrite_removes_only_the_stores_of_the_replaced_file(tmp_path, capsys):
    from fedprivopt.data.token_cache import file_key, open_or_build

    data, shared = tmp_path / "d", tmp_path / "shared"
    synth = ["data", "synth", "--out", str(data), "--clients", "8", "--vocab", "200", "--tags"]
    assert main([*synth, "5", "--workers", "1"]) == 0
    shared.mkdir()
    (data / ".fedprivopt-cache").symlink_to(shared)  # one cache directory for every dataset

    def store(file: dict):
        return open_or_build(
            shared, {"file": file}, 1, lambda u: ([[1]], [[0]]), multi_label=True,
            token_bound=5, label_bound=2, workers=1,
        ).directory  # fmt: skip

    ours = store(file_key(data / "stackoverflow.sqlite"))
    other = store({"size": 1, "mtime_ns": 2})  # another dataset's store
    capsys.readouterr()
    assert main([*synth, "5", "--workers", "1", "--overwrite", "--seed", "1"]) == 0
    assert "removed 1 token store(s) of the replaced files" in capsys.readouterr().out
    assert not ours.exists() and (other / "meta.json").is_file()  # before: both removed


# -- 13. a dataset whose generation was interrupted -------------------------------------------


def test_13_an_interrupted_generation_is_not_used(tmp_path, capsys, tp_preset):
    import shutil

    data = tmp_path / "d"
    shutil.copytree(tp_preset.parent / "d", data)
    # what an interrupted `data synth --out d --overwrite --seed 9 --clients 60000` leaves: the
    # previous dataset's files (or the new SQLite file beside them) and a marker without config
    marker = data / "stackoverflow.synthetic.json"
    marker.write_text('{"generator": "fedprivopt.data.synthetic", "complete": false}\n')
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    with pytest.raises(ValueError, match=r'says "complete": false\), so its files may belong'):
        StackOverflowTagTask(data_dir=data, synth_clients=60_000, synth_seed=9)  # before: used
    preset = tmp_path / "p.toml"
    preset.write_text(tp_preset.read_text().replace(str(tp_preset.parent / "d"), str(data)))
    line = _usage_line(capsys, ["simulate", str(preset), "--out", str(tmp_path / "r")])
    assert "the generation of its synthetic dataset was interrupted" in line, line
    assert not (tmp_path / "r").exists()
    argv = ["data", "synth", "--out", str(data), "--clients", "30", "--vocab", "200"]
    assert main([*argv, "--tags", "10", "--workers", "1", "--overwrite"]) == 0
    assert main(["simulate", str(preset), "--out", str(tmp_path / "r"), "--quiet"]) == 0
