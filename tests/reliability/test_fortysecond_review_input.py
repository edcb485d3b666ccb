"""Issue 15, forty-second hostile review (input: bad settings and data files): tests.

1. ``cp other.sqlite D/stackoverflow.sqlite`` (a copy writes into the same file, where ``data
   synth --overwrite`` renames a new one into place) while a run of a StackOverflow task read
   ``D``: the task's open training split went on reading the other file's pages under the old
   client ids: ``unreadable SQLite database: database disk image is malformed`` (rc 2, a damaged
   file where it was a replaced one), or the other dataset's users silently where the pages fit,
   until the next evaluation reopened the file. Now a ``stat`` before each read of a user, and
   the full check of the thirty-fifth review when it changed
   (``StackOverflowFiles._check_file_unchanged``): ``the dataset changed while the task used
   it``; a file touched or replaced by an equal copy still reads.
"""

from __future__ import annotations

import os
import shutil

import pytest

from fedprivopt.data import SyntheticConfig, generate
from fedprivopt.models.tag_prediction import StackOverflowTagTask


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Two tiny synthetic datasets of the same sizes and other seeds (``a``, ``b``)."""
    root = tmp_path_factory.mktemp("review42-input")
    for name, seed in (("a", 0), ("b", 1)):
        config = SyntheticConfig.tiny(num_clients=30, vocab_size=200, num_tags=10, seed=seed)
        generate(root / name, config, workers=1)
    return root


def _tag_task(d):
    return StackOverflowTagTask(
        data_dir=d, synthetic=False, vocab_size=50, num_tags=5, num_users=10, eval_users=5
    )


# -- finding 1: a dataset copied over the file a task reads -------------------------------------


@pytest.mark.parametrize("how", ["copy over", "copy over, time kept"])
def test_1_a_copy_over_the_file_stops_the_next_read(tmp_path, datasets, how):
    d = tmp_path / "d"
    shutil.copytree(datasets / "a", d)
    task = _tag_task(d)
    task.user_data(0)
    sqlite = d / "stackoverflow.sqlite"
    (shutil.copy2 if "kept" in how else shutil.copyfile)(datasets / "b" / sqlite.name, sqlite)
    with pytest.raises(ValueError, match=r"stackoverflow\.sqlite: the dataset changed while "):
        task.user_data(5)


def test_1_a_touched_or_equal_file_still_reads(tmp_path, datasets):
    d = tmp_path / "d"
    shutil.copytree(datasets / "a", d)
    task = _tag_task(d)
    x = task.user_data(0)[0]
    sqlite = d / "stackoverflow.sqlite"
    os.utime(sqlite)  # touched
    task.user_data(1)
    shutil.copyfile(datasets / "a" / sqlite.name, sqlite)  # the same bytes written over it
    task._cache.clear()
    assert task.user_data(0)[0].equal(x)
