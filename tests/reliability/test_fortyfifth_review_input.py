"""Issue 15, forty-fifth hostile review (input: bad settings and data files): tests.

1. The Python API's task parameters of types a run's ``config.toml`` cannot record:
   ``simulate(load_config(P, {"task-params.data-dir": Path(D)}), out)`` (a ``pathlib.Path``,
   as a Python user names a directory; also ``dataclasses.replace(config, task_params=...)``
   and ``RunConfig(...)``), ``{"task-params.num-users": numpy.int64(40)}`` (a count computed
   with NumPy), and ``{"task-params.max-examples-per-user": None}`` (the next-word task's "no
   cap", which the forty-first review says is Python's only). Before: the ``Path`` run released
   its rounds (ledger and checkpoint written) and ended in ``TypeError: Object of type
   PosixPath is not JSON serializable`` before ``summary.json``; ``numpy.int64`` ended so at
   the ledger's header; ``None`` ran (rc 0) and wrote ``max_examples_per_user = "None"`` to
   ``config.toml``, so ``simulate --resume`` refused the run for ever (``"None"``, but the
   ledger records ``null``). Now ``RunConfig`` records each task parameter as ``config.toml``
   does: a path as its text, a NumPy scalar as its number, a tuple as a list; ``None`` (and a
   set, bytes, an object) is refused naming the key, before anything is written
   (``config_values.plain_task_params``).
2. The same for the run's other settings: ``load_config(P, {"cohort-chunk": numpy.int64(8)})``
   (also ``fast-actors``), ``{"seed": numpy.uint64(2**64 - 1)}``, and ``StrategyConfig(seed=2**63)``
   (also ``batch_size``, ``max_examples``, ``min_shares``, ``dp2-s1``: integers without an upper
   bound). Before: ``cohort-chunk`` stayed a NumPy integer, so ``simulate`` released its round
   and ended in ``TypeError: Object of type int64 is not JSON serializable`` before
   ``summary.json`` (``config.toml`` held ``cohort-chunk = "8"``); the ``uint64`` seed passed
   the 64-bit check a Python int meets, and the run (rc 0) could never be resumed
   (``seed: integers must fit in 64 bits``), as ``StrategyConfig(seed=2**63)``'s. Now a NumPy
   scalar is its Python number wherever a configuration is read or a ``RunConfig`` built
   (``config_values.plain_scalar``), and ``StrategyConfig`` refuses an integer above 2**63 - 1
   naming the key (``StrategyConfig._check_64_bits``).
3. ``simulate stackoverflow-tp-mini.toml --set task-params.data-dir=2024`` (a directory named by
   a year; also ``0x10``, ``1e3``, ``inf``, ``task-params.cache-dir``, a strategy table's
   ``task-params``). Before: the value was read as TOML's number and refused as
   ``config: task-params.data-dir must be a non-empty path, got 16`` (for ``0x10``), a value
   the user did not type, with no word of how to name such a directory. Now a directory task
   parameter given by ``--set`` takes the number's text (``config_presets.parse_override``);
   a number for any other key is still a number.
4. ``fedprivopt.data.generate(out, SyntheticConfig(num_clients=numpy.int64(30)))`` (any knob a
   NumPy scalar: ``vocab_size``, ``num_tags``, ``seed``, ``mean_examples_per_client``; also a
   task's ``synth_*`` parameters). Before: the whole dataset was written (122 MB at the default
   knobs), then ``TypeError: Object of type int64 is not JSON serializable`` at its marker, which
   was left ``"complete": false``, so every task refused the directory as an interrupted
   generation. Now ``SyntheticConfig`` holds each NumPy scalar as its Python number
   (``core.checks.plain_scalar``, which ``config_values`` shares).
5. ``simulate toy.toml --strategy adadps --set side-information.Kind=ones`` (the key in another
   case; also ``KIND``, ``kind.x``, a misspelling). Before: ``config: side-information.Kind
   needs an explicit side-information.kind (one of two-level, token-frequency, public-users,
   ones); 'auto' takes no parameters``: told to give the kind the user gave. Now ``unknown key
   'side-information.Kind' (the keys of side-information: kind, bias, …)``, as the other tables
   say it; a known parameter without a kind is still told to give one
   (``SideInformationSpec.__post_init__``).
6. ``simulate toy.toml --set clients-per-round=1e-310`` (also ``5e-324``, ``1e-300``). Before:
   rc 2, ``… must be at most 1e+150 …; lower clip-norm or raise clients-per-round (clip-norm at
   most 0 here)`` (``at most 2e-150`` for ``1e-300``): advice below the smallest clip-norm
   allowed (7.9e-31), which no run can follow. Now ``raise clients-per-round (to at least
   5e-151 for this clip-norm; no clip-norm of at least 7.88861e-31 fits 1e-310)``
   (``StrategyConfig._check_noise_std``); a clip norm that can be lowered is advised as before.
7. ``simulate stackoverflow-tp-mini.toml --set task-params.data-dir=D --set
   task-params.token-cache=true`` by a user who cannot write ``D`` (a dataset another user
   owns, shared read-only), the default ``cache-dir`` inside it (also a ``cache_dir`` that
   cannot be made, ``/proc/x/c``, through the Python API). Before: rc 2 with
   ``D/.fedprivopt-cache: Permission denied`` (``FileNotFoundError`` from the API), naming
   neither the parameter nor a way out. Now ``cache_dir 'D/.fedprivopt-cache' (its default,
   in data_dir): cannot be created (Permission denied), and token_cache = true writes its token
   store there: set cache_dir to a directory you can write``
   (``TagTaskData._check_cache_dir``); a store built beforehand is used as before.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import tomllib

from fedprivopt.data import generate
from fedprivopt.data.synthetic import read_marker
from fedprivopt.data.synthetic_config import SyntheticConfig
from fedprivopt.models import StackOverflowTagTask
from fedprivopt.models.side_information_spec import SideInformationSpec
from fedprivopt.simulation.config import RunConfig, config_to_toml, load_config, resolve_config
from fedprivopt.simulation.config_presets import parse_override
from fedprivopt.simulation.run import simulate
from fedprivopt.strategies.config import StrategyConfig
from fedprivopt.strategies.options import BLOCKS

TOY = "simulations/toy.toml"
MINI = "simulations/stackoverflow-tp-mini.toml"


# -- finding 1: task parameters a run's config.toml cannot record ------------------------------


def test_1_a_path_is_recorded_as_its_text(tmp_path):
    config = load_config(MINI, {"task-params.data-dir": tmp_path / "d"})
    assert config.task_params["data_dir"] == str(tmp_path / "d")  # before: a PosixPath
    replaced = dataclasses.replace(config, task_params={"cache_dir": tmp_path, "seed": 1})
    assert replaced.task_params == {"cache_dir": str(tmp_path), "seed": 1}
    json.dumps(RunConfig(task="toy", task_params={"t": (tmp_path, 1)}).task_params)


def test_1_numpy_scalars_are_recorded_as_numbers(tmp_path):
    config = load_config(TOY, {"task-params.num-users": np.int64(40), "num-server-rounds": 1})
    assert type(config.task_params["num_users"]) is int
    outcome = simulate(config, tmp_path / "r")  # before: TypeError (int64) at the ledger
    assert outcome.rounds_completed == 1
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["config"]["task-params"]["num_users"] == 40


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (None, "is None, which a run's config.toml cannot record"),
        ({1, 2}, "must be a string, number, boolean, array or table"),
        (b"/tmp/d", "must be a string, number, boolean, array or table"),
        ([1, None], "is None"),
    ],
)
def test_1_values_toml_cannot_hold_are_refused_naming_the_key(tmp_path, value, words):
    key = "task-params.max-examples-per-user"
    with pytest.raises(ValueError, match=rf"^{key}\b.*{words}"):
        load_config(MINI, {key: value})  # before: taken, written as "None"
    with pytest.raises(ValueError, match=rf"^{key}\b"):
        RunConfig(task="stackoverflow-nwp", task_params={"max_examples_per_user": value})
    assert not list(tmp_path.iterdir())


# -- finding 2: NumPy scalars and integers above 64 bits in the run's other settings ----------


def test_2_numpy_settings_read_back_from_config_toml():
    config = load_config(TOY, {"cohort-chunk": np.int64(8), "fast-actors": np.int64(0)})
    assert type(config.cohort_chunk) is int  # before: numpy.int64, written as the text "8"
    again = resolve_config(tomllib.loads(config_to_toml(config)))
    assert again == config
    assert type(RunConfig(eval_every=np.int64(2)).eval_every) is int


@pytest.mark.parametrize(
    "make",
    [
        lambda: load_config(TOY, {"seed": np.uint64(2**64 - 1)}),
        lambda: StrategyConfig(seed=2**63),
        lambda: RunConfig(strategy=StrategyConfig(batch_size=2**64)),
        lambda: StrategyConfig(strategy="dp2", options=BLOCKS["dp2"](dp2_s1=2**63)),
    ],
)
def test_2_integers_beyond_64_bits_are_refused(make):
    with pytest.raises(ValueError, match=r"^(seed|batch-size|dp2-s1)\b.*64 bits"):
        make()  # before: taken, and the run's config.toml could not be read back
    assert StrategyConfig(seed=2**63 - 1).seed == 2**63 - 1


# -- finding 3: a directory named by a number, given with --set -------------------------------


@pytest.mark.parametrize("text", ["2024", "0x10", "1e3", "inf", "1_000"])
@pytest.mark.parametrize(
    "key", ["task-params.data-dir", "task-params.cache_dir", "strategies.dp2.task-params.data-dir"]
)
def test_3_a_directory_named_by_a_number_is_its_text(key, text):
    assert parse_override(f"{key}={text}") == (key, text)  # before: 2024, 16, 1000.0, inf


def test_3_numbers_and_quoted_text_elsewhere_are_unchanged():
    assert parse_override("task-params.num-users=0x10") == ("task-params.num-users", 16)
    assert parse_override('task-params.data-dir="7"') == ("task-params.data-dir", "7")
    assert parse_override("task-params.data-dir=true") == ("task-params.data-dir", True)
    config = load_config(MINI, dict([parse_override("task-params.data-dir=2024")]))
    assert config.task_params["data_dir"] == "2024"


# -- finding 4: a synthetic dataset's knobs given as NumPy scalars -----------------------------


def test_4_numpy_knobs_give_a_complete_dataset(tmp_path):
    config = SyntheticConfig(
        num_clients=np.int64(6), vocab_size=np.int32(200), num_tags=np.int64(5), seed=np.uint64(3)
    )
    assert type(config.num_clients) is int and type(config.seed) is int
    files = generate(tmp_path / "d", config, workers=1)  # before: TypeError at the marker
    marker = read_marker(files.meta)
    assert marker["config"]["num_clients"] == 6 and "complete" not in marker


# -- finding 5: a side-information key in another case ----------------------------------------


@pytest.mark.parametrize("key", ["Kind", "KIND", "kind.x", "knd"])
def test_5_an_unknown_side_information_key_is_named_unknown(key):
    with pytest.raises(ValueError, match=rf"^unknown key 'side-information\.{key}' \(the keys"):
        load_config(TOY, {f"side-information.{key}": "ones"})  # before: "needs an explicit kind"
    with pytest.raises(ValueError, match=r"top-k needs an explicit side-information\.kind"):
        SideInformationSpec.parse({"top-k": 5})


# -- finding 6: the advice for a tiny clients-per-round ----------------------------------------


@pytest.mark.parametrize("rate", [5e-324, 1e-310, 1e-300])
def test_6_no_clip_norm_below_its_minimum_is_advised(rate):
    with pytest.raises(ValueError, match=r"raise clients-per-round \(to at least 5e-151") as info:
        StrategyConfig(population=40, clients_per_round=rate, noise_multiplier=0.5)
    assert "lower clip-norm" not in str(info.value)  # before: clip-norm at most 0 (or 2e-150)
    with pytest.raises(ValueError, match=r"lower clip-norm or raise clients-per-round"):
        StrategyConfig(population=40, clients_per_round=1e-160, noise_multiplier=0.5)


# -- finding 7: a token store's directory that cannot be made ----------------------------------


def test_7_a_cache_dir_that_cannot_be_made_is_named(tmp_path):
    generate(tmp_path / "d", SyntheticConfig(num_clients=8, vocab_size=200, num_tags=5), workers=1)
    task = StackOverflowTagTask(
        data_dir=tmp_path / "d", vocab_size=100, num_tags=5, eval_users=2, token_cache=True,
        cache_dir="/proc/fedprivopt-nowhere/c",
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"^cache_dir '/proc/fedprivopt-nowhere/c': cannot be"):
        task.encoded_users()  # before: FileNotFoundError naming no parameter
