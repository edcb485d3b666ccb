"""Issue 15, forty-sixth hostile review (input: bad input and the data readers): tests.

1. ``simulate https://example.org/toy.toml`` (a preset's address pasted where its path
   belongs; also ``s3://b/x.toml``, ``compare``, ``tune``, ``deploy local`` and the Python
   ``load_config``, with a ``str`` or a ``Path``). Before: ``config file
   'https:/example.org/toy.toml' does not exist``, a path not typed, and where
   ``./https:/example.org/toy.toml`` existed that local file was read and run (rc 0), where
   ``--out``, ``--resume`` and the data directories refuse a URL. Now
   ``simulation.config.load_config`` refuses it as they do (``core.files.url_refusal``):
   ``config file 'https://example.org/toy.toml' is a URL (https://), not a path: ...``.
2. A ``stackoverflow.word_count`` saved in Latin-1 (``café`` on line 2,001; read by both
   tasks, ``read_word_counts``) or as UTF-16 (Windows' "Unicode", ``iconv -t utf-16``); a
   ``stackoverflow.tag_count`` alike. Before: ``not a UTF-8 text file: 'utf-8' codec can't
   decode byte 0xe9 in position 7791``, an offset in neither the file (15,983) nor the line,
   where every other error of the reader names its line; UTF-16 as ``... byte 0xff in
   position 0``, no cause. Now ``data.vocab`` names the line, column and byte (``line 2,001,
   column 4: byte 0xe9 is not UTF-8 (the file was saved in another encoding, e.g. Latin-1
   ...)``) or the UTF-16 byte-order mark, and says to save it as plain UTF-8, as the presets'
   reader has said since the forty-third review.
3. ``simulate stackoverflow-tp-mini.toml --set task=toy`` (a preset's task switched on the
   command line, its ``[task-params]`` kept; also ``--set task=stackoverflow-nwp``, an unknown
   ``--set task-params.xx=1``). Before: ``unknown key 'task-params.data-dir': not a parameter
   of the task (task parameters are plain values, not tables)``: a plain value told it is a
   table, and neither the task nor the keys it takes named. Now
   ``cli_task_errors.task_param_error`` names the task and its parameters (``not a parameter
   of task 'toy' (its parameters: dim, examples-per-user, ...)``); the table remark stays for
   a dotted key (``--set 'task-params.dim={a=1}'`` reaches the task as ``dim.a``).
4. ``decompress_lzma(D/"stackoverflow.sqlite.lzma")`` (also ``open_split`` of it, and
   ``overwrite=True``) where ``D/stackoverflow.sqlite`` is a directory (a ``mkdir`` slip).
   Before: ``FileExistsError: ... exists and is not the decompression of ... (its modification
   time is not the download's ...) ... pass overwrite=True to replace it``; with
   ``overwrite=True`` the whole download was decompressed, then ``IsADirectoryError: [Errno
   21] Is a directory: '...partial' -> '...'``. Now ``data.sqlite_lzma.decompress_lzma``
   refuses it before reading a byte (``is a directory, where decompress_lzma writes the
   decompressed database (overwrite replaces a file, never a directory) ...``); a dangling
   link there is named as one (``a symbolic link to nothing``), not by its time.
5. ``data synth --out D --overwrite`` (``data.generate(D, config, overwrite=True)``) of a
   synthetic dataset one of whose files (``stackoverflow.word_count``) is now a directory.
   Before: the new ``stackoverflow.sqlite`` was written over the old one, then ``argument
   --out: D/stackoverflow.word_count: Is a directory``, rc 2: the old dataset gone, the new
   one half made under a marker saying ``"complete": false``. Now ``data.synthetic.generate``
   refuses before its marker or a byte of data is written (``is a directory, where the
   dataset's stackoverflow.word_count is written; a directory is never replaced ...``).
6. ``write_sqlite(path, ...)`` and ``write_hdf5(path, ...)`` (the documented writers) where
   ``path`` is a directory, with and without ``overwrite=True``. Before: ``exists (pass
   overwrite=True to replace it)``; with it every example was written, then ``IsADirectoryError:
   [Errno 21] Is a directory: '....partial' -> '...'`` (input 4's case in the writers). Now
   both refuse it first: ``is a directory, where write_sqlite writes its file (overwrite
   replaces a file, never a directory) ...``; the directory untouched.
"""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.data import SyntheticConfig, decompress_lzma, generate, write_hdf5, write_sqlite
from fedprivopt.data.loader import open_split
from fedprivopt.data.vocab import read_tag_counts, read_word_counts
from fedprivopt.simulation.config import load_config

PRESETS = Path(__file__).resolve().parents[2] / "simulations"
TOY = PRESETS / "toy.toml"


def test_1_a_preset_named_by_a_url_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"'s3:/b/x.toml' is a URL \(s3://\)"):
        load_config(Path("s3://b/x.toml"))  # Path writes s3:/b/x.toml, no such directory here
    local = tmp_path / "https:" / "example.org"
    local.mkdir(parents=True)
    shutil.copy(TOY, local / "toy.toml")  # what the text would name as a relative path
    with pytest.raises(ValueError, match=r"is a URL \(https://\), not a path"):
        load_config("https://example.org/toy.toml")
    # the local directory named as a path is read
    assert load_config(Path("https:") / "example.org" / "toy.toml").task_params["num_users"] == 40


def test_2_a_vocabulary_file_in_another_encoding_names_its_line(tmp_path):
    lines = [f"w{i} {5000 - i}".encode() for i in range(3000)]
    lines[2000] = "caf\u00e9 3000".encode("latin-1")
    words = tmp_path / "stackoverflow.word_count"
    words.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(ValueError, match=r"line 2,001, column 4: byte 0xe9 is not UTF-8"):
        read_word_counts(words, limit=10)
    tags = tmp_path / "stackoverflow.tag_count"
    tags.write_bytes('{"a": 2,\n "caf\u00e9": 1}'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"line 2, column 6: byte 0xe9 is not UTF-8"):
        read_tag_counts(tags)
    for path, text in ((words, "the 5\nof 4\n"), (tags, '{"a": 1}')):
        path.write_text(text, encoding="utf-16")
        with pytest.raises(ValueError, match=r"starts with a UTF-16 byte-order mark"):
            (read_word_counts if path == words else read_tag_counts)(path)
        path.write_text(text, encoding="utf-8")
        assert len((read_word_counts if path == words else read_tag_counts)(path)) >= 1


def test_3_a_key_of_another_task_names_the_task_and_its_parameters(tmp_path, capsys):
    mini = str(PRESETS / "stackoverflow-tp-mini.toml")
    args = ["simulate", mini, "--set", "task=toy", "--rounds", "1", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "unknown key 'task-params.data-dir': not a parameter of task 'toy'" in err
    assert "(its parameters: dim, examples-per-user," in err and "not tables" not in err
    table = ["simulate", str(TOY), "--set", "task-params.dim={a=1}", "--out", str(tmp_path / "s")]
    assert main(table) == 2
    err = capsys.readouterr().err
    assert "'task-params.dim.a': not a parameter of task 'toy' (its parameters: dim," in err
    assert err.endswith("test-examples; they are plain values, not tables)\n")
    assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()


def test_4_a_directory_where_the_decompression_goes_is_refused_first(tmp_path):
    download = tmp_path / "stackoverflow.sqlite.lzma"
    download.write_bytes(lzma.compress(b"not read"))
    (tmp_path / "stackoverflow.sqlite").mkdir()
    for overwrite in (False, True):
        with pytest.raises(ValueError, match=r"stackoverflow.sqlite: is a directory, where"):
            decompress_lzma(download, overwrite=overwrite)
    with pytest.raises(ValueError, match=r"never a directory\): move it"):
        open_split(download)
    assert [p.name for p in (tmp_path / "stackoverflow.sqlite").iterdir()] == []
    (tmp_path / "stackoverflow.sqlite").rmdir()
    (tmp_path / "stackoverflow.sqlite").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError, match=r"\(a symbolic link to nothing \("):
        decompress_lzma(download)


def test_5_a_directory_among_a_synthetic_datasets_files_is_refused_first(tmp_path):
    small = {"num_clients": 30, "vocab_size": 200, "num_tags": 5}
    files = generate(tmp_path / "d", SyntheticConfig(**small), workers=1)
    files.word_count.unlink()
    files.word_count.mkdir()
    before = files.sqlite.read_bytes(), files.meta.read_bytes()
    with pytest.raises(FileExistsError, match=r"word_count: is a directory, where the dataset"):
        generate(tmp_path / "d", SyntheticConfig(**small, seed=3), overwrite=True, workers=1)
    assert (files.sqlite.read_bytes(), files.meta.read_bytes()) == before


@pytest.mark.parametrize("writer", ["write_sqlite", "write_hdf5"])
def test_6_the_writers_refuse_a_directory_first(tmp_path, writer):
    target = tmp_path / "x"
    target.mkdir()
    (target / "keep").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(ValueError, match=rf"x: is a directory, where {writer} writes its"):
            if writer == "write_sqlite":
                write_sqlite(target, iter([]), [], overwrite=overwrite)
            else:
                write_hdf5(target, {}, overwrite=overwrite)
    assert [p.name for p in target.iterdir()] == ["keep"]
