"""The StackOverflow record and the per-client split interface shared by every reader.

An example is one sentence of a question or an answer, with its question's metadata; the TFF
files hold it as a ``tf.train.Example`` with six features (all ``bytes_list`` of one value except
``score``, an ``int64_list``):

========================  ========================================================
``tokens``                the sentence, space-separated lower-cased tokens
``title``                 the question's title
``tags``                  the question's tags, ``'|'``-separated
``creation_date``         e.g. ``'2010-01-08 09:34:05 UTC'``
``score``                 the question's score (may be negative)
``type``                  ``'question'`` or ``'answer'``
========================  ========================================================

References
----------
.. [1] TensorFlow Federated, ``tff.simulation.datasets.stackoverflow.load_data``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from fedprivopt.data.tfexample import (
    BYTES_LIST,
    INT64_LIST,
    ProtoDecodeError,
    bytes_feature,
    int64_feature,
    parse_features_raw,
)
from fedprivopt.data.tfexample_encode import serialize_example

__all__ = [
    "FEATURES",
    "MAX_EXAMPLE_BYTES",
    "SPLITS",
    "ClientSplit",
    "StackOverflowExample",
    "decode_example",
    "encode_example",
    "too_large",
]

#: Feature names of a StackOverflow ``tf.train.Example``.
FEATURES = ("creation_date", "score", "tags", "title", "tokens", "type")
_TEXT_FEATURES = ("creation_date", "tags", "title", "tokens", "type")
_SCHEMA = tuple(
    (name, name.encode(), INT64_LIST if name == "score" else BYTES_LIST) for name in FEATURES
)
MAX_EXAMPLE_BYTES = 1 << 20
"""Bytes of one serialized example at most (a StackOverflow post holds at most 30,000
characters; its title 150). Thirtieth review of issue 15 (data, finding 4): decoding expands a
blob up to about 17 times (a 50 MB blob of packed ``score`` values peaked at 862 MB before its
refusal; SQLite holds blobs of up to 1 GB), so a larger one is refused before it is decoded."""
#: Split names of the TFF SQLite file (the legacy HDF5 files name the middle one ``held_out``).
SPLITS = ("train", "heldout", "test")


@dataclass(frozen=True, slots=True)
class StackOverflowExample:
    """One StackOverflow sentence with its question's metadata.

    Attributes
    ----------
    tokens : str
        Space-separated tokens of the sentence.
    title : str
        Title of the question.
    tags : str
        ``'|'``-separated tags of the question.
    creation_date : str
        Creation time of the post, e.g. ``'2010-01-08 09:34:05 UTC'``.
    score : int
        Score of the question.
    type : str
        ``'question'`` or ``'answer'``.
    """

    tokens: str
    title: str
    tags: str
    creation_date: str
    score: int
    type: str

    @property
    def token_list(self) -> list[str]:
        """The tokens as a list (split on whitespace)."""
        return self.tokens.split()

    @property
    def tag_list(self) -> list[str]:
        """The tags as a list (empty when there are none)."""
        return self.tags.split("|") if self.tags else []


def too_large(size: int) -> str:
    """The refusal of an example of ``size`` bytes, more than :data:`MAX_EXAMPLE_BYTES`."""
    return (
        f"an example of {size:,} bytes, more than {MAX_EXAMPLE_BYTES:,}, which no StackOverflow "
        "example holds (a post is at most 30,000 characters)"
    )


def decode_example(data: bytes) -> StackOverflowExample:
    """Decode a serialized StackOverflow ``tf.train.Example``.

    Parameters
    ----------
    data : bytes
        The serialized message.

    Returns
    -------
    StackOverflowExample
        The decoded record.

    Raises
    ------
    ProtoDecodeError
        If ``data`` is malformed, lacks a StackOverflow feature or holds more than
        :data:`MAX_EXAMPLE_BYTES` (a ``ValueError``).
    """
    if len(data) > MAX_EXAMPLE_BYTES:
        raise ProtoDecodeError(too_large(len(data)))
    features = parse_features_raw(data)
    fields: dict[str, object] = {}
    for name, key, kind in _SCHEMA:
        feature = features.get(key)
        if feature is None:
            found = sorted(k.decode("utf-8", "replace") for k in features)
            raise ProtoDecodeError(
                f"not a StackOverflow example: feature {name!r} is missing (found {found})"
            )
        if feature[0] != kind or len(feature[1]) != 1:
            raise ProtoDecodeError(
                f"not a StackOverflow example: feature {name!r} should be a {kind} of one "
                f"value, found a {feature[0]} of {len(feature[1])}"
            )
        value = feature[1][0]
        if kind == BYTES_LIST:
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ProtoDecodeError(f"feature {name!r} is not valid UTF-8") from exc
        fields[name] = value
    return StackOverflowExample(**fields)  # type: ignore[arg-type]


def encode_example(example: StackOverflowExample) -> bytes:
    """Serialize a :class:`StackOverflowExample` as a ``tf.train.Example``.

    Parameters
    ----------
    example : StackOverflowExample
        The record.

    Returns
    -------
    bytes
        The serialized message, features in lexicographic order.
    """
    features = {name: bytes_feature([getattr(example, name)]) for name in _TEXT_FEATURES}
    features["score"] = int64_feature([example.score])
    return serialize_example({name: features[name] for name in FEATURES})


class ClientSplit(abc.ABC):
    """One split (train, heldout or test) of a federated StackOverflow dataset.

    Readers give lazy per-client access: opening a split reads the client list and counts only,
    and :meth:`client_examples` reads one client's examples when asked.

    Attributes
    ----------
    path : pathlib.Path
        The file the split is read from.
    split : str
        The split name.
    """

    path: object
    split: str

    @property
    @abc.abstractmethod
    def client_ids(self) -> Sequence[str]:
        """Client ids of the split, in a fixed order."""

    @abc.abstractmethod
    def num_examples(self, client_id: str) -> int:
        """Return the number of examples of ``client_id``; ``KeyError`` if absent."""

    @abc.abstractmethod
    def client_examples(self, client_id: str) -> list[StackOverflowExample]:
        """Return all examples of ``client_id`` in file order; ``KeyError`` if absent."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release open file handles (reopened on next use)."""

    def __len__(self) -> int:
        return len(self.client_ids)

    def __contains__(self, client_id: object) -> bool:
        try:
            self.num_examples(client_id)  # type: ignore[arg-type]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self.client_ids)

    def __enter__(self) -> ClientSplit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}({str(self.path)!r}, split={self.split!r}, clients={len(self)})"
