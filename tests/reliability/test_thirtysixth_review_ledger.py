"""Issue 15, thirty-sixth hostile review (ledger: the privacy ledger, the run directory's audit).

1. The released models' digests deleted from the ledger: ``simulate toy.toml --set
   noise-mechanism=tree`` (seeded, restart period 4) killed after round 3's ledger line with
   its newest checkpoint of round 2, whose model was edited (``state_digest`` recomputed, as in
   the twenty-ninth review's finding 1), then every ``"params_sha256": "…"`` of
   ``privacy_ledger.jsonl`` set to ``null`` (one ``sed``) and ``simulate --resume``: rc 0, ε
   19.62 as before. A line without a digest is what a ledger rebuilt from a checkpoint
   (:meth:`RunLedger.convert`) holds after its ``carried`` line, so neither the checkpoint's
   model (``check_model``) nor the seeded replay was checked: round 3 was released again from
   another model with its first release's tree noise and participants (the two releases'
   difference is that of the clipped sums, without noise), charged nothing inside its restart
   period. Every version-2 writer records the digest on each ``round`` and ``partial`` line;
   only a converted ledger's rounds after its ``carried`` line hold none. A line without one
   elsewhere is refused now (``ledger_lines.parse_lines``): rc 2, one line naming the file,
   the line and ``params_sha256``; nothing written. (The test: the twenty-ninth review's tree
   run, killed after round 5 with its checkpoint of round 3.) Also refused: the digests
   emptied (``""``, which the replay read as none) or not 64 hexadecimal digits, and a line
   after a released round's marked ``carried`` (only a rebuilt ledger starts with such
   lines, the rounds without digests after them).
2. A ledger header whose δ is not a number in (0, 1), in its ``delta`` and its settings alike
   (``"0.0001"``, ``true``, ``1e400``, ``-0.0``): ``--resume`` refused it against
   ``config.toml``, but a report of the run (the documented ``write_report(out,
   load_runs(R))``) ended in ``ValueError: Unknown format code 'g' for object of type 'str'``,
   naming no file, or noted ``its privacy_ledger.jsonl states delta 1`` for ``true``. The
   header's δ is checked as the accountant checks it (``accounting_state.check_delta``): one
   line naming the file, line 1 and the value.
"""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.simulation.checkpoint import state_digest
from fedprivopt.simulation.files import CHECKPOINT, LEDGER_FILE
from fedprivopt.simulation.run import simulate
from fedprivopt.simulation.rundata import load_runs
from tests.reliability.test_ledger import kept_files
from tests.reliability.test_twentyninth_review_ledger import TREE, _as_killed
from tests.simulation.test_run import small_config


def _one_line(err: str) -> str:
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


# -- 1: the released models' digests deleted from the ledger ---------------------------------------
def test_1_a_ledger_whose_model_digests_were_deleted_is_refused(tmp_path, capsys):
    config = small_config(**{**TREE, "num-server-rounds": 6})
    ref = simulate(config, tmp_path / "ref")
    killed = tmp_path / "killed"
    _as_killed(ref.out_dir, killed, 5)  # checkpoint of round 3, rounds 4-5 released after it
    state = torch.load(killed / CHECKPOINT, map_location="cpu", weights_only=True)
    state["algorithm"]["params"] = state["algorithm"]["params"] + 0.5
    state["sha256"] = state_digest(state)
    torch.save(state, killed / CHECKPOINT)
    ledger = killed / LEDGER_FILE
    text = re.sub(r'"params_sha256": "[0-9a-f]+"', '"params_sha256": null', ledger.read_text())
    ledger.write_text(text)
    files = kept_files(killed)
    capsys.readouterr()
    assert main(["simulate", "--resume", str(killed), "--quiet"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{ledger}: line 2: a round line without params_sha256" in err, err
    assert kept_files(killed) == files


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished private run of 2 rounds (the small toy configuration)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    simulate(small_config(**{"num-server-rounds": 2}), out)
    return out


@pytest.mark.parametrize(
    "edit",
    [
        (r'"params_sha256": "[0-9a-f]+"', '"params_sha256": ""'),
        (r'"params_sha256": "[0-9a-f]+"', '"params_sha256": "zz"'),
        (r'"kind": "round", "round": 2,', '"kind": "carried", "round": 2,'),
    ],
    ids=["empty", "not-hex", "carried"],
)
def test_1_digests_emptied_or_a_line_marked_carried_are_refused(finished, tmp_path, edit):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    ledger = run / LEDGER_FILE
    lines = ledger.read_text().splitlines(keepends=True)
    lines[2] = re.sub(*edit, lines[2])  # round 2's line (round 1's keeps its digest)
    assert lines[2] != ledger.read_text().splitlines(keepends=True)[2]
    ledger.write_text("".join(lines))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(ledger))}: line 3: "):
        load_runs(run)


# -- 2: a header's delta that is not a number in (0, 1) ----------------------------------------
@pytest.mark.parametrize("value", ['"0.0001"', "true", "1e400", "-0.0"])
def test_2_a_header_delta_that_is_no_probability_is_named(finished, tmp_path, value):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    ledger = run / LEDGER_FILE
    lines = ledger.read_text().splitlines(keepends=True)
    assert lines[0].count('"delta": 0.0001') == 2  # the header's and its settings'
    ledger.write_text(lines[0].replace('"delta": 0.0001', f'"delta": {value}') + "".join(lines[1:]))
    with pytest.raises(ValueError) as info:
        load_runs(run)
    assert str(info.value).startswith(f"{ledger}: line 1: the header's delta must be"), info.value
