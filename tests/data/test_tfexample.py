import pickle
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from so_fixtures import ex, proto_example_class

from fedprivopt.data.stackoverflow import decode_example, encode_example
from fedprivopt.data.tfexample import (
    Feature,
    ProtoDecodeError,
    bytes_feature,
    float_feature,
    int64_feature,
    parse_example,
)
from fedprivopt.data.tfexample_encode import (
    bytes_entry,
    feature_entry,
    serialize_example,
    wrap_feature_entries,
)

ExampleProto = proto_example_class()
needs_protobuf = pytest.mark.skipif(ExampleProto is None, reason="protobuf not installed")


def _varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _ld(field, payload):  # length-delimited field
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _entry(name, feature_payload):
    return _ld(1, _ld(1, name.encode()) + _ld(2, feature_payload))


def test_round_trip_all_kinds():
    features = {
        "b": bytes_feature([b"", b"x" * 300, "ü"]),
        "f": float_feature([0.5, -1.25, 3e38]),
        "i": int64_feature([0, 1, -1, 2**63 - 1, -(2**63), 300]),
        "empty_b": bytes_feature([]),
        "empty_i": int64_feature([]),
    }
    out = parse_example(serialize_example(features))
    assert out["b"] == Feature("bytes_list", (b"", b"x" * 300, "ü".encode()))
    assert out["f"].kind == "float_list" and out["f"].values == (
        0.5,
        -1.25,
        struct.unpack("<f", struct.pack("<f", 3e38))[0],
    )
    assert out["i"] == features["i"]
    assert out["empty_b"] == Feature("bytes_list", ())
    assert out["empty_i"] == Feature("int64_list", ())
    assert list(out) == list(features)


def test_plain_values_are_coerced():
    out = parse_example(serialize_example({"s": "abc", "n": -5, "x": 1.5, "l": [1, 2]}))
    assert out == {
        "s": Feature("bytes_list", (b"abc",)),
        "n": Feature("int64_list", (-5,)),
        "x": Feature("float_list", (1.5,)),
        "l": Feature("int64_list", (1, 2)),
    }
    with pytest.raises(TypeError, match="ambiguous"):
        serialize_example({"e": []})
    with pytest.raises(TypeError, match="bool"):
        serialize_example({"e": True})
    with pytest.raises(ValueError, match="outside"):
        int64_feature([2**63])


def test_unpacked_scalars_are_accepted():
    ints = b"".join(_varint(1 << 3 | 0) + _varint(v) for v in (7, -3))
    floats = b"".join(_varint(1 << 3 | 5) + struct.pack("<f", v) for v in (1.5, -2.0))
    data = _ld(1, _entry("i", _ld(3, ints)) + _entry("f", _ld(2, floats)))
    assert parse_example(data) == {
        "i": Feature("int64_list", (7, -3)),
        "f": Feature("float_list", (1.5, -2.0)),
    }


def test_unknown_fields_are_skipped_at_every_level():
    unknown = (
        _varint(15 << 3 | 0)
        + _varint(99)
        + _varint(16 << 3 | 1)
        + b"\0" * 8
        + _varint(17 << 3 | 5)
        + b"\0" * 4
        + _ld(18, b"junk")
    )
    blist = _ld(1, b"v") + unknown
    feature = _ld(1, blist) + unknown
    entry = _ld(1, b"k") + unknown + _ld(2, feature)
    data = unknown + _ld(1, _ld(1, entry) + unknown) + unknown
    assert parse_example(data) == {"k": Feature("bytes_list", (b"v",))}


def test_protobuf_merge_semantics():
    # A repeated key keeps the last value; a second Features field merges; the last oneof wins.
    first = _entry("k", _ld(1, _ld(1, b"old")))
    second = _entry("k", _ld(1, _ld(1, b"new")))
    oneof = _entry("o", _ld(1, _ld(1, b"bytes")) + _ld(3, _ld(1, _varint(4))))
    data = _ld(1, first) + _ld(1, second + oneof)
    assert parse_example(data) == {
        "k": Feature("bytes_list", (b"new",)),
        "o": Feature("int64_list", (4,)),
    }
    assert parse_example(b"") == {}
    # an entry without a value reads as an empty feature
    assert parse_example(_ld(1, _ld(1, _ld(1, b"bare")))) == {"bare": Feature("bytes_list", ())}


def test_every_truncation_is_an_error():
    data = encode_example(ex("some tokens here", score=-7))
    for cut in range(1, len(data)):
        with pytest.raises(ProtoDecodeError):
            parse_example(data[:cut])


@pytest.mark.parametrize(
    "data, match",
    [
        (b"\x0b", "wire type 3"),  # start group
        (b"\x0c", "wire type 4"),
        (b"\x07", "field number 0"),
        (b"\x10" + b"\xff" * 11, "longer than 10"),
        (b"\x0a\x05\x0a\x03", "runs past"),
        (b"\x08\x01", "Example.features has wire type 0"),
        (_ld(1, _varint(1 << 3 | 0) + b"\x01"), "Features.feature has wire type 0"),
        (_ld(1, _ld(1, _varint(2 << 3 | 0) + b"\x01")), "map entry field 2"),
        (_ld(1, _ld(1, _ld(2, _varint(1 << 3 | 0) + b"\x01"))), "Feature.bytes_list"),
        (_ld(1, _entry("f", _ld(2, _ld(1, b"abc")))), "packed float"),
        (_ld(1, _entry("b", _ld(1, _varint(1 << 3 | 0) + b"\x01"))), "unexpected wire type"),
        (_ld(1, _ld(1, _ld(1, b"\xff"))), "not UTF-8"),
    ],
)
def test_malformed_messages(data, match):
    with pytest.raises(ProtoDecodeError, match=match):
        parse_example(data)
    assert issubclass(ProtoDecodeError, ValueError)


def test_stackoverflow_codec_and_schema_errors():
    e = ex("tokens here", score=-(2**40))
    assert decode_example(encode_example(e)) == e
    assert e.tag_list == ["python", "numpy"] and e.token_list == ["tokens", "here"]
    assert pickle.loads(pickle.dumps(e)) == e and ex("x", tags="").tag_list == []
    with pytest.raises(ProtoDecodeError, match="'creation_date' is missing"):
        decode_example(serialize_example({"snippets": "to be or not to be"}))
    bad = {
        "tokens": "a",
        "title": "t",
        "tags": "x",
        "creation_date": "d",
        "type": "answer",
        "score": "3",
    }
    with pytest.raises(ProtoDecodeError, match="'score' should be a int64_list"):
        decode_example(serialize_example(bad))
    bad["score"] = [1, 2]
    with pytest.raises(ProtoDecodeError, match="of 2"):
        decode_example(serialize_example(bad))
    bad["score"], bad["title"] = 1, b"\xff\xfe"
    with pytest.raises(ProtoDecodeError, match="'title' is not valid UTF-8"):
        decode_example(serialize_example(bad))


def test_fast_entry_matches_general_encoder():
    for n in (0, 1, 127, 128, 16383, 16384, 70000):
        for name in ("tokens", "k" * 200):
            value = bytes(range(256)) * (n // 256) + b"z" * (n % 256)
            assert bytes_entry(name, value) == feature_entry(name, bytes_feature([value]))
            assert parse_example(wrap_feature_entries(bytes_entry(name, value))) == {
                name: Feature("bytes_list", (value,))
            }


# ---- cross-checks against the protobuf runtime (a tf.train.Example descriptor) ----

_names = st.text(min_size=0, max_size=12)
_feature = st.one_of(
    st.lists(st.binary(max_size=300), max_size=4).map(bytes_feature),
    st.lists(st.floats(width=32, allow_nan=False), max_size=4).map(float_feature),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4).map(int64_feature),
)


def _to_proto(features):
    msg = ExampleProto()
    for name, f in features.items():
        sub = getattr(msg.features.feature[name], f.kind)
        sub.SetInParent()
        sub.value.extend(f.values)
    return msg


def _from_proto(msg):
    out = {}
    for name, f in msg.features.feature.items():
        kind = f.WhichOneof("kind") or "bytes_list"
        out[name] = Feature(kind, tuple(getattr(f, kind).value))
    return out


@needs_protobuf
@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_names, _feature, max_size=6))
def test_matches_protobuf_both_ways(features):
    ours = serialize_example(features)
    assert _from_proto(ExampleProto.FromString(ours)) == features
    theirs = _to_proto(features).SerializeToString()
    assert parse_example(theirs) == features


@needs_protobuf
def test_decodes_protobuf_unpacked_and_reordered():
    msg = _to_proto({"i": int64_feature([1, -2]), "s": bytes_feature([b"a"])})
    assert parse_example(msg.SerializeToString(deterministic=True)) == {
        "i": Feature("int64_list", (1, -2)),
        "s": Feature("bytes_list", (b"a",)),
    }
