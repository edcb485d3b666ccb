import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedprivopt.cli import main

BASE = [
    "--noise-multiplier",
    "1.0",
    "--sample-rate",
    "0.01",
    "--rounds",
    "10000",
    "--delta",
    "1e-5",
]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def exit_code(argv):
    """main's return code, or the code of the SystemExit argparse raises for parse errors."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_epsilon_json_rdp_and_pld(capsys):
    code, out, err = run(capsys, "epsilon", *BASE, "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["epsilon"] == pytest.approx(6.7127, abs=0.005)
    assert data["delta"] == 1e-5 and data["noise_multiplier"] == 1.0
    assert data["sample_rate"] == 0.01 and data["rounds"] == 10_000
    assert data["accountant"] == "rdp" and data["sampling"] == "poisson"
    code, out, _ = run(capsys, "epsilon", *BASE, "--json", "--accountant", "pld")
    assert code == 0 and json.loads(out)["epsilon"] == pytest.approx(6.19, abs=0.02)


def test_epsilon_readable_line(capsys):
    code, out, _ = run(capsys, "epsilon", *BASE)
    assert code == 0
    assert out.count("\n") == 1 and "epsilon = 6.71" in out and "10000 rounds" in out


def test_epsilon_fixed_sampling_and_events_per_round(capsys):
    argv = ["--noise-multiplier", "1.0", "--rounds", "100", "--delta", "1e-5"]
    code, out, _ = run(
        capsys,
        "epsilon",
        *argv,
        "--sampling",
        "fixed",
        "--population",
        "1000",
        "--cohort",
        "10",
        "--json",
    )
    fixed = json.loads(out)
    assert code == 0 and fixed["neighboring_relation"] == "replace_one"
    assert fixed["accountant_noise_multiplier"] == 0.5 and fixed["sample_rate"] == 0.01
    _, out, _ = run(capsys, "epsilon", *argv, "--sample-rate", "0.01", "--json")
    poisson = json.loads(out)
    assert fixed["epsilon"] > poisson["epsilon"]
    _, out, _ = run(
        capsys, "epsilon", *argv, "--sample-rate", "0.01", "--json", "--events-per-round", "2"
    )
    two = json.loads(out)
    _, out, _ = run(
        capsys,
        "epsilon",
        "--noise-multiplier",
        "1.0",
        "--rounds",
        "200",
        "--delta",
        "1e-5",
        "--sample-rate",
        "0.01",
        "--json",
    )
    assert two["epsilon"] == json.loads(out)["epsilon"] > poisson["epsilon"]


def test_calibrate_round_trips_through_epsilon(capsys):
    code, out, _ = run(
        capsys,
        "calibrate",
        "--target-epsilon",
        "3",
        "--delta",
        "1e-5",
        "--sample-rate",
        "0.02",
        "--rounds",
        "500",
        "--json",
    )
    data = json.loads(out)
    assert code == 0 and data["target_epsilon"] == 3.0
    sigma = data["noise_multiplier"]
    _, out, _ = run(
        capsys,
        "epsilon",
        "--noise-multiplier",
        repr(sigma),
        "--sample-rate",
        "0.02",
        "--rounds",
        "500",
        "--delta",
        "1e-5",
        "--json",
    )
    eps = json.loads(out)["epsilon"]
    assert eps <= 3.0 and eps == pytest.approx(3.0, rel=0.005)


BAD = [
    (["--noise-multiplier", "0"], "--noise-multiplier", "[1e-100, inf)"),
    (["--noise-multiplier", "-1"], "--noise-multiplier", "[1e-100, inf)"),
    (["--sample-rate", "0"], "--sample-rate", "(0, 1]"),
    (["--sample-rate", "1.5"], "--sample-rate", "(0, 1]"),
    (["--delta", "0"], "--delta", "(0, 1)"),
    (["--delta", "1"], "--delta", "(0, 1)"),
    (["--rounds", "0"], "--rounds", ">= 1"),
    (["--rounds", "2.5"], "--rounds", "int"),
    (["--accountant", "gdp"], "--accountant", "'rdp', 'pld', 'prv'"),
    (["--sampling", "fixed"], "--sampling", "--population"),
    (["--sampling", "fixed", "--population", "10", "--cohort", "20"], "--cohort", "[1, "),
    (
        ["--sampling", "fixed", "--population", "1000", "--cohort", "10", "--accountant", "pld"],
        "--accountant",
        "rdp",
    ),
    (["--events-per-round", "0"], "--events-per-round", ">= 1"),
]


@pytest.mark.parametrize(("change", "flag", "hint"), BAD)
def test_bad_input_exits_2_with_one_line_naming_the_flag(capsys, change, flag, hint):
    args = dict(zip(BASE[::2], BASE[1::2], strict=True))
    extra = []
    for key, value in zip(change[::2], change[1::2], strict=True):
        if key in args:
            args[key] = value
        else:
            extra += [key, value]
    argv = ["epsilon", *[x for kv in args.items() for x in kv], *extra]
    assert exit_code(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert flag in lines[0] and hint in lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("target", "rate", "rounds"), [("5", "0.1", "100"), ("3", "0.1", "500"), ("1", "0.01", "1000")]
)
def test_calibrate_prints_a_sigma_that_meets_the_target(capsys, target, rate, rounds):
    """Sixth review of issue 15: the printed 1.2910 gave epsilon 5.0002 > 5 (rounded to nearest)."""
    flags = ["--sample-rate", rate, "--rounds", rounds, "--delta", "1e-5"]
    code, out, _ = run(capsys, "calibrate", "--target-epsilon", target, *flags)
    printed = out.split("noise multiplier = ")[1].split()[0]
    _, again, _ = run(capsys, "epsilon", "--noise-multiplier", printed, *flags, "--json")
    assert code == 0 and json.loads(again)["epsilon"] <= float(target)


def test_calibrate_bad_target(capsys):
    argv = ["calibrate", "--target-epsilon", "0", "--delta", "1e-5", "--sample-rate", "0.1"]
    assert exit_code([*argv, "--rounds", "10"]) == 2
    assert "--target-epsilon" in capsys.readouterr().err


def _console_script() -> str:
    exe = Path(sys.executable).with_name("fedprivopt")
    return str(exe) if exe.exists() else shutil.which("fedprivopt")


def test_installed_console_script_end_to_end():
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    ok = subprocess.run(
        [_console_script(), "epsilon", *BASE, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["epsilon"] == pytest.approx(6.7127, abs=0.005)
    bad = subprocess.run(
        [_console_script(), "epsilon", *BASE[:-1], "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "--delta" in bad.stderr
    assert "Traceback" not in bad.stderr
    helped = subprocess.run(
        [_console_script(), "epsilon", "--help"], capture_output=True, text=True, timeout=120
    )
    assert helped.returncode == 0 and "--noise-multiplier" in helped.stdout


def test_ctrl_c_while_the_parser_is_built_is_one_line(monkeypatch, capsys):
    # found by a later review: Ctrl-C in the first seconds (building the parser imports torch)
    # ended with a KeyboardInterrupt traceback
    import fedprivopt.cli as cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["simulate", "x.toml"]) == 130
    assert capsys.readouterr().err == "fedprivopt: interrupted\n"


def test_the_command_line_module_loads_without_torch():
    # what runs before the parser exists (and before Ctrl-C is caught) stays light
    import subprocess
    import sys

    code = "import sys, fedprivopt.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
