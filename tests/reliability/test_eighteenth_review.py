"""Issue 15, eighteenth hostile review: regression tests of its findings.

1. DP-FedAdam with ``tau`` unset (τ_t = σC/m̄, d7b59c2) and DP-AdamBC with ``gamma`` unset
   (γ′ = Φ) at a noise multiplier the config accepts (``simulate stackoverflow-tp-mini.toml
   --strategy dp-fedadam --set noise-multiplier=1e-60``; DP-AdamBC from 1e-30): the model was
   NaN after round 1 ("diverged ... lower the learning rates"), because τ (Φ) below float32's
   smallest normal number rounds to 0 and the coordinates no client moved stepped by 0/0. Now
   τ and the floor are at least ``torch.finfo(dtype).tiny``; fixed values alike.
2. ``tune toy.toml --strategy dp-fedadam --set adam-flavor=flower --grid
   bias-correction=true,false`` ran 5 trials and released "best trial-003
   (bias-correction=True)": Flower's FedAdam always corrects, so the value changed nothing
   (``simulate --set adam-flavor=flower --set bias-correction=false`` said nothing). Now the
   config refuses ``bias-correction = false`` with the flower flavor, naming both keys.
3. A Flower run config whose ``strategy-options-json`` (or ``task-params-json``) held an
   integer of over 4,300 digits was refused with Python's own "Exceeds the limit (4300 digits)
   for integer string conversion", naming no key; a JSON value that is not an object was
   echoed whole (a 1 MB string). Now the message names the key and cuts the value.
4. ``data synth --out D --overwrite`` over a synthetic dataset whose
   ``stackoverflow.word_count`` (``tag_count``, or the marker ``stackoverflow.synthetic.json``)
   was a FIFO hung in ``open`` until killed (also without ``--overwrite`` for the marker, and
   a task's synthetic generation into such a directory). Now special files are removed before
   writing, as links are, and a marker is read only when it is a regular file.
5. At the Python API an integer beyond Python's 4,300-digit limit for text
   (``compose_epsilon([(event, 10**5000)], 1e-5)``, ``calibrate_noise_multiplier(...,
   rounds=10**5000)``, ``calibrate_tree``, ``composed_tuning_epsilon``,
   ``PrivacyAccountant.load_state_dict`` with such a count) was refused with Python's own
   "Exceeds the limit (4300 digits) for integer string conversion", naming no argument, and a
   real parameter of 10**400 (``optim.adam(learning_rate=10**400)``, ``tau``, ...) raised
   ``OverflowError``; a non-number was echoed whole (1 MB). Now ``ValueError`` naming the
   argument, with the number's digit count or the value cut at 80 characters.
6. A token cache (``task-params.token-cache = true``) whose store held a FIFO as
   ``meta.json`` or ``tokens.npy`` hung the run in ``read`` before its first round; its lock
   file a FIFO ended the run in a traceback (``io.UnsupportedOperation: File or stream is not
   seekable``, rc 1), and a data directory's ``.stackoverflow.lock`` a FIFO in ``config: File
   or stream is not seekable.`` (rc 2, naming no file). Now a store holding a special file is
   damaged and rebuilt, and a lock file that is not a regular file is one line naming it.
7. A preset (``simulate X.toml``; also ``compare``, ``tune``, ``deploy local``), a run's
   ``config.toml`` on ``--resume``, or a dataset's ``stackoverflow.word_count``,
   ``stackoverflow.tag_count`` or marker that is a sparse file of 20 GB (``truncate -s 20G``)
   was read whole: ``MemoryError`` traceback (rc 1) under a memory limit, else growth until the
   kernel kills it. Now a preset is read up to 64 MiB, a word-count line up to 1 MiB, a tag-count
   file up to 256 MiB and the marker up to 1 MiB: rc 2, one line naming the file (a marker
   larger than that is not ours).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from pathlib import Path

import pytest
import torch

from fedprivopt import optim
from tests.procs import run_program_forked
from tests.reliability.test_fuzz_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
TOY = str(ROOT / "simulations" / "toy.toml")
TAG_MINI = str(ROOT / "simulations" / "stackoverflow-tp-mini.toml")


def one_line_error(code: int, err: str, *parts: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err and err.endswith("\n") and len(err.splitlines()) == 1, err
    for part in parts:
        assert part in err, err


# -- finding 1: a noise-following tau or floor below float32's smallest normal number ------------
DELTA = torch.tensor([0.5, -0.25, 0.0])  # the last coordinate: no client moved it


@pytest.mark.parametrize(
    ("transform", "variance"),
    [
        (optim.adam(learning_rate=0.1, tau=None), 1e-100),  # tau_t = 1e-50
        (optim.adam(learning_rate=0.1, tau=1e-50), None),
        (optim.flower_fedadam(tau=1e-50), None),
        (optim.adam_bc(learning_rate=0.1, gamma=None, noise_variance=None), 1e-62),
        (optim.adam_bc(learning_rate=0.1, gamma=1e-60, noise_variance=None), 1e-62),
    ],
)
def test_1_a_tau_or_floor_below_the_dtypes_normal_numbers_gives_a_finite_step(transform, variance):
    params = torch.zeros(3)
    state = transform.init(params)
    for _ in range(3):
        step, state = transform.update(DELTA, state, params, noise_variance=variance)
        assert torch.isfinite(step).all(), step
        assert step[2] == 0.0, step
        params = params + step


def test_1_a_representable_tau_is_unchanged():
    params = torch.zeros(3, dtype=torch.float64)
    a = optim.adam(learning_rate=0.1, tau=1e-3, bias_correction=False)
    step, _ = a.update(DELTA.double(), a.init(params), params)
    expected = 0.1 * 0.1 * 0.5 / (math.sqrt(0.01 * 0.25) + 1e-3)
    assert step[0].item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("strategy", "sigma"), [("dp-fedadam", "1e-60"), ("dp-fedadam-bc", "1e-30")]
)
def test_1_a_tiny_noise_multiplier_does_not_make_the_model_nan(tmp_path, mini, strategy, sigma):
    out = tmp_path / "run"
    argv = ["simulate", TAG_MINI, "--strategy", strategy, "--rounds", "2", "--out", str(out)]
    argv += ["--set", f"noise-multiplier={sigma}", "--set", f"task-params.data-dir={mini}"]
    code, _, err = run_cli([*argv, "--quiet"])
    assert code == 0, err
    assert "diverged" not in err, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary.get("diverged") is None, summary


# -- finding 2: bias-correction = false with adam-flavor = "flower" ------------------------------
FLOWER = ["--strategy", "dp-fedadam", "--set", "adam-flavor=flower", "--rounds", "1"]


def test_2_a_tuning_grid_over_an_option_the_flavor_ignores_is_refused(tmp_path):
    out = tmp_path / "tuning"
    argv = ["tune", TOY, *FLOWER, "--grid", "bias-correction=true,false", "--out", str(out)]
    code, _, err = run_cli([*argv, "--mean-trials", "2", "--seed", "1", "--quiet"])
    one_line_error(code, err, "bias-correction", "adam-flavor 'flower'")
    assert not out.exists()


def test_2_simulate_refuses_the_flavor_with_bias_correction_off(tmp_path):
    out = tmp_path / "run"
    argv = ["simulate", TOY, *FLOWER, "--set", "bias-correction=false", "--out", str(out)]
    code, _, err = run_cli([*argv, "--quiet"])
    one_line_error(code, err, "bias-correction", "adam-flavor 'flower'")
    assert not out.exists()


@pytest.mark.parametrize("extra", [[], ["--set", "bias-correction=true"]])
def test_2_the_flavor_with_its_default_still_runs(tmp_path, extra):
    out = tmp_path / "run"
    code, _, err = run_cli(["simulate", TOY, *FLOWER, *extra, "--out", str(out), "--quiet"])
    assert code == 0, err
    assert (out / "summary.json").is_file()


def test_2_the_options_block_refuses_it_by_itself():
    from fedprivopt.strategies.options import AdamOptions

    with pytest.raises(ValueError, match="bias-correction applies only with adam-flavor"):
        AdamOptions(adam_flavor="flower", bias_correction=False)
    assert AdamOptions(adam_flavor="standard", bias_correction=False).bias_correction is False


# -- finding 3: the Flower run config's JSON values ----------------------------------------------
def test_3_an_unreadable_json_number_names_the_run_config_key():
    from fedprivopt.deploy.runconfig import app_config_defaults, run_config_from_flower

    config = app_config_defaults(ROOT)
    for key, raw in [
        ("strategy-options-json", '{"tau": ' + "9" * 5000 + "}"),
        ("task-params-json", '{"seed": ' + "9" * 5000 + "}"),
    ]:
        with pytest.raises(ValueError, match=f"^{key} must be a JSON object"):
            run_config_from_flower({**config, "strategy": "dp-fedadam", key: raw})


def test_3_a_json_value_that_is_not_an_object_is_cut():
    from fedprivopt.wire import json_object

    with pytest.raises(ValueError, match="must be a JSON object, got") as info:
        json_object("task-params-json", '"' + "y" * 1_000_000 + '"')
    assert len(str(info.value)) < 200


# -- finding 4: a FIFO among a dataset's files ----------------------------------------------------
def _cli(
    argv: list[str], tmp_path: Path, timeout: float = 90, address_space: int | None = None
) -> tuple[int, str]:
    """``fedprivopt ARGV`` in a subprocess, stopped (by its PID) if it outlives ``timeout``.

    The child is forked from a server that has imported the program
    (``tests.procs.run_program_forked``), its address space limited to ``address_space`` bytes
    if given."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHONWARNINGS": "ignore",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_HOME": str(tmp_path / "flwr-home"),
    }
    code, _, err = run_program_forked(
        argv, env=env, cwd=Path.cwd(), timeout=timeout, address_space=address_space
    )
    if code is None:
        pytest.fail(f"{argv[:2]} still running after {timeout} s (hung)")
    return code, err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("name", ["stackoverflow.word_count", "stackoverflow.synthetic.json"])
@pytest.mark.parametrize("overwrite", [True, False])
def test_4_data_synth_never_hangs_on_a_fifo_among_the_dataset(tmp_path, name, overwrite):
    out = tmp_path / "data"
    code, _, err = run_cli(["data", "synth", "--out", str(out), "--clients", "5"])
    assert code == 0, err
    (out / name).unlink()
    os.mkfifo(out / name)
    argv = ["data", "synth", "--out", str(out), "--clients", "5"]
    code, err = _cli([*argv, *(["--overwrite"] if overwrite else [])], tmp_path)
    if name.endswith("word_count") and overwrite:
        assert code == 0, err
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    elif name.endswith("word_count"):
        one_line_error(code, err, "already holds a dataset (use --overwrite)")
    else:  # a marker that is not a file is not ours: the dataset is refused as a stranger's
        one_line_error(code, err, "stackoverflow.synthetic.json")
        assert (out / "stackoverflow.sqlite").is_file()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_4_a_fifo_marker_alone_is_replaced_by_a_generation(tmp_path):
    out = tmp_path / "data"
    out.mkdir()
    os.mkfifo(out / "stackoverflow.synthetic.json")
    code, err = _cli(
        ["data", "synth", "--out", str(out), "--clients", "5", "--overwrite"], tmp_path
    )
    assert code == 0, err
    marker = json.loads((out / "stackoverflow.synthetic.json").read_text())
    assert marker["generator"] == "fedprivopt.data.synthetic"


def test_4_unlink_links_keeps_regular_files_and_directories(tmp_path):
    from fedprivopt.core.files import unlink_links

    (tmp_path / "plain").write_text("kept")
    (tmp_path / "dir").mkdir()
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
    unlink_links(tmp_path, ["plain", "dir", "fifo", "absent"])
    assert (tmp_path / "plain").read_text() == "kept" and (tmp_path / "dir").is_dir()
    assert not os.path.lexists(tmp_path / "fifo")


# -- finding 5: integers beyond float64 and beyond Python's 4,300-digit text limit -------------
HUGE = 10**5000


def _event():
    from fedprivopt.privacy import SubsampledGaussianEvent

    return SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=1.0)


def _huge_counts():
    from fedprivopt.privacy import calibrate_noise_multiplier, compose_epsilon
    from fedprivopt.privacy.tree import calibrate_tree
    from fedprivopt.privacy.tuning import TrialCount, composed_tuning_epsilon

    trials = TrialCount("poisson", 5)
    return {
        "compose_epsilon": (lambda: compose_epsilon([(_event(), HUGE)], 1e-5), "count"),
        "calibrate_noise_multiplier": (
            lambda: calibrate_noise_multiplier(
                target_epsilon=5, delta=1e-5, rounds=HUGE, sample_rate=0.1
            ),
            "rounds",
        ),
        "calibrate_tree": (
            lambda: calibrate_tree(5, 1e-5, restart_rounds=10, rounds=HUGE),
            "restart_rounds",
        ),
        "composed_tuning_epsilon": (
            lambda: composed_tuning_epsilon([(_event(), 10)], 1e-5, trials, HUGE),
            "count",
        ),
    }


@pytest.mark.parametrize(
    "function",
    ["compose_epsilon", "calibrate_noise_multiplier", "calibrate_tree", "composed_tuning_epsilon"],
)
def test_5_a_count_beyond_the_text_limit_is_named(function):
    call, name = _huge_counts()[function]
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert name in message and "digits" in message and "4300" not in message, message


@pytest.mark.parametrize("count", [HUGE, -HUGE], ids=["huge", "minus-huge"])
def test_5_an_accountant_state_with_such_a_count_names_the_field(count):
    from fedprivopt.privacy import PrivacyAccountant

    accountant = PrivacyAccountant(accountant="rdp")
    accountant.step(_event())
    state = accountant.state_dict()
    state["ledger"][0]["count"] = count
    with pytest.raises(ValueError, match=r"ledger\[0\]\.count must be an integer .* digits"):
        PrivacyAccountant(accountant="rdp").load_state_dict(state)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"learning_rate": 10**400}, "learning_rate"),
        ({"learning_rate": 0.1, "tau": 10**400}, "tau"),
        ({"learning_rate": 0.1, "tau": -HUGE}, "tau"),
        ({"learning_rate": 0.1, "tau": "x" * 1_000_000}, "tau"),
    ],
    ids=["rate-1e400", "tau-1e400", "tau-minus-huge", "tau-1MB-text"],
)
def test_5_a_real_parameter_beyond_float64_is_a_value_error_naming_it(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name} must be a") as info:
        optim.adam(**kwargs)
    assert len(str(info.value)) < 200


# -- finding 6: special files in a token cache and as a waiting lock ------------------------------
def _blocked_on_fifo(call, fifo: Path, timeout: float = 30):
    """``call()``'s result; fails (releasing the reader by opening ``fifo``) if it hangs."""
    result: dict = {}

    def target():
        try:
            result["value"] = call()
        except BaseException as exc:  # reported below
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        try:  # a writer's open and close gives the blocked reader its end of file
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        thread.join(10)
        pytest.fail(f"blocked reading the FIFO {fifo.name}")
    if "error" in result:
        raise result["error"]
    return result["value"]


def _store(root: Path):
    from fedprivopt.data.token_cache import open_or_build

    def encode(user):
        return [[user, user + 1], [2]], [1, 0]

    return open_or_build(
        root, {"k": 1}, 4, encode, multi_label=False, token_bound=10, label_bound=3, workers=1
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("name", ["meta.json", "tokens.npy"])
def test_6_a_token_store_holding_a_fifo_is_rebuilt_not_read(tmp_path, name):
    first = _store(tmp_path)
    fifo = first.directory / name
    fifo.unlink()
    os.mkfifo(fifo)
    store = _blocked_on_fifo(lambda: _store(tmp_path), fifo)
    assert fifo.is_file() and store.num_users == 4
    assert store.user(2)[0].tolist() == [2, 3, 2]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_6_a_waiting_lock_that_is_a_fifo_is_named(tmp_path):
    from fedprivopt.data.locks import file_lock

    os.mkfifo(tmp_path / "x.lock")
    with pytest.raises(ValueError, match=r"x\.lock is not a regular file"):
        with file_lock(tmp_path / "x.lock"):
            pass
    with file_lock(tmp_path / "y.lock"):  # a regular (new) one is still taken
        assert (tmp_path / "y.lock").is_file()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_6_a_data_directorys_lock_that_is_a_fifo_is_one_line_naming_it(tmp_path, mini):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(mini, data, ignore=shutil.ignore_patterns("stackoverflow.sqlite", ".*"))
    os.mkfifo(data / ".stackoverflow.lock")  # the sqlite file is missing: generation locks it
    out = tmp_path / "run"
    argv = ["simulate", TAG_MINI, "--rounds", "1", "--out", str(out), "--quiet"]
    code, _, err = run_cli([*argv, "--set", f"task-params.data-dir={data}"])
    one_line_error(code, err, ".stackoverflow.lock is not a regular file")
    assert not out.exists()


# -- finding 7: sparse files of 20 GB read whole ---------------------------------------------------
def _cli_under_memory_limit(argv: list[str], tmp_path: Path) -> tuple[int, str]:
    """``fedprivopt ARGV`` in a subprocess whose address space is limited to 6 GiB."""
    return _cli(argv, tmp_path, timeout=180, address_space=6 << 30)


def _sparse(path: Path, size: int = 20 << 30) -> None:
    with path.open("wb") as fh:
        fh.truncate(size)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sparse files, RLIMIT_AS")
def test_7_a_preset_of_20_gb_is_refused_without_reading_it(tmp_path):
    preset = tmp_path / "big.toml"
    _sparse(preset)
    out = tmp_path / "run"
    code, err = _cli_under_memory_limit(["simulate", str(preset), "--out", str(out)], tmp_path)
    # the path may be cut at 80 characters (shown()): the file is named by the message's start
    one_line_error(code, err, "config: config file '", "holds more than 1,048,576 bytes")
    assert not out.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sparse files, RLIMIT_AS")
def test_7_a_runs_config_of_20_gb_is_refused_on_resume(tmp_path):
    run = tmp_path / "run"
    code, _, err = run_cli(["simulate", TOY, "--rounds", "1", "--out", str(run), "--quiet"])
    assert code == 0, err
    (run / "config.toml").unlink()
    _sparse(run / "config.toml")
    code, err = _cli_under_memory_limit(["simulate", "--resume", str(run)], tmp_path)
    one_line_error(code, err, "argument --resume: config file '", "holds more than 1,048,576")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sparse files, RLIMIT_AS")
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("stackoverflow.word_count", "a line of more than 1,048,576 characters"),
        ("stackoverflow.tag_count", "more than 268,435,456 bytes"),
        ("stackoverflow.synthetic.json", None),  # not a marker of ours: the files are used
    ],
)
def test_7_a_dataset_file_of_20_gb_is_not_read_whole(tmp_path, mini, name, expected):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(mini, data, ignore=shutil.ignore_patterns(".*"))
    (data / name).unlink()
    _sparse(data / name)
    out = tmp_path / "run"
    argv = ["simulate", TAG_MINI, "--rounds", "1", "--out", str(out), "--quiet"]
    code, err = _cli_under_memory_limit([*argv, "--set", f"task-params.data-dir={data}"], tmp_path)
    if expected is None:
        assert code == 0, err
    else:
        one_line_error(code, err, name, expected)
        assert not out.exists()
