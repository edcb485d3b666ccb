"""Forty-third review of issue 15: the lead's findings (rows the reviewers left open).

1. ``simulate toy.toml --rounds 1 --set fast-actors=1`` (also ``--engine flower``, ``compare`` and
   ``tune`` with Ray) under a limit on processes (``ulimit -u``, a container's pids limit:
   ``fork`` refused with EAGAIN, injected where the real ``fork_exec`` raises it; the processes
   reviewer's open row). Before: rc 1 and a 30- to 56-line ``BlockingIOError`` traceback
   (``cli.main`` re-raised an ``OSError`` that is not a file's). Now: rc 1 and one line saying a
   process could not be started and what to do (``core.orphans.fork_refusal``, shared with
   ``deploy local``'s line since processes 2), nothing left in ``--out``.
2. The Python API ``simulate(config, "s3://b/r")`` and ``resume("s3://b/r")`` (the input
   reviewer's open row; ``simulate --out s3://b/r`` refuses it since input 5), and the deployment's
   run config ``out = "s3://b/r"``. Before: the run written into ``./s3:/b/r``, rc 0. Now:
   ``ValueError`` naming the argument, before anything is written (``core.files.url_refusal``,
   the one wording the command line, the tasks and ``data.generate`` now share too).
3. ``compare toy.toml ... --out CT`` and ``tune toy.toml ... --out CT`` started together (the
   processes reviewer's open row; also ``compare`` beside ``simulate``). Before: the loser said
   ``comparison 'CT' is in use by another process (its lock file compare.lock was removed or
   replaced, so its PID is unknown)``, where nothing was removed and ``tune.lock`` named the
   holder, and a refused ``compare`` left an empty ``runs/`` in the tuning's directory. Now: the
   refusal names the holder's PID from the other command's lock file
   (``rundir.lock_directory`` reads each of ``rundir.DIRECTORY_LOCKS``), and ``compare`` and
   ``tune`` make ``runs/`` only once they hold the directory.
5. ``optim.dp2(..., frozen=mask.to_sparse())`` or a meta mask, then ``init`` (the privacy
   follow-up's open row; api 3's twin in the public optimizers). Before: torch's
   ``NotImplementedError`` ("Could not run 'aten::all' ... 'SparseCPU'") or ``RuntimeError``
   ("Tensor.item() cannot be called on meta tensors"), naming nothing. Now: ``ValueError`` naming
   ``frozen`` (``optim._checks.check_frozen``, with ``privacy.sparse.dense_problem``).
6. ``PrivacyAccountant.step(event, count=c)`` and ``calibrate_noise_multiplier(rounds=r)`` with
   ``c``, ``r`` an ``int`` subclass storing 5 (100) whose own ``__int__`` and ``__index__`` say 1
   (the ledger follow-up's open row; the relative of reports 2 and follow-up ledger 3 in every
   integer the package checks). Before: charged as 1 event (ε 2.13 where 2.90 was spent) and
   calibrated for 1 round (σ 0.475 where 100 rounds need 0.994). Now: the stored value is used
   (``core.checks.check_int`` returns ``operator.index(value)``, which reads an ``int``
   subclass's own value, not its methods).
7. ``deploy_local(config, out=Path("s3://b/r"))`` (the outputs follow-up's open row; outputs 4's
   twin: ``Path`` writes ``s3:/b/r``, one slash). Before: passed ``check_out``, which looked for a
   URL in the text only, so the deployment would write into ``./s3:/b/r``. Now: ``ValueError``
   naming ``--out`` before anything starts (``deploy.local_checks.check_out`` calls
   ``core.files.url_refusal`` with the path itself).
"""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.deploy.runconfig import check_run_out
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.simulation.rundir import DIRECTORY_LOCKS, lock_directory

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def test_1_simulate_refused_a_process_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    def _execute_child(self, *args, **kwargs):  # fork_exec refused at a pids limit
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", _execute_child)
    out = tmp_path / "run"
    args = ["simulate", str(TOY), "--rounds", "1", "--set", "fast-actors=1", "--out", str(out)]
    code = main([*args, "--quiet"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err and "BlockingIOError" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "simulate: error: a process could not be started" in err
    assert "limit on processes" in err
    assert not out.exists() or not any(out.iterdir())  # nothing written, nothing left


@pytest.mark.parametrize("url", ["s3://b/r", "gs://bucket/run", "file:///tmp/x"])
def test_2_the_python_api_refuses_a_url_as_its_run_directory(tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    config = load_config(TOY, {"num-server-rounds": 1})
    with pytest.raises(ValueError, match=r"^out_dir '.*' is a URL \("):
        simulate(config, url)
    with pytest.raises(ValueError, match=r"^out_dir '.*' is a URL \("):
        resume(url)
    with pytest.raises(ValueError, match=r"^out '.*' is a URL \("):
        check_run_out(url)
    assert not any(tmp_path.iterdir())  # nothing written where the URL would have pointed


def test_3_the_lock_files_read_are_every_command_s():
    from fedprivopt.deploy.local_checks import DEPLOY_LOCK
    from fedprivopt.simulation.cells import COMPARE_LOCK
    from fedprivopt.simulation.files import LOCK_FILE
    from fedprivopt.simulation.tune_dir import TUNE_LOCK

    assert set(DIRECTORY_LOCKS) == {LOCK_FILE, COMPARE_LOCK, TUNE_LOCK, DEPLOY_LOCK}


def test_3_a_comparison_refused_by_a_tuning_names_its_holder(tmp_path):
    import os

    from fedprivopt.simulation.cells import lock_compare_dir
    from fedprivopt.simulation.tune_dir import TUNE_LOCK

    out = tmp_path / "CT"
    out.mkdir()
    with lock_directory(out, TUNE_LOCK, what="tuning"):  # a tune holding CT (in this process)
        with pytest.raises(ValueError, match=f"in use by process {os.getpid()}") as refused:
            with lock_compare_dir(out):
                pass
    assert "removed or replaced" not in str(refused.value)


def test_3_a_refused_compare_leaves_no_runs_in_the_holder_s_directory(tmp_path, capsys):
    from fedprivopt.simulation.tune_dir import TUNE_LOCK

    out = tmp_path / "CT"
    out.mkdir()
    with lock_directory(out, TUNE_LOCK, what="tuning"):
        # the moment both found CT new: the holder's PID file not yet there to see
        (out / TUNE_LOCK).unlink()
        args = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1"]
        code = main([*args, "--out", str(out), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and "in use by another process" in err, err
        assert not any(out.iterdir())  # no runs/ of the refused compare's


@pytest.mark.parametrize("kind", ["sparse", "meta"])
def test_5_an_optimizer_s_frozen_mask_without_values_names_the_argument(kind):
    import torch

    from fedprivopt import optim

    mask = torch.tensor([True, False, False, False])
    frozen = mask.to_sparse() if kind == "sparse" else mask.to("meta")
    with pytest.raises(ValueError, match=r"^frozen must be a dense tensor with values"):
        transform = optim.dp2(
            sgd_learning_rate=0.1,
            adaptive_learning_rate=0.1,
            s1=1,
            s2=1,
            epsilon=1e-3,
            frozen=frozen,
        )
        transform.init(torch.zeros(4))


class _Lying(int):
    """An int that says 1 through its own methods, whatever it stores."""

    def __int__(self):
        return 1

    def __index__(self):
        return 1


def test_6_an_int_subclass_is_read_by_its_stored_value():
    from fedprivopt.core.checks import check_int
    from fedprivopt.privacy import PrivacyAccountant, make_round_event
    from fedprivopt.privacy.calibration import calibrate_noise_multiplier

    assert check_int("count", _Lying(5), 1) == 5 and type(check_int("count", _Lying(5))) is int
    event = make_round_event(1.0, sample_rate=0.1)
    lying, plain = PrivacyAccountant(accountant="rdp"), PrivacyAccountant(accountant="rdp")
    lying.step(event, count=_Lying(5))
    plain.step(event, count=5)
    assert lying.epsilon(1e-5) == plain.epsilon(1e-5)
    settings = {"target_epsilon": 8.0, "delta": 1e-5, "sample_rate": 0.1}
    assert calibrate_noise_multiplier(rounds=_Lying(100), **settings) == (
        calibrate_noise_multiplier(rounds=100, **settings)
    )


@pytest.mark.parametrize("out", [Path("s3://b/r"), "gs://b/r"])
def test_7_deploy_local_s_out_check_refuses_a_url_given_as_a_path(tmp_path, monkeypatch, out):
    from fedprivopt.deploy.local_checks import check_out

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^argument --out: '.*' is a URL \("):
        check_out(out)
    assert not any(tmp_path.iterdir())
