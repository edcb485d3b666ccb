"""Issue 15, forty-sixth review: the lead's findings, from rows the reviewers left open.

1. The follow-up's open row (outputs): the readers of data and runs given a URL,
   ``read_word_counts('https://e.org/x')``, ``read_tag_counts``, ``open_split``,
   ``SQLiteSplit``, ``read_example_counts``, ``create_client_index``, ``HDF5Split``,
   ``decompress_lzma``, ``load_runs`` (the documented ``write_report(out, load_runs(D))``) and
   ``load_run``. Before: ``https:/e.org/x: no such file`` (one slash: a path nobody typed), and a
   local ``./https:/e.org/x`` was read, where the commands (``load_config``, ``--out``, the
   tasks' ``data_dir``) refuse a URL. Now each refuses it with the same line, naming its
   parameter (``core.files.refuse_url``), before touching the file system.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.data.hdf5 import HDF5Split
from fedprivopt.data.loader import open_split
from fedprivopt.data.sqlite import SQLiteSplit, create_client_index, read_example_counts
from fedprivopt.data.sqlite_lzma import decompress_lzma
from fedprivopt.data.vocab import read_tag_counts, read_word_counts
from fedprivopt.simulation.rundata import load_run, load_runs

READERS = [
    (read_word_counts, "path"),
    (read_tag_counts, "path"),
    (open_split, "path"),
    (SQLiteSplit, "path"),
    (read_example_counts, "path"),
    (create_client_index, "path"),
    (HDF5Split, "path"),
    (decompress_lzma, "path"),
    (load_runs, "root"),
    (load_run, "path"),
]


@pytest.mark.parametrize(("reader", "name"), READERS, ids=[r.__name__ for r, _ in READERS])
def test_1_a_url_given_to_a_reader_is_refused_as_a_url(reader, name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "https:" / "e.org" / "x"  # what Path('https://e.org/x') names here
    local.parent.mkdir(parents=True)
    local.write_text("word 1\n")
    with pytest.raises(ValueError, match=rf"^{name} 'https://e.org/x' is a URL \(https://\)"):
        reader("https://e.org/x")
    with pytest.raises(ValueError, match=rf"^{name} 's3:/b/x' is a URL \(s3://\), not a path"):
        reader(Path("s3://b/x"))
    assert local.read_text() == "word 1\n"
