"""Fuzz tests of the command line: random flags and values for ``epsilon``, ``calibrate``,
``simulate``, ``compare`` and ``data info``, and random token lists.

Property: :func:`fedprivopt.cli.main` ends with exit code 0 or 2 (returned, or argparse's
``SystemExit``); with 2, stderr is exactly one line starting with ``fedprivopt`` and holds no
traceback. Nothing else escapes.

Kept fast and harmless: the accountant is ``rdp``, ``pld`` or an invalid name (``prv`` is not
fuzzed). ``pld`` used to exhaust memory on a tiny sigma; it now refuses a grid beyond
``pld_guard.PLD_MAX_BYTES`` before allocating it, and the fuzz lowers that limit to 16 MiB
(:func:`small_pld_limit`) so that an accepted ``pld`` input costs at most ~0.3 s while the refusal
path is exercised too. ``simulate`` and ``compare`` always carry a last ``--set`` that no other
flag can repair (so no training starts), and everything runs in a temporary working directory.
``deploy`` and ``data synth`` are not generated.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fedprivopt.cli import main
from fedprivopt.privacy import pld_guard
from tests.reliability.conftest import count, fuzz_settings

PRESET = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)``: exit code (argparse's SystemExit included), stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def small_pld_limit(monkeypatch):
    """PLD grids above 16 MiB (estimated) are refused: accepted PLD inputs stay fast."""
    monkeypatch.setattr(pld_guard, "PLD_MAX_BYTES", 16 * 2**20)


def check(argv: list[str]) -> tuple[int, str, str]:
    count("cli")
    code, out, err = run_cli(argv)
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        assert "Traceback" not in err, (argv, err)
        assert err.endswith("\n") and len(err.splitlines()) == 1, (argv, err)
        assert err.startswith("fedprivopt"), (argv, err)
    return code, out, err


# -- values -------------------------------------------------------------------------------------

SPECIAL = st.sampled_from(
    [
        "nan", "inf", "-inf", "1e-300", "1e300", "0", "1", "-1", "\n2", " 0.5 ", "0x10", "1_000",
        "", " \n0", "1e309", "5e-324", "--delta", "=1", "١", "²", "0.1\r", "1e-5",
    ]
)  # fmt: skip
FLOAT_TEXT = st.one_of(
    SPECIAL,
    st.floats().map(repr),
    st.floats(min_value=0.0, max_value=1.0).map(repr),
    st.floats(min_value=0.05, max_value=20.0).map(lambda x: f"{x:.3g}"),
    st.text(max_size=6),
)
INT_TEXT = st.one_of(
    SPECIAL,
    st.integers(-3, 60).map(str),
    st.integers(-(2**70), 2**70).map(str),
    st.text(alphabet="0123456789-+ .e_", max_size=6),
)


def _flag_values(sigma_flag: str) -> dict:
    return {
        sigma_flag: FLOAT_TEXT,
        "--sample-rate": FLOAT_TEXT,
        "--rounds": INT_TEXT,
        "--delta": FLOAT_TEXT,
        "--accountant": st.sampled_from(["rdp", "rdp", "pld", "pld", "RDP", "", "gdp", "pld "]),
        "--pld-discretization": st.one_of(FLOAT_TEXT, st.sampled_from(["1e-3", "1e-2", "0.5"])),
        "--sampling": st.sampled_from(["poisson", "fixed", "fixed", "random", ""]),
        "--population": INT_TEXT,
        "--cohort": INT_TEXT,
        "--events-per-round": INT_TEXT,
        "--json": None,
        "--bogus": st.text(max_size=4),
    }


@st.composite
def privacy_argv(draw, command: str, sigma_flag: str, forced_bad: bool) -> list[str]:
    values = _flag_values(sigma_flag)
    required = [sigma_flag, "--rounds", "--delta"]
    flags = draw(st.lists(st.sampled_from(sorted(values)), unique=True, max_size=8))
    if draw(st.booleans()):  # mostly complete commands, so the checks past argparse run
        flags = list(dict.fromkeys(required + flags))
    argv = [command]
    for flag in draw(st.permutations(flags)):
        argv.append(flag)
        if values[flag] is not None:
            argv.append(draw(values[flag]))
    if forced_bad:
        argv += ["--delta", draw(st.sampled_from(["0", "1", "nan", "-1e-5", "x"]))]
    return argv


EPS = ["epsilon", "--noise-multiplier"]


PLD = ["--accountant", "pld"]


@fuzz_settings(60)
@given(argv=privacy_argv("epsilon", "--noise-multiplier", forced_bad=False))
@example(argv=[*EPS, "1", "--sample-rate", "\n2", "--rounds", "5", "--delta", "1e-5"])
@example(argv=[*EPS, "1", "--sample-rate", "0.1", "--rounds", " \n0", "--delta", "1e-5"])
@example(argv=[*EPS, "1e300", "--sample-rate", "1e-300", "--rounds", "50", "--delta", "1e-300"])
@example(argv=[*EPS, "0.01", "--sample-rate", "1", "--rounds", "1", "--delta", "1e-5", *PLD])
@example(
    argv=[*EPS, "0.5", "--sample-rate", "1e-300", "--rounds", "1" + "0" * 12, "--delta", "1e-5"]
)
def test_epsilon_flags(small_pld_limit, argv):
    check(argv)


def test_pld_regressions(small_pld_limit):
    """Inputs that exhausted memory (a ~22 GiB grid, a 10^12-digit integer) or hung in
    dp-accounting: now one error line, or a result."""
    code, _, err = check([*EPS, "0.01", "--sample-rate", "1", "--rounds", "1", "--delta", "1e-5",
                          *PLD])  # fmt: skip
    assert code == 2 and "noise_multiplier=0.01" in err and "--accountant" not in err
    assert "rdp" in err and "--pld-discretization" in err
    code, out, _ = check([*EPS, "0.5", "--sample-rate", "1e-300", "--rounds", str(10**12),
                          "--delta", "1e-5", *PLD, "--json"])  # fmt: skip
    assert code == 0 and '"epsilon": 0.0' in out
    code, _, err = check([*EPS, "3", "--sample-rate", "0.5", "--rounds", "100000", "--delta",
                          "1e-5", *PLD])  # fmt: skip
    assert code == 2 and "composition over 100000" in err


@fuzz_settings(40)
@given(argv=privacy_argv("calibrate", "--target-epsilon", forced_bad=True))
def test_calibrate_flags(small_pld_limit, argv):
    """Every generated argv ends with a bad ``--delta`` (a full calibration takes up to 5 s)."""
    check(argv)


def _in_range(lo: float, hi: float, extremes: list[str]):
    return st.one_of(st.floats(min_value=lo, max_value=hi).map(repr), st.sampled_from(extremes))


@st.composite
def in_range_argv(draw, command: str, sigma_flag: str, extremes: bool = True) -> list[str]:
    """Complete commands whose values all pass argparse: the accountant's numerics are tested."""
    sigma = _in_range(1e-2, 1e3, ["1e-300", "5e-324", "1e300", "1.7e308"] if extremes else ["1"])
    rate = _in_range(1e-6, 1.0, ["1e-300", "5e-324", "1"] if extremes else ["1"])
    delta = _in_range(1e-12, 0.5, ["1e-300", "5e-324", "0.9999999"] if extremes else ["1e-5"])
    rounds = st.integers(1, 10**12 if extremes else 1000)
    argv = [command, sigma_flag, draw(sigma), "--sample-rate", draw(rate)]
    argv += ["--delta", draw(delta), "--rounds", str(draw(rounds))]
    if draw(st.booleans()):
        argv += ["--events-per-round", str(draw(st.integers(1, 3)))]
    if draw(st.booleans()):
        argv.append("--json")
    if command == "epsilon" and draw(st.booleans()):
        argv += ["--accountant", "pld"]
        if draw(st.booleans()):
            argv += ["--pld-discretization", draw(_in_range(1e-5, 0.5, ["1e-300", "0.9"]))]
    return argv


@fuzz_settings(30)
@given(argv=in_range_argv("epsilon", "--noise-multiplier"))
def test_epsilon_in_range_values(small_pld_limit, argv):
    check(argv)


@st.composite
def pld_argv(draw) -> list[str]:
    """Complete ``epsilon --accountant pld`` commands, mostly with grids that fit (and run)."""
    sigma = _in_range(0.3, 100.0, ["0.01", "0.05", "1e-300", "1e300"])
    rate = _in_range(1e-5, 1.0, ["1", "1e-300"])
    rounds = st.one_of(st.integers(1, 2000), st.sampled_from([10**6, 10**12]))
    argv = [*EPS, draw(sigma), "--sample-rate", draw(rate), "--rounds", str(draw(rounds))]
    argv += ["--delta", draw(_in_range(1e-12, 0.5, ["1e-300", "0.9999999"])), *PLD]
    if draw(st.booleans()):
        argv += ["--pld-discretization", draw(st.sampled_from(["1e-3", "1e-2", "0.3", "1e-5"]))]
    return argv


@fuzz_settings(15)
@given(argv=pld_argv())
def test_epsilon_pld_values(small_pld_limit, argv):
    check(argv)


CAL = ["calibrate", "--target-epsilon"]


@fuzz_settings(3)
@given(argv=in_range_argv("calibrate", "--target-epsilon", extremes=False))
@example(argv=[*CAL, "1.7e308", "--sample-rate", "1", "--delta", "1e-300", "--rounds", "32015"])
@example(argv=[*CAL, "1e300", "--sample-rate", "1", "--rounds", "50", "--delta", "0.9999"])
def test_calibrate_in_range_values(argv):
    """A few complete calibrations (1-5 s each; extreme ones take up to ~40 s, so the
    extremes are the explicit examples, which fail fast)."""
    check(argv)


# -- simulate / compare ---------------------------------------------------------------------------

SET_VALUES = st.one_of(
    st.sampled_from(
        [
            "clip-norm=0.5", "noise-multiplier=abc", "seed=-1", "x", "=1", "strategy=nope",
            "task-params.num-users=7", "device=cuda:one", "engine=ray", "seed=1\n[x]",
            "num-server-rounds=0", "strategies.nope.clip-norm=1", "population=1e400",
        ]
    ),
    st.text(max_size=12),
)  # fmt: skip
# Each is invalid whatever else the command line says (no flag sets these keys).
UNREPAIRABLE = st.sampled_from(
    ["population=0", "noise-multiplier=-1", "task=", "device=tpu", "fuzz-unknown-key=1"]
)


@st.composite
def run_argv(draw, command: str, configs: list[str]) -> list[str]:
    argv = [command]
    if draw(st.integers(0, 4)):
        argv.append(draw(st.sampled_from(configs)))
    options = {
        "--strategy": st.sampled_from(["dp-fedavg", "dp2", "nope", ""]),
        "--engine": st.sampled_from(["fast", "flower", "ray"]),
        "--rounds": INT_TEXT,
        "--seed": INT_TEXT,
        "--out": st.sampled_from(["out", "out/a", ""]),
        "--quiet": None,
        "--resume": st.sampled_from(configs),
        "--noise-multipliers": st.one_of(FLOAT_TEXT, st.sampled_from(["0.5,1", "1,,2", "a,b"])),
        "--strategies": st.sampled_from(["dp-fedavg,fedavg", "nope", "", "dp-fedavg,,dp2"]),
        "--seeds": INT_TEXT,
    }
    names = ["--strategy", "--engine", "--rounds", "--seed", "--out", "--quiet", "--resume"]
    if command == "compare":
        names = ["--noise-multipliers", "--strategies", "--seeds", "--engine", "--rounds",
                 "--out", "--quiet"]  # fmt: skip
    for flag in draw(st.lists(st.sampled_from(names), max_size=5)):
        argv.append(flag)
        if options[flag] is not None:
            argv.append(draw(options[flag]))
    for text in draw(st.lists(SET_VALUES, max_size=3)):
        argv += ["--set", text]
    return [*argv, "--set", draw(UNREPAIRABLE)]


def _paths(tmp: Path) -> list[str]:
    junk = tmp / "junk.toml"
    junk.write_bytes(b"\x00\xffstrategy = [")
    run_dir = tmp / "run"
    run_dir.mkdir(exist_ok=True)
    (run_dir / "config.toml").write_text("strategy = 'dp-fedavg'\npopulation = 0\n")
    return [str(PRESET), str(tmp / "missing.toml"), str(tmp), str(junk), str(run_dir), "\n"]


@fuzz_settings(60)
@given(data=st.data())
def test_simulate_and_compare_flags(tmp_path, monkeypatch, data):
    monkeypatch.chdir(tmp_path)
    configs = _paths(tmp_path)
    command = data.draw(st.sampled_from(["simulate", "compare"]))
    argv = data.draw(run_argv(command, configs))
    code, _, _ = check(argv)
    assert code == 2  # never ran: the last --set is always invalid
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


def test_simulate_regressions(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv in (
        ["simulate", str(tmp_path / "x\ny.toml")],
        ["simulate", str(PRESET), "--set", "seed=1\n[x]", "--set", "population=0"],
        ["data", "info", str(tmp_path / "no\nsuch")],
    ):
        assert check(argv)[0] == 2


# -- data info and random tokens ------------------------------------------------------------------

TOKENS = st.one_of(
    st.sampled_from(
        [
            "epsilon", "calibrate", "simulate", "compare", "data", "info", "--help", "--version",
            "--json", "--rounds", "--delta", "--noise-multiplier", "--sample-rate", "1", "0.5",
            "-h", "--set", "--resume", "--quiet", "--accountant", "rdp", "-", "--", "x=1",
        ]
    ),
    st.text(max_size=6),
)  # fmt: skip


@fuzz_settings(60)
@given(tokens=st.lists(TOKENS, max_size=7))
def test_random_tokens(tmp_path, monkeypatch, tokens):
    """Any token list (no ``deploy``/``synth``, so nothing starts or writes) exits 0 or 2."""
    monkeypatch.chdir(tmp_path)
    if "deploy" in tokens or "synth" in tokens:
        tokens = [t for t in tokens if t not in ("deploy", "synth")]
    if {"simulate", "compare"} & set(tokens):
        tokens = [*tokens, "--set", "population=0"]
    check(tokens)


@fuzz_settings(30)
@given(path=st.one_of(st.sampled_from(["missing", ".", "junk.h5", "junk.sqlite", "junk"]),
                      st.text(max_size=8)))  # fmt: skip
def test_data_info_paths(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "junk.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\x00" * 64)
    (tmp_path / "junk.sqlite").write_bytes(b"SQLite format 3\x00" + b"\x01" * 200)
    (tmp_path / "junk").write_bytes(b"not a dataset")
    check(["data", "info", path])
