"""The command line under misuse: every case ends with exit code 2 and one line on stderr.

Each case used to end otherwise: a traceback (exit code 1), a process that allocated without
bound or ran for hours, or a silent success that did the wrong thing. The property checked is the
CLI's contract (``docs/DESIGN.md``, Style): exit code 2, exactly one line on stderr that starts
with ``fedprivopt`` and names the flag, key or file, no traceback, and nothing already written
lost.

Permission cases need a user the permission bits apply to. As root (containers, CI) chmod does not
stop reads or writes, so those assertions are skipped, and the same failure is produced through a
path root cannot use either: a regular file under ``/proc/sys`` that refuses reads (EACCES), and a
directory under ``/sys`` where ``mkdir`` fails (EPERM).

Cases that used to run without bound (``--seeds 99999999999999999999`` and the like) run in a
child process with a time limit; the child is killed by its PID, also when the test fails.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.core.text import shown
from tests.procs import run_program_forked
from tests.reliability.test_fuzz_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"
TAG_MINI = ROOT / "simulations" / "stackoverflow-tp-mini.toml"
SMALL = ["--set", "population=12", "--set", "clients-per-round=4"]
SMALL += ["--set", "task-params.num-users=12", "--quiet"]
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
AS_ROOT = "running as root: permission bits do not stop root (a /proc or /sys path stands in)"
UNREADABLE = Path("/proc/sys/vm/drop_caches")  # mode 0200: not even root may read it


def run_child(argv: list[str], *, timeout: float = 60.0) -> tuple[int, str, str]:
    """``fedprivopt ARGV`` in a child process, killed by its PID after ``timeout``.

    The child is forked from a server that has imported the program (``tests.procs.
    run_program_forked``): the same program in a process of its own, without the seconds of an
    interpreter's start-up and imports for each case.
    """
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "FLWR_TELEMETRY_ENABLED": "0"}
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    code, out, err = run_program_forked(argv, env=env, cwd=ROOT, timeout=timeout)
    if code is None:
        pytest.fail(f"{argv[:3]}... still running after {timeout:g} s")
    return code, out, err


def usage_error(result: tuple[int, str, str], *needles: str) -> str:
    """Assert the CLI contract for bad input; return the error line."""
    code, _, err = result
    assert code == 2, (code, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    assert err.endswith("\n") and len(err.splitlines()) == 1, err[-2000:]
    line = err.splitlines()[0]
    assert line.startswith("fedprivopt"), line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def simulate(out: str, *extra: str) -> list[str]:
    return ["simulate", str(TOY), "--rounds", "1", "--out", out, *SMALL, *extra]


def compare(out: str, *extra: str) -> list[str]:
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--out", out]
    return [*argv, *SMALL, *extra]


def synth(out: str, *extra: str) -> list[str]:
    return [
        "data",
        "synth",
        "--out",
        out,
        "--clients",
        "20",
        "--vocab",
        "200",
        "--tags",
        "5",
        *extra,
    ]


def deploy(out: str) -> list[str]:
    return ["deploy", "local", "--nodes", "1", "--insecure", str(TOY), "--out", out, "--quiet"]


COMMANDS = {"simulate": simulate, "compare": compare, "data synth": synth, "deploy local": deploy}


# -- 2. bounds checked before allocating --------------------------------------------------------


def test_compare_seeds_are_bounded_before_the_grid_is_built(tmp_path):
    out = str(tmp_path / "cmp")
    usage_error(run_child(compare(out, "--seeds", "99999999999999999999")), "--seeds", "1000")
    assert not Path(out).exists()


def test_compare_grid_is_bounded(tmp_path):
    out = str(tmp_path / "cmp")
    sigmas = ",".join(str(0.5 + i / 100) for i in range(11))
    argv = compare(out, "--seeds", "1000", "--noise-multipliers", sigmas)
    usage_error(run_child(argv), "11,000 runs", "10,000")
    assert not Path(out).exists()


@pytest.mark.parametrize("rounds", ["1000001", "100000000000000"])
def test_simulate_rounds_are_bounded(tmp_path, rounds):
    """Found by a variant of case 8: rounds were accepted without bound (2 KB of memory each)."""
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", rounds, "--out", str(out), *SMALL]
    usage_error(run_child(argv), "num-server-rounds", "[1, 1000000]")
    assert not out.exists()


def test_data_synth_clients_are_bounded(tmp_path):
    out = tmp_path / "so"
    argv = ["data", "synth", "--out", str(out), "--clients", "99999999999999999999"]
    usage_error(run_child(argv), "--clients", "1000000")
    assert not out.exists()


def test_toy_examples_per_user_are_bounded(tmp_path):
    argv = simulate(
        str(tmp_path / "run"), "--set", "task-params.examples-per-user=[1, 100000000000]"
    )
    usage_error(run_child(argv), "task-params.examples-per-user=")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("task-params.train-bias=maybe", "task-params.train-bias must be true or false"),
        ("task-params.init-bias='prior'", "task-params.init-bias must be one of zero, tag-prior"),
        ("task-params.eval-users=0", "task-params.eval-users must be an integer in [1, 100000000]"),
    ],
)
def test_a_bad_task_parameter_is_named_as_written(tmp_path, setting, needle):
    argv = ["simulate", str(TAG_MINI), "--out", str(tmp_path / "run"), "--set", setting]
    usage_error(run_cli(argv), needle)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        # sixth review of issue 15: each was a traceback with exit code 1
        ("task-params.heterogeneity=[1]", "task-params.heterogeneity must be a real number"),
        ("task-params.heterogeneity=1e308", "task-params.heterogeneity must be a finite number"),
        ("clients-per-round=1e-200", "/ min(1, clients-per-round) must be at most 1e+150"),
        ("clip-norm=1e300", "lower clip-norm or raise clients-per-round"),
        ("local-learning-rate=1e39", "local-learning-rate must be a finite number in (0, 3.4"),
    ],
)
def test_values_that_overflowed_are_refused(tmp_path, setting, needle):
    argv = ["simulate", str(TOY), "--rounds", "1", "--out", str(tmp_path / "run"), "--quiet"]
    for small in ("population=12", "clients-per-round=4", "task-params.num-users=12"):
        if small.split("=")[0] != setting.split("=")[0]:  # a key set twice is refused
            argv += ["--set", small]
    usage_error(run_cli([*argv, "--set", setting]), needle)
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="a machine with CUDA has a cuda device"
)
@pytest.mark.parametrize("command", ["simulate", "compare"])
@pytest.mark.parametrize("device", ["cuda", "cuda:7"])
def test_cuda_device_on_a_machine_without_one(tmp_path, command, device):
    """Sixth review of issue 15: torch's 'not compiled with CUDA' traceback, exit code 1."""
    build = simulate if command == "simulate" else compare
    argv = build(str(tmp_path / "run"), "--set", f'device="{device}"')
    usage_error(run_cli(argv), "device must be auto or cpu on this machine", repr(device))
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run" / "runs").glob("*/*"))


# -- 3. file-system failures: one line naming the path ------------------------------------------


def _unreadable_copy(tmp_path: Path, source: Path) -> Path:
    copy = tmp_path / source.name
    copy.write_bytes(source.read_bytes())
    copy.chmod(0)
    return copy


def test_unreadable_config_file(tmp_path):
    config = _unreadable_copy(tmp_path, TOY)
    if not IS_ROOT:  # chmod 000 stops only non-root users
        argv = ["simulate", str(config), "--out", str(tmp_path / "a"), "--quiet"]
        usage_error(run_cli(argv), str(config))
    if not UNREADABLE.is_file():
        pytest.skip(f"{UNREADABLE} is missing here; {AS_ROOT}")
    for argv in (
        ["simulate", str(UNREADABLE), "--out", str(tmp_path / "b"), "--quiet"],
        ["compare", str(UNREADABLE), "--out", str(tmp_path / "c"), "--quiet"],
    ):
        usage_error(run_cli(argv), str(UNREADABLE))
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_out_is_an_existing_regular_file(tmp_path, command):
    target = tmp_path / "results"
    target.write_text("keep me\n")
    # a long path is cut in the message (pytest-xdist's temporary paths are longer)
    usage_error(run_cli(COMMANDS[command](str(target))), "--out", shown(str(target))[:-2])
    assert target.read_text() == "keep me\n"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_out_under_a_regular_file(tmp_path, command):
    parent = tmp_path / "file"
    parent.write_text("keep me\n")
    # shown(): a long temporary path is cut in the middle, its tail (the file) kept
    usage_error(run_cli(COMMANDS[command](str(parent / "sub"))), "--out", shown(str(parent)))
    assert parent.read_text() == "keep me\n"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_out_in_a_read_only_directory(tmp_path, command):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if not IS_ROOT:
            usage_error(run_cli(COMMANDS[command](str(locked / "out"))), str(locked))
    finally:
        locked.chmod(stat.S_IRWXU)
    assert list(locked.iterdir()) == []
    # root: /sys refuses mkdir (EPERM) even to root
    usage_error(run_cli(COMMANDS[command]("/sys/fedprivopt-misuse-test")), "/sys")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_out_under_proc(command):
    usage_error(run_cli(COMMANDS[command]("/proc/fedprivopt-misuse-test")), "/proc")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_out_with_a_component_over_255_bytes(tmp_path, command):
    usage_error(run_cli(COMMANDS[command](str(tmp_path / ("a" * 300)))), "--out", "255")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out", ["", " ", "\t", "runs/ /x"])
@pytest.mark.parametrize("command", ["simulate", "compare", "data synth"])
def test_empty_or_blank_out_is_an_error(tmp_path, monkeypatch, command, out):
    monkeypatch.chdir(tmp_path)  # where an empty --out used to write (a blank one: a dir " ")
    usage_error(run_cli(COMMANDS[command](out)), "--out")
    assert list(tmp_path.iterdir()) == []


# -- 3. task parameters, nested TOML ------------------------------------------------------------


@pytest.mark.parametrize("key", ["bogus", "a.b", "num-users.x"])
@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_unknown_or_nested_task_params(tmp_path, command, key):
    argv = COMMANDS[command](str(tmp_path / "out"), "--set", f"task-params.{key}=1")
    usage_error(run_cli(argv), f"task-params.{key}")
    assert not (tmp_path / "out").exists()


def test_a_bug_raising_type_error_is_not_hidden(monkeypatch, tmp_path):
    from fedprivopt.simulation import run

    def broken(*args, **kwargs):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    monkeypatch.setattr(run, "build_task", broken)
    with pytest.raises(TypeError, match="unsupported operand"):
        main(simulate(str(tmp_path / "out")))


def test_other_os_errors_are_not_hidden(monkeypatch, tmp_path):
    from fedprivopt import cli_runs

    def refused(args):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(cli_runs, "cmd_simulate", refused)
    with pytest.raises(ConnectionRefusedError):
        main(simulate(str(tmp_path / "out")))


@pytest.mark.parametrize("where", ["file", "set"])
def test_deeply_nested_toml(tmp_path, where):
    deep = "[" * 5000 + "]" * 5000
    if where == "file":
        config = tmp_path / "deep.toml"
        config.write_text(f"a = {deep}\n")
        argv = ["simulate", str(config), "--out", str(tmp_path / "out"), "--quiet"]
        usage_error(run_cli(argv), str(config), "nested")
    else:
        usage_error(run_cli(simulate(str(tmp_path / "out"), "--set", f"a={deep}")), "--set")
    assert not (tmp_path / "out").exists()


# -- 3. StackOverflow data directories ----------------------------------------------------------


def _tag_task(tmp_path: Path, data_dir: Path, *, synthetic: bool = False) -> list[str]:
    return [
        "simulate", str(TAG_MINI), "--rounds", "1", "--out", str(tmp_path / "out"), "--quiet",
        "--set", f"task-params.data-dir={str(data_dir)!r}",
        "--set", f"task-params.synthetic={'true' if synthetic else 'false'}",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """A small StackOverflow-format dataset (the synthetic generator's files)."""
    from fedprivopt.data import SyntheticConfig, generate

    root = tmp_path_factory.mktemp("so")
    generate(root, SyntheticConfig.tiny(num_clients=40))
    return root


def _copy_dataset(dataset: Path, dst: Path, *, leave_out: str = "") -> Path:
    dst.mkdir()
    for name in ("stackoverflow.sqlite", "stackoverflow.word_count", "stackoverflow.tag_count"):
        if name != leave_out:
            (dst / name).write_bytes((dataset / name).read_bytes())
    return dst


def test_missing_data_dir_without_synthetic(tmp_path):
    data_dir = tmp_path / "nowhere"
    usage_error(run_cli(_tag_task(tmp_path, data_dir)), str(data_dir), "stackoverflow.sqlite")
    assert not data_dir.exists() and not (tmp_path / "out").exists()


def test_sqlite_that_is_a_directory(tmp_path):
    data_dir = tmp_path / "data"
    (data_dir / "stackoverflow.sqlite").mkdir(parents=True)
    usage_error(run_cli(_tag_task(tmp_path, data_dir)), str(data_dir), "stackoverflow.sqlite")


def test_missing_word_count(tmp_path, dataset):
    data_dir = _copy_dataset(dataset, tmp_path / "data", leave_out="stackoverflow.word_count")
    usage_error(run_cli(_tag_task(tmp_path, data_dir)), "stackoverflow.word_count")


def test_unreadable_database(tmp_path, dataset):
    data_dir = _copy_dataset(dataset, tmp_path / "data")
    sqlite = data_dir / "stackoverflow.sqlite"
    if not IS_ROOT:
        sqlite.chmod(0)
        usage_error(run_cli(_tag_task(tmp_path, data_dir)), str(sqlite))
    if not UNREADABLE.is_file():
        pytest.skip(f"{UNREADABLE} is missing here; {AS_ROOT}")
    sqlite.unlink()
    sqlite.symlink_to(UNREADABLE)
    usage_error(run_cli(_tag_task(tmp_path, data_dir)), "stackoverflow.sqlite")


def test_unreadable_data_directory(tmp_path, dataset):
    data_dir = _copy_dataset(dataset, tmp_path / "data")
    if not IS_ROOT:
        data_dir.chmod(0)
        try:
            for synthetic in (False, True):
                usage_error(run_cli(_tag_task(tmp_path, data_dir, synthetic=synthetic)))
        finally:
            data_dir.chmod(stat.S_IRWXU)
    # a data directory that is a regular file (root stand-in: it cannot be listed either)
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory\n")
    for synthetic in (False, True):
        usage_error(run_cli(_tag_task(tmp_path, blocker, synthetic=synthetic)), str(blocker))
    assert blocker.read_text() == "not a directory\n"


# -- 4. smaller ones ----------------------------------------------------------------------------


def test_calibrate_refuses_sample_rate_with_population_and_cohort():
    argv = ["calibrate", "--target-epsilon", "3", "--delta", "1e-5", "--rounds", "50"]
    argv += ["--sample-rate", "0.02", "--population", "1000", "--cohort", "50"]
    usage_error(run_cli(argv), "--sample-rate", "--cohort")
    usage_error(run_cli([*argv[:-6], "--sample-rate", "0.02", "--cohort", "50"]), "--cohort")


def test_long_values_are_shortened_in_messages(tmp_path):
    name = "x" * 2**20
    for argv in (
        ["compare", str(TOY), "--strategies", name, "--out", str(tmp_path / "o"), "--quiet"],
        ["simulate", str(TOY), "--strategy", name, "--out", str(tmp_path / "o"), "--quiet"],
        simulate(str(tmp_path / "o"), "--set", f"strategy={name}"),
    ):
        line = usage_error(run_cli(argv))
        assert len(line) < 1000 and "xxx…" in line, line[:300]


def test_text_between_two_quoted_words_is_not_shortened():
    from fedprivopt.cli_args import one_line

    advice = "a long explanation, " * 12
    text = f"accountant 'prv' cannot bound this: {advice}use 'rdp' instead"
    assert one_line(text) == text  # the advice between 'prv' and 'rdp' is kept whole
    value = "y" * 300
    shortened = one_line(f"bad name '{value}' given")  # both ends kept: a path's tail is its file
    assert shortened == f"bad name '{'y' * 39}…{'y' * 40}' (300 characters) given"


# -- later review ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["simulate", "compare", "data synth"])
def test_out_with_a_line_break_is_an_error(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)  # it used to create a directory whose name holds the line break
    usage_error(run_cli(COMMANDS[command]("runs/a\nb")), "--out", "control character")
    assert list(tmp_path.iterdir()) == []


def test_out_that_is_a_dangling_symlink_is_named_as_such(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    usage_error(run_cli(COMMANDS["simulate"](str(tmp_path / "link"))), "--out", "link to nothing")


@pytest.mark.parametrize("path", ["", "a" * 300, "run\n"])
def test_resume_needs_a_path(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)  # an empty --resume used to resume the current directory
    err = usage_error(run_cli(["simulate", "--resume", path]), "--resume")
    assert len(err) < 300


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_config_that_is_not_a_regular_file_is_named_as_such(tmp_path, kind):
    path = tmp_path / "preset.toml"
    path.mkdir() if kind == "directory" else os.mkfifo(path)
    argv = ["simulate", str(path), "--out", str(tmp_path / "o")]
    usage_error(run_cli(argv), "not a regular file")


@pytest.mark.parametrize(
    ("sets", "needle"),
    [  # found by a third review: Ray's own error 12 s later; an allocation traceback after 26 s
        (["fast-actors=4611686018427387904"], "fast-actors must be an integer in [0, 256]"),
        (
            ["task-params.dim=16000", "task-params.num-classes=16000"],
            "task-params.dim * task-params.num-classes",
        ),
    ],
)
def test_sizes_that_would_not_fit_are_refused_before_the_run(tmp_path, sets, needle):
    argv = ["simulate", str(TOY), "--out", str(tmp_path / "o"), "--quiet"]
    usage_error(run_cli([*argv, *(f"--set={s}" for s in sets)]), needle)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "case",
    ["client-cpus", "ray-cpus", "client-gpus", "client-cpus-zero", "client-cpus-tiny", "ray-big"],
)
def test_flower_client_resources_beyond_the_machine_are_refused_before_ray(tmp_path, case):
    # found by a fourth review: client-cpus=64 on 2 cores, or client-gpus=1 with no GPU, ended
    # after 10-17 s with rc 1 and a 114-line traceback ("ActorPool is empty"); a fifth: client-cpus
    # 0 (ZeroDivisionError traceback), 0.001 (2,000 actors, still starting after 80 s) and
    # ray-cpus=100000 (a pool for CPUs that are not there, still running after 150 s)
    import re

    import torch

    cpus, gpus = os.cpu_count() or 1, torch.cuda.device_count()
    settings, key, valid = {
        "client-cpus": ({"client-cpus": cpus + 1}, "client-cpus", f"[{cpus / 256:g}, {cpus}]"),
        "ray-cpus": ({"ray-cpus": 1, "client-cpus": 2}, "client-cpus", f"[{1 / 256:g}, 1]"),
        "client-gpus": ({"client-gpus": gpus + 0.5}, "client-gpus", f"[0, {gpus}]"),
        "client-cpus-zero": ({"client-cpus": 0}, "client-cpus", f"[{cpus / 256:g}, {cpus}]"),
        "client-cpus-tiny": ({"client-cpus": 0.001}, "client-cpus", f"[{cpus / 256:g}, {cpus}]"),
        "ray-big": ({"ray-cpus": 100000}, "ray-cpus", f"[0, {cpus}]"),
    }[case]
    sets = [f"--set={k}={v}" for k, v in settings.items()]
    out = tmp_path / "o"
    usage_error(run_cli(simulate(str(out), "--engine", "flower", *sets)), key, valid)
    assert not out.exists()
    line = usage_error(run_cli(compare(str(tmp_path / "c"), "--engine", "flower", *sets)), key)
    assert "dp-fedavg__sigma0.5__seed0" in line and valid in line
    assert not (tmp_path / "c").exists()  # nor an empty runs/ (twenty-third review)
    # a finished fast run whose config.toml is switched to the flower engine (not a privacy
    # setting, so a resume may change it): refused before anything of the run changes
    run = tmp_path / "run"
    assert run_cli(simulate(str(run)))[0] == 0
    text = (run / "config.toml").read_text().replace('engine = "fast"', 'engine = "flower"')
    for name, value in settings.items():
        text = re.sub(rf"(?m)^{name} = .*$", f"{name} = {value}", text)
    (run / "config.toml").write_text(text)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.name != "run.lock"}
    usage_error(run_cli(["simulate", "--resume", str(run), "--quiet"]), key, valid)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != "run.lock"} == before


# -- sixth review ------------------------------------------------------------------------------


def test_epsilon_at_a_noise_multiplier_below_the_floor(tmp_path):
    """σ 1e-155 printed epsilon 0.0000 (dp-accounting's NaN RDP); 1e-300 a ZeroDivisionError."""
    for sigma in ("1e-155", "1e-300"):
        argv = ["epsilon", "--noise-multiplier", sigma, "--sample-rate", "0.25", "--rounds", "1"]
        usage_error(run_cli([*argv, "--delta", "1e-4"]), "--noise-multiplier", "1e-100")


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_runs_at_a_noise_multiplier_below_the_floor_write_nothing(tmp_path, command):
    """simulate at σ 1e-160 reported ε 0 and skipped the budget stop; compare at 1e-300 left a
    traceback, ``compare.lock`` and an empty ``runs/``."""
    out = tmp_path / "R"
    if command == "simulate":
        argv = simulate(str(out), "--set", "noise-multiplier=1e-160", "--set", "target-epsilon=1")
    else:
        argv = compare(str(out), "--noise-multipliers", "1e-300")
    usage_error(run_cli(argv), "noise-multiplier", "1e-100")
    assert not out.exists()


def test_deploy_local_into_a_directory_that_is_not_a_run_writes_nothing(tmp_path):
    """It wrote deploy/processes.json and logs and started SuperLink and a SuperNode before the
    ServerApp refused the directory: rc 1 with a traceback (sixth review)."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("a user's file\n")
    usage_error(run_cli(deploy(str(out))), str(out), "notes.txt")
    assert sorted(os.listdir(out)) == ["notes.txt"]


# -- seventh round: a flag and ``--set`` of the same key, empty lists, non-ASCII digits ----------


@pytest.mark.parametrize(
    ("flag", "setting"),
    [(["--rounds", "2"], "num-server-rounds=3"), (["--seed", "4"], "seed=5")],
)
def test_a_flag_that_contradicts_set_is_refused(tmp_path, flag, setting):
    """``--rounds 2 --set num-server-rounds=3`` ran 2 rounds and said nothing of the 3."""
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--out", str(out), *SMALL, *flag, "--set", setting]
    usage_error(run_cli(argv), flag[0], setting.split("=")[0])
    assert not out.exists()


def test_a_flag_that_repeats_set_is_accepted(tmp_path):
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--out", str(out), *SMALL, "--rounds", "1"]
    assert run_cli([*argv, "--set", "num-server-rounds=1"])[0] == 0
    assert (out / "summary.json").is_file()


@pytest.mark.parametrize("names", ["", " ", ",", "dp-fedavg,"])
def test_compare_strategies_empty_names_are_refused(tmp_path, names):
    """``--strategies ""`` ran every registered strategy: the empty list read as no flag."""
    out = tmp_path / "cmp"
    argv = ["compare", str(TOY), "--strategies", names, "--rounds", "1", "--out", str(out)]
    usage_error(run_cli([*argv, *SMALL]), "--strategies")
    assert not out.exists()


@pytest.mark.parametrize(("flag", "text"), [("--rounds", "\u0663"), ("--seed", "\uff11")])
def test_non_ascii_digits_are_refused(tmp_path, flag, text):
    """``int("٣")`` is 3: the flag took Arabic-Indic and full-width digits as numbers."""
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--out", str(out), *SMALL, flag, text]
    usage_error(run_cli(argv), flag, "ASCII")
    assert not out.exists()


def _tag_run(tmp_path: Path, data_dir: Path, out: Path, synth_seed: int) -> list[str]:
    """A 1-round tag-prediction run on a tiny synthetic dataset generated into ``data_dir``."""
    sets = {
        "data-dir": str(data_dir),
        "synth-clients": 30,
        "synth-vocab": 300,
        "synth-tags": 10,
        "synth-seed": synth_seed,
        "vocab-size": 200,
        "num-tags": 8,
        "num-users": 24,
        "eval-users": 4,
    }
    argv = ["simulate", str(TAG_MINI), "--rounds", "1", "--out", str(out), "--quiet"]
    argv += ["--set", "population=24", "--set", "clients-per-round=4"]
    for key, value in sets.items():
        argv += ["--set", f"task-params.{key}={value}"]
    return argv


def test_resume_on_other_data_at_the_same_path_is_refused(tmp_path):
    """Finding 8 of the sixth review: another dataset moved to ``data-dir`` was resumed on.

    The ledger's header records the task's data identity; ``--resume`` (and a compare that
    would reuse the run) rebuilds the task and compares before anything is written.
    """
    import shutil

    data, out = tmp_path / "data", tmp_path / "run"
    assert run_cli(_tag_run(tmp_path, data, out, synth_seed=0))[0] == 0
    ledger = (out / "privacy_ledger.jsonl").read_text()
    assert '"users_sha256"' in ledger.splitlines()[0]
    # the same data: resuming a finished run is accepted
    assert run_cli(["simulate", "--resume", str(out), "--quiet"])[0] == 0
    # another synthetic dataset (another seed, same sizes) generated elsewhere, moved in
    other = tmp_path / "other"
    assert run_cli(_tag_run(tmp_path, other, tmp_path / "run2", synth_seed=1))[0] == 0
    shutil.rmtree(data)
    shutil.copytree(other, data)
    (data / "stackoverflow.synthetic.json").unlink()  # as a real download has no sidecar
    before = {p: p.read_bytes() for p in out.iterdir() if p.is_file()}
    line = usage_error(run_cli(["simulate", "--resume", str(out), "--quiet"]), "data-dir")
    assert "other data" in line
    assert {p: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("secure", [True, False])
def test_a_secure_tree_run_does_not_redo_released_rounds(tmp_path, secure):
    """Seventh review, F1: a secure tree run resumed from an older checkpoint redid rounds 3-4
    with a new shuffle and new noise, uncharged, and users of the lost rounds took part twice
    in the period. Refused now; seeded mode replays the same releases and resumes."""
    from fedprivopt.simulation.files import CHECKPOINT

    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "4", "--out", str(out), "--quiet"]
    argv += ["--set", "population=16", "--set", "clients-per-round=4"]
    argv += ["--set", "task-params.num-users=16", "--set", "checkpoint-every=2"]
    argv += ["--set", 'noise-mechanism="tree"', "--set", f"secure={str(secure).lower()}"]
    assert run_cli(argv)[0] == 0
    (out / CHECKPOINT).unlink()  # the round-4 checkpoint lost: the round-2 one is restored
    ledger = (out / "privacy_ledger.jsonl").read_bytes()
    resumed = run_cli(["simulate", "--resume", str(out), "--quiet"])
    if secure:
        usage_error(resumed, "noise-mechanism = tree", "secure", "rounds 3-4")
        assert (out / "privacy_ledger.jsonl").read_bytes() == ledger
    else:
        assert resumed[0] == 0, resumed[2][-2000:]


@pytest.mark.parametrize(("nodes", "needle"), [("100000", "[1, 64]"), ("13", "population (12")])
def test_deploy_local_nodes_are_bounded(tmp_path, nodes, needle):
    """Seventh review, F8: --nodes 100000 ended in EMFILE with a traceback, leaving deploy/;
    more nodes than users waited for nodes that could have no users."""
    out = tmp_path / "dep"
    argv = ["deploy", "local", "--nodes", nodes, "--insecure", str(TOY), "--out", str(out)]
    usage_error(run_child([*argv, *SMALL]), "--nodes", needle)
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--set", 'strategy="dp-fedadam"'], "--strategies"),
        (["--noise-multipliers", "0.5", "--set", "noise-multiplier=50"], "--noise-multipliers"),
    ],
)
def test_compare_grid_flags_are_not_contradicted_by_set(tmp_path, extra, needle):
    """Seventh review, minor 1: the grid silently won over ``--set strategy`` or the σ."""
    out = tmp_path / "cmp"
    usage_error(run_cli([*compare(str(out)), *extra]), needle)
    assert not out.exists()


def test_compare_metric_the_task_does_not_report_is_refused_before_any_run(tmp_path):
    """Sixth review, finding 10: ``--metric eval_recall_at_5`` on the toy task ran every cell
    and failed only when the report was written."""
    out = tmp_path / "cmp"
    usage_error(run_cli([*compare(str(out)), "--metric", "eval_recall_at_5"]), "--metric")
    assert not out.exists()


# -- eighth review's minors: a key set twice, keys that do nothing in this run ----------------


def test_a_key_set_twice_with_two_values_is_refused(tmp_path):
    """``--set noise-multiplier=0.5 --set noise-multiplier=50`` ran at 50: the last won."""
    out = tmp_path / "run"
    argv = simulate(str(out), "--set", "noise-multiplier=0.5", "--set", "noise-multiplier=50")
    usage_error(run_cli(argv), "--set", "noise-multiplier=50", "noise-multiplier=0.5")
    assert not out.exists()
    # the same value twice says the same thing, and runs
    argv = simulate(str(out), "--set", "noise-multiplier=0.5", "--set", "noise-multiplier=0.5")
    assert run_cli(argv)[0] == 0


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ('ray-address="127.0.0.1:6379"', "fast-actors"),  # was ignored: trained in process
        ("tree-restart-rounds=2", "noise-mechanism 'tree'"),  # was ignored: Gaussian noise
    ],
)
def test_a_key_that_this_run_would_ignore_is_refused(tmp_path, setting, needle):
    out = tmp_path / "run"
    usage_error(run_cli(simulate(str(out), "--set", setting)), setting.split("=")[0], needle)
    assert not out.exists()


def test_an_interrupted_tuning_says_how_to_continue():
    """Ctrl-C of ``tune`` printed only ``interrupted``; the same command reuses its trials."""
    from fedprivopt.cli import _interrupted

    assert "the same command continues it" in _interrupted("tune", KeyboardInterrupt())
