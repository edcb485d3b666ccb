"""Issue 15, thirty-seventh hostile review (data layer): regression tests of its findings.

1. ``data info D`` of a dataset whose users are in several splits (TFF's test users are
   training users too; ``data synth`` draws them so): ``data synth --out D --clients 50000``
   said ``wrote … (50,000 users …)`` and ``data info D`` then said ``total 65,527`` clients
   (of TFF's 342,477 users it would say 585,323): the total row summed the splits' client
   counts, counting a user once for each split. The total is now the number of distinct
   clients of ``client_metadata`` (``data.sqlite.count_distinct_clients``, counted by SQLite
   in bounded memory), and the total's row (still the last line) says after its cells that a
   client in several splits is in each split's row, with the rows' sum. ``format_summary``
   without ``distinct_clients`` (the Python API, an HDF5 split's single row) keeps the sum.
2. A token store (``task-params.token-cache = true``) one of whose ``.npy`` files is empty (a
   crash or a full disk while the store was copied to a share, ``: > tokens.npy``): ``simulate``
   ended in numpy's ``EOFError: No data left in file`` traceback (a file cut anywhere else was
   rebuilt). ``EncodedUsers`` now takes it as a damaged store, which is rebuilt under its lock.
3. The presets' own recipe for another dataset, ``simulate stackoverflow-tp.toml --set
   task-params.data-dir=D --set task-params.synthetic=false`` (``--set population=…``), where
   ``D`` holds a synthetic dataset of another size (``data synth --out D --clients 50000``, the
   large dataset a scaling test builds): rc 2, ``task-params.synth-clients=10000, but D holds a
   synthetic dataset generated with num_clients=50000; use another data_dir``: the preset's
   ``synth-*`` keys, which only say what to generate, were compared with ``D``'s marker although
   nothing is generated, and ``--set task-params.synth-clients=`` cannot remove them. With
   ``synthetic = false`` the files are now read as they are (an interrupted generation is still
   refused).
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
    assert lines[-1].split()[:3] == ["total", "4", "6"]  # 4 users, 6 examples (said 6 clients)
    assert lines[-1].endswith("(distinct clients; the split rows count 6)")


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


def test_3_synthetic_false_reads_a_synthetic_dataset_of_other_parameters(tmp_path):
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    d = tmp_path / "d"
    synth = ["data", "synth", "--out", str(d), "--clients", "12", "--vocab", "200"]
    assert main([*synth, "--tags", "10", "--workers", "1"]) == 0
    kw = dict(data_dir=d, vocab_size=50, num_tags=5, num_users=5, eval_users=5)
    other = dict(synth_clients=500, synth_vocab=4000, synth_tags=100, synth_seed=0)  # the mini's
    with pytest.raises(ValueError, match="synth_clients=500, but"):
        StackOverflowTagTask(synthetic=True, **other, **kw)  # would generate: refused, as before
    # was: ValueError "synth_clients=500, but ... generated with num_clients=12"
    assert StackOverflowTagTask(synthetic=False, **other, **kw).num_users == 5
