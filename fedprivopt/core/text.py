"""Values shown in one-line messages: never a wall of text."""

from __future__ import annotations

import decimal
import math
import re

__all__ = ["SHOWN_CHARS", "cut_middle", "epsilon_text", "shown", "shown_key"]

SHOWN_CHARS = 80
"""Characters of a value that a message shows (:func:`shown`)."""

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\Z")


def shown(value: object) -> str:
    """``repr(value)`` cut to :data:`SHOWN_CHARS` characters with an ellipsis (for messages).

    A string keeps both ends, its middle cut: a long path's tail names the file a message is
    about (a path cut after 80 characters lost it: ``cannot create '/home/…': '/home/…' is not a
    directory``).

    An integer beyond Python's limit for converting it to text (4,300 digits), whose ``repr``
    raises ``ValueError``, is shown by its number of digits (eighteenth review of issue 15,
    finding 5: the messages refusing it were that ``ValueError``, naming no argument).
    """
    try:
        text = repr(value)
    except ValueError:
        if not isinstance(value, int):
            raise
        return f"an integer of about {int(abs(value).bit_length() * math.log10(2)) + 1:,} digits"
    if len(text) <= SHOWN_CHARS:
        return text
    if isinstance(value, str):  # both ends: a path's tail names its file (nineteenth review)
        return cut_middle(text)
    return f"{text[: SHOWN_CHARS - 1]}…"


def cut_middle(text: str) -> str:
    """``text`` of more than :data:`SHOWN_CHARS` characters as its two ends around an ellipsis.

    :data:`SHOWN_CHARS` characters in all; used by :func:`shown` and by the command line's
    shortening of long quoted values.
    """
    if len(text) <= SHOWN_CHARS:
        return text
    head = (SHOWN_CHARS - 1) // 2
    return f"{text[:head]}…{text[head - SHOWN_CHARS + 1 :]}"


def shown_key(key: str) -> str:
    """A configuration key for a message: as written if plain, else as :func:`shown` writes it.

    Plain: a dotted key of at most :data:`SHOWN_CHARS` characters (``strategies.dp2.tau``);
    any other (empty, with a space or a quote, huge) is quoted and its middle cut.

    Twentieth review of issue 15: the refusal of ``KEY = {}`` wrote the key as it came, so a
    preset's ``'' = {}`` read ``config:  = {} is a table ...`` and a key of 1,000,000
    characters filled a line of 1,900.
    """
    if isinstance(key, str) and len(key) <= SHOWN_CHARS and _PLAIN_KEY.match(key):
        return key
    return shown(key)


def epsilon_text(epsilon: float, digits: int = 4, *, places: int | None = None) -> str:
    """ε as a message or report shows it: rounded up, never below what was spent.

    ``digits`` significant digits in the style of ``format(x, ".4g")``, or with ``places``
    that many decimal places (``format(x, ".4f")``), the last one rounded up from the float's
    shortest decimal (``repr``, which reads back as the same float): ``8.961188`` is shown
    ``8.962``, ``12.17`` and ``0.1`` as they are. ``inf`` and ``nan`` are shown as Python writes
    them.

    Thirty-ninth review of issue 15 (reports, open for the lead): every line and report rounded
    ε to the nearest shown digit, so a run that spent 8.961188 was shown ``8.961``, below what
    it spent (``calibrate`` already rounded its σ up so that the shown value keeps its
    promise). ``summary.json`` and ``summary.csv`` keep every digit.
    """
    value = float(epsilon)
    if not math.isfinite(value) or value == 0:
        return f"{value:.{places}f}" if places is not None else f"{value:.{digits}g}"
    # the float's shortest decimal (repr), which reads back as the same float: 0.1 stays 0.1
    exact = decimal.Decimal(repr(value))
    context = decimal.Context(prec=_EPSILON_PRECISION, rounding=decimal.ROUND_CEILING)
    if places is not None:
        return f"{exact.quantize(decimal.Decimal(1).scaleb(-places), context=context):f}"
    step = decimal.Decimal(1).scaleb(exact.adjusted() - digits + 1)
    up = exact.quantize(step, context=context)
    text = f"{float(up):.{digits}g}"  # the float's style: 2, 1e+05, 1.5e+298
    if "inf" in text or decimal.Decimal(text) < up:  # beyond the floats (1.798e+308, 5e-324)
        text = re.sub(r"e([+-])(\d)$", r"e\g<1>0\2", f"{up.normalize():.{digits}g}")
    return text


_EPSILON_PRECISION = 400
"""Decimal digits :func:`epsilon_text` computes with: a float up to 1.8e308 with decimals."""
