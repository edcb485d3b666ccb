"""Issue 15, fortieth hostile review, the ledger: regression tests of its findings.

1. A genuine seeded tree run written by a version of 24-25 November 2026 (d307e8f to 6cd99d8^:
   lines with ``params_sha256``, none with ``participants_sha256``, a header without
   ``records``; made at 6cd99d8^, toy, restart 3, 2 rounds, then the rounds raised),
   ``simulate --resume``: rc 2, ``line 3: a tree round's line without participants_sha256 …;
   the privacy ledger was edited: refusing to resume`` (the thirty-ninth review follow-up's
   open row): a genuine run called edited, with no word of what its owner can do. The
   refusal stays (a secure run's participants cannot be replayed, so accepting such lines
   reopens the thirty-eighth review's finding 3), but where nothing in the ledger marks a later
   version (no participants on any line, no ``partial`` line, no header ``records`` or
   ``data.task_source``) the line says that such a version may have written it, that its ε
   stands and what to do (``LedgerChecks._participants_unrecorded``). An edit that leaves such
   a mark is still called an edit only. The ledger here is the current one with ``records``
   and every ``participants_sha256`` removed: line for line the file 6cd99d8^ writes for this
   run (measured: the same header, events and model digests).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.simulation.files import LEDGER_FILE
from fedprivopt.simulation.run import simulate
from tests.reliability.test_ledger import kept_files
from tests.simulation.test_run import small_config

OLD_VERSION = "or written by a version of 24-25 November 2026"


@pytest.fixture(scope="module")
def tree_run(tmp_path_factory) -> Path:
    """A finished seeded tree run (restart 3, 2 rounds: its period half done)."""
    config = small_config(
        **{"num-server-rounds": 2, "noise-mechanism": "tree", "tree-restart-rounds": 3}
    )
    return simulate(config, tmp_path_factory.mktemp("tree") / "run").out_dir


def _rewrite(run: Path, edit) -> Path:
    path = run / LEDGER_FILE
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    edit(lines)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    config = run / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 2", "num-server-rounds = 3"))
    return path


def _resume_refused(run: Path, capsys) -> str:
    files = kept_files(run)
    capsys.readouterr()
    rc = main(["simulate", "--resume", str(run), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert kept_files(run) == files
    return err


def _as_24_november(lines) -> None:
    lines[0].pop("records")
    for line in lines[1:]:
        line.pop("participants_sha256")


# -- 1: a tree ledger of a version that recorded no participants --------------------------------
def test_1_a_tree_ledger_of_24_november_is_refused_saying_what_it_may_be(
    tree_run, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(tree_run, run)
    path = _rewrite(run, _as_24_november)
    err = _resume_refused(run, capsys)
    assert f"{path}: line 3: a tree round's line without participants_sha256" in err, err
    assert OLD_VERSION in err and "start a new run in another directory" in err, err
    assert "summary.json" in err, err


def test_1_an_edit_that_leaves_a_later_mark_is_called_an_edit(tree_run, tmp_path, capsys):

    def records(lines):  # the header states what it records: written by a later version
        lines[2].pop("participants_sha256")

    def another_line(lines):  # line 2 keeps its participants
        lines[0].pop("records")
        lines[2].pop("participants_sha256")

    def task_source(lines):  # recorded only after the participants were
        _as_24_november(lines)
        lines[0]["data"] = {"task_source": {"module": "m", "sha256": "0" * 64}}

    for edit in (records, another_line, task_source):
        run = tmp_path / edit.__name__
        shutil.copytree(tree_run, run)
        _rewrite(run, edit)
        err = _resume_refused(run, capsys)
        assert "line 3: a tree round's line without participants_sha256" in err, err
        assert OLD_VERSION not in err, err
