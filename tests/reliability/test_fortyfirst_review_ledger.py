"""Issue 15, forty-first hostile review, the ledger: regression tests of its findings.

1. A finished secure toy run (2 rounds) with a directory where a resume replaces a file
   (``mkdir R/checkpoint.pt.tmp``, ``R/checkpoint.prev.pt`` or ``R/summary.json.tmp``), its
   rounds raised to 3, ``simulate --resume R``: round 3 was released (its ledger line written)
   and the run then failed, rc 2, ``R/checkpoint.pt.tmp: Is a directory`` (saving the round's
   checkpoint, or rotating the old one onto ``checkpoint.prev.pt``, or writing the summary),
   where ``resume`` promises that every check is made before anything is written. With the
   directory removed, the next ``--resume`` redid round 3 from the checkpoint of round 2 as a
   new release: ε 13.71 for the 3 rounds whose uninterrupted ε is 12.17. Now ``resume``
   refuses such a directory before it takes the lock (``run._check_replaced``): rc 2, one
   line naming it; nothing is written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fedprivopt.simulation.files import LEDGER_FILE
from fedprivopt.simulation.run import resume, simulate
from tests.reliability.test_fortieth_review_followup_ledger import raise_rounds
from tests.simulation.test_run import small_config


@pytest.fixture(scope="module")
def secure_run(tmp_path_factory) -> Path:
    """A finished secure run of 2 rounds."""
    config = small_config(**{"num-server-rounds": 2, "secure": True})
    return simulate(config, tmp_path_factory.mktemp("secure") / "run").out_dir


@pytest.mark.parametrize("name", ["checkpoint.pt.tmp", "checkpoint.prev.pt"])
def test_1_directory_where_a_resume_replaces_a_file_is_refused_first(secure_run, tmp_path, name):
    run = tmp_path / "run"
    shutil.copytree(secure_run, run)
    target = run / name
    if target.exists():
        target.unlink()
    target.mkdir()
    raise_rounds(run, 3)
    ledger = (run / LEDGER_FILE).read_bytes()
    with pytest.raises(ValueError, match=rf"{name}' is a directory, where a resume writes") as exc:
        resume(run)
    assert "\n" not in str(exc.value)
    assert (run / LEDGER_FILE).read_bytes() == ledger  # nothing released
    assert (run / "summary.json").exists()
    target.rmdir()
    resume(run)
    assert len((run / LEDGER_FILE).read_text().splitlines()) == 4  # round 3 released once
