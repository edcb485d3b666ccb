import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from fedprivopt.data import Vocabulary, read_word_counts
from fedprivopt.models import (
    StackOverflowTagTask,
    ToyClassificationTask,
    model_spec,
    token_frequency_preconditioner,
    two_level_preconditioner,
)
from fedprivopt.models.side_information import DEFAULT_SIDE_INFORMATION
from fedprivopt.models.side_information_config import (
    SideInformationSpec,
    build_side_information,
    resolve_side_information,
)
from fedprivopt.models.tag_prediction_encoding import multi_hot


def test_layout_values_and_normalizations():
    counts = np.array([99.0, 15.0, 3.0, 0.0])
    v, k = 4, 3
    raw = token_frequency_preconditioner(
        counts, vocab_size=v, num_tags=k, power=0.5, floor=1.0, normalize="none"
    )
    words = np.sqrt(counts + 1.0)  # 10, 4, 2, 1
    expected = np.concatenate([np.repeat(words, k), np.full(k, 20 * 10.0)])  # 20 x the largest
    assert raw.dtype == torch.float32 and raw.shape == (v * k + k,)
    assert torch.allclose(raw, torch.tensor(expected, dtype=torch.float32))
    # the flat layout of the (V, K) weight is row-major: word j owns [j K, (j + 1) K)
    assert torch.equal(
        raw[: v * k].view(v, k), torch.tensor(words, dtype=torch.float32)[:, None].expand(v, k)
    )
    mean = token_frequency_preconditioner(counts, vocab_size=v, num_tags=k, power=0.5)
    assert float(mean.mean()) == pytest.approx(1.0, rel=1e-6)
    assert torch.allclose(mean, raw / raw.mean())
    top = token_frequency_preconditioner(
        counts, vocab_size=v, num_tags=k, power=0.5, normalize="max"
    )
    assert float(top.max()) == 1.0
    bias_mean = token_frequency_preconditioner(
        counts, vocab_size=v, num_tags=k, power=0.5, bias="mean", bias_scale=1, normalize="none"
    )
    assert torch.allclose(bias_mean[-k:], torch.full((k,), float(words.mean())))
    fixed = token_frequency_preconditioner(
        counts, vocab_size=2, num_tags=k, bias=7.0, bias_scale=0.5, normalize="none"
    )
    assert fixed.tolist() == [100.0] * k + [16.0] * k + [3.5] * k  # p = 1, first V counts only


def test_orientation_frequent_words_get_smaller_steps():
    counts = np.array([1000.0, 100.0, 10.0, 1.0])
    a = token_frequency_preconditioner(counts, vocab_size=4, num_tags=2)
    rows = a[:8].view(4, 2)[:, 0]
    assert bool(torch.all(rows[:-1] > rows[1:]))  # A grows with the count ...
    step = 1.0 / rows  # ... so a preconditioned step (g / A) favours rare words
    assert float(step[-1] / step[0]) == pytest.approx(1001 / 2)
    assert bool(torch.all(a > 0)) and bool(torch.all(torch.isfinite(a)))


def test_accepts_vocabulary_and_tensor_and_validates():
    vocab = Vocabulary(("a", "b", "c"), np.array([5, 3, 0]))
    from_vocab = token_frequency_preconditioner(vocab, vocab_size=3, num_tags=2)
    from_tensor = token_frequency_preconditioner(torch.tensor([5, 3, 0]), vocab_size=3, num_tags=2)
    assert torch.equal(from_vocab, from_tensor)
    bad = [
        (dict(vocab_size=4), "fewer than vocab_size"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(num_tags=0), "num_tags"),
        (dict(power=0.0), "power"),
        (dict(floor=-1.0), "floor"),
        (dict(floor=0.0), "floor must be > 0"),
        (dict(normalize="sum"), "normalize"),
        (dict(bias="min"), "bias"),
        (dict(bias=-1.0), "bias"),
        (dict(bias_scale=0.0), "bias_scale"),
    ]
    for kwargs, match in bad:
        args = dict(vocab_size=3, num_tags=2)
        args.update(kwargs)
        with pytest.raises(ValueError, match=match):
            token_frequency_preconditioner(vocab, **args)
    with pytest.raises(ValueError, match="finite and >= 0"):
        token_frequency_preconditioner([1.0, -2.0], vocab_size=2, num_tags=1)
    with pytest.raises(ValueError, match="float32"):
        token_frequency_preconditioner([1e30, 1.0], vocab_size=2, num_tags=1, power=3.0)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return StackOverflowTagTask(
        data_dir=str(tmp_path_factory.mktemp("synth")),
        synth_clients=300,
        synth_vocab=600,
        synth_tags=20,
        synth_seed=3,
        vocab_size=500,
        num_tags=15,
        num_users=150,
    )


def test_task_side_information_uses_the_published_word_counts(task):
    side = task.side_information()
    assert side.shape == (model_spec(task).numel,)
    assert bool(torch.all(side > 0)) and float(side.mean()) == pytest.approx(1.0, rel=1e-5)
    counts = read_word_counts(task.word_count_path).top(task.num_features)
    assert torch.equal(
        side,
        token_frequency_preconditioner(
            counts, vocab_size=task.num_features, num_tags=task.num_tags
        ),
    )
    assert torch.equal(
        task.side_information(power=0.5, normalize="max"),
        token_frequency_preconditioner(
            counts,
            vocab_size=task.num_features,
            num_tags=task.num_tags,
            power=0.5,
            normalize="max",
        ),
    )


def test_side_information_tracks_adams_denominator(task):
    """The word values rank like sqrt(E[g^2]) of the weight rows at the initial model, the bias's
    is the largest.

    This is what AdaDPS approximates with public information: frequent words have large gradient
    second moments, rare words small ones (see the module docstring).
    """
    model = task.build_model()
    v, k = task.num_features, task.num_tags
    second = torch.zeros(v)
    bias_second = 0.0
    batches = 0
    for u in range(0, task.num_users, 3):
        x, y = task.user_data(u)
        for start in range(0, x.shape[0], 16):
            xb, yb = x[start : start + 16], y[start : start + 16]
            model.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(xb), multi_hot(yb, k))
            loss.backward()
            second += model.weight.grad.pow(2).sum(dim=1) / k
            bias_second += float(model.bias.grad.pow(2).mean())
            batches += 1
    adam = (second / batches).sqrt()
    side = task.side_information(normalize="none")[: v * k : k]
    seen = adam > 0
    rho = spearmanr(adam[seen].numpy(), side[seen].numpy()).statistic
    assert rho > 0.4  # measured 0.57: the counts count users, Adam sees occurrences
    # the bias (value 1 in every example) gets larger gradients than any word: measured 6.5x
    ratio = (bias_second / batches) ** 0.5 / float(adam.max())
    assert ratio > 3.0
    side = task.side_information(normalize="none")
    assert float(side[-1]) == pytest.approx(20 * float(side[: v * k].max()))


# -- the configurable kinds --------------------------------------------------------------------


def _resolve(spec, task, **kwargs):
    args = dict(population=task.num_users, clients_per_round=10.0, batch_size=8)
    args.update(kwargs)
    return resolve_side_information(spec, task, **args)


def test_two_level_is_the_authors_scaling_exactly():
    v, k = 6, 2
    a = two_level_preconditioner(vocab_size=v, num_tags=k, top_k=2, factor=200)
    expected = [1.0] * (2 * k) + [1 / 200] * ((v - 2) * k) + [1.0] * k  # bias untouched
    assert a.dtype == torch.float32 and a.tolist() == torch.tensor(expected).tolist()
    # dividing a gradient by A is grads[0][top_k:] *= factor, the bias unchanged
    g = torch.randn(v * k + k)
    scaled = g.clone()
    scaled[2 * k : v * k] *= 200
    torch.testing.assert_close(g / a, scaled)
    assert torch.equal(two_level_preconditioner(vocab_size=v, num_tags=k, top_k=v), torch.ones(14))
    for kwargs, match in [
        (dict(top_k=0), r"top_k must be an integer in \[1, V=6\], got 0"),
        (dict(top_k=7), r"top_k must be an integer in \[1, V=6\], got 7"),
        (dict(top_k=2, factor=0.0), "factor"),
        (dict(top_k=2, factor=float("inf")), "factor"),
    ]:
        with pytest.raises(ValueError, match=match):
            two_level_preconditioner(vocab_size=v, num_tags=k, **kwargs)


def test_token_frequency_max_ratio_caps_the_spread():
    counts = np.array([999.0, 99.0, 9.0, 0.0])
    raw = token_frequency_preconditioner(
        counts, vocab_size=4, num_tags=1, bias_scale=1.0, normalize="none", max_ratio=10.0
    )
    # words 1000, 100, 10, 1 and the bias 1000; entries raised to 1000 / 10 = 100
    assert raw.tolist() == [1000.0, 100.0, 100.0, 100.0, 1000.0]
    assert float(raw.max() / raw.min()) == pytest.approx(10.0)
    capped = token_frequency_preconditioner(counts, vocab_size=4, num_tags=3, max_ratio=50.0)
    assert float(capped.max() / capped.min()) == pytest.approx(50.0, rel=1e-6)
    assert float(capped.mean()) == pytest.approx(1.0, rel=1e-6)  # normalized after the cap
    uncapped = token_frequency_preconditioner(counts, vocab_size=4, num_tags=3)
    assert float(uncapped.max() / uncapped.min()) == pytest.approx(20_000.0)
    assert torch.equal(
        token_frequency_preconditioner(counts, vocab_size=4, num_tags=3, max_ratio=0), uncapped
    )
    for bad in (0.5, -1.0, float("inf"), "x"):
        with pytest.raises(ValueError, match="max_ratio"):
            token_frequency_preconditioner(counts, vocab_size=4, num_tags=3, max_ratio=bad)


def _direct_public_users(task, users, batch, eps, max_examples=0, max_ratio=200.0):
    """sqrt(mean g^2) / max + eps, raised to max / max_ratio, by hand over the named parameters."""
    model = task.build_model()
    sums = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in model.named_parameters()}
    count = 0
    for u in users:
        x, y = task.user_data(u)
        if max_examples:
            x, y = x[:max_examples], y[:max_examples]
        for i in range(0, x.shape[0], batch):
            model.zero_grad()
            task.loss(model, x[i : i + batch], y[i : i + batch]).backward()
            for n, p in model.named_parameters():
                sums[n] += p.grad.double() ** 2
            count += 1
    root = torch.cat([(sums[n] / count).sqrt().reshape(-1) for n in model.state_dict()])
    a = root / root.max() + eps
    if max_ratio:
        a = a.clamp(min=float(a.max()) / max_ratio)
    return a.float()


def test_public_users_equal_a_direct_computation(task):
    resolved = _resolve(
        {"kind": "public-users", "users": 3, "eps": 1e-3, "max-ratio": 0}, task, batch_size=5
    )
    assert resolved.public_users == (0, 1, 2) and resolved.private_population == 147
    side = build_side_information(resolved, task)
    assert side.shape == (model_spec(task).numel,) and side.dtype == torch.float32
    direct = _direct_public_users(task, [0, 1, 2], 5, 1e-3, max_ratio=0)
    torch.testing.assert_close(side, direct, rtol=1e-5, atol=1e-7)
    assert float(side.max()) == pytest.approx(1 + 1e-3) and float(side.min()) >= 1e-3
    # max-examples of the run limits the examples; max-ratio caps the spread
    limited = build_side_information(_resolve(resolved_spec(3), task, max_examples=4), task)
    torch.testing.assert_close(limited, _direct_public_users(task, [0, 1, 2], 8, 1e-5, 4))
    capped = build_side_information(
        _resolve({"kind": "public-users", "users": 3, "max-ratio": 100}, task), task
    )
    assert float(capped.max() / capped.min()) == pytest.approx(100.0, rel=1e-5)


def resolved_spec(users):
    return {"kind": "public-users", "users": users}


def test_public_users_work_for_any_task_and_default_to_one_percent():
    toy = ToyClassificationTask(num_users=250, seed=1)
    resolved = _resolve("public-users", toy)
    assert resolved.params == {"users": 3, "eps": 1e-5, "max-ratio": 200.0}  # ceil(1% of 250)
    side = build_side_information(resolved, toy)
    torch.testing.assert_close(side, _direct_public_users(toy, [0, 1, 2], 8, 1e-5))
    assert _resolve("public-users", ToyClassificationTask(num_users=20)).public_users == (0,)
    with pytest.raises(ValueError, match=r"side-information.users must be an integer in \[1, "):
        _resolve(resolved_spec(241), toy)  # 250 - 241 < 10 = clients-per-round


def test_every_kind_on_the_tag_task_has_the_models_layout(task):
    v, k, n = task.num_features, task.num_tags, model_spec(task).numel
    two = build_side_information(_resolve("two-level", task), task)
    assert torch.equal(two, two_level_preconditioner(vocab_size=v, num_tags=k))
    assert torch.equal(two[: 100 * k], torch.ones(100 * k))
    assert torch.equal(two[100 * k : v * k], torch.full(((v - 100) * k,), 1 / 200))
    assert torch.equal(two[v * k :], torch.ones(k))
    counts = read_word_counts(task.word_count_path).top(v)
    freq = build_side_information(
        _resolve({"kind": "token-frequency", "power": 0.5, "max-ratio": 30}, task), task
    )
    assert torch.equal(
        freq,
        token_frequency_preconditioner(counts, vocab_size=v, num_tags=k, power=0.5, max_ratio=30.0),
    )
    ones = build_side_information(_resolve("ones", task), task)
    assert torch.equal(ones, torch.ones(n))
    for side in (two, freq, ones):
        assert side.shape == (n,) and bool(torch.all(side > 0))


def test_auto_is_the_default_kind_and_ones_where_it_does_not_apply(task):
    auto = _resolve("auto", task)
    assert auto.requested == "auto" and auto.kind == DEFAULT_SIDE_INFORMATION["kind"]
    # the measured default: 1% of the users opted out, A capped at the two-level range
    assert auto.kind == "public-users"
    assert auto.params == {"users": 2, "eps": 1e-5, "max-ratio": 200.0}  # ceil(1% of 150)
    assert auto.public_users == (0, 1) and auto.note == ""
    side = build_side_information(auto, task)
    assert float(side.max() / side.min()) == pytest.approx(200.0, rel=1e-5)
    # an explicit two-level beyond a small vocabulary is refused, naming the key
    tiny = StackOverflowTagTask(data_dir=task.data_dir, vocab_size=50, num_tags=5, num_users=20)
    with pytest.raises(ValueError, match=r"top-k must be an integer in \[1, V=50\], got 100"):
        _resolve("two-level", tiny)
    # the default was measured on the tag task: elsewhere auto is ones, and says so
    toy = _resolve("auto", ToyClassificationTask(num_users=20))
    assert toy.kind == "ones" and "chosen on the bag-of-words tag task" in toy.note
    assert toy.summary()["note"] == toy.note


@pytest.mark.parametrize("kind", ["two-level", "token-frequency"])
def test_bag_of_words_kinds_refuse_another_task(kind):
    with pytest.raises(ValueError, match=r"side-information.kind = '.*public-users, ones"):
        _resolve(kind, ToyClassificationTask(num_users=20))


def test_top_k_beyond_the_vocabulary_names_the_key(task):
    with pytest.raises(
        ValueError, match=r"side-information.top-k must be an integer in \[1, V=500"
    ):
        _resolve({"kind": "two-level", "top-k": 501}, task)


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        (
            {"kind": "two-level", "top-k": 0},
            r"side-information.top-k must be an integer in \[1, V\]",
        ),
        ({"kind": "two-level", "top-k": 1.5}, "side-information.top-k"),
        ({"kind": "two-level", "top-k": True}, "side-information.top-k"),
        ({"kind": "two-level", "factor": 0}, "side-information.factor must be a finite number > 0"),
        ({"kind": "two-level", "power": 1.0}, "unknown key 'side-information.power'"),
        ({"kind": "two-level", "top_k": 10}, "unknown key 'side-information.top_k'"),
        ({"kind": "token-frequency", "power": -1}, "side-information.power"),
        ({"kind": "token-frequency", "normalize": "sum"}, "side-information.normalize"),
        ({"kind": "token-frequency", "floor": -0.1}, "side-information.floor must be"),
        ({"kind": "token-frequency", "bias": "min"}, "side-information.bias must be"),
        ({"kind": "token-frequency", "bias": 0}, "side-information.bias must be"),
        ({"kind": "token-frequency", "bias-scale": 0}, "side-information.bias-scale"),
        ({"kind": "token-frequency", "max-ratio": 0.5}, r"side-information.max-ratio must be 0"),
        ({"kind": "public-users", "users": 0}, r"side-information.users must be an integer in"),
        ({"kind": "public-users", "eps": 0}, "side-information.eps must be a finite number > 0"),
        ({"kind": "public-users", "max-ratio": "2"}, "side-information.max-ratio"),
        ({"kind": "ones", "factor": 2}, "unknown key 'side-information.factor'.*none"),
        ({"kind": "adam"}, "side-information.kind must be one of"),
        ({"top-k": 5}, "side-information.top-k needs an explicit side-information.kind"),
    ],
)
def test_bad_tables_name_the_key(table, needle):
    with pytest.raises(ValueError, match=needle):
        SideInformationSpec.parse(table)


def test_string_forms_and_round_trip():
    assert SideInformationSpec.parse("ones") == SideInformationSpec(kind="ones")
    assert (
        SideInformationSpec.parse("auto") == SideInformationSpec() == SideInformationSpec.parse({})
    )
    spec = SideInformationSpec.parse({"kind": "two-level", "factor": 50})
    assert spec.params == {"factor": 50.0} and spec.to_mapping() == {
        "kind": "two-level",
        "factor": 50.0,
    }
    assert SideInformationSpec.parse(spec.to_mapping()) == spec
    with pytest.raises(ValueError, match="side-information must be a kind"):
        SideInformationSpec.parse(3)
