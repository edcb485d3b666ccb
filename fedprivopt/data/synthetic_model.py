"""The generative model behind :mod:`fedprivopt.data.synthetic` (vectorized numpy).

:func:`build_model` draws the global structure (word names and background frequencies, tag
popularity, the informative words of each tag); :func:`draw_chunk` draws a chunk of users:
their examples, posts, tags, dates, splits and sentences. Serialization lives in
:mod:`fedprivopt.data.synthetic`; the model is described in its docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fedprivopt.data.synthetic_config import SyntheticConfig

__all__ = ["ChunkDraws", "WordTagModel", "build_model", "draw_chunk", "parse_date"]

_TAGS_PER_POST_P = np.array([0.13, 0.26, 0.29, 0.19, 0.13])  # 1..5 tags, mean ~2.9
_TAG_CANDIDATES = 8
_CONSONANTS = "bcdfghjklmnprstvz"
_VOWELS = "aeiou"
_SECONDS_PER_YEAR = 365.25 * 86400
TRAIN, HELDOUT, TEST = 0, 1, 2


def parse_date(name: str, value: str) -> np.datetime64:
    """Parse an ISO date for config field ``name``; ``ValueError`` naming it if invalid."""
    try:
        return np.datetime64(value, "s")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be an ISO date like '2018-01-01', got {value!r}") from exc


def _pseudo_words(n: int) -> list[str]:
    """``n`` distinct pronounceable words, shortest first (bijective base-85 syllables)."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    base = len(syllables)
    out = []
    for i in range(n):
        parts = []
        i += 1
        while i > 0:
            i, r = divmod(i - 1, base)
            parts.append(syllables[r])
        out.append("".join(reversed(parts)))
    return out


def _zipf(n: int, exponent: float) -> np.ndarray:
    p = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    return p / p.sum()


def _cdf(p: np.ndarray) -> np.ndarray:
    c = np.cumsum(p)
    c[-1] = 1.0
    return c


@dataclass(frozen=True)
class WordTagModel:
    """Global structure shared by all users (word ids are background frequency ranks)."""

    words: list[str]  # word id = background frequency rank
    background_cdf: np.ndarray
    tag_popularity: np.ndarray
    tag_popularity_cdf: np.ndarray
    tag_words: np.ndarray  # (num_tags, words_per_tag) word ids
    within_tag_cdf: np.ndarray
    tag_names: list[str]


def build_model(config: SyntheticConfig, rng: np.random.Generator) -> WordTagModel:
    """Draw the word names, background distribution, tag popularity and tag words."""
    v, t, w = config.vocab_size, config.num_tags, config.words_per_tag
    words = _pseudo_words(v)
    rare = np.arange(v // 2, v)
    tag_words = rng.permutation(rare)[: t * w].reshape(t, w)
    popularity = _zipf(t, config.tag_zipf)
    return WordTagModel(
        words=words,
        background_cdf=_cdf(_zipf(v, config.word_zipf)),
        tag_popularity=popularity,
        tag_popularity_cdf=_cdf(popularity),
        tag_words=tag_words,
        within_tag_cdf=_cdf(_zipf(w, 1.0)),
        tag_names=[words[i] for i in tag_words[:, 0]],
    )


# ----- one chunk of users -----


def _favourites(
    config: SyntheticConfig, model: WordTagModel, n_users: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Favourite tags (n_users, kmax) and their cumulative weights (exactly 1 from k_u on)."""
    t = config.num_tags
    k = np.minimum(1 + rng.poisson(config.tags_per_client - 1.0, n_users), t)
    kmax = int(k.max())
    keys = np.log(model.tag_popularity)[None, :] + rng.gumbel(size=(n_users, t))
    top = (
        np.argpartition(-keys, kmax - 1, axis=1)[:, :kmax]
        if kmax < t
        else np.tile(np.arange(t), (n_users, 1))
    )
    order = np.argsort(-np.take_along_axis(keys, top, axis=1), axis=1, kind="stable")
    fav = np.take_along_axis(top, order, axis=1)
    weights = rng.gamma(1.0, size=(n_users, kmax)) * (np.arange(kmax)[None, :] < k[:, None])
    cum = np.cumsum(weights / weights.sum(axis=1, keepdims=True), axis=1)
    cum[np.arange(kmax)[None, :] >= (k - 1)[:, None]] = 1.0
    return fav, cum


def _post_tags(
    config: SyntheticConfig,
    model: WordTagModel,
    post_user: np.ndarray,
    fav: np.ndarray,
    fav_cum: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Tags of each post (P, 5; padded with -1, kept ones first) and their number."""
    p, c = len(post_user), _TAG_CANDIDATES
    wanted = 1 + np.searchsorted(_cdf(_TAGS_PER_POST_P), rng.random(p), side="right")
    u = rng.random((p, c))
    fav_idx = (fav_cum[post_user][:, None, :] < u[:, :, None]).sum(axis=2)
    from_fav = np.take_along_axis(fav[post_user], fav_idx, axis=1)
    popular = np.searchsorted(model.tag_popularity_cdf, rng.random((p, c)), side="right")
    cand = np.where(rng.random((p, c)) < config.client_focus, from_fav, popular)
    order = np.argsort(cand, axis=1, kind="stable")
    srt = np.take_along_axis(cand, order, axis=1)
    dup_sorted = np.zeros_like(srt, dtype=bool)
    dup_sorted[:, 1:] = srt[:, 1:] == srt[:, :-1]
    dup = np.empty_like(dup_sorted)
    np.put_along_axis(dup, order, dup_sorted, axis=1)
    keep = ~dup & (np.cumsum(~dup, axis=1) <= wanted[:, None])
    first = np.argsort(~keep, axis=1, kind="stable")[:, :5]
    tags = np.where(
        np.take_along_axis(keep, first, axis=1), np.take_along_axis(cand, first, axis=1), -1
    )
    return tags, keep.sum(axis=1)


def _sentences(
    model: WordTagModel,
    lengths: np.ndarray,
    unit_tags: np.ndarray,
    unit_ntags: np.ndarray,
    informative: float,
    rng: np.random.Generator,
) -> tuple[list[str], np.ndarray]:
    """Token strings of ``len(lengths)`` sentences and the word id of every token."""
    unit = np.repeat(np.arange(len(lengths)), lengths)
    n = len(unit)
    words = np.searchsorted(model.background_cdf, rng.random(n), side="right")
    inf = np.flatnonzero(rng.random(n) < informative)
    if len(inf):
        col = (rng.random(len(inf)) * unit_ntags[unit[inf]]).astype(np.int64)
        tag = unit_tags[unit[inf], col]
        within = np.searchsorted(model.within_tag_cdf, rng.random(len(inf)), side="right")
        words[inf] = model.tag_words[tag, within]
    names = np.asarray(model.words, dtype=object)[words].tolist()
    ends = np.cumsum(lengths).tolist()
    starts = [0, *ends[:-1]]
    return [" ".join(names[a:b]) for a, b in zip(starts, ends, strict=True)], words


def _lengths(mean: float, minimum: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Gamma-Poisson (negative binomial) lengths >= ``minimum`` with the given mean."""
    extra = max(mean - minimum, 0.0)
    lam = rng.gamma(2.0, extra / 2.0, size) if extra > 0 else np.zeros(size)
    return minimum + rng.poisson(lam)


@dataclass(frozen=True)
class ChunkDraws:
    """Everything drawn for one chunk of users (indices are local to the chunk).

    Examples are in user order and chronological within a user; posts likewise.
    """

    users: np.ndarray  # global user indices
    ex_user: np.ndarray  # per example: local user
    ex_post: np.ndarray  # per example: post
    ex_split: np.ndarray  # per example: TRAIN, HELDOUT or TEST
    ex_len: np.ndarray  # per example: number of tokens
    tokens: list[str]  # per example: the sentence
    tok_words: np.ndarray  # per token (examples concatenated): word id
    post_user: np.ndarray  # per post: local user
    post_split: np.ndarray
    tags: np.ndarray  # per post: (P, 5) tag ids, padded with -1
    ntags: np.ndarray
    times: np.ndarray  # per post: seconds since the epoch
    is_question: np.ndarray
    score: np.ndarray
    titles: list[str]


def truncated_lognormal_mu(mean: float, sigma: float, low: float) -> float:
    r"""``mu`` of the lognormal whose part above ``low`` has mean ``mean`` (``mean > low``).

    :math:`E[X \mid X \ge L] = e^{\mu + \sigma^2/2}\,\bar\Phi(a - \sigma)/\bar\Phi(a)`,
    :math:`a = (\ln L - \mu)/\sigma`, increasing in ``mu``; solved by bisection (scipy's
    ``brentq``) in log space.
    """
    from scipy.optimize import brentq
    from scipy.special import log_ndtr

    log_low = np.log(low)

    def gap(mu: float) -> float:
        a = (log_low - mu) / sigma
        return mu + sigma**2 / 2 + log_ndtr(sigma - a) - log_ndtr(-a) - np.log(mean)

    return float(brentq(gap, log_low - 40.0 * sigma - 40.0, np.log(mean), xtol=1e-12))


def _examples_per_user(config: SyntheticConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """Lognormal counts with the configured mean, clipped to [min, max].

    With ``truncate_below_min`` the lognormal is conditioned on ``>= min`` instead (users below it
    do not exist, as the real data expunged users with fewer than 100 sentences) and its ``mu``
    is chosen so that the conditioned mean is ``mean_examples_per_client``; drawn by the inverse
    CDF from one uniform per user.
    """
    sigma, low = config.examples_sigma, config.min_examples_per_client
    if config.truncate_below_min and sigma > 0:
        from scipy.special import ndtr, ndtri

        mu = truncated_lognormal_mu(config.mean_examples_per_client, sigma, low)
        tail = ndtr(-(np.log(low) - mu) / sigma)  # P(X >= low) of the untruncated lognormal
        draws = np.exp(mu - sigma * ndtri(tail * (1.0 - rng.random(n))))
    else:
        mu = np.log(config.mean_examples_per_client) - sigma**2 / 2
        draws = np.exp(rng.normal(mu, sigma, n))
    return np.clip(np.rint(draws), low, config.max_examples_per_client).astype(np.int64)


def _post_times(
    config: SyntheticConfig, post_user: np.ndarray, n_users: int, rng: np.random.Generator
) -> np.ndarray:
    """Post dates: uniform in each user's activity window, chronological within a user."""
    t0, t1 = (
        parse_date(n, getattr(config, n)).astype(np.int64) for n in ("start_date", "end_date")
    )
    join = t0 + (t1 - t0) * rng.beta(1.0, 1.5, n_users)
    leave = np.minimum(
        join + rng.exponential(config.activity_years * _SECONDS_PER_YEAR, n_users), t1
    )
    times = join[post_user] + rng.random(len(post_user)) * (leave - join)[post_user]
    return np.floor(times[np.lexsort((times, post_user))]).astype(np.int64)


def draw_chunk(
    config: SyntheticConfig, model: WordTagModel, users: np.ndarray, rng: np.random.Generator
) -> ChunkDraws:
    """Draw the examples of the users ``users`` (global indices) from ``rng``."""
    nu = len(users)
    n_ex = _examples_per_user(config, nu, rng)
    ex_user = np.repeat(np.arange(nu), n_ex)
    starts = rng.random(len(ex_user)) < 1.0 / config.mean_sentences_per_post
    starts[np.concatenate(([0], np.cumsum(n_ex)[:-1]))] = True
    ex_post = np.cumsum(starts) - 1
    post_user = ex_user[starts]
    n_posts = len(post_user)

    fav, fav_cum = _favourites(config, model, nu, rng)
    tags, ntags = _post_tags(config, model, post_user, fav, fav_cum, rng)
    times = _post_times(config, post_user, nu, rng)
    is_question = rng.random(n_posts) < config.question_fraction
    score = np.floor(rng.pareto(2.0, n_posts) * 2.0).astype(np.int64) - (
        rng.random(n_posts) < 0.1
    ) * rng.geometric(0.5, n_posts)

    m = config.heldout_modulus
    heldout = (users % m == 0) if m else np.zeros(nu, dtype=bool)
    cut = parse_date("cut_date", config.cut_date).astype(np.int64)
    post_split = np.where(heldout[post_user], HELDOUT, np.where(times < cut, TRAIN, TEST))

    ex_len = _lengths(config.mean_tokens_per_example, 1, len(ex_user), rng)
    tokens, tok_words = _sentences(
        model, ex_len, tags[ex_post], ntags[ex_post], config.informative_fraction, rng
    )
    title_len = _lengths(config.mean_title_tokens, 2, n_posts, rng)
    titles, _ = _sentences(model, title_len, tags, ntags, config.title_informative_fraction, rng)
    return ChunkDraws(
        users=users,
        ex_user=ex_user,
        ex_post=ex_post,
        ex_split=post_split[ex_post],
        ex_len=ex_len,
        tokens=tokens,
        tok_words=tok_words,
        post_user=post_user,
        post_split=post_split,
        tags=tags,
        ntags=ntags,
        times=times,
        is_question=is_question,
        score=score,
        titles=titles,
    )
