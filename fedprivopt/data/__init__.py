"""StackOverflow data: TFF file formats, vocabularies, summaries and a synthetic generator.

Readers give lazy per-client access through one interface, :class:`ClientSplit`
(``client_ids``, ``num_examples``, ``client_examples``); nothing loads a whole split.

* :mod:`~fedprivopt.data.tfexample`, :mod:`~fedprivopt.data.tfexample_encode`: ``tf.train.Example``
  decoder and encoder without TensorFlow.
* :mod:`~fedprivopt.data.stackoverflow`: :class:`StackOverflowExample`, :class:`ClientSplit`.
* :mod:`~fedprivopt.data.sqlite`: ``stackoverflow.sqlite``; :mod:`~fedprivopt.data.sqlite_lzma`:
  its ``.lzma`` download.
* :mod:`~fedprivopt.data.hdf5`: legacy ``stackoverflow_<split>.h5`` files (needs ``h5py``).
* :mod:`~fedprivopt.data.vocab`: ``stackoverflow.word_count`` / ``stackoverflow.tag_count``.
* :mod:`~fedprivopt.data.synthetic`: a StackOverflow-like generator writing the same files
  (its generative model in :mod:`~fedprivopt.data.synthetic_model`).
* :mod:`~fedprivopt.data.summary`: per-split users and examples (``fedprivopt data info``).
"""

from fedprivopt.data.hdf5 import HDF5Split, open_hdf5, write_hdf5
from fedprivopt.data.loader import open_split
from fedprivopt.data.sqlite import (
    SQLiteSplit,
    create_client_index,
    list_splits,
    read_example_counts,
    write_sqlite,
)
from fedprivopt.data.sqlite_lzma import decompress_lzma, open_sqlite
from fedprivopt.data.stackoverflow import (
    FEATURES,
    SPLITS,
    ClientSplit,
    StackOverflowExample,
    decode_example,
    encode_example,
)
from fedprivopt.data.summary import (
    SplitSummary,
    format_summary,
    summarize_split,
    summarize_sqlite,
)
from fedprivopt.data.synthetic import (
    SyntheticConfig,
    SyntheticFiles,
    ensure_synthetic,
    generate,
)
from fedprivopt.data.tfexample import ProtoDecodeError, parse_example
from fedprivopt.data.tfexample_encode import serialize_example
from fedprivopt.data.vocab import Vocabulary, read_tag_counts, read_word_counts

__all__ = [
    "FEATURES",
    "SPLITS",
    "ClientSplit",
    "HDF5Split",
    "ProtoDecodeError",
    "SQLiteSplit",
    "SplitSummary",
    "StackOverflowExample",
    "SyntheticConfig",
    "SyntheticFiles",
    "Vocabulary",
    "create_client_index",
    "decode_example",
    "decompress_lzma",
    "encode_example",
    "ensure_synthetic",
    "format_summary",
    "generate",
    "list_splits",
    "open_hdf5",
    "open_split",
    "open_sqlite",
    "parse_example",
    "read_example_counts",
    "read_tag_counts",
    "read_word_counts",
    "serialize_example",
    "summarize_split",
    "summarize_sqlite",
    "write_hdf5",
    "write_sqlite",
]
