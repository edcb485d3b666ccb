import numpy as np
import pytest
from so_fixtures import DATA

from fedprivopt.data.sqlite import SQLiteSplit
from fedprivopt.data.summary import (
    SplitSummary,
    format_summary,
    summarize_counts,
    summarize_split,
    summarize_sqlite,
)


def test_summary_from_client_metadata(tff_sqlite):
    rows = summarize_sqlite(tff_sqlite)
    assert [r.split for r in rows] == ["train", "heldout", "test"]
    train = rows[0]
    assert train == SplitSummary("train", 3, 10, 1, 2.0, 6.0, 7, 10 / 3)  # counts 2, 1, 7
    assert rows[1] == SplitSummary("heldout", 1, 1, 1, 1.0, 1.0, 1, 1.0)
    table = format_summary(rows)
    lines = table.splitlines()
    assert lines[0].split() == [
        "split",
        "clients",
        "examples",
        "min",
        "median",
        "p90",
        "max",
        "mean",
    ]
    assert lines[1].split() == ["train", "3", "10", "1", "2.0", "6.0", "7", "3.3"]
    assert lines[-1].split() == ["total", "6", "13"]


def test_summary_matches_reader_counts(tff_sqlite_indexed):
    sp = SQLiteSplit(tff_sqlite_indexed, "test")
    assert summarize_split(sp) == summarize_sqlite(tff_sqlite_indexed)[2]
    assert summarize_split(sp).num_examples == sum(len(v) for v in DATA["test"].values())


def test_summary_statistics_and_order():
    counts = np.arange(1, 101)
    (s,) = summarize_counts({"train": counts})
    assert (s.min, s.median, s.max, s.mean) == (1, 50.5, 100, 50.5)
    assert s.p90 == pytest.approx(90.1)
    rows = summarize_counts({"zzz": [1], "test": [2], "train": []})
    assert [r.split for r in rows] == ["train", "test", "zzz"]
    assert rows[0] == SplitSummary("train", 0, 0, 0, 0.0, 0.0, 0, 0.0)
    with pytest.raises(ValueError, match="must be >= 0"):
        SplitSummary.from_counts("x", [-1])


def test_summary_of_a_large_metadata_table_is_cheap(tmp_path, tiny_synthetic):
    rows = summarize_sqlite(tiny_synthetic.sqlite)
    assert sum(r.num_clients for r in rows) > 300 and rows[0].max > rows[0].median


def test_summary_of_bad_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        summarize_sqlite(tmp_path / "missing.sqlite")
