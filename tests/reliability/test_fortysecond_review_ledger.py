"""Issue 15, forty-second hostile review, the ledger: regression tests of its findings.

1. A secure toy run (6 rounds, ``checkpoint-every = 2``, ``eval-every = 2``) killed right after
   round 5's ledger line (its newest checkpoint of round 4, no row of round 5), its
   ``privacy_ledger.jsonl`` then given CR line endings (``unix2mac``, an old editor), ``simulate
   --resume R``. Before: the file held no line feed, so it was read as one torn line, that is
   as no ledger ("no ledger was found"), and rebuilt from the checkpoint and the rows: rc 0,
   ε 16.29 where 17.36 was spent (round 5 released twice, charged once). Now a last line
   without a line feed that holds carriage returns is no append cut short and is refused
   (``files.read_lines``): rc 2, one line naming the file; nothing written.
2. The same conversion of ``metrics.jsonl`` in a finished 3-round run, its rounds raised to 4,
   ``simulate --resume R``. Before: rc 0, no word, and the resumed ``metrics.jsonl`` held only
   round 4's row (rounds 1-3 lost). Now refused as in 1. A CRLF file cut before its last line
   feed (a whole last line ending in ``\\r``) is read as before.
3. Finding 1's run and finding 2's with the files' lines joined by spaces (or tabs) instead:
   the same as before (ε 16.29; rows lost). Now a last line without a line feed that is a JSON
   value followed by more text is refused alike (``files.read_lines``).
4. Finding 1's run with its ledger in an earlier version's form (event counts only: 5 events
   by round 5, one more than its checkpoint of round 4 holds), ``simulate --resume R`` killed
   right after the old ledger was set aside as ``privacy_ledger.jsonl.v1``, then ``--resume R``
   again. Before: the old ledger was renamed aside before the converted one was written, so the
   kill left no ledger, and the next resume rebuilt one from the checkpoint alone: rc 0, 6
   events charged (round 5's first release lost) where an unkilled conversion charges 7. Now
   the old ledger is copied aside and replaced in one rename (``RunLedger.write_converted``):
   the next resume converts it again, 7 events.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.simulation.files import LEDGER_FILE, METRICS_FILE, read_rows
from fedprivopt.simulation.ledger import RunLedger
from fedprivopt.simulation.run import resume, simulate
from tests.reliability.test_fortieth_review_followup_ledger import raise_rounds
from tests.simulation.test_run import small_config


class _Killed(Exception):
    """Stands for SIGKILL right after a ledger line was fsynced."""


@pytest.fixture(scope="module")
def killed_secure(tmp_path_factory) -> Path:
    """A secure run killed after round 5's ledger line (checkpoint of round 4, rows 2 and 4)."""
    config = small_config(**{"secure": True, "checkpoint-every": 2, "eval-every": 2})
    out = tmp_path_factory.mktemp("killed") / "run"
    append = RunLedger.append

    def killing(self, round_num, *args, **kwargs):
        append(self, round_num, *args, **kwargs)
        if round_num == 5:
            raise _Killed

    RunLedger.append = killing
    try:
        with pytest.raises(_Killed):
            simulate(config, out)
    finally:
        RunLedger.append = append
    assert [r["round"] for r in read_rows(out / METRICS_FILE)] == [2, 4]
    return out


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished seeded run of 3 rounds."""
    out = tmp_path_factory.mktemp("finished") / "run"
    return simulate(small_config(**{"num-server-rounds": 3}), out).out_dir


def _to_cr(path: Path) -> bytes:
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r"))
    return path.read_bytes()


def _refused_by_cli(run: Path, capsys) -> str:
    assert main(["simulate", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_1_a_ledger_with_cr_line_endings_is_refused_not_rebuilt(killed_secure, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(killed_secure, run)
    before = _to_cr(run / LEDGER_FILE)
    err = _refused_by_cli(run, capsys)
    assert f"{LEDGER_FILE}: line 1 has no line feed but holds carriage returns" in err
    assert (run / LEDGER_FILE).read_bytes() == before
    assert not (run / (LEDGER_FILE + ".v1")).exists()
    # the same file with its line feeds back resumes, every release charged
    (run / LEDGER_FILE).write_bytes(before.replace(b"\r", b"\n"))
    outcome = resume(run)
    assert outcome.rounds_completed == 6
    ledger = RunLedger.read(run)
    assert ledger.entries[-1].events == 7  # round 5 released twice, both charged
    assert outcome.epsilon == ledger.epsilon()


def test_2_metrics_with_cr_line_endings_are_refused_not_lost(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = _to_cr(run / METRICS_FILE)
    raise_rounds(run, 4)
    err = _refused_by_cli(run, capsys)
    assert f"{METRICS_FILE}: line 1 has no line feed but holds carriage returns" in err
    assert (run / METRICS_FILE).read_bytes() == before


def test_2_a_crlf_file_cut_before_its_last_line_feed_is_read(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    for name in (LEDGER_FILE, METRICS_FILE):
        path = run / name
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n")[:-1])
    raise_rounds(run, 4)
    outcome = resume(run)
    assert [r["round"] for r in outcome.rows] == [1, 2, 3, 4]


@pytest.mark.parametrize("sep", [b" ", b"\t"])
def test_3_lines_joined_into_one_are_refused(killed_secure, finished, tmp_path, capsys, sep):
    for source, name in ((killed_secure, LEDGER_FILE), (finished, METRICS_FILE)):
        run = tmp_path / name
        shutil.copytree(source, run)
        path = run / name
        path.write_bytes(path.read_bytes().replace(b"\n", sep))
        before = path.read_bytes()
        if source is finished:
            raise_rounds(run, 4)
        err = _refused_by_cli(run, capsys)
        assert f"{name}: line 1 has no line feed but holds a JSON value followed by more" in err
        assert path.read_bytes() == before


def _old_form(run: Path) -> None:
    """Rewrite ``run``'s ledger as an earlier version wrote it (round and event counts only)."""
    path = run / LEDGER_FILE
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    old = [{"round": 0, "events": 0}] + [
        {"round": x["round"], "events": x["events"]} for x in lines[1:]
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in old))


def test_4_a_resume_killed_while_converting_an_old_ledger_keeps_its_counts(
    killed_secure, tmp_path, monkeypatch
):
    whole = tmp_path / "whole"
    shutil.copytree(killed_secure, whole)
    _old_form(whole)
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    expected = resume(whole)
    assert RunLedger.read(whole).entries[-1].events == 7
    replace = os.replace

    def killing(src, dst, *args, **kwargs):
        replace(src, dst, *args, **kwargs)
        if str(dst).endswith(".v1"):
            raise _Killed

    monkeypatch.setattr(os, "replace", killing)
    with pytest.raises(_Killed):
        resume(run)
    monkeypatch.setattr(os, "replace", replace)
    outcome = resume(run)
    assert RunLedger.read(run).entries[-1].events == 7
    assert outcome.epsilon == expected.epsilon
