"""Issue 15, thirty-fifth hostile review (data layer): regression tests of its findings.

1. A task's synthetic dataset of few tags, ``simulate stackoverflow-tp-mini.toml --set
   task-params.synth-tags=2`` (or 1): rc 2, ``config: invalid synth_* parameters:
   tags_per_client must be a finite number in [1, 2], got 3.0``, a knob no task parameter
   sets (the ninth review's N8 fixed it for ``data synth --tags 1`` only). And every refusal of
   the generator's knobs named them as the generator does: ``--set task-params.synth-tags=5000``
   read ``invalid synth_* parameters: vocab_size must be an integer >= 100000 (2 x
   num_tags=5000 x 10 informative words a tag), got 4000``, where ``vocab_size`` is the
   generator's name for ``synth-vocab`` but reads as the task's own ``vocab-size`` (the model's
   vocabulary, another key). Now a task sets ``tags_per_client`` as ``data synth`` does
   (``synthetic.tag_knobs``: each user has at most ``synth-tags`` favourites; the marker is
   the same), and the refusal names the task's keys (``synthetic.config_error``, shared with
   ``data synth``): ``config: task-params.synth-vocab must be an integer >= 100000 (2 x
   task-params.synth-tags=5000 x 10 …), got 4000``.
2. ``decompress_lzma(D/"stackoverflow.sqlite.lzma")`` (what ``data info`` advises for TFF's
   download; ``open_split`` of the ``.lzma`` alike) returned any existing
   ``D/stackoverflow.sqlite`` as its decompression: in a directory that already held a
   synthetic dataset the synthetic file was returned as the real data (silently, as the
   decompression of an older download after a new one replaced it, or another download's in a
   shared ``cache_dir``). The decompression now keeps the download's modification time, as
   ``xz -dk`` does, and an existing file is reused only when its time is the download's
   (to the nanosecond, or within 2 s where a file system keeps whole seconds); another raises
   ``FileExistsError`` naming both (``overwrite=True`` or another ``cache_dir``).
3. ``data info D`` of a file whose ``client_metadata`` names a split ``'te\\x1b[31mst\\ntrain
   999 …'`` (a terminal escape and a line break; a name of a million characters alike) printed
   it as it was: the terminal's colour changed and the table gained a row of its own (a line of
   a million characters). A split's name is now shown as written only if printable and at most
   80 characters, else quoted and cut (``'te\\x1b[31mst\\ntrain 999'``).
4. ``data synth --out D --overwrite`` (or a copy over ``D/stackoverflow.sqlite``) while a run
   reads ``D``: the task's evaluation set, built at its first evaluation, and the copies of
   the task that Ray actors and shards hold (pickled; they reopen the file) read the new
   dataset's users under the old one's client ids and vocabulary, silently (rc 0), while the
   ledger recorded the old dataset; a replacement between the task's build and the ledger
   made the ledger record the new one. A StackOverflow task now records the file it read
   (its size and the SHA-256 of its first MiB, as the cluster's fingerprint: an equal copy on
   another node is the same) and checks it wherever the file is opened again: the evaluation
   users, the training split of a copy, ``data_identity``, ``private_evaluation_users``; a
   changed file stops the run, rc 2, one line naming it.
5. ``data info STACKOVERFLOW_TRAIN.H5`` (a legacy split saved with an upper-case name) and
   ``data info stackoverflow_train.h5.1`` (a second download, as wget names it): ``not an
   SQLite database (bad or missing header)``, a valid file called another format's; the second
   also ``unrecognized format`` from ``open_split``. A split file is now HDF5 by its suffix in
   any case or by its signature (``data.hdf5.is_hdf5_file``): both summarized, rc 0.
6. Another dataset put into a synthetic data directory beside the generator's marker (the
   real download decompressed into ``data/so``, which held a synthetic dataset:
   ``xz -dkf``, ``mv``, ``cp``): ``data synth --out D --overwrite`` replaced it (rc 0; a
   decompressed real dataset is about 20 GB and hours of work), and a task whose ``synth_*``
   parameters matched the marker used it as that synthetic dataset. A complete marker records
   each split's clients and examples; a ``stackoverflow.sqlite`` whose ``client_metadata``
   holds others is now not the generator's (``synthetic.foreign_sqlite``): ``data synth
   --overwrite`` and ``generate`` refuse to replace it (a link to one is still replaced, its
   target kept, as the sixteenth review made it), and such a task is refused naming the file.
7. ``write_hdf5(path, {"u/1": examples, ...})`` (the documented writer of the legacy layout)
   wrote a group ``u`` holding a group ``1``: rc 0, read back as a client ``u`` without
   features; ``"a\\0b"`` was written as ``a`` (another client's id, maybe); ``""`` and ``"."``
   failed half-way with h5py's ``Unable to synchronously create group``, naming no client,
   and with ``overwrite=True`` the file it was to replace was already emptied. Client ids that
   cannot name a group are now refused before anything is written, naming the id, and the
   file is written beside its path and renamed over it once complete.
8. ``fedprivopt data`` without an ACTION (a script's ``fedprivopt data $ACTION`` with it
   unset) printed its help with rc 0, as if a dataset had been written or checked (the
   thirty-first review noticed it; ``fedprivopt deploy`` says ``choose a target`` with rc 2).
   Now rc 2, one line: ``fedprivopt data: error: choose an action: synth (write a synthetic
   dataset) or info (summarize one), …``; ``fedprivopt data --help`` is unchanged.
"""

from __future__ import annotations

import json
import os

import pytest

from fedprivopt.cli import main

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
synthetic = {synthetic}
vocab-size = 100
num-tags = 5
num-users = 20
eval-users = 5
"""


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """A 30-user synthetic dataset (``d``) and a one-round tag-task preset on it."""
    root = tmp_path_factory.mktemp("review35-data")
    synth = ["data", "synth", "--out", str(root / "d"), "--clients", "30", "--vocab", "200"]
    assert main([*synth, "--tags", "10", "--workers", "1"]) == 0
    (root / "tp.toml").write_text(_TP.format(data=str(root / "d"), synthetic="false"))
    return root


def _usage_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.splitlines()[0]


# -- 1. a task's synth_* knobs -----------------------------------------------------------------


@pytest.mark.parametrize("tags", [1, 2])
def test_1_a_task_generates_a_dataset_of_one_or_two_tags(tmp_path, capsys, tags):
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    task = StackOverflowTagTask(
        data_dir=tmp_path / "d", synthetic=True, synth_clients=30, synth_vocab=40,
        synth_tags=tags, vocab_size=20, num_tags=tags, num_users=10, eval_users=3,
    )  # fmt: skip
    assert task.num_users == 10
    marker = json.loads((tmp_path / "d" / "stackoverflow.synthetic.json").read_text())
    # what data synth --tags records: a task and the command agree on the same directory
    assert marker["config"]["num_tags"] == tags
    assert marker["config"]["tags_per_client"] == float(tags)
    synth = ["data", "synth", "--out", str(tmp_path / "c"), "--clients", "30"]
    assert main([*synth, "--vocab", "40", "--tags", str(tags), "--workers", "1"]) == 0
    capsys.readouterr()
    other = json.loads((tmp_path / "c" / "stackoverflow.synthetic.json").read_text())
    assert other["config"] == marker["config"]


@pytest.mark.parametrize(
    "extra, expected",
    [
        (
            ["--set", "task-params.synth-vocab=30"],
            "config: task-params.synth-vocab must be an integer >= 100000 (2 x "
            "task-params.synth-tags=5000 x 10 informative words a tag), got 30",
        ),
        (
            [],
            "config: task-params.synth-vocab must be an integer >= 100000 (2 x "
            "task-params.synth-tags=5000 x 10 informative words a tag), got 20000 (the default: "
            "set a larger task-params.synth-vocab or fewer task-params.synth-tags)",
        ),
    ],
)
def test_1_a_refused_synth_knob_is_named_as_the_config_writes_it(tmp_path, capsys, extra, expected):
    preset = tmp_path / "tp.toml"
    preset.write_text(_TP.format(data=str(tmp_path / "d"), synthetic="true"))
    argv = ["simulate", str(preset), "--out", str(tmp_path / "r"), "--quiet"]
    line = _usage_line(capsys, [*argv, "--set", "task-params.synth-tags=5000", *extra])
    assert line == f"fedprivopt simulate: error: {expected}", line
    assert not (tmp_path / "r").exists() and not (tmp_path / "d").exists()


def test_1_other_refusals_keep_their_lead(tmp_path):
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    with pytest.raises(ValueError, match=r"^synth_clients must be at most 1000000 .*got 2000000$"):
        StackOverflowTagTask(data_dir=tmp_path / "d", synthetic=True, synth_clients=2_000_000)
    with pytest.raises(ValueError, match=r"^synth_tags must be at most 10000 .*got 20000$"):
        StackOverflowTagTask(data_dir=tmp_path / "d", synthetic=True, synth_tags=20_000)
    assert not (tmp_path / "d").exists()


# -- 2. the decompression of TFF's download ----------------------------------------------------


def test_2_an_existing_other_database_is_not_taken_for_the_download(tmp_path, data_root):
    import lzma

    from fedprivopt.data import SyntheticConfig, decompress_lzma, generate, open_split

    d = tmp_path / "dl"
    generate(d, SyntheticConfig.tiny(num_clients=5, vocab_size=100, num_tags=5), workers=1)
    real = (data_root / "d" / "stackoverflow.sqlite").read_bytes()  # "the download": 30 users
    src = d / "stackoverflow.sqlite.lzma"
    src.write_bytes(lzma.compress(real, format=lzma.FORMAT_ALONE))
    synthetic = (d / "stackoverflow.sqlite").read_bytes()
    for call in (lambda: decompress_lzma(src), lambda: open_split(src, "train")):
        with pytest.raises(FileExistsError, match=r"stackoverflow\.sqlite: exists and is not the "):
            call()
    assert (d / "stackoverflow.sqlite").read_bytes() == synthetic  # untouched
    # its own cache is reused, not rewritten; a newer download is not served the older one's
    out = decompress_lzma(src, cache_dir=tmp_path / "cache", index=False)
    assert out.read_bytes() == real
    stamp = out.stat().st_mtime_ns
    assert decompress_lzma(src, cache_dir=tmp_path / "cache") == out
    assert out.stat().st_mtime_ns == stamp
    assert len(open_split(src, "train", cache_dir=tmp_path / "cache").client_ids) > 5
    later = src.stat().st_mtime_ns + 3600 * 10**9
    os.utime(src, ns=(later, later))
    with pytest.raises(FileExistsError, match="an older download's"):
        decompress_lzma(src, cache_dir=tmp_path / "cache")
    assert decompress_lzma(src, cache_dir=tmp_path / "cache", overwrite=True).read_bytes() == real
    # a cache on a file system that keeps whole seconds is still its own
    out = tmp_path / "cache" / "stackoverflow.sqlite"
    os.utime(out, ns=(later, later - later % 10**9))
    assert decompress_lzma(src, cache_dir=tmp_path / "cache") == out


# -- 3. data info of hostile split names -------------------------------------------------------


def test_3_data_info_shows_a_split_name_it_cannot_print_quoted(tmp_path, capsys, data_root):
    import shutil
    import sqlite3

    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(data_root / "d" / "stackoverflow.sqlite", d)
    conn = sqlite3.connect(d / "stackoverflow.sqlite")
    with conn:
        conn.execute("UPDATE client_metadata SET split_name = ? WHERE split_name = 'test'",
                     ("te\x1b[31mst\ntrain 999",))  # fmt: skip
        conn.execute("UPDATE client_metadata SET split_name = ? WHERE split_name = 'heldout'",
                     ("h" * 1_000_000,))  # fmt: skip
    conn.close()
    assert main(["data", "info", str(d)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "\x1b" not in out and len(lines) == 5, out  # header, 3 splits, total
    assert lines[1].startswith("train ") and lines[-1].startswith("total ")
    assert any(line.startswith("'te\\x1b[31mst\\ntrain 999'  ") for line in lines), out
    assert max(map(len, lines)) < 200


# -- 4. a dataset replaced while a task reads it -----------------------------------------------


def _replaced_under(tmp_path, data_root):
    """A tag task on a copy of the fixture's dataset, a pickled copy of it, and the file."""
    import pickle
    import shutil

    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    d = tmp_path / "d"
    shutil.copytree(data_root / "d", d)
    task = StackOverflowTagTask(
        data_dir=d, synthetic=False, vocab_size=50, num_tags=5, num_users=10, eval_users=5
    )
    return task, pickle.loads(pickle.dumps(task)), d / "stackoverflow.sqlite"


def test_4_a_dataset_replaced_under_a_task_is_refused(tmp_path, capsys, data_root):
    task, copy, sqlite = _replaced_under(tmp_path, data_root)
    before = task.data_identity()
    synth = ["data", "synth", "--out", str(sqlite.parent), "--clients", "40", "--vocab", "200"]
    assert main([*synth, "--tags", "10", "--workers", "1", "--overwrite"]) == 0
    capsys.readouterr()
    for call in (
        task.eval_batches,
        lambda: copy.user_data(1),
        task.data_identity,
        task.private_evaluation_users,
    ):
        with pytest.raises(ValueError, match=r"stackoverflow\.sqlite: the dataset changed while "):
            call()
    assert before["sqlite_bytes"] != sqlite.stat().st_size


def test_4_an_equal_copy_of_the_file_is_the_same_dataset(tmp_path, data_root):
    import shutil

    task, copy, sqlite = _replaced_under(tmp_path, data_root)
    x = task.user_data(1)[0]
    shutil.copy(data_root / "d" / "stackoverflow.sqlite", tmp_path / "copy.sqlite")
    os.replace(tmp_path / "copy.sqlite", sqlite)  # another file (inode, time), equal bytes
    assert copy.user_data(1)[0].equal(x)
    assert task.eval_batches() and task.data_identity()["sqlite_bytes"] == sqlite.stat().st_size


def test_4_a_run_whose_dataset_is_replaced_stops_in_one_line(
    tmp_path, capsys, monkeypatch, data_root
):
    import shutil

    from fedprivopt.data import SyntheticConfig, generate
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    d = tmp_path / "d"
    shutil.copytree(data_root / "d", d)
    preset = tmp_path / "tp.toml"
    preset.write_text(_TP.format(data=str(d), synthetic="false"))
    build = StackOverflowTagTask.eval_batches

    def replaced_first(self):  # data synth --overwrite in another terminal, mid-run
        if self._eval is None:
            config = SyntheticConfig(num_clients=40, vocab_size=200, num_tags=10)
            generate(d, config, overwrite=True, workers=1)
        return build(self)

    monkeypatch.setattr(StackOverflowTagTask, "eval_batches", replaced_first)
    argv = ["simulate", str(preset), "--out", str(tmp_path / "r"), "--quiet"]
    line = _usage_line(capsys, argv)
    assert f"{d}/stackoverflow.sqlite: the dataset changed while the task used it" in line, line


# -- 5. an HDF5 split by any name --------------------------------------------------------------


@pytest.mark.parametrize("name", ["STACKOVERFLOW_TRAIN.H5", "stackoverflow_train.h5.1"])
def test_5_data_info_of_an_hdf5_split_by_another_name(tmp_path, capsys, name):
    pytest.importorskip("h5py")
    from fedprivopt.data import open_split
    from fedprivopt.data.hdf5 import write_hdf5
    from fedprivopt.data.stackoverflow import StackOverflowExample

    example = StackOverflowExample("a b", "t", "x|y", "2010-01-01 00:00:00 UTC", 1, "question")
    path = write_hdf5(tmp_path / name, {"c1": [example] * 2, "c2": [example]})
    assert main(["data", "info", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["train", "2", "3", "1", "1.5", "1.9", "2", "1.5"], lines
    assert len(open_split(path).client_ids) == 2


# -- 6. another dataset beside a synthetic dataset's marker ------------------------------------


def test_6_another_dataset_beside_the_marker_is_neither_replaced_nor_used(
    tmp_path, capsys, data_root
):
    import shutil

    from fedprivopt.data import SyntheticConfig, generate
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    d = tmp_path / "d"
    synth = ["data", "synth", "--out", str(d), "--clients", "12", "--vocab", "200"]
    assert main([*synth, "--tags", "10", "--workers", "1"]) == 0
    shutil.copy(data_root / "d" / "stackoverflow.sqlite", d)  # "the real dataset", 30 users
    real = (d / "stackoverflow.sqlite").read_bytes()
    line = _usage_line(capsys, [*synth, "--tags", "10", "--workers", "1", "--overwrite"])
    assert "stackoverflow.sqlite is not the file its stackoverflow.synthetic.json describes" in (
        line
    ), line
    with pytest.raises(FileExistsError, match="is never replaced"):
        generate(d, SyntheticConfig.tiny(), overwrite=True, workers=1)
    assert (d / "stackoverflow.sqlite").read_bytes() == real
    kw = dict(data_dir=d, vocab_size=50, num_tags=5, num_users=10, eval_users=5)
    with pytest.raises(ValueError, match="so it is not the synthetic dataset the synth_"):
        StackOverflowTagTask(synthetic=True, synth_clients=12, synth_vocab=200, synth_tags=10, **kw)
    assert StackOverflowTagTask(synthetic=False, **kw).num_users == 10  # as it is: allowed


def test_6_the_generators_own_files_are_still_replaced(tmp_path, capsys):
    d = tmp_path / "d"
    synth = ["data", "synth", "--out", str(d), "--clients", "12", "--vocab", "200", "--tags", "5"]
    assert main([*synth, "--workers", "1"]) == 0
    assert main([*synth, "--workers", "1", "--overwrite", "--seed", "3"]) == 0
    assert '"seed": 3' in (d / "stackoverflow.synthetic.json").read_text()


# -- 7. write_hdf5 of client ids that cannot name a group --------------------------------------


@pytest.mark.parametrize("client_id", ["u/1", "a\0b", "", "."])
def test_7_write_hdf5_refuses_an_id_that_is_no_group_and_keeps_the_old_file(tmp_path, client_id):
    pytest.importorskip("h5py")
    from fedprivopt.data.hdf5 import HDF5Split, write_hdf5
    from fedprivopt.data.stackoverflow import StackOverflowExample

    example = StackOverflowExample("a b", "t", "x", "2010-01-01 00:00:00 UTC", 1, "question")
    path = write_hdf5(tmp_path / "s.h5", {"keep": [example]})
    kept = path.read_bytes()
    with pytest.raises(ValueError, match=r"^client id .* cannot name an HDF5 group"):
        write_hdf5(path, {"ok": [example], client_id: [example]}, overwrite=True)
    assert path.read_bytes() == kept and sorted(p.name for p in tmp_path.iterdir()) == ["s.h5"]
    assert list(HDF5Split(path).client_ids) == ["keep"]


# -- 8. fedprivopt data without an action ------------------------------------------------------


def test_8_data_without_an_action_is_a_usage_error(capsys):
    line = _usage_line(capsys, ["data"])
    assert line.startswith("fedprivopt data: error: choose an action: synth (write "), line
    assert capsys.readouterr().out == ""
