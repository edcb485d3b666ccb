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
  (its configuration in :mod:`~fedprivopt.data.synthetic_config`, its directory's files and
  marker in :mod:`~fedprivopt.data.synthetic_files`, its generative model in
  :mod:`~fedprivopt.data.synthetic_model`).
* :mod:`~fedprivopt.data.summary`: per-split users and examples (``fedprivopt data info``).
"""

from fedprivopt.core.lazy import lazy_package

__all__ = lazy_package(
    __name__,
    {
        "hdf5": (
            "HDF5Split",
            "open_hdf5",
            "write_hdf5",
        ),
        "loader": ("open_split",),
        "sqlite": (
            "SQLiteSplit",
            "create_client_index",
            "list_splits",
            "read_example_counts",
            "write_sqlite",
        ),
        "sqlite_lzma": (
            "decompress_lzma",
            "open_sqlite",
        ),
        "stackoverflow": (
            "FEATURES",
            "SPLITS",
            "ClientSplit",
            "StackOverflowExample",
            "decode_example",
            "encode_example",
        ),
        "summary": (
            "SplitSummary",
            "format_summary",
            "summarize_split",
            "summarize_sqlite",
        ),
        "synthetic": (
            "ensure_synthetic",
            "generate",
        ),
        "synthetic_config": ("SyntheticConfig",),
        "synthetic_files": ("SyntheticFiles",),
        "tfexample": (
            "ProtoDecodeError",
            "parse_example",
        ),
        "tfexample_encode": ("serialize_example",),
        "vocab": (
            "Vocabulary",
            "read_tag_counts",
            "read_word_counts",
        ),
    },
)
