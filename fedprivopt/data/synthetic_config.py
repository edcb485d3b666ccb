"""The synthetic generator's configuration: :class:`SyntheticConfig`, its limits and user sizes.

The knobs of the generative model described in :mod:`fedprivopt.data.synthetic` and their
checks; the upper limits of users, words and tags (each with the memory it costs); the named
shapes of the examples per user (:data:`USER_SIZES`) and the disk a user of each takes; and the
helpers that :mod:`fedprivopt.cli_data` and the StackOverflow tasks share to turn their own
parameters into a configuration (:func:`tag_knobs`, :func:`user_size_knobs`) and a refusal into
their own names (:func:`config_error`).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, fields
from numbers import Real
from typing import Any

from fedprivopt.core.checks import as_float, check_bool, check_int, check_real, plain_scalar
from fedprivopt.core.memory import physical_memory, processes_that_fit
from fedprivopt.core.text import shown
from fedprivopt.data.synthetic_model import parse_date
from fedprivopt.data.vocab import MAX_WORDS

__all__ = [
    "DISK_PER_USER",
    "MAX_CLIENTS",
    "MAX_TAGS",
    "MAX_VOCAB",
    "USER_SIZES",
    "SyntheticConfig",
    "config_error",
    "tag_knobs",
    "user_size_knobs",
    "worker_memory",
    "workers_that_fit",
]

# ~2.5x the real dataset's ~380,000 users; per user ~12.5 kB of disk and ~0.4 kB of memory (the
# client metadata, held until the SQLite file is complete): 10**6 users ~ 12.5 GB, ~400 MB.
MAX_CLIENTS = 1_000_000
# Word types: the words, their background distribution and per-chunk counts cost ~95 bytes a
# word (measured: 10**6 words took 93 MB more than 2 * 10**4), so 10**7 words ~ 1 GB; 10**9 used
# to be accepted and grow past 6 GB. The real dataset's vocabulary files hold a few million.
MAX_VOCAB = MAX_WORDS  # 10**7: the words a word-count file may hold (its readers refuse more)
# Tags: every chunk of 2,048 users draws a (users x tags) float64 matrix of favourite-tag keys
# and sorts it, ~50 kB a tag (measured: 10,000 tags, 2,048 users, 520 MB peak), so 10**4 tags
# ~ 0.5 GB. The task predicts the 500 most frequent tags; 10**4 covers any realistic setting.
MAX_TAGS = 10_000

#: Named shapes of the examples-per-user distribution (``fedprivopt data synth --user-sizes``,
#: task parameter ``synth-user-sizes``), applied over the other knobs.
#:
#: ``small``: the defaults, a lognormal of mean 40 (sigma 1, at least 1): a tenth of the real
#: size, so that the demo and the tests stay fast.
#:
#: ``real``: the published sizes of TFF's StackOverflow. Its documentation says that users with
#: fewer than 100 sentences (examples) were expunged, and gives the split totals: train
#: 135,818,730 examples over 342,477 users (397 a user), held-out 16,491,230 over 38,758 (425),
#: test 16,586,035 over 204,088 (81). Held-out users keep all their examples, so over all
#: 381,235 users a user has (135.8 M + 16.6 M + 16.5 M) / 381,235 = 443 examples. The shape is a
#: lognormal conditioned on >= 100: multiplicative activity gives a lognormal, and the floor is
#: the documented filter. No per-user quantile is published; sigma = 1.2 puts the largest of
#: 381,235 users near 36,000 examples, matching TFF's note that a small set of clients has "tens
#: of thousands of examples" (sigma 1.0: about 21,000; 1.4: 57,000). Train and test means then
#: follow from the date split of the activity model (measured: docs/EXPERIMENTS.md).
USER_SIZES: dict[str, dict[str, object]] = {
    "small": {},
    "real": {
        "mean_examples_per_client": 443.0,
        "examples_sigma": 1.2,
        "min_examples_per_client": 100,
        "truncate_below_min": True,
    },
}

#: Disk a user of each :data:`USER_SIZES` shape takes (the SQLite file and its index; measured:
#: 20,000 small users 246 MB, 20 real ones 2.77 MB): ``fedprivopt data synth`` checks the free
#: space before writing (fourteenth review of issue 15: ``--clients 1000000 --user-sizes real``
#: asked for about 140 GB, and a full disk ended in a traceback).
DISK_PER_USER: dict[str, int] = {"small": 12_500, "real": 140_000}


@dataclass(frozen=True, kw_only=True)
class SyntheticConfig:
    """Knobs of the synthetic StackOverflow generator (:mod:`fedprivopt.data.synthetic`: the model).

    Parameters
    ----------
    num_clients : int, default 10_000
        Users generated (across all splits), in [1, :data:`MAX_CLIENTS`] (10**6: about 2.5 times
        the real dataset's ~380,000 users). Each user costs about 12.5 kB of disk and 0.4 kB of
        memory (the client metadata, held until the SQLite file is complete; measured: 5,000 and
        40,000 users took 143 and 156 MB peak, 63 and 493 MB of disk, 3.4 and 21 s), so 10**6
        users take about 12.5 GB of disk, 0.5 GB of memory and 10-20 minutes.
    vocab_size : int, default 20_000
        Word types; >= 10, at least ``2 * num_tags * words_per_tag`` and at most
        :data:`MAX_VOCAB` = 10**7 (about 95 bytes of memory a word: 10**7 words ~ 1 GB).
    num_tags : int, default 500
        Tags; in [1, :data:`MAX_TAGS`] (10,000: each chunk of 2,048 users draws a users x tags
        float64 matrix, about 50 kB a tag: 10**4 tags ~ 0.5 GB).
    words_per_tag : int, default 10
        Informative words owned by each tag; in [1, ``MAX_VOCAB // 2``] (they are distinct
        words of the rare half of the vocabulary).
    seed : int, default 0
        Seed of every random stream; >= 0.
    word_zipf : float, default 1.1
        Zipf exponent of background word frequencies, in (0, 5].
    tag_zipf : float, default 1.0
        Zipf exponent of tag popularity, in [0, 5].
    informative_fraction : float, default 0.15
        Probability that a sentence token is an informative word of its tags, in [0, 1].
    title_informative_fraction : float, default 0.4
        The same for title tokens, in [0, 1].
    mean_examples_per_client : float, default 40.0
        Mean of the lognormal number of examples per user, in [1, 1e6].
    examples_sigma : float, default 1.0
        Lognormal sigma of examples per user (tail heaviness), in [0, 4].
    min_examples_per_client : int, default 1
        Floor on examples per user; >= 1.
    max_examples_per_client : int, default 100_000
        Cap on examples per user; >= ``min_examples_per_client``.
    truncate_below_min : bool, default False
        Condition the lognormal on ``>= min_examples_per_client`` (users below it do not exist,
        as in the real data, which expunged users with fewer than 100 sentences) instead of
        raising smaller draws to it; ``mean_examples_per_client`` is then the mean of the
        conditioned distribution and must exceed the minimum. :data:`USER_SIZES` ``"real"``.
    mean_tokens_per_example : float, default 14.0
        Mean sentence length in tokens, in [1, 1000].
    mean_title_tokens : float, default 8.0
        Mean title length in tokens, in [2, 1000].
    mean_sentences_per_post : float, default 4.0
        Mean sentences per post (geometric), in [1, 1000].
    question_fraction : float, default 0.25
        Probability that a post is a question, in [0, 1].
    tags_per_client : float, default 3.0
        Mean number of favourite tags per user (1 + Poisson), in [1, num_tags].
    client_focus : float, default 0.85
        Probability that a post tag is drawn from the user's favourites, in [0, 1].
    heldout_modulus : int, default 10
        Users with index % heldout_modulus == 0 form the heldout split; 0 disables it.
    start_date, cut_date, end_date : str, default "2008-08-01", "2018-01-01", "2018-09-01"
        Activity range and the train/test cut; ``start_date < end_date``,
        ``start_date <= cut_date <= end_date``.
    activity_years : float, default 10.0
        Mean length of a user's active period in years, in (0, 100].
    """

    num_clients: int = 10_000
    vocab_size: int = 20_000
    num_tags: int = 500
    words_per_tag: int = 10
    seed: int = 0
    word_zipf: float = 1.1
    tag_zipf: float = 1.0
    informative_fraction: float = 0.15
    title_informative_fraction: float = 0.4
    mean_examples_per_client: float = 40.0
    examples_sigma: float = 1.0
    min_examples_per_client: int = 1
    max_examples_per_client: int = 100_000
    truncate_below_min: bool = False
    mean_tokens_per_example: float = 14.0
    mean_title_tokens: float = 8.0
    mean_sentences_per_post: float = 4.0
    question_fraction: float = 0.25
    tags_per_client: float = 3.0
    client_focus: float = 0.85
    heldout_modulus: int = 10
    start_date: str = "2008-08-01"
    cut_date: str = "2018-01-01"
    end_date: str = "2018-09-01"
    activity_years: float = 10.0

    def __post_init__(self) -> None:
        # forty-fifth review of issue 15 (input 4): generate(out, SyntheticConfig(num_clients=
        # numpy.int64(30))) wrote the whole dataset, then ended in "TypeError: Object of type
        # int64 is not JSON serializable" at its marker, left "complete": false (refused by
        # every task); a NumPy scalar is its Python number
        for f in fields(self):
            value = _recordable(f.name, f.type, plain_scalar(getattr(self, f.name)))
            object.__setattr__(self, f.name, value)
        check_int("num_clients", self.num_clients, 1)
        if self.num_clients > MAX_CLIENTS:
            raise ValueError(
                f"num_clients must be at most {MAX_CLIENTS} (disk and memory grow with it; see "
                f"SyntheticConfig), got {self.num_clients}"
            )
        check_int("num_tags", self.num_tags, 1)
        if self.num_tags > MAX_TAGS:
            raise ValueError(
                f"num_tags must be at most {MAX_TAGS} (memory grows with it, about 50 kB a tag; "
                f"see SyntheticConfig), got {self.num_tags}"
            )
        check_int("words_per_tag", self.words_per_tag, 1, MAX_VOCAB // 2)
        # thirtieth review of issue 15 (data, finding 3): the one check of vocab_size, with why
        least, tagged = 10, 2 * self.num_tags * self.words_per_tag
        why = f" (2 x num_tags={self.num_tags} x {self.words_per_tag} informative words a tag)"
        try:
            check_int("vocab_size", self.vocab_size, max(least, tagged))
        except ValueError as exc:
            line = str(exc).replace(", got", f"{why if tagged > least else ''}, got", 1)
            raise ValueError(line) from None
        if self.vocab_size > MAX_VOCAB:
            raise ValueError(
                f"vocab_size must be at most {MAX_VOCAB} (memory grows with it, about 95 bytes "
                f"a word; see SyntheticConfig), got {self.vocab_size}"
            )
        check_int("seed", self.seed, 0)
        check_real("word_zipf", self.word_zipf, low=0.0, high=5.0, low_open=True)
        check_real("tag_zipf", self.tag_zipf, low=0.0, high=5.0)
        check_real("informative_fraction", self.informative_fraction, low=0.0, high=1.0)
        check_real("title_informative_fraction", self.title_informative_fraction, low=0.0, high=1.0)
        check_real("mean_examples_per_client", self.mean_examples_per_client, low=1.0, high=1e6)
        check_real("examples_sigma", self.examples_sigma, low=0.0, high=4.0)
        check_int("min_examples_per_client", self.min_examples_per_client, 1)
        check_int(
            "max_examples_per_client", self.max_examples_per_client, self.min_examples_per_client
        )
        if check_bool("truncate_below_min", self.truncate_below_min) and not (
            self.min_examples_per_client
            < self.mean_examples_per_client
            < self.max_examples_per_client
        ):
            raise ValueError(
                "mean_examples_per_client must be in (min_examples_per_client, "
                f"max_examples_per_client) = ({self.min_examples_per_client}, "
                f"{self.max_examples_per_client}) with truncate_below_min, got "
                f"{self.mean_examples_per_client}"
            )
        check_real("mean_tokens_per_example", self.mean_tokens_per_example, low=1.0, high=1000.0)
        check_real("mean_title_tokens", self.mean_title_tokens, low=2.0, high=1000.0)
        check_real("mean_sentences_per_post", self.mean_sentences_per_post, low=1.0, high=1000.0)
        check_real("question_fraction", self.question_fraction, low=0.0, high=1.0)
        check_real("tags_per_client", self.tags_per_client, low=1.0, high=float(self.num_tags))
        check_real("client_focus", self.client_focus, low=0.0, high=1.0)
        check_int("heldout_modulus", self.heldout_modulus, 0)
        start = parse_date("start_date", self.start_date)
        cut = parse_date("cut_date", self.cut_date)
        end = parse_date("end_date", self.end_date)
        if not start < end:
            raise ValueError(
                f"start_date must be before end_date, got {self.start_date!r} >= {self.end_date!r}"
            )
        if not start <= cut <= end:
            raise ValueError(
                f"cut_date must be in [start_date, end_date] = [{self.start_date!r}, "
                f"{self.end_date!r}], got {self.cut_date!r}"
            )
        check_real("activity_years", self.activity_years, low=0.0, high=100.0, low_open=True)

    @classmethod
    def sized(cls, user_sizes: str = "small", **knobs: object) -> SyntheticConfig:
        """``SyntheticConfig(**knobs)`` with the :data:`USER_SIZES` shape ``user_sizes`` applied."""
        return cls(**{**knobs, **user_size_knobs(user_sizes)})  # type: ignore[arg-type]

    @classmethod
    def tiny(cls, **overrides: object) -> SyntheticConfig:
        """Return a 300-user configuration for tests and demos (generates in under a second)."""
        base = dict(
            num_clients=300,
            vocab_size=2_000,
            num_tags=50,
            words_per_tag=8,
            mean_examples_per_client=30.0,
        )
        base.update(overrides)
        return cls(**base)  # type: ignore[arg-type]


_DATES = ("start_date", "cut_date", "end_date")


def _recordable(name: str, kind: Any, value: Any) -> Any:
    """A knob of :class:`SyntheticConfig` as the dataset's marker (JSON) records it.

    Follow-up of the forty-fifth review of issue 15 (outputs 2; input 4 had NumPy scalars):
    ``generate(out, SyntheticConfig(question_fraction=Fraction(1, 4)))`` (a real knob as a
    ``fractions.Fraction``, which the knob's check takes) or ``start_date=datetime.date(2009, 1,
    1)`` (which ``numpy.datetime64`` reads) wrote the whole dataset, then ended in ``TypeError:
    Object of type Fraction (date) is not JSON serializable`` at its marker, left ``"complete":
    false``, which every task refuses. A real knob is kept as a float; a date as its ISO text
    (``datetime.date.isoformat``); any other date (a number, which ``numpy.datetime64`` read as
    seconds after 1970, or a ``datetime`` with its time) is refused naming the knob.
    """
    if kind == "float" and isinstance(value, Real) and not isinstance(value, (bool, int, float)):
        return as_float(value)  # checked as this float by check_real
    if name in _DATES and not isinstance(value, str):
        if type(value) is datetime.date:
            return value.isoformat()
        raise ValueError(f"{name} must be an ISO date like '2018-01-01', got {shown(value)}")
    return value


def tag_knobs(num_tags: int) -> dict[str, object]:
    """``num_tags`` and the mean favourite tags a user may have with it (at most ``num_tags``).

    ``tags_per_client`` (3 by default) must be at most ``num_tags``; ``data synth --tags K`` and
    a task's ``synth_tags`` set only the tags, so each user then has up to ``K`` favourites.
    Ninth review of issue 15 (N8) for ``data synth --tags 1``; thirty-fifth review (data) for a
    task's ``synth-tags = 1`` or ``2``, refused as ``tags_per_client must be a finite number in
    [1, 2], got 3.0``, a knob no task parameter sets.
    """
    default = SyntheticConfig.__dataclass_fields__["tags_per_client"].default
    tags = float(num_tags) if isinstance(num_tags, int) and not isinstance(num_tags, bool) else 0
    return {"num_tags": num_tags, "tags_per_client": min(default, max(tags, 1.0))}


def config_error(message: str, names: dict[str, str], *, vocab_given: bool, hint: str) -> str:
    """A :class:`SyntheticConfig` refusal with its knobs as the caller's user names them.

    ``names`` maps knob names (``num_clients``, ``vocab_size``, ``num_tags``, ``seed``) to the
    caller's (``--clients``, ``task-params``' ``synth_vocab``, ...); a refused ``vocab_size``
    the caller did not give (the default) gets ``hint``. Thirty-fifth review of issue 15 (data):
    a task's ``synth-tags = 5000`` was refused as ``invalid synth_* parameters: vocab_size must
    be an integer >= 100000 (...), got 4000``, the generator's name for ``synth-vocab``, which
    reads as the task's own ``vocab-size`` (the model's vocabulary, another key).
    """
    refused_vocab = message.startswith("vocab_size ")
    for knob, name in names.items():
        message = re.sub(rf"(?<![\w-]){knob}(?![\w])", name, message)
    return message + (f" ({hint})" if refused_vocab and not vocab_given else "")


def user_size_knobs(user_sizes: str, name: str = "user_sizes") -> dict[str, object]:
    """The four size knobs of the :data:`USER_SIZES` shape ``user_sizes`` (defaults filled in)."""
    if not isinstance(user_sizes, str) or user_sizes not in USER_SIZES:
        raise ValueError(f"{name} must be one of {', '.join(USER_SIZES)}, got {user_sizes!r}")
    defaults = {f.name: f.default for f in fields(SyntheticConfig)}
    return {k: USER_SIZES[user_sizes].get(k, defaults[k]) for k in USER_SIZES["real"]}


#: Users a chunk of the generator holds (``synthetic_rows.CHUNK_USERS``, repeated here so that
#: the estimate below needs no import of the model's modules).
_CHUNK_USERS = 2048
#: Memory a worker of :func:`fedprivopt.data.synthetic.generate` holds besides its words, tags
#: and chunk: an interpreter with NumPy (about 60 MB measured).
_WORKER_BASE = 64 * 2**20
#: Memory a serialized example of a chunk takes with its draws (a row tuple, its bytes, the
#: drawn tokens and title): about 1 kB at the default sentence lengths (estimated from 8,192
#: users of 10,000 tags and 200,000 words, 797 MB a worker at most, measured).
_EXAMPLE_MEMORY = 1000
#: Memory an example takes for each token of its sentence (its drawn word ids, its text and its
#: serialized row) and for each token of its post's title (serialized into every example of the
#: post): 36 and 12 bytes (measured, forty-fourth review of issue 15: 20,000 examples of 1,000
#: tokens took 720 MB, of 1,000 title tokens 222 MB).
_TOKEN_MEMORY, _TITLE_TOKEN_MEMORY = 36, 12


def worker_memory(config: SyntheticConfig) -> int:
    """Bytes a worker drawing chunks of ``config`` holds at least (an estimate).

    Each worker rebuilds the word and tag model (about 95 bytes a word), draws a chunk of 2,048
    users' favourite-tag keys (about 50 kB a tag) and holds the chunk's serialized examples (2,048
    users, or fewer when the dataset has fewer, of ``mean_examples_per_client`` examples, at most
    ``max_examples_per_client``; about 1 kB each at the default lengths, and 36 bytes a sentence
    token and 12 a title token beyond them). Forty-fourth review of issue 15 (input 1): the
    lengths were left out, so ``mean_tokens_per_example=1000`` (in its documented range) was
    estimated at 1 kB an example where it takes about 42 kB.
    """
    example = max(
        _EXAMPLE_MEMORY,
        _TOKEN_MEMORY * config.mean_tokens_per_example
        + _TITLE_TOKEN_MEMORY * config.mean_title_tokens,
    )
    examples = min(config.mean_examples_per_client, config.max_examples_per_client)
    return (
        _WORKER_BASE
        + 95 * config.vocab_size
        + 50_000 * config.num_tags
        + int(min(_CHUNK_USERS, config.num_clients) * examples * example)
    )


def workers_that_fit(config: SyntheticConfig, workers: int | None, default: int) -> int:
    """The worker processes to draw ``config``'s chunks with: ``workers`` or ``default``.

    Thirty-ninth review of issue 15 (input 1): ``data synth --clients 1000000 --tags 10000
    --workers 1024`` started 489 workers (one a chunk of 2,048 users) of about 0.8 GB each, some
    400 GB on a machine of 23 GB: memory is bounded by the workers, and they were bounded only
    by 1,024. A default count (the CPUs) is lowered to what this machine's memory holds; a count
    given that starts more processes than it holds is refused.

    Raises
    ------
    ValueError
        Naming ``workers``, the most this machine holds and the memory of one; or, where not
        even one worker fits in this machine's memory, naming the knobs that size a chunk.
    """
    chunks = max(1, -(-config.num_clients // _CHUNK_USERS))
    each, memory = worker_memory(config), physical_memory()
    if 0 < memory < each:  # forty-fourth review of issue 15 (input 1): one did not fit either
        # follow-up (outputs 6): the words and tags a worker rebuilds were left out of the line,
        # which advised lowering the users' lengths where 10**7 words took 0.9 GiB of 1.4
        model = 95 * config.vocab_size + 50_000 * config.num_tags
        raise ValueError(
            f"a chunk of {min(_CHUNK_USERS, config.num_clients):,} users of this dataset takes "
            f"about {each / 2**30:,.1f} GiB to draw ({model / 2**30:,.2f} GiB for the "
            f"{config.vocab_size:,} words and {config.num_tags:,} tags a worker rebuilds, "
            f"{(each - model - _WORKER_BASE) / 2**30:,.2f} GiB for the users' "
            f"{config.mean_examples_per_client:g} examples a user of "
            f"{config.mean_tokens_per_example:g} tokens and {config.mean_title_tokens:g} title "
            f"tokens on average), more than this machine's {memory / 2**30:.1f} GiB of memory: "
            "lower vocab_size or num_tags, or mean_examples_per_client, "
            "mean_tokens_per_example or mean_title_tokens"
        )
    most = processes_that_fit(chunks, memory, each)
    if workers is None:
        return min(default, most)
    if min(workers, chunks) > most:
        raise ValueError(
            f"workers must be an integer in [1, {most}] on this machine for this dataset: each "
            f"worker holds about {each / 2**20:,.0f} MiB (its words, tags and a chunk of "
            f"{_CHUNK_USERS:,} users) and it has {memory / 2**30:.1f} GiB of memory, got {workers}"
        )
    return workers
