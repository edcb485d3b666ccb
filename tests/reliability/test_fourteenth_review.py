"""Issue 15, fourteenth hostile review: variants of the ten case classes not tried before.

Finding 1 (a reported ε smaller than what was spent): a tree-aggregation run's checkpoint with
its participation ledger emptied (or cut) and its digest recomputed with the project's own
``state_digest`` resumed with rc 0 and drew the users of rounds 1-2 again in rounds 3-4 of the
same restart period, while one tree event (each user in at most one round a period) was
charged: ε 19.62 reported for users who took part twice. Now refused in seeded and secure mode:
the restored period must hold the users its rounds drew (``metrics.jsonl``'s ``cohort_size``,
else ``clients-per-round`` a round) and at most ``step·m``.

A variant found while fixing: the 20 participants exchanged for the 20 users who had not taken
part (the count unchanged) is refused in seeded mode (full cohorts are the first users of the
seed's shuffle) and, since each round's ledger line of a tree run holds the SHA-256 of the
period's participants, in secure mode too; not with the ledger deleted as well (secure mode,
recorded, not fixed: the files carry no secret and the shuffle is redrawn from OS entropy).

Finding 2: ``compose_epsilon([(event, nan)], δ)`` returned ε 0.0 (a count of 0.5 too; 9.5
composed 9.5 releases), where every other entry point refuses a count that is not an integer.

Finding 3: ``SamplingSpec`` (so ``calibrate_noise_multiplier`` and ``make_round_event``)
silently took ``sample_rate`` over a disagreeing ``population``/``cohort_size`` (Poisson), or
ignored ``sample_rate`` (fixed): the API variant of the ``calibrate`` flags of case 10.

Finding 4: ``deploy local --out D`` over a run advised ``use --resume D``, which ``deploy local``
does not accept (``unrecognized arguments``); it now names ``fedprivopt simulate --resume D``.

Finding 5: ``noise-mechanism = "tree"`` with ``sampling = "fixed"`` was accepted and ignored
(same cohorts and ε as Poisson; ``tune --grid sampling=poisson,fixed`` labelled trials by it).

Finding 6: ``calibrate_noise_multiplier(tol=nan)`` ended in brentq's bracket error naming no
parameter, ``tol=1e9`` in an error blaming ``target_epsilon``, and ``tol=10`` returned σ 13.0 as
"the smallest" σ for a target σ 3.03 meets. A raw ``SubsampledGaussianEvent`` took ``True`` as
its noise multiplier or sample rate (a state it then could not reload), and ``PoissonSampler``
``True`` or ``"0.5"`` as its rate.

Finding 7: ``add_gaussian_noise`` of an int64 vector ended in torch's ``NotImplementedError``
(``"normal_kernel_cpu" not implemented for 'Long'``), and ``gaussian_noise(2.5, …)`` drew 2
entries; now a ``ValueError`` naming ``dtype`` or ``numel``, as ``clip_l2`` does.

Finding 8 (two writers): two ``data synth --out D`` at once (no lock; one ``….partial`` path)
left a ``stackoverflow.sqlite`` of 10,507 clients beside a marker and a success line saying
8,000 users of seed 1, while the other call failed. ``data synth`` now holds the data
directory's lock (``.stackoverflow.lock``, the one a task takes to generate its files) without
waiting: the second exits 2 naming the holder's PID.

Finding 9: ``compare --jobs`` was bounded only by 256: on this 2-CPU machine of 23 GB, 256
workers of a 256-cell grid (about 220 MB each on the toy task) ask for about 56 GB. Now at most
the physical memory over 256 MiB (94 here), checked before anything is written.

Finding 10: a full disk. ``simulate`` on a 20 MB tmpfs filled to 40 kB free ended mid-run in a
40-line ``OSError: [Errno 28] No space left on device`` traceback (rc 1: a flush or close names
no file, so the CLI did not take it for a file error), at the start in one from ``run.lock``'s
``os.pwrite``; ``data synth`` in ``sqlite3.OperationalError: database or disk is full``; and
``data synth --clients 1000000 --user-sizes real`` set out to write about 140 GB on a disk with
51 GB free. Now one line naming the file (``D/checkpoint.pt.tmp: No space left on device``;
``--resume D`` continues once space is freed: 200 rounds, ε 188.2 and accuracy 0.7467 as
uninterrupted), and ``data synth`` refuses a request its disk cannot hold, before writing.

Finding 11: ``deploy local --out D`` where D holds only the user's own ``deploy/`` (scripts, a
``processes.json``) passed the claim of D (a failed deployment leaves its logs there): the run
was written into D and ``deploy/processes.json`` replaced by the deployment's. Now ``deploy/``
must hold only its logs and a ``processes.json`` of its records.

Finding 12 (a stale number in a summary): a run the budget stopped between evaluations
(``eval-every = 3``, target ε 15: 4 rounds) reported round 3's metrics as final (``eval_loss``
0.7999, accuracy line included) beside ``rounds_completed`` 4 and the ε of 4 rounds; round 4's
model, the one released, has 0.7660. With ``eval-every = 5`` its summary had no metric. The
round after which the budget stops a run is now evaluated, as the last round is.

Finding 13: ``data synth --out D`` where D is a run, a comparison or a tuning wrote the dataset
among its files (rc 0); ``compare … --out D`` then refused D for holding them. Refused now, and
so is a task's synthetic generation into such a ``task-params.data-dir`` (it did the same).

Run against the code before the fixes (findings 1-8: a worktree of 8356a8e; finding 9: of
a5fe982, which added ``--jobs``; 2026-11-25) every test here fails except those named as
controls or as not fixed (64 failed, 7 passed there; the control of a ledger without participant
digests fails too, as it first asserts that this version writes them).
"""

from __future__ import annotations

import errno
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fedprivopt.privacy import calibrate_noise_multiplier, compose_epsilon, make_round_event
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.simulation.checkpoint import state_digest
from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_misuse_cli import TOY, usage_error

TREE = ["--set", "noise-mechanism=tree", "--set", "tree-restart-rounds=4", "--quiet"]


# -- finding 1: a tree run's participation ledger in an edited checkpoint ------------------------
@pytest.fixture(scope="module")
def tree_runs(tmp_path_factory):
    """Two finished 2-round tree runs (toy: 40 users, 10 a round, periods of 4): seeded, secure."""
    root = tmp_path_factory.mktemp("tree")
    runs = {}
    for mode in ("seeded", "secure"):
        out = root / mode
        extra = ["--set", "secure=true"] if mode == "secure" else []
        code, _, err = run_cli(["simulate", str(TOY), "--rounds", "2", "--out", str(out), *TREE,
                                *extra])  # fmt: skip
        assert code == 0, err
        runs[mode] = out
    return runs


def _extended(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    config = dst / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 2", "num-server-rounds = 4"))
    return dst


def _forge_participants(run: Path, keep: int) -> None:
    """Keep the first ``keep`` participants of the checkpoint's period; recompute its digest."""
    path = run / "checkpoint.pt"
    state = torch.load(path, weights_only=False)
    cohorts = state["algorithm"]["tree"]["cohorts"]
    assert cohorts["period"] == 0 and cohorts["users"].numel() == 20  # rounds 1-2 drew 20
    cohorts["users"] = cohorts["users"][:keep]
    del state["sha256"]
    state["sha256"] = state_digest(state)
    torch.save(state, path)


@pytest.mark.parametrize("mode", ["seeded", "secure"])
@pytest.mark.parametrize("keep", [0, 15])
def test_a_checkpoint_with_participants_removed_is_refused(tree_runs, tmp_path, mode, keep):
    run = _extended(tree_runs[mode], tmp_path / "run")
    _forge_participants(run, keep)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "run.lock"}
    line = usage_error(run_cli(["simulate", "--resume", str(run), "--quiet"]),
                       "tree participation ledger", f"holds {keep} users", "drew 20")  # fmt: skip
    assert "edited" in line, line
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "run.lock"}
    assert after == before  # nothing written


def _swap_participants(run: Path) -> None:
    """Exchange the checkpoint's 20 participants for the 20 users who did not take part."""
    path = run / "checkpoint.pt"
    state = torch.load(path, weights_only=False)
    cohorts = state["algorithm"]["tree"]["cohorts"]
    others = sorted(set(range(40)) - {int(u) for u in cohorts["users"]})
    cohorts["users"] = torch.tensor(others, dtype=torch.int64)
    del state["sha256"]
    state["sha256"] = state_digest(state)
    torch.save(state, path)


def test_seeded_participants_exchanged_for_others_are_refused(tree_runs, tmp_path):
    run = _extended(tree_runs["seeded"], tmp_path / "run")
    _swap_participants(run)
    usage_error(run_cli(["simulate", "--resume", str(run), "--quiet"]),
                "holds other users than the 20 that the seed's shuffle gives")  # fmt: skip


def test_secure_participants_exchanged_for_others_are_refused_by_the_ledger(tree_runs, tmp_path):
    """Secure mode redraws the shuffle: each round's ledger line holds the period's digest."""
    run = _extended(tree_runs["secure"], tmp_path / "run")
    _swap_participants(run)
    usage_error(run_cli(["simulate", "--resume", str(run), "--quiet"]),
                "is not the one privacy_ledger.jsonl recorded for round 2")  # fmt: skip


def test_not_fixed_secure_participants_exchanged_with_the_ledger_deleted(tree_runs, tmp_path):
    """Recorded, not fixed: with the ledger gone (rebuilt from the checkpoint) only the count
    is left to check in secure mode; the files carry no secret."""
    run = _extended(tree_runs["secure"], tmp_path / "run")
    _swap_participants(run)
    (run / "privacy_ledger.jsonl").unlink()
    code, _, err = run_cli(["simulate", "--resume", str(run), "--quiet"])
    assert code == 0, err


def test_control_a_ledger_without_participant_digests_is_refused(tree_runs, tmp_path):
    """Lines that record their model's digest but not their participants' (no version wrote
    both apart: thirty-eighth review of issue 15, ledger 3, which changed this control from
    "still resumes"; lines of a version before model digests are refused since the
    thirty-sixth review)."""
    import json

    run = _extended(tree_runs["secure"], tmp_path / "run")
    path = run / "privacy_ledger.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert all("participants_sha256" in line for line in lines[1:])
    for line in lines:
        line.pop("participants_sha256", None)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    usage_error(run_cli(["simulate", "--resume", str(run), "--quiet"]),
                "a tree round's line without participants_sha256")  # fmt: skip


def test_the_check_holds_without_metrics_rows(tree_runs, tmp_path):
    run = _extended(tree_runs["secure"], tmp_path / "run")
    _forge_participants(run, 0)
    (run / "metrics.jsonl").unlink()  # then every simulated round drew clients-per-round
    usage_error(run_cli(["simulate", "--resume", str(run), "--quiet"]),
                "holds 0 users", "drew 20 (10 a round)")  # fmt: skip


def test_control_a_participation_ledger_of_another_period_is_refused(tree_runs, tmp_path):
    """Held before (rc 2: ``period 0 is over (the ledger is at restart period 1)``)."""
    run = _extended(tree_runs["seeded"], tmp_path / "run")
    path = run / "checkpoint.pt"
    state = torch.load(path, weights_only=False)
    state["algorithm"]["tree"]["cohorts"]["period"] = 1  # its next rounds would start afresh
    del state["sha256"]
    state["sha256"] = state_digest(state)
    torch.save(state, path)
    # now: "… but its round 2 is step 2 of period 0 (at most 20 users): the checkpoint was edited"
    usage_error(run_cli(["simulate", "--resume", str(run), "--quiet"]), "restart period 1")


@pytest.mark.parametrize("mode", ["seeded", "secure"])
def test_control_an_unedited_tree_run_resumes_with_every_user_once(tree_runs, tmp_path, mode):
    run = _extended(tree_runs[mode], tmp_path / "run")
    code, _, err = run_cli(["simulate", "--resume", str(run), "--quiet"])
    assert code == 0, err
    state = torch.load(run / "checkpoint.pt", weights_only=False)
    assert state["algorithm"]["tree"]["cohorts"]["users"].numel() == 40  # 4 rounds x 10


def test_compare_refuses_to_reuse_such_a_cell(tmp_path):
    out = tmp_path / "cmp"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--noise-multipliers", "0.5",
            "--rounds", "2", "--out", str(out), *TREE]  # fmt: skip
    code, _, err = run_cli(argv)
    assert code == 0, err
    (cell,) = (out / "runs").iterdir()
    _forge_participants(cell, 0)
    usage_error(run_cli(argv), cell.name, "tree participation ledger")


# -- finding 2: compose_epsilon's counts ----------------------------------------------------------
EVENT = SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=1.0)


@pytest.mark.parametrize("accountant", ["rdp", "pld", "prv"])
@pytest.mark.parametrize("count", [math.nan, 0.5, 9.5, -5, math.inf, "10", True])
def test_compose_epsilon_refuses_a_count_that_is_not_an_integer(accountant, count):
    with pytest.raises(ValueError, match=r"^ledger\[0\] count must be an integer >= 0"):
        compose_epsilon([(EVENT, count)], 1e-5, accountant=accountant)


def test_compose_epsilon_names_the_item_and_refuses_a_non_event():
    with pytest.raises(ValueError, match=r"^ledger\[1\] count must be an integer >= 0, got -5"):
        compose_epsilon([(EVENT, 10), (EVENT, -5)], 1e-5)  # was 3.44: the -5 dropped
    with pytest.raises(ValueError, match=r"^ledger\[0\] must pair a SubsampledGaussianEvent"):
        compose_epsilon([("dp-fedavg", 3)], 1e-5)


def test_control_integer_counts_compose_as_before():
    eps = compose_epsilon([(EVENT, 10)], 1e-5)
    assert eps == pytest.approx(3.4416, abs=1e-4)
    assert compose_epsilon([(EVENT, 10), (EVENT, 0)], 1e-5) == eps  # a 0 is no release
    assert compose_epsilon([(EVENT, np.int64(10))], 1e-5) == eps  # numpy integers


# -- finding 3: disagreeing sampling arguments ---------------------------------------------------
@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_calibrate_refuses_a_sample_rate_that_disagrees_with_the_cohort(sampling):
    with pytest.raises(ValueError, match=r"sample_rate=0.5 disagrees with cohort_size/population"):
        calibrate_noise_multiplier(target_epsilon=5, delta=1e-5, rounds=10, sampling=sampling,
                                   sample_rate=0.5, population=100, cohort_size=10)  # fmt: skip


def test_a_cohort_without_a_population_does_not_define_a_rate():
    with pytest.raises(ValueError, match="cohort_size without population"):
        make_round_event(1.0, sample_rate=0.1, cohort_size=10)


def test_control_agreeing_sampling_arguments_are_accepted():
    poisson = make_round_event(1.0, sample_rate=0.1, population=100, cohort_size=10)
    assert poisson.sample_rate == 0.1 and poisson.sampling == "poisson"
    fixed = make_round_event(1.0, sampling="fixed", sample_rate=0.1, population=100, cohort_size=10)
    assert fixed.cohort_size == 10


# -- finding 4: deploy local's advice -------------------------------------------------------------
def test_deploy_local_over_a_run_names_a_command_that_continues_it(tmp_path):
    run = tmp_path / "run"
    code, _, err = run_cli(["simulate", str(TOY), "--rounds", "1", "--out", str(run), "--quiet"])
    assert code == 0, err
    line = usage_error(run_cli(["deploy", "local", str(TOY), "--nodes", "2", "--rounds", "1",
                                "--out", str(run), "--insecure", "--quiet"]),
                       f"use fedprivopt simulate --resume {run} to continue it")  # fmt: skip
    assert not (run / "deploy").exists(), line  # refused before anything was written
    # control: simulate's own refusal still names its own flag
    usage_error(run_cli(["simulate", str(TOY), "--rounds", "1", "--out", str(run), "--quiet"]),
                f"(use --resume {run} to continue")  # fmt: skip


# -- finding 5: sampling under tree aggregation ----------------------------------------------------
def test_tree_aggregation_refuses_fixed_sampling_it_would_ignore(tmp_path):
    out = tmp_path / "run"
    usage_error(run_cli(["simulate", str(TOY), "--rounds", "1", "--out", str(out), *TREE,
                         "--set", "sampling=fixed"]),
                "sampling applies only with noise-mechanism 'gaussian'", "got 'fixed'")  # fmt: skip
    assert not out.exists()


def test_tune_names_the_grid_point_of_fixed_sampling_under_the_tree(tmp_path):
    usage_error(run_cli(["tune", str(TOY), "--grid", "sampling=poisson,fixed", "--mean-trials",
                         "1", "--rounds", "1", "--out", str(tmp_path / "t"), *TREE]),
                "grid point sampling='fixed'", "sampling applies only")  # fmt: skip


# -- finding 6: calibrate's tol, and the raw event's bools ---------------------------------------
@pytest.mark.parametrize("tol", [math.nan, math.inf, 0, -1, 10, 1e9, True, "0.1"])
def test_calibrate_refuses_a_tolerance_outside_its_range(tol):
    with pytest.raises(ValueError, match=r"^tol must be a number in \(0, 1\]"):
        calibrate_noise_multiplier(target_epsilon=5, delta=1e-5, rounds=10, sample_rate=0.1,
                                   tol=tol)  # fmt: skip


def test_control_a_coarse_tolerance_still_meets_the_target():
    sigma = calibrate_noise_multiplier(target_epsilon=2, delta=1e-5, rounds=10, sample_rate=0.1,
                                       tol=1.0)  # fmt: skip
    assert compose_epsilon([(make_round_event(sigma, sample_rate=0.1), 10)], 1e-5) <= 2


@pytest.mark.parametrize("field", ["noise_multiplier", "sample_rate"])
def test_a_raw_event_refuses_a_bool(field):
    values = {"noise_multiplier": 1.0, "sampling": "poisson", "sample_rate": 0.1, field: True}
    with pytest.raises(ValueError, match=field):
        SubsampledGaussianEvent(**values)


@pytest.mark.parametrize("rate", [True, "0.5"])
def test_a_poisson_sampler_refuses_a_rate_that_is_not_a_number(rate):
    from fedprivopt.privacy import PoissonSampler

    with pytest.raises(ValueError, match=r"^sample_rate must be a number in \(0, 1\]"):
        PoissonSampler(10, rate)  # True was kept as the rate; "0.5" failed inside the draw


# -- finding 7: the public noise functions' dtype and length ---------------------------------------
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_add_gaussian_noise_refuses_a_vector_that_is_not_real(dtype):
    from fedprivopt.privacy import add_gaussian_noise

    with pytest.raises(ValueError, match=r"^dtype must be float16, bfloat16, float32 or float64"):
        add_gaussian_noise(torch.zeros(3, dtype=dtype), 1.0, generator=torch.Generator())


def test_gaussian_noise_refuses_a_fractional_length():
    from fedprivopt.privacy import gaussian_noise

    with pytest.raises(ValueError, match=r"^numel must be an integer >= 0, got 2.5"):
        gaussian_noise(2.5, 1.0, generator=torch.Generator())  # was 2 entries
    assert gaussian_noise(3, 1.0, generator=torch.Generator()).shape == (3,)  # control


# -- finding 8: two writers of one data directory --------------------------------------------------
def test_data_synth_refuses_a_directory_another_writer_holds(tmp_path):
    """Two ``data synth --out D`` at once: one failed (``….partial -> …: No such file``), the
    other reported 8,000 users of seed 1 over a ``stackoverflow.sqlite`` of 10,507 clients."""
    import os

    from fedprivopt.data.locks import exclusive_lock

    lock = ".stackoverflow.lock"  # data.locks.DATA_LOCK
    out = tmp_path / "data"
    out.mkdir()
    synth = ["data", "synth", "--clients", "20", "--workers", "1", "--out", str(out)]
    with exclusive_lock(out / lock):  # as another `data synth`, or a task generating
        line = usage_error(run_cli(synth), f"dataset directory {out} is in use by process "
                                           f"{os.getpid()}")  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == [lock], line  # nothing written
    code, _, err = run_cli(synth)
    assert code == 0, err  # control: once released, it writes


# -- finding 9: compare --jobs beyond what memory holds --------------------------------------------
def test_compare_jobs_is_bounded_by_the_machines_memory(tmp_path, monkeypatch):
    """``--jobs 256`` was accepted on a 23 GB machine: 256 workers of about 220 MB each."""
    from fedprivopt.simulation import parallel

    monkeypatch.setattr(parallel, "physical_memory", lambda: 2**30, raising=False)  # 1 GiB: 4
    out = tmp_path / "cmp"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--noise-multipliers", "0.5",
            "--rounds", "1", "--out", str(out), "--quiet"]  # fmt: skip
    line = usage_error(run_cli([*argv, "--jobs", "5"]), "argument --jobs: must be an integer "
                                                        "in [1, 4] on this machine")  # fmt: skip
    assert "1.0 GiB of memory" in line and not out.exists()


# -- finding 10: a full disk ---------------------------------------------------------------------
def _no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")  # as flush/close/pwrite: no file name


def test_a_full_disk_mid_run_is_one_line_naming_the_file(tmp_path, monkeypatch):
    """A 20 MB tmpfs filled to 40 kB free, `simulate --rounds 200`: a 40-line traceback, rc 1."""
    from fedprivopt.simulation import files

    real_fsync, calls = files.os.fsync, []

    def fsync(fd):
        calls.append(fd)
        if len(calls) > 12:  # a few rounds in: the ledger, metrics and checkpoints were written
            _no_space()
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    out = tmp_path / "run"
    line = usage_error(run_cli(["simulate", str(TOY), "--rounds", "20", "--out", str(out),
                                "--quiet"]), "No space left on device")  # fmt: skip
    assert str(out) in line, line  # the file it was writing
    monkeypatch.setattr(files.os, "fsync", real_fsync)  # space freed: the run continues
    code, _, err = run_cli(["simulate", "--resume", str(out), "--quiet"])
    assert code == 0, err


def test_a_full_disk_at_the_lock_is_one_line(tmp_path, monkeypatch):
    from fedprivopt.data import locks

    monkeypatch.setattr(locks.os, "pwrite", _no_space)
    out = tmp_path / "run"
    usage_error(run_cli(["simulate", str(TOY), "--rounds", "1", "--out", str(out), "--quiet"]),
                f"{out / 'run.lock'}: No space left on device")  # fmt: skip


def test_data_synth_on_a_full_disk_is_one_line(tmp_path, monkeypatch):
    import sqlite3

    from fedprivopt.data import sqlite as so_sqlite

    class Full:
        def execute(self, *args):
            raise sqlite3.OperationalError("database or disk is full")

        executemany = execute

        def close(self):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(so_sqlite.sqlite3, "connect", lambda *a, **k: Full())
    out = tmp_path / "data"
    usage_error(run_cli(["data", "synth", "--clients", "20", "--workers", "1", "--out", str(out)]),
                "stackoverflow.sqlite.partial: No space left on device")  # fmt: skip


def test_data_synth_refuses_more_users_than_the_disk_holds(tmp_path, monkeypatch):
    """``--clients 1000000 --user-sizes real`` would write about 140 GB (51 GB were free)."""
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=1_000_000))
    out = tmp_path / "data"
    line = usage_error(run_cli(["data", "synth", "--clients", "20", "--user-sizes", "real",
                                "--workers", "1", "--out", str(out)]),
                       "argument --clients: 20 users of --user-sizes real need about 0.0028 GB",
                       "0.001 GB free")  # fmt: skip
    assert not out.exists(), line
    code, _, err = run_cli(["data", "synth", "--clients", "20", "--workers", "1",
                            "--out", str(out)])  # fmt: skip
    assert code == 0, err  # control: 20 small users (250 kB) fit in 1 MB


def test_a_full_disk_while_writing_a_report_names_the_out_directory(tmp_path, monkeypatch):
    """`tune`/`compare-tuned` on a full disk: ``[Errno 28]`` from a CSV or a plot, no file."""
    import fedprivopt.data

    monkeypatch.setattr(fedprivopt.data, "generate", _no_space)
    out = tmp_path / "data"
    usage_error(
        run_cli(["data", "synth", "--clients", "20", "--workers", "1", "--out", str(out)]),
        f"{out}: [Errno 28] No space left on device (the disk or file server under "
        "--out failed, not the argument)",
    )  # fmt: skip (47th follow-up ledger 3)


# -- finding 11: deploy local into a user's own deploy/ -------------------------------------------
USER_DEPLOY = [{"deploy.sh": "./run-prod\n"}, {"processes.json": '{"mine": 1}'}]


@pytest.mark.parametrize("files", USER_DEPLOY)
def test_deploy_local_refuses_an_out_whose_deploy_dir_is_not_its_logs(tmp_path, monkeypatch, files):
    """An ``--out`` holding only the user's ``deploy/`` passed the claim (a failed deployment
    leaves its logs there): the run was written into it and ``processes.json`` replaced."""
    from fedprivopt.deploy import local

    def started(**_kwargs):
        raise AssertionError("the deployment started")

    monkeypatch.setattr(local, "deploy_local", started)
    out = tmp_path / "project"
    (out / "deploy").mkdir(parents=True)
    for name, text in files.items():
        (out / "deploy" / name).write_text(text)
    usage_error(run_cli(["deploy", "local", str(TOY), "--nodes", "2", "--rounds", "1",
                         "--out", str(out), "--insecure", "--quiet"]),
                f"argument --out: {out / 'deploy'} holds {next(iter(files))}, which deploy "
                "local did not write")  # fmt: skip
    assert sorted(p.name for p in out.rglob("*")) == sorted(["deploy", *files])


# -- finding 12: the final metrics of a run the budget stopped between evaluations ----------------
@pytest.mark.parametrize("every", [3, 5])
def test_a_budget_stop_evaluates_the_last_released_model(tmp_path, every):
    """Target ε 15 allows 4 rounds: with eval-every 3 the summary gave round 3's eval_loss
    0.7999 as final beside rounds_completed 4 (round 4's model: 0.7660); with 5, nothing."""
    import json

    out = tmp_path / "run"
    budget = ["--set", f"eval-every={every}", "--set", "target-epsilon=15"]
    code, _, err = run_cli(["simulate", str(TOY), "--rounds", "20", "--out", str(out), "--quiet",
                            *budget])  # fmt: skip
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["stopped_reason"], summary["rounds_completed"]) == ("budget", 4)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["round"] == 4
    assert summary["final"]["eval_loss"] == rows[-1]["eval_loss"] == pytest.approx(0.7660, abs=1e-4)


# -- finding 13: data synth into a run, a comparison or a tuning ----------------------------------
def test_data_synth_refuses_an_out_that_is_a_run_or_a_comparison(tmp_path):
    """``data synth --out C`` into a comparison wrote the dataset among its files (rc 0), after
    which ``compare … --out C`` refused C for holding them."""
    out = tmp_path / "cmp"
    code, _, err = run_cli(["compare", str(TOY), "--strategies", "dp-fedavg",
                            "--noise-multipliers", "0.5", "--rounds", "1", "--out", str(out),
                            "--quiet"])  # fmt: skip
    assert code == 0, err
    (cell,) = (out / "runs").iterdir()
    for target, needle in ((out, "holds compare.lock"), (cell, "holds privacy_ledger.jsonl")):
        before = sorted(p.name for p in target.iterdir())
        usage_error(run_cli(["data", "synth", "--clients", "10", "--workers", "1", "--out",
                             str(target)]), needle, "not a data directory")  # fmt: skip
        assert sorted(p.name for p in target.iterdir()) == before


def test_a_task_does_not_generate_its_dataset_into_a_comparison(tmp_path):
    """``--set task-params.data-dir=C`` (a comparison) with ``synthetic = true``: the task
    generated its dataset among C's files (rc 0)."""
    from tests.reliability.test_misuse_cli import TAG_MINI

    cmp_dir = tmp_path / "cmp"
    code, _, err = run_cli(["compare", str(TOY), "--strategies", "dp-fedavg",
                            "--noise-multipliers", "0.5", "--rounds", "1", "--out", str(cmp_dir),
                            "--quiet"])  # fmt: skip
    assert code == 0, err
    before = sorted(p.name for p in cmp_dir.iterdir())
    out = tmp_path / "run"
    usage_error(run_cli(["simulate", str(TAG_MINI), "--rounds", "1", "--out", str(out), "--quiet",
                         "--set", f"task-params.data-dir={cmp_dir}"]),
                "task-params.data-dir", "holds compare.lock", "not a data directory")  # fmt: skip
    assert sorted(p.name for p in cmp_dir.iterdir()) == before and not out.exists()
