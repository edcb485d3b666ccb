"""Issue 15, thirteenth hostile review (cases 8 and 9: bounded memory and time, one line, rc 2).

Finding 1: the next-word task's model sizes were unbounded: ``task-params.hidden-size=100000``
(a 160 GB LSTM weight), ``embedding-dim=1000000`` or ``seq-len=10000000`` (every example padded
to it) ended in a ``RuntimeError`` traceback (rc 1) from torch's allocator under a 4 GB limit, and
without a limit grew until the kernel killed them; the tag task's ``(V + 1) K`` model was
unbounded too (only the data's vocabulary and tags limited it). Now at most
``MAX_MODEL_PARAMETERS`` = 2**26 parameters and ``seq_len`` at most 1024, checked before the
model (and, for the LSTM's own size, before any file) is built: rc 2, one line naming the key.

Finding 2: ``compare --noise-multipliers`` with 12,000 values took 27.6 s before refusing the
grid (a quadratic duplicate check formatting every earlier value), and the refusal named
``--seeds``, which the user had not given. Now linear (2.9 s, most of it start-up) and the line
names the flags that multiply the grid.

Run against the code before the fixes (a worktree of e075d24, 2026-11-25) the module fails to
import (``MAX_MODEL_PARAMETERS`` is new); its CLI cases, run by hand there, gave the tracebacks and
the 27.6 s above. The controls are named as such.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fedprivopt.models.next_word_model import parameter_count
from fedprivopt.models.stackoverflow_files import MAX_MODEL_PARAMETERS, check_model_parameters
from fedprivopt.simulation.cells import grid
from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_misuse_cli import ROOT, SMALL, TOY, usage_error

NWP = ROOT / "simulations" / "stackoverflow-nwp.toml"
MINI = ROOT / "data" / "stackoverflow-synthetic-mini"
NWP_MINI = [
    *("--set", f"task-params.data-dir={MINI}", "--set", "task-params.synth-clients=500"),
    *("--set", "population=200", "--set", "task-params.num-users=200"),
    *("--set", "task-params.eval-users=20", "--quiet"),
]


def _nwp(out: Path, *extra: str) -> list[str]:
    return ["simulate", str(NWP), "--rounds", "1", "--out", str(out), *NWP_MINI, *extra]


# -- finding 1: model sizes and seq_len of the StackOverflow tasks -------------------------------
@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("task-params.hidden-size=100000", "task-params.hidden-size"),  # 40 G parameters
        ("task-params.hidden-size=10000000000000", "task-params.hidden-size"),
        # 1.3 G parameters
        ("task-params.embedding-dim=1000000", "task-params.embedding-dim=1000000"),
        ("task-params.seq-len=10000000", "task-params.seq-len must be an integer in [1, 1024]"),
    ],
)
def test_a_next_word_model_too_large_is_one_line_before_allocating(tmp_path, setting, key):
    out = tmp_path / "run"
    line = usage_error(run_cli(_nwp(out, "--set", setting)), key)
    assert "Error" not in line and "allocate" not in line, line
    if "seq-len" not in setting:
        assert f"at most {MAX_MODEL_PARAMETERS:,}" in line, line
    assert not out.exists()  # refused before the run directory was claimed


def test_the_lstm_alone_is_checked_before_any_file_is_generated(tmp_path):
    from fedprivopt.models.next_word import StackOverflowNextWordTask

    data = tmp_path / "data"  # synthetic = true: the task would generate it
    with pytest.raises(ValueError, match=r"^hidden_size=100000, embedding_dim=96 \(with any"):
        StackOverflowNextWordTask(data_dir=data, synth_clients=10, hidden_size=100_000)
    assert not data.exists()


def test_the_tag_model_is_bounded_by_its_effective_sizes(monkeypatch, mini):
    from fedprivopt.models import tag_prediction
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    # the mini preset's dataset in a directory of its own (``mini``): built on the checkout's
    # data/ with the task's default synth-clients, this generated 10,000 clients there when it
    # ran first, and every later run of the mini preset was refused (seen in a full run)
    huge = {"data_dir": mini, "vocab_size": 10**7, "num_tags": 2**25}  # the files' sizes win
    task = StackOverflowTagTask(**huge)  # control: the real limit admits the mini dataset
    size = (task.num_features + 1) * task.num_tags  # 3,981 words and 100 tags: 398,200
    assert sum(p.numel() for p in task.build_model().parameters()) == size
    monkeypatch.setattr(tag_prediction, "check_model_parameters", _limited(size - 1))
    sizes = f"vocab_size={task.num_features} and num_tags={task.num_tags}"
    with pytest.raises(ValueError, match=rf"^{sizes} give a model of {size:,} parameters"):
        StackOverflowTagTask(**huge)


def _limited(limit: int):
    def check(count: int, sizes: str) -> None:
        if count > limit:
            raise ValueError(f"{sizes} give a model of {count:,} parameters; at most {limit:,}")

    return check


def test_the_limit_admits_tffs_shapes_and_refuses_one_more():  # control and bound
    assert parameter_count(10_000, 96, 670) < MAX_MODEL_PARAMETERS  # TFF's next-word model
    assert 10_001 * 500 < MAX_MODEL_PARAMETERS  # TFF's tag-prediction model
    check_model_parameters(MAX_MODEL_PARAMETERS, "x=1")
    with pytest.raises(ValueError, match=r"^x=1 give a model of 67,108,865 parameters"):
        check_model_parameters(MAX_MODEL_PARAMETERS + 1, "x=1")


def test_a_next_word_run_at_the_bounds_still_trains(tmp_path):  # control
    argv = _nwp(tmp_path / "run", "--set", "task-params.seq-len=1024")
    code, _, err = run_cli(argv)
    assert code == 0, err[-2000:]


# -- finding 2: compare's grid check, linear and naming the flags given ------------------------
def test_many_noise_multipliers_are_refused_at_once_naming_the_flag(tmp_path):
    sigmas = ",".join(str(i) for i in range(1, 12_000))
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1"]
    start = time.perf_counter()
    line = usage_error(
        run_cli([*argv, "--out", str(tmp_path / "c"), *SMALL, "--noise-multipliers", sigmas]),
        "argument --noise-multipliers: the grid would hold 11,999 runs",
    )
    assert time.perf_counter() - start < 10, "the grid check is not linear"  # 27.6 s before
    assert "--seeds" not in line, line


def test_the_grid_names_every_flag_that_multiplies_it(monkeypatch):
    with pytest.raises(ValueError, match=r"^argument --strategies/--noise-multipliers/--seeds:"):
        grid(["dp-fedavg", "dp-fedadam"], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 0, 1000)
    monkeypatch.setattr("fedprivopt.simulation.cells.MAX_CELLS", 5)
    with pytest.raises(ValueError, match=r"^argument --seeds: the grid would hold 6 runs"):
        grid(["dp-fedavg"], [1.0], 0, 6)


def test_repeated_noise_multipliers_are_still_refused():  # control of the linear check
    same = 0.5
    with pytest.raises(ValueError, match=r"0.5 is given twice"):
        grid(["dp-fedavg"], [same, 1.0, same], 0, 1)  # the same object twice
    with pytest.raises(ValueError, match=r"1.0 and 1.0000001 name the same run directories"):
        grid(["dp-fedavg"], [1.0, 2.0, 1.0000001], 0, 1)
    assert len(grid(["dp-fedavg", "fedavg"], [0.5, 1.0], 0, 2)) == 6
