"""Values shown in one-line messages: never a wall of text."""

from __future__ import annotations

__all__ = ["SHOWN_CHARS", "shown"]

SHOWN_CHARS = 80
"""Characters of a value that a message shows (:func:`shown`)."""


def shown(value: object) -> str:
    """``repr(value)`` cut to :data:`SHOWN_CHARS` characters with an ellipsis (for messages)."""
    text = repr(value)
    if len(text) <= SHOWN_CHARS:
        return text
    quote = text[-1] if isinstance(value, str) else ""  # keep a string's closing quote
    return f"{text[: SHOWN_CHARS - 1 - len(quote)]}…{quote}"
