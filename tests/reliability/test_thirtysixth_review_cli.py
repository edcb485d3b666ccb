"""Issue 15, thirty-sixth hostile review (command line): regression tests of its findings.

1. ``simulate toy.toml --out P``, P a path of about 5,000 characters (25 components of 200)
   that cannot be created (``File name too long``; also under a file), echoed about 1,900
   characters of it on its one line: paths in a file-system error are not quoted, so
   ``one_line`` did not cut them, only its 2,000-character cap did. Now the path is cut as
   every long value is: ``argument --out: '/tmp/…aaa' (5,038 characters): File name too
   long`` (``cli_args.shown_path``; also ``check_out_dir``'s ``cannot use``/``cannot write
   in``).
2. ``compare`` again with ``--tensorboard`` over a cell run without it refused with
   ``holds a run made with tensorboard = False, this call asks for True``: Python's ``repr``
   (strings in single quotes), not the ``false``/``true`` a user writes in a preset or a
   ``--set``. The values are now written as TOML (``tensorboard = false, this call asks for
   true``; ``device = "auto"``), also in the report's "the earlier run had …" of a rerun.
3. ``simulate toy.toml --out /proc/a/b`` (a directory whose parent cannot be created) was
   refused as ``error: /proc/a: No such file or directory``, naming no flag (the twenty-third
   review named it only for the path itself, ``--out /proc/t``); run from a working directory
   under ``/proc``, ``simulate`` (default ``runs/<strategy>-seed<S>``) and ``compare``
   (``runs/compare``) said ``error: runs: No such file or directory``, a path the user never
   typed. Now ``argument --out: cannot create /proc/a/b: /proc/a: No such file or directory``
   and ``argument --out: cannot create runs/dp-fedavg-seed0: runs: …``.
4. ``fedprivopt epsilon … extra`` (also ``simulate toy.toml toy.toml``, ``simulate -- toy.toml
   --rounds 1``, ``simulate --version``, ``data synth … y``, ``deploy local … extra``) was
   refused as ``fedprivopt: error: unrecognized arguments: extra``: argparse's top parser
   reports what its subcommand left over, so this was the one usage line naming no command.
   Now ``fedprivopt epsilon: error: unrecognized arguments: extra`` (the innermost command's
   parser: ``fedprivopt data synth: …``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.test_twentyninth_review_cli import _cli, _one_line

ROOT = Path(__file__).resolve().parents[2]
TOY = str(ROOT / "simulations" / "toy.toml")


# -- finding 1: a long --out that cannot be created is cut -----------------------------------------


@pytest.mark.parametrize("under_a_file", [False, True])
def test_1_a_long_out_that_cannot_be_created_is_cut(tmp_path, under_a_file):
    base = tmp_path
    if under_a_file:
        (tmp_path / "f").write_text("mine\n")
        base = tmp_path / "f"
    out = str(base / "/".join(["a" * 200] * 25))  # each component fits, the whole does not
    line = _one_line(_cli(tmp_path, "simulate", TOY, "--rounds", "1", "--out", out, "--quiet"))
    assert "argument --out:" in line, line
    assert f"({len(out):,} characters)" in line, line
    assert len(line) < 300, line
    if under_a_file:
        assert (tmp_path / "f").read_text() == "mine\n"


def test_1_shown_path_keeps_a_short_path_as_it_is():
    from fedprivopt.cli_args import describe_os_error, shown_path

    assert shown_path("/tmp/x") == "/tmp/x"
    err = FileNotFoundError(2, "No such file or directory", "/proc/t")
    assert describe_os_error(err) == "/proc/t: No such file or directory"
    long = "/" + "b" * 300
    assert describe_os_error(FileNotFoundError(2, "No such file", long)).endswith(
        "' (301 characters): No such file"
    )


# -- finding 2: a changed key of a reused cell is written as TOML ----------------------------------


def test_2_a_changed_cell_key_is_written_as_toml(tmp_path):
    out = str(tmp_path / "C")
    args = ["compare", TOY, "--strategies", "fedavg", "--rounds", "1", "--out", out, "--quiet"]
    first = _cli(tmp_path, *args)
    assert first.returncode == 0, first.stderr
    line = _one_line(_cli(tmp_path, *args, "--tensorboard"))
    assert "tensorboard = false, this call asks for true" in line, line
    line = _one_line(_cli(tmp_path, *args, "--set", "device=cpu"))
    assert 'device = "auto", this call asks for "cpu"' in line, line
    rerun = _cli(tmp_path, *args, "--set", "device=cpu", "--overwrite")
    assert rerun.returncode == 0, rerun.stderr
    report = (tmp_path / "C" / "report.md").read_text()
    assert 'the earlier run had device = "auto"' in report, report


# -- finding 3: --out whose parent cannot be created is named --------------------------------------


def test_3_an_out_whose_parent_cannot_be_created_names_the_flag(tmp_path):
    line = _one_line(_cli(tmp_path, "simulate", TOY, "--rounds", "1", "--out", "/proc/fpo-a/b"))
    assert line.endswith(
        "argument --out: cannot create /proc/fpo-a/b: /proc/fpo-a: No such file or directory"
    ), line


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_3_the_default_out_under_proc_names_the_flag(tmp_path, monkeypatch, command):
    monkeypatch.chdir("/proc")
    extra = ["--strategies", "fedavg"] if command == "compare" else []
    line = _one_line(_cli(tmp_path, command, TOY, *extra, "--rounds", "1", "--quiet"))
    default = "runs/compare" if command == "compare" else "runs/dp-fedavg-seed0"
    assert f"argument --out: cannot create {default}: runs: No such file" in line, line


# -- finding 4: arguments left over are refused by their command -----------------------------------

EPSILON = ["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--rounds", "10"]


@pytest.mark.parametrize(
    ("argv", "prefix"),
    [
        ([*EPSILON, "--delta=1e-5", "extra"], "fedprivopt epsilon"),
        (["simulate", TOY, TOY], "fedprivopt simulate"),
        (["simulate", "--", TOY, "--rounds", "1"], "fedprivopt simulate"),
        (["simulate", "--version"], "fedprivopt simulate"),
        (["data", "synth", "--clients", "3", "--out", "x", "y"], "fedprivopt data synth"),
        (["--bogus"], "fedprivopt"),
    ],
)
def test_4_left_over_arguments_name_their_command(tmp_path, argv, prefix):
    line = _one_line(_cli(tmp_path, *argv))
    assert line.startswith(f"{prefix}: error: unrecognized arguments: "), line
