"""A minimal ``tf.train.Example`` encoder in pure Python (no TensorFlow, no protobuf runtime).

:func:`serialize_example` writes the messages that :mod:`fedprivopt.data.tfexample` decodes
(see its docstring for the schema): map entries in the mapping's order, repeated scalars packed,
an empty packed list not written at all, and int64 values in two's complement.
:func:`feature_entry` and :func:`wrap_feature_entries` expose the two steps so that a writer can
precompute entries shared by many examples, and :func:`bytes_entry` is the fast path of a
single-value ``bytes_list``.

References
----------
.. [1] Protocol Buffers encoding, https://protobuf.dev/programming-guides/encoding/
.. [2] TensorFlow ``tensorflow/core/example/example.proto`` and ``feature.proto``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from fedprivopt.data.tfexample import (
    BYTES_LIST,
    FLOAT_LIST,
    INT64_LIST,
    MASK64,
    WIRE_LEN,
    Feature,
    bytes_feature,
    float_feature,
    int64_feature,
)

__all__ = ["bytes_entry", "feature_entry", "serialize_example", "wrap_feature_entries"]

_KIND_FIELD = {BYTES_LIST: 1, FLOAT_LIST: 2, INT64_LIST: 3}
_SMALL = [bytes((i,)) for i in range(0x80)]


def _encode_varint(v: int) -> bytes:
    if 0 <= v < 0x80:
        return _SMALL[v]
    v &= MASK64
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


_VARINTS = [_encode_varint(i) for i in range(1 << 14)]  # lengths below 16 KiB: table lookup


def _len_field(field: int, payload: bytes) -> bytes:
    n = len(payload)
    prefix = _VARINTS[n] if n < len(_VARINTS) else _encode_varint(n)
    return b"".join((_encode_varint((field << 3) | WIRE_LEN), prefix, payload))


def _as_feature(name: str, value: object) -> Feature:
    """Coerce a plain Python value to a :class:`Feature` (see :func:`serialize_example`)."""
    if isinstance(value, Feature):
        return value
    if isinstance(value, (bytes, str)):
        return bytes_feature([value])
    if isinstance(value, bool):
        raise TypeError(f"feature {name!r}: bool values are ambiguous, use int64_feature")
    if isinstance(value, int):
        return int64_feature([value])
    if isinstance(value, float):
        return float_feature([value])
    values = list(value)  # type: ignore[call-overload]
    if not values:
        raise TypeError(f"feature {name!r}: empty list is ambiguous, use bytes_feature([]) etc.")
    first = values[0]
    if isinstance(first, (bytes, str)):
        return bytes_feature(values)
    if isinstance(first, float):
        return float_feature(values)
    if isinstance(first, int) and not isinstance(first, bool):
        return int64_feature(values)
    raise TypeError(f"feature {name!r}: cannot encode values of type {type(first).__name__}")


def _encode_feature(feature: Feature) -> bytes:
    if feature.kind == BYTES_LIST:
        body = b"".join(_len_field(1, v) for v in feature.values)
    elif feature.kind == FLOAT_LIST:
        body = _len_field(1, struct.pack(f"<{len(feature.values)}f", *feature.values))
    elif feature.kind == INT64_LIST:
        body = _len_field(1, b"".join(_encode_varint(v) for v in feature.values))
    else:
        raise ValueError(f"unknown feature kind {feature.kind!r}")
    if feature.kind != BYTES_LIST and not feature.values:
        body = b""  # an empty packed list is not written at all
    return _len_field(_KIND_FIELD[feature.kind], body)


def feature_entry(name: str, value: object) -> bytes:
    """Return one serialized ``Features.feature`` map entry, field tag included.

    Concatenated entries wrapped by :func:`wrap_feature_entries` form an ``Example``; this lets
    writers precompute entries shared by many examples (the generator does so).

    Parameters
    ----------
    name : str
        Feature name.
    value : Feature, bytes, str, int, float or a non-empty list of one of those
        The feature; plain values are coerced as in :func:`serialize_example`.

    Returns
    -------
    bytes
        The encoded map entry.
    """
    entry = _len_field(1, name.encode("utf-8")) + _len_field(
        2, _encode_feature(_as_feature(name, value))
    )
    return _len_field(1, entry)


_KEYS: dict[str, bytes] = {}


def bytes_entry(name: str, value: bytes) -> bytes:
    """Fast path of :func:`feature_entry` for a ``bytes_list`` holding the single ``value``."""
    key = _KEYS.get(name)
    if key is None:
        raw = name.encode("utf-8")
        key = _KEYS.setdefault(name, b"\x0a" + _encode_varint(len(raw)) + raw)
    n = len(value)
    table = _VARINTS
    if n + len(key) + 16 >= len(table):
        return feature_entry(name, Feature(BYTES_LIST, (value,)))
    ln = table[n]
    bl = 1 + len(ln) + n  # BytesList
    lbl = table[bl]
    feat = 1 + len(lbl) + bl  # Feature
    lfeat = table[feat]
    entry = len(key) + 1 + len(lfeat) + feat
    return b"".join((b"\x0a", table[entry], key, b"\x12", lfeat, b"\x0a", lbl, b"\x0a", ln, value))


def wrap_feature_entries(entries: bytes) -> bytes:
    """Wrap concatenated :func:`feature_entry` outputs into a serialized ``Example``."""
    return _len_field(1, entries)


def serialize_example(features: Mapping[str, object]) -> bytes:
    """Serialize a ``tf.train.Example``.

    Parameters
    ----------
    features : mapping of str to value
        Each value is a :class:`Feature`, or is coerced: ``bytes``/``str`` (and lists of them)
        become ``bytes_list``, ``int`` become ``int64_list``, ``float`` become ``float_list``.

    Returns
    -------
    bytes
        The serialized message (map entries in the mapping's order).
    """
    return wrap_feature_entries(b"".join(feature_entry(k, v) for k, v in features.items()))
