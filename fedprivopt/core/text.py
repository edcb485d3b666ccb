"""Values shown in one-line messages: never a wall of text."""

from __future__ import annotations

import math
import re

__all__ = ["SHOWN_CHARS", "cut_middle", "shown", "shown_key"]

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
