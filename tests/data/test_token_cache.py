"""The memory-mapped encoded-user store: round trips, reuse, damage, workers, errors."""

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from fedprivopt.data.token_cache import EncodedUsers, cache_key_digest, open_or_build


def _users(n, vocab=40_000, seed=0):
    """Ragged word-id lists and label lists per user (some users and examples empty)."""
    rng = np.random.default_rng(seed)
    out = []
    for u in range(n):
        examples = 0 if u % 7 == 3 else int(rng.integers(1, 6))
        words = [list(rng.integers(0, vocab, int(rng.integers(0, 9)))) for _ in range(examples)]
        tags = [sorted(set(rng.integers(0, 30, int(rng.integers(0, 4))).tolist())) for _ in words]
        out.append(([list(map(int, w)) for w in words], tags))
    return out


class Counting:
    def __init__(self, data, single=False):
        self.data, self.single, self.calls = data, single, 0

    def __call__(self, u):
        self.calls += 1
        words, tags = self.data[u]
        if self.single:
            return words, [t[0] if t else 0 for t in tags]
        return words, tags


def _build(root, data, *, single=False, key=None, workers=1, bound=40_001):
    enc = Counting(data, single)
    store = open_or_build(
        root, key or {"k": 1}, len(data), enc, multi_label=not single,
        token_bound=bound, label_bound=30, workers=workers,
    )  # fmt: skip
    return store, enc


@pytest.mark.parametrize("single", [False, True])
def test_every_user_round_trips(tmp_path, single):
    data = _users(50)
    store, enc = _build(tmp_path, data, single=single)
    assert enc.calls == 50 and store.num_users == 50
    for u, (words, tags) in enumerate(data):
        tokens, lengths, labels, label_lengths = store.user(u)
        assert lengths.tolist() == [len(w) for w in words]
        assert tokens.tolist() == [t for w in words for t in w]
        if single:
            assert label_lengths is None
            assert labels.tolist() == [t[0] if t else 0 for t in tags]
        else:
            assert label_lengths.tolist() == [len(t) for t in tags]
            assert labels.tolist() == [t for ts in tags for t in ts]


def test_ids_are_stored_in_the_smallest_dtype_that_holds_them(tmp_path):
    small, _ = _build(tmp_path / "a", _users(5, vocab=100), bound=101)
    wide, _ = _build(tmp_path / "b", _users(5), bound=40_001)
    assert small.user(0)[0].dtype == np.int16
    assert wide.user(0)[0].dtype == np.int32


def test_a_store_is_reused_and_keys_are_kept_apart(tmp_path):
    data = _users(20)
    first, _ = _build(tmp_path, data)
    again, enc = _build(tmp_path, data)
    assert enc.calls == 0  # opened, not rebuilt
    assert again.directory == first.directory == tmp_path / cache_key_digest({"k": 1})
    other, enc = _build(tmp_path, data, key={"k": 2})
    assert enc.calls == 20 and other.directory != first.directory


def test_forked_workers_build_the_same_store(tmp_path):
    data = _users(300, seed=4)
    one, _ = _build(tmp_path / "one", data, workers=1)
    two, _ = _build(tmp_path / "two", data, workers=2)
    for name in ("users", "token_ptr", "tokens", "label_ptr", "labels"):
        a = np.load(one.directory / f"{name}.npy")
        b = np.load(two.directory / f"{name}.npy")
        assert a.dtype == b.dtype and np.array_equal(a, b), name


@pytest.mark.parametrize("damage", ["truncate", "meta", "delete"])
def test_a_damaged_store_is_detected_and_rebuilt(tmp_path, damage):
    data = _users(30)
    store, _ = _build(tmp_path, data)
    target = store.directory
    if damage == "truncate":
        path = target / "tokens.npy"
        path.write_bytes(path.read_bytes()[:-8])
    elif damage == "meta":
        meta = json.loads((target / "meta.json").read_text())
        meta["num_examples"] += 1
        (target / "meta.json").write_text(json.dumps(meta))
    else:
        (target / "users.npy").unlink()
    with pytest.raises(ValueError, match=str(target.name)):
        EncodedUsers(target)
    rebuilt, enc = _build(tmp_path, data)
    assert enc.calls == 30
    assert rebuilt.user(29)[0].tolist() == [t for w in data[29][0] for t in w]


def test_an_encoder_error_propagates_and_writes_nothing(tmp_path):
    def broken(u):
        if u == 7:
            raise ValueError("user 7 is corrupt")
        return [[1]], [[0]]

    with pytest.raises(ValueError, match="user 7 is corrupt"):
        open_or_build(
            tmp_path, {"k": 1}, 10, broken, multi_label=True, token_bound=5, label_bound=5,
            workers=1,
        )  # fmt: skip
    assert not (tmp_path / cache_key_digest({"k": 1})).exists()
    assert not list(tmp_path.glob("*.tmp-*"))


def test_bad_arguments_and_users(tmp_path):
    store, _ = _build(tmp_path, _users(3))
    with pytest.raises(ValueError, match=r"user_id must be an integer in \[0, 3\)"):
        store.user(3)
    with pytest.raises(ValueError, match="num_users must be an integer >= 0"):
        open_or_build(tmp_path, {}, -1, len, multi_label=True, token_bound=2, label_bound=2)
    with pytest.raises(ValueError, match="labels"):
        open_or_build(
            tmp_path, {"x": 1}, 1, lambda u: ([[1], [2]], [[0]]), multi_label=True,
            token_bound=5, label_bound=5, workers=1,
        )  # fmt: skip


def test_pickles_by_path(tmp_path):
    store, _ = _build(tmp_path, _users(10))
    copy = pickle.loads(pickle.dumps(store))
    assert len(pickle.dumps(store)) < 1000  # the path, not the arrays
    for u in range(10):
        assert all(
            (a is None and b is None) or np.array_equal(a, b)
            for a, b in zip(store.user(u), copy.user(u), strict=True)
        )


@pytest.mark.parametrize("damage", ["id", "offsets", "label"])
def test_damage_inside_the_arrays_is_caught_per_user(tmp_path, damage):
    data = _users(12, vocab=100)
    store, _ = _build(tmp_path, data, bound=101)
    name, value = {"id": ("tokens", 101), "offsets": ("token_ptr", None), "label": ("labels", 30)}[
        damage
    ]
    array = np.load(store.directory / f"{name}.npy")
    user = 5  # has examples (users 3 and 10 are empty)
    users = np.load(store.directory / "users.npy")
    e0, e1 = int(users[user]), int(users[user + 1])
    if damage == "offsets":
        array[e0 + 1] = array[e0] - 1  # a negative length
    else:
        ptr = np.load(store.directory / ("token_ptr.npy" if name == "tokens" else "label_ptr.npy"))
        assert ptr[e1] > ptr[e0]  # the user holds ids of this kind
        array[ptr[e0]] = value
    np.save(store.directory / f"{name}.npy", array)
    damaged = EncodedUsers(store.directory)  # sizes and ends still agree
    with pytest.raises(ValueError, match=f"damaged encoded-user store: user {user}"):
        damaged.user(user)
    damaged.user(0)  # the other users still read
    everything = [np.arange(len(data[u][0])) for u in (0, user)]
    with pytest.raises(ValueError, match="damaged encoded-user store"):
        damaged.gather([0, user], everything)
    damaged.gather([0, 1], [np.arange(len(data[u][0])) for u in (0, 1)])


@pytest.mark.parametrize("single", [False, True])
def test_gather_reads_the_picked_examples_of_many_users_at_once(tmp_path, single):
    data = _users(30)
    store, _ = _build(tmp_path, data, single=single)
    rng = np.random.default_rng(4)
    users = [7, 3, 0, 12, 7, 29]  # any order, an empty user (3), a repeated one
    counts = store.example_counts(users)
    assert counts.tolist() == [len(data[u][0]) for u in users]
    picks = [rng.permutation(int(n))[: max(0, int(n) - 1)] for n in counts]
    tokens, lengths, labels, label_lengths = store.gather(users, picks)
    want_tokens, want_lengths, want_labels, want_label_lengths = [], [], [], []
    for user, pick in zip(users, picks, strict=True):
        t, ln, lab, lab_ln = store.user(user)
        starts = np.cumsum(ln) - ln
        for p in pick:
            want_tokens += t[starts[p] : starts[p] + ln[p]].tolist()
            want_lengths.append(int(ln[p]))
            if single:
                want_labels.append(int(lab[p]))
            else:
                lstart = int(np.sum(lab_ln[:p]))
                want_labels += lab[lstart : lstart + lab_ln[p]].tolist()
                want_label_lengths.append(int(lab_ln[p]))
    assert tokens.tolist() == want_tokens and lengths.tolist() == want_lengths
    assert labels.tolist() == want_labels
    assert label_lengths is None if single else label_lengths.tolist() == want_label_lengths
    with pytest.raises(ValueError, match="outside its user's examples"):
        store.gather([0], [np.array([len(data[0][0])])])
    with pytest.raises(ValueError, match=r"users must be in \[0, 30\)"):
        store.gather([30], [np.array([0])])
    with pytest.raises(ValueError, match="one array of picks per user"):
        store.gather([0, 1], [np.array([0])])


def test_workers_end_even_under_a_sigterm_handler_that_does_not_exit(tmp_path):
    """Regression: a forked worker inherited such a handler (Flower leaves one installed after an
    in-process simulation) and the pool's terminate() then waited for it forever."""
    import os
    import signal
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import signal, sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from fedprivopt.data.token_cache import open_or_build
        signal.signal(signal.SIGTERM, lambda *a: None)  # does not end the process

        def encode(u):
            time.sleep(0.001)
            return [[u % 50, 1]], [[0]]

        for key in range(10):  # before the fix, 2 of 3 runs of this loop hung
            store = open_or_build({str(tmp_path)!r}, {{"k": key}}, 1000, encode,
                                  multi_label=True, token_bound=51, label_bound=1, workers=2)
        print(store.num_users)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        out, _ = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        pytest.fail("building the store with forked workers hung")
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == 0 and out.split() == [b"1000"]
