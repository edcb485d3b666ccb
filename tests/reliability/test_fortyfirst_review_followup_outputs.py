"""Issue 15, follow-up of the forty-first hostile review (outputs: the input, processes and
lead fixes of that review): tests.

1. Input 1's twin through the Python API: a ``RunConfig`` whose ``task_params`` name a
   ``data_dir`` or ``cache_dir`` holding a null character (``dataclasses.replace(config,
   task_params={..., "data_dir": "D\\x00x"})``, ``RunConfig(...)``, a ``pathlib.Path``), then
   ``simulate(config, out)``. Before: ``ValueError: embedded null byte``, the operating
   system's words naming no parameter (``check_task_dirs_outside``'s ``realpath``), where the
   command line names ``task-params.data-dir`` since input 1. Now ``RunConfig`` refuses it when
   it is made, naming the key, as ``resolve_config`` does (``config_values.check_task_dirs``).
2. Input 2's refusal of a file whose ``examples.client_id`` is declared ``INTEGER`` (a type that
   stores the text ``'1'`` as the integer 1): ``SQLiteSplit.client_examples('1')``. Before: the
   line said ``reading client '1' of split 'train' found a row of client '1' of split
   'train'``, a line that contradicts itself (the row's id is the integer 1, shown as text).
   Now the row's id is shown with how it is stored (``... found a row of client 1, stored as
   an integer, not the text '1' ...``; ``sqlite_files.check_row_owner``).
3. Input 4's refusal (``data synth --out D --overwrite``, ``D/stackoverflow.sqlite`` beside a
   hot journal) gives a command to roll the write back, ``sqlite3 PATH 'PRAGMA quick_check'``,
   with ``PATH`` unquoted: for ``--out "my data/it's D"`` the command a shell reads opens
   ``my`` (or stops at the unclosed quotation). Now the path is quoted for a shell
   (``shlex.quote``; ``cli_data._refuse_hot_journal``), and the command rolls the write back.
4. Input 6's words for ``--set task-params.KEY=None``: ``... or left out of the configuration
   (TOML has no None), got 'None'``, also for a parameter whose default is not None:
   ``simulate stackoverflow-nwp.toml --set task-params.max-examples-per-user=None`` (None: no
   cap; left out: the factory's 1000, and the preset sets 1000). Before: the line told the user
   to leave it out to get None. Now ``(None from Python only: TOML has no None, and a key left
   out takes the task's default)`` (``cli_task_errors.name_task_param``), true for every task.
5. Input 4's twin in a task: ``simulate`` (or ``compare``) ``stackoverflow-tp-mini.toml --set
   task-params.data-dir=D``, ``D`` a synthetic dataset whose ``stackoverflow.sqlite`` has a hot
   journal beside it. Before: ``... is not the file its stackoverflow.synthetic.json describes
   (...), so it is not the synthetic dataset the synth_* parameters ask for: use another
   data_dir, or remove the marker ...``, the cause input 4 corrected in ``data synth``. Now the
   task says what ``data synth`` says (``sqlite_files.hot_journal_refusal``, from
   ``StackOverflowDataDir._check_synthetic_meta`` and ``cli_data._refuse_hot_journal``).
6. Input 2's twin in the summaries: a file whose ``client_metadata.client_id`` (or
   ``split_name``) is declared ``COLLATE NOCASE`` and lists ``u1`` and ``U1`` (splits ``train``
   and ``Train``), ``examples`` plain text. The reader trains them as two users (text equal to
   text, as input 2 requires); ``data info`` said ``total 1 (distinct clients; the split rows
   count 2)`` and ``list_splits`` gave one of the two splits (``COUNT(DISTINCT ...)`` and
   ``DISTINCT`` use the column's collation), and ``SQLiteSplit`` of ``train`` listed ``Train``'s
   ``u2`` too, refused as ``client 'u2' of split 'train' has 0 examples``. Now each compares
   ``COLLATE BINARY`` (``sqlite.count_distinct_clients``, ``list_splits``, the split's
   ``client_metadata`` queries): total 3, both splits, ``train`` of ``U1`` and ``u1``.
7. Processes 1's twin inside: ``deploy local --out D/sub`` (``check_out_claimable``, which the
   command line and ``deploy_local`` call) while another process holds ``D`` with only
   ``run.lock`` written (a start; here ``lock_directory`` in a child process, stopped by its
   PID). Before: every check passed (the inside-a-run check knows a run by its ledger or by
   ``run.lock`` beside ``config.toml``), so ``D/sub/deploy`` would be written into the other
   run's directory. Now refused naming the holder's PID (``out_checks.check_not_held`` probes
   every parent holding ``run.lock``); unheld debris still taken.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.data.locks import LockHeldError
from fedprivopt.data.sqlite import SQLiteSplit, count_distinct_clients, list_splits
from fedprivopt.data.stackoverflow import StackOverflowExample, encode_example
from fedprivopt.deploy.out_checks import check_out_claimable
from fedprivopt.simulation.config import RunConfig, load_config
from tests.reliability.test_fortyfirst_review_input import _HOT
from tests.reliability.test_thirtyeighth_review_input import _cli

MINI = "simulations/stackoverflow-tp-mini.toml"


def _stdout(*argv: str) -> tuple[int, list[str]]:
    """``fedprivopt ARGV`` in process: its exit code and its stdout lines."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(list(argv))
    return code, out.getvalue().strip().splitlines()


# -- finding 1: a null character in a task directory, through the Python API -------------------


@pytest.mark.parametrize("key", ["data_dir", "cache_dir"])
@pytest.mark.parametrize("kind", [str, Path])
def test_1_a_null_character_in_a_task_directory_is_named_by_the_api(tmp_path, key, kind):
    config = load_config(MINI)
    value = kind(f"{tmp_path}/d\x00x")
    named = rf"task-params\.{key.replace('_', '-')} holds a null character"
    with pytest.raises(ValueError, match=named):  # before: taken
        dataclasses.replace(config, task_params={**config.task_params, key: value})
    with pytest.raises(ValueError, match=named):
        RunConfig(task="stackoverflow-tp", task_params={key: value})


def test_1_ordinary_directories_are_taken(tmp_path):
    config = load_config(MINI)
    params = {**config.task_params, "data_dir": str(tmp_path / "d x"), "cache_dir": tmp_path}
    # forty-fifth review (input 1): a Path is recorded as its text, as config.toml holds it
    assert dataclasses.replace(config, task_params=params).task_params["cache_dir"] == str(tmp_path)


# -- finding 2: a client id stored as a number is named so ------------------------------------


def _example(text):
    return encode_example(StackOverflowExample(text, "", "a", "2010", 1, "question"))


def test_2_a_client_id_stored_as_an_integer_is_named_as_one(tmp_path):
    path = tmp_path / "s.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE examples (split_name TEXT NOT NULL, client_id INTEGER NOT NULL, "
        "serialized_example_proto BLOB NOT NULL)"
    )
    conn.execute(
        "CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, "
        "num_examples INTEGER NOT NULL)"
    )
    for client in ("1", "2"):
        conn.executemany("INSERT INTO examples VALUES ('train', ?, ?)", [(client, _example("a"))])
        conn.execute("INSERT INTO client_metadata VALUES (?, 'train', 1)", (client,))
    conn.commit()
    conn.close()
    split = SQLiteSplit(path, warn_unindexed=False)
    with pytest.raises(ValueError) as caught:
        split.client_examples("1")
    line = str(caught.value)
    assert "\n" not in line and "makes different client ids equal" in line
    assert "found a row of client '1'" not in line  # before: what was asked, as what was found
    assert "found a row of client 1, stored as an integer, not the text '1'" in line


# -- finding 3: the advice for a hot journal, as a shell takes it ------------------------------


def test_3_the_hot_journal_advice_is_a_command_a_shell_takes(tmp_path):
    out = tmp_path / "my data" / "it's D"
    synth = ["data", "synth", "--out", str(out), "--clients", "3", "--workers", "1"]
    assert _cli(*synth)[0] == 0
    sqlite = out / "stackoverflow.sqlite"
    subprocess.run([sys.executable, "-c", _HOT, str(sqlite)], check=True, timeout=60)
    code, lines = _cli(*synth, "--overwrite")
    assert code == 2 and len(lines) == 1, lines
    advice = lines[0].split("roll the write back once (", 1)[1].rsplit(") and run again", 1)[0]
    # before: sqlite3 /tmp/.../my data/it's D/stackoverflow.sqlite ... (no closing quotation)
    assert shlex.split(advice) == ["sqlite3", str(sqlite), "PRAGMA quick_check"]


# -- finding 4: None where the task's default is not None --------------------------------------


def test_4_none_is_not_said_to_be_what_a_key_left_out_gives(tmp_path):
    code, lines = _cli(
        "simulate", "simulations/stackoverflow-nwp.toml", "--rounds", "1", "--out",
        str(tmp_path / "r"), "--quiet", "--set", "task-params.max-examples-per-user=None",
    )  # fmt: skip
    assert code == 2 and len(lines) == 1, lines
    assert "task-params.max-examples-per-user must be" in lines[0], lines
    # before: 'or left out of the configuration (TOML has no None)': left out, it is 1000
    assert "left out of the configuration" not in lines[0], lines
    assert "TOML has no None, and a key left out takes the task's default" in lines[0], lines
    assert not (tmp_path / "r").exists()


# -- finding 5: a task's synthetic dataset beside a hot journal --------------------------------


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_5_a_task_names_the_hot_journal_as_data_synth_does(tmp_path, command):
    data = tmp_path / "my data"
    assert _cli("data", "synth", "--out", str(data), "--clients", "3", "--workers", "1")[0] == 0
    sqlite = data / "stackoverflow.sqlite"
    subprocess.run([sys.executable, "-c", _HOT, str(sqlite)], check=True, timeout=60)
    argv = [command, MINI, "--rounds", "1", "--out", str(tmp_path / "r"), "--quiet"]
    if command == "compare":
        argv += ["--strategies", "dp-fedavg"]
    code, lines = _cli(*argv, "--set", f"task-params.data-dir={data}")
    assert code == 2 and len(lines) == 1, lines
    # before: '... is not the file its stackoverflow.synthetic.json describes (...): use
    # another data_dir, or remove the marker and synth_* to use it as it is'
    assert "has a hot journal beside it" in lines[0] and "is not the file" not in lines[0]
    advice = lines[0].split("roll the write back once (", 1)[1].rsplit(") and run again", 1)[0]
    assert shlex.split(advice) == ["sqlite3", str(sqlite), "PRAGMA quick_check"]
    assert not (tmp_path / "r").exists()


# -- finding 6: data info counts clients as the reader tells them apart ------------------------


def test_6_a_collation_does_not_merge_clients_or_splits_in_a_summary(tmp_path):
    path = tmp_path / "s.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
        "serialized_example_proto BLOB NOT NULL)"
    )
    conn.execute(
        "CREATE TABLE client_metadata (client_id TEXT COLLATE NOCASE NOT NULL, "
        "split_name TEXT COLLATE NOCASE NOT NULL, num_examples INTEGER NOT NULL)"
    )
    for split, client in (("train", "u1"), ("train", "U1"), ("Train", "u2")):
        conn.execute("INSERT INTO examples VALUES (?, ?, ?)", (split, client, _example("a")))
        conn.execute("INSERT INTO client_metadata VALUES (?, ?, 1)", (client, split))
    conn.commit()
    conn.close()
    split = SQLiteSplit(path, warn_unindexed=False)  # before: u2 of 'Train' listed in 'train'
    assert list(split.client_ids) == ["U1", "u1"]
    assert [len(split.client_examples(c)) for c in split.client_ids] == [1, 1]  # two users
    assert count_distinct_clients(path) == 3  # before: 2 (u1 and U1 counted once)
    assert list_splits(path) == ["Train", "train"]  # before: one of them
    code, out = _stdout("data", "info", str(path))
    assert code == 0 and out[-1].split()[:2] == ["total", "3"], out


# -- finding 7: deploy local --out inside a run directory another process holds ---------------

_HOLD = """
import sys, time
from fedprivopt.simulation.rundir import lock_directory
with lock_directory(sys.argv[1], "run.lock", what="a start"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_7_deploy_out_inside_a_held_start_is_refused(tmp_path):
    held = tmp_path / "D"
    held.mkdir()
    config = load_config("simulations/toy.toml")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(held)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"  # only run.lock written, as a start
        with pytest.raises(LockHeldError, match=r"is inside the run directory .*D, which process"):
            check_out_claimable(held / "sub", config)  # before: passed (deploy/ written there)
        with pytest.raises(LockHeldError, match=f"in use by process {holder.pid}"):
            check_out_claimable(held, config)  # processes 1, as before
    finally:
        holder.kill()
        holder.wait(timeout=30)
    check_out_claimable(held / "sub", config)  # its debris, not held: taken as before
    assert not (held / "sub").exists()
