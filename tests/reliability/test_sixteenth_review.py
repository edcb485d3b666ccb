"""Issue 15, sixteenth hostile review: the minor findings the fifteenth left, and new variants.

Known findings of the fifteenth review, fixed here:

a. ``data synth --out C/runs`` (a comparison's ``runs/``, ``C/runs/new``, a directory inside a
   run) wrote the dataset there (rc 0): only ``--out`` itself was looked at for a run's files.
   Now refused, rc 2, one line naming ``--out`` and the run, comparison or tuning it is inside;
   a task's synthetic generation (``task-params.data-dir``) alike.
b. ``data synth --out L/sub`` with ``L`` a dangling symbolic link said ``L: exists and is not a
   directory``; now ``'L' is a symbolic link to nothing ('target')`` (every ``--out``).
c. ``TrialCount("poisson", numpy.float32(3.0))`` was refused (``float64`` was accepted); every
   real scalar is accepted now, bools, strings, NaN and out-of-range means are still refused.
d. ``PoissonSampler.sample(-1)`` (and ``2.5``, ``True``; ``FixedSizeSampler`` alike) drew a
   cohort; now ``ValueError`` naming ``round_num``.
e. ``compose_epsilon([(event, 10**400)], δ)`` raised ``OverflowError``; now ``ValueError``
   naming the count and its range [0, 10**300] (``epsilon``/``calibrate``: one line naming
   ``--rounds/--events-per-round``).
f. Ctrl-C of ``data synth`` printed ``fedprivopt data: interrupted`` (``deploy local``:
   ``fedprivopt deploy: interrupted``); now the command as typed.
g. ``--out`` on a read-only file system said ``(permission denied)``; now
   ``(read-only file system)``, naming the directory.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from fedprivopt.privacy.accounting import SubsampledGaussianEvent, compose_epsilon
from fedprivopt.privacy.sampling import FixedSizeSampler, PoissonSampler
from fedprivopt.privacy.tuning import TrialCount
from tests.reliability.test_fuzz_cli import run_cli

TOY = str(Path(__file__).resolve().parents[2] / "simulations" / "toy.toml")
EVENT = SubsampledGaussianEvent(1.0, "poisson", 0.1)


def one_line_error(code: int, err: str, *parts: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err and err.endswith("\n") and len(err.splitlines()) == 1, err
    for part in parts:
        assert part in err, err


@pytest.fixture(scope="module")
def comparison(tmp_path_factory) -> Path:
    """A finished one-cell, one-round comparison ``C``."""
    out = tmp_path_factory.mktemp("cmp") / "C"
    code, _, err = run_cli(
        ["compare", TOY, "--strategies", "dp-fedavg", "--rounds", "1", "--out", str(out), "--quiet"]
    )
    assert code == 0, err
    return out


@pytest.mark.parametrize("inside", ["runs", "runs/new", "runs/dp-fedavg__sigma0.5__seed0/x"])
def test_a_data_synth_refuses_a_directory_inside_a_comparison_or_run(comparison, inside):
    target = comparison / inside
    before = sorted(p.name for p in (comparison / "runs").iterdir())
    code, _, err = run_cli(["data", "synth", "--out", str(target), "--clients", "5"])
    one_line_error(code, err, "argument --out:", "is inside")
    assert "not a data directory" in err or "a run's directory holds its own files" in err
    assert sorted(p.name for p in (comparison / "runs").iterdir()) == before
    assert not (target / "stackoverflow.sqlite").exists()


def test_a_data_synth_beside_a_comparison_is_still_written(comparison, tmp_path):
    # control: `..` leads out of the comparison (the path is resolved, not read lexically)
    target = comparison / "runs" / ".." / ".." / "D"
    code, _, err = run_cli(["data", "synth", "--out", str(target), "--clients", "5"])
    assert code == 0, err
    assert (comparison.parent / "D" / "stackoverflow.sqlite").is_file()


def test_a_task_generates_no_dataset_inside_a_comparison(comparison):
    preset = str(Path(TOY).parent / "stackoverflow-tp-mini.toml")
    target = comparison / "runs" / "data"
    argv = ["simulate", preset, "--rounds", "1", "--set", f"task-params.data-dir={target}",
            "--out", str(comparison.parent / "R"), "--quiet"]  # fmt: skip
    code, _, err = run_cli(argv)
    one_line_error(code, err, "task-params.data-dir", "is inside", "no synthetic dataset")
    assert not target.exists() or not (target / "stackoverflow.sqlite").exists()


def test_b_a_dangling_link_as_a_parent_of_out_is_named(tmp_path):
    link = tmp_path / "L"
    link.symlink_to("nowhere")  # relative: the message shows it whole on any tmp path
    for argv in (
        ["data", "synth", "--out", str(link / "sub"), "--clients", "5"],
        ["simulate", TOY, "--rounds", "1", "--out", str(link / "a" / "b")],
    ):
        code, _, err = run_cli(argv)
        # the link's own path may be shortened (shown()) on a long temporary path; its target not
        one_line_error(code, err, "argument --out:", "is a symbolic link to nothing ('nowhere')")
        assert "exists and is not a directory" not in err, err
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("mean", [np.float32(3.0), np.float16(2.0), np.int64(4), 3, 2.5])
def test_c_trial_count_takes_any_real_scalar(mean):
    trials = TrialCount("poisson", mean)
    assert trials.mean == float(mean) and type(trials.mean) is float
    tnb = TrialCount("truncated-negative-binomial", mean, shape=np.float32(0.5))
    assert tnb.shape == 0.5 and type(tnb.shape) is float


@pytest.mark.parametrize(
    "mean", [True, np.bool_(True), "3", None, math.nan, np.float32("nan"), -1.0, np.float32(0.5)]
)
def test_c_trial_count_still_refuses_what_is_not_a_valid_mean(mean):
    with pytest.raises(ValueError, match=r"mean must be"):
        TrialCount("poisson", mean)


@pytest.mark.parametrize("round_num", [-1, -(2**70), 2.5, True, "3", None, np.float64(1.0)])
def test_d_samplers_refuse_a_round_that_is_not_an_integer_at_least_zero(round_num):
    for sampler in (PoissonSampler(10, 0.5), FixedSizeSampler(10, 3)):
        with pytest.raises(ValueError, match=r"round_num must be an integer >= 0"):
            sampler.sample(round_num)


def test_d_samplers_still_draw_rounds_zero_and_up():
    sampler = PoissonSampler(10, 0.5)
    assert sampler.sample(np.int64(3)).tolist() == sampler.sample(3).tolist()
    assert PoissonSampler(7, 1.0).sample(0).tolist() == list(range(7))
    assert len(FixedSizeSampler(10, 3).sample(10**30)) == 3


@pytest.mark.parametrize("accountant", ["rdp", "pld", "prv"])
def test_e_a_count_beyond_float64_is_a_value_error_naming_it(accountant):
    range_ = r"ledger\[0\] count must be an integer in \[0, 10\*\*300\]"
    with pytest.raises(ValueError, match=range_):
        compose_epsilon([(EVENT, 10**400)], 1e-5, accountant=accountant)
    with pytest.raises(ValueError, match=r"ledger\[1\] count: merged .* more than 10\*\*300"):
        compose_epsilon([(EVENT, 10**300), (EVENT, 10**300)], 1e-5, accountant=accountant)


def test_e_counts_up_to_the_bound_still_compose():
    eps = compose_epsilon([(EVENT, 10**300)], 1e-5)
    assert math.isfinite(eps) and eps > 1e297  # never less than what 10**300 releases spend
    assert compose_epsilon([(EVENT, 10)], 1e-5) == pytest.approx(3.442, abs=1e-3)


@pytest.mark.parametrize("command", ["epsilon", "calibrate"])
def test_e_the_cli_names_its_flags(command):
    first = ["--noise-multiplier", "1"] if command == "epsilon" else ["--target-epsilon", "1"]
    argv = [command, *first, "--sample-rate", "0.1", "--rounds", str(10**400), "--delta", "1e-5"]
    code, _, err = run_cli(argv)
    one_line_error(code, err, "argument --rounds/--events-per-round", "10**300")
    assert "OverflowError" not in err


def test_f_ctrl_c_of_data_synth_names_the_subcommand(tmp_path, monkeypatch):
    import fedprivopt.data as data

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(data, "generate", interrupted)
    code, _, err = run_cli(["data", "synth", "--out", str(tmp_path / "D"), "--clients", "5"])
    assert code == 130 and err == "fedprivopt data synth: interrupted\n", (code, err)


def test_g_a_read_only_file_system_is_named_as_such(tmp_path, monkeypatch):
    import fedprivopt.cli_args as cli_args

    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(cli_args.os, "access", lambda path, mode: False)
    monkeypatch.setattr(cli_args.os, "statvfs", lambda path: ReadOnly())
    code, _, err = run_cli(["data", "synth", "--out", str(tmp_path / "x"), "--clients", "5"])
    one_line_error(code, err, f"cannot write in {tmp_path} (read-only file system)")
    monkeypatch.setattr(cli_args.os, "statvfs", lambda path: type("Rw", (), {"f_flag": 0})())
    code, _, err = run_cli(["data", "synth", "--out", str(tmp_path / "x"), "--clients", "5"])
    one_line_error(code, err, f"cannot write in {tmp_path} (permission denied)")


# -- the review's own findings ----------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished 2-round toy run ``A``."""
    out = tmp_path_factory.mktemp("run") / "A"
    code, _, err = run_cli(["simulate", TOY, "--rounds", "2", "--out", str(out), "--quiet"])
    assert code == 0, err
    return out


def _copy_run(run: Path, to: Path, rounds: int) -> Path:
    import shutil

    shutil.copytree(run, to)
    config = to / "config.toml"
    config.write_text(
        config.read_text().replace("num-server-rounds = 2", f"num-server-rounds = {rounds}")
    )
    return to


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs /proc/self/mem (EIO)")
@pytest.mark.parametrize("name", ["metrics.jsonl", "privacy_ledger.jsonl", "summary.json"])
def test_1_a_run_file_that_fails_to_read_is_one_line_naming_it(comparison, tmp_path, name):
    """Finding 1: a run file whose ``read`` fails with EIO (a failing disk; here a link to
    ``/proc/self/mem``, a regular file that cannot be read) ended ``--resume`` (before finding
    6 refused such links there) and ``compare`` in a traceback, rc 1 (an ``OSError`` naming no
    file was taken for a bug)."""
    import shutil

    out = tmp_path / "C"
    shutil.copytree(comparison, out)
    cell = out / "runs" / "dp-fedavg__sigma0.5__seed0"
    (cell / name).unlink()
    (cell / name).symlink_to("/proc/self/mem")
    argv = ["compare", TOY, "--strategies", "dp-fedavg", "--rounds", "1", "--out", str(out)]
    code, _, err = run_cli([*argv, "--quiet"])
    one_line_error(code, err, f"{cell / name}: Input/output error")


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs /proc/self/mem (EIO)")
def test_1_resume_of_a_summary_that_fails_to_read_is_one_line(finished_run, tmp_path):
    run = _copy_run(finished_run, tmp_path / "B", 3)
    (run / "summary.json").unlink()
    (run / "summary.json").symlink_to("/proc/self/mem")
    code, _, err = run_cli(["simulate", "--resume", str(run), "--quiet"])
    one_line_error(code, err, f"{run / 'summary.json'}: Input/output error")


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs /proc/self/mem (EIO)")
def test_1_data_info_of_a_file_that_fails_to_read_is_one_line():
    code, _, err = run_cli(["data", "info", "/proc/self/mem"])
    one_line_error(code, err, "/proc/self/mem: Input/output error")


def test_1_an_eio_naming_no_file_is_a_file_error():
    import errno

    from fedprivopt.cli_args import is_file_error

    assert is_file_error(OSError(errno.EIO, "Input/output error"))
    assert not is_file_error(OSError(errno.ECONNREFUSED, "Connection refused"))


def test_2_calibration_refuses_what_it_cannot_compose_and_a_bool_target():
    """Finding 2: ``calibrate_noise_multiplier(rounds=10**400)`` raised ``OverflowError``
    (finding e through dp-accounting's composition); ``target_epsilon=True`` was taken as a
    target of 1 and ``"5"`` failed with a ``TypeError``."""
    from fedprivopt.privacy.calibration import calibrate_noise_multiplier

    base = {"target_epsilon": 5.0, "delta": 1e-5, "rounds": 100, "sample_rate": 0.1}
    with pytest.raises(ValueError, match=r"rounds x events_per_round must be at most 10\*\*300"):
        calibrate_noise_multiplier(**{**base, "rounds": 10**400})
    for target in (True, "5", math.nan, math.inf, 0.0):
        with pytest.raises(ValueError, match=r"target_epsilon must be a finite number > 0"):
            calibrate_noise_multiplier(**{**base, "target_epsilon": target})
    sigma = calibrate_noise_multiplier(**{**base, "target_epsilon": np.float32(5.0)})
    assert sigma == calibrate_noise_multiplier(**base)
    assert compose_epsilon([(SubsampledGaussianEvent(sigma, "poisson", 0.1), 100)], 1e-5) <= 5.0


def test_2_events_take_real_scalars_as_floats_and_refuse_bools_and_strings():
    """Finding 2: ``SubsampledGaussianEvent(numpy.float32(1.0), ...)`` was refused while a
    ``float32`` rate was kept unconverted (its ``to_dict`` then failed as JSON);
    ``SubsampledGaussianEvent.poisson(sample_rate=True, noise_multiplier="1")`` was accepted
    (through ``float()``) as q = 1, σ = 1."""
    import json

    event = SubsampledGaussianEvent(np.float32(1.0), "poisson", np.float32(0.5))
    assert type(event.noise_multiplier) is float and type(event.sample_rate) is float
    json.dumps(event.to_dict())
    assert event == SubsampledGaussianEvent(1.0, "poisson", 0.5)
    bad = [
        {"sample_rate": True, "noise_multiplier": 1.0},
        {"sample_rate": 0.1, "noise_multiplier": True},
        {"sample_rate": "0.1", "noise_multiplier": 1.0},
        {"sample_rate": 0.1, "noise_multiplier": "1"},
    ]
    for kwargs in bad:
        with pytest.raises(ValueError, match=r"(sample_rate|noise_multiplier) must be"):
            SubsampledGaussianEvent.poisson(**kwargs)
    with pytest.raises(ValueError, match=r"noise_multiplier must be"):
        SubsampledGaussianEvent.fixed(population=10, cohort_size=2, noise_multiplier=True)


def test_3_accountant_settings_must_be_numbers_in_range():
    """Finding 3: ``compose_epsilon(ledger, "1e-5")`` and ``PrivacyAccountant(
    pld_discretization="0.5")`` were taken through ``float()``; ``PrivacyAccountant(
    prv_eps_error="0.5")`` raised a ``TypeError``; ``compose_epsilon(..., accountant="prv",
    prv_eps_error=-1)`` (or NaN) was refused as a domain of ``inf`` points, and 5 accepted."""
    from fedprivopt.privacy.accounting import PrivacyAccountant

    ledger = [(EVENT, 10)]
    for delta in ("1e-5", True, None):
        with pytest.raises(ValueError, match=r"delta must be a number in \(0, 1\)"):
            compose_epsilon(ledger, delta)
    for value in (-1.0, math.nan, 5.0, "0.01", True):
        with pytest.raises(ValueError, match=r"prv_eps_error must be"):
            compose_epsilon(ledger, 1e-5, accountant="prv", prv_eps_error=value)
    for kwargs in (
        {"prv_eps_error": "0.5"},
        {"pld_discretization": "0.5"},
        {"prv_eps_error": True},
    ):
        with pytest.raises(ValueError, match=r"(prv_eps_error|pld_discretization) must be"):
            PrivacyAccountant(**kwargs)
    assert compose_epsilon(ledger, np.float32(1e-5)) == pytest.approx(3.4416, abs=1e-3)


@pytest.mark.parametrize("name", ["metrics.jsonl", "privacy_ledger.jsonl"])
def test_4_a_run_file_of_more_lines_than_any_run_writes_is_refused(
    finished_run, tmp_path, monkeypatch, name
):
    """Finding 4: 5 million lines ``{"round": 1}`` appended to ``metrics.jsonl`` (65 MB) made
    ``--resume`` hold 3.3 GB for 33 s (and resume, rc 0); a larger file grew until killed.
    Now at most ``files.LINES_LIMIT`` lines (twice 10**6 rounds); lowered here to keep it fast."""
    from fedprivopt.simulation import files

    monkeypatch.setattr(files, "LINES_LIMIT", 50)
    run = _copy_run(finished_run, tmp_path / "B", 3)
    with open(run / name, "a") as fh:
        fh.write('{"round": 1}\n' * 60)
    code, _, err = run_cli(["simulate", "--resume", str(run), "--quiet"])
    one_line_error(code, err, f"{run / name}: holds more than 50 lines")


def test_4_the_line_limit_covers_the_longest_run():
    from fedprivopt.simulation import files
    from fedprivopt.strategies.config import MAX_ROUNDS

    assert files.LINES_LIMIT >= 2 * MAX_ROUNDS + 2


def _synthetic_beside_real(tmp_path: Path, names: list[str]) -> tuple[Path, Path]:
    """A "real" dataset R holding ``names`` and a fresh synthetic dataset D (5 clients)."""
    real = tmp_path / "R"
    real.mkdir()
    for name in names:
        (real / name).write_text(f"the real {name}\n")
    data = tmp_path / "D"
    code, _, err = run_cli(["data", "synth", "--out", str(data), "--clients", "5"])
    assert code == 0, err
    return real, data


def test_5_data_synth_overwrite_never_writes_through_a_linked_file(tmp_path):
    """Finding 5: ``data synth --out D --overwrite`` over a synthetic ``D`` whose
    ``stackoverflow.word_count`` (or ``tag_count``, ``sqlite``, the marker) was a symbolic link
    to another dataset's file wrote the synthetic counts through the link (rc 0): the other,
    real dataset's vocabulary was replaced. Now the links are removed, their targets kept."""
    names = ["stackoverflow.word_count", "stackoverflow.tag_count", "stackoverflow.sqlite"]
    real, data = _synthetic_beside_real(tmp_path, names)
    for name in names:
        (data / name).unlink()
        (data / name).symlink_to(real / name)
    (data / "stackoverflow.synthetic.json").rename(tmp_path / "marker.json")
    (data / "stackoverflow.synthetic.json").symlink_to(tmp_path / "marker.json")
    code, _, err = run_cli(["data", "synth", "--out", str(data), "--clients", "7", "--overwrite"])
    assert code == 0, err
    for name in names:
        assert (real / name).read_text() == f"the real {name}\n", name
        assert not (data / name).is_symlink()
    assert '"num_clients": 5,' in (tmp_path / "marker.json").read_text()  # the old marker
    assert '"num_clients": 7,' in (data / "stackoverflow.synthetic.json").read_text()


@pytest.mark.parametrize("name", ["privacy_ledger.jsonl", "metrics.jsonl"])
def test_6_a_resume_never_appends_through_a_linked_ledger_or_metrics(finished_run, tmp_path, name):
    """Finding 6: run ``B`` made as a linked copy of run ``A`` (``cp -rs A B``, config.toml
    copied and raised to more rounds), then ``simulate --resume B``: rc 0, ``B``'s rounds were
    appended to ``A``'s ledger through the link (``A`` then showed rounds it never released).
    Now refused before anything is written, naming the link; the linked file unchanged."""
    other = _copy_run(finished_run, tmp_path / "A", 2)
    run = _copy_run(finished_run, tmp_path / "B", 3)
    (run / name).unlink()
    (run / name).symlink_to(other / name)
    before = (other / name).read_bytes()
    code, _, err = run_cli(["simulate", "--resume", str(run), "--quiet"])
    one_line_error(code, err, f"{run / name} is a symbolic link", "a resume appends to it")
    assert (other / name).read_bytes() == before
    assert (run / "summary.json").is_file()  # nothing of B touched either


def test_7_a_resume_of_a_hard_linked_copy_leaves_the_original_unchanged(finished_run, tmp_path):
    """Finding 7: run ``B`` made as a hard-linked copy of run ``A`` (``cp -al A B``, a snapshot
    backup), ``config.toml`` raised to 3 rounds, ``simulate --resume B``: rc 0, and ``B``'s
    round 3 appended to ``A``'s ledger too (one inode), after which ``A`` showed a round it
    never released and its own resume was refused. Now the resume copies the two files it
    appends to before its first write."""
    import shutil

    original = tmp_path / "A"
    shutil.copytree(finished_run, original)
    copy = tmp_path / "B"
    shutil.copytree(original, copy, copy_function=os.link)
    (copy / "config.toml").unlink()
    shutil.copy(original / "config.toml", copy / "config.toml")
    config = copy / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 2", "num-server-rounds = 3"))
    before = {n: (original / n).read_bytes() for n in ("privacy_ledger.jsonl", "metrics.jsonl")}
    code, _, err = run_cli(["simulate", "--resume", str(copy), "--quiet"])
    assert code == 0, err
    for name, data in before.items():
        assert (original / name).read_bytes() == data, name
        assert (copy / name).stat().st_nlink == 1
    assert b'"round": 3' in (copy / "privacy_ledger.jsonl").read_bytes()
    config = original / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 2", "num-server-rounds = 3"))
    code, _, err = run_cli(["simulate", "--resume", str(original), "--quiet"])
    assert code == 0, err


def test_8_deploy_local_refuses_a_log_that_is_a_symbolic_link(tmp_path):
    """Finding 8: ``deploy local toy.toml --nodes 2 --out DL`` with ``DL/deploy/superlink.log`` a
    symbolic link to a user's ``notes.txt``: rc 0, and 62 lines of SuperLink's log appended to
    ``notes.txt`` (the name looked like an earlier deployment's log). Now refused before
    anything is written or started."""
    from fedprivopt.deploy.cli import _check_log_dir

    notes = tmp_path / "notes.txt"
    notes.write_text("user notes\n")
    out = tmp_path / "DL"
    (out / "deploy").mkdir(parents=True)
    (out / "deploy" / "superlink.log").symlink_to(notes)
    with pytest.raises(ValueError, match=r"holds superlink\.log, which deploy local did not"):
        _check_log_dir(out / "deploy")
    code, _, err = run_cli(["deploy", "local", TOY, "--nodes", "2", "--out", str(out), "--quiet"])
    one_line_error(code, err, "argument --out:", "superlink.log")
    assert notes.read_text() == "user notes\n"
    assert sorted(p.name for p in out.iterdir()) == ["deploy"]
    (out / "deploy" / "superlink.log").unlink()
    (out / "deploy" / "superlink.log").write_text("an earlier log\n")
    _check_log_dir(out / "deploy")  # control: a regular log of an earlier deployment


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["data", "info", ""], "argument PATH: must be a path, got ''"),
        (["data", "info", "/nowhere\x1b[31m"], "argument PATH: the path holds a control character"),
        (["compare-tuned", "", "--out", "OUT"], "argument TUNED: must be a path, got ''"),
        (["simulate", "", "--rounds", "1", "--out", "OUT"], "config file must be a path, got ''"),
        (["compare", " ", "--rounds", "1", "--out", "OUT"], "config file must be a path, got ' '"),
    ],
)
def test_9_an_empty_path_is_refused_as_such(tmp_path, monkeypatch, argv, expected):
    """Finding 9: ``data info ""`` summarized the current directory (``directory  holds no
    stackoverflow.sqlite``), and echoed an escape sequence in PATH raw to the terminal;
    ``compare-tuned "" --out X`` said ``'X' is inside the tuning ''``; ``simulate ""`` said
    ``config file '.' is not a regular file``."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(argv)
    one_line_error(code, err, expected)
    assert "\x1b" not in err
    assert not (tmp_path / "OUT").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["simulate", TOY, "--rounds", "1"],
        ["compare", TOY, "--strategies", "dp-fedavg", "--rounds", "1"],
        ["tune", TOY, "--grid", "local-learning-rate=0.1,0.5", "--mean-trials", "1"],
        ["deploy", "local", TOY, "--nodes", "2"],
    ],
)
def test_10_no_output_directory_inside_a_run(comparison, command):
    """Finding 10: ``simulate --out RUN/sub`` (also ``compare``, ``tune``, ``deploy local``; and
    ``C/runs/CELL/x``) wrote a run among another run's files, rc 0; ``compare --overwrite`` then
    refused that cell for holding it. Now rc 2 naming --out and the run directory."""
    cell = comparison / "runs" / "dp-fedavg__sigma0.5__seed0"
    before = sorted(p.name for p in cell.iterdir())
    code, _, err = run_cli([*command, "--out", str(cell / "x"), "--quiet"])
    one_line_error(code, err, "argument --out:", "is inside the run directory")
    assert sorted(p.name for p in cell.iterdir()) == before


def test_10_a_projects_own_checkpoint_does_not_make_it_a_run(tmp_path, monkeypatch):
    """Control for findings a and 10: an ancestor is a run, comparison or tuning only by the
    names fedprivopt alone writes (a ledger, ``run.lock`` beside ``config.toml``,
    ``compare.lock``, ``tune.lock``), not by a project's own ``checkpoint.pt`` or ``tune.json``."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "checkpoint.pt").write_bytes(b"a model of the user's")
    (project / "tune.json").write_text("{}\n")
    (project / "run.lock").write_text("")
    monkeypatch.chdir(project)
    code, _, err = run_cli(["data", "synth", "--out", "data/so", "--clients", "5"])
    assert code == 0, err
    code, _, err = run_cli(["simulate", TOY, "--rounds", "1", "--out", "runs/r", "--quiet"])
    assert code == 0, err


def _rewrite_delta(run: Path, delta: float, epsilon: float) -> None:
    """The ledger's header and settings at ``delta``; every ε the rows and summary state lowered
    to ``epsilon`` (three files; ``config.toml`` and the checkpoints kept)."""
    import json

    ledger = run / "privacy_ledger.jsonl"
    lines = ledger.read_text().splitlines()
    header = json.loads(lines[0])
    header["delta"] = header["settings"]["delta"] = delta
    ledger.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row["epsilon"] = min(row["epsilon"], epsilon)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = json.loads((run / "summary.json").read_text())
    summary["epsilon"] = epsilon
    (run / "summary.json").write_text(json.dumps(summary))


def test_11_a_report_composes_epsilon_at_the_delta_it_shows(finished_run, tmp_path):
    """Finding 11: the ledger's header and settings set to δ 0.5, the rows' and summary's ε
    lowered to the ledger's ε at 0.5, ``config.toml`` kept at δ 1e-4: a report of the run as it
    is (``compare-tuned --untuned R``) showed ε 2.88 beside δ 1e-4 for a run (of 4 rounds) that
    spent 13.70 at 1e-4. Now ε is composed at the δ the report shows, and the disagreement is
    noted. (``--resume`` and ``compare`` refuse such a run: its config differs from the
    ledger.)"""
    import shutil

    from fedprivopt.simulation.ledger import RunLedger
    from fedprivopt.simulation.rundata import load_run

    run = tmp_path / "R"
    shutil.copytree(finished_run, run)
    spent = load_run(run).epsilon
    _rewrite_delta(run, 0.5, 0.0)
    assert RunLedger.read(run).epsilon() < spent  # the edited ledger at its own δ: less
    data = load_run(run)
    assert data.delta == 1e-4
    assert data.epsilon == pytest.approx(spent, rel=1e-12)
    assert any("states delta 0.5" in note for note in data.warnings), data.warnings


@pytest.fixture(scope="module")
def tuning(tmp_path_factory) -> Path:
    """A finished one-round tuning of dp-fedavg on the toy task."""
    out = tmp_path_factory.mktemp("tune") / "T"
    argv = ["tune", TOY, "--strategy", "dp-fedavg", "--grid", "local-learning-rate=0.1,0.5",
            "--mean-trials", "1", "--rounds", "1", "--out", str(out), "--quiet"]  # fmt: skip
    code, _, err = run_cli(argv)
    assert code == 0, err
    return out


def _rewrite_sigma(run: Path, sigma: float) -> None:
    """Every noise multiplier of the ledger (header and lines) set to ``sigma``; every ε the rows
    and the summary state lowered to the edited ledger's (three files; ``config.toml`` and the
    checkpoints kept)."""
    import json

    from fedprivopt.simulation.ledger import RunLedger

    def edit(item):
        if isinstance(item, dict):
            for key, value in item.items():
                if key in ("noise_multiplier", "noise-multiplier") and value == 0.5:
                    item[key] = sigma
                else:
                    edit(value)
        elif isinstance(item, list):
            for value in item:
                edit(value)

    ledger = run / "privacy_ledger.jsonl"
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    edit(lines)
    ledger.write_text("".join(json.dumps(line) + "\n" for line in lines))
    _rewrite_delta(run, 1e-4, RunLedger.read(run).epsilon())


def test_12_compare_tuned_checks_an_untuned_runs_files(finished_run, tuning, tmp_path):
    """Finding 12: an untuned run whose ledger was edited to σ 50 (header and lines), with the
    rows' and summary's ε lowered to the edited ledger's and ``config.toml`` and the checkpoints
    kept: ``compare-tuned T --untuned R`` reported it as σ 0.5 at ε 0.0235 (a 4-round run that
    spent 13.70; here 2 rounds), rc 0. ``--resume`` and ``compare`` refuse such a run. Now
    ``compare-tuned`` gives every untuned run the checks of ``--resume``: rc 2, one line."""
    import shutil

    run = tmp_path / "R"
    shutil.copytree(finished_run, run)
    _rewrite_sigma(run, 50.0)
    out = tmp_path / "O"
    code, _, err = run_cli(["compare-tuned", str(tuning), "--untuned", str(run), "--out", str(out)])
    one_line_error(code, err, "argument --untuned:", "fails the checks of --resume", "50")
    assert not (out / "summary.csv").exists()
    code, _, err = run_cli(
        ["compare-tuned", str(tuning), "--untuned", str(finished_run), "--out", str(out)]
    )
    assert code == 0, err  # control: the unedited run is reported


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="removes its working directory")
def test_13_a_removed_working_directory_is_named(tmp_path):
    """Finding 13: from a directory that was removed (a shell left in it), every command ended
    with ``Intel oneMKL FATAL ERROR: Cannot load .../libtorch_cpu.so.`` (rc 2), naming no cause.
    Now one line saying the current directory no longer exists."""
    import subprocess

    gone = tmp_path / "gone"
    gone.mkdir()
    script = (
        f'cd "{gone}" && rmdir "{gone}" && exec "{sys.executable}" -m fedprivopt.cli epsilon '
        "--noise-multiplier 1 --sample-rate 0.1 --rounds 10 --delta 1e-5"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    one_line_error(done.returncode, done.stderr, "the current directory no longer exists")


def test_14_a_trial_copied_out_of_its_tuning_is_not_an_untuned_run(tuning, tmp_path):
    """Finding 14: ``cp -r T/runs/trial-001 R`` then ``compare-tuned T --untuned R``: rc 0, the
    trial reported as an untuned row at its single run's ε (a path inside the tuning was
    refused, a copy was not). Now refused: R released the models trial-001 released."""
    import shutil

    trial = sorted((tuning / "runs").iterdir())[0]
    copy = tmp_path / "R"
    shutil.copytree(trial, copy)
    out = tmp_path / "O"
    code, _, err = run_cli(
        ["compare-tuned", str(tuning), "--untuned", str(copy), "--out", str(out)]
    )
    # the paths may be shortened (shown()) on a long temporary path: both ends are kept
    one_line_error(code, err, "argument --untuned:", f"released the models of '{str(trial)[:30]}")
    assert "(the same digests in their privacy ledgers)" in err, err
    assert not out.exists() or not (out / "summary.csv").exists()


def test_15_noise_and_clipping_name_a_wrong_argument():
    """Finding 15: ``add_gaussian_noise(v, "1", ...)`` (also ``std=True``) drew noise of std 1
    (``float()``); ``clip_l2(numpy.ones(3), 1.0)`` and ``l2_norm([1.0, 2.0])`` ended in an
    ``AttributeError`` (``'str' object has no attribute 'type'``)."""
    import torch

    from fedprivopt.privacy.clip import clip_l2, l2_norm
    from fedprivopt.privacy.noise import add_gaussian_noise, gaussian_noise

    for std in ("1", True, np.bool_(True), None, torch.tensor([1.0, 2.0])):
        with pytest.raises(ValueError, match=r"std must be a finite number >= 0"):
            add_gaussian_noise(torch.zeros(3), std, generator=torch.Generator())
        with pytest.raises(ValueError, match=r"std must be a finite number >= 0"):
            gaussian_noise(3, std, generator=torch.Generator())
    for std in (1, np.float32(0.5), torch.tensor(0.5)):  # real scalars still taken
        assert add_gaussian_noise(torch.zeros(3), std, generator=torch.Generator()).shape == (3,)
    for vector in (np.ones(3), [1.0, 2.0], 3.0):
        with pytest.raises(ValueError, match=r"vector must be a torch.Tensor"):
            clip_l2(vector, 1.0)
        with pytest.raises(ValueError, match=r"vector must be a torch.Tensor"):
            l2_norm(vector)


def test_16_compare_tuned_reads_a_tuning_on_a_read_only_disk(tuning, tmp_path, monkeypatch):
    """Finding 16: ``compare-tuned T`` with ``T`` on a read-only file system (checked on a tmpfs
    remounted read-only) scored every trial as failed (``run.lock`` cannot be opened for
    writing there) and said ``its best trial 'trial-001' is not the one its runs select (none
    …); the tuning's files were edited``. Now a read-only file system is read without the lock
    (nobody can write it). Simulated here: the lock fails with EROFS, statvfs says read-only."""
    import errno

    from fedprivopt.simulation import rundir

    def read_only_lock(out):
        raise OSError(errno.EROFS, "Read-only file system", str(Path(out) / "run.lock"))

    real_statvfs = os.statvfs

    class ReadOnly:
        def __init__(self, path):
            self.f_flag = real_statvfs(path).f_flag | os.ST_RDONLY

    monkeypatch.setattr(rundir, "lock_run_dir", read_only_lock)
    monkeypatch.setattr(rundir.os, "statvfs", ReadOnly)
    code, _, err = run_cli(["compare-tuned", str(tuning), "--out", str(tmp_path / "O")])
    assert code == 0, err
    assert (tmp_path / "O" / "summary.csv").is_file()


def test_16_a_trial_in_use_is_named_not_called_edited(tuning, tmp_path):
    """Finding 16, the other cause of the same false line: a trial locked by a running process
    (a tuning continued by ``tune`` while ``compare-tuned`` reads it) was scored as failed and
    the tuning called edited. Now one line naming the trial in use."""
    from fedprivopt.simulation.rundir import lock_run_dir

    trial = sorted((tuning / "runs").iterdir())[0]
    with lock_run_dir(trial):
        code, _, err = run_cli(["compare-tuned", str(tuning), "--out", str(tmp_path / "O")])
    one_line_error(code, err, str(trial), "try again once it has finished")
    assert "were edited" not in err


def test_17_composed_tuning_epsilon_bounds_its_count():
    """Finding 17 (finding e in the tuning module): ``composed_tuning_epsilon(ledger, δ,
    trials, 10**400)`` raised ``OverflowError``; now a ``ValueError`` naming ``count`` and
    [1, 10**300]. 10**300 still composes (ε 1.7e300)."""
    from fedprivopt.privacy.tuning import TrialCount, composed_tuning_epsilon

    trials = TrialCount("poisson", 5)
    with pytest.raises(ValueError, match=r"count must be an integer in \[1, 10\*\*300\]"):
        composed_tuning_epsilon([(EVENT, 10)], 1e-5, trials, 10**400)
    assert math.isfinite(composed_tuning_epsilon([(EVENT, 10)], 1e-5, trials, 10**300))


def test_18_calibrate_tree_checks_delta_and_its_periods():
    """Finding 18: ``calibrate_tree(5, "1e-5", restart_rounds=10, rounds=100)`` raised a
    ``TypeError`` inside dp-accounting, and ``rounds=10**400`` an ``OverflowError``."""
    from fedprivopt.privacy.tree import calibrate_tree

    with pytest.raises(ValueError, match=r"delta must be a number in \(0, 1\)"):
        calibrate_tree(5.0, "1e-5", restart_rounds=10, rounds=100)
    with pytest.raises(ValueError, match=r"at most 10\*\*300 periods"):
        calibrate_tree(5.0, 1e-5, restart_rounds=10, rounds=10**400)
    sigma = calibrate_tree(5.0, 1e-5, restart_rounds=10, rounds=100)
    assert sigma == pytest.approx(6.025, abs=1e-3)


def test_19_data_synth_overwrite_never_writes_through_a_hard_link(tmp_path):
    """Finding 19 (finding 5 with hard links): ``data synth --out D --overwrite`` over a
    synthetic ``D`` whose vocabularies were hard links of another, real dataset's files
    (``ln R/stackoverflow.word_count D/``) truncated and rewrote the shared files (rc 0)."""
    names = ["stackoverflow.word_count", "stackoverflow.tag_count"]
    real, data = _synthetic_beside_real(tmp_path, names)
    for name in names:
        (data / name).unlink()
        os.link(real / name, data / name)
    code, _, err = run_cli(["data", "synth", "--out", str(data), "--clients", "7", "--overwrite"])
    assert code == 0, err
    for name in names:
        assert (real / name).read_text() == f"the real {name}\n", name
        assert (data / name).stat().st_nlink == 1


def test_20_a_report_is_never_written_through_a_link(tuning, tmp_path):
    """Finding 20: ``compare-tuned T --out O`` over its own earlier report whose ``summary.csv``
    was a symbolic link to a user's file (``report.md`` its own: the directory passed the check
    of ``--out``) wrote the new CSV into the user's file (rc 0); a hard link alike. Now the link
    is removed and a new file written."""
    out = tmp_path / "O"
    code, _, err = run_cli(["compare-tuned", str(tuning), "--out", str(out)])
    assert code == 0, err
    notes = tmp_path / "notes.csv"
    notes.write_text("precious\n")
    (out / "summary.csv").unlink()
    (out / "summary.csv").symlink_to(notes)
    shared = tmp_path / "shared.png"
    os.link(out / "privacy_utility.png", shared)
    before = shared.read_bytes()
    code, _, err = run_cli(["compare-tuned", str(tuning), "--out", str(out)])
    assert code == 0, err
    assert notes.read_text() == "precious\n"
    assert not (out / "summary.csv").is_symlink() and (out / "summary.csv").stat().st_size > 0
    assert shared.read_bytes() == before and shared.stat().st_nlink == 1


def test_6_compare_refuses_a_linked_ledger_of_a_cell_to_resume_when_it_plans(tmp_path):
    """Finding 6 in ``compare``: a cell to be resumed (its ``summary.json`` gone) whose ledger is
    a symbolic link was refused only when its turn came, after the other cells' ``[i/n]`` lines
    (three lines on stderr); now when the grid is planned, in one line naming the cell, and
    ``--overwrite`` reruns the cell without touching the linked file."""
    out = tmp_path / "C"
    argv = ["compare", TOY, "--strategies", "dp-fedavg", "--noise-multipliers", "0.5,1",
            "--rounds", "1", "--out", str(out), "--quiet"]  # fmt: skip
    code, _, err = run_cli(argv)
    assert code == 0, err
    cell = out / "runs" / "dp-fedavg__sigma1__seed0"
    shared = tmp_path / "shared.jsonl"
    (cell / "privacy_ledger.jsonl").rename(shared)
    (cell / "privacy_ledger.jsonl").symlink_to(shared)
    (cell / "summary.json").unlink()
    before = shared.read_bytes()
    code, _, err = run_cli(argv)
    one_line_error(code, err, "cell dp-fedavg__sigma1__seed0:", "is a symbolic link")
    code, _, err = run_cli([*argv, "--overwrite"])
    assert code == 0, err
    assert shared.read_bytes() == before
    assert not (cell / "privacy_ledger.jsonl").is_symlink()
