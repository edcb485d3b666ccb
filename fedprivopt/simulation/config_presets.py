"""A preset's layers: its text read, its tables flattened, ``--set`` overrides parsed and merged.

A preset (TOML) and the ``--set key=value`` overrides (:func:`parse_override`) become one flat
mapping of dotted kebab-case keys (:func:`flatten`, as in Flower's flattened run config), each
task parameter in one spelling (:func:`task_param_spellings`); a layer is merged over the one below
(:func:`merge`: preset < its ``[strategies.<name>]`` table < ``--set``). :func:`preset_text` reads
a preset file within bounds. Resolving the result into a validated
:class:`~fedprivopt.simulation.config.RunConfig`: :mod:`fedprivopt.simulation.config`.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedprivopt.core.files import read_at_most
from fedprivopt.core.text import shown, shown_key
from fedprivopt.models.side_information_config import KEY as SIDE_INFORMATION
from fedprivopt.strategies.config import STRATEGIES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "PRESET_LIMIT",
    "flat_overrides",
    "flatten",
    "merge",
    "parse_override",
    "preset_text",
    "task_param_spellings",
    "unknown_strategy_table",
]


def parse_override(text: str) -> tuple[str, Any]:
    r"""Parse ``key=value``; the value is read as TOML (``2``, ``0.5``, ``true``), else as text.

    The value is TOML only when it is exactly one TOML value: ``1\n[x]`` is the text itself,
    not ``1`` with the rest dropped. Whitespace around the value is no part of it, TOML or text
    (fortieth review of issue 15, input 2: ``0.5`` followed by a carriage return, as a script
    saved with CRLF line ends passes its last word, or by a no-break space copied from a web
    page, is no TOML, so it was the text ``'0.5'``, refused as ``noise-multiplier must be a real
    number …, got '0.5'``, and ``--rounds 1 --set num-server-rounds=1`` as contradicting).
    """
    if "=" not in text:
        raise ValueError(f"--set expects key=value, got {shown(text)}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ValueError(f"--set expects key=value, got {shown(text)}")
    raw = raw.strip()
    try:
        parsed = tomllib.loads(f"v = {raw}")
    except ValueError:  # not TOML, or an integer too long to read: the text, which the key checks
        parsed = {}
    value = parsed["v"] if list(parsed) == ["v"] else raw
    named = isinstance(value, _NAMES_READ_AS_VALUES) and not isinstance(value, bool)
    if named and _is_task_dir(key):
        # forty-fifth review of issue 15 (input 3): a directory named by a number (2024, 0x10,
        # 1e3, inf) was read as TOML's number and refused as "task-params.data-dir must be a
        # non-empty path, got 16", a value not typed; a directory parameter takes text.
        # Follow-up (outputs 3): a directory named by a date or time (2024-01-01, 07:30:00, a
        # dated snapshot) was read as TOML's date and refused as "a TOML date or time is no
        # setting", where 2024 was taken
        value = raw
    return key, value


#: What TOML reads from a directory's name that is not text: numbers, dates and times (a
#: ``bool`` is an ``int``; ``true`` and ``false`` stay refused, as TOML's booleans).
_NAMES_READ_AS_VALUES = (int, float, datetime.date, datetime.time)


def _is_task_dir(key: str) -> bool:
    """Whether ``key`` (as ``--set`` gives it) names a directory task parameter."""
    head, _, name = key.rpartition(".")
    return head.endswith("task-params") and name.replace("_", "-") in ("data-dir", "cache-dir")


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables become dotted keys, as in Flower's flattened run config.

    Raises
    ------
    ValueError
        For an empty table where a value belongs (``noise-multiplier = {}``): flattening drops
        it, so the code's default ran where the preset said ``{}`` (nineteenth review of issue
        15). The tables themselves (``[strategies.X]``, ``task-params``, ``side-information``)
        may be empty. For a key reached twice with different values: a quoted dotted key beside
        its table (``"task-params.seed" = 5`` and ``[task-params] seed = 0``), or ``--set
        task-params.seed=1 --set 'task-params={seed=2}'``; TOML reads the quoted key as one key,
        and the last spelling won silently (thirty-fifth review of issue 15, lifecycle finding
        5, as ``--set`` of one key twice is refused).
    """
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if not value:
                _check_empty_table(name)
            entries = flatten(value, f"{name}.").items()
        else:
            entries = [(name, value)]
        for dotted, item in entries:
            if dotted in flat and not _same_value(flat[dotted], item):
                raise ValueError(
                    f"{shown_key(dotted)} is given twice, as {shown(flat[dotted])} and "
                    f"{shown(item)} (a dotted key beside its table, or a table beside a dotted "
                    "key): give it once"
                )
            flat[dotted] = item
    return flat


def _same_value(a: Any, b: Any) -> bool:
    """Whether two spellings of a key give it the same value (``1`` and ``1.0`` do not)."""
    return type(a) is type(b) and repr(a) == repr(b)


def _check_empty_table(name: str) -> None:
    """Refuse ``name = {}`` where a value belongs, and an empty table of an unknown strategy.

    A non-empty ``[strategies.zzz]`` is refused by ``config._apply_strategy_table``; an empty one
    reached no key, so it was accepted (twentieth review of issue 15).
    """
    head, _, rest = name.partition(".")
    strategy, _, key = rest.partition(".")
    if head == "strategies" and strategy and not key and strategy not in STRATEGIES:
        raise unknown_strategy_table(name)
    if not _is_table(name):
        raise ValueError(
            f"{shown_key(name)} = {{}} is a table without a value, which sets nothing (the "
            "default would be used); give a value"
        )


def unknown_strategy_table(table: str) -> ValueError:
    """The error naming a ``[strategies.<name>]`` table whose name is no strategy's."""
    return ValueError(
        f"unknown key {shown(table)}: the table name must be one of {', '.join(STRATEGIES)}"
    )


def _is_table(name: str) -> bool:
    """Whether the dotted ``name`` is one of a preset's tables (which may be empty)."""
    head, _, rest = name.partition(".")
    if head != "strategies":
        return name in ("task-params", SIDE_INFORMATION)
    strategy_key = rest.partition(".")[2]
    return strategy_key in ("", "task-params", SIDE_INFORMATION)


def task_param_spellings(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``flat`` with each task parameter spelled in kebab case (``task-params.num-classes``).

    ``num-classes`` and ``num_classes`` name one task parameter; both in one layer (a preset,
    one of its strategy tables, or the overrides) was a silent choice of the last line
    (issue 15, ninth review, N6) and is refused. Across layers the upper one still wins.

    Raises
    ------
    ValueError
        Naming both spellings.
    """
    out: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for key, value in flat.items():
        head, sep, name = key.partition("task-params.")
        if sep and (not head or (head.startswith("strategies.") and head.count(".") == 2)):
            canon = f"{head}{sep}{name.replace('_', '-')}"
            if canon in seen:
                raise ValueError(
                    f"{seen[canon]} and {key} are both given: one task parameter in two "
                    "spellings; give one"
                )
            seen[canon] = key
            key = canon
        out[key] = value
    return out


def _side_information_keys(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The string form ``side-information = "x"`` as ``side-information.kind = "x"``."""
    out = dict(flat)
    if SIDE_INFORMATION in out:
        kind_key = f"{SIDE_INFORMATION}.kind"
        if kind_key in out:
            raise ValueError(f"{SIDE_INFORMATION} and {kind_key} are both given; give one")
        out[kind_key] = out.pop(SIDE_INFORMATION)
    return out


def merge(lower: Mapping[str, Any], upper: Mapping[str, Any]) -> dict[str, Any]:
    """``upper`` over ``lower``.

    An ``upper`` that changes the side-information kind replaces ``lower``'s whole
    side-information table (its parameters belong to the other kind).
    """
    lower, upper = _side_information_keys(lower), _side_information_keys(upper)
    kind_key, prefix = f"{SIDE_INFORMATION}.kind", f"{SIDE_INFORMATION}."
    out = dict(lower)
    if kind_key in upper and upper[kind_key] != lower.get(kind_key, "auto"):
        out = {k: v for k, v in out.items() if not k.startswith(prefix)}
    out.update(upper)
    return out


def flat_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` as :func:`load_config` applies them: dotted keys, task parameters kebab-cased.

    Raises
    ------
    ValueError
        For an empty table where a value belongs, or one task parameter in two spellings.
    """
    return task_param_spellings(flatten(dict(overrides)))


PRESET_LIMIT = 1 << 20
"""The most bytes a preset (or a run's ``config.toml``) may hold: 1 MiB, some 250 times the
largest preset here (4 kB). Fortieth review of issue 15 (input 4): the limit was
:data:`~fedprivopt.simulation.files.SMALL_FILE_LIMIT` (64 MiB), and Python's TOML parser holds
about 95 bytes a byte of tables (``[t0000001]`` lines): a preset of 16 MiB took 1.5 GB and 38 s
before its first key was refused, one of 64 MiB about 6 GB; one of 1 MiB takes about 2 s and
80 MB at most."""


def preset_text(path: Path) -> str:
    """The text of the preset ``path``, refused above :data:`PRESET_LIMIT` (1 MiB).

    Eighteenth review of issue 15, finding 7: ``simulate X.toml`` (and ``--resume R`` whose
    ``config.toml`` had grown) read the whole file first; a sparse file of 20 GB (``truncate -s
    20G``) ended in a ``MemoryError`` traceback (rc 1) or grew until the kernel killed it. A
    preset is a few kB; at most the limit plus one byte is read.
    """
    raw = read_at_most(path, PRESET_LIMIT)
    if raw is None:
        raise ValueError(
            f"config file {shown(str(path))} holds more than {PRESET_LIMIT:,} bytes, which "
            "no preset does (a preset is a few kB; parsing TOML takes about 100 times a "
            "file's size in memory)"
        )
    for mark, what in _BYTE_ORDER_MARKS:
        if raw.startswith(mark):
            raise ValueError(
                f"config file {shown(str(path))} is not valid TOML: it starts with {what}; TOML "
                "is UTF-8 without a byte-order mark (save it as plain UTF-8)"
            )
    cause = _encoding_slip(raw)
    if cause is not None:
        raise ValueError(f"config file {shown(str(path))} is not valid TOML: {cause}")
    return raw.decode("utf-8")


def _encoding_slip(raw: bytes) -> str | None:
    r"""What keeps ``raw`` from being TOML's UTF-8 text with its line ends, else ``None``.

    Forty-third review of issue 15 (input 3), the thirty-first review's encodings saved without
    a byte-order mark: a preset saved as UTF-16 (``iconv -t utf-16le``) was refused as ``Found
    invalid character '\x00' (at line 1, column 2)``, one in Latin-1 or Windows-1252 (an
    ``é`` in a comment) as ``'utf-8' codec can't decode byte 0xe9 in position 5: invalid
    continuation byte`` (a byte offset, no line), and one whose lines end in carriage returns
    alone (classic Mac OS) as ``Found invalid character '\r' (at line 1, column 98)``.
    """
    half = len(raw) // 2
    if half and max(raw[0::2].count(0), raw[1::2].count(0)) * 2 >= half:
        return (
            "it holds a NUL byte between most characters, as UTF-16 does; TOML is UTF-8 (save "
            "it as plain UTF-8)"
        )
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        return (
            f"line {line}, column {column}: byte 0x{raw[exc.start]:02x} is not UTF-8 (the file "
            "was saved in another encoding, e.g. Latin-1 or Windows-1252); TOML is UTF-8 (save "
            "it as plain UTF-8)"
        )
    if b"\r" in raw and b"\n" not in raw:
        return (
            "its lines end in carriage returns alone (classic Mac OS); TOML lines end in a line "
            "feed or CRLF (save it with Unix or Windows line ends)"
        )
    return None


#: Thirty-first review of issue 15: a preset saved with a byte-order mark (as some Windows editors
#: save UTF-8) was refused as ``Invalid statement (at line 1, column 1)``, a line that looks
#: right; one saved as UTF-16 as ``'utf-8' codec can't decode byte 0xff in position 0``.
_BYTE_ORDER_MARKS = (
    (b"\xef\xbb\xbf", "a UTF-8 byte-order mark (U+FEFF)"),
    (b"\xff\xfe", "a UTF-16 byte-order mark (the file is UTF-16)"),
    (b"\xfe\xff", "a UTF-16 byte-order mark (the file is UTF-16)"),
)
