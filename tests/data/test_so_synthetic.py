import collections
import dataclasses
import hashlib
import json

import numpy as np
import pytest

from fedprivopt.data.sqlite import SQLiteSplit, read_example_counts
from fedprivopt.data.synthetic import ensure_synthetic, generate
from fedprivopt.data.synthetic_config import SyntheticConfig, user_size_knobs
from fedprivopt.data.synthetic_files import SyntheticFiles
from fedprivopt.data.synthetic_model import _examples_per_user, truncated_lognormal_mu
from fedprivopt.data.vocab import read_tag_counts, read_word_counts


def _digests(files: SyntheticFiles):
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (files.sqlite, files.word_count, files.tag_count, files.meta)
    }


def _all_examples(path, split):
    sp = SQLiteSplit(path, split)
    return {c: sp.client_examples(c) for c in sp.client_ids}


@pytest.fixture(scope="module")
def tiny_data(tiny_synthetic):
    return {s: _all_examples(tiny_synthetic.sqlite, s) for s in ("train", "heldout", "test")}


# ---- configuration ----


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("num_clients", 0, r"num_clients must be an integer >= 1"),
        ("num_clients", 2.5, r"num_clients must be an integer"),
        ("num_clients", True, r"num_clients must be an integer"),
        ("vocab_size", 100, r"vocab_size must be an integer >= 8000"),  # 2 * 500 tags * 8 words
        # issue 15: no upper bounds (10**9 words grew to 6.4 GB; huge tags blamed vocab_size)
        ("vocab_size", 10**9, r"vocab_size must be at most 10000000"),
        ("num_tags", 10**14, r"num_tags must be at most 10000"),
        ("words_per_tag", 10**14, r"words_per_tag must be an integer in \[1, 5000000\]"),
        ("seed", -1, r"seed must be an integer >= 0"),
        ("word_zipf", 0.0, r"word_zipf must be a finite number in \(0, 5\]"),
        ("tag_zipf", -0.1, r"tag_zipf must be a finite number in \[0, 5\]"),
        ("informative_fraction", 1.5, r"informative_fraction must be a finite number in \[0, 1\]"),
        ("informative_fraction", float("nan"), r"informative_fraction"),
        ("examples_sigma", 9.0, r"examples_sigma"),
        ("mean_examples_per_client", 0.5, r"mean_examples_per_client"),
        ("max_examples_per_client", 0, r"max_examples_per_client must be an integer >= 1"),
        ("tags_per_client", 600.0, r"tags_per_client must be a finite number in \[1, 500\]"),
        ("client_focus", -1.0, r"client_focus"),
        ("heldout_modulus", -1, r"heldout_modulus must be an integer >= 0"),
        ("cut_date", "2030-01-01", r"cut_date must be in \[start_date, end_date\]"),
        ("end_date", "2000-01-01", r"start_date must be before end_date"),
        ("start_date", "yesterday", r"start_date must be an ISO date"),
        ("activity_years", 0.0, r"activity_years"),
    ],
)
def test_config_validation(field, value, match):
    kwargs = {"num_tags": 500, "words_per_tag": 8} if field == "vocab_size" else {}
    with pytest.raises(ValueError, match=match):
        SyntheticConfig(**{**kwargs, field: value})


def test_config_is_frozen_and_keyword_only():
    cfg = SyntheticConfig.tiny(seed=3)
    assert cfg.num_clients == 300 and cfg.seed == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 4
    with pytest.raises(TypeError):
        SyntheticConfig(100)


# ---- determinism ----


def test_same_seed_same_bytes(tmp_path, tiny_synthetic):
    again = generate(tmp_path / "again", SyntheticConfig.tiny())
    assert _digests(again) == _digests(tiny_synthetic)
    other = generate(tmp_path / "other", SyntheticConfig.tiny(seed=1))
    assert _digests(other)[other.sqlite.name] != _digests(tiny_synthetic)[other.sqlite.name]


def test_generate_refuses_a_marker_file_it_did_not_write(tmp_path):
    """Issue 15: a stranger's ``stackoverflow.synthetic.json`` was replaced without overwrite."""
    marker = tmp_path / "stackoverflow.synthetic.json"
    for text in ("not JSON\n", '{"generator": "someone else"}\n'):
        marker.write_text(text)
        with pytest.raises(ValueError, match=r"stackoverflow\.synthetic\.json.*--overwrite"):
            generate(tmp_path, SyntheticConfig.tiny(num_clients=5))
        assert marker.read_text() == text
    generate(tmp_path, SyntheticConfig.tiny(num_clients=5), overwrite=True)  # asked: replaced
    assert json.loads(marker.read_text())["generator"] == "fedprivopt.data.synthetic"


def test_generate_refuses_to_overwrite_and_ensure_reuses(tmp_path):
    cfg = SyntheticConfig.tiny(num_clients=40)
    files = ensure_synthetic(tmp_path, cfg)
    with pytest.raises(FileExistsError):
        generate(tmp_path, cfg)
    stamp = files.sqlite.stat().st_mtime_ns
    assert ensure_synthetic(tmp_path, cfg) == files
    assert files.sqlite.stat().st_mtime_ns == stamp
    ensure_synthetic(tmp_path, dataclasses.replace(cfg, seed=9))
    assert json.loads(files.meta.read_text())["config"]["seed"] == 9


# ---- the files, read back by the readers ----


def test_round_trip_and_metadata(tiny_synthetic, tiny_data):
    meta = json.loads(tiny_synthetic.meta.read_text())
    counts = read_example_counts(tiny_synthetic.sqlite)
    for split, clients in tiny_data.items():
        sp = SQLiteSplit(tiny_synthetic.sqlite, split)
        assert sp.indexed
        assert all(sp.num_examples(c) == len(v) for c, v in clients.items())
        assert sum(map(len, clients.values())) == counts[split].sum() == meta["examples"][split]
        assert len(clients) == meta["clients"][split]
    assert sum(len(c) for c in tiny_data.values()) > 300  # users appear in several splits
    for clients in tiny_data.values():
        for examples in clients.values():
            for e in examples:
                assert 1 <= len(e.tag_list) <= 5 and len(set(e.tag_list)) == len(e.tag_list)
                assert e.type in ("question", "answer") and e.token_list and e.title
                assert e.creation_date.endswith(" UTC") and isinstance(e.score, int)


def test_splits_follow_the_real_rule(tiny_data):
    heldout, train, test = (set(tiny_data[s]) for s in ("heldout", "train", "test"))
    assert heldout and all(int(c) % 10 == 0 for c in heldout)
    assert not heldout & (train | test) and train & test
    assert all(int(c) % 10 != 0 for c in train | test)
    assert max(e.creation_date for v in tiny_data["train"].values() for e in v) < "2018-01-01"
    assert min(e.creation_date for v in tiny_data["test"].values() for e in v) >= "2018-01-01"
    for v in tiny_data["train"].values():  # chronological within a client
        assert [e.creation_date for e in v] == sorted(e.creation_date for e in v)


def test_vocab_files_count_distinct_training_users(tiny_synthetic, tiny_data):
    words, tags = collections.Counter(), collections.Counter()
    for examples in tiny_data["train"].values():
        words.update({w for e in examples for w in e.token_list})
        tags.update({t for e in examples for t in e.tag_list})
    wc, tc = read_word_counts(tiny_synthetic.word_count), read_tag_counts(tiny_synthetic.tag_count)
    assert wc.as_dict() == dict(words) and tc.as_dict() == dict(tags)
    assert np.all(np.diff(wc.counts) <= 0) and np.all(np.diff(tc.counts) <= 0)


def test_heavy_tailed_clients_and_non_iid_tags(tiny_synthetic, tiny_data):
    n = np.array([len(v) for v in tiny_data["train"].values()])
    assert n.max() > 5 * np.median(n) and n.mean() > 1.2 * np.median(n)
    overall, shares = collections.Counter(), []
    for examples in tiny_data["train"].values():
        mine = collections.Counter(t for e in examples for t in e.tag_list)
        overall.update(mine)
        if len(examples) >= 10:
            shares.append(sum(c for _, c in mine.most_common(3)) / sum(mine.values()))
    global_share = sum(c for _, c in overall.most_common(3)) / sum(overall.values())
    assert np.median(shares) > 0.6 > 0.4 > global_share  # users concentrate on a few tags


def test_rare_informative_words_and_uninformative_frequent_words(tiny_data, tiny_synthetic):
    """Tag-name words predict their tag; the most frequent words predict nothing."""
    examples = [e for v in tiny_data["train"].values() for e in v]
    tag_sets = [set(e.tag_list) for e in examples]
    token_sets = [set(e.token_list) for e in examples]
    wc = read_word_counts(tiny_synthetic.word_count)
    top_tags = read_tag_counts(tiny_synthetic.tag_count).items[:10]

    def precision(word, tag):
        having = [tag in t for t, w in zip(tag_sets, token_sets, strict=True) if word in w]
        return np.mean(having) if having else np.nan

    base = {tag: np.mean([tag in t for t in tag_sets]) for tag in top_tags}
    informative = [precision(tag, tag) for tag in top_tags]  # the tag's own name word
    assert np.nanmean(informative) > 0.9
    frequent = [precision(w, tag) / base[tag] for w in wc.items[:5] for tag in top_tags]
    assert 0.7 < np.mean(frequent) < 1.3  # no better than the base rate
    rank = {w: i for i, w in enumerate(wc.items)}
    assert np.median([rank[t] for t in top_tags if t in rank]) > 20


def test_several_generator_chunks(tmp_path):
    cfg = SyntheticConfig.tiny(num_clients=2100, mean_examples_per_client=3.0)  # 2 chunks
    files = generate(tmp_path, cfg)
    ids = {s: set(SQLiteSplit(files.sqlite, s).client_ids) for s in ("train", "heldout", "test")}
    assert set().union(*ids.values()) == {f"{u:08d}" for u in range(2100)}
    assert ids["heldout"] == {f"{u:08d}" for u in range(0, 2100, 10)}
    meta = json.loads(files.meta.read_text())
    assert sum(meta["examples"].values()) == sum(
        int(c.sum()) for c in read_example_counts(files.sqlite).values()
    )


# ---- issue 19: users of real size, parallel generation ----


def test_same_bytes_for_any_number_of_workers(tmp_path):
    cfg = SyntheticConfig.tiny(num_clients=4500, mean_examples_per_client=2.0)  # 3 chunks
    one = generate(tmp_path / "one", cfg, workers=1)
    three = generate(tmp_path / "three", cfg, workers=3)
    assert _digests(one) == _digests(three)
    with pytest.raises(ValueError, match=r"workers must be an integer >= 1"):
        generate(tmp_path / "zero", cfg, workers=0)
    # inside a daemonic process (a multiprocessing.Pool worker, as in sweeps) it runs serially
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(1) as pool:
        pool.apply(_generate_digests, (tmp_path / "daemon", cfg, 3))
    assert _digests(SyntheticFiles.at(tmp_path / "daemon")) == _digests(one)


def _generate_digests(out, cfg, workers):
    generate(out, cfg, workers=workers)


def test_real_user_sizes_follow_the_published_shape():
    """Conditioned on >= 100 (the real data's filter), mean 443 over all users, heavy-tailed."""
    cfg = SyntheticConfig.sized("real", num_clients=10)
    assert (cfg.mean_examples_per_client, cfg.min_examples_per_client) == (443.0, 100)
    n = _examples_per_user(cfg, 200_000, np.random.default_rng(5))
    assert n.min() == 100  # no user below the floor, and no pile-up of raised users at it
    assert (n == 100).mean() < 0.01
    assert abs(n.mean() - 443) < 5  # standard error about 1.3
    assert 240 < np.median(n) < 280 and n.max() > 10_000  # tail: TFF's "tens of thousands"
    small = _examples_per_user(SyntheticConfig(), 200_000, np.random.default_rng(5))
    assert abs(small.mean() - 40) < 1  # the default shape is unchanged


def test_truncated_mean_is_solved_exactly():
    for mean, sigma, low in ((443.0, 1.2, 100), (300.0, 1.0, 100), (5.0, 0.5, 1)):
        mu = truncated_lognormal_mu(mean, sigma, low)
        x = np.exp(np.random.default_rng(0).normal(mu, sigma, 2_000_000))
        kept = x[x >= low]
        assert abs(kept.mean() / mean - 1) < 0.02


@pytest.mark.parametrize(
    "knobs, match",
    [
        ({"truncate_below_min": 1}, r"truncate_below_min must be true or false"),
        (
            {"truncate_below_min": True, "min_examples_per_client": 50},
            r"mean_examples_per_client must be in \(min_examples_per_client",
        ),
    ],
)
def test_truncation_validation(knobs, match):
    with pytest.raises(ValueError, match=match):
        SyntheticConfig(**knobs)
    with pytest.raises(ValueError, match=r"user_sizes must be one of small, real, got 'huge'"):
        SyntheticConfig.sized("huge")


def test_real_sizes_in_a_generated_dataset(tmp_path):
    files = generate(tmp_path, SyntheticConfig.tiny(num_clients=60, **user_size_knobs("real")))
    counts = read_example_counts(files.sqlite)
    totals = collections.Counter()
    for split in ("train", "test"):
        for cid, n in zip(SQLiteSplit(files.sqlite, split).client_ids, counts[split], strict=True):
            totals[cid] += int(n)
    assert min(totals.values()) >= 100  # train + test of a user: at least the floor
    assert counts["heldout"].min() >= 100
    assert json.loads(files.meta.read_text())["config"]["truncate_below_min"] is True
