"""Issue 15, forty-fifth hostile review (ledger: the ledger, checkpoints, every reader): tests.

1. A secure toy run killed after round 3's ledger line (its newest checkpoint of round 2, as a
   kill before round 3's checkpoint leaves it) whose ``privacy_ledger.jsonl`` ends, instead of
   its last line feed, in a character that Python's ``str.strip`` removes and JSON does not
   allow (a form feed, a vertical tab, the record separator ``\\x1e``, a no-break space,
   U+2028; a byte order mark before the line alike), then ``simulate --resume R``. Before:
   that last line (round 3's release) was neither refused as lines joined (the check strips
   such characters) nor read as a whole line lacking its newline (``json`` refuses them): it
   was dropped as an append cut short, so the resume charged round 3 once for its two
   releases, rc 0 (the 6-round run of the review: epsilon 29.24 where 32.45 was spent).
   Now ``files.read_lines`` (``_refuse_beside_object``) refuses it for every reader, naming
   the file, the line and the characters; a line cut short, its NUL debris and a whole line
   without its newline (or ending in JSON's own whitespace) are read as before.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import (
    CHECKPOINT,
    LEDGER_FILE,
    METRICS_FILE,
    PREVIOUS_CHECKPOINT,
    SUMMARY_FILE,
    read_lines,
    read_rows,
)
from fedprivopt.simulation.ledger import RunLedger
from fedprivopt.simulation.run import resume, simulate

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = {"population": 12, "task-params.num-users": 12}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished secure toy run of 4 rounds (checkpoints of rounds 2 and 4)."""
    run = tmp_path_factory.mktemp("r45ledger") / "run"
    settings = {**SMALL, "num-server-rounds": 4, "secure": True, "checkpoint-every": 2}
    simulate(load_config(TOY, settings), run)
    return run


def _killed(finished: Path, at: Path, end: str) -> Path:
    """``finished`` as a kill after round 3's ledger line leaves it; the ledger ends in ``end``."""
    at.mkdir()
    for name in ("config.toml", PREVIOUS_CHECKPOINT):
        (at / name).write_bytes((finished / name).read_bytes())
    (at / PREVIOUS_CHECKPOINT).rename(at / CHECKPOINT)  # the newest checkpoint: round 2
    lines = (finished / LEDGER_FILE).read_text(encoding="utf-8").splitlines()[:4]  # rounds 1-3
    (at / LEDGER_FILE).write_text("\n".join(lines) + end, encoding="utf-8")
    rows = (finished / METRICS_FILE).read_text(encoding="utf-8").splitlines()
    kept = [r + "\n" for r in rows if json.loads(r)["round"] <= 2]
    (at / METRICS_FILE).write_text("".join(kept), encoding="utf-8")
    return at


@pytest.mark.parametrize("end", ["\x0c", "\x0b", "\x1e", "\u00a0", "\u2028"])
def test_1_a_whole_last_line_beside_what_json_refuses_is_refused_not_dropped(
    finished: Path, tmp_path: Path, end: str
) -> None:
    run = _killed(finished, tmp_path / "run", end)
    before = (run / LEDGER_FILE).read_bytes()
    with pytest.raises(ValueError, match="line 4 has no line feed but is a whole JSON object") as e:
        resume(run)
    assert str(run / LEDGER_FILE) in str(e.value) and ascii(end) in str(e.value)
    assert (run / LEDGER_FILE).read_bytes() == before  # nothing written
    assert not (run / SUMMARY_FILE).exists()
    with pytest.raises(ValueError, match="is a whole JSON object beside characters"):
        RunLedger.read(run)  # every reader: load_run, compare, compare-tuned, tune


def test_1_a_byte_order_mark_before_the_last_line_is_refused(
    finished: Path, tmp_path: Path
) -> None:
    run = _killed(finished, tmp_path / "run", "")
    text = (run / LEDGER_FILE).read_text(encoding="utf-8")
    head, last = text.rsplit("\n", 1)
    (run / LEDGER_FILE).write_text(f"{head}\n\ufeff{last}", encoding="utf-8")
    with pytest.raises(ValueError, match="beside characters that JSON does not allow"):
        RunLedger.read(run)


def test_1_the_same_in_metrics_jsonl_is_refused_not_skipped(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    path.write_text('{"round": 1, "epsilon": 1.0}\n{"round": 2, "epsilon": 2.0}\x0c')
    with pytest.raises(ValueError, match="line 2 has no line feed but is a whole JSON object"):
        read_rows(path)


@pytest.mark.parametrize(
    "end", ["", " ", "\r", "\n", '\n{"kind": "round", "rou', "\n\x00\x00\x00", "\n  "]
)
def test_1_what_a_killed_append_or_a_missing_newline_leaves_reads_as_before(
    finished: Path, tmp_path: Path, end: str
) -> None:
    run = _killed(finished, tmp_path / "run", end)
    read_lines(run / LEDGER_FILE)  # not refused
    ledger = RunLedger.read(run)
    assert ledger is not None and ledger.last_round == 3  # round 3's whole line is kept


def test_1_a_whole_last_line_without_newline_is_charged_on_resume(
    finished: Path, tmp_path: Path
) -> None:
    run = _killed(finished, tmp_path / "run", "")
    outcome = resume(run)
    assert len([e for e in RunLedger.read(run).entries if e.round == 3]) == 2  # both charged
    # round 3 released twice: 5 events, more than the uninterrupted run's 4
    assert outcome.epsilon > json.loads((finished / SUMMARY_FILE).read_text())["epsilon"]
