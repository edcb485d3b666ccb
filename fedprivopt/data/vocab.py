"""The StackOverflow vocabulary files: ``stackoverflow.word_count`` and ``stackoverflow.tag_count``.

* ``stackoverflow.word_count``: one ``word count`` line per word, by descending count.
* ``stackoverflow.tag_count``: a JSON object ``{tag: count}``.

In the TFF release a count is the number of distinct **training users** with at least one
example containing the word (in ``tokens``) or the tag, not a number of occurrences. The
readers return a :class:`Vocabulary` sorted by descending count (ties keep file order), so
``vocab.top(10_000)`` is the usual model vocabulary and ``vocab.top(500)`` the tag set.

References
----------
.. [1] TensorFlow Federated, ``tff.simulation.datasets.stackoverflow.load_word_counts`` and
   ``load_tag_counts``.
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import re
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedprivopt.core.checks import check_int
from fedprivopt.core.files import read_at_most, refuse_url
from fedprivopt.core.text import shown

__all__ = [
    "MAX_KEPT_CHARS",
    "MAX_LINE",
    "MAX_WORDS",
    "TAG_COUNT_FILE",
    "TAG_FILE_LIMIT",
    "WORD_COUNT_FILE",
    "Vocabulary",
    "read_tag_counts",
    "read_word_counts",
    "write_tag_counts",
    "write_word_counts",
]

WORD_COUNT_FILE = "stackoverflow.word_count"
TAG_COUNT_FILE = "stackoverflow.tag_count"
_COUNT = re.compile(r"-?[0-9]+\Z")  # ASCII digits: str.isdigit() also accepts '²', int() not
_MAX_COUNT = 2**63 - 1  # counts are stored as int64
MAX_LINE = 1 << 20
"""Characters of a word-count line at most (``word count``: no word is a MiB long)."""
MAX_WORDS = 10_000_000
"""Words of a word-count file at most (the real one holds a few million; the synthetic generator
writes at most as many). Twenty-ninth review of issue 15: a file of 10**7 words took 1.97 GB to
read whole and 10**8 grew until the kernel killed the run; a task now reads only the words it
keeps (``limit``), and a longer file is refused as it is read."""
MAX_KEPT_CHARS = 1 << 28
"""Characters of the kept words (or tags) together at most (256 Mi; the real 10,000 most
frequent words hold about 70,000). Thirtieth review of issue 15 (data, finding 5): lines of up
to :data:`MAX_LINE` characters, one a MiB, made 600 kept words hold 644 MB (a sparse 10 GB
word-count file, 2.5 MB of disk, would have taken ~10 GB at the default 10,000 words)."""
TAG_FILE_LIMIT = 256 << 20
"""Bytes of a tag-count file at most (the real one's 50,000 tags take about 1 MB)."""


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """Items (words or tags) with their counts, by descending count.

    Attributes
    ----------
    items : tuple of str
        The items, most frequent first.
    counts : numpy.ndarray
        ``int64`` counts aligned with ``items`` (non-increasing).
    """

    items: tuple[str, ...]
    counts: np.ndarray

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts, dtype=np.int64).reshape(-1)
        if len(counts) != len(self.items):
            raise ValueError(f"counts has {len(counts)} entries for {len(self.items)} items")
        if len(set(self.items)) != len(self.items):
            raise ValueError("items must be distinct")
        if np.any(counts < 0):
            raise ValueError("counts must be non-negative")
        order = np.argsort(-counts, kind="stable")
        if np.any(order != np.arange(len(counts))):
            object.__setattr__(self, "items", tuple(self.items[i] for i in order))
            counts = counts[order]
        counts.setflags(write=False)
        object.__setattr__(self, "counts", counts)

    def __len__(self) -> int:
        return len(self.items)

    def top(self, k: int) -> Vocabulary:
        """Return the ``k`` most frequent items (all of them if there are fewer).

        ``k`` is an integer ``>= 0`` (twenty-fifth review of issue 15, finding 10: ``True`` was
        taken as 1, and 1.5, NaN, ``"5"`` and ``None`` raised ``TypeError``s naming nothing).
        """
        k = check_int("k", k, 0)
        return Vocabulary(self.items[:k], self.counts[:k])

    def index(self) -> dict[str, int]:
        """Return item to position, e.g. for bag-of-words features."""
        return {item: i for i, item in enumerate(self.items)}

    def as_dict(self) -> dict[str, int]:
        """Return item to count, in descending order of count."""
        return dict(zip(self.items, self.counts.tolist(), strict=True))


def _existing(path: str | os.PathLike) -> Path:
    refuse_url("path", path)  # forty-sixth review of issue 15 (follow-up outputs, open)
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{p}: is a directory, expected a vocabulary file")
    if not p.is_file():
        if p.exists():  # forty-fourth review of issue 15 (input 2): a FIFO was "no such file"
            raise ValueError(
                f"{p}: not a regular file (a FIFO, device or socket); a vocabulary file is a "
                "regular file"
            )
        raise FileNotFoundError(f"{p}: no such file")
    return p


def read_word_counts(path: str | os.PathLike, *, limit: int | None = None) -> Vocabulary:
    """Read a ``stackoverflow.word_count`` file.

    Parameters
    ----------
    path : str or os.PathLike
        The file: lines ``word count``, at most :data:`MAX_WORDS`; blank lines are ignored.
    limit : int, optional
        Keep only the ``limit`` most frequent words (ties in file order). Every line is still
        checked, but only the kept words are held in memory, and a repeated word is found when
        one of its lines is among them; without ``limit`` every word is kept and checked.

    Returns
    -------
    Vocabulary
        Words by descending count.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If it is not a regular file (a FIFO, a device); on a malformed line (with its
        number), a count outside ``[0, 2**63)``, a repeated word
        or more than :data:`MAX_WORDS` words.
    """
    limit = check_int("limit", limit, 0, none=True)
    p = _existing(path)
    try:
        # a leading byte-order mark (an editor's "UTF-8 with BOM") is no part of the first
        # word (thirty-first review of issue 15, data: the most frequent word was read as
        # "\ufeffthe", which no example holds, so it was silently out of the vocabulary)
        # bytes that are not UTF-8 are kept as surrogates and named with their line by
        # _word_lines (forty-sixth review of issue 15, input 2)
        with p.open(encoding="utf-8-sig", errors="surrogateescape") as f:
            return _keep_top(
                _word_lines(p, f),
                limit,
                lambda word, lineno: f"{p}:{lineno}: word {word!r} appears twice",
                lambda lineno: f"{p}:{lineno}",
            )
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not a UTF-8 text file: {exc}") from exc


#: What a file saved as UTF-16 starts with: its byte-order mark, as a ``surrogateescape``
#: decoding gives it (little- or big-endian).
_UTF16_MARKS = ("\udcff\udcfe", "\udcfe\udcff")
_ESCAPED = re.compile("[\udc80-\udcff]")


def _not_utf8(p: Path, where: str, byte: int, utf16: bool) -> ValueError:
    """The error of a vocabulary file whose byte ``byte`` at ``where`` is not UTF-8.

    Forty-sixth review of issue 15 (input 2): a ``stackoverflow.word_count`` saved in Latin-1
    (a ``café`` on line 2,001) was refused as ``'utf-8' codec can't decode byte 0xe9 in position
    7791``, an offset in neither the file (15,983) nor the line, where every other error of the
    reader names its line; one saved as UTF-16 (Windows' "Unicode") as ``... byte 0xff in
    position 0``, no cause; a tag-count file alike. The presets say both so since the
    forty-third review (input 3).
    """
    if utf16:
        cause = "it starts with a UTF-16 byte-order mark (the file is UTF-16)"
    else:
        cause = (
            f"{where}: byte 0x{byte:02x} is not UTF-8 (the file was saved in another encoding, "
            "e.g. Latin-1 or Windows-1252)"
        )
    return ValueError(f"{p}: not a UTF-8 text file: {cause}; save it as plain UTF-8")


def _keep_top(
    entries: Iterable[tuple[int, str, int]], limit: int | None, repeated, where
) -> Vocabulary:
    """The ``limit`` (all if None) highest-count items of ``(position, item, count)`` entries.

    Ties keep the earlier position; only the kept items are held, so a repeated item is found
    (``ValueError(repeated(item, position))``) when one of its entries is among them. Kept
    items of more than :data:`MAX_KEPT_CHARS` characters together are refused, the message led
    by ``where(position)``.
    """

    def too_long(position: int) -> str:
        return (
            f"{where(position)}: the kept items hold more than {MAX_KEPT_CHARS:,} characters, "
            "which no vocabulary file's do (the file is damaged)"
        )

    items: list[str] = []  # the kept items, with their counts and positions
    counts, lines = array("q"), array("q")
    kept: set[str] = set()
    heap: list[tuple[int, int, int]] | None = None  # (count, -position, slot): heap[0] goes next
    chars = 0  # of the kept items, at most MAX_KEPT_CHARS
    for lineno, word, count in entries:
        if word in kept:
            raise ValueError(repeated(word, lineno))
        if limit is None or len(items) < limit:
            items.append(word)
            counts.append(count)
            lines.append(lineno)
        elif limit == 0:
            continue
        else:  # full: an entry replaces the least kept item if it ranks above it
            if heap is None:
                pairs = enumerate(zip(counts, lines, strict=True))
                heap = [(c, -n, i) for i, (c, n) in pairs]
                heapq.heapify(heap)
            if (count, -lineno) <= heap[0][:2]:
                continue
            slot = heapq.heapreplace(heap, (count, -lineno, heap[0][2]))[2]
            kept.discard(items[slot])
            chars -= len(items[slot])
            items[slot], counts[slot], lines[slot] = word, count, lineno
        kept.add(word)
        chars += len(word)
        if chars > MAX_KEPT_CHARS:
            raise ValueError(too_long(lineno))
    del kept
    sizes = np.frombuffer(counts, dtype=np.int64) if counts else np.zeros(0, dtype=np.int64)
    if heap is None and bool(np.all(sizes[:-1] >= sizes[1:])):  # in file order: sorted
        return Vocabulary(tuple(items), sizes.copy())
    order = sorted(range(len(items)), key=lambda i: (-counts[i], lines[i]))
    return Vocabulary(
        tuple(items[i] for i in order), np.asarray([counts[i] for i in order], dtype=np.int64)
    )


def _word_lines(p: Path, f) -> Iterator[tuple[int, str, int]]:
    """``(line number, word, count)`` of each non-blank line of the open word-count file."""
    words = 0
    # lines of at most MAX_LINE characters: a sparse file of 20 GB without a line break was read
    # as one line, MemoryError (eighteenth review of issue 15, finding 7)
    for lineno, line in enumerate(iter(lambda: f.readline(MAX_LINE + 1), ""), 1):
        if len(line) > MAX_LINE:
            raise ValueError(
                f"{p}:{lineno}: a line of more than {MAX_LINE:,} characters, which no "
                "word-count file holds (the file is damaged)"
            )
        escaped = _ESCAPED.search(line)
        if escaped is not None:
            utf16 = lineno == 1 and line.startswith(_UTF16_MARKS)
            where = f"line {lineno:,}, column {escaped.start() + 1:,}"
            raise _not_utf8(p, where, ord(escaped[0]) - 0xDC00, utf16)
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or not _COUNT.match(parts[1]):
            raise ValueError(f"{p}:{lineno}: expected 'word count', found {line.strip()[:80]!r}")
        # 25 digits at most (thirtieth review of issue 15, data finding 6: 5,000 digits raised
        # Python's "Exceeds the limit (4300 digits)" naming no file)
        count = int(parts[1]) if len(parts[1]) <= 25 else int(parts[1][0] + "9" * 25)
        shown_count = parts[1] if len(parts[1]) <= 40 else parts[1][:40] + "..."
        if count < 0:
            raise ValueError(f"{p}:{lineno}: negative count {shown_count}")
        if count > _MAX_COUNT:
            raise ValueError(f"{p}:{lineno}: count {shown_count} does not fit in int64")
        words += 1
        if words > MAX_WORDS:
            raise ValueError(
                f"{p}:{lineno}: more than {MAX_WORDS:,} words, which no word-count file holds "
                "(the real one holds a few million; the file is damaged or not a word count)"
            )
        yield lineno, parts[0], count


def read_tag_counts(path: str | os.PathLike, *, limit: int | None = None) -> Vocabulary:
    """Read a ``stackoverflow.tag_count`` file (a JSON object tag to count).

    Parameters
    ----------
    path : str or os.PathLike
        The file.
    limit : int, optional
        Keep only the ``limit`` most frequent tags.

    Returns
    -------
    Vocabulary
        Tags by descending count (ties in file order).

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If it is not a regular file (a FIFO, a device), or not a JSON object of integer
        counts in ``[0, 2**63)`` with distinct tags.
    """
    limit = check_int("limit", limit, 0, none=True)
    p = _existing(path)
    raw = read_at_most(p, TAG_FILE_LIMIT)  # finding 7, as for word counts
    if raw is None:
        raise ValueError(
            f"{p}: more than {TAG_FILE_LIMIT:,} bytes, which no tag-count file holds (the file "
            "is damaged)"
        )
    try:
        text = raw.decode("utf-8-sig")  # a leading byte-order mark, as for word counts
    except UnicodeDecodeError as exc:  # input 2, as for word counts
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        where = f"line {line:,}, column {column:,}"
        utf16 = raw.startswith((b"\xff\xfe", b"\xfe\xff"))
        raise _not_utf8(p, where, raw[exc.start], utf16) from None
    try:
        del raw
        return _keep_top(
            _tag_entries(p, text),
            limit,
            lambda tag, _: f"{p}: tag {tag!r} appears twice",
            lambda _: str(p),
        )
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{p}: not a JSON tag-count file: {exc}") from exc


_WS = re.compile(r"[ \t\n\r]*")
_DIGITS = frozenset("-0123456789")
_KINDS = {"[": "list", '"': "str", "t": "bool", "f": "bool", "n": "NoneType"}


def _tag_entries(p: Path, text: str) -> Iterator[tuple[int, str, int]]:
    """``(position, tag, count)`` of each pair of the JSON object ``text``, as it is parsed.

    Thirtieth review of issue 15 (data, finding 1): ``json.loads`` of a tag-count file held
    every tag and its pair at once, about 17 bytes of memory a byte of file (a 151 MB file took
    2.3 GB; one at the 256 MiB limit about 4.4 GB); the pairs are now read one at a time and
    only the kept tags held.
    """
    decoder = json.JSONDecoder()
    pos = _WS.match(text, 0).end()
    if text[pos : pos + 1] != "{":
        found = _KINDS.get(text[pos : pos + 1], "number" if text[pos : pos + 1] in _DIGITS else "")
        if not found:
            raise json.JSONDecodeError("Expecting value", text, pos)
        raise ValueError(f"{p}: expected a JSON object tag -> count, found {found}")
    pos = _WS.match(text, pos + 1).end()
    if text[pos : pos + 1] == "}":
        pos += 1
    else:
        for n in itertools.count(1):
            if text[pos : pos + 1] != '"':
                raise json.JSONDecodeError(
                    "Expecting property name enclosed in double quotes", text, pos
                )
            tag, pos = json.decoder.scanstring(text, pos + 1)
            if not tag or "|" in tag:
                # thirty-first review of issue 15 (data): an example's tags are "|"-separated,
                # so a tag "" was carried by every example without tags and "a|b" by none
                raise ValueError(
                    f"{p}: tag {shown(tag)} is empty or holds '|', which separates an "
                    "example's tags: no tag-count file holds one (the file is damaged)"
                )
            pos = _WS.match(text, pos).end()
            if text[pos : pos + 1] != ":":
                raise json.JSONDecodeError("Expecting ':' delimiter", text, pos)
            start = _WS.match(text, pos + 1).end()
            try:
                count, pos = decoder.raw_decode(text, start)
            except json.JSONDecodeError:
                raise
            except ValueError:  # finding 6: an integer of over 4,300 digits (Python's limit)
                count = text[start : start + 40] + "..."
            bad = isinstance(count, bool) or not isinstance(count, int)
            if bad or not 0 <= count <= _MAX_COUNT:
                raise ValueError(
                    f"{p}: tag {tag!r} has count {count!r}, expected an integer in [0, 2**63)"
                )
            yield n, tag, count
            pos = _WS.match(text, pos).end()
            if text[pos : pos + 1] == "}":
                pos += 1
                break
            if text[pos : pos + 1] != ",":
                raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)
            pos = _WS.match(text, pos + 1).end()
    if _WS.match(text, pos).end() != len(text):
        raise json.JSONDecodeError("Extra data", text, pos)


def _pairs(items: Iterable[str], counts: Iterable[int]) -> Vocabulary:
    return Vocabulary(tuple(items), np.asarray(list(counts), dtype=np.int64))


def write_word_counts(path: str | os.PathLike, words: Iterable[str], counts: Iterable[int]) -> Path:
    """Write a ``stackoverflow.word_count`` file (sorted by descending count)."""
    vocab = _pairs(words, counts)
    for w in vocab.items:
        if not w or len(w.split()) != 1 or w.strip() != w:
            raise ValueError(f"word {w!r} must be non-empty without whitespace")
    p = Path(path)
    with p.open("w", encoding="utf-8") as f:
        f.writelines(f"{w} {c}\n" for w, c in zip(vocab.items, vocab.counts.tolist(), strict=True))
    return p


def write_tag_counts(path: str | os.PathLike, tags: Iterable[str], counts: Iterable[int]) -> Path:
    """Write a ``stackoverflow.tag_count`` JSON file (sorted by descending count)."""
    vocab = _pairs(tags, counts)
    for t in vocab.items:
        if not t or "|" in t:
            raise ValueError(f"tag {t!r} must be non-empty without '|'")
    p = Path(path)
    p.write_text(json.dumps(vocab.as_dict()), encoding="utf-8")
    return p
