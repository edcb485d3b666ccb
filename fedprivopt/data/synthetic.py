"""A synthetic StackOverflow-like federated dataset, written in the real file formats.

:func:`generate` writes ``stackoverflow.sqlite`` (the exact TFF schema, plus an index on
``examples(split_name, client_id)``), ``stackoverflow.word_count``, ``stackoverflow.tag_count``
and a sidecar ``stackoverflow.synthetic.json`` recording the configuration. Every reader of the
real data therefore reads it unchanged.

The generative model (knobs in :class:`SyntheticConfig`):

* **Words.** ``vocab_size`` word types with Zipf background frequencies (``word_zipf``). Frequent
  words are short pseudo-words and carry no tag information (stop words). Each tag owns
  ``words_per_tag`` *informative* words, placed in the rare half of the background ranking;
  within a sentence each token is, with probability ``informative_fraction``, an informative
  word of one of the question's tags (Zipf within the tag), otherwise a background word. Tag
  names are their first informative word (as ``python`` is both a tag and a word).
* **Tags.** Zipf popularity over ``num_tags`` tags (``tag_zipf``). Each user has a few favourite
  tags (``tags_per_client`` on average, drawn by popularity, Dirichlet weights), and each tag of
  a post comes from them with probability ``client_focus``: users are non-IID.
* **Posts and examples.** Examples per user are lognormal (``mean_examples_per_client``,
  ``examples_sigma``): heavy-tailed. A user's examples are grouped into posts (geometric,
  ``mean_sentences_per_post`` sentences); a post is a question (``question_fraction``) or an
  answer and has 1-5 tags, a title, a score and a creation date shared by its sentences.
* **Splits.** As in the real data [1]_: users whose index is a multiple of ``heldout_modulus``
  form ``heldout`` (all their examples); every other user's examples dated before ``cut_date``
  go to ``train`` and later ones to ``test``. A user is active over an interval starting
  ``Beta(1, 1.5)``-distributed in [``start_date``, ``end_date``] and lasting an exponential
  time of mean ``activity_years``; posts are uniform in it. With the defaults (10,000 users)
  test holds 12 % of the non-heldout examples (real data: 16.6 M of 152.4 M, 11 %) and 39 % as
  many users as train (real: 204,088 / 342,477 = 60 %, higher because every real user has at
  least 100 sentences, so a user active after the cut almost surely posted after it).
* **Counts.** As in the real files, a count is the number of distinct training users with at
  least one example containing the word (in ``tokens``) or the tag.

Generation is vectorized in chunks of users with a fixed chunk size, all randomness drawn from
``numpy.random.Generator`` streams spawned from ``seed``: the same configuration gives
byte-identical files, for any number of worker processes drawing the chunks
(:mod:`fedprivopt.data.synthetic_rows`; only the SQLite writer is serial). At the defaults it
takes about 1 s and 12.5 MB of disk per 1,000 users (10,000 users: about 10 s, 125 MB, 408,000
examples), with memory bounded by ``workers + 1`` chunks; real-size users
(:data:`USER_SIZES`) are about 11 times as many examples (``make bench``, D1).

References
----------
.. [1] TensorFlow Federated, ``tff.simulation.datasets.stackoverflow.load_data``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from fedprivopt.core.checks import check_bool, check_int, check_real
from fedprivopt.core.files import read_at_most, unlink_links
from fedprivopt.data.sqlite import SQLiteSplit, read_example_counts, write_sqlite
from fedprivopt.data.synthetic_model import WordTagModel, build_model, parse_date
from fedprivopt.data.synthetic_rows import CHUNK_USERS, SPLITS, chunk_rows, default_workers
from fedprivopt.data.vocab import (
    MAX_WORDS,
    TAG_COUNT_FILE,
    WORD_COUNT_FILE,
    write_tag_counts,
    write_word_counts,
)

__all__ = [
    "DATASET_FILES",
    "GENERATOR_VERSION",
    "MAX_CLIENTS",
    "MAX_TAGS",
    "MAX_VOCAB",
    "SQLITE_FILE",
    "SYNTHETIC_META_FILE",
    "SyntheticConfig",
    "SyntheticFiles",
    "check_free_disk",
    "config_error",
    "ensure_synthetic",
    "foreign_sqlite",
    "generate",
    "is_synthetic_dir",
    "read_marker",
    "run_files_around",
    "run_files_note",
    "tag_knobs",
    "word_tag_model",
]

GENERATOR_VERSION = 1
SQLITE_FILE = "stackoverflow.sqlite"
SYNTHETIC_META_FILE = "stackoverflow.synthetic.json"
DATASET_FILES = (SQLITE_FILE, WORD_COUNT_FILE, TAG_COUNT_FILE)
_MARKER_LIMIT = 1 << 20  # bytes: the marker is about 1 kB; a larger file is not ours
_GENERATOR = "fedprivopt.data.synthetic"  # the marker's "generator": the files are ours
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

#: Files only fedprivopt's runs, comparisons and tunings write: a directory holding one is no
#: data directory, and neither ``data synth`` nor a task's synthetic generation writes into it
#: (fourteenth review of issue 15).
OUTPUT_FILES = (
    "privacy_ledger.jsonl",
    "checkpoint.pt",
    "run.lock",
    "compare.lock",
    "tune.json",
    "tune.lock",
)

#: Of :data:`OUTPUT_FILES`, the names no other tool is likely to write.
_DISTINCTIVE_OUTPUT_FILES = ("privacy_ledger.jsonl", "compare.lock", "tune.lock")

#: Disk a user of each :data:`USER_SIZES` shape takes (the SQLite file and its index; measured:
#: 20,000 small users 246 MB, 20 real ones 2.77 MB): ``fedprivopt data synth`` checks the free
#: space before writing (fourteenth review of issue 15: ``--clients 1000000 --user-sizes real``
#: asked for about 140 GB, and a full disk ended in a traceback).
DISK_PER_USER: dict[str, int] = {"small": 12_500, "real": 140_000}

#: Disk an example takes at least, at the default sentence lengths (the measurements above: 307
#: and 312 bytes an example; 265 for 500 users of seed 0), for :func:`generate`'s own check of
#: the free space. Twenty-fifth review of issue 15, finding 5: a task's generation (``simulate``
#: with ``task-params.synth-clients`` and ``synth-user-sizes = "real"``) had no such check and
#: wrote until the disk was full (a 20 MB disk: rc 2 once it was full; 10**6 real users ask for
#: about 140 GB).
DISK_PER_EXAMPLE = 200


@dataclass(frozen=True, kw_only=True)
class SyntheticConfig:
    """Knobs of the synthetic StackOverflow generator (see the module docstring for the model).

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


@dataclass(frozen=True)
class SyntheticFiles:
    """Paths of a generated dataset.

    Attributes
    ----------
    root, sqlite, word_count, tag_count, meta : pathlib.Path
        The directory, ``stackoverflow.sqlite``, ``stackoverflow.word_count``,
        ``stackoverflow.tag_count`` and ``stackoverflow.synthetic.json``.
    """

    root: Path
    sqlite: Path
    word_count: Path
    tag_count: Path
    meta: Path

    @classmethod
    def at(cls, root: str | os.PathLike) -> SyntheticFiles:
        """Return the file paths under ``root``."""
        r = Path(root)
        return cls(
            r, r / SQLITE_FILE, r / WORD_COUNT_FILE, r / TAG_COUNT_FILE, r / SYNTHETIC_META_FILE
        )

    def open(self, split: str = "train") -> SQLiteSplit:
        """Open one split of the SQLite file."""
        return SQLiteSplit(self.sqlite, split)


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------


def check_free_disk(out_dir: str | os.PathLike, config: SyntheticConfig) -> None:
    """Refuse a dataset that the disk of ``out_dir`` cannot hold, before anything is written.

    The estimate is a lower bound: ``num_clients * mean_examples_per_client *``
    :data:`DISK_PER_EXAMPLE` bytes, less for sentences shorter than the default 14 tokens.

    Raises
    ------
    ValueError
        Naming the directory, the estimate and the free space.
    """
    base = next(p for p in (Path(out_dir), *Path(out_dir).absolute().parents) if p.exists())
    free = shutil.disk_usage(base).free
    per_example = DISK_PER_EXAMPLE * min(1.0, config.mean_tokens_per_example / 14.0)
    need = config.num_clients * config.mean_examples_per_client * per_example
    if need > free:
        raise ValueError(
            f"{out_dir}: a synthetic dataset of {config.num_clients:,} users of "
            f"{config.mean_examples_per_client:g} examples on average needs at least "
            f"{need / 1e9:.3g} GB of disk, and {base} has {free / 1e9:.3g} GB free"
        )


def generate(
    out_dir: str | os.PathLike,
    config: SyntheticConfig | None = None,
    *,
    overwrite: bool = False,
    workers: int | None = None,
) -> SyntheticFiles:
    """Generate a synthetic StackOverflow dataset under ``out_dir``.

    Parameters
    ----------
    out_dir : str or os.PathLike
        Directory for the four files (created if missing).
    config : SyntheticConfig, optional
        The knobs; default ``SyntheticConfig()`` (10,000 users).
    overwrite : bool, default False
        Replace the files of a synthetic dataset (:func:`is_synthetic_dir`); otherwise raise
        ``FileExistsError`` if the SQLite file exists, and ``ValueError`` if a
        ``stackoverflow.synthetic.json`` that is not this generator's marker exists.

    Returns
    -------
    SyntheticFiles
        Paths of the written files.

    Raises
    ------
    FileExistsError
        If the SQLite file exists and ``overwrite`` is false, or if any of :data:`DATASET_FILES`
        exists in a directory without our marker (a dataset this module did not write, e.g. the
        real one): it is never replaced.
    ValueError
        If ``overwrite`` is false and ``stackoverflow.synthetic.json`` exists but is not this
        generator's marker (not JSON, or not written by it): someone else's file is replaced
        only when asked to (CLI: ``--overwrite``).
    workers : int, optional
        Processes drawing chunks of 2,048 users in parallel (``>= 1``; default
        :func:`default_workers`); the files are byte-identical for any number.
    """
    config = SyntheticConfig() if config is None else config
    workers = default_workers() if workers is None else check_int("workers", workers, 1)
    files = SyntheticFiles.at(out_dir)
    check_free_disk(files.root, config)
    files.root.mkdir(parents=True, exist_ok=True)
    if files.sqlite.exists() and not overwrite:
        raise FileExistsError(f"{files.sqlite}: exists (pass overwrite=True to replace it)")
    if not overwrite and files.meta.exists() and not is_synthetic_dir(files.root):
        raise ValueError(
            f"{files.meta} exists and is not a marker of this generator; refusing to replace "
            "it (use --overwrite to replace it)"
        )
    present = [name for name in DATASET_FILES if (files.root / name).exists()]
    if present and not is_synthetic_dir(files.root):
        raise FileExistsError(
            f"{files.root}: holds {', '.join(present)} but no {SYNTHETIC_META_FILE} of this "
            "generator: a dataset it did not write is never replaced"
        )
    foreign = foreign_sqlite(files.root, links=False) if present else None
    if foreign is not None:
        raise FileExistsError(
            f"{files.sqlite}: not the file its {SYNTHETIC_META_FILE} describes ({foreign}): "
            "another dataset was put there, and one the generator did not write is never "
            "replaced (move it, or remove the marker to use it as it is)"
        )
    # Sixteenth review of issue 15: a file of the directory that is a symbolic or hard link (a
    # vocabulary linked from another, real dataset) was written through, replacing the linked
    # file (rc 0). The links themselves are removed (as the .partial link is): what they point
    # to is never written.
    unlink_links(files.root, [p.name for p in (files.meta, files.sqlite, files.word_count,
                                               files.tag_count)])  # fmt: skip
    # Our marker before the first byte of data: an interrupted generation leaves a directory
    # that is still recognized as ours (and, lacking a configuration, is never taken as current).
    files.meta.write_text(json.dumps({"generator": _GENERATOR, "complete": False}) + "\n")
    seeds = _seed_streams(config)
    model = build_model(config, np.random.default_rng(seeds[0]))
    chunk_seeds = seeds[1].spawn((config.num_clients + CHUNK_USERS - 1) // CHUNK_USERS)
    word_users = np.zeros(config.vocab_size, dtype=np.int64)
    tag_users = np.zeros(config.num_tags, dtype=np.int64)
    meta: list[tuple[str, str, int]] = []
    totals = dict.fromkeys(SPLITS, 0)

    def rows():
        chunks = chunk_rows(config, model, seeds[0], chunk_seeds, workers)
        for rows_of_chunk, chunk_meta, wu, tu in chunks:
            meta.extend(chunk_meta)
            word_users[:] += wu
            tag_users[:] += tu
            yield from rows_of_chunk

    # ``meta`` is complete once ``rows()`` is exhausted, before write_sqlite reads it.
    write_sqlite(files.sqlite, rows(), meta, index=True, overwrite=True)
    for _, split, n in meta:
        totals[split] += n
    used = np.flatnonzero(word_users)
    write_word_counts(files.word_count, [model.words[i] for i in used], word_users[used])
    used = np.flatnonzero(tag_users)
    write_tag_counts(files.tag_count, [model.tag_names[i] for i in used], tag_users[used])
    files.meta.write_text(
        json.dumps(
            {
                "generator": _GENERATOR,
                "version": GENERATOR_VERSION,
                "config": asdict(config),
                "examples": totals,
                "clients": {s: sum(1 for _, sp, _ in meta if sp == s) for s in SPLITS},
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    return files


def _seed_streams(config: SyntheticConfig) -> list[np.random.SeedSequence]:
    """The generator's two seed streams: its global model's, and its chunks' parent."""
    return np.random.SeedSequence(config.seed).spawn(2)


def word_tag_model(config: SyntheticConfig) -> WordTagModel:
    """The global model :func:`generate` draws for ``config``: words, tags, each tag's words.

    For analyses that need the generator's ground truth (which words carry which tag), e.g.
    ``experiments/oracle_side_information.py``; it is not public information of a dataset.
    """
    return build_model(config, np.random.default_rng(_seed_streams(config)[0]))


def run_files_around(directory: str | os.PathLike) -> tuple[Path, list[str]] | None:
    """The run, comparison or tuning ``directory`` is, or lies inside, and the files showing it.

    ``directory`` (resolved) is looked at for :data:`OUTPUT_FILES` and each of its ancestors
    for the distinctive ones (a ledger, ``compare.lock``, ``tune.lock``); the nearest that holds
    any is returned with their names, ``None`` when none does. Sixteenth
    review of issue 15: ``data synth --out C/runs`` (a comparison's ``runs/``, also
    ``C/runs/new`` or a directory inside a run) wrote the dataset there, rc 0, as only
    ``directory`` itself was looked at.
    """
    # where the files would go: links and ".." followed (realpath: a link loop is left as
    # written, where Path.resolve raised RuntimeError, a traceback with rc 1; thirty-first
    # review of issue 15, data: task-params.data-dir or cache-dir through a loop)
    real = Path(os.path.realpath(directory))
    for place in (real, *real.parents):
        # an ancestor by the names only ours write (a checkpoint.pt or tune.json alone may be
        # any project's)
        names = OUTPUT_FILES if place == real else _DISTINCTIVE_OUTPUT_FILES
        ours = [name for name in names if os.path.lexists(place / name)]
        if ours:
            return place, ours
    return None


def run_files_note(directory: str | os.PathLike) -> str | None:
    """What shows ``directory`` is, or lies inside, a run, comparison or tuning (else ``None``).

    ``"holds F, G"`` or ``"is inside P, which holds F"`` (:func:`run_files_around`), for the
    one-line refusals of ``data synth --out`` and of a task's synthetic generation.
    """
    around = run_files_around(directory)
    if around is None:
        return None
    place, ours = around
    here = place == Path(os.path.realpath(directory))
    where = "holds" if here else f"is inside {place}, which holds"
    return f"{where} {', '.join(ours)}"


def is_synthetic_dir(root: str | os.PathLike) -> bool:
    """Whether ``root`` holds this generator's marker ``stackoverflow.synthetic.json``.

    :func:`generate` writes the marker before any data (``"complete": false``) and rewrites it
    with the configuration at the end, so a directory it was interrupted in is recognized too.
    """
    meta = read_marker(Path(root) / SYNTHETIC_META_FILE)
    return isinstance(meta, dict) and meta.get("generator") == _GENERATOR


def foreign_sqlite(root: str | os.PathLike, *, links: bool = True) -> str | None:
    """Why ``root``'s ``stackoverflow.sqlite`` is not the one its complete marker describes.

    A complete marker records each split's clients and examples; a file whose
    ``client_metadata`` holds others (or that is not a readable database) was put there after
    the generation: ``None`` when they agree, or nothing can be compared (no file, a marker that
    is incomplete or not ours). With ``links=False`` a file that is a link (symbolic, or with
    other hard links) is not looked at: replacing it removes the link only (sixteenth review of
    issue 15, finding 5), and what it links to is kept.

    Thirty-fifth review of issue 15 (data): the real dataset decompressed into a directory that
    held a synthetic one (its marker left beside it) was replaced by ``data synth --overwrite``
    (rc 0), and a task with ``synth_*`` parameters that matched the marker used it as that
    synthetic dataset.
    """
    files = SyntheticFiles.at(root)
    marker = read_marker(files.meta)
    if not isinstance(marker, dict) or marker.get("generator") != _GENERATOR:
        return None
    clients, examples = marker.get("clients"), marker.get("examples")
    if not (isinstance(clients, dict) and isinstance(examples, dict)) or not files.sqlite.is_file():
        return None
    if not links and (files.sqlite.is_symlink() or files.sqlite.stat().st_nlink > 1):
        return None
    recorded = {
        s: (clients.get(s, 0), examples.get(s, 0)) for s in {*clients, *examples}
    }  # fmt: skip
    recorded = {s: sizes for s, sizes in recorded.items() if sizes != (0, 0)}
    try:
        counts = read_example_counts(files.sqlite)
    except (OSError, ValueError) as exc:
        return f"it is not the database the generator wrote ({exc})"
    found = {s: (int(c.size), sum(c.tolist())) for s, c in counts.items()}
    if found == recorded:
        return None
    said = ", ".join(f"{s} {n:,} clients/{e:,} examples" for s, (n, e) in sorted(found.items()))
    wrote = ", ".join(f"{s} {n}/{e}" for s, (n, e) in sorted(recorded.items()))
    return f"it holds {said or 'no client'}, where the generator wrote {wrote or 'none'}"


def read_marker(path: str | os.PathLike) -> object:
    """The JSON in the marker ``path``; ``None`` if it is missing, unreadable or not a file.

    Only a regular file of at most 1 MiB is read (eighteenth review of issue 15, finding 4: a
    marker that was a FIFO hung ``data synth`` and a task's synthetic generation in ``read``;
    finding 7: one of 20 GB ended in ``MemoryError``).
    """
    path = Path(path)
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return None
        raw = read_at_most(path, _MARKER_LIMIT)  # finding 7: a sparse 20 GB marker
        return None if raw is None else json.loads(raw.decode("utf-8"))
    except (OSError, ValueError):
        return None


def ensure_synthetic(
    out_dir: str | os.PathLike, config: SyntheticConfig | None = None
) -> SyntheticFiles:
    """Return the dataset under ``out_dir``, generating it unless it matches ``config``.

    The sidecar ``stackoverflow.synthetic.json`` records the configuration and generator
    version; if it, the SQLite file and both vocabulary files are present and match, nothing is
    written.
    """
    config = SyntheticConfig() if config is None else config
    files = SyntheticFiles.at(out_dir)
    meta = read_marker(files.meta)
    try:
        current = (
            isinstance(meta, dict)
            and meta.get("version") == GENERATOR_VERSION
            and meta.get("config") == asdict(config)
            and files.sqlite.is_file()
            and files.word_count.is_file()
            and files.tag_count.is_file()
        )
    except (OSError, ValueError):
        current = False
    return files if current else generate(out_dir, config, overwrite=True)
