"""Helpers writing StackOverflow fixture files in the exact real layouts, at test time.

The SQLite fixture is written with raw ``sqlite3`` in TFF's DDL (not with the package's writer),
and its blobs are serialized with the real protobuf runtime when it is installed (a
``tf.train.Example`` descriptor built at test time), so the readers are checked against bytes
they did not produce.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fedprivopt.data.stackoverflow import StackOverflowExample, encode_example


def ex(
    tokens,
    tags="python|numpy",
    *,
    title="how to sum rows",
    score=3,
    type="question",
    date="2012-03-04 05:06:07 UTC",
):
    return StackOverflowExample(
        tokens=tokens, title=title, tags=tags, creation_date=date, score=score, type=type
    )


# split -> client -> examples; client ids as in the real data (zero-padded numbers).
DATA = {
    "train": {
        "00000001": [ex("how do i sum rows ?"), ex("i tried np . sum", type="answer", score=-2)],
        "00000002": [ex("use a list comprehension .", tags="python", title="lists", score=0)],
        "00000003": [
            ex(f"sentence {i} about css", tags="css|html", title="center a div", score=i)
            for i in range(7)
        ],
    },
    "heldout": {
        "00000010": [ex("held out user text", tags="java")],
    },
    "test": {
        "00000001": [ex("a later post .", date="2018-05-06 07:08:09 UTC")],
        "00000003": [ex("café unicode ✓", tags="c++|unicode", score=12345678901)],
    },
}

TFF_DDL = (
    "CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
    "serialized_example_proto BLOB NOT NULL);",
    "CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, "
    "num_examples INTEGER NOT NULL);",
)


def proto_example_class():
    """``tf.train.Example`` as a protobuf message class built from a descriptor, or None."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        return None
    fdp = descriptor_pb2.FileDescriptorProto(
        name="fpo_test_example.proto", package="tensorflow", syntax="proto3"
    )
    f = descriptor_pb2.FieldDescriptorProto
    for name, typ in (
        ("BytesList", f.TYPE_BYTES),
        ("FloatList", f.TYPE_FLOAT),
        ("Int64List", f.TYPE_INT64),
    ):
        msg = fdp.message_type.add(name=name)
        field = msg.field.add(name="value", number=1, type=typ, label=f.LABEL_REPEATED)
        if typ != f.TYPE_BYTES:
            field.options.packed = True
    feature = fdp.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, typ) in enumerate(
        (("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")), 1
    ):
        feature.field.add(
            name=name,
            number=number,
            type=f.TYPE_MESSAGE,
            label=f.LABEL_OPTIONAL,
            type_name=f".tensorflow.{typ}",
            oneof_index=0,
        )
    features = fdp.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    entry.field.add(
        name="value",
        number=2,
        type=f.TYPE_MESSAGE,
        label=f.LABEL_OPTIONAL,
        type_name=".tensorflow.Feature",
    )
    features.field.add(
        name="feature",
        number=1,
        type=f.TYPE_MESSAGE,
        label=f.LABEL_REPEATED,
        type_name=".tensorflow.Features.FeatureEntry",
    )
    example = fdp.message_type.add(name="Example")
    example.field.add(
        name="features",
        number=1,
        type=f.TYPE_MESSAGE,
        label=f.LABEL_OPTIONAL,
        type_name=".tensorflow.Features",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


_EXAMPLE_CLS = proto_example_class()


def serialize_reference(e: StackOverflowExample) -> bytes:
    """Serialize like TensorFlow would: with the protobuf runtime when available."""
    if _EXAMPLE_CLS is None:
        return encode_example(e)
    msg = _EXAMPLE_CLS()
    for name in ("tokens", "title", "tags", "creation_date", "type"):
        msg.features.feature[name].bytes_list.value.append(getattr(e, name).encode())
    msg.features.feature["score"].int64_list.value.append(e.score)
    return msg.SerializeToString()


def write_tff_sqlite(
    path: Path, data=DATA, *, index: bool = False, blob=serialize_reference
) -> Path:
    """Write ``data`` in the TFF schema with raw SQL (optionally with a client index)."""
    conn = sqlite3.connect(path)
    with conn:
        for statement in TFF_DDL:
            conn.execute(statement)
        for split, clients in data.items():
            for cid, examples in clients.items():
                conn.executemany(
                    "INSERT INTO examples VALUES (?, ?, ?)",
                    [(split, cid, blob(e)) for e in examples],
                )
                conn.execute(
                    "INSERT INTO client_metadata VALUES (?, ?, ?)", (cid, split, len(examples))
                )
        if index:
            conn.execute("CREATE INDEX idx_client ON examples (client_id, split_name)")
    conn.close()
    return path


_CHILD_READ = """
import sys
import fedprivopt.data.hdf5 as hdf5
import fedprivopt.data.hdf5_checks as hdf5_checks
if sys.argv[2]:
    hdf5_checks.PROBE_TIMEOUT_S = float(sys.argv[2])
try:
    sp = hdf5.HDF5Split(sys.argv[1])
    for cid in sp.client_ids:
        sp.client_examples(cid)
except ValueError as exc:
    print("ValueError:", exc)
else:
    print("read")
"""


def read_hdf5_in_child(path: Path, timeout: float = 60, probe_timeout: float | None = None) -> str:
    """Read every client of the HDF5 file ``path`` in a child process; its stdout.

    Prints ``read`` or ``ValueError: ...``. The test fails when the child hangs past
    ``timeout`` (it is killed by its PID, also when the test fails) or dies (a crash).
    ``probe_timeout`` sets the reader's ``PROBE_TIMEOUT_S`` in the child.
    """
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    probe = "" if probe_timeout is None else str(probe_timeout)
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD_READ, str(path), probe],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading {path.name} did not finish within {timeout} s (pid {proc.pid})")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"the reader died with {proc.returncode}: {err[-2000:]}"
    return out
