"""Parameter checks: each returns the value or raises ``ValueError`` naming it and its range."""

from __future__ import annotations

__all__ = ["check_bool", "check_int"]


def check_int(name: str, value: object, minimum: int, *, none: bool = False) -> int | None:
    """``value`` as an ``int >= minimum`` (``None`` passes when ``none``); bools are refused."""
    if none and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = " or None" if none else ""
        raise ValueError(f"{name} must be an integer >= {minimum}{extra}, got {value!r}")
    return int(value)


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a ``bool`` (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value
