"""Issue 15, thirty-sixth hostile review (docs): what README.md and docs/*.md promise.

Users read ``README.md`` and ``docs/*.md`` and run what they show; these tests hold the shown
commands and outputs to what the tool does, so they cannot drift silently.

1. ``README.md``'s tuned comparison (``compare simulations/toy.toml --strategies
   dp-fedavg,dp-fedadam --seeds 2 --mean-trials 3 --tune-grid ...``), then ``cat
   runs/cmp-tuned/summary.csv``, showed the header ``strategy,noise_multiplier,seeds,epsilon,
   epsilon_single_run,delta,...``: the file has had ``epsilon_tunings_composed`` after
   ``epsilon`` since the thirty-third review (81.67 for a row's two tunings, where the shown
   rows gave only one tuning's 46.59), so a script reading the fifth column as the single run's
   ε read the composition. The block now shows the file's header and rows, and says what the
   two ε columns mean.
2. ``README.md``'s first command, ``simulate simulations/toy.toml --strategy dp-fedadam --rounds
   20 --out runs/a``, showed one line, ``round   20/20  eval_accuracy=0.7400  epsilon=29.18``;
   the command prints a line per round ending in its seconds, then ``20 rounds (rounds),
   eval_accuracy = 0.7400, epsilon = 29.18; results in runs/a``. The block shows both.
3. ``docs/TREE.md`` said that under ``noise-mechanism = "tree"`` the key ``sampling`` "is
   ignored"; ``--set sampling=fixed`` is refused (rc 2, one line naming ``sampling``) since the
   fourteenth review. The page now lists it among the refusals.
4. ``README.md`` said ``--set key=value`` overrides any key, and not that a key given twice with
   different values (two ``--set``, or a dotted key beside its table: the thirty-fifth review's
   lifecycle finding 5) is refused, rc 2; it says so now (no behaviour change; no test).

Also checked here so that they cannot drift: every ``--flag`` of a ``fedprivopt COMMAND`` line
in the documents this review owns is a flag of that command's parser, and the ``epsilon`` output
shown in ``README.md`` is what the command prints (``calibrate``'s was checked by hand: its
search takes a second).
"""

from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path

import pytest

from fedprivopt.cli import build_parser
from tests.reliability.test_fuzz_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "simulations" / "toy.toml"
DOCS = (
    "README.md",
    "docs/DESIGN.md",
    "docs/DEPLOYMENT.md",
    "docs/SCALING.md",
    "docs/TREE.md",
    "docs/FLOWER.md",
    "examples/digits/README.md",
    "examples/flower-app/README.md",
)


def readme_console() -> list[str]:
    """The lines of README.md's ``console`` blocks, continuation lines joined."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```console\n(.*?)```", text, flags=re.S)
    return re.sub(r"\\\n\s*", " ", "\n".join(blocks)).splitlines()


def shown_output(command: str) -> list[str]:
    """The output lines README.md shows after ``$ fedprivopt COMMAND`` (up to the next ``$``)."""
    lines = readme_console()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"$ fedprivopt {command}"))
    shown = []
    for line in lines[start + 1 :]:
        if line.startswith("$"):
            break
        shown.append(line)
    return shown


def test_1_the_readme_shows_the_tuned_comparison_s_summary_header(tmp_path):
    """The README's header of a tuned comparison's summary.csv is the file's."""
    lines = readme_console()
    header = next(line for line in lines if line.startswith("strategy,noise_multiplier,"))
    shown = header.removesuffix(",...").split(",")
    code, _, err = run_cli([
        "compare", str(PRESET), "--strategies", "dp-fedavg", "--seeds", "1",
        "--mean-trials", "1", "--rounds", "1", "--tune-grid", "server-learning-rate=0.3,1",
        "--out", str(tmp_path / "cmp-tuned"), "--quiet",
    ])  # fmt: skip
    assert code == 0, err
    with (tmp_path / "cmp-tuned" / "summary.csv").open(newline="", encoding="utf-8") as fh:
        columns = next(csv.reader(fh))
    assert columns[: len(shown)] == shown


def test_2_the_readme_s_first_run_prints_what_it_shows(tmp_path):
    """The rounds' lines end in their seconds; the run ends with its result line."""
    shown = shown_output("simulate simulations/toy.toml --strategy dp-fedadam --rounds 20")
    code, out, err = run_cli([
        "simulate", str(PRESET), "--strategy", "dp-fedadam", "--rounds", "20",
        "--out", str(tmp_path / "a"),
    ])  # fmt: skip
    assert code == 0, err
    assert shown[-1] == out.replace(str(tmp_path / "a"), "runs/a").splitlines()[-1]
    printed = err.splitlines()
    rounds = [line for line in shown if line.startswith("round ")]
    assert rounds and all(
        re.sub(r"\(\d+\.\d+ s\)$", "", line) in {re.sub(r"\(\d+\.\d+ s\)$", "", p) for p in printed}
        for line in rounds
    ), (rounds, printed)


def test_3_tree_md_lists_fixed_sampling_among_the_refusals(tmp_path):
    """TREE.md no longer says sampling is ignored; the CLI refuses it naming the key."""
    text = (ROOT / "docs" / "TREE.md").read_text(encoding="utf-8")
    assert "`sampling` is ignored" not in text
    assert '`sampling = "fixed"`' in text
    code, _, err = run_cli([
        "simulate", str(PRESET), "--set", "noise-mechanism=tree", "--set", "sampling=fixed",
        "--rounds", "1", "--out", str(tmp_path / "t"), "--quiet",
    ])  # fmt: skip
    assert code == 2 and len(err.splitlines()) == 1 and "sampling" in err, err
    assert not (tmp_path / "t").exists()


def _flags_by_command() -> dict[tuple[str, ...], set[str]]:
    flags: dict[tuple[str, ...], set[str]] = {}

    def walk(parser: argparse.ArgumentParser, prefix: tuple[str, ...]) -> None:
        flags[prefix] = {o for a in parser._actions for o in a.option_strings}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*prefix, name))

    walk(build_parser(), ())
    return flags


@pytest.mark.parametrize("doc", DOCS)
def test_every_flag_a_doc_names_exists(doc):
    """Each ``fedprivopt COMMAND ... --flag`` of the document is a flag of COMMAND."""
    flags = _flags_by_command()
    text = re.sub(r"\\\n\s*", " ", (ROOT / doc).read_text(encoding="utf-8"))
    unknown = []
    for match in re.finditer(r"fedprivopt ([a-z-]+)(?: ([a-z-]+))?([^\n`|]*)", text):
        first, second, rest = match.groups()
        command = (first, second) if (first, second) in flags else (first,)
        if command not in flags:
            continue
        if second and command == (first,):
            rest = f" {second}{rest}"
        # a later command on the same line (`... simulate --resume OUT`) is its own
        rest = re.split(r"fedprivopt ", rest)[0]
        unknown += [(command, f) for f in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest)
                    if f not in flags[command]]  # fmt: skip
    assert not unknown, unknown


def test_the_readme_s_epsilon_output_is_what_the_command_prints():
    """README's ``fedprivopt epsilon`` line is the command's output, to the digit."""
    line = next(line for line in readme_console() if line.startswith("$ fedprivopt epsilon"))
    code, out, err = run_cli(line.removeprefix("$ fedprivopt ").split("#")[0].split())
    assert code == 0, err
    assert out.strip() == shown_output("epsilon")[0]
