"""The protobuf (C) fast path decodes exactly what the pure-Python reader decodes, or refuses."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivopt.data.fast_example import text_fields_decoder
from fedprivopt.data.stackoverflow import StackOverflowExample, decode_example, encode_example
from fedprivopt.data.tfexample_encode import bytes_entry, serialize_example, wrap_feature_entries

decode = text_fields_decoder()
pytestmark = pytest.mark.skipif(decode is None, reason="protobuf not installed")

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(_text, _text, _text, _text, st.integers(-(2**63), 2**63 - 1), _text)
def test_fast_path_matches_the_reference_decoder(tokens, title, tags, date, score, kind):
    ex = StackOverflowExample(
        tokens=tokens, title=title, tags=tags, creation_date=date, score=score, type=kind
    )
    blob = encode_example(ex)
    ref = decode_example(blob)
    assert decode(blob) == (ref.tokens, ref.title, ref.tags)


@pytest.mark.parametrize(
    "blob",
    [
        b"\xff\xff\xff",  # not a message
        serialize_example({}),  # no features at all
        wrap_feature_entries(bytes_entry("tokens", b"a")),  # features missing
        wrap_feature_entries(
            b"".join(
                [
                    bytes_entry("tokens", b"a"),
                    bytes_entry("title", b""),
                    bytes_entry("tags", b""),
                    bytes_entry("creation_date", b""),
                    bytes_entry("type", b""),
                    bytes_entry("score", b"1"),  # wrong kind
                ]
            )
        ),
        wrap_feature_entries(
            b"".join(
                bytes_entry(name, b"\xff" if name == "type" else b"1")  # invalid UTF-8 text
                for name in ("tokens", "title", "tags", "creation_date", "type")
            )
        ),
    ],
)
def test_the_fast_path_refuses_what_the_reference_refuses(blob):
    with pytest.raises(ValueError):
        decode_example(blob)
    with pytest.raises(Exception):  # noqa: B017 - any refusal sends the caller to the reference
        decode(blob)


def test_tag_task_reads_the_same_users_through_either_path(tmp_path):
    from fedprivopt.models import StackOverflowTagTask

    task = StackOverflowTagTask(
        data_dir=str(tmp_path), synth_clients=40, synth_vocab=200, synth_tags=8, num_tags=6,
        max_examples_per_user=5,
    )  # fmt: skip
    for cid in task.client_ids[:15]:
        fast = task._read_train_user(cid)
        reference = task._encode(task._train.client_examples(cid))
        assert fast == reference
