"""Issue 15, thirty-seventh hostile review (data layer): regression tests of its findings.

1. ``data info D`` of a dataset whose users are in several splits (TFF's test users are
   training users too; ``data synth`` draws them so): ``data synth --out D --clients 50000``
   said ``wrote … (50,000 users …)`` and ``data info D`` then said ``total 65,527`` clients
   (of TFF's 342,477 users it would say 585,323): the total row summed the splits' client
   counts, counting a user once for each split. The total is now the number of distinct
   clients of ``client_metadata`` (``data.sqlite.count_distinct_clients``, counted by SQLite
   in bounded memory), and a line under the table says that a client in several splits is in
   each split's row, with the rows' sum. ``format_summary`` without ``distinct_clients`` (the
   Python API, an HDF5 split's single row) keeps the sum.
2. A token store (``task-params.token-cache = true``) one of whose ``.npy`` files is empty (a
   crash or a full disk while the store was copied to a share, ``: > tokens.npy``): ``simulate``
   ended in numpy's ``EOFError: No data left in file`` traceback (a file cut anywhere else was
   rebuilt). ``EncodedUsers`` now takes it as a damaged store, which is rebuilt under its lock.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedprivopt.cli import main
from fedprivopt.data.sqlite import count_distinct_clients, write_sqlite
from fedprivopt.data.stackoverflow import StackOverflowExample, encode_example
from fedprivopt.data.token_cache import open_or_build


def _example(text: str) -> bytes:
    return encode_example(
        StackOverflowExample(text, "t", "python", "2010-01-08 09:34:05 UTC", 1, "question")
    )


def test_1_data_info_counts_a_user_of_several_splits_once(tmp_path, capsys):
    users = {"train": ["1", "2", "3"], "heldout": ["4"], "test": ["1", "3"]}
    rows = [(s, c, _example(f"post of {c}")) for s, ids in users.items() for c in ids]
    meta = [(c, s, 1) for s, ids in users.items() for c in ids]
    path = write_sqlite(tmp_path / "stackoverflow.sqlite", rows, meta)
    assert count_distinct_clients(path) == 4
    assert main(["data", "info", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    total = next(line for line in lines if line.startswith("total"))
    assert total.split() == ["total", "4", "6"]  # 4 users, 6 examples (it said 6 clients)
    assert "4 distinct clients" in lines[-1] and "6 in all" in lines[-1]


@pytest.mark.parametrize("name", ["tokens.npy", "users.npy", "labels.npy"])
def test_2_a_store_file_of_zero_bytes_is_rebuilt(tmp_path, name):
    def encode(user: int):
        return [[user, user + 1], [2]], [[0], [1, 2]]

    args = {"multi_label": True, "token_bound": 10, "label_bound": 3, "workers": 1}
    store = open_or_build(tmp_path, {"k": 1}, 3, encode, **args)
    before = [[np.array(a) for a in store.user(u)] for u in range(3)]  # copies of the maps
    directory = store.directory
    del store
    (directory / name).write_bytes(b"")  # a crash before the data reached the disk
    # was EOFError: No data left in file (numpy), a traceback out of `simulate`, rc 1
    again = open_or_build(tmp_path, {"k": 1}, 3, encode, **args)
    for old, new in zip(before, [again.user(u) for u in range(3)], strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(old, new, strict=True))
