"""Forty-first review of issue 15: the lead's findings.

1. (the processes reviewer's open row, for the data owner) ``hdf5_checks._probe_in_child``
   reads a variable-length HDF5 dataset once in a forked child, with a timeout. If the wait
   ended another way (a signal to the parent, an error, the parent killed), the child was
   neither stopped by its PID nor set to die with its parent: with a read that hangs it lived
   on, holding every descriptor it inherited (a run directory's lock: the next ``--resume`` was
   refused naming a dead PID). Now the child is killed and reaped on every way out of the wait,
   and it dies with its parent (``core.orphans.die_with_parent``).
2. (the ledger follow-up's open row) ``compare`` of a cell to resume holding a directory where
   a resume replaces a file: refused only at the cell's turn, after the report was removed and
   the cells before it ran. Now refused when planned, the report and the other cells unchanged.
3. (the privacy follow-up's open row) ``NoisyMeanAggregator.aggregate`` called directly with
   updates of a tensor subclass that reads its norm as 0.001, a ``RowSparse`` subclass whose
   ``add_to`` scales, or a batch of such tensors: summed unclipped (mean 90 where 0.9 is the
   most). Now every update is rebuilt of plain parts (``privacy.plain.own_update``) and such an
   update is rejected alone.
4. (the privacy follow-up's open row) api 3's twin: a float32 model with an int64 buffer of
   2**40 + 1 and a cohort trainer of its own, on the fast engine: rc 0, the buffer 2**40 in the
   initial and the evaluated model. Now ``run.build_run`` refuses it, naming the entry.
5. (the privacy follow-up's open row) api 4's twin: ``drive_round`` with the fast engine's
   trainer (``make_cohort_train``) inside ``torch.inference_mode()`` raised "Inference tensors
   do not track version counter". Now its copies, its sequential trainer and each step of a
   cohort trainer are made with gradients, and the rounds equal rounds driven outside it.
6. (the outputs follow-up's open row) ``simulate --out D/sub`` (``compare`` alike) while
   another run held ``D`` with only ``run.lock`` written: rc 0, a run written inside that run's
   directory. Now refused by the command line's ``--out`` check, naming the holder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.data import hdf5_checks
from fedprivopt.models import build_task
from fedprivopt.models.task import TaskError
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.sparse import RowSparse, RowSparseBatch
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.fast import make_cohort_train
from fedprivopt.simulation.run import build_run, simulate
from fedprivopt.simulation.rundir import lock_directory
from fedprivopt.strategies.core import drive_round
from tests.procs import alive, proc_stat
from tests.reliability.test_misuse_cli import TOY


class _Hangs:
    """A dataset whose read never ends (what a damaged file does to HDF5)."""

    def __getitem__(self, key):
        time.sleep(3600)


def _forks(monkeypatch) -> list[int]:
    pids: list[int] = []
    fork = os.fork

    def recorded():
        pid = fork()
        if pid:
            pids.append(pid)
        return pid

    monkeypatch.setattr(hdf5_checks.os, "fork", recorded)
    return pids


def test_1_an_error_out_of_the_wait_stops_the_child_by_its_pid(monkeypatch):
    pids = _forks(monkeypatch)
    calls = []

    def interrupted(seconds):
        calls.append(seconds)
        if len(calls) == 20:
            raise KeyboardInterrupt  # Ctrl-C while the parent waits
        time.sleep(seconds)

    monkeypatch.setattr(hdf5_checks.time, "sleep", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            hdf5_checks._probe_in_child(_Hangs(), "f.h5: tokens", timeout=60)
        (pid,) = pids
        assert proc_stat(pid) is None  # killed and reaped, not left reading
    finally:
        for pid in pids:
            if proc_stat(pid) is not None:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


CHILD = """
import sys, time
from fedprivopt.cli import main
from fedprivopt.data import hdf5_checks
from fedprivopt.models import build_task
from fedprivopt.models.task import TaskError
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.sparse import RowSparse, RowSparseBatch
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.fast import make_cohort_train
from fedprivopt.simulation.run import build_run, simulate
from fedprivopt.simulation.rundir import lock_directory
from fedprivopt.strategies.core import drive_round
fork = hdf5_checks.os.fork
def recorded():
    pid = fork()
    if pid:
        print(pid, flush=True)
    return pid
hdf5_checks.os.fork = recorded
class Hangs:
    def __getitem__(self, key):
        time.sleep(3600)
hdf5_checks._probe_in_child(Hangs(), "f.h5: tokens", timeout=600)
"""


def test_1_the_child_dies_with_a_parent_killed_while_it_waits():
    parent = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    child = {}
    try:
        pid = int(parent.stdout.readline())
        child = {pid: proc_stat(pid)[19]}
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the probe's child outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for pid in alive(child):
            os.kill(pid, signal.SIGKILL)


# 2. (the ledger follow-up's open row, for compare) A cell to resume with a directory where a
#    resume replaces a file (ledger 1, refused by ``run.resume``): compare's plan passed it, so
#    the refusal came only at the cell's turn, after the report was removed and the cells
#    before it had run. Now the plan refuses it (``cell_plans._audited`` calls
#    ``files.check_replaced``): rc 2, one line, the report and the other cell as they were.

SMALL = ["--rounds", "2", "--quiet", "--set", "population=12", "--set", "clients-per-round=4",
         "--set", "task-params.num-users=12", "--set", "secure=true"]  # fmt: skip


def _unfinished(cell) -> None:
    """``cell`` as if stopped after round 1 (its round-2 files cut, its older checkpoint)."""
    (cell / "summary.json").unlink()
    for name in ("privacy_ledger.jsonl", "metrics.jsonl"):
        lines = (cell / name).read_text().splitlines(keepends=True)
        (cell / name).write_text("".join(x for x in lines if json.loads(x).get("round", 0) <= 1))
    shutil.copyfile(cell / "checkpoint.prev.pt", cell / "checkpoint.pt")


def test_2_compare_refuses_when_planned_a_cell_whose_resume_would_fail(tmp_path, capsys):
    out = tmp_path / "C3"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg,dp-fedadam", "--out", str(out), *SMALL]
    assert main(argv) == 0
    cells = sorted((out / "runs").iterdir())
    late = cells[-1]
    _unfinished(late)
    (late / "checkpoint.pt.tmp").mkdir()
    kept = {p: p.read_bytes() for p in [out / "summary.csv", out / "report.md"]}
    kept.update({p: p.read_bytes() for p in cells[0].iterdir() if p.is_file()})
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoint.pt.tmp' is a directory" in err[0], err
    assert {p: p.read_bytes() for p in kept} == kept


# 3. (the privacy follow-up's open row, for mechanisms) The documented aggregator called
#    directly with updates of a torch.Tensor subclass whose __torch_function__ reads norms as
#    0.001: accepted 9 of 9, mean 100 · 9 / 10 = 90 in every entry where C = 1 allows 0.9 (api
#    1's check was only in the strategies' aggregation). Now the aggregator rebuilds every update
#    of plain parts (``privacy.plain.own_update``) and rejects such an update alone.


class _Small(torch.Tensor):
    """A tensor whose norms read 0.001."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        if getattr(func, "__name__", "") in ("norm", "vector_norm", "linalg_vector_norm"):
            return torch.as_tensor(0.001, dtype=torch.float64)
        return out


class _Scaled(RowSparse):
    """A RowSparse that adds 1000 times what it holds."""

    def add_to(self, total, alpha=1.0):
        return super().add_to(total, alpha=alpha * 1000)


def _entries(kind: str):
    if kind == "tensor":
        return [(u, torch.full((4,), 100.0).as_subclass(_Small)) for u in range(9)]
    if kind == "row-sparse":
        rows, values = torch.tensor([0]), torch.full((1, 2), 0.1)
        return [(u, _Scaled(rows, values, 4)) for u in range(9)]
    batch = RowSparseBatch(tuple(range(9)), torch.zeros(9, dtype=torch.int64),
                           torch.full((9, 2), 100.0).as_subclass(_Small),
                           torch.arange(10, dtype=torch.int64), 4)  # fmt: skip
    return [batch]


@pytest.mark.parametrize("kind", ["tensor", "row-sparse", "batch"])
def test_3_the_aggregator_rejects_an_update_that_is_not_plain(kind):
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=0.0, expected_cohort_size=10)
    result = agg.aggregate(_entries(kind), dim=4, generator=torch.Generator().manual_seed(0))
    assert sorted(result.rejected) == list(range(9))
    assert result.metrics["accepted"] == 0.0
    assert float(result.delta_tilde.abs().max()) == 0.0


# 4. (the privacy follow-up's open row, for the lead) api 3's twin path: a float32 model with an
#    int64 buffer of 2**40 + 1 and a cohort trainer of its own, on the fast engine, reached
#    neither model_spec nor LocalTrainer: rc 0, the buffer 2**40 in the initial and evaluated
#    model. Now ``build_run`` refuses it, naming the entry.


class _Pairs:
    def __init__(self, pairs):
        self.pairs, self.users, self.norms = pairs, [u for u, _ in pairs], [0.0] * len(pairs)

    def split(self):
        return self.pairs


class _Zeros:
    """A cohort trainer of one's own: every user's update is zero."""

    def train_batches(self, params, users, **_):
        for user in users:
            yield _Pairs([(user, torch.zeros_like(params))])


def test_4_the_fast_engine_refuses_an_integer_buffer_the_flat_dtype_rounds(tmp_path):
    task = build_task("toy", num_users=12)
    build = task.build_model

    def seeded():  # the toy's model, with a hashing seed beyond float32's exact integers
        model = build()
        model.register_buffer("seed", torch.tensor(2**40 + 1, dtype=torch.int64))
        return model

    task.build_model = seeded
    task.cohort_trainer = lambda device, chunk_users: _Zeros()
    sets = {"population": 12, "task-params.num-users": 12, "num-server-rounds": 1}
    with pytest.raises(TaskError, match=r"entry 'seed' holding 1099511627777"):
        simulate(load_config(TOY, sets), tmp_path / "r", task=task)  # was rc 0, the buffer 2**40
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


# 5. (the privacy follow-up's open row, for the lead) api 4's twin on the fast engine:
#    ``drive_round(alg, r, make_cohort_train(task, ...))`` inside ``torch.inference_mode()``
#    raised "Inference tensors do not track version counter" (the trainer's copies, its
#    sequential trainer built on first use, the cohort trainer's steps all in the caller's
#    mode). Now the rounds give the model of rounds driven outside it.


MINI = "stackoverflow-tp-mini.toml"


@pytest.mark.parametrize("preset, vectorize", [("toy.toml", False), (MINI, True), (MINI, False)])
def test_5_the_fast_engines_trainer_runs_inside_inference_mode(preset, vectorize):
    models = []
    for inference in (True, False):
        task, alg = build_run(load_config(TOY.parent / preset, {"num-server-rounds": 2}))
        train = make_cohort_train(task, device="cpu", vectorize=vectorize)
        with torch.inference_mode(inference):
            for r in (1, 2):
                drive_round(alg, r, train)  # was RuntimeError (a TaskError naming loss())
        models.append(alg.params.clone())
    assert torch.equal(models[0], models[1])


# 6. (the outputs follow-up's open row) ``simulate --out D/sub`` while another run held ``D``
#    with only ``run.lock`` written (a start): rc 0, a whole run written inside that run's
#    directory (``deploy local`` was refused since the follow-up's outputs 7). Now the command
#    line's ``--out`` check refuses it too (``deploy.out_checks.refuse_inside_held``).


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_6_out_inside_a_held_start_is_refused(tmp_path, capsys, command):
    held = tmp_path / "D"
    held.mkdir()
    with lock_directory(held, "run.lock", what="a start"):  # as a start of another process
        code = main([command, str(TOY), "--out", str(held / "sub"), "--rounds", "1", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "is inside the run directory" in err[0], err
    assert sorted(p.name for p in held.iterdir()) == ["run.lock"]
