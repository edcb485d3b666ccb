"""Issue 15, forty-third hostile review (input: bad settings and data files): tests.

1. ``simulate stackoverflow-tp-mini.toml --set task-params.data-dir=D --set
   task-params.synth-vocab=5000`` where ``D`` holds the synthetic dataset of ``synth-vocab``
   4000 (also ``synth-tags``, ``synth-seed``; ``--resume R`` from another directory, whose
   relative ``data-dir`` names another dataset there): rc 2, but ``… but D holds a synthetic
   dataset generated with task-params.vocab-size=4000`` (``task-params.num-tags=100``,
   ``task-params.seed=3``): the generator's key, which the command line renamed as another task
   parameter of another value (the preset's ``vocab-size`` is 2000, ``num-tags`` 50), and a
   relative directory not said to be read from the working directory. Now ``… generated with
   task-params.synth-vocab=4000``, the relative directory named as the forty-second review's
   line names it (``StackOverflowDataDir._check_synthetic_meta``).
2. ``simulate stackoverflow-tp-mini.toml --set task-params.data-dir=D/stackoverflow.sqlite/x``
   (a directory under a file; the forty-second review's input 7 took only the file itself):
   ``…/x: Not a directory`` with the preset's ``synthetic = true``, naming no key, and ``…/x:
   missing stackoverflow.sqlite, … pass synthetic=True …`` with ``false``, whose advice gives
   the first line; ``--set task-params.token-cache=true --set task-params.cache-dir=F`` where
   ``F`` is a file (or ``F/x/y``): ``F: exists and is not a directory`` (``Not a directory``)
   at the token store's first use, naming no key. Now ``config: task-params.data-dir '…/x'
   lies under '…/stackoverflow.sqlite', which is a file, not a directory: name the directory
   that holds …`` (``cache-dir`` alike) before anything is read or generated
   (``stackoverflow_datadir.file_in_the_way``).
3. ``simulate P.toml`` (also ``--resume R`` of such a ``config.toml``, ``compare``, ``tune``:
   one reader) of a preset saved in the thirty-first review's encodings without a byte-order
   mark: UTF-16 (``iconv -t utf-16le``), Latin-1 or Windows-1252 (an ``é`` in a comment), and
   with carriage returns alone as line ends (classic Mac OS): rc 2, but ``Found invalid
   character '\\x00' (at line 1, column 2)``, ``'utf-8' codec can't decode byte 0xe9 in position
   5: invalid continuation byte`` (a byte offset, no line) and ``Found invalid character
   '\\r' (at line 1, column 98)``: none names the cause or the fix. Now ``… is not valid TOML:
   it holds a NUL byte between most characters, as UTF-16 does; TOML is UTF-8 (save it as plain
   UTF-8)``, ``line 1, column 6: byte 0xe9 is not UTF-8 (… Latin-1 or Windows-1252) …``, ``its
   lines end in carriage returns alone (classic Mac OS) …`` (``config_presets.preset_text``).
4. ``data info D`` where ``D`` holds TFF's legacy HDF5 splits (``stackoverflow_train.h5``, …)
   and no ``stackoverflow.sqlite`` (the forty-second review's minor row, not fixed then); a task
   on it (``--set task-params.data-dir=D --set task-params.synthetic=false``): ``directory D
   holds no stackoverflow.sqlite``, naming none of the files ``data info`` reads, and ``D:
   missing stackoverflow.sqlite, … (decompress and index the TFF download there; …)``, not
   saying that the files there are of a release the tasks do not read. Now ``… holds no
   stackoverflow.sqlite (it holds the legacy HDF5 splits stackoverflow_train.h5, …: name one, as
   in data info D/stackoverflow_train.h5)`` (``cli_data.cmd_data_info``) and ``… it holds TFF's
   legacy HDF5 splits (…), which the tasks do not read: they read the SQLite release; …``
   (``StackOverflowDataDir._ensure_files``).
5. ``simulate stackoverflow-tp-mini.toml --set task-params.data-dir=s3://bucket/so`` (an object
   store, as a cloud notebook names it; also ``gs://``, ``https://``, ``file://``; the tag
   task's ``cache-dir``; the tasks' Python API) and ``simulate toy.toml --out s3://bucket/run``
   (also ``--resume``, ``data synth --out``, ``data info``, ``compare --out``): rc 0, the text
   taken as the relative directory ``./s3:/bucket/so``, a synthetic dataset generated there and
   trained on where the user named their storage; the run written into ``./s3:/bucket/run``,
   reported as ``results in s3:/bucket/run``. Now rc 2 before anything is read or written:
   ``argument --out: 's3://bucket/run' is a URL (s3://), not a path: fedprivopt reads and writes
   directories of this machine (mount the storage and name its path)``, ``config:
   task-params.data-dir 's3://bucket/so' is a URL …`` (``core.files.url_scheme``, used by
   ``cli_args.check_path_text``, ``stackoverflow_datadir.expanded_dir`` and
   ``data.synthetic.generate``, whose ``out_dir`` alike wrote ``./s3:/b/d``).
6. ``simulate toy.toml --seed 1 --set seed=true`` (also ``--tensorboard --set tensorboard=1``,
   ``--set seed=1 --set seed=true``): rc 0, not a contradiction since ``True == 1`` in Python;
   the value the key refuses (``--set seed=true`` alone is refused) was dropped silently and the
   other used. Now ``argument --seed: 1 contradicts --set seed=True; give one of them``, as for
   any two values (``cli_runs._differ``); ``--set noise-multiplier=1 --set
   noise-multiplier=1.0`` (one number) still runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.data import SyntheticConfig, generate
from fedprivopt.models.tag_prediction import StackOverflowTagTask
from tests.reliability.test_thirtyeighth_review_input import _cli

MINI = "simulations/stackoverflow-tp-mini.toml"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A tiny synthetic dataset (12 clients, 200 words, 10 tags, seed 3) and its parameters."""
    root = tmp_path_factory.mktemp("review43-input")
    config = SyntheticConfig.tiny(num_clients=12, vocab_size=200, num_tags=10, seed=3)
    generate(root / "d", config, workers=1)
    return root / "d", dict(synth_clients=12, synth_vocab=200, synth_tags=10, synth_seed=3)


# -- finding 1: another synthetic dataset named with the generator's keys ----------------------


@pytest.mark.parametrize(
    ("key", "value", "recorded"),
    [("synth_vocab", 300, 200), ("synth_tags", 9, 10), ("synth_seed", 0, 3)],
)
def test_1_other_synth_parameters_name_the_recorded_value_by_its_key(
    synthetic, key, value, recorded
):
    d, params = synthetic
    kw = dict(data_dir=d, vocab_size=50, num_tags=5, num_users=5, eval_users=5)
    with pytest.raises(ValueError) as info:
        StackOverflowTagTask(synthetic=True, **{**params, key: value}, **kw)
    assert f"generated with {key}={recorded};" in str(info.value)
    # the command line: the key of the config, and no other task parameter named
    dashed = key.replace("_", "-")
    sets = [f"data-dir={d}", "vocab-size=50", "num-tags=5"]
    sets += [f"{k.replace('_', '-')}={v}" for k, v in {**params, key: value}.items()]
    code, lines = _cli(
        "simulate", MINI, "--rounds", "1", "--quiet", "--out", str(d.parent / f"r-{key}"),
        *(arg for text in sets for arg in ("--set", f"task-params.{text}")),
    )  # fmt: skip
    assert code == 2 and len(lines) == 1, lines
    assert f"generated with task-params.{dashed}={recorded};" in lines[0], lines
    for other in ("vocab-size", "num-tags", "seed"):
        assert f"task-params.{other}=" not in lines[0].split("but", 1)[1], lines


def test_1_a_relative_data_dir_is_said_to_be_read_from_the_working_directory(
    synthetic, monkeypatch
):
    d, params = synthetic
    monkeypatch.chdir(d.parent)
    kw = dict(vocab_size=50, num_tags=5, num_users=5, eval_users=5)
    with pytest.raises(ValueError) as info:
        StackOverflowTagTask(data_dir="d", synthetic=True, **{**params, "synth_seed": 0}, **kw)
    line = str(info.value)
    assert f"d (a relative data_dir, read from the working directory: {d.parent})" in line


# -- finding 2: a data or cache directory under a file ----------------------------------------


@pytest.mark.parametrize("synthetic", [True, False])
def test_2_a_data_dir_under_a_file_names_the_key_and_the_file(synthetic, tmp_path):
    from fedprivopt.models.next_word import StackOverflowNextWordTask

    sqlite = tmp_path / "stackoverflow.sqlite"
    sqlite.write_bytes(b"")
    d = sqlite / "x" / "y"
    for task in (StackOverflowTagTask, StackOverflowNextWordTask):
        with pytest.raises(ValueError) as info:
            task(data_dir=d, synthetic=synthetic, vocab_size=50, num_users=5, eval_users=5)
        assert str(info.value).startswith(
            f"data_dir {str(d)!r} lies under {str(sqlite)!r}, which is a file, not a directory"
        ), info.value
        assert str(info.value).endswith(f"({tmp_path})")
    code, lines = _cli(
        "simulate", MINI, "--rounds", "1", "--quiet", "--out", str(tmp_path / "r"),
        "--set", f"task-params.data-dir={d}", "--set", f"task-params.synthetic={synthetic}".lower(),
    )  # fmt: skip
    assert code == 2 and len(lines) == 1, lines
    assert f"config: task-params.data-dir {str(d)!r} lies under" in lines[0]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("under", [False, True])
def test_2_a_cache_dir_that_is_or_lies_under_a_file_names_the_key(synthetic, tmp_path, under):
    d, params = synthetic
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    cache = afile / "x" / "y" if under else afile
    kw = dict(data_dir=d, vocab_size=50, num_tags=5, num_users=5, eval_users=5, **params)
    with pytest.raises(ValueError) as info:
        StackOverflowTagTask(token_cache=True, cache_dir=cache, **kw)
    line = str(info.value)
    assert line.startswith(f"cache_dir {str(cache)!r}"), line
    assert f"{str(afile)!r}, which is a file" in line if under else "is a file," in line
    assert afile.read_text() == "mine\n"
    task = StackOverflowTagTask(token_cache=True, cache_dir=tmp_path / "new" / "c", **kw)
    assert task.encoded_users() is not None  # a directory to make is taken, as before


# -- finding 3: a preset in another encoding or with other line ends --------------------------


@pytest.mark.parametrize(
    ("how", "needle"),
    [
        ("utf-16le", "it holds a NUL byte between most characters, as UTF-16 does"),
        ("utf-16be", "it holds a NUL byte between most characters, as UTF-16 does"),
        ("latin-1", "line 2, column 8: byte 0xe9 is not UTF-8 (the file was saved in another"),
        ("cr", "its lines end in carriage returns alone (classic Mac OS)"),
    ],
)
def test_3_a_preset_in_another_encoding_names_the_cause(tmp_path, how, needle):
    from fedprivopt.simulation.config import load_config

    text = "strategy = 'dp-fedavg'\n# a café\nnoise-multiplier = 0.5\n"
    raw = text.replace("\n", "\r").encode() if how == "cr" else text.encode(how)
    path = tmp_path / "p.toml"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=r"is not valid TOML: ") as info:
        load_config(path)
    assert needle in str(info.value), info.value
    code, lines = _cli("simulate", str(path), "--out", str(tmp_path / "r"), "--quiet")
    assert code == 2 and len(lines) == 1 and needle in lines[0], lines
    assert not (tmp_path / "r").exists()


def test_3_utf8_and_crlf_presets_still_read(tmp_path):
    from fedprivopt.simulation.config import load_config

    path = tmp_path / "p.toml"
    for text in ("# café ✓\nnoise-multiplier = 0.5\n", "noise-multiplier = 0.5\r\n"):
        path.write_bytes(text.encode())
        assert load_config(path, {"task": "toy"}).strategy.noise_multiplier == 0.5


# -- finding 4: a directory of legacy HDF5 splits ---------------------------------------------


def test_4_a_directory_of_legacy_hdf5_splits_names_them(tmp_path):
    from fedprivopt.data.hdf5 import write_hdf5
    from fedprivopt.data.stackoverflow import StackOverflowExample

    example = StackOverflowExample(
        tokens="a b", title="t", tags="x", creation_date="2010", score=1, type="question"
    )
    d = tmp_path / "d"
    d.mkdir()
    for name in ("stackoverflow_train.h5", "stackoverflow_test.h5"):
        write_hdf5(d / name, {"u1": [example]})
    code, lines = _cli("data", "info", str(d))
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].endswith(
        "holds no stackoverflow.sqlite (it holds the legacy HDF5 splits stackoverflow_train.h5, "
        f"stackoverflow_test.h5: name one, as in data info {d}/stackoverflow_train.h5)"
    ), lines
    assert _cli("data", "info", str(d / "stackoverflow_train.h5"))[0] == 0  # the advice works
    with pytest.raises(FileNotFoundError) as info:
        StackOverflowTagTask(data_dir=d, synthetic=False, vocab_size=5, num_users=1, eval_users=1)
    assert "legacy HDF5 splits (stackoverflow_train.h5, stackoverflow_test.h5)" in str(info.value)
    assert "which the tasks do not read" in str(info.value), info.value
    code, lines = _cli("data", "info", str(tmp_path))  # a directory of neither: as before
    assert code == 2 and lines[0].endswith(f"directory {tmp_path} holds no stackoverflow.sqlite")


# -- finding 5: a URL where a directory belongs -----------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", str(ROOT / "simulations/toy.toml"), "--quiet", "--out", "s3://b/run"],
        ["simulate", "--resume", "gs://b/run"],
        ["data", "synth", "--out", "https://example.org/d", "--clients", "3"],
        ["data", "info", "file:///tmp/d"],
    ],
)
def test_5_a_url_given_as_a_path_is_refused(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, lines = _cli(*argv)
    assert code == 2 and len(lines) == 1, lines
    assert "is a URL (" in lines[0] and "not a path" in lines[0], lines
    assert list(tmp_path.iterdir()) == []  # no ./s3:/b/run, ./https:/example.org/d


def test_5_a_url_as_the_data_or_cache_dir_is_refused(tmp_path, monkeypatch, synthetic):
    d, params = synthetic
    monkeypatch.chdir(tmp_path)
    code, lines = _cli(
        "simulate", str(ROOT / MINI), "--rounds", "1", "--quiet", "--out", str(tmp_path / "r"),
        "--set", "task-params.data-dir=s3://bucket/so",
    )  # fmt: skip
    assert code == 2 and len(lines) == 1, lines
    assert "config: task-params.data-dir 's3://bucket/so' is a URL (s3://)" in lines[0], lines
    assert list(tmp_path.iterdir()) == []  # was: ./s3:/bucket/so, a synthetic dataset
    kw = dict(vocab_size=50, num_tags=5, num_users=5, eval_users=5, **params)
    with pytest.raises(ValueError, match=r"^cache_dir 'gs://b/c' is a URL \(gs://\)"):
        StackOverflowTagTask(data_dir=d, token_cache=True, cache_dir="gs://b/c", **kw)
    assert StackOverflowTagTask(data_dir=d, **kw).num_users == 5  # a path as before
    config = SyntheticConfig.tiny(num_clients=3, vocab_size=200, num_tags=10)
    with pytest.raises(ValueError, match=r"^out_dir 's3://b/d' is a URL \(s3://\)"):
        generate("s3://b/d", config, workers=1)  # the Python API of data synth
    assert list(tmp_path.iterdir()) == []


# -- finding 6: a boolean beside a number of one key ------------------------------------------


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        (["--seed", "1", "--set", "seed=true"], "argument --seed: 1 contradicts --set seed=True"),
        (["--tensorboard", "--set", "tensorboard=1"], "argument --tensorboard: True contradicts"),
        (
            ["--set", "seed=1", "--set", "seed=true"],
            "seed=True contradicts an earlier --set seed=1",
        ),
    ],
)
def test_6_a_boolean_and_a_number_of_one_key_contradict(tmp_path, given, needle):
    toy = str(ROOT / "simulations/toy.toml")
    code, lines = _cli(
        "simulate", toy, "--rounds", "1", "--quiet", "--out", str(tmp_path / "r"), *given
    )
    assert code == 2 and len(lines) == 1 and needle in lines[0], lines
    assert not (tmp_path / "r").exists()
