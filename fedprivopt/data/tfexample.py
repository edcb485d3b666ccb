"""A minimal ``tf.train.Example`` decoder in pure Python (no TensorFlow, no protobuf runtime).

The TFF StackOverflow files store every example as a serialized ``tf.train.Example``. Only a
handful of protobuf messages are involved, so they are decoded here straight from the wire
format::

    message Example   { Features features = 1; }
    message Features  { map<string, Feature> feature = 1; }   // entries: key = 1, value = 2
    message Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                     Int64List int64_list = 3; } }
    message BytesList { repeated bytes value = 1; }
    message FloatList { repeated float value = 1 [packed = true]; }
    message Int64List { repeated int64 value = 1 [packed = true]; }

The parser follows protobuf semantics: unknown fields are skipped (groups included), packed and
unpacked repeated scalars are both accepted, a repeated map key or a different ``oneof`` member
replaces the earlier one, a repeated embedded message merges into the earlier one (the same
``oneof`` list twice concatenates; an empty second ``Feature`` changes nothing), and int64
values are two's complement. Malformed input (truncated, a length running past its parent, an
invalid wire type, an over-long varint, an unmatched group) raises :class:`ProtoDecodeError`, a
:class:`ValueError`. The encoder (:func:`~fedprivopt.data.tfexample_encode.serialize_example`)
is :mod:`fedprivopt.data.tfexample_encode`; both share :class:`Feature`.

References
----------
.. [1] Protocol Buffers encoding, https://protobuf.dev/programming-guides/encoding/
.. [2] TensorFlow ``tensorflow/core/example/example.proto`` and ``feature.proto``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple

__all__ = [
    "MASK64",
    "WIRE_LEN",
    "Feature",
    "ProtoDecodeError",
    "bytes_feature",
    "float_feature",
    "int64_feature",
    "parse_example",
    "parse_features_raw",
]

BYTES_LIST = "bytes_list"
FLOAT_LIST = "float_list"
INT64_LIST = "int64_list"

# Wire types; WIRE_LEN and MASK64 are also the encoder's (fedprivopt.data.tfexample_encode).
_WIRE_VARINT, _WIRE_I64, WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5
_WIRE_START_GROUP, _WIRE_END_GROUP = 3, 4
_MAX_GROUP_DEPTH = 100  # protobuf's default recursion limit
MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63


class ProtoDecodeError(ValueError):
    """Raised when bytes are not a well-formed serialized ``tf.train.Example``."""


class Feature(NamedTuple):
    """One ``tf.train.Feature``: its ``kind`` and its values.

    Attributes
    ----------
    kind : str
        ``"bytes_list"``, ``"float_list"`` or ``"int64_list"``.
    values : tuple
        ``bytes``, ``float`` or ``int`` values, in order.
    """

    kind: str
    values: tuple


def bytes_feature(values: Iterable[bytes | str]) -> Feature:
    """Return a ``bytes_list`` feature; ``str`` values are UTF-8 encoded."""
    return Feature(
        BYTES_LIST, tuple(v.encode() if isinstance(v, str) else bytes(v) for v in values)
    )


def float_feature(values: Iterable[float]) -> Feature:
    """Return a ``float_list`` feature (values are stored as float32)."""
    return Feature(FLOAT_LIST, tuple(float(v) for v in values))


def int64_feature(values: Iterable[int]) -> Feature:
    """Return an ``int64_list`` feature; values must fit in a signed 64-bit integer."""
    out = tuple(int(v) for v in values)
    for v in out:
        if not -_SIGN64 <= v < _SIGN64:
            raise ValueError(f"int64 feature value {v} is outside [-2**63, 2**63)")
    return Feature(INT64_LIST, out)


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode one varint starting at ``pos``; return ``(value, next_pos)``."""
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise ProtoDecodeError(f"truncated varint at byte {pos}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & MASK64, pos
        shift += 7
        if shift >= 70:
            raise ProtoDecodeError(f"varint longer than 10 bytes ending at byte {pos}")


def _tag(buf: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """Decode a field tag; return ``(field_number, wire_type, next_pos)``."""
    b = buf[pos]
    if b < 0x80:
        key, pos = b, pos + 1
    else:
        key, pos = _varint(buf, pos, end)
    field, wire = key >> 3, key & 7
    if field == 0:
        raise ProtoDecodeError(f"invalid field number 0 at byte {pos}")
    return field, wire, pos


def _length(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode a length prefix and check the payload fits; return ``(payload_end, start)``."""
    b = buf[pos] if pos < end else None
    if b is not None and b < 0x80:
        n, pos = b, pos + 1
    else:
        n, pos = _varint(buf, pos, end)
    stop = pos + n
    if stop > end:
        raise ProtoDecodeError(
            f"length-delimited field of {n} bytes at byte {pos} runs past its end ({end})"
        )
    return stop, pos


def _skip(buf: bytes, pos: int, end: int, wire: int, field: int = 0, depth: int = 0) -> int:
    """Skip the payload of unknown field ``field`` and return the next position."""
    if wire == _WIRE_VARINT:
        return _varint(buf, pos, end)[1]
    if wire == WIRE_LEN:
        return _length(buf, pos, end)[0]
    if wire == _WIRE_START_GROUP:  # deprecated groups: fields up to the matching end tag
        if depth >= _MAX_GROUP_DEPTH:
            raise ProtoDecodeError(f"groups nested deeper than {_MAX_GROUP_DEPTH} at byte {pos}")
        while pos < end:
            inner, inner_wire, pos = _tag(buf, pos, end)
            if inner_wire == _WIRE_END_GROUP:
                if inner != field:
                    raise ProtoDecodeError(f"group {field} ended by field {inner} at byte {pos}")
                return pos
            pos = _skip(buf, pos, end, inner_wire, inner, depth + 1)
        raise ProtoDecodeError(f"unterminated group {field} at byte {pos}")
    width = {_WIRE_I64: 8, _WIRE_I32: 4}.get(wire)
    if width is None:
        raise ProtoDecodeError(f"unsupported wire type {wire} before byte {pos}")
    if pos + width > end:
        raise ProtoDecodeError(f"truncated fixed-width field at byte {pos}")
    return pos + width


def _signed(v: int) -> int:
    return v - (1 << 64) if v & _SIGN64 else v


def _parse_list(buf: bytes, pos: int, end: int, kind: str) -> tuple:
    values: list = []
    while pos < end:
        if kind == BYTES_LIST and buf[pos] == 0x0A and pos + 1 < end and buf[pos + 1] < 0x80:
            start = pos + 2
            pos = start + buf[pos + 1]
            if pos > end:
                raise ProtoDecodeError(f"bytes value at byte {start} runs past its end ({end})")
            values.append(buf[start:pos])
            continue
        field, wire, pos = _tag(buf, pos, end)
        if field != 1:
            pos = _skip(buf, pos, end, wire, field)
        elif kind == BYTES_LIST and wire == WIRE_LEN:
            stop, pos = _length(buf, pos, end)
            values.append(buf[pos:stop])
            pos = stop
        elif kind == FLOAT_LIST and wire == WIRE_LEN:
            stop, pos = _length(buf, pos, end)
            if (stop - pos) % 4:
                raise ProtoDecodeError(f"packed float list of {stop - pos} bytes at byte {pos}")
            values.extend(struct.unpack_from(f"<{(stop - pos) // 4}f", buf, pos))
            pos = stop
        elif kind == FLOAT_LIST and wire == _WIRE_I32:
            if pos + 4 > end:
                raise ProtoDecodeError(f"truncated float at byte {pos}")
            values.append(struct.unpack_from("<f", buf, pos)[0])
            pos += 4
        elif kind == INT64_LIST and wire == WIRE_LEN:
            stop, pos = _length(buf, pos, end)
            while pos < stop:
                v, pos = _varint(buf, pos, stop)
                values.append(_signed(v))
        elif kind == INT64_LIST and wire == _WIRE_VARINT:
            v, pos = _varint(buf, pos, end)
            values.append(_signed(v))
        else:
            raise ProtoDecodeError(f"{kind}.value has unexpected wire type {wire} at byte {pos}")
    return tuple(values)


_KINDS = {1: BYTES_LIST, 2: FLOAT_LIST, 3: INT64_LIST}
_KIND_TAGS = {0x0A: BYTES_LIST, 0x12: FLOAT_LIST, 0x1A: INT64_LIST}
_UNSET = (BYTES_LIST, ())  # an unset oneof reads as an empty list


def _parse_feature(
    buf: bytes, pos: int, end: int, feature: tuple[str, tuple] | None = None
) -> tuple[str, tuple] | None:
    """Parse a ``Feature`` merged into ``feature`` (protobuf's merge of a repeated message).

    Returns ``None`` while no ``oneof`` member is set.
    """
    while pos < end:
        field, wire, pos = _tag(buf, pos, end)
        kind = _KINDS.get(field)
        if kind is None or wire != WIRE_LEN:
            if kind is not None:
                raise ProtoDecodeError(f"Feature.{kind} has wire type {wire} at byte {pos}")
            pos = _skip(buf, pos, end, wire, field)
            continue
        stop, pos = _length(buf, pos, end)
        values = _parse_list(buf, pos, stop, kind)
        same = feature is not None and feature[0] == kind
        feature = (kind, feature[1] + values if same else values)  # type: ignore[index]
        pos = stop
    return feature


def _parse_entry(buf: bytes, pos: int, end: int) -> tuple[bytes, tuple[str, tuple]]:
    key = b""
    value: tuple[str, tuple] | None = None
    while pos < end:
        field, wire, pos = _tag(buf, pos, end)
        if field in (1, 2) and wire != WIRE_LEN:
            raise ProtoDecodeError(f"map entry field {field} has wire type {wire} at byte {pos}")
        if field == 1:
            stop, pos = _length(buf, pos, end)
            key = buf[pos:stop]
            pos = stop
        elif field == 2:
            stop, pos = _length(buf, pos, end)
            value = _parse_feature(buf, pos, stop, value)
            pos = stop
        else:
            pos = _skip(buf, pos, end, wire, field)
    return key, _UNSET if value is None else value


def _short_length(buf: bytes, q: int, end: int) -> tuple[int, int]:
    """Decode a 1- or 2-byte length at ``q < end``; return ``(n, next)`` or ``(-1, q)``."""
    n = buf[q]
    if n < 0x80:
        return n, q + 1
    if q + 1 >= end or buf[q + 1] >= 0x80:
        return -1, q
    return (n & 0x7F) | (buf[q + 1] << 7), q + 2


def _parse_entry_fast(buf: bytes, pos: int, end: int) -> tuple[bytes, tuple[str, tuple]] | None:
    """Parse a canonically encoded map entry, or return None to use the general parser.

    Canonical: ``0x0A klen key 0x12 flen <kind tag> llen <list>`` with a one-byte ``klen``,
    ``flen``/``llen`` of at most two bytes and the list ending the entry (what TensorFlow
    writes). The list itself goes through the general :func:`_parse_list`.
    """
    if end - pos < 6 or buf[pos] != 0x0A or buf[pos + 1] >= 0x80:
        return None
    kstop = pos + 2 + buf[pos + 1]
    if kstop + 4 > end or buf[kstop] != 0x12:
        return None
    n, q = _short_length(buf, kstop + 1, end)
    if q + n != end or q >= end:
        return None
    kind = _KIND_TAGS.get(buf[q])
    if kind is None or q + 1 >= end:
        return None
    n, q = _short_length(buf, q + 1, end)
    if q + n != end:
        return None
    return buf[pos + 2 : kstop], (kind, _parse_list(buf, q, end, kind))


def parse_features_raw(data: bytes) -> dict[bytes, tuple[str, tuple]]:
    """Parse a serialized ``tf.train.Example`` into raw ``{name: (kind, values)}``.

    The fast path behind :func:`parse_example`: names stay ``bytes`` (not validated as UTF-8)
    and no :class:`Feature` objects are built.

    Raises
    ------
    ProtoDecodeError
        If ``data`` is not a well-formed ``tf.train.Example``.
    """
    if not isinstance(data, bytes):
        data = bytes(data)
    out: dict[bytes, tuple[str, tuple]] = {}
    pos, end = 0, len(data)
    while pos < end:
        field, wire, pos = _tag(data, pos, end)
        if field != 1:
            pos = _skip(data, pos, end, wire, field)
            continue
        if wire != WIRE_LEN:
            raise ProtoDecodeError(f"Example.features has wire type {wire} at byte {pos}")
        fstop, pos = _length(data, pos, end)
        while pos < fstop:  # Features message; repeated occurrences merge
            ffield, fwire, pos = _tag(data, pos, fstop)
            if ffield != 1:
                pos = _skip(data, pos, fstop, fwire, ffield)
                continue
            if fwire != WIRE_LEN:
                raise ProtoDecodeError(f"Features.feature has wire type {fwire} at byte {pos}")
            estop, pos = _length(data, pos, fstop)
            parsed = _parse_entry_fast(data, pos, estop)
            key, value = parsed if parsed is not None else _parse_entry(data, pos, estop)
            out[key] = value
            pos = estop
    return out


def parse_example(data: bytes) -> dict[str, Feature]:
    """Parse a serialized ``tf.train.Example``.

    Parameters
    ----------
    data : bytes
        The serialized message.

    Returns
    -------
    dict of str to Feature
        Feature name to :class:`Feature`, in wire order (a repeated name keeps its last value,
        at the position of its first occurrence).

    Raises
    ------
    ProtoDecodeError
        If ``data`` is not a well-formed ``tf.train.Example`` or a feature name is not UTF-8.
    """
    out: dict[str, Feature] = {}
    for key, (kind, values) in parse_features_raw(data).items():
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtoDecodeError(f"feature name {key[:40]!r} is not UTF-8") from exc
        out[name] = Feature(kind, values)
    return out
