"""Dataset summaries (the ``fedprivopt data info`` command): users and examples per split.

For an SQLite file everything comes from ``client_metadata`` (:func:`summarize_sqlite`), so the
full StackOverflow file is summarized in about a second with a few MB of memory; any other
:class:`~fedprivopt.data.stackoverflow.ClientSplit` is summarized from its per-client counts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from fedprivopt.core.text import SHOWN_CHARS, shown
from fedprivopt.data.sqlite import read_example_counts
from fedprivopt.data.stackoverflow import SPLITS, ClientSplit

__all__ = [
    "SplitSummary",
    "format_summary",
    "summarize_counts",
    "summarize_split",
    "summarize_sqlite",
]


@dataclass(frozen=True)
class SplitSummary:
    """Size of one split and the distribution of examples per client.

    Attributes
    ----------
    split : str
        Split name.
    num_clients, num_examples : int
        Clients and examples in the split.
    min, max : int
        Fewest and most examples of a client (0 for an empty split).
    median, p90, mean : float
        Median, 90th percentile (linear interpolation) and mean examples per client.
    """

    split: str
    num_clients: int
    num_examples: int
    min: int
    median: float
    p90: float
    max: int
    mean: float

    @classmethod
    def from_counts(cls, split: str, counts: Iterable[int]) -> SplitSummary:
        """Summarize the example counts ``counts`` of a split's clients."""
        c = np.asarray(
            list(counts) if not isinstance(counts, np.ndarray) else counts, dtype=np.int64
        )
        if c.size == 0:
            return cls(split, 0, 0, 0, 0.0, 0.0, 0, 0.0)
        if np.any(c < 0):
            raise ValueError(f"split {split!r}: example counts must be >= 0")
        # summed as Python integers: int64 wrapped around (nineteenth review of issue 15: counts
        # near 2**63 in client_metadata gave a negative number of examples)
        total = sum(c.tolist())
        return cls(
            split,
            int(c.size),
            total,
            int(c.min()),
            float(np.median(c)),
            float(np.percentile(c, 90)),
            int(c.max()),
            total / c.size,
        )


def _ordered(names: Iterable[str]) -> list[str]:
    names = list(names)
    return [s for s in SPLITS if s in names] + sorted(s for s in names if s not in SPLITS)


def summarize_counts(counts: Mapping[str, Iterable[int]]) -> list[SplitSummary]:
    """Summaries of several splits given as split name to per-client counts (train first)."""
    return [SplitSummary.from_counts(s, counts[s]) for s in _ordered(counts)]


def summarize_sqlite(path: str | os.PathLike) -> list[SplitSummary]:
    """Summarize every split of a TFF SQLite file from ``client_metadata`` alone.

    Raises
    ------
    FileNotFoundError, ValueError
        For a missing file or one that is not in the TFF StackOverflow schema.
    """
    return summarize_counts(read_example_counts(path))


def summarize_split(split: ClientSplit) -> SplitSummary:
    """Summarize any split from its per-client counts (one small read per client for HDF5)."""
    return SplitSummary.from_counts(split.split, [split.num_examples(c) for c in split.client_ids])


def _split_name(name: str) -> str:
    """A split's name for the table: as written if printable and short, else quoted and cut.

    Thirty-fifth review of issue 15 (data): ``data info`` printed the split names of a file's
    ``client_metadata`` as they were, so a name holding a terminal escape coloured the terminal
    and one holding a line break and ``train …`` wrote a row of its own (a name of a million
    characters, a line as long).
    """
    name = str(name)
    return name if name.isprintable() and len(name) <= SHOWN_CHARS else shown(name)


def format_summary(
    summaries: Iterable[SplitSummary], *, distinct_clients: int | None = None
) -> str:
    """Render summaries as an aligned plain-text table (one row per split, then a total).

    ``distinct_clients`` (:func:`~fedprivopt.data.sqlite.count_distinct_clients`) is the total's
    number of clients when given: a client in several splits counted once, which the total's row
    then says after its cells (thirty-seventh review of issue 15, data: the total was the splits'
    sum, 65,527 clients of a 50,000-user dataset). Without it the total is the splits' sum.
    """
    rows = list(summaries)
    split_sum = sum(s.num_clients for s in rows)
    clients = split_sum if distinct_clients is None else int(distinct_clients)
    head = ("split", "clients", "examples", "min", "median", "p90", "max", "mean")
    body = [
        (
            _split_name(s.split),
            f"{s.num_clients:,}",
            f"{s.num_examples:,}",
            f"{s.min:,}",
            f"{s.median:,.1f}",
            f"{s.p90:,.1f}",
            f"{s.max:,}",
            f"{s.mean:,.1f}",
        )
        for s in rows
    ]
    body.append(
        (
            "total",
            f"{clients:,}",
            f"{sum(s.num_examples for s in rows):,}",
            "",
            "",
            "",
            "",
            "",
        )
    )
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in [head, *body]
    ]
    if clients != split_sum:  # said on the total's row, which stays the last line
        lines[-1] = f"{lines[-1]}  (distinct clients; the split rows count {split_sum:,})"
    return "\n".join(lines)
