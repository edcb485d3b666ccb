"""The cells of ``report.md``: numbers, seeds, rounds and escaped text.

Split from :mod:`fedprivopt.simulation.report_markdown`, which writes the report from these:
numbers rounded to what the spread supports (:func:`fmt_pm`), ε as the Summary shows it
(:func:`fmt_eps`), seeds listed or as ranges (:func:`seed_list`, :func:`seeds_cell`), a row's
completed rounds (:func:`rounds_text`, as ``summary.csv`` writes them too) and text escaped to one
line (:func:`one_line`) or to one cell of a markdown table (:func:`table_cell`, also used by the
tuning's reports).
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

from fedprivopt.core.text import epsilon_text

__all__ = [
    "LISTED", "alt_text", "code_span", "fmt", "fmt_eps", "fmt_pm", "one_line", "plain_text",
    "rounds_text", "seed_list", "seeds_cell", "table_cell",
]  # fmt: skip


def fmt(x: float, digits: int = 4) -> str:
    """``x`` to ``digits`` significant digits, ``n/a`` for NaN."""
    return "n/a" if math.isnan(x) else f"{x:.{digits}g}"


_ROUNDING = 1e-12
"""A std at most this fraction of the mean is the rounding of equal values' mean, shown ``± 0``.

Thirty-second review of issue 15 (reports, finding 8): 7 seeds of an equal accuracy 0.37333
have a float mean one ulp off and a std of 6e-17, which was written ``0.37333333 ± 0.00000000``
(eight places claimed) where 6 seeds gave ``0.3733 ± 0``.
"""


def fmt_pm(mean: float, std: float, n: int) -> str:
    """``mean ± std`` with the std to two significant digits and the mean to the same place.

    A std of 100 or more is rounded to its second significant digit too (``1000 ± 120``), in
    scientific notation from a million on (``1.163e+19 ± 5.7e+17``). Thirty-third review of
    issue 15 (results, finding 4): such a spread was written with every digit of the float, as
    ``11630144715940167680 ± 569119712518259776`` (``compare --set server-learning-rate=1e20``'s
    eval loss; 39 digits each near float32's largest loss).
    """
    if not math.isfinite(mean):
        return "n/a" if math.isnan(mean) else str(mean)
    if n <= 1 or math.isnan(std):  # NaN: fewer than two finite values (no spread)
        return fmt(mean)
    if 0 < std <= abs(mean) * _ROUNDING:  # equal values whose mean was rounded: no spread
        std = 0.0
    if not (math.isfinite(std) and std > 0):
        return f"{fmt(mean)} ± {fmt(std)}"
    place = 1 - math.floor(math.log10(std))  # decimal place of the std's second digit
    if place >= 0:
        return f"{mean:.{min(place, 8)}f} ± {std:.{min(place, 8)}f}"
    if max(abs(mean), std) < 1e6:
        return f"{round(mean, place):.0f} ± {round(std, place):.0f}"
    digits = max(math.floor(math.log10(abs(mean))) + place, 0) if mean else 0
    return f"{mean:.{digits}e} ± {std:.1e}"


LISTED = 10
"""Up to this many seeds are listed one by one; more are written as ranges (``0-299``)."""


def seed_list(seeds: Sequence[int]) -> str:
    """``0, 1, 2`` or, above :data:`LISTED` seeds, their ranges: ``0-299, 301``.

    Twenty-ninth review of issue 15: ``compare --seeds 300`` wrote every seed number into the
    report's first paragraph, and a row whose 300 seeds diverged a table cell of 6,893
    characters (``seed 0 from round 1, seed 1 from round 1, ...``).
    """
    ordered = sorted(set(seeds))
    if len(ordered) <= LISTED:
        return ", ".join(map(str, ordered))
    spans: list[list[int]] = []
    for seed in ordered:
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    # forty-fourth review of issue 15 (reports, finding 1): the released trials of a tuned
    # comparison have scattered run seeds (1356721935, ...), which make no ranges: compare
    # --tune-grid ... --seeds 300 wrote all 300 into the header (3,437 characters) and a row's
    # diverged seeds into one table cell (3,530); the first spans are shown, then a count
    shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans[:LISTED])
    rest = sum(b - a + 1 for a, b in spans[LISTED:])
    return shown + (f" and {rest} more" if rest else "")


def seeds_cell(
    n: int, n_finite: int, diverged: Sequence[tuple[int, int]], budget: int = 0,
    seeds_named: bool = True,
) -> str:  # fmt: skip
    """``3``, or ``3 (1 non-finite; 2 diverged: seed 0 from round 1, seed 2 from round 4)``.

    Above :data:`LISTED` diverged seeds they are grouped by round: ``seeds 0-299 from round 1``.
    ``budget`` seeds stopped early at the privacy budget: ``3 (3 stopped at the privacy
    budget)`` (:func:`write_summary_csv`, finding 5). ``seeds_named`` false (a tuned row,
    whose run seeds are released trials' and give their numbers: forty-seventh review,
    tuning 4): ``1 (1 diverged: from round 1)``.
    """
    marks = [f"{budget} stopped at the privacy budget"] if budget else []
    marks += [f"{n - n_finite} non-finite"] if n_finite != n else []
    if diverged and not seeds_named:
        rounds = sorted({first for _, first in diverged})
        more = ", ..." if len(rounds) > LISTED else ""
        which = f"from round {', '.join(map(str, rounds[:LISTED]))}{more}"
        marks.append(f"{len(diverged)} diverged: {which}")
    elif len(diverged) > LISTED:
        rounds = sorted({first for _, first in diverged})
        which = ", ".join(
            f"seeds {seed_list([s for s, f in diverged if f == first])} from round {first}"
            for first in rounds[:LISTED]
        )  # at most LISTED rounds (finding 1 of the forty-fourth review, above)
        later = sum(f in rounds[LISTED:] for _, f in diverged)
        which += f", {later} more from later rounds" if later else ""
        marks.append(f"{len(diverged)} diverged: {which}")
    elif diverged:
        which = ", ".join(f"seed {seed} from round {first}" for seed, first in diverged)
        marks.append(f"{len(diverged)} diverged: {which}")
    return f"{n} ({'; '.join(marks)})" if marks else str(n)


def rounds_text(row: Mapping[str, Any]) -> str:
    """An :func:`aggregate_runs` row's completed rounds: ``3``, or ``1–3`` when they differ.

    The ``rounds`` cell of ``report.md`` and of ``summary.csv`` alike. Thirty-second review of
    issue 15 (reports, finding 5): ``compare --tune-grid num-server-rounds=1,3`` released
    1-round and 3-round trials as one row's seeds, and the row said ``rounds 1`` (the fewest)
    beside a mean over both; thirty-third review (results, finding 1): ``summary.csv`` still
    wrote that ``1``.
    """
    lo = row["rounds"]
    hi = row.get("rounds_max", lo)  # rows built without it: one count
    return str(lo) if lo == hi else f"{lo}–{hi}"


def fmt_eps(eps: float, private: bool = False) -> str:
    """ε as the Summary shows it; ``∞ (non-private)`` only for a row that is not private.

    Thirty-ninth review of issue 15 (reports, finding 3): a dp-fedavg run whose
    ``summary.json`` was edited to ``"epsilon": Infinity`` (its ledger 10.28; the largest ε its
    files state is reported) was shown as ``∞ (non-private)`` and drawn as a non-private
    baseline.
    """
    if math.isinf(eps):
        return "∞ (private: its files state an unbounded epsilon)" if private else "∞ (non-private)"
    return "n/a" if math.isnan(eps) else epsilon_text(eps)  # rounded up (thirty-ninth review)


def one_line(text: str) -> str:
    r"""``text`` with its control characters escaped (``\n``, ``\r``, ``\x1b``): one line.

    Thirty-fifth review of issue 15 (outputs, finding 7): ``compare $'my\n## Notes.toml' …``
    (a preset whose file name holds a newline) wrote the title ``# fedprivopt compare: my``
    and then a heading ``## Notes.toml`` of its own in ``report.md``; a task's
    ``initialization`` text alike (its "Initial model:" line).
    """
    return "".join(
        c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def table_cell(text: Any) -> str:
    r"""``text`` as one cell of a markdown table: ``|`` escaped, newlines as spaces.

    Also the Summary's header cell of the task metric: thirty-fifth review of issue 15 (outputs,
    finding 2): a task by reference whose metric is named ``p(y|x)`` wrote the header
    ``| … | eval_p(y|x) | eval loss | s/round |``, 10 cells over a delimiter row of 9, which
    Markdown does not take for a table: the Summary showed as lines of text.

    Forty-sixth review of issue 15 (reports, finding 3): only ``\n`` was a line break here.
    ``write_report(out, load_runs(D))`` of a run directory named ``a\r## Fake heading`` (a
    carriage return, a line ending of Markdown too) wrote each of its warnings as a heading
    ``## Fake heading: diverged at round 1 ...`` under "Warnings", and a table cell so broken
    ends its row. The other control characters are now escaped as :func:`one_line` does.
    """
    return one_line(str(text).replace("\n", " ")).replace("|", "\\|")


def code_span(text: Any) -> str:
    r"""``text`` as one inline code span of markdown, on one line (:func:`one_line`).

    Fenced by one more backtick than the longest run of backticks inside (CommonMark), padded
    by a space when it holds one: ``eval_accuracy`` is written as before. Forty-fifth review of
    issue 15 (reports, finding 1): a task by reference whose metric is named with a line break
    and a heading (``acc\n## Privacy parameters``) wrote ``Task metric: `eval_acc`` and then a
    heading of its own in ``report.md``; a backtick in the name ended the code span early.
    """
    text = one_line(str(text))
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence, pad = "`" * (longest + 1), " " if longest else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def alt_text(text: Any) -> str:
    """``text`` as the alternative text of a markdown image: one line, brackets escaped.

    Forty-fifth review of issue 15 (reports, finding 1): a metric named ``a](http://x)`` made
    ``![eval_a](http://x) by round](metric_vs_round.png)``, an image of another address.
    """
    return one_line(str(text)).replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")


def plain_text(text: Any) -> str:
    r"""``text`` as plain markdown text: one line, no link, image or inline HTML.

    ``[``, ``]`` and ``<`` are escaped, a backslash before punctuation doubled (:func:`one_line`'s
    ``\n`` kept as it is).

    Forty-seventh review of issue 15 (reports, finding 2): a task by reference whose
    ``reference()`` model is named ``prior\n## Privacy parameters\n\n- noise: none\n\n
    ![x](http://evil.example/t.png)`` wrote three headings ``## Privacy parameters`` of its own,
    a list item ``- noise: none`` and an image of another address (fetched when the report is
    shown) into ``report.md``; an ``initialization`` text alike (its "Initial model:" line).
    """
    text = one_line(str(text))
    out = []
    for i, c in enumerate(text):
        if c == "\\" and (i + 1 == len(text) or text[i + 1] in string.punctuation):
            out.append("\\\\")  # an escaping backslash is one of its own; ``\n`` stays
        else:
            out.append("\\" + c if c in "[]<" else c)
    return "".join(out)
