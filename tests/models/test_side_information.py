import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from fedprivopt.data import Vocabulary, read_word_counts
from fedprivopt.models import StackOverflowTagTask, model_spec, token_frequency_preconditioner
from fedprivopt.models.tag_prediction import multi_hot


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
