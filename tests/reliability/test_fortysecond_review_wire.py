"""Issue 15, forty-second hostile review (wire: Flower messages, replies, the ClientApp): tests.

1. ``wire.read_updates(reply.content)`` (the public reader of a train reply, for a ServerApp of
   one's own) of a reply whose ``update/1`` array ``delta`` is damaged or hostile: bytes cut
   short (empty), another serialization than NumPy's (``stype`` ``torch.Tensor``), an object
   array or bytes that are no ``.npy`` file; ``DPStrategy.start`` (``check_initial_arrays``) of
   an ``initial_arrays`` record holding such an array. Before: ``EOFError: No data left in
   file``, Flower's ``TypeError: Unsupported serialization type ...`` or NumPy's own
   ``ValueError`` (``read_updates``; ``check_initial_arrays`` wrapped only the last), naming
   neither the record nor the user, where ``ValueError`` is documented (the fortieth review's
   missing ``delta`` and the forty-first's ``TrainMessage.read`` were fixed, not these). Now
   ``ValueError`` naming the record, the user and the array (``wire._readable_array``), or
   ``initial_arrays`` (``flower_arrays.check_initial_arrays``).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, RecordDict

from fedprivopt import wire as P
from fedprivopt.privacy.flat import flatten
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower_arrays import check_initial_arrays


def _object_array() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.array([object()], dtype=object), allow_pickle=True)
    return buffer.getvalue()


# -- finding 1: a damaged array is one ValueError naming where it is ------------------------------

DAMAGED = {
    "cut": Array("float32", (3,), "numpy.ndarray", b""),
    "torch stype": Array("float32", (3,), "torch.Tensor", b"abc"),
    "object array": Array("object", (1,), "numpy.ndarray", _object_array()),
    "no npy file": Array("float32", (3,), "numpy.ndarray", b"garbage"),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_1_read_updates_names_the_record_of_a_damaged_delta(name):
    content = RecordDict({"update/1": ArrayRecord({P.DELTA_ARRAY: DAMAGED[name]})})
    with pytest.raises(ValueError, match=r"record 'update/1' \(user 1\): array 'delta' cannot be"):
        P.read_updates(content)


def test_1_read_updates_reads_a_good_reply_as_before():
    content = RecordDict({"update/2": ArrayRecord({P.DELTA_ARRAY: Array(np.ones(3, np.float32))})})
    ((user, delta),) = P.read_updates(content).items()
    assert user == 2 and delta.dtype == np.float32 and delta.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_1_initial_arrays_with_a_damaged_array_are_one_value_error(name):
    flat, spec = flatten({"w": torch.zeros(3)})
    algorithm = build_algorithm(StrategyConfig(population=4, clients_per_round=2), flat)
    with pytest.raises(ValueError, match=r"^initial_arrays: "):
        check_initial_arrays(ArrayRecord({"w": DAMAGED[name]}), spec, algorithm)
