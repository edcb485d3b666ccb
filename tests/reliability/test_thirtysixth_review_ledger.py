"""Issue 15, thirty-sixth hostile review (ledger: the privacy ledger, the run directory's audit).

1. The released models' digests deleted from the ledger: ``simulate toy.toml --set
   noise-mechanism=tree`` (seeded, restart period 4) killed after round 3's ledger line with
   its newest checkpoint of round 2, whose model was edited (``state_digest`` recomputed, as in
   the twenty-ninth review's finding 1), then every ``"params_sha256": "…"`` of
   ``privacy_ledger.jsonl`` set to ``null`` (one ``sed``) and ``simulate --resume``: rc 0, ε
   19.61 as before. A line without a digest is what a ledger rebuilt from a checkpoint
   (:meth:`RunLedger.convert`) holds after its ``carried`` line, so neither the checkpoint's
   model (``check_model``) nor the seeded replay was checked: round 3 was released again from
   another model with its first release's tree noise and participants (the two releases'
   difference is that of the clipped sums, without noise), charged nothing inside its restart
   period. Every version-2 writer records the digest on each ``round`` and ``partial`` line;
   only a converted ledger's rounds after its ``carried`` line hold none. A line without one
   elsewhere is refused now (``ledger_lines.parse_lines``): rc 2, one line naming the file,
   the line and ``params_sha256``; nothing written. (The test: the twenty-ninth review's tree
   run, killed after round 5 with its checkpoint of round 3.)
"""

from __future__ import annotations

import re

import torch

from fedprivopt.cli import main
from fedprivopt.simulation.checkpoint import state_digest
from fedprivopt.simulation.files import CHECKPOINT, LEDGER_FILE
from fedprivopt.simulation.run import simulate
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
