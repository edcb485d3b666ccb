import json

import numpy as np
import pytest

from fedprivopt.data.vocab import (
    Vocabulary,
    read_tag_counts,
    read_word_counts,
    write_tag_counts,
    write_word_counts,
)


def test_word_count_file(tmp_path):
    path = tmp_path / "stackoverflow.word_count"
    path.write_text("the 342000\n. 341000\n\nto 300000\nof 300000\npython 1200\n")
    vocab = read_word_counts(path)
    assert vocab.items == ("the", ".", "to", "of", "python")
    assert vocab.counts.tolist() == [342000, 341000, 300000, 300000, 1200]
    assert len(vocab) == 5 and vocab.index()["of"] == 3
    top = read_word_counts(path, limit=3)
    assert top.items == ("the", ".", "to")
    assert vocab.top(10).items == vocab.items and vocab.top(0).items == ()
    with pytest.raises(ValueError, match="k must be an integer >= 0"):
        vocab.top(-1)


def test_unsorted_file_is_sorted_stably(tmp_path):
    path = tmp_path / "wc"
    path.write_text("b 1\na 5\nc 1\nd 5\n")
    vocab = read_word_counts(path)
    assert vocab.items == ("a", "d", "b", "c")
    assert read_word_counts(path, limit=1).items == ("a",)
    assert not vocab.counts.flags.writeable


@pytest.mark.parametrize(
    "text, match",
    [
        ("the 10\nbad line here\n", r"wc:2: expected 'word count'"),
        ("the ten\n", r"wc:1: expected 'word count'"),
        ("the -3\n", r"wc:1: negative count -3"),
        ("the 3\nthe 2\n", r"wc:2: word 'the' appears twice"),
    ],
)
def test_malformed_word_count(tmp_path, text, match):
    path = tmp_path / "wc"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_word_counts(path)


def test_missing_and_binary_vocab_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nothing\.word_count"):
        read_word_counts(tmp_path / "nothing.word_count")
    with pytest.raises(FileNotFoundError, match=r"nothing\.tag_count"):
        read_tag_counts(tmp_path / "nothing.tag_count")
    with pytest.raises(ValueError, match="is a directory"):
        read_word_counts(tmp_path)
    binary = tmp_path / "bin"
    binary.write_bytes(b"\xff\xfe\x00 1\n")
    with pytest.raises(ValueError, match="not a UTF-8 text file"):
        read_word_counts(binary)
    with pytest.raises(ValueError, match="limit must be"):
        read_word_counts(binary, limit=-1)


def test_tag_count_file(tmp_path):
    path = tmp_path / "stackoverflow.tag_count"
    path.write_text(json.dumps({"css": 50, "javascript": 120, "python": 120, "c++": 7}))
    tags = read_tag_counts(path)
    assert tags.items == ("javascript", "python", "css", "c++")
    assert tags.as_dict() == {"javascript": 120, "python": 120, "css": 50, "c++": 7}
    assert read_tag_counts(path, limit=2).items == ("javascript", "python")


@pytest.mark.parametrize(
    "text, match",
    [
        ("{not json", "not a JSON tag-count file"),
        ("[1, 2]", "expected a JSON object"),
        ('{"a": "3"}', r"tag 'a' has count '3'"),
        ('{"a": true}', r"tag 'a' has count True"),
        ('{"a": -1}', r"tag 'a' has count -1"),
        ('{"a": 1.5}', r"tag 'a' has count 1.5"),
    ],
)
def test_malformed_tag_count(tmp_path, text, match):
    path = tmp_path / "tc"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_tag_counts(path)


def test_writers_round_trip(tmp_path):
    words, counts = ["rare", "common", "mid"], [1, 100, 10]
    wc = write_word_counts(tmp_path / "wc", words, counts)
    assert wc.read_text() == "common 100\nmid 10\nrare 1\n"
    assert read_word_counts(wc).items == ("common", "mid", "rare")
    tc = write_tag_counts(tmp_path / "tc", ["a", "b"], [1, 2])
    assert json.loads(tc.read_text()) == {"b": 2, "a": 1}
    assert list(json.loads(tc.read_text())) == ["b", "a"]
    with pytest.raises(ValueError, match="without whitespace"):
        write_word_counts(tmp_path / "x", ["two words"], [1])


def test_vocabulary_validation():
    with pytest.raises(ValueError, match="counts has 1 entries for 2 items"):
        Vocabulary(("a", "b"), np.array([1]))
    with pytest.raises(ValueError, match="distinct"):
        Vocabulary(("a", "a"), np.array([1, 1]))
    with pytest.raises(ValueError, match="non-negative"):
        Vocabulary(("a",), np.array([-1]))
